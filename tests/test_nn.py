"""Tests for lcjax.nn: RMSNorm, SwiGLU, Attention (pluggable, GQA, RoPE), DecoderLM, KV cache.

Compilation dominates on CPU, so most tests share one model shape (``tiny()``, tokens
[2, 9]) and build parameters with numpy (``make``) instead of per-shape jitted
initialisers; the real constructor is exercised by a few tests.
"""

import dataclasses
import functools
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.attention import dot_product_attention
from lcjax.nn import (
    Attention,
    DecoderConfig,
    DecoderLM,
    RMSNorm,
    SwiGLU,
)

V = 37
B, T = 2, 9
VARIANTS = [("softmax", {}), ("blockwise", {"block_q": 4, "block_kv": 4}), ("jax", {})]


def tiny(**overrides) -> DecoderConfig:
    base = dict(vocab_size=V, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=8, mlp_hidden=48, max_len=16)
    return DecoderConfig(**{**base, **overrides})


def make(config: DecoderConfig, seed: int = 0) -> DecoderLM:
    """DecoderLM with random numpy parameters (norm scales 1 + noise, never trivial).

    Each parameter's values depend only on (seed, its path, its shape), so models of two
    configs share every parameter whose shape agrees.
    """
    graphdef, state = nnx.split(nnx.eval_shape(lambda: DecoderLM(config, rngs=nnx.Rngs(0))))

    def fill(path, leaf):
        name = path[-2].key
        rng = np.random.default_rng([seed, zlib.crc32(jax.tree_util.keystr(path).encode())])
        x = rng.standard_normal(leaf.shape)
        if name == "scale":
            x = 1.0 + 0.2 * x
        else:
            fan_in = {"embed": leaf.shape[-1], "o_proj": leaf.shape[0] * leaf.shape[1]}
            x = x / math.sqrt(fan_in.get(name, leaf.shape[0]))
        return jnp.asarray(x.astype(leaf.dtype))

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(fill, state))


def random_tokens(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, shape, dtype=np.int32))


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens, positions, segment_ids):
    return nnx.merge(graphdef, state)(tokens, positions=positions, segment_ids=segment_ids)


def forward(model, tokens, *, positions=None, segment_ids=None):
    graphdef, state = nnx.split(model)
    return np.asarray(_forward(graphdef, state, tokens, positions, segment_ids))


@functools.partial(jax.jit, static_argnums=0)
def _step(graphdef, state, tokens, cache, positions, segment_ids):
    model = nnx.merge(graphdef, state)
    return model(tokens, cache=cache, positions=positions, segment_ids=segment_ids)


def step(model, tokens, cache, *, positions=None, segment_ids=None):
    graphdef, state = nnx.split(model)
    return _step(graphdef, state, tokens, cache, positions, segment_ids)


def assert_close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=tol)


# ----------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------
def test_rms_norm_matches_numpy_formula():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8)) * 3.0 + 1.0
    norm = RMSNorm(8, eps=1e-6)
    norm.scale[...] = jnp.asarray(rng.standard_normal(8), jnp.float32)
    got = jax.jit(lambda m, x: m(x))(norm, jnp.asarray(x, jnp.float32))
    want = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-6) * np.asarray(norm.scale[...])
    assert_close(got, want)
    assert norm(jnp.ones((1, 8), jnp.bfloat16)).dtype == jnp.bfloat16


def test_swiglu_matches_numpy_formula():
    mlp = SwiGLU(32, 48, rngs=nnx.Rngs(0))  # tiny() shapes: compiled initialisers are shared
    x = np.random.default_rng(1).standard_normal((2, 3, 32))
    got = jax.jit(lambda m, x: m(x))(mlp, jnp.asarray(x, jnp.float32))
    g = x @ np.asarray(mlp.w_gate[...], np.float64)
    u = x @ np.asarray(mlp.w_up[...], np.float64)
    assert_close(got, (g / (1 + np.exp(-g)) * u) @ np.asarray(mlp.w_down[...], np.float64))


