"""FlashBlock (lcjax.attention.flashblock): the LSE merge of block-external and
block-internal attention against full attention, exact reuse when the block's queries do
not change, recompute-mask heads equal full attention, the two reuse rules, and the
sampler option (lcjax.nn.diffusion.generate_blocks(flashblock=...)). Tiny shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.attention import dot_product_attention, merge_attention
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


# ----------------------------------------------------------------------------
# FlashBlock composed with a sparse external part
# ----------------------------------------------------------------------------
def numpy_history_scores(q, k, mask):
    """a_h[j] = mean over the block's queries of softmax over the visible history keys,
    -1 where no query sees j: loops over heads, float64."""
    q, k, mask = np.asarray(q, np.float64), np.asarray(k, np.float64), np.asarray(mask)
    out = np.full((BATCH, H, S), -1.0)
    for b in range(BATCH):
        for h in range(H):
            s = q[b, :, h] @ k[b, :, h // (H // HKV)].T / np.sqrt(DIM)  # [T, S]
            s = np.where(mask[b, h], s, -np.inf)
            p = np.zeros_like(s)
            for i in range(T):
                if mask[b, h, i].any():
                    e = np.exp(s[i] - s[i].max())
                    p[i] = e / e.sum()
            out[b, h] = np.where(mask[b, h].any(0), p.mean(0), -1.0)
    return out


sparse_split = jax.jit(F.sparse_flashblock_attention,
                       static_argnames=("keep", "residual", "return_cache", "pool"))


def test_sparse_external_equals_dense_softmax_over_the_kept_keys():
    q, k_ext, v_ext, _, _ = qkv(5)
    m = ext_mask()
    scores = F.history_scores(q, k_ext, mask=m)
    np.testing.assert_allclose(scores, numpy_history_scores(q, k_ext, m), atol=1e-6)
    keep = 5
    sel = F.select_history(scores, keep)
    ref_top = np.argsort(-np.asarray(scores), axis=-1, kind="stable")[..., :keep]
    np.testing.assert_array_equal(np.sort(sel.indices, -1), np.sort(ref_top, -1))
    assert not bool(sel.valid[0, 1].any())  # batch 0, head 1 sees no history
    a, lse = jax.jit(F.sparse_external_attention)(q, k_ext, v_ext, sel, mask=m)
    kept = F.selection_mask(sel, S)
    assert int(kept.sum(-1).max()) == keep
    ref, ref_lse = dot_product_attention(q, k_ext, v_ext, mask=m & kept[:, :, None],
                                         return_lse=True)
    np.testing.assert_allclose(a, ref, atol=1e-6)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-6)
    dense = dot_product_attention(q, k_ext, v_ext, mask=m)
    assert float(jnp.abs(a - dense).max()) > 1e-2  # the dropped keys mattered


def test_sparse_with_every_key_kept_is_exact_flashblock():
    q, k_ext, v_ext, k_in, v_in = qkv(6)
    m = ext_mask()
    exact = full(q, k_ext, v_ext, k_in, v_in, m)
    for residual in (False, True):
        out = sparse_split(q, k_ext, v_ext, k_in, v_in, keep=S, ext_mask=m,
                           residual=residual)
        np.testing.assert_allclose(out, exact, atol=1e-6)


def test_sparse_cache_reuse_and_the_residual():
    """Step 0 selects and caches; at a later step with unchanged queries (the block's keys
    and values moved) sparse alone equals dense attention over the kept history keys plus
    the block, and sparse + residual equals full attention; the one-pass dropped part
    equals dense attention over the dropped keys."""
    q, k_ext, v_ext, k_in, v_in = qkv(7)
    m = ext_mask()
    keep = 3
    _, (sel, dropped) = sparse_split(q, k_ext, v_ext, k_in, v_in, keep=keep, ext_mask=m,
                                     return_cache=True)
    ref_drop = F.dropped_attention(q, k_ext, v_ext, sel, mask=m)
    np.testing.assert_allclose(dropped[0], ref_drop[0], atol=1e-6)
    np.testing.assert_allclose(dropped[1], ref_drop[1], atol=1e-5)
    _, _, _, k2, v2 = qkv(8)
    with_res = sparse_split(q, k_ext, v_ext, k2, v2, keep=keep, ext_mask=m,
                            cache=(sel, dropped))
    np.testing.assert_allclose(with_res, full(q, k_ext, v_ext, k2, v2, m), atol=1e-6)
    alone = sparse_split(q, k_ext, v_ext, k2, v2, keep=keep, ext_mask=m, residual=False,
                         cache=(sel, None))
    kept = F.selection_mask(sel, S)[:, :, None]
    want = full(q, k_ext, v_ext, k2, v2, m & kept)
    np.testing.assert_allclose(alone, want, atol=1e-6)
    assert float(jnp.abs(alone - with_res).max()) > 1e-2
    # new queries: the kept keys are recomputed with them, the dropped part is the cached one
    q2 = qkv(9)[0]
    moved = sparse_split(q2, k_ext, v_ext, k2, v2, keep=keep, ext_mask=m, cache=(sel, dropped))
    a_k, l_k = F.sparse_external_attention(q2, k_ext, v_ext, sel, mask=m)
    a_x, l_x = merge_attention(a_k, l_k, *dropped)
    a_i, l_i = dot_product_attention(q2, k2, v2, return_lse=True)
    np.testing.assert_allclose(moved, merge_attention(a_i, l_i, a_x, l_x)[0], atol=1e-6)
    with pytest.raises(ValueError, match="residual"):
        F.sparse_flashblock_attention(q, k_ext, v_ext, k2, v2, keep=keep, cache=(sel, None))
    with pytest.raises(ValueError, match="sparse_keep"):
        F.FlashBlockConfig(sparse_keep=0)
    with pytest.raises(ValueError, match="recompute_heads"):
        F.FlashBlockConfig(sparse_keep=2, recompute_heads=((True,) * 4,))


def test_sampler_with_sparse_external_part():
    cfg = D.diffusion_config(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                             head_dim=8, mlp_hidden=64, max_len=32)
    model = DecoderLM(cfg, rngs=nnx.Rngs(0))
    prompt = jax.random.randint(jax.random.key(7), (2, 8), 0, 256, jnp.int32)
    exact = D.generate_blocks(model, prompt, 2, 4, block_size=4)
    # every history key kept: the kept part is recomputed with the current queries at every
    # step, so sparse alone is the exact sampler
    every = D.generate_blocks(model, prompt, 2, 4, block_size=4, flashblock=F.FlashBlockConfig(
        sparse_keep=16, sparse_residual=False))
    np.testing.assert_array_equal(every.tokens, exact.tokens)
    np.testing.assert_allclose(every.logprob, exact.logprob, atol=1e-5)
    assert every.refreshes == ((0,), (0,))
    # aggressive sparsity: step 0 of block 0 with the residual is exact, sparse alone is not
    res, alone = (D.generate_blocks(model, prompt, 2, 4, block_size=4,
                                    flashblock=F.FlashBlockConfig(sparse_keep=2,
                                                                  sparse_residual=r))
                  for r in (True, False))
    first = np.asarray(exact.step)[:, :4] == 0
    np.testing.assert_allclose(np.asarray(res.logprob)[:, :4][first],
                               np.asarray(exact.logprob)[:, :4][first], atol=1e-5)
    assert float(np.abs(np.asarray(alone.logprob)[:, :4][first]
                        - np.asarray(exact.logprob)[:, :4][first]).max()) > 1e-3


def test_teacher_forced_replay():
    """Replaying a generation under teacher forcing: the exact sampler reproduces it (tokens,
    log-probs) and its per-step logits equal those of the no-cache full recompute (an
    independent path); FlashBlock with every head recomputed gives the exact logits, and
    plain reuse differs from them only at the steps that reuse (step 0 refreshes)."""
    cfg = D.diffusion_config(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                             head_dim=8, mlp_hidden=64, max_len=32)
    model = DecoderLM(cfg, rngs=nnx.Rngs(1))
    prompt = jax.random.randint(jax.random.key(3), (2, 8), 0, 256, jnp.int32)
    teacher = D.generate_blocks(model, prompt, 2, 4, block_size=4)
    replay, logits = D.generate_blocks(model, prompt, 2, 4, block_size=4, teacher=teacher)
    assert logits.shape == (2, 4, 2, 4, cfg.vocab_size)
    np.testing.assert_array_equal(replay.tokens, teacher.tokens)
    np.testing.assert_array_equal(replay.step, teacher.step)
    np.testing.assert_allclose(replay.logprob, teacher.logprob, atol=1e-5)
    _, full = D.generate_blocks(model, prompt, 2, 4, block_size=4, use_cache=False,
                                teacher=teacher)
    np.testing.assert_allclose(full, logits, atol=2e-4)
    every = F.FlashBlockConfig(recompute_heads=((True,) * 4,) * 2)
    _, fb = D.generate_blocks(model, prompt, 2, 4, block_size=4, flashblock=every,
                              teacher=teacher)
    np.testing.assert_allclose(fb, logits, atol=2e-4)
    reuse, rl = D.generate_blocks(model, prompt, 2, 4, block_size=4,
                                  flashblock=F.FlashBlockConfig(), teacher=teacher)
    np.testing.assert_array_equal(reuse.tokens, teacher.tokens)  # forced, whatever it predicts
    np.testing.assert_allclose(rl[:, 0], logits[:, 0], atol=2e-4)
    assert float(jnp.max(jnp.abs(rl[:, 1:] - logits[:, 1:]))) > 1e-3
    with pytest.raises(ValueError, match="teacher"):
        D.generate_blocks(model, prompt, 1, 4, block_size=4, teacher=teacher)
