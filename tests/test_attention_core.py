"""Attention core: reference vs jax.nn.dot_product_attention, blockwise vs dense,
LSE merge, masks, gradients vs finite differences, errors."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcjax import attention
from lcjax.attention import (
    blockwise_attention,
    blockwise_attention_bwd,
    dot_product_attention,
    jax_dot_product_attention,
    lengths_to_segment_ids,
    merge_attention,
)


def _qkv(seed, b=2, t=24, s=24, h=4, hk=2, d=16, dtype=jnp.float32):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(kq, (b, t, h, d), dtype)
    k = jax.random.normal(kk, (b, s, hk, d), dtype)
    v = jax.random.normal(kv, (b, s, hk, d), dtype)
    return q, k, v


def _naive(q, k, v, allowed, scale):
    """Independent numpy reference: repeat kv heads, explicit softmax over allowed keys."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bthd,bshd->bhts", q, k) * scale
    allowed = np.broadcast_to(allowed, s.shape)
    s = np.where(allowed, s, -np.inf)
    m = np.max(s, -1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m)
    denom = p.sum(-1, keepdims=True)
    p = p / np.where(denom > 0, denom, 1)
    return np.einsum("bhts,bshd->bthd", p, v)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
def test_reference_equals_jax(causal, heads):
    h, hk = heads
    q, k, v = _qkv(0, h=h, hk=hk)
    ours = dot_product_attention(q, k, v, causal=causal)
    theirs = jax.nn.dot_product_attention(q, k, v, is_causal=causal)
    chex.assert_trees_all_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_reference_masked_equals_jax_and_numpy():
    q, k, v = _qkv(1, t=20, s=28)
    mask = jax.random.bernoulli(jax.random.PRNGKey(5), 0.6, (2, 4, 20, 28))
    mask = mask.at[:, :, :, 0].set(True)  # jax gives NaN-free output only with a visible key
    ours = dot_product_attention(q, k, v, mask=mask)
    theirs = jax.nn.dot_product_attention(q, k, v, mask=mask)
    chex.assert_trees_all_close(ours, theirs, atol=1e-5, rtol=1e-5)
    naive = _naive(q, k, v, np.asarray(mask), 1 / 4.0)
    np.testing.assert_allclose(ours, naive, atol=1e-5)


def test_contract_wrapper_and_registry():
    q, k, v = _qkv(2)
    assert set(["softmax", "blockwise", "jax"]) <= set(attention.available())
    for name in ("softmax", "blockwise", "jax"):
        out = attention.get(name)(q, k, v, causal=True)
        chex.assert_trees_all_close(out, jax_dot_product_attention(q, k, v, causal=True),
                                    atol=1e-5)
    fn = lambda q, k, v, **kw: q
    assert attention.get(fn) is fn
    with pytest.raises(ValueError, match="unknown attention variant"):
        attention.get("no-such-variant")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("blocks", [(8, 8), (8, 16), (16, 8), (512, 512)])
@pytest.mark.parametrize("lens", [(37, 37), (24, 45)])
def test_blockwise_equals_dense(causal, blocks, lens):
    t, s = lens
    q, k, v = _qkv(3, t=t, s=s)
    dense, lse_d = dot_product_attention(q, k, v, causal=causal, return_lse=True)
    out, lse = blockwise_attention(q, k, v, causal=causal, block_q=blocks[0],
                                   block_kv=blocks[1], return_lse=True)
    np.testing.assert_allclose(out, dense, atol=1e-5)
    np.testing.assert_allclose(lse, lse_d, atol=1e-5)


@pytest.mark.parametrize("q_offset", [0, 5, 21])
def test_blockwise_q_offset_matches_dense(q_offset):
    q, k, v = _qkv(4, t=16, s=40)
    dense = dot_product_attention(q, k, v, causal=True, q_offset=q_offset)
    out = blockwise_attention(q, k, v, causal=True, q_offset=q_offset, block_q=8, block_kv=8)
    np.testing.assert_allclose(out, dense, atol=1e-5)
    allowed = np.arange(40)[None, :] <= np.arange(16)[:, None] + q_offset
    np.testing.assert_allclose(out, _naive(q, k, v, allowed, 0.25), atol=1e-5)


