"""experiments/token_sparse: the sparse-prefill / dense-decoding generator against
lcjax.nn.generate and nn's own cache writes, its kept fractions against the method's aux,
and the claims on hand-made numbers. The pipeline end to end is the experiment's quick run
(``python experiments/reproduce.py --quick --only token_sparse``): too slow for this file's
15 s."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.token_sparse import experiment as exp
from lcjax.attention.token_sparse import layer_attention, token_sparse_attention
from lcjax.data import VOCAB_SIZE
from lcjax.data import tokenizer as tok
from lcjax.nn import DecoderConfig, DecoderLM, capture_attention, generate

TINY = dict(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, mlp_hidden=64)
OPTS = dict(coverage=0.5, min_tokens=6, window=4, pool=3, inner="softmax")


@pytest.fixture(scope="module")
def models():
    """A random dense model and the same weights with token-sparse attention in layer 0."""
    cfg = DecoderConfig(vocab_size=VOCAB_SIZE, max_len=128, **TINY)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: DecoderLM(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(3)  # numpy weights: no compile per parameter shape

    def draw(x):
        if len(x.shape) == 1:  # norm scales
            return (1 + 0.1 * rng.standard_normal(x.shape)).astype(np.float32)
        return (rng.standard_normal(x.shape) / np.sqrt(x.shape[0])).astype(np.float32)

    dense = nnx.merge(graphdef, jax.tree.map(draw, state))
    names, options = layer_attention(2, (0,), sparse_options=OPTS)
    return dense, exp.with_layer_attention(dense, names, options)


def _rows(n, b, seed):
    return np.random.default_rng(seed).integers(0, 256, (b, n)).astype(np.int32)


def _references(dense, sparse, rows):
    """Independent of the generator, in one compile: the dense model's own prefill cache
    writes, and the queries its layer 0 received (the sparse model's layer 0 sees the same
    embeddings); dense block 1's cache write of the hidden state after the sparse block 0
    (through the blocks); the token-sparse aux of layer 0 on its inputs."""
    b, n = rows.shape
    (_, dense_caches), inputs = capture_attention(
        dense, rows, cache=dense.init_cache(b, n + 2), tap="inputs")
    pos = jnp.broadcast_to(jnp.arange(n), (b, n))
    h1, _ = sparse.blocks[0](jnp.take(sparse.embed[...], rows, axis=0), pos)
    _, c1 = dense.blocks[1](h1, pos, cache=dense.blocks[1].attn.init_cache(b, n + 2))
    x = {"q": inputs[0]["q"], "k": dense_caches[0].k[:, :n], "v": dense_caches[0].v[:, :n]}
    _, aux = token_sparse_attention(x["q"], x["k"], x["v"], causal=True, return_aux=True,
                                    **OPTS)
    return dense_caches, c1, x, aux


@pytest.fixture(scope="module")
def prefilled(models):
    """The generator's sparse prefill of three 40-token prompts (two random, one constant)
    and the references."""
    dense, sparse = models
    rows = np.concatenate([_rows(40, 2, 2), np.full((1, 40), 7, np.int32)])
    gen = exp.SparsePrefillGenerator(sparse, dense, max_new_tokens=3, batch_size=3)
    return gen.prefill(rows), nnx.jit(_references)(dense, sparse, jnp.asarray(rows))


def test_dense_generator_is_lcjax_generate(models):
    """With dense attention the generator is greedy decoding: its answers to three prompts
    are those of lcjax.nn.generate (cached prefill) cut at EOS, specials dropped."""
    dense, _ = models
    rng = np.random.default_rng(1)
    prompts = ["".join(chr(c) for c in rng.integers(97, 123, 30)) for _ in range(3)]
    rows = np.stack([tok.encode(p, bos=True) for p in prompts])
    out = generate(dense, rows, 5, stop_tokens=(tok.EOS,), pad_id=tok.PAD)
    tokens, ends = np.asarray(out.tokens), np.asarray(out.lengths)
    want = [tok.decode(t[31:e][t[31:e] < 256]) for t, e in zip(tokens, ends)]
    gen = exp.SparsePrefillGenerator(dense, max_new_tokens=5, batch_size=3)
    assert gen(prompts) == want
    assert gen.kept == [{}] * 3  # no token-sparse layer


def test_generator_groups_prompts_by_length(models):
    """Prompts of several lengths are answered in their order, in rows of one length and
    ``batch_size`` (a short group repeats its last row), each answer cut at its first EOS
    with the specials dropped; kept fractions and budgets are filed per prompt."""
    _, sparse = models
    gen = exp.SparsePrefillGenerator(sparse, max_new_tokens=4, batch_size=2)
    seen = []

    def fake(rows):  # answer: the row's last prompt byte, BOS (dropped), EOS, then junk
        seen.append(rows.copy())
        last = rows[:, -1]
        out = np.stack([last, np.full_like(last, tok.BOS), np.full_like(last, tok.EOS),
                        last], axis=1)
        return out, [(rows[:, 1] / 1000.0, rows.shape[1] - last)]

    gen.generate_tokens = fake
    prompts = ["abc", "wxyz", "de", "fgh", "klm"]
    assert gen(prompts) == ["c", "z", "e", "h", "m"]
    assert [r.shape for r in seen] == [(2, 3), (2, 4), (2, 4), (2, 5)]
    for r in (seen[0], seen[2], seen[3]):  # "de", "klm", "wxyz" alone: repeated
        np.testing.assert_array_equal(r[0], r[1])
    assert [k[0] for k in gen.kept] == [ord(p[0]) / 1000.0 for p in prompts]
    assert [b[0] for b in gen.budgets] == [len(p) + 1 - ord(p[-1]) for p in prompts]


def test_sparse_prefill_caches_what_each_layer_receives(prefilled):
    """Layer 0 (token-sparse) sees the embeddings, so its cached K/V equal the dense
    model's own cache writes; layer 1's equal nn's cache write of the hidden state after
    the sparse block 0, and differ from the dense ones (the sparse prefill changed them)."""
    (_, caches, _), (dense_caches, c1, _, _) = prefilled
    assert [int(c.index) for c in caches] == [40, 40] and caches[0].k.shape[1] == 42
    for name in ("k", "v"):
        np.testing.assert_allclose(getattr(caches[0], name)[:, :40],
                                   getattr(dense_caches[0], name)[:, :40], atol=1e-5)
        np.testing.assert_allclose(getattr(caches[1], name)[:, :40],
                                   getattr(c1, name)[:, :40], atol=1e-5)
    assert float(jnp.max(jnp.abs(caches[1].v[:, :40] - dense_caches[1].v[:, :40]))) > 1e-3


def test_kept_fraction_and_budget_are_the_methods(prefilled):
    """Per example, the generator's kept fraction and budget of the token-sparse layer equal
    the aux of token_sparse_attention on the inputs that layer received (three prompts,
    different budgets); a prompt too short to be sparse keeps everything."""
    (_, _, [(kept, budget)]), (_, _, x, aux) = prefilled
    np.testing.assert_allclose(kept, aux["kept_fraction"], rtol=1e-6)
    np.testing.assert_array_equal(budget, aux["budget"])
    assert np.all(np.asarray(kept) < 1) and len(set(np.asarray(budget).tolist())) > 1
    short = exp.kept_fraction(x["q"][:, :9], x["k"][:, :9], OPTS)  # 9 <= min_tokens + window: dense
    np.testing.assert_array_equal(short[0], 1.0)
    np.testing.assert_array_equal(short[1], 9 - OPTS["window"])


def _pt(speedup, kept, sparse, c=0.1, layers="drift-chosen", task="t"):
    return {"speedup": speedup, "kept": kept, "coverage": c, "layers_label": layers,
            "label": f"coverage {c} ({layers})", "by_task_seeds": {task: list(sparse)}}


def test_claim_points_are_chosen_by_speed_and_kept_fraction_alone():
    """The paper's claim is checked at the least aggressive drift-chosen coverage reaching
    3.23x, the kept claim at the one keeping the most with kept <= 0.5 — never the one with
    the best accuracy; the all-layers rows are not candidates."""
    pts = [_pt(1.5, 0.45, [0, 0], c=0.2), _pt(3.3, 0.3, [0, 0], c=0.3),
           _pt(5.0, 0.2, [99, 99], c=0.5), _pt(3.5, 0.4, [99, 99], c=0.3, layers="all layers")]
    chosen = exp.claim_points(pts)
    assert chosen["paper"]["coverage"] == 0.3 and chosen["paper"]["layers_label"] == "drift-chosen"
    assert chosen["kept"]["coverage"] == 0.2
    assert exp.claim_points([_pt(2.0, 0.6, [0])]) == {"paper": None, "kept": None}


def test_claims_follow_the_paired_interval_over_seeds():
    """Per seed d = sparse − dense; holds when the 95% t-interval (scipy's quantile, by
    hand here) lies above −1 point; a spread of seeds whose mean is ~0 fails; one seed, an
    unlearned task or no qualifying coverage is not tested."""
    from scipy import stats

    dense = {"t": [99.0, 98.0, 100.0]}
    sparse = [98.8, 97.9, 99.9]  # d = -0.2, -0.1, -0.1
    paper, kept = exp.claims_from(dense, [_pt(4.0, 0.3, sparse)], ["t"])
    d = np.asarray(sparse) - np.asarray(dense["t"])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    assert paper.holds and kept.holds and paper.verdict == "holds"
    assert f"[{d.mean() - half:+.1f}, {d.mean() + half:+.1f}]" in paper.ours
    assert "per seed -0.2, -0.1, -0.1" in paper.ours and "4.00x" in paper.ours
    wide = [97.0, 99.0, 101.0]  # d = -2, +1, +1: mean 0, interval reaches below -1
    paper, _ = exp.claims_from(dense, [_pt(4.0, 0.3, wide)], ["t"])
    assert paper.holds is False and paper.verdict == "fails"
    one = exp.claims_from({"t": [99.0]}, [_pt(4.0, 0.3, [99.0])], ["t"])
    assert all(c.holds is None and "1 of 1 seeds learned t" in c.ours for c in one)
    unlearned = exp.claims_from({"t": [80.0, 95.0]}, [_pt(4.0, 0.3, [80.0, 95.0])], ["t"])
    assert all(c.holds is None and "1 of 2 seeds learned t (dense 80.0, 95.0%)" in c.ours
               for c in unlearned)
    # a seed whose dense model never learned the task is left out of the pairing: its
    # 0 − 0 would pull the interval toward 0
    paper, _ = exp.claims_from({"t": [99.0, 0.0, 98.0]}, [_pt(4.0, 0.3, [98.0, 0.0, 60.0])],
                               ["t"])
    assert paper.holds is False and "over seeds [0, 2] (per seed -1.0, -38.0)" in paper.ours
    paper, _ = exp.claims_from({"t": [99.0, 0.0, 98.0]}, [_pt(4.0, 0.3, [98.9, 0.0, 97.9])],
                               ["t"])
    assert paper.holds is True and "2 of 3 seeds learned t" in paper.ours
    paper, kept = exp.claims_from(dense, [_pt(1.2, 0.6, sparse)], ["t"], seq_len=125)
    assert paper.holds is None and "no coverage reaches 3.23x at T = 125" in paper.ours
    assert kept.holds is None and "no coverage keeps ≤ 0.5" in kept.ours


def test_points_aggregate_over_seeds_in_seed_order():
    """aggregate_points: per (layer set, coverage) the per-seed accuracies in record order,
    their means, the mean kept fraction and the largest budget."""
    def rec(seed, acc, kept, budget):
        return {"seed": seed, "points": [
            {"coverage": 0.5, "layers_label": "drift-chosen", "layers": [1], "options": {},
             "by_task": {"t": acc, "overall": acc}, "kept": kept, "budget_max": budget}]}

    (p,) = exp.aggregate_points([rec(0, 90.0, 0.2, 30), rec(1, 70.0, 0.4, 50)], ["t"])
    assert p["by_task_seeds"]["t"] == [90.0, 70.0] and p["by_task"]["t"] == 80.0
    assert p["kept"] == pytest.approx(0.3) and p["budget_max"] == 50
    assert p["label"] == "coverage 0.5 (drift-chosen)"


def test_seed_records_resume_and_rerun_on_another_setting(tmp_path, monkeypatch):
    """A kept seed is reused only under the same setting (fingerprint); ``only`` runs a
    subset; the setting's first seed alone gets the diagnosis and the eval report."""
    calls = []

    def fake(seed, setting, *, eval_report_dir=None, command="", log=print):
        calls.append((seed, setting["diagnose_per_cell"], eval_report_dir is not None))
        return {"seed": seed, "steps": setting["steps"]}

    monkeypatch.setattr(exp, "run_seed", fake)
    setting = exp.resolve_setting(False, seeds=(0, 1, 2), steps=7)
    out = tmp_path / "ts"
    exp.seed_records(setting, out, keep=True, only={1}, log=lambda *a: None)
    assert calls == [(1, 0, False)]
    recs = exp.seed_records(setting, out, keep=True, log=lambda *a: None)
    assert [r["seed"] for r in recs] == [0, 1, 2]
    assert calls[1:] == [(0, setting["diagnose_per_cell"], True), (2, 0, False)]
    exp.seed_records(setting, out, keep=True, log=lambda *a: None)
    assert len(calls) == 3  # all kept
    exp.seed_records(exp.resolve_setting(False, seeds=(0, 1, 2), steps=8), out, keep=True,
                     log=lambda *a: None)
    assert len(calls) == 6  # another setting: every seed again
