"""Tests for lcjax.nn.trsp (TRSP's side path) and DecoderConfig(trsp=True).

References are independent: explicit causal convolutions in float64 numpy, the triangle
kernel as the convolution of two boxes, the gate formula written out in numpy, and the
full forward pass for cached decoding (batched, ragged prompts, chunked prefill).
"""

import functools
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.attention import lengths_to_segment_ids
from lcjax.nn import DecoderConfig, DecoderLM, generate
from lcjax.nn.trsp import (
    TRSPGate,
    box_filter,
    context_lengths,
    init_trsp_state,
    triangle_filter,
    triangle_kernel,
    trsp_side_path,
)

V = 29


def rand(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) + 0.5


def causal_conv(x, h):
    """y[t] = Σ_k h[k] x[t-k] (zeros before 0), float64, x [T, D]."""
    t = x.shape[0]
    y = np.zeros(x.shape, np.float64)
    for i in range(t):
        for k in range(min(len(h), i + 1)):
            y[i] += h[k] * x[i - k]
    return y


def tri_reference(x, level, context="causal"):
    """Tri_ℓ per position on one segment x [n, D]: L(t) = min(2^ℓ, L_ctx(t)) + 1."""
    n = x.shape[0]
    y = np.zeros(x.shape, np.float64)
    for t in range(n):
        lctx = t + 1 if context == "causal" else n
        big = min(2**level, lctx) + 1
        h = np.convolve(np.ones(big) / big, np.ones(big) / big)
        y[t] = causal_conv(x[: t + 1], h)[t]
    return y


def tiny(**overrides) -> DecoderConfig:
    base = dict(vocab_size=V, d_model=16, num_layers=2, num_heads=2, num_kv_heads=1,
                head_dim=8, mlp_hidden=24, max_len=32, trsp=True)
    return DecoderConfig(**{**base, **overrides})