# ----------------------------------------------------------------------------
# KV-cache decoding
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("attention,options", VARIANTS, ids=[v for v, _ in VARIANTS])
def test_kv_cache_decoding_equals_full_forward(attention, options):
    model = make(tiny(attention=attention, attention_options=options))
    tokens = random_tokens(1, (B, T))
    full = forward(model, tokens)
    cache = model.init_cache(B, 12)
    pieces, start = [], 0
    for chunk in (6, 2, 1):  # prefill, a 2-token chunk, one token
        logits, cache = step(model, tokens[:, start:start + chunk], cache)
        pieces.append(np.asarray(logits))
        start += chunk
    assert int(cache[0].index) == T and int(cache[1].index) == T
    assert_close(np.concatenate(pieces, axis=1), full)


def test_empty_cache_slots_are_segment_minus_one_and_masked_by_segments_alone():
    # bidirectional layer: no causal mask, only the segment ids (-1 = empty) hide slots 5..7
    attn = Attention(32, 4, 2, 8, causal=False, rngs=nnx.Rngs(0))
    cache = attn.init_cache(2, 8)
    np.testing.assert_array_equal(cache.segment_ids, -1)
    x = jnp.asarray(np.random.default_rng(16).standard_normal((2, 5, 32)), jnp.float32)
    run = jax.jit(lambda m, x, pos, c: m(x, pos, cache=c))
    full, _ = run(attn, x, jnp.arange(5), None)  # all 5 tokens see each other
    _, cache = run(attn, x[:, :3], jnp.arange(3), cache)
    y, cache = run(attn, x[:, 3:], jnp.arange(3, 5), cache)
    assert_close(y, full[:, 3:])  # the empty (zero-key) slots got no weight
    np.testing.assert_array_equal(cache.segment_ids[:, :5], 0)
    np.testing.assert_array_equal(cache.segment_ids[:, 5:], -1)


def test_left_padded_prefill_then_decode_matches_unpadded():
    model = make(tiny(rope_layout="interleaved"), seed=5)
    seq = random_tokens(6, (1, 8))
    pad = 2  # row 0: 2 padding tokens, then seq[:6]; row 1: seq[:8], no padding
    prompt = jnp.concatenate(
        [jnp.concatenate([random_tokens(7, (1, pad)), seq[:, :6]], axis=1), seq], axis=0)
    seg = jnp.array([[-1] * pad + [0] * 6, [0] * 8], jnp.int32)
    pos = jnp.array([[0] * pad + list(range(6)), list(range(8))], jnp.int32)
    want = forward(model, seq)  # [1, 8, V]
    cache = model.init_cache(2, 10)
    logits, cache = step(model, prompt, cache, positions=pos, segment_ids=seg)
    assert_close(logits[0, pad:], want[0, :6])
    assert_close(logits[1], want[0])
    nxt = jnp.stack([seq[:, 6], seq[:, 0]])  # row 0 decodes seq[6] at position 6
    logits, cache = step(model, nxt, cache, positions=jnp.array([[6], [8]], jnp.int32))
    assert_close(logits[0, 0], want[0, 6])


# ----------------------------------------------------------------------------
# Pluggable attention
# ----------------------------------------------------------------------------
def test_variants_by_name_give_the_same_logits():
    tokens = random_tokens(1, (B, T))
    logits = [forward(make(tiny(attention=a, attention_options=o)), tokens) for a, o in VARIANTS]
    assert_close(logits[1], logits[0])
    assert_close(logits[2], logits[0])


def test_packed_segments_match_separate_sequences():
    # softmax/blockwise take segment ids natively, "jax" through a folded mask
    a, b = random_tokens(10, (1, 4)), random_tokens(11, (1, 5))
    packed = jnp.concatenate([jnp.concatenate([a, b], 1), jnp.concatenate([b, a], 1)], 0)
    seg = jnp.array([[0] * 4 + [1] * 5, [0] * 5 + [1] * 4], jnp.int32)
    pos = jnp.array([list(range(4)) + list(range(5)), list(range(5)) + list(range(4))])
    # causal: the logits of a prefix do not depend on what follows it
    alone = jnp.concatenate([jnp.concatenate([a, packed[:1, 4:]], 1),
                             jnp.concatenate([b, packed[1:, 5:]], 1)], 0)
    for attention, options in VARIANTS:
        model = make(tiny(attention=attention, attention_options=options))
        ref = forward(model, alone)  # row 0 starts with a, row 1 with b
        got = forward(model, packed, positions=pos, segment_ids=seg)
        assert_close(got[0, :4], ref[0, :4])
        assert_close(got[1, :5], ref[1, :5])
        assert_close(got[0, 4:], ref[1, :5])
        assert_close(got[1, 5:], ref[0, :4])


