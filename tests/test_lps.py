"""lcjax.analysis.lps: LPS head scores, enhancement and `lcjax analyze lps`.

References: the explicit D_model × D_model kernels M_m = A_mᵀ R_m B_m built here in
float64 (the trace form must equal ‖M_m‖_F², and sym must equal its definition on
M = Σ M_m); the RoPE of lcjax.rope applied to real projections (the kernel must be the
bilinear form of rotated q and k at distance n = j − i); closed forms for the extreme
energy distributions.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.analysis.lps import (
    LLAMA_MULTIPLIER,
    QWEN3_MULTIPLIER,
    enhance_heads,
    enhance_model,
    kernel_energies,
    lps_scores,
    model_lps,
    pair_indices,
    scores_from_energies,
)
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.rope import apply_rope, inv_freq, scaled_inv_freq


def _weights(seed, layers=2, dm=12, heads=4, kv_heads=2, d=8):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(layers, dm, heads, d)), rng.normal(size=(layers, dm, kv_heads, d)))


def _explicit(wq, wk, theta, n, layout):
    """Energies [L, H, P] and sym [L, H] from the explicit D_model × D_model kernels."""
    layers, dm, heads, d = wq.shape
    group = heads // wk.shape[2]
    a, b = pair_indices(d, layout)
    energies = np.zeros((layers, heads, d // 2))
    sym = np.zeros((layers, heads))
    for i in range(layers):
        for h in range(heads):
            total = np.zeros((dm, dm))
            for m in range(d // 2):
                c, s = np.cos(n * theta[m]), np.sin(n * theta[m])
                r = np.array([[c, -s], [s, c]])
                am = wq[i, :, h, [a[m], b[m]]]            # [2, Dm]
                bm = wk[i, :, h // group, [a[m], b[m]]]
                mm = am.T @ r @ bm                          # [Dm, Dm]
                energies[i, h, m] = np.sum(mm ** 2)
                total += mm
            half = (total + total.T) / 2
            sym[i, h] = abs(np.sum(half ** 2) / np.sum(total ** 2) - 0.5)
    return energies, sym


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_trace_form_equals_explicit_kernels(layout):
    wq, wk = _weights(0)
    theta = np.asarray(inv_freq(8, 10000.0), np.float64)
    for n in (-32768, -7, 5):
        e, sym = kernel_energies(wq, wk, theta, distance=n, layout=layout,
                                 gram_dtype=np.float64)
        ref_e, ref_sym = _explicit(wq, wk, theta, n, layout)
        np.testing.assert_allclose(e, ref_e, rtol=1e-10)
        np.testing.assert_allclose(sym, ref_sym, rtol=1e-9, atol=1e-12)
        assert sym.std() > 1e-3  # not a constant
    # float32 Gram products (the default) stay close
    e32, sym32 = kernel_energies(wq, wk, theta, distance=-32768, layout=layout)
    ref_e, ref_sym = _explicit(wq, wk, theta, -32768, layout)
    np.testing.assert_allclose(e32, ref_e, rtol=1e-4)
    np.testing.assert_allclose(sym32, ref_sym, rtol=1e-3, atol=1e-6)


def test_parallel_layers_and_blas_threads_restored():
    """Layers scored in 1 or 3 threads give the same numbers, for stacked, listed and
    non-contiguous weights, and the BLAS thread count is restored afterwards."""
    from threadpoolctl import threadpool_info

    def blas_threads():
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    wq, wk = _weights(3, layers=3, dm=16, heads=8, kv_heads=2, d=8)
    theta = np.asarray(inv_freq(8, 10000.0), np.float64)
    before = blas_threads()
    e1, s1 = kernel_energies(wq, wk, theta, workers=1, gram_dtype=np.float64)
    e3, s3 = kernel_energies(list(wq), list(wk), theta, workers=3, gram_dtype=np.float64)
    fq = [np.asfortranarray(x) for x in wq]  # strided, non-C-contiguous layers
    ef, sf = kernel_energies(fq, list(wk), theta, gram_dtype=np.float64)
    ref_e, ref_sym = _explicit(wq, wk, theta, -32768, "half")
    for e, sym in ((e1, s1), (e3, s3), (ef, sf)):
        np.testing.assert_allclose(e, ref_e, rtol=1e-10)
        np.testing.assert_allclose(sym, ref_sym, rtol=1e-9, atol=1e-12)
    assert blas_threads() == before


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_kernel_is_the_bilinear_form_of_rotated_q_and_k(layout):
    """x_iᵀ M(j − i) y_j = RoPE(W_q x, i) · RoPE(W_k y, j), with lcjax.rope's RoPE."""
    rng = np.random.default_rng(1)
    dm, d, i, j = 6, 8, 50, 13
    wq, wk = rng.normal(size=(dm, 1, d)), rng.normal(size=(dm, 1, d))
    x, y = rng.normal(size=dm), rng.normal(size=dm)
    q = apply_rope(jnp.asarray((x @ wq.reshape(dm, d))[None, None, None], jnp.float32),
                   jnp.array([i]), layout=layout)
    k = apply_rope(jnp.asarray((y @ wk.reshape(dm, d))[None, None, None], jnp.float32),
                   jnp.array([j]), layout=layout)
    want = float(jnp.sum(q * k))
    theta = np.asarray(inv_freq(d), np.float64)
    a, b = pair_indices(d, layout)
    n = j - i
    total = 0.0
    for m in range(d // 2):
        c, s = np.cos(n * theta[m]), np.sin(n * theta[m])
        am, bm = wq[:, 0, [a[m], b[m]]].T, wk[:, 0, [a[m], b[m]]].T
        total += x @ am.T @ np.array([[c, -s], [s, c]]) @ bm @ y
    np.testing.assert_allclose(total, want, rtol=1e-4)


def test_extreme_energy_distributions():
    d = 16
    lowest = np.zeros(d // 2)
    lowest[-1] = 3.0
    s_dist, s_erank, lps = scores_from_energies(lowest)
    assert s_dist == pytest.approx(1.0, abs=1e-12)
    assert s_erank == pytest.approx(1 - 2 / d, abs=1e-12)
    assert lps == pytest.approx((1 - 2 / d) ** 0.6, abs=1e-12)
    s_dist, s_erank, lps = scores_from_energies(np.full(d // 2, 0.7))
    assert s_erank == pytest.approx(0.0, abs=1e-12) and lps == pytest.approx(0.0, abs=1e-9)
    assert s_dist == pytest.approx(0.5, abs=1e-12)
    # from weights: W_Q and W_K nonzero only on the lowest-frequency pair's rows
    wq, wk = _weights(2, layers=1, heads=2, kv_heads=1, d=d)
    a, b = pair_indices(d)
    keep = np.zeros(d, bool)
    keep[[a[-1], b[-1]]] = True
    res = lps_scores(wq * keep, wk * keep, gram_dtype=np.float64)
    np.testing.assert_allclose(res.s_dist, 1.0, atol=1e-12)
    np.testing.assert_allclose(res.s_erank, 1 - 2 / d, atol=1e-12)
    assert res.energies[..., :-1].max() == 0 and res.energies[..., -1].min() > 0


def test_gqa_mapping():
    """H = 8, H_kv = 2: query head h reads key head h // 4."""
    wq, wk = _weights(3, layers=1, heads=8, kv_heads=2, d=8)
    theta = np.asarray(inv_freq(8), np.float64)
    e, _ = kernel_energies(wq, wk, theta, gram_dtype=np.float64)
    for h in range(8):
        single, _ = kernel_energies(wq[:, :, h:h + 1], wk[:, :, h // 4:h // 4 + 1], theta,
                                    gram_dtype=np.float64)
        np.testing.assert_allclose(e[0, h], single[0, 0], rtol=1e-12)
    wk2 = wk.copy()
    wk2[:, :, 1] *= 2.0
    e2, _ = kernel_energies(wq, wk2, theta, gram_dtype=np.float64)
    np.testing.assert_allclose(e2[0, :4], e[0, :4], rtol=1e-12)
    np.testing.assert_allclose(e2[0, 4:], 4 * e[0, 4:], rtol=1e-12)
    with pytest.raises(ValueError, match="do not fit"):
        kernel_energies(wq[:, :, :6], wk[:, :, :1].repeat(4, 2), theta)


def test_enhancement_scales_energies_by_mult_squared():
    wq, wk = _weights(4, layers=3, heads=4, kv_heads=2, d=8)
    wq, wk = wq.astype(np.float32), wk.astype(np.float32)
    params = {"blocks": {i: {"attn": {"q_proj": wq[i], "k_proj": wk[i]}} for i in range(3)},
              "embed": np.ones(3)}
    heads = [(0, 1), (2, 3), (2, 0)]
    mult = np.array([[1.5, 0.5, 2.0, 1.0], [0.3, 1.0, 1.0, 1.7], [1.1, 1.2, 0.9, 0.8]])
    for layout in ("half", "interleaved"):
        new = enhance_heads(params, heads, mult, layout=layout)
        assert new["embed"] is params["embed"]
        assert np.array_equal(params["blocks"][0]["attn"]["q_proj"], wq[0])  # input untouched
        theta = np.asarray(inv_freq(8), np.float64)
        e0, _ = kernel_energies(wq, wk, theta, layout=layout, gram_dtype=np.float64)
        nq = np.stack([new["blocks"][i]["attn"]["q_proj"] for i in range(3)])
        nk = np.stack([new["blocks"][i]["attn"]["k_proj"] for i in range(3)])
        np.testing.assert_array_equal(nk, wk)
        e1, _ = kernel_energies(nq, nk, theta, layout=layout, gram_dtype=np.float64)
        want = e0.copy()
        for (layer, head), m in zip(heads, mult):
            want[layer, head] *= m ** 2
        np.testing.assert_allclose(e1, want, rtol=1e-6)
        untouched = np.ones((3, 4), bool)
        for layer, head in heads:
            untouched[layer, head] = False
        np.testing.assert_array_equal(e1[untouched], e0[untouched])
    with pytest.raises(ValueError, match=r"multipliers must be \[4\]"):
        enhance_heads(params, heads, np.ones(5))


def test_multiplier_presets():
    assert LLAMA_MULTIPLIER.shape == QWEN3_MULTIPLIER.shape == (64,)
    np.testing.assert_allclose(LLAMA_MULTIPLIER[[0, 39, 40, 47, 48, 55, 56, 63]],
                               [0.8, 0.8 + 0.2 * 39 / 40, 1.0, 1.0 + 0.2 * 7 / 8, 1.2,
                                1.2 - 0.2 * 7 / 8, 1.0, 1.0])
    np.testing.assert_allclose(QWEN3_MULTIPLIER[[0, 7, 8, 31, 32, 47, 48, 55, 56, 63]],
                               [1, 1, 1, 0.2, 0.2, 1, 1, 1.4, 1.4, 1])
    params = {"blocks": {0: {"attn": {"q_proj": np.ones((4, 2, 128), np.float32)}}}}
    new = enhance_heads(params, [(0, 1)], "qwen3")
    a, b = pair_indices(128)
    np.testing.assert_allclose(new["blocks"][0]["attn"]["q_proj"][0, 1, a], QWEN3_MULTIPLIER,
                               rtol=1e-6)
    np.testing.assert_allclose(new["blocks"][0]["attn"]["q_proj"][0, 1, b], QWEN3_MULTIPLIER,
                               rtol=1e-6)
    np.testing.assert_array_equal(new["blocks"][0]["attn"]["q_proj"][:, 0], 1.0)


def _model(**kw):
    cfg = DecoderConfig(vocab_size=32, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=16, mlp_hidden=24, **kw)
    return DecoderLM(cfg, rngs=nnx.Rngs(0))


_forward = nnx.jit(lambda model, tokens: model(tokens))


SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@pytest.fixture(scope="module")
def small_model():
    return _model(rope_scaling=SCALING, rope_base=500000.0)


def test_model_lps_uses_rope_scaling_and_enhance_model(small_model):
    scaling, model = SCALING, small_model
    res = model_lps(model, gram_dtype=np.float64)
    wq = np.stack([np.asarray(b.attn.q_proj[...]) for b in model.blocks])
    wk = np.stack([np.asarray(b.attn.k_proj[...]) for b in model.blocks])
    want = lps_scores(wq, wk, frequencies=scaled_inv_freq(16, 500000.0, scaling),
                      gram_dtype=np.float64)
    np.testing.assert_allclose(res.energies, want.energies, rtol=1e-12)
    plain = lps_scores(wq, wk, rope_base=500000.0, gram_dtype=np.float64)
    assert np.abs(plain.energies - res.energies).max() > 1e-3 * res.energies.max()
    heads = res.top_heads(3)
    mult = np.linspace(0.5, 1.5, 8)
    enhanced = enhance_model(model, heads, mult)
    after = model_lps(enhanced, gram_dtype=np.float64)
    np.testing.assert_allclose(model_lps(model, gram_dtype=np.float64).energies, res.energies)
    for layer, head in heads:
        np.testing.assert_allclose(after.energies[layer, head],
                                   res.energies[layer, head] * mult ** 2, rtol=1e-5)
    tokens = jnp.arange(6)[None]
    assert np.abs(np.asarray(_forward(enhanced, tokens) - _forward(model, tokens))).max() > 1e-4


def test_records_table_and_heatmap(tmp_path):
    wq, wk = _weights(5, layers=3, heads=4, kv_heads=4, d=8)
    res = lps_scores(wq, wk, distance=-1000)
    records = res.records()
    assert len(records) == 12 and records[5]["layer"] == 1 and records[5]["head"] == 1
    assert set(records[0]) == {"layer", "head", "lps", "s_dist", "s_erank", "sym", "score"}
    r = records[7]
    assert r["score"] == pytest.approx(r["lps"] - 0.5 * r["sym"])
    assert r["lps"] == pytest.approx(r["s_dist"] ** 0.4 * r["s_erank"] ** 0.6)
    top = res.top(4)
    assert [t["score"] for t in top] == sorted((x["score"] for x in records), reverse=True)[:4]
    res.heatmap(tmp_path / "h.png", top=3)
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_analyze_lps(tmp_path, capsys, small_model):
    from lcjax.cli import main
    from lcjax.interop import load_hf, save_hf

    model = small_model
    save_hf(model, tmp_path / "ckpt")
    mult = list(np.linspace(0.6, 1.4, 8))
    (tmp_path / "mult.json").write_text(json.dumps(mult))
    rc = main(["analyze", "lps", "--checkpoint", str(tmp_path / "ckpt"), "--top", "3",
               "--json", str(tmp_path / "lps.json"), "--enhance", "--enhance-heads", "2",
               "--multiplier", str(tmp_path / "mult.json"), "--out", str(tmp_path / "out")])
    assert rc == 0
    out = capsys.readouterr().out
    records = json.loads((tmp_path / "lps.json").read_text())
    want = model_lps(model)
    assert len(records) == 8
    np.testing.assert_allclose([r["score"] for r in records], want.score.ravel(), rtol=1e-5,
                               atol=1e-7)
    best = want.top(1)[0]
    assert f"{best['layer']:>5} {best['head']:>4}" in out
    assert (tmp_path / "lps.png").read_bytes()[:4] == b"\x89PNG"
    enhanced, _ = load_hf(tmp_path / "out")
    after = model_lps(enhanced, gram_dtype=np.float64)
    before = model_lps(model, gram_dtype=np.float64)
    for layer, head in want.top_heads(2):
        np.testing.assert_allclose(after.energies[layer, head],
                                   before.energies[layer, head] * np.array(mult) ** 2,
                                   rtol=1e-5)


def test_retrieval_success_matches_numpy_attention(small_model):
    from lcjax.analysis.retrieval_heads import answer_position, retrieval_success
    from lcjax.nn import capture_attention

    model = small_model
    rng = np.random.default_rng(3)
    prompts = rng.integers(0, 32, (4, 12))
    positions = [int(rng.integers(0, 11)) for _ in prompts]
    got = retrieval_success(model, list(prompts), positions, top_k=3)
    assert got.shape == (2, 4)
    hits = np.zeros((2, 4))
    inputs = nnx.jit(lambda m, t: capture_attention(m, t, tap="inputs")[1])(
        model, jnp.asarray(prompts))
    for b, pos in enumerate(positions):
        for layer, x in enumerate(inputs):
            q, k = np.asarray(x["q"], np.float64)[b, -1], np.asarray(x["k"], np.float64)[b]
            for h in range(4):
                s = k[:, h // 2] @ q[h] * x["scale"]       # the last query sees every key
                w = np.exp(s - s.max())
                hits[layer, h] += pos in np.argsort(-w)[:3]
    np.testing.assert_allclose(got, hits / len(prompts))
    assert 0 < got.mean() < 1
    np.testing.assert_allclose(retrieval_success(model, [prompts[0]], positions[:1], top_k=99),
                               1.0)
    assert answer_position([5, 1, 2, 7, 1, 2], [1, 2]) == 1
    assert answer_position([5, 1, 2, 7, 1, 2], [1, 2], before=6) == 1
    with pytest.raises(ValueError, match="do not occur"):
        answer_position([5, 1, 2], [2, 5])


def test_correlations_equal_scipy(tmp_path):
    from scipy import stats

    from lcjax.analysis.retrieval_heads import correlate, pearson, scatter_plot, spearman

    rng = np.random.default_rng(4)
    x, y = rng.normal(size=40), np.round(rng.uniform(size=40) * 4) / 4  # y has ties
    assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
    res = lps_scores(*_weights(6, layers=3, heads=4, kv_heads=2, d=8))
    success = np.clip(res.lps * 3 + 0.1 * rng.normal(size=res.lps.shape), 0, 1)
    out = correlate(success, res)
    assert out["lps"]["pearson"] == pytest.approx(stats.pearsonr(res.lps.ravel(),
                                                                 success.ravel())[0])
    assert out["s_erank"]["spearman"] == pytest.approx(
        stats.spearmanr(res.s_erank.ravel(), success.ravel())[0])
    scatter_plot(success, res, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_resample_multiplier():
    from lcjax.analysis.lps import resample_multiplier

    np.testing.assert_array_equal(resample_multiplier("llama", 64), LLAMA_MULTIPLIER)
    # a linear schedule stays linear with the same end points (closed form)
    np.testing.assert_allclose(resample_multiplier(np.linspace(0.5, 2.0, 64), 8),
                               np.linspace(0.5, 2.0, 8), rtol=1e-12)
    small = resample_multiplier(LLAMA_MULTIPLIER, 8)
    assert small[0] == pytest.approx(0.8) and small[-1] == pytest.approx(1.0)
    assert small.max() > 1.05  # the Llama bump on the lower-middle frequencies survives
    with pytest.raises(ValueError, match="preset"):
        resample_multiplier("gpt", 8)
