"""Block-diffusion LM (lcjax.nn.diffusion): block-causal exactness, the vectorised training
pass against per-block passes, cached sampling against recomputation, training through
lcjax.train.train with resume. Tiny shapes: d=32, 2 layers, block 4, T <= 16."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.attention import block_causal_mask, causal_mask
from lcjax.data.corpus import shakespeare_split
from lcjax.nn import DecoderLM
from lcjax.nn import diffusion as D
from lcjax.train import TrainConfig, train
from lcjax.train import diffusion as TD

B = 4  # block size
CFG = D.diffusion_config(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                         mlp_hidden=64, max_len=32)


@pytest.fixture(scope="module")
def model():
    return DecoderLM(CFG, rngs=nnx.Rngs(0))


# jitted once for the module: a full pass with a mask, the training pass, the loss
forward = nnx.jit(lambda m, x, mask: m(x, mask=mask))
training_logits = nnx.jit(D.diffusion_logits, static_argnums=3)
LOSS = TD.MaskedDiffusionLoss(B)
loss_value = nnx.jit(lambda m, x, rng: LOSS(m, {"inputs": x}, rng))


def tokens(key, shape):
    return jax.random.randint(jax.random.key(key), shape, 0, 256, jnp.int32)


def test_block_causal_mask_against_loops():
    for t, s, b, off in ((6, 6, 2, 0), (5, 9, 3, 4), (7, 7, 1, 0)):
        want = np.array([[(j // b) <= ((i + off) // b) for j in range(s)] for i in range(t)])
        strict = np.array([[(j // b) < ((i + off) // b) for j in range(s)] for i in range(t)])
        np.testing.assert_array_equal(block_causal_mask(t, s, b, q_offset=off), want)
        np.testing.assert_array_equal(
            block_causal_mask(t, s, b, q_offset=off, own_block=False), strict)
    np.testing.assert_array_equal(block_causal_mask(5, 8, 1, q_offset=3),
                                  causal_mask(5, 8, q_offset=3))
    with pytest.raises(ValueError, match="block_size"):
        block_causal_mask(4, 4, 0)


def test_block_causal_exactness(model):
    x = tokens(1, (2, 16))
    mask = block_causal_mask(16, 16, B)
    y = x.at[:, 9].set((x[:, 9] + 7) % 256)  # a token of block 2
    lx, ly = forward(model, x, mask), forward(model, y, mask)
    np.testing.assert_array_equal(lx[:, :8], ly[:, :8])  # blocks 0, 1: bit for bit
    assert float(jnp.abs(lx[:, 8] - ly[:, 8]).max()) > 1e-3  # bidirectional in block 2
    assert float(jnp.abs(lx[:, 12:] - ly[:, 12:]).max()) > 1e-3  # later blocks see it
    # the training pass: a noisy block sees neither later blocks nor its own clean tokens
    x_t = jnp.where(jax.random.bernoulli(jax.random.key(2), 0.5, x.shape), D.MASK_ID, x)
    base = training_logits(model, x_t, x, B)
    x2 = x.at[:, 8:].set((x[:, 8:] + 3) % 256)  # clean blocks 2, 3
    xt2 = x_t.at[:, 12:].set(D.MASK_ID)  # noisy block 3
    other = training_logits(model, xt2, x2, B)
    np.testing.assert_array_equal(base[:, :12], other[:, :12])
    assert float(jnp.abs(base[:, 12:] - other[:, 12:]).max()) > 1e-3


def test_training_pass_equals_per_block_passes(model):
    """The vectorised [x_t, x0] pass and the loss equal one plain pass per block on
    [clean earlier blocks, noisy block] (what follows is [MASK] filler, which the
    block-causal mask hides)."""
    x0 = tokens(3, (2, 16))
    rng = jax.random.key(4)
    loss, mets = loss_value(model, x0, rng)
    x_t, masked, t = D.mask_blocks(x0, rng, B)
    got = training_logits(model, x_t, x0, B)
    mask = block_causal_mask(16, 16, B)
    total = 0.0
    for i in range(4):
        blk = slice(i * B, (i + 1) * B)
        seq = jnp.concatenate([x0[:, :i * B], x_t[:, blk],
                               jnp.full((2, 16 - (i + 1) * B), D.MASK_ID, jnp.int32)], axis=1)
        want = forward(model, seq, mask)[:, blk]
        np.testing.assert_allclose(got[:, blk], want, atol=2e-5, rtol=1e-5)
        logp = np.asarray(jax.nn.log_softmax(want, -1), np.float64)
        nll = -np.take_along_axis(logp, np.asarray(x0[:, blk])[..., None], -1)[..., 0]
        total += float(np.sum(np.asarray(masked[:, blk]) * nll / np.asarray(t[:, blk])))
    np.testing.assert_allclose(float(loss), total / x0.size, rtol=1e-5)
    assert 0 < float(mets["mask_fraction"]) < 1
    # one t per block, stratified over the batch's 8 blocks: one in each eighth of [t_min, 1)
    tb = np.asarray(t[:, ::B]).ravel()
    np.testing.assert_array_equal(np.asarray(t), np.repeat(t[:, ::B], B, axis=1))
    np.testing.assert_array_equal(np.sort(np.floor((tb - 1e-3) / (1 - 1e-3) * 8)), np.arange(8))


def test_cached_sampler_equals_recomputation(model):
    """s = b steps, one token per step, greedy confidence order: the KV-cache sampler and
    the one recomputing the whole sequence at every step agree."""
    prompt = tokens(5, (2, 8))
    cached = D.generate_blocks(model, prompt, 2, B, block_size=B)
    fresh = D.generate_blocks(model, prompt, 2, B, block_size=B, use_cache=False)
    np.testing.assert_array_equal(cached.tokens, fresh.tokens)
    np.testing.assert_allclose(cached.logprob, fresh.logprob, atol=1e-5)
    np.testing.assert_array_equal(cached.tokens[:, :8], prompt)
    assert not bool((cached.tokens == D.MASK_ID).any())
    # one token per step: each block's reveal steps are a permutation of 0..b-1
    for blk in np.asarray(cached.step).reshape(2, 2, B):
        for row in blk:
            np.testing.assert_array_equal(np.sort(row), np.arange(B))
    assert bool((cached.logprob <= 0).all())


def test_transfer_schedule_and_bad_arguments(model):
    assert D.transfer_schedule(4, 4) == (1, 1, 1, 1)
    assert D.transfer_schedule(5, 2) == (3, 2)
    prompt = tokens(6, (1, 4))
    with pytest.raises(ValueError, match="multiple of block_size"):
        D.generate_blocks(model, tokens(6, (1, 5)), 1, 2, block_size=B)
    with pytest.raises(ValueError, match="steps_per_block"):
        D.generate_blocks(model, prompt, 1, 5, block_size=B)
    with pytest.raises(ValueError, match="order"):
        D.generate_blocks(model, prompt, 1, 2, block_size=B, order="left")
    with pytest.raises(ValueError, match="causal=False"):
        causal = DecoderLM(dataclasses.replace(CFG, causal=True), rngs=nnx.Rngs(0))
        D.generate_blocks(causal, prompt, 1, 2, block_size=B)


def test_loss_trains_through_train_loop_and_resumes(tmp_path):
    docs = shakespeare_split()[0][:2]
    ds = lambda: TD.diffusion_dataset(16, 8, docs=docs)
    loss_fn = TD.MaskedDiffusionLoss(B)
    cfg = TrainConfig(steps=8, warmup_steps=1, lr=1e-2, eval_batches=0, progress=False,
                      log_every=8)
    full = train(CFG, dataclasses.replace(cfg, out_dir=str(tmp_path / "a")), dataset=ds(),
                 loss_fn=loss_fn)
    nll = [r["masked_nll"] for r in full.history]
    assert np.mean(nll[-2:]) < np.mean(nll[:2]) - 1.0, nll  # from ~6 nats towards unigram
    part = dataclasses.replace(cfg, out_dir=str(tmp_path / "b"))
    train(CFG, part, dataset=ds(), loss_fn=loss_fn, stop_at=4)
    resumed = train(CFG, dataclasses.replace(part, resume=True), dataset=ds(), loss_fn=loss_fn)
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in full.history[4:]]
    pa, pb = (nnx.state(r.model, nnx.Param) for r in (full, resumed))
    for a, b in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        np.testing.assert_array_equal(a, b)


def test_threshold_rule_on_a_hand_made_case():
    M = D.MASK_ID
    block = jnp.array([[M, 5, M, M], [M, M, M, M], [7, 8, 9, 6]], jnp.int32)
    tokens = jnp.array([[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]], jnp.int32)
    conf = jnp.array([[0.9, 0.99, 0.5, 0.85],   # 0.99 is already revealed
                      [0.3, 0.6, 0.2, 0.1],     # none >= 0.8: only the most confident
                      [0.9, 0.9, 0.9, 0.9]])    # nothing masked: nothing changes
    new, revealed = D.threshold_reveal(tokens, jnp.log(conf), block, 0.8)
    np.testing.assert_array_equal(new, [[10, 5, M, 13], [M, 21, M, M], [7, 8, 9, 6]])
    np.testing.assert_array_equal(revealed, [[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]])
    new, _ = D.threshold_reveal(tokens, jnp.log(conf), block, 0.4)
    np.testing.assert_array_equal(new[:2], [[10, 5, 12, 13], [M, 21, M, M]])


def test_threshold_sampler_limits(model):
    """threshold 0 reveals a whole block at its first step (= one step per block); above
    1 one token per step (= the fixed schedule with s = b); steps_per_block caps it."""
    prompt = tokens(9, (2, 8))
    kw = dict(block_size=B)
    one_step = D.generate_blocks(model, prompt, 2, 1, **kw)
    at_zero = D.generate_blocks(model, prompt, 2, B, threshold=0.0, **kw)
    np.testing.assert_array_equal(at_zero.tokens, one_step.tokens)
    assert not bool(at_zero.step.any())
    per_token = D.generate_blocks(model, prompt, 2, B, **kw)
    above = D.generate_blocks(model, prompt, 2, B, threshold=1.5, **kw)
    np.testing.assert_array_equal(above.tokens, per_token.tokens)
    np.testing.assert_array_equal(above.step, per_token.step)
    capped = D.generate_blocks(model, prompt, 1, 2, threshold=1.5, **kw)
    np.testing.assert_array_equal(np.sort(np.asarray(capped.step), -1), [[0, 1, 1, 1]] * 2)
    with pytest.raises(ValueError, match="threshold"):
        D.generate_blocks(model, prompt, 1, 2, threshold=0.5, order="random", **kw)
