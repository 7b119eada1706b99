"""Tests for lcjax.analysis.spectral: every metric against a hand computation on a
constructed matrix (identity, rank one, a known spectrum; uniform, permutation and causal
attention), masking, the randomised SVD against the exact one, and the per-layer report of
a model. Each test compiles one program (the hand cases share one batch)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.analysis.spectral import (
    effective_rank,
    hidden_state_metrics,
    perturbation_ratio,
    plot_spectral,
    randomized_singular_values,
    spectral_flatness,
    spectral_gap,
    spectral_report,
    stable_rank,
)
from lcjax.nn import DecoderConfig, DecoderLM


def orthogonal(seed, n):
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))
    return q


def with_spectrum(sigma, n, d, seed=0):
    """U diag(σ) Vᵀ [n, d] with random orthonormal U, V."""
    k = len(sigma)
    return (orthogonal(seed, n)[:, :k] * sigma) @ orthogonal(seed + 1, d)[:, :k].T


def test_metrics_by_hand_on_constructed_matrices_with_masked_padding():
    rng = np.random.default_rng(0)
    n, d = 9, 6
    garbage = lambda k: 100 * rng.standard_normal((k, d))
    a, b = rng.uniform(0.5, 2, n), rng.standard_normal(d)
    s = np.array([1, -1, 1, 1, 1, 1, 1, 1, -1])  # rows ±b: cos = s_i s_j
    sigma = np.array([8.0, 4.0, 2.0, 2.0, 1.0, 1.0])
    rand8 = rng.standard_normal((8, d)) + 0.7
    cases = {  # name: (matrix [9, 6], valid rows); padding rows hold garbage, masked out
        "identity": (np.concatenate([np.eye(d), garbage(3)]), 6),
        "rank1": (np.outer(a, b), 9),
        "rank1_signed": (np.outer(s * a, b), 9),
        "spectrum": (np.concatenate([with_spectrum(sigma, 7, d), garbage(2)]), 7),
        "random": (np.concatenate([rand8, garbage(1)]), 8),
    }
    x = jnp.asarray(np.stack([m for m, _ in cases.values()]), jnp.float32)
    mask = jnp.asarray([[i < k for i in range(n)] for _, k in cases.values()])
    got = {k: dict(zip(cases, np.asarray(v)))
           for k, v in jax.jit(hidden_state_metrics)(x, mask).items()}
    m = lambda name: {k: float(v[name]) for k, v in got.items()}

    ident = m("identity")
    assert ident["stable_rank"] == pytest.approx(6, rel=1e-5)
    assert ident["effective_rank"] == pytest.approx(6, rel=1e-5)
    assert ident["spectral_flatness"] == pytest.approx(1, rel=1e-5)
    assert ident["anisotropy"] == pytest.approx(0, abs=1e-6)  # orthogonal rows

    one = m("rank1")  # rank 1, every row a positive multiple of b
    assert one["stable_rank"] == pytest.approx(1, rel=1e-5)
    assert one["effective_rank"] == pytest.approx(1, rel=1e-4)
    assert one["spectral_flatness"] == 0  # σ_2 … below the numerical rank
    assert one["anisotropy"] == pytest.approx(1, rel=1e-5)
    assert m("rank1_signed")["anisotropy"] == pytest.approx((s.sum() ** 2 - n) / (n * (n - 1)),
                                                            abs=1e-6)

    spec = m("spectrum")
    p = sigma / sigma.sum()
    assert spec["stable_rank"] == pytest.approx(90 / 64, rel=1e-5)
    assert spec["effective_rank"] == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-5)
    assert spec["spectral_flatness"] == pytest.approx(128 ** (1 / 6) / 3, rel=1e-5)

    u = rand8 / np.linalg.norm(rand8, axis=1, keepdims=True)  # anisotropy by brute force
    cos = u @ u.T
    assert m("random")["anisotropy"] == pytest.approx((cos.sum() - np.trace(cos)) / (8 * 7),
                                                      rel=1e-5)
    sv = np.linalg.svd(rand8, compute_uv=False)
    assert m("random")["stable_rank"] == pytest.approx((sv**2).sum() / sv[0] ** 2, rel=1e-5)

    # the σ-level functions, with ``count`` limiting them to the first values
    sr, er, sf = jax.jit(lambda: (stable_rank(jnp.asarray([4.0, 2.0, 1.0])),
                                  effective_rank(jnp.asarray([3.0, 1.0, 5.0]), 2),
                                  spectral_flatness(jnp.asarray([4.0, 1.0, 9.0]), 2)))()
    assert float(sr) == pytest.approx(21 / 16)
    assert float(er) == pytest.approx(math.exp(-(0.75 * math.log(0.75)
                                                 + 0.25 * math.log(0.25))), rel=1e-6)
    assert float(sf) == pytest.approx(2 / 2.5, rel=1e-6)


def test_attention_spectral_gap_uniform_permutation_and_causal():
    t = 6
    assert float(spectral_gap(np.full((t, t), 1 / t))) == pytest.approx(1, abs=1e-6)
    cyclic = np.roll(np.eye(t), 1, axis=1)  # eigenvalues: the t-th roots of unity
    assert float(spectral_gap(cyclic)) == pytest.approx(0, abs=1e-6)
    assert float(spectral_gap(np.eye(t))) == pytest.approx(0, abs=1e-6)
    # uniform causal attention: eigenvalues 1, 1/2, ..., 1/t -> gap 1/2, either path
    causal = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    assert float(spectral_gap(causal)) == pytest.approx(0.5, abs=1e-6)
    assert float(spectral_gap(causal, triangular=False)) == pytest.approx(0.5, abs=1e-6)
    # random causal softmax rows, batched [2, 3, t, t]: the diagonal equals LAPACK's eig
    z = np.random.default_rng(3).standard_normal((2, 3, t, t)) * 2
    z = np.where(np.tril(np.ones((t, t), bool)), z, -np.inf)
    w = np.exp(z - z.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    lam = np.sort(np.abs(np.linalg.eigvals(w)), axis=-1)[..., -2]
    np.testing.assert_allclose(spectral_gap(w), 1 - lam, atol=1e-5)
    np.testing.assert_allclose(jax.jit(lambda w: spectral_gap(w, triangular=True))(w),
                               1 - lam, atol=1e-5)
    with pytest.raises(ValueError, match="triangular"):
        jax.jit(spectral_gap)(w)
    with pytest.raises(ValueError, match="square"):
        spectral_gap(np.ones((3, 4)))


def test_randomized_svd_matches_exact_top_values():
    sigma = 10.0 * 0.6 ** np.arange(24)
    x = jnp.asarray(with_spectrum(sigma, 120, 32)[None], jnp.float32)

    @jax.jit
    def run(x, key):
        k1, k2 = jax.random.split(key)
        return (randomized_singular_values(x, 6, key=k1), hidden_state_metrics(x),
                hidden_state_metrics(x, rank=6, key=k2))

    approx, exact, fast = run(x, jax.random.key(0))
    np.testing.assert_allclose(approx[0], sigma[:6], rtol=1e-3)
    np.testing.assert_allclose(fast["stable_rank"], exact["stable_rank"], rtol=1e-3)
    np.testing.assert_allclose(fast["anisotropy"], exact["anisotropy"], rtol=1e-6)
    with pytest.raises(ValueError, match="rank"):
        randomized_singular_values(x, 33, key=jax.random.key(0))


def test_perturbation_ratio_by_hand():
    rng = np.random.default_rng(4)
    prev, d = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 3)) * 1e-3
    scale = np.array([1.0, 2.0, 3.0, 4.0, 5.0])[None, :, None]  # token t amplified (t+1)x
    cur, cur_p = 7 * prev, 7 * prev + scale * d
    mask = jnp.asarray([[True] * 5, [True, True, False, False, False]])
    args = (jnp.asarray(a, jnp.float32) for a in (prev, cur, prev + d, cur_p))
    np.testing.assert_allclose(jax.jit(perturbation_ratio)(*args, mask), [3.0, 1.5], rtol=1e-3)


def test_spectral_report_of_a_model_masks_padding_and_plots(tmp_path):
    cfg = DecoderConfig(vocab_size=23, d_model=16, num_layers=2, num_heads=2, num_kv_heads=1,
                        head_dim=8, mlp_hidden=24, max_len=16)  # any lcjax LM (TRSP or not)
    # random parameters filled in numpy (no compiled initialisers), norm scales 1
    graphdef, state = nnx.split(nnx.eval_shape(lambda: DecoderLM(cfg, rngs=nnx.Rngs(0))))
    fill = np.random.default_rng(6)
    value = lambda v: (np.ones(v.shape) if v.ndim == 1 and v.shape[0] == 16 else
                       fill.standard_normal(v.shape) / math.sqrt(v.shape[0] if v.ndim else 1))
    model = nnx.merge(graphdef, jax.tree.map(lambda v: jnp.asarray(value(v), v.dtype), state))
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 23, (2, 12)).astype(np.int32)
    seg = jnp.asarray([[0] * 12, [0] * 9 + [-1] * 3], jnp.int32)
    rep = spectral_report(model, jnp.asarray(tokens), segment_ids=seg)
    # the same padded row with other padding tokens, first in its batch
    other = np.stack([tokens[1], tokens[0]])
    other[0, 9:] = (other[0, 9:] + 7) % 23
    rep2 = spectral_report(model, jnp.asarray(other), segment_ids=seg[::-1])
    for k in ("stable_rank", "effective_rank", "spectral_flatness", "anisotropy",
              "perturbation_ratio"):
        assert rep[k].shape == (3, 2), k
    assert rep["spectral_gap"].shape == (3, 2, 2)
    assert np.all(np.isnan(rep["perturbation_ratio"][0]))
    assert np.all(np.isnan(rep["spectral_gap"][0]))
    assert np.all((rep["spectral_gap"][1:] >= 0) & (rep["spectral_gap"][1:] <= 1))
    assert np.all(rep["perturbation_ratio"][1:] > 0)
    assert np.all(rep["stable_rank"] >= 1) and np.all(rep["anisotropy"] <= 1)
    for k in ("stable_rank", "effective_rank", "spectral_flatness", "anisotropy",
              "spectral_gap"):
        np.testing.assert_allclose(rep[k][:, 1], rep2[k][:, 0], rtol=1e-4, atol=1e-6,
                                   err_msg=k)
    path = plot_spectral({"a": rep, "b": rep2}, tmp_path / "spectral.png", title="tiny")
    assert path.stat().st_size > 5000
