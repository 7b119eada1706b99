"""Performer FAVOR+ (lcjax/attention/performer.py): the fast paths against an independent
numpy computation of the same random features, the features' expectation against the exact
softmax kernel, and the approximation error falling with the number of features."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcjax.attention import performer as PF
from lcjax.attention.core import dot_product_attention


def _numpy_favor(q, k, v, w, scale, causal):
    """FAVOR+ in numpy, float64: φ(x) = exp(W√s x − s‖x‖²/2)/√m, out = AV / A1."""
    q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, w))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    phi = lambda x: np.exp(np.sqrt(scale) * x @ w.T - 0.5 * scale * np.sum(x * x, -1,
                                                                           keepdims=True))
    a = np.einsum("bthm,bshm->bhts", phi(q), phi(k))
    if causal:
        a = a * np.tril(np.ones(a.shape[-2:]))
    return np.einsum("bhts,bshv->bthv", a, v) / a.sum(-1)[..., None].transpose(0, 2, 1, 3)


def test_matches_numpy_and_reference():
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (2, 19, 4, 8)) * 0.5
    k = jax.random.normal(kk, (2, 19, 2, 8)) * 0.5
    v = jax.random.normal(kv, (2, 19, 2, 8))
    w = PF.performer_projection(None, 16, 8)
    for causal in (False, True):
        out = PF.performer_attention(q, k, v, causal=causal, num_features=16, chunk=6)
        want = _numpy_favor(q, k, v, w, 1 / np.sqrt(8), causal)
        np.testing.assert_allclose(out, want, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(PF.performer_reference(q, k, v, causal=causal,
                                                          num_features=16), want, atol=2e-5,
                                   rtol=1e-4)


def test_features_are_unbiased_and_error_falls_with_features():
    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        x, y = rng.normal(size=4) * 0.6, rng.normal(size=4) * 0.6
        def one(seed):
            w = PF.performer_projection(jax.random.key(seed), 4, 4, jnp.float64)
            fx = PF.performer_features(jnp.asarray(x), w, 1.0, is_query=False)
            return fx @ PF.performer_features(jnp.asarray(y), w, 1.0, is_query=False)

        est = np.asarray(jax.jit(jax.vmap(one))(jnp.arange(1000)))
        se = np.std(est, ddof=1) / np.sqrt(len(est))
        assert abs(np.mean(est) - np.exp(x @ y)) < 3 * se
        kq, kk, kv = jax.random.split(jax.random.key(2), 3)
        q, k, v = (jax.random.normal(kk_, (1, 32, 2, 8), jnp.float64) * 0.5
                   for kk_ in (kq, kk, kv))
        exact = dot_product_attention(q, k, v)
        attend = jax.jit(PF.performer_attention, static_argnames=("num_features", "key"))
        errs = [float(np.mean([jnp.abs(attend(q, k, v, num_features=m, key=s) - exact).mean()
                               for s in range(2)]))
                for m in (4, 64, 1024)]
        assert errs[0] > errs[1] > errs[2], errs


def _numpy_log_weights(q, k, w, scale, causal):
    """Attention weights [B, H, T, S] of FAVOR+ in float64, in log space:
    ℓ_ij = logsumexp_m(log φ_m(q_i) + log φ_m(k_j)), softmax over the visible j."""
    q, k, w = (np.asarray(x, np.float64) for x in (q, k, w))
    k = np.repeat(k, q.shape[2] // k.shape[2], axis=2)
    logphi = lambda x: (np.sqrt(scale) * x @ w.T - 0.5 * scale * np.sum(x * x, -1, keepdims=True)
                        - 0.5 * np.log(w.shape[0]))
    z = logphi(q).transpose(0, 2, 1, 3)[:, :, :, None, :] + \
        logphi(k).transpose(0, 2, 1, 3)[:, :, None, :, :]               # [B, H, T, S, m]
    zmax = z.max(-1, keepdims=True)
    ell = (zmax + np.log(np.exp(z - zmax).sum(-1, keepdims=True)))[..., 0]
    if causal:
        t, s = ell.shape[-2:]
        ell = np.where(np.arange(s)[None, :] <= np.arange(t)[:, None], ell, -np.inf)
    a = np.exp(ell - ell.max(-1, keepdims=True))
    return a / a.sum(-1, keepdims=True)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("causal", [False, True])
def test_large_logits_give_convex_rows_equal_to_float64(dtype, causal):
    """q, k ~ 8·N(0, 1): the feature exponents reach hundreds (exp overflows float32 and the
    old fixed shifts gave NaN / all-zero rows). V = identity reads the weights off the
    output: finite, >= 0, zero on hidden keys, rows summing to 1, equal to the float64
    weights of the same random features; a random V gives weights @ V."""
    t, s, m, d = 24, 24, 16, 32
    kq, kk, kv = jax.random.split(jax.random.key(3), 3)
    q = (jax.random.normal(kq, (2, t, 2, d)) * 8).astype(dtype)
    k = (jax.random.normal(kk, (2, s, 1, d)) * 8).astype(dtype)
    eye = jnp.broadcast_to(jnp.eye(s, dtype=dtype)[None, :, None, :], (2, s, 1, s))
    opts = dict(causal=causal, num_features=m, chunk=5)
    weights = np.asarray(PF.performer_attention(q, k, eye, **opts), np.float64)  # [B, T, H, S]
    w = PF.performer_projection(None, m, d)
    want = _numpy_log_weights(q, k, w, 1 / np.sqrt(d), causal).transpose(0, 2, 1, 3)
    assert np.isfinite(weights).all()
    assert (weights >= 0).all()
    tol = 2e-3 if dtype == "float16" else 2e-5
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=tol * 4)
    if causal:
        hidden = np.arange(s)[None, :] > np.arange(t)[:, None]
        assert (weights[:, hidden.nonzero()[0], :, hidden.nonzero()[1]] == 0).all()
    # the old map lost every row's weight to over/underflow: the true weights are peaked
    assert want.max(-1).mean() > 0.5
    np.testing.assert_allclose(weights, want, atol=tol)
    v = jax.random.normal(kv, (2, s, 1, 8)).astype(dtype)
    out = np.asarray(PF.performer_attention(q, k, v, **opts), np.float64)
    vv = np.asarray(v, np.float64)[:, :, 0]                              # [B, S, Dv]
    np.testing.assert_allclose(out, np.einsum("bths,bsv->bthv", want, vv), atol=tol * 10)
    ref = np.asarray(PF.performer_reference(q, k, v, causal=causal, num_features=m), np.float64)
    np.testing.assert_allclose(out, ref, atol=tol * 10)


def test_large_logits_gradients_finite():
    kq, kk, kv = jax.random.split(jax.random.key(4), 3)
    q, k, v = (jax.random.normal(x, (1, 20, 2, 8)) * 8 for x in (kq, kk, kv))
    for causal in (False, True):
        f = lambda q, k, v, c=causal: jnp.sum(PF.performer_attention(
            q, k, v, causal=c, num_features=16, chunk=6) ** 2)
        grads = jax.grad(f, argnums=(0, 1, 2))(q, k, v)
        assert all(bool(jnp.isfinite(g).all()) for g in grads)
