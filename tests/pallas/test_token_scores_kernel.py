"""Token-scores Pallas kernels (pallas_kernels.token_scores): interpret mode against the
XLA scoring pass of lcjax.attention.token_sparse and the dense reference (GQA, causal and
not, lengths and windows that are not multiples of the blocks), no gradient, argument
errors, and lowering for TPU (Mosaic) and GPU (Triton) from this CPU."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcjax.attention import token_sparse
from pallas_kernels.token_scores import (
    BlockSizes,
    merge_stats,
    token_scores_pallas,
    token_scores_reference,
)

B, L, H, HKV, D = 2, 45, 4, 2, 16  # L is not a multiple of the 16-key blocks


def _qk(seed=0, length=L, d=D, dtype=jnp.float32):
    kq, kk = jax.random.split(jax.random.key(seed))
    q = jax.random.normal(kq, (B, length, H, d)) * 1.5
    k = jax.random.normal(kk, (B, length, HKV, d)) * 1.5
    return q.astype(dtype), k.astype(dtype)


@pytest.mark.parametrize("causal", [True, False])
def test_interpret_equals_xla_path_and_reference(causal):
    q, k = _qk()
    window = 7  # not a power of two: padded rows are dropped
    kernel = jax.jit(functools.partial(token_scores_pallas, window=window, causal=causal,
                                       block_sizes=BlockSizes(16), interpret=True))
    got = kernel(q, k)
    assert got.shape == (B, H, L - window) and got.dtype == jnp.float32
    want = token_scores_reference(q, k, window=window, causal=causal)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
    xla = token_sparse.token_scores(q, k, window=window, pool=1, causal=causal, block_kv=16)
    np.testing.assert_allclose(got, xla, rtol=2e-5, atol=1e-7)
    # causal and not differ (the window rows' normalisers see different keys)
    other = token_scores_reference(q, k, window=window, causal=not causal)
    assert float(jnp.max(jnp.abs(got - other))) > 1e-4


def test_bfloat16_and_head_dim_padding():
    q, k = _qk(1, d=12, dtype=jnp.bfloat16)  # head_dim padded to 16 inside
    got = jax.jit(functools.partial(token_scores_pallas, window=5, scale=0.4,
                                    block_sizes=BlockSizes(8), interpret=True))(q, k)
    want = token_scores_reference(q, k, window=5, scale=0.4)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_no_gradient_and_argument_errors():
    q, k = _qk(2, length=20)
    f = functools.partial(token_scores_pallas, window=4, block_sizes=BlockSizes(8),
                          interpret=True)
    dq = jax.jit(jax.grad(lambda q_: jnp.sum(f(q_, k))))(q)
    assert float(jnp.max(jnp.abs(dq))) == 0.0
    with pytest.raises(ValueError, match="window"):
        jax.eval_shape(functools.partial(token_scores_pallas, window=20, interpret=True), q, k)
    with pytest.raises(ValueError, match="kv_len"):
        jax.eval_shape(functools.partial(token_scores_pallas, window=4, interpret=True), q,
                       k[:, :10])
    with pytest.raises(ValueError, match="block_kv"):
        jax.eval_shape(functools.partial(token_scores_pallas, window=4, interpret=True,
                                         block_sizes=BlockSizes(24)), q, k)
    with pytest.raises(ValueError, match="heads"):
        jax.eval_shape(functools.partial(token_scores_pallas, window=4, interpret=True),
                       q[:, :, :3], k)


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_lowers_for_real_targets(platform):
    q, k = _qk(3, length=512, d=64, dtype=jnp.bfloat16)
    f = functools.partial(token_scores_pallas, window=128, block_sizes=BlockSizes(128))
    lowered = jax.jit(f).trace(q, k).lower(lowering_platforms=(platform,))
    text = lowered.as_text()
    assert "token_scores_stats" in text or "tpu_custom_call" in text or "triton" in text


def test_key_blocks_a_window_row_cannot_see():
    """Causal, window 12, 8-key blocks: row 33 sees no key of block [40, 48), so that
    block's statistics are empty (l_b = 0) and must not enter the merged normaliser."""
    q, k = _qk(4)
    f = jax.jit(functools.partial(token_scores_pallas, window=12, block_sizes=BlockSizes(8),
                                  interpret=True))
    np.testing.assert_allclose(f(q, k), token_scores_reference(q, k, window=12), rtol=2e-5,
                               atol=1e-7)


def test_merge_stats_equals_logsumexp_of_all_keys():
    s = jax.random.normal(jax.random.key(5), (3, 4, 40)) * 3.0  # [heads, rows, keys]
    blocks = s.reshape(3, 4, 5, 8)                                # 5 key blocks of 8
    m_b = jnp.max(blocks, -1).transpose(0, 2, 1)                  # [heads, nk, rows]
    l_b = jnp.sum(jnp.exp(blocks - jnp.max(blocks, -1, keepdims=True)), -1).transpose(0, 2, 1)
    m, l = merge_stats(m_b, l_b)
    np.testing.assert_allclose(m + jnp.log(l), jax.nn.logsumexp(s, -1), rtol=1e-6)


def test_window_times_block_too_big_for_vmem_is_a_value_error():
    q, k = _qk(6, length=4096)
    f = functools.partial(token_scores_pallas, window=2048, block_sizes=BlockSizes(512))
    with pytest.raises(ValueError, match=r"window 2048 .* block_kv 512 is 1048576"):
        jax.eval_shape(f, q, k)
    jax.eval_shape(functools.partial(f, block_sizes=BlockSizes(128)), q, k)  # fits
