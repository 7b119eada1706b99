"""Numerics and decoding limits of the linear-feature baselines (issue 36 item 5): ``linear``
in float16 against a float64 reference at large logits, and the up-front messages of
``generate`` with variants that cannot decode from a KV cache (performer: no mask;
nystrom: not causal)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.attention import linear as L
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.nn.sampling import generate


@pytest.mark.parametrize("causal", [False, True])
def test_linear_float16_large_logits_finite_and_accurate(causal):
    """q, k ~ 8·N(0, 1), T = D = 64 (scores s·q·k in the hundreds): accumulated in float32,
    the float16 output is finite and equal to the float64 definition within float16
    rounding; the gradients are finite."""
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q, k = ((jax.random.normal(x, (1, 64, 2, 64)) * 8).astype(jnp.float16) for x in (kq, kk))
    v = jax.random.normal(kv, (1, 64, 2, 64)).astype(jnp.float16)
    out = L.linear_attention(q, k, v, causal=causal)
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    a = np.einsum("bthd,bshd->bhts", q64, k64) / 8.0                   # s = 1/√64
    if causal:  # out_i = s Σ_{j<=i} (q_i·k_j) v_j / (i + 1)
        a = a * np.tril(np.ones((64, 64))) / np.arange(1, 65)[:, None]
    else:
        a = a / 64
    want = np.einsum("bhts,bshv->bthv", a, v64)
    assert out.dtype == jnp.float16 and bool(jnp.isfinite(out).all())
    np.testing.assert_allclose(np.asarray(out, np.float64), np.asarray(want), rtol=2e-3,
                               atol=2e-3 * np.abs(want).max())
    grads = jax.grad(lambda *a: L.linear_attention(*a, causal=causal).astype(jnp.float32).sum(),
                     argnums=(0, 1, 2))(q, k, v)
    assert all(bool(jnp.isfinite(g).all()) for g in grads)


@pytest.mark.parametrize("attention, says", [
    ("performer", "cannot decode from a KV cache"),
    ("nystrom", "is not causal"),
])
def test_generate_refuses_variants_without_cache_decoding(attention, says):
    cfg = DecoderConfig(vocab_size=260, d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                        head_dim=16, mlp_hidden=64, max_len=32, attention=attention)
    model = DecoderLM(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=says):
        generate(model, jnp.ones((1, 5), jnp.int32), max_new_tokens=2)