def test_callable_variant_and_options_are_used():
    def scaled(q, k, v, *, causal=False, mask=None, scale=None, factor):
        return dot_product_attention(q, k, v, causal=causal, mask=mask,
                                     scale=factor / math.sqrt(q.shape[-1]))

    tokens = random_tokens(1, (B, T))
    ref = forward(make(tiny()), tokens)
    same = forward(make(tiny(attention=scaled, attention_options={"factor": 1.0})), tokens)
    hot = forward(make(tiny(attention=scaled, attention_options={"factor": 4.0})), tokens)
    assert_close(same, ref)
    assert np.max(np.abs(hot - ref)) > 1e-2


def test_gqa_equals_model_with_repeated_kv_heads():
    gqa = make(tiny(num_heads=4, num_kv_heads=2))
    mha = make(tiny(num_heads=4, num_kv_heads=4))
    for bg, bm in zip(gqa.blocks, mha.blocks):
        # query head h uses kv head h // G (G = 2): repeat each kv head G times
        bm.attn.k_proj[...] = jnp.repeat(bg.attn.k_proj[...], 2, axis=1)
        bm.attn.v_proj[...] = jnp.repeat(bg.attn.v_proj[...], 2, axis=1)
    np.testing.assert_array_equal(gqa.blocks[1].mlp.w_up[...], mha.blocks[1].mlp.w_up[...])
    tokens = random_tokens(1, (B, T))
    assert_close(forward(gqa, tokens), forward(mha, tokens))


def test_attention_module_with_real_init_and_cache():
    attn = Attention(32, 4, 2, 8, attention="blockwise", attention_options={"block_q": 2},
                     rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(14).standard_normal((2, 5, 32)), jnp.float32)
    run = jax.jit(lambda m, x, c: m(x, jnp.arange(5), cache=c))
    y, none = run(attn, x, None)
    assert y.shape == (2, 5, 32) and none is None and float(jnp.std(y)) > 1e-2
    y2, cache = run(attn, x, attn.init_cache(2, 8))
    assert_close(y2, y)
    assert cache.k.shape == (2, 8, 2, 8) and int(cache.index) == 5