def test_lse_is_logsumexp_of_scores():
    q, k, v = _qkv(5)
    _, lse = dot_product_attention(q, k, v, return_lse=True)
    kr = jnp.repeat(k, 2, axis=2)
    scores = jnp.einsum("bthd,bshd->bth s".replace(" ", ""), q, kr) / 4.0
    np.testing.assert_allclose(lse, jax.scipy.special.logsumexp(scores, axis=-1), atol=1e-5)


def test_segments_and_padding():
    q, k, v = _qkv(6, t=20, s=20)
    seg = jnp.array([[0] * 7 + [1] * 10 + [-1] * 3, [2] * 20])
    allowed = (np.asarray(seg)[:, None, :, None] == np.asarray(seg)[:, None, None, :]) & (
        np.asarray(seg)[:, None, :, None] >= 0
    )
    causal = np.tril(np.ones((20, 20), bool))
    want = _naive(q, k, v, allowed & causal, 0.25)
    for fn in (dot_product_attention,
               functools.partial(blockwise_attention, block_q=8, block_kv=8)):
        out = fn(q, k, v, causal=True, q_segment_ids=seg, kv_segment_ids=seg)
        np.testing.assert_allclose(out, want, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(out[0, 17:]), 0.0)  # padding rows
    lens = jnp.array([3, 7])
    np.testing.assert_array_equal(lengths_to_segment_ids(lens, 5),
                                  [[0, 0, 0, -1, -1], [0, 0, 0, 0, 0]])


def test_empty_rows_are_zero_not_nan():
    q, k, v = _qkv(7, t=16, s=16)
    mask = jnp.ones((1, 1, 16, 16), bool).at[..., 3, :].set(False)
    for fn in (dot_product_attention,
               functools.partial(blockwise_attention, block_q=4, block_kv=8)):
        out, lse = fn(q, k, v, mask=mask, return_lse=True)
        assert not np.isnan(np.asarray(out)).any()
        np.testing.assert_array_equal(np.asarray(out[:, 3]), 0.0)
        assert np.all(np.isneginf(np.asarray(lse[:, 3])))
        loss = lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v, mask=mask) ** 2)
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
        assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_merge_attention_equals_dense():
    q, k, v = _qkv(8, s=30)
    full, lse_full = dot_product_attention(q, k, v, return_lse=True)
    a, la = dot_product_attention(q, k[:, :11], v[:, :11], return_lse=True)
    b, lb = blockwise_attention(q, k[:, 11:], v[:, 11:], block_q=8, block_kv=8, return_lse=True)
    out, lse = merge_attention(a, la, b, lb)
    np.testing.assert_allclose(out, full, atol=1e-5)
    np.testing.assert_allclose(lse, lse_full, atol=1e-5)
    # an empty part (lse = -inf) contributes nothing; two empty parts give zeros
    neg = jnp.full_like(la, -jnp.inf)
    out2, _ = merge_attention(full, lse_full, jnp.ones_like(full) * 7.0, neg)
    np.testing.assert_allclose(out2, full, atol=1e-6)
    out3, lse3 = merge_attention(full, neg, full, neg)
    np.testing.assert_array_equal(np.asarray(out3), 0.0)
    assert np.all(np.isneginf(np.asarray(lse3)))


def test_merge_is_associative_over_three_chunks():
    q, k, v = _qkv(9, s=36)
    full = dot_product_attention(q, k, v)
    parts = [dot_product_attention(q, k[:, i:i + 12], v[:, i:i + 12], return_lse=True)
             for i in (0, 12, 24)]
    out, lse = merge_attention(*parts[0], *parts[1])
    out, lse = merge_attention(out, lse, *parts[2])
    np.testing.assert_allclose(out, full, atol=1e-5)


