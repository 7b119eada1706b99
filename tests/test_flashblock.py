"""FlashBlock (lcjax.attention.flashblock): the LSE merge of block-external and
block-internal attention against full attention, exact reuse when the block's queries do
not change, recompute-mask heads equal full attention, the two reuse rules, and the
sampler option (lcjax.nn.diffusion.generate_blocks(flashblock=...)). Tiny shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.attention import dot_product_attention
from lcjax.attention import flashblock as F
from lcjax.nn import DecoderLM
from lcjax.nn import diffusion as D

BATCH, T, H, HKV, DIM, S = 2, 4, 4, 2, 8, 12  # block of 4 queries, 12 history slots


def qkv(seed):
    ks = jax.random.split(jax.random.key(seed), 5)
    q = jax.random.normal(ks[0], (BATCH, T, H, DIM))
    k_ext, v_ext = (jax.random.normal(k, (BATCH, S, HKV, DIM)) for k in ks[1:3])
    k_in, v_in = (jax.random.normal(k, (BATCH, T, HKV, DIM)) for k in ks[3:5])
    return q, k_ext, v_ext, k_in, v_in


@jax.jit
def full(q, k_ext, v_ext, k_in, v_in, ext_mask):
    """Dense attention over the concatenated keys: the reference."""
    mask = jnp.concatenate([jnp.broadcast_to(ext_mask, (BATCH, H, T, S)),
                            jnp.ones((BATCH, H, T, T), bool)], axis=-1)
    return dot_product_attention(q, jnp.concatenate([k_ext, k_in], 1),
                                 jnp.concatenate([v_ext, v_in], 1), mask=mask)


# jitted once: (out, external) with or without a cached external and recomputed heads
split = jax.jit(F.flashblock_attention, static_argnames=("recompute_heads", "return_external"))


def ext_mask():
    m = jax.random.bernoulli(jax.random.key(9), 0.6, (BATCH, H, T, S))
    return m.at[0, 1].set(False)  # batch 0, head 1: no history at all (L_out = -inf)


def test_lse_merge_equals_full_attention():
    q, k_ext, v_ext, k_in, v_in = qkv(0)
    m = ext_mask()
    out, (a_out, l_out) = split(q, k_ext, v_ext, k_in, v_in, ext_mask=m,
                                                 return_external=True)
    np.testing.assert_allclose(out, full(q, k_ext, v_ext, k_in, v_in, m), atol=1e-6)
    assert bool(jnp.isneginf(l_out[0, :, 1]).all()) and not bool(a_out[0, :, 1].any())
    # and in float64, far below float32 rounding
    with jax.enable_x64(True):
        args = [jnp.asarray(x, jnp.float64) for x in (q, k_ext, v_ext, k_in, v_in)]
        out64 = split(*args, ext_mask=m)
        np.testing.assert_allclose(out64, full(*args, m), atol=1e-12)


def test_reuse_is_exact_when_queries_do_not_change():
    q, k_ext, v_ext, k_in, v_in = qkv(1)
    m = ext_mask()
    _, cached = split(q, k_ext, v_ext, k_in, v_in, ext_mask=m,
                                       return_external=True)
    # a later step: the block's keys and values moved (tokens unmasked), its queries did not
    _, _, _, k2, v2 = qkv(2)
    reused = split(q, k_ext, v_ext, k2, v2, ext_mask=m, external=cached)
    np.testing.assert_allclose(reused, full(q, k_ext, v_ext, k2, v2, m), atol=1e-6)


def test_recompute_heads_equal_full_attention():
    q, k_ext, v_ext, k_in, v_in = qkv(3)
    m = ext_mask()
    _, cached = split(q, k_ext, v_ext, k_in, v_in, ext_mask=m,
                                       return_external=True)
    q2 = qkv(4)[0]  # the queries changed: reuse is now an approximation
    heads = (True, False, False, True)
    out = split(q2, k_ext, v_ext, k_in, v_in, ext_mask=m, external=cached,
                                 recompute_heads=heads)
    exact = full(q2, k_ext, v_ext, k_in, v_in, m)
    stale = split(q2, k_ext, v_ext, k_in, v_in, ext_mask=m, external=cached)
    np.testing.assert_allclose(out[:, :, [0, 3]], exact[:, :, [0, 3]], atol=1e-6)
    np.testing.assert_array_equal(out[:, :, [1, 2]], stale[:, :, [1, 2]])
    assert float(jnp.abs(out[:, :, 2] - exact[:, :, 2]).max()) > 1e-2  # reuse is stale there


def test_reuse_rules():
    # token-count rule, b = 4, ratio 0.5: refresh at step 0 and once 2 tokens are dirty
    assert F.should_refresh(0, 0, 4, 0.5)
    assert not F.should_refresh(1, 1, 4, 0.5) and F.should_refresh(2, 2, 4, 0.5)
    assert not F.should_refresh(3, 3, 4, None)
    # calibration: identical steps are stable; a sign-flipped head or a moved LSE is not
    a = jax.random.normal(jax.random.key(5), (2, 3, 4, 8))
    lse = jax.random.normal(jax.random.key(6), (2, 3, 4))
    a2 = a.at[:, :, 1].multiply(-1.0)
    lse2 = lse.at[:, :, 2].add(0.1)
    cos, dlse = F.head_stability([(a, lse), (a, lse), (a2, lse2)])
    np.testing.assert_allclose(cos, [1.0, 0.0, 1.0, 1.0], atol=1e-6)  # mean of 1 and -1
    np.testing.assert_allclose(dlse, [0.0, 0.0, 0.05, 0.0], atol=1e-6)
    assert F.recompute_mask(cos, dlse, cos_threshold=0.85, lse_threshold=0.04) == (
        False, True, True, False)
    with pytest.raises(ValueError, match="reuse_ratio"):
        F.FlashBlockConfig(reuse_ratio=1.5)
    with pytest.raises(ValueError, match="recompute_heads"):
        F.flashblock_attention(*qkv(0), recompute_heads=(True,) * H)


def test_sampler_with_flashblock():
    """In the model: with every head in the recompute mask the sampler equals the exact
    one; the token-count rule refreshes at the steps it should; reuse changes the
    outputs of an untrained model only through the stale external part."""
    cfg = D.diffusion_config(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                             head_dim=8, mlp_hidden=64, max_len=32)
    model = DecoderLM(cfg, rngs=nnx.Rngs(0))
    prompt = jax.random.randint(jax.random.key(7), (2, 8), 0, 256, jnp.int32)
    exact = D.generate_blocks(model, prompt, 2, 4, block_size=4)
    every = F.FlashBlockConfig(recompute_heads=((True,) * 4,) * 2)
    fb = D.generate_blocks(model, prompt, 2, 4, block_size=4, flashblock=every)
    np.testing.assert_array_equal(fb.tokens, exact.tokens)
    np.testing.assert_allclose(fb.logprob, exact.logprob, atol=1e-5)
    assert fb.refreshes == ((0,), (0,))
    ratio = D.generate_blocks(model, prompt, 2, 4, block_size=4,
                              flashblock=F.FlashBlockConfig(reuse_ratio=0.5))
    assert ratio.refreshes == ((0, 2), (0, 2))
    # step 0 of the first block computes everything: its reveal is the exact sampler's
    first = np.asarray(exact.step)[:, :4] == 0
    np.testing.assert_allclose(np.asarray(ratio.logprob)[:, :4][first],
                               np.asarray(exact.logprob)[:, :4][first], atol=1e-5)
    np.testing.assert_array_equal(np.asarray(ratio.tokens)[:, 8:12][first],
                                  np.asarray(exact.tokens)[:, 8:12][first])
    # calibration on these prompts gives one flag per (layer, head) from its statistics
    config, cos, dlse = D.calibrate_recompute_heads(model, prompt, 4, block_size=4)
    assert cos.shape == dlse.shape == (2, 4)
    assert config.recompute_heads == tuple(
        tuple(bool(c < 0.85 or d > 0.05) for c, d in zip(cr, dr)) for cr, dr in zip(cos, dlse))
