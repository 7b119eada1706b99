"""Performer FAVOR+ (lcjax/attention/performer.py): the fast paths against an independent
numpy computation of the same random features, the features' expectation against the exact
softmax kernel, and the approximation error falling with the number of features."""

import jax
import jax.numpy as jnp
import numpy as np

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