def make(config: DecoderConfig) -> DecoderLM:
    """DecoderLM with random numpy parameters by path (no compiled initialisers: cheap),
    norm scales 1 + noise; the TRSP gate gets κ = 0.4 and a sigmoid near 1 (b2 = 2), so
    the side path matters in the logits."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: DecoderLM(config, rngs=nnx.Rngs(0))))

    def fill(path, leaf):
        name = path[-2].key if hasattr(path[-2], "key") else str(path[-2])
        rng = np.random.default_rng(zlib.crc32(jax.tree_util.keystr(path).encode()))
        x = rng.standard_normal(leaf.shape)
        if name == "scale":
            x = 1.0 + 0.2 * x
        elif name in ("kappa", "b2"):
            x = np.full(leaf.shape, 0.4 if name == "kappa" else 2.0)
        elif leaf.ndim >= 2:
            x = x / math.sqrt(leaf.shape[-1] if name == "embed" else
                              leaf.shape[0] * (leaf.shape[1] if name == "o_proj" else 1))
        return jnp.asarray(x.astype(leaf.dtype))

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(fill, state))


@functools.cache
def models():
    """(a tiny TRSP LM, the same LM without TRSP: every other parameter equal)."""
    return make(tiny()), make(tiny(trsp=False))


@functools.cache
def _compiled():
    graphdef = nnx.graphdef(models()[0])

    @jax.jit
    def forward(state, tokens):
        return nnx.merge(graphdef, state)(tokens)

    @jax.jit
    def step(state, tokens, cache, positions, segment_ids):
        return nnx.merge(graphdef, state)(tokens, cache=cache, positions=positions,
                                          segment_ids=segment_ids)

    return forward, step


def jitted(state=None):
    """Compiled full pass and cached step of the TRSP model (its state, or ``state``, as
    an argument: one compile per shape, shared by the tests)."""
    forward, step = _compiled()
    state = nnx.state(models()[0]) if state is None else state
    return (lambda t: np.asarray(forward(state, t)),
            lambda *a: step(state, *a))


SEQS = jnp.asarray(np.random.default_rng(2).integers(0, V, (3, 13)), jnp.int32)


# ----------------------------------------------------------------------------
# The filters (each test compiles one jitted function)
# ----------------------------------------------------------------------------
def test_cumsum_box_equals_explicit_convolution_and_is_divided_by_L():
    x = rand(0, (2, 13, 3))
    windows = (1, 2, 5, 20)
    outs, padded = jax.jit(lambda x: ([box_filter(x, L) for L in windows],
                                      box_filter(x, 4, jnp.asarray([13, 7]))))(x)
    for L, got in zip(windows, outs):
        for b in range(2):
            np.testing.assert_allclose(got[b], causal_conv(x[b], np.ones(L) / L),
                                       atol=2e-6, rtol=1e-5)
    # the first tokens are divided by L, not by the number of tokens seen
    np.testing.assert_allclose(outs[-1][:, 0], x[:, 0] / 20, rtol=1e-6)
    # lengths: padding outputs are 0, real ones unchanged
    np.testing.assert_allclose(padded[1, :7], causal_conv(x[1, :7], np.ones(4) / 4), atol=2e-6)
    assert np.all(np.asarray(padded[1, 7:]) == 0)


def test_two_boxes_equal_the_triangle_kernel():
    windows = (1, 2, 3, 6)
    x = rand(1, (1, 15, 2))
    twice, kernels = jax.jit(lambda x: ([box_filter(box_filter(x, L), L) for L in windows],
                                        [triangle_kernel(L) for L in windows]))(x)
    for L, got, kernel in zip(windows, twice, kernels):
        k = np.arange(2 * L - 1)
        formula = (L - np.abs(k - (L - 1))) / L**2
        np.testing.assert_allclose(np.convolve(np.ones(L) / L, np.ones(L) / L), formula,
                                   atol=1e-12)
        np.testing.assert_allclose(kernel, formula, atol=1e-7)
        assert abs(formula.sum() - 1) < 1e-12 and formula.argmax() == L - 1
        np.testing.assert_allclose(got[0], causal_conv(x[0], formula), atol=2e-6, rtol=1e-5)


def test_triangle_filter_per_position_window_equals_reference():
    x = rand(1, (2, 21, 3))
    levels = (0, 2, 3, 6)  # 2^6 > 21: the window never reaches 2^ℓ
    outs = jax.jit(lambda x: {(lv, c): triangle_filter(x, lv, context=c) for lv in levels
                              for c in ("causal", "sequence")})(x)
    for (level, context), got in outs.items():
        for b in range(2):
            np.testing.assert_allclose(got[b], tri_reference(x[b], level, context),
                                       atol=3e-6, rtol=2e-5, err_msg=f"{level} {context}")


def test_padding_and_packing_change_nothing_of_the_real_tokens():
    a, c = rand(2, (7, 3)), rand(3, (5, 3))
    # row 0: [pad, pad, a0..a3, pad, a4..a6, c0..c4, pad]; row 1: a then c, then padding
    seg0 = [-1, -1] + [4] * 4 + [-1] + [4] * 3 + [9] * 5 + [-1]
    order0 = [None, None, 0, 1, 2, 3, None, 4, 5, 6, 7, 8, 9, 10, 11, None]
    ac = np.concatenate([a, c])
    x0 = np.stack([ac[i] if i is not None else rand(4, (3,)) * 50 for i in order0])
    seg1 = [0] * 7 + [1] * 5 + [-2] * 4
    x1 = np.concatenate([ac, rand(5, (4, 3)) * 50])
    x, seg = jnp.asarray(np.stack([x0, x1])), jnp.asarray([seg0, seg1], jnp.int32)
    real0 = np.array([i is not None for i in order0])
    lengths = jnp.asarray([16, 12])

    @jax.jit
    def run(x, seg, lengths):
        out = {ctx: (context_lengths((2, 16), segment_ids=seg, context=ctx),
                     [triangle_filter(x, lv, segment_ids=seg, context=ctx) for lv in (1, 3)])
               for ctx in ("causal", "sequence")}
        by_lengths = (context_lengths((2, 16), lengths), triangle_filter(x, 2, lengths),
                      triangle_filter(x, 2, segment_ids=lengths_to_segment_ids(lengths, 16)))
        return out, by_lengths

    out, (lctx_len, tri_len, tri_seg) = run(x, seg, lengths)
    for context, (lctx, tris) in out.items():
        lctx = np.asarray(lctx)
        want = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5] if context == "causal" else [7] * 7 + [5] * 5
        np.testing.assert_array_equal(lctx[0, real0], want)
        np.testing.assert_array_equal(lctx[1, :12], want)
        assert np.all(lctx[0, ~real0] == 0) and np.all(lctx[1, 12:] == 0)
        for level, got in zip((1, 3), tris):
            got = np.asarray(got)
            ref = np.concatenate([tri_reference(a, level, context),
                                  tri_reference(c, level, context)])
            np.testing.assert_allclose(got[0, real0], ref, atol=3e-6, rtol=2e-5)
            np.testing.assert_allclose(got[1, :12], ref, atol=3e-6, rtol=2e-5)
            assert np.all(got[0, ~real0] == 0) and np.all(got[1, 12:] == 0)
    # lengths = right padding, the same as segment ids
    np.testing.assert_array_equal(lctx_len[1], list(range(1, 13)) + [0] * 4)
    np.testing.assert_allclose(tri_len, tri_seg, atol=1e-6)


def test_future_tokens_change_nothing_causal_but_do_in_sequence_mode():
    gate = TRSPGate(rngs=nnx.Rngs(1))
    x = rand(6, (1, 12, 4))
    x2 = x.copy()
    x2[:, 8:] = rand(7, (1, 4, 4)) * 10
    seg = jnp.asarray([[0] * 12], jnp.int32)
    seg_short = jnp.asarray([[0] * 8 + [-1] * 4], jnp.int32)  # the sequence ends at 8
    levels = (0, 4)

    @nnx.jit
    def run(gate, x, x2):
        xs, segs = jnp.concatenate([x, x2, x]), jnp.concatenate([seg, seg, seg_short])
        return [(trsp_side_path(xs, lv, gate, segment_ids=segs)[0],
                 trsp_side_path(xs, lv, gate, segment_ids=segs, context="sequence")[0])
                for lv in levels]

    for causal, sequence in run(gate, jnp.asarray(x), jnp.asarray(x2)):
        y, y2, y_short = causal
        np.testing.assert_allclose(y[:8], y2[:8], atol=1e-7)
        assert np.abs(y[8:] - y2[8:]).max(axis=-1).min() > 1e-4
        np.testing.assert_allclose(y_short[:8], y[:8], atol=1e-7)
        # the paper's whole-sequence L_ctx: a longer sequence changes earlier outputs
        assert np.abs(sequence[0, :8] - sequence[2, :8]).max() > 1e-3
    # the whole model is causal too: row 1 = row 0 with its last 5 tokens changed
    tokens = SEQS.at[1].set(SEQS[0]).at[1, 8:].set((SEQS[0, 8:] + 3) % V)
    logits = jitted()[0](tokens)
    np.testing.assert_allclose(logits[1, :8], logits[0, :8], atol=1e-6)
    assert np.abs(logits[1, 8:] - logits[0, 8:]).max() > 1e-3


# ----------------------------------------------------------------------------
# The gate and the block
# ----------------------------------------------------------------------------
def test_gate_formula_and_fifty_shared_parameters():
    model, plain = models()
    count = lambda m: sum(p.size for p in jax.tree.leaves(nnx.state(m, nnx.Param)))
    assert count(model) - count(plain) == 50 == count(model.trsp_gate)
    gates = [m for _, m in nnx.iter_modules(model) if isinstance(m, TRSPGate)]
    assert len(gates) == 1  # one MLP and one κ for all layers

    g = TRSPGate(rngs=nnx.Rngs(3))
    g.kappa[...] = jnp.float32(-0.7)
    lctx = np.array([1, 2, 3, 7, 8, 100, 5000], np.int32)
    levels = (0, 1, 3)
    x = rand(4, (1, 7, 3))

    @nnx.jit
    def run(g, x):
        return [(g(jnp.minimum(2**lv, lctx), jnp.asarray(lctx)), trsp_side_path(x, lv, g)[0])
                for lv in levels]

    w1, b1 = np.asarray(g.w1[...], np.float64), np.asarray(g.b1[...], np.float64)
    w2, b2 = np.asarray(g.w2[...], np.float64), np.asarray(g.b2[...], np.float64)
    phi = math.log1p(math.exp(-0.7))

    def gamma(b, lc):
        r = np.maximum(b / lc, 1e-6)
        logit = np.tanh(np.log2(r)[:, None] * w1[0] + b1) @ w2[:, 0] + b2[0]
        return 1 / (1 + np.exp(-logit)) * r**phi

    for level, (got, side) in zip(levels, run(g, jnp.asarray(x))):
        np.testing.assert_allclose(got, gamma(np.minimum(2**level, lctx), lctx), rtol=2e-6)
        # the side path is that gate times the triangle filter, per position
        lc = np.arange(1, 8)
        want = gamma(np.minimum(2**level, lc), lc)[:, None] * tri_reference(x[0], level)
        np.testing.assert_allclose(side[0], want, atol=3e-6, rtol=2e-5)


def test_block_adds_gated_triangle_of_its_input_to_the_attention_residual():
    model = models()[0]

    @nnx.jit
    def run(model, tokens):
        h = model.hidden_states(tokens)
        b, t = tokens.shape
        pos = jnp.broadcast_to(jnp.arange(t), (b, t))
        lc = jnp.broadcast_to(jnp.arange(1, t + 1), (b, t))
        by_hand = []
        for level in (0, 1):
            blk, x = model.blocks[level], h[level]
            attn, _ = blk.attn(blk.attn_norm(x), pos)
            gamma = model.trsp_gate(jnp.minimum(2**level, lc), lc)
            mid = x + attn + gamma[..., None] * triangle_filter(x, level)
            by_hand.append(mid + blk.mlp(blk.mlp_norm(mid)))
        return h, by_hand, model.logits(model.final_norm(h[-1]))

    h, by_hand, logits = run(model, SEQS)
    np.testing.assert_allclose(logits, jitted()[0](SEQS), atol=1e-5)
    for level, want in zip((0, 1), by_hand):
        np.testing.assert_allclose(h[level + 1], want, atol=2e-5, rtol=1e-5)


# ----------------------------------------------------------------------------
# KV-cache decoding = the full pass
# ----------------------------------------------------------------------------
def test_cache_decoding_equals_full_pass_batched_ragged_chunked_and_padded():
    model = models()[0]
    forward, step = jitted()
    full = forward(SEQS)
    # the same compiled forward with the gate closed (b2 = -60: sigmoid, hence γ, ≈ 0)
    closed = jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.full_like(x, -60.0) if "b2" in jax.tree_util.keystr(p) else x,
        nnx.state(model))
    assert np.abs(full - jitted(closed)[0](SEQS)).max() > 1e-2  # the side path matters
    # two prefill chunks of 4 slots, every row its own layout, then token by token:
    #   row 0: chunk 1 = s0 s1 + 2 right pads, chunk 2 = s2 s3 s4 + 1 pad   (ragged)
    #   row 1: chunk 1 = s0..s3,               chunk 2 = 2 left pads + s4 s5
    #   row 2: chunk 1 = 3 left pads + s0,     chunk 2 = s1..s4
    layout = [([0, 1, None, None], [2, 3, 4, None]),
              ([0, 1, 2, 3], [None, None, 4, 5]),
              ([None, None, None, 0], [1, 2, 3, 4])]
    seen = np.array([5, 6, 5])  # tokens per row after the prefill
    cache = model.init_cache(3, 8 + 4)
    for chunk in range(2):
        idx = [lay[chunk] for lay in layout]
        tok = jnp.asarray([[SEQS[b, i] if i is not None else 0 for i in row]
                           for b, row in enumerate(idx)], jnp.int32)
        pos = jnp.asarray([[i if i is not None else 0 for i in row] for row in idx], jnp.int32)
        seg = jnp.asarray([[0 if i is not None else -1 for i in row] for row in idx], jnp.int32)
        logits, cache = step(tok, cache, pos, seg)
        for b, row in enumerate(idx):
            for j, i in enumerate(row):
                if i is not None:
                    np.testing.assert_allclose(logits[b, j], full[b, i], atol=2e-5,
                                               err_msg=f"row {b} token {i}")
    for i in range(4):  # row b feeds its token at position seen_b + i
        at = jnp.asarray(seen + i)
        tok = jnp.take_along_axis(SEQS, at[:, None], axis=1)
        logits, cache = step(tok, cache, at[:, None], jnp.zeros((3, 1), jnp.int32))
        np.testing.assert_allclose(logits[:, 0], full[np.arange(3), seen + i], atol=2e-5)
    np.testing.assert_array_equal(cache[1].trsp.count, seen + 4)
    assert cache[1].trsp.box1.shape == (3, 3, 16)  # W = min(2^1, 12) + 1


def test_generate_with_trsp_equals_the_full_pass():
    model = models()[0]
    prompts = SEQS[:, :5]
    lengths = np.array([5, 2, 4])
    out = generate(model, prompts, 3, prompt_lengths=jnp.asarray(lengths),
                   return_logprobs=True)
    seqs = np.zeros((3, 13), np.int32)
    for b, ln in enumerate(lengths):
        seqs[b, : ln + 3] = out.tokens[b, : ln + 3]
    logp = jax.nn.log_softmax(jitted()[0](jnp.asarray(seqs)), axis=-1)
    for b, ln in enumerate(lengths):
        at = np.arange(ln - 1, ln + 2)
        np.testing.assert_allclose(out.logprobs[b], logp[b, at, seqs[b, ln : ln + 3]],
                                   atol=2e-5)
        # greedy: each generated token is the argmax of the full pass
        np.testing.assert_array_equal(seqs[b, ln : ln + 3], np.argmax(logp[b, at], axis=-1))


def test_value_errors():
    x = jnp.ones((1, 4, 2))
    gate = TRSPGate(rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="`x`"):
        box_filter(jnp.ones((4, 2)), 2)
    with pytest.raises(ValueError, match="`L`"):
        box_filter(x, 0)
    with pytest.raises(ValueError, match="`level`"):
        triangle_filter(x, -1)
    with pytest.raises(ValueError, match="not both"):
        box_filter(x, 2, jnp.asarray([4]), segment_ids=jnp.zeros((1, 4), jnp.int32))
    with pytest.raises(ValueError, match="`lengths`"):
        box_filter(x, 2, jnp.asarray([4, 4]))
    with pytest.raises(ValueError, match="`context`"):
        triangle_filter(x, 1, context="global")
    with pytest.raises(ValueError, match="not causal"):
        trsp_side_path(x, 1, gate, context="sequence", state=init_trsp_state(1, 2, 1, 8))
    with pytest.raises(ValueError, match="trsp_context"):
        DecoderConfig(trsp=True, trsp_context="global")
    model, plain = models()
    with pytest.raises(ValueError, match="TRSPCache"):
        model(jnp.zeros((1, 2), jnp.int32), cache=plain.init_cache(1, 4))