@pytest.mark.parametrize("fn_name", ["softmax", "blockwise"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_finite_differences(fn_name, causal):
    fn = attention.get(fn_name)
    if fn_name == "blockwise":
        fn = functools.partial(fn, block_q=4, block_kv=8)
    with jax.enable_x64(True):
        q, k, v = _qkv(10, b=1, t=12, s=12, h=2, hk=1, d=8, dtype=jnp.float64)
        w = jax.random.normal(jax.random.PRNGKey(11), q.shape, jnp.float64)
        loss = jax.jit(lambda q, k, v: jnp.sum(w * fn(q, k, v, causal=causal)))
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
        rng = np.random.default_rng(0)
        eps = 1e-6
        for arg, g in enumerate(grads):
            for _ in range(4):
                direction = rng.standard_normal(g.shape)
                args = [q, k, v]
                plus, minus = list(args), list(args)
                plus[arg] = args[arg] + eps * direction
                minus[arg] = args[arg] - eps * direction
                fd = (loss(*plus) - loss(*minus)) / (2 * eps)
                np.testing.assert_allclose(np.sum(np.asarray(g) * direction), fd, rtol=1e-6,
                                           atol=1e-8)


def test_blockwise_grads_equal_dense_grads_with_mask_and_gqa():
    q, k, v = _qkv(12, t=21, s=29, h=6, hk=2)
    mask = jax.random.bernoulli(jax.random.PRNGKey(1), 0.7, (2, 6, 21, 29))
    w = jax.random.normal(jax.random.PRNGKey(2), q.shape)
    dense = lambda q, k, v: jnp.sum(w * dot_product_attention(q, k, v, mask=mask))
    block = lambda q, k, v: jnp.sum(
        w * blockwise_attention(q, k, v, mask=mask, block_q=8, block_kv=8))
    g1 = jax.jit(jax.grad(dense, argnums=(0, 1, 2)))(q, k, v)
    g2 = jax.jit(jax.grad(block, argnums=(0, 1, 2)))(q, k, v)
    chex.assert_trees_all_close(g1, g2, atol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("given", ["out", "delta"])
def test_blockwise_bwd_from_saved_out_and_lse_equals_dense_vjp(causal, given):
    """The public backward from (out, lse) — or from delta = Σ d_out·out — gives the
    dense reference's VJP: GQA, lengths not multiples of the blocks, a random mask,
    q_offset, and a row that sees no key (mask all False) has zero gradients."""
    q, k, v = _qkv(14, t=21, s=29, h=6, hk=2)
    mask = jax.random.bernoulli(jax.random.PRNGKey(3), 0.7, (2, 6, 21, 29)).at[1, 4, 5].set(False)
    d_out = jax.random.normal(jax.random.PRNGKey(4), q.shape)
    opts = dict(causal=causal, mask=mask, q_offset=3)
    out, pull = jax.vjp(lambda q, k, v: dot_product_attention(q, k, v, **opts), q, k, v)
    want = pull(d_out)
    out_b, lse = blockwise_attention(q, k, v, block_q=8, block_kv=8, return_lse=True, **opts)
    saved = ({"out": out_b} if given == "out"
             else {"delta": jnp.einsum("bthd,bthd->bth", d_out, out_b)})
    got = jax.jit(functools.partial(blockwise_attention_bwd, block_q=8, block_kv=8, **opts))(
        q, k, v, lse, d_out, **saved)
    chex.assert_trees_all_close(got, want, atol=2e-5)
    assert float(jnp.abs(got[0][1, 5, 4]).max()) == 0.0
    with pytest.raises(ValueError, match="exactly one of `out` and `delta`"):
        blockwise_attention_bwd(q, k, v, lse, d_out)
    with pytest.raises(ValueError, match="`lse` must have shape"):
        blockwise_attention_bwd(q, k, v, lse[:, :5], d_out, out=out_b)
    # accumulators: dk, dv added into them (S = 29 not a multiple of the 8-key blocks)
    dk0, dv0 = (jax.random.normal(jax.random.PRNGKey(i), x.shape) for i, x in ((5, k), (6, v)))
    acc = jax.jit(functools.partial(blockwise_attention_bwd, block_q=8, block_kv=8, **opts))(
        q, k, v, lse, d_out, dk_acc=dk0, dv_acc=dv0, **saved)
    chex.assert_trees_all_close(acc, (want[0], want[1] + dk0, want[2] + dv0), atol=2e-5)
    with pytest.raises(ValueError, match="`dk_acc` must have shape"):
        blockwise_attention_bwd(q, k, v, lse, d_out, dk_acc=dk0[:, :5], **saved)


def test_lse_gradient_flows_through_blockwise():
    q, k, v = _qkv(13, t=16, s=16)
    f_dense = lambda q: jnp.sum(jnp.sin(dot_product_attention(q, k, v, return_lse=True)[1]))
    f_block = lambda q: jnp.sum(jnp.sin(
        blockwise_attention(q, k, v, block_q=8, block_kv=8, return_lse=True)[1]))
    np.testing.assert_allclose(jax.jit(jax.grad(f_block))(q), jax.jit(jax.grad(f_dense))(q),
                               atol=1e-5)


def test_bf16_inputs_keep_f32_statistics():
    q, k, v = _qkv(14, dtype=jnp.bfloat16)
    q = q * 30  # large logits
    for fn in (dot_product_attention, blockwise_attention):
        out, lse = fn(q, k, v, causal=True, return_lse=True)
        assert out.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
        assert np.isfinite(np.asarray(out, np.float32)).all()
    ref = _naive(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                 np.tril(np.ones((24, 24), bool)), 0.25)
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=3e-2)


def test_jit_vmap_compose():
    q, k, v = _qkv(15)
    f = jax.jit(functools.partial(blockwise_attention, causal=True, block_q=8, block_kv=8))
    np.testing.assert_allclose(f(q, k, v), dot_product_attention(q, k, v, causal=True),
                               atol=1e-5)
    per_example = jax.vmap(lambda q, k, v: blockwise_attention(
        q[None], k[None], v[None], causal=True, block_q=8, block_kv=8)[0])(q, k, v)
    np.testing.assert_allclose(per_example, dot_product_attention(q, k, v, causal=True),
                               atol=1e-5)


@pytest.mark.parametrize(
    "shapes, kwargs, match",
    [
        (((2, 8, 4, 16), (2, 8, 3, 16), (2, 8, 3, 16)), {}, "multiple of kv_heads"),
        (((2, 8, 4, 16), (2, 8, 2, 8), (2, 8, 2, 8)), {}, "head_dim"),
        (((2, 8, 4), (2, 8, 2, 16), (2, 8, 2, 16)), {}, "rank 4"),
        (((2, 8, 4, 16), (3, 8, 2, 16), (3, 8, 2, 16)), {}, "batch"),
        (((2, 8, 4, 16), (2, 8, 2, 16), (2, 9, 2, 16)), {}, "must agree"),
        (((2, 8, 4, 16), (2, 8, 2, 16), (2, 8, 2, 16)), {"mask": np.ones((3, 8, 8), bool)},
         "does not broadcast"),
        (((2, 8, 4, 16), (2, 8, 2, 16), (2, 8, 2, 16)), {"mask": np.ones((8, 8))},
         "boolean"),
    ],
)
def test_bad_inputs_raise(shapes, kwargs, match):
    q, k, v = (jnp.ones(s, jnp.float32) for s in shapes)
    for fn in (dot_product_attention, blockwise_attention):
        with pytest.raises(ValueError, match=match):
            fn(q, k, v, **kwargs)


def test_integer_inputs_raise():
    q = jnp.ones((1, 4, 2, 8), jnp.int32)
    with pytest.raises(ValueError, match="floating"):
        dot_product_attention(q, q, q)