# ----------------------------------------------------------------------------
# Errors and config
# ----------------------------------------------------------------------------
def test_value_errors():
    with pytest.raises(ValueError, match="num_kv_heads"):
        DecoderConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        Attention(16, 4, 3, 4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="unknown attention variant"):
        DecoderLM(tiny(attention="no-such-variant"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="unknown attention variant"):
        Attention(16, 4, 2, 4, attention="no-such-variant", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="rope_layout"):
        tiny(rope_layout="sideways")
    model = make(tiny())
    with pytest.raises(ValueError, match="tokens"):
        model(jnp.ones((2, 3), jnp.float32))
    with pytest.raises(ValueError, match="cache length"):
        model(random_tokens(0, (1, 6)), cache=model.init_cache(1, 4))
    full = tuple(c._replace(index=jnp.int32(3)) for c in model.init_cache(1, 4))
    with pytest.raises(ValueError, match="cache index 3"):
        model(random_tokens(0, (1, 2)), cache=full)


def test_config_is_frozen_and_hashable():
    cfg = tiny(attention_options={"block_q": 4})
    assert hash(cfg) == hash(tiny(attention_options={"block_q": 4}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 64
    assert dataclasses.replace(cfg, num_layers=3).num_layers == 3


# ----------------------------------------------------------------------------
# Training properties
# ----------------------------------------------------------------------------
def _loss(graphdef, params, tokens):
    logits = nnx.merge(graphdef, params)(tokens[:, :-1])
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


_grad = jax.jit(jax.grad(_loss, argnums=1), static_argnums=0)


def test_gradients_finite_under_jit_and_blockwise_matches_softmax():
    tokens = random_tokens(15, (B, T + 1))
    grads = []
    for attention, options in VARIANTS[:2]:
        graphdef, params = nnx.split(
            make(tiny(attention=attention, attention_options=options, tie_embeddings=False,
                      num_layers=1)))
        grads.append(_grad(graphdef, params, tokens))
    leaves = jax.tree.leaves(grads[0])
    assert len(leaves) == 9 + 3  # per block 2 norms, 4 attn, 3 mlp; embed, norm, head
    for g in leaves:
        assert bool(jnp.all(jnp.isfinite(g))) and float(jnp.max(jnp.abs(g))) > 0
    jax.tree.map(lambda a, b: assert_close(a, b, 1e-4), grads[0], grads[1])


def test_bf16_params_and_activations():
    tokens = random_tokens(1, (B, T))
    model16 = make(tiny(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16))
    assert model16.embed[...].dtype == jnp.bfloat16
    logits16 = forward(model16, tokens)
    assert logits16.dtype == np.float32 and np.all(np.isfinite(logits16))
    # same parameters up to rounding: the same function up to bf16 error
    logits32 = forward(make(tiny()), tokens)
    assert np.max(np.abs(logits16 - logits32)) < 0.1 * np.max(np.abs(logits32))
    assert model16.init_cache(B, 4)[0].k.dtype == jnp.bfloat16


def test_causal_future_token_does_not_change_earlier_logits():
    model = DecoderLM(tiny(), rngs=nnx.Rngs(0))  # the real initialiser
    tokens = random_tokens(1, (B, T))
    changed = tokens.at[:, 6].set((tokens[:, 6] + 1) % V)
    a, b = forward(model, tokens), forward(model, changed)
    assert np.std(a) > 0.1
    np.testing.assert_array_equal(a[:, :6], b[:, :6])
    assert np.max(np.abs(a[:, 6:] - b[:, 6:])) > 1e-3


def test_attention_config_form_equals_keyword_form():
    """Attention(AttentionConfig(...)) builds the same layer as the keyword form (same
    parameters from the same rngs, same output); a config plus fields is refused; a
    DecoderLM's layer is its config's layer_attention_config."""
    from lcjax.nn import AttentionConfig, DecoderConfig, DecoderLM

    kw = dict(attention="softmax", qkv_bias=True, qk_norm=True, local_window_size=(3, 0))
    cfg = AttentionConfig(16, 4, 2, 8, **kw)
    by_cfg = Attention(cfg, rngs=nnx.Rngs(3))
    by_kw = Attention(16, 4, 2, 8, **kw, rngs=nnx.Rngs(3))
    by_name = Attention(config=cfg, rngs=nnx.Rngs(3))
    x = jax.random.normal(jax.random.key(0), (2, 5, 16))
    want = by_kw(x, jnp.arange(5))[0]
    for layer in (by_cfg, by_name):
        for a, b in zip(jax.tree.leaves(nnx.state(layer, nnx.Param)),
                        jax.tree.leaves(nnx.state(by_kw, nnx.Param)), strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(layer(x, jnp.arange(5))[0], want)
    with pytest.raises(TypeError, match="not both"):
        Attention(cfg, causal=False, rngs=nnx.Rngs(0))
    dc = DecoderConfig(vocab_size=300, d_model=16, num_heads=4, num_kv_heads=2, head_dim=8,
                       num_layers=1, max_len=32)
    lm = DecoderLM(dc, rngs=nnx.Rngs(1))
    ref = Attention(dc.layer_attention_config(0), rngs=nnx.Rngs(1))
    attrs = ("num_heads", "num_kv_heads", "head_dim", "causal", "position", "use_rope",
             "rope_base", "local_window_size", "attention_fn", "attention_options")
    assert [getattr(lm.blocks[0].attn, a) for a in attrs] == [getattr(ref, a) for a in attrs]
