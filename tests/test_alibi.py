"""ALiBi bias (``alibi_slopes`` / ``alibi_offset``) and NAPE positions.

The dense reference (core.dot_product_attention), blockwise softmax and entmax's XLA path
(all through the one tile-score function, blocks.block_scores) are compared with an
independent numpy reference: scores q·k/√D - m_h·|i + offset - j| masked causally, then a
softmax or an exact sorted 1.5-entmax per row. The entmax kernel declines ALiBi; NAPE in the
model uses slopes 1/1 .. 1/(H/2) on the first half of the heads and decodes through the KV
cache exactly like the full pass.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding import cached_logits
from flax import nnx

from lcjax import attention
from lcjax.nn import Attention, DecoderConfig, DecoderLM
from lcjax.nn.attention import nape_slopes

B, H, HKV, D = 2, 4, 2, 8
SLOPES = np.array([1.0, 0.5, 0.0, 0.25])


def _entmax15_rows(x):
    """Exact 1.5-entmax of each row of x (-inf = excluded), by sorting (Peters et al. 2019)."""
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        live = np.isfinite(row)
        if not live.any():
            continue
        z = row[live] / 2.0  # (α - 1) x with α = 1.5
        zs = np.sort(z)[::-1]
        n = np.arange(1, len(zs) + 1)
        mean = np.cumsum(zs) / n
        ss = np.cumsum(zs ** 2) / n
        delta = (1.0 - n * (ss - mean ** 2)) / n
        tau = mean - np.sqrt(np.maximum(delta, 0.0))
        support = int((tau <= zs).sum())
        p = np.maximum(z - tau[support - 1], 0.0) ** 2
        full = np.zeros_like(row)
        full[live] = p
        out[idx] = full
    return out


def _reference(q, k, v, *, causal, offset, mapping):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    t, s = q.shape[1], k.shape[1]
    kk = np.repeat(k, H // HKV, axis=2)
    vv = np.repeat(v, H // HKV, axis=2)
    x = np.einsum("bthd,bshd->bhts", q, kk) / np.sqrt(D)
    i = np.arange(t)[:, None] + offset
    j = np.arange(s)[None, :]
    x = x - SLOPES[None, :, None, None] * np.abs(i - j)[None, None]
    if causal:
        x = np.where((j <= i)[None, None], x, -np.inf)
    if mapping == "softmax":
        p = np.exp(x - x.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
    else:
        p = _entmax15_rows(x)
    return np.einsum("bhts,bshd->bthd", p, vv)


def _qkv(t, s, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(kq, (B, t, H, D)), jax.random.normal(kk, (B, s, HKV, D)),
            jax.random.normal(kv, (B, s, HKV, D)))


@pytest.mark.parametrize("causal,t,s,offset", [(True, 11, 17, 6), (False, 9, 14, 3)])
def test_alibi_matches_numpy_reference(causal, t, s, offset):
    """Causal with the query block at an offset (a decoding step), and bidirectional cross
    attention with a symmetric distance; GQA (H = 4, Hkv = 2), one head with slope 0."""
    q, k, v = _qkv(t, s)
    if causal:  # the causal alignment of the dense/blockwise paths is q_offset; a mask here
        mask = jnp.arange(s)[None, :] <= jnp.arange(t)[:, None] + offset
        kwargs = dict(causal=False, mask=mask)
    else:
        kwargs = dict(causal=False)
    soft = _reference(q, k, v, causal=causal, offset=offset, mapping="softmax")
    ent = _reference(q, k, v, causal=causal, offset=offset, mapping="entmax")
    opts = dict(alibi_slopes=jnp.asarray(SLOPES), alibi_offset=offset, **kwargs)

    @jax.jit
    def run(q, k, v):
        return {
            "softmax": attention.get("softmax")(q, k, v, **opts),
            "blockwise": attention.get("blockwise")(q, k, v, block_q=4, block_kv=4, **opts),
            "entmax": attention.get("entmax")(q, k, v, implementation="xla", block_q=4,
                                              block_kv=4, **opts),
        }

    got = run(q, k, v)
    for name, out in got.items():
        want = ent if name == "entmax" else soft
        np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=0, err_msg=name)
    # the bias matters: without it the result differs
    plain = attention.get("softmax")(q, k, v, **kwargs)
    assert float(np.abs(np.asarray(plain) - soft).max()) > 1e-2


def test_blockwise_causal_q_offset_and_gradients_with_alibi():
    """blockwise (causal, static q_offset, traced alibi_offset = 0) equals the dense
    reference in value and in dq, dk, dv (the backward uses the same tile scores)."""
    q, k, v = _qkv(10, 15, seed=1)
    cot = jax.random.normal(jax.random.key(7), (B, 10, H, D))
    slopes = jnp.asarray(SLOPES)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * cot)

    dense = lambda q, k, v: attention.dot_product_attention(q, k, v, causal=True, q_offset=5,
                                                            alibi_slopes=slopes)
    block = lambda q, k, v: attention.blockwise_attention(q, k, v, causal=True, q_offset=5,
                                                          alibi_slopes=slopes, block_q=4,
                                                          block_kv=4)
    np.testing.assert_allclose(block(q, k, v), dense(q, k, v), atol=2e-6)
    want = _reference(q, k, v, causal=True, offset=5, mapping="softmax")
    np.testing.assert_allclose(np.asarray(dense(q, k, v)), want, atol=2e-5)
    g_block = jax.jit(jax.grad(loss(block), argnums=(0, 1, 2)))(q, k, v)
    g_dense = jax.jit(jax.grad(loss(dense), argnums=(0, 1, 2)))(q, k, v)
    for name, a, b in zip("qkv", g_block, g_dense):
        np.testing.assert_allclose(a, b, atol=2e-5, err_msg=f"d{name}")


def test_kernel_declines_alibi_and_bad_options_raise():
    q, k, v = _qkv(16, 16)
    with pytest.raises(NotImplementedError, match="alibi"):
        attention.get("entmax")(q, k, v, alibi_slopes=SLOPES, implementation="pallas")
    with pytest.raises(ValueError, match="alibi_slopes"):
        attention.get("blockwise")(q, k, v, alibi_slopes=np.ones(3))
    with pytest.raises(ValueError, match="alibi_slopes"):  # the jax anchor takes no ALiBi
        attention.get("jax")(q, k, v, alibi_slopes=SLOPES)
    with pytest.raises(ValueError, match="alibi_slopes"):
        Attention(16, H, HKV, D, attention="jax", position="nape", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="position"):
        DecoderConfig(position="alibi")


def test_nape_slopes_and_kv_cache_decoding_equals_full_pass():
    assert nape_slopes(4) == (1.0, 0.5, 0.0, 0.0)
    assert nape_slopes(8) == (1.0, 0.5, 1 / 3, 0.25, 0.0, 0.0, 0.0, 0.0)
    config = DecoderConfig(vocab_size=32, d_model=32, num_layers=2, num_heads=H,
                           num_kv_heads=HKV, head_dim=D, mlp_hidden=32, max_len=16,
                           attention="blockwise", attention_options={"block_q": 4,
                                                                     "block_kv": 4},
                           position="nape")
    model = DecoderLM(config, rngs=nnx.Rngs(0))
    assert model.blocks[0].attn.attention_options["alibi_slopes"] == nape_slopes(H)
    tokens = jax.random.randint(jax.random.key(3), (B, 9), 0, 32)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)
    np.testing.assert_allclose(np.asarray(cached_logits(model, tokens, [5, 1, 1, 1, 1], 16)),
                               np.asarray(full), atol=2e-5, rtol=0)
    # the bias is applied: the same weights without it (NoPE) give other logits
    nope = DecoderLM(dataclasses.replace(config, position="none"), rngs=nnx.Rngs(0))
    assert float(jnp.abs(nope(tokens) - full).max()) > 1e-4
