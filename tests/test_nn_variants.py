"""Variant parameters built from the spec, capabilities from the spec, and the
attention-weights tap of ``lcjax.nn.Attention`` / ``DecoderLM``.

References are independent numpy (float64) computations: projections, RoPE (half
layout, written out here), per-head scores, causal softmax.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax import attention as A
from lcjax.attention import AttentionSpec, Features, Implementation
from lcjax.nn import (
    Attention,
    AttentionTap,
    DecoderConfig,
    DecoderLM,
    VariantConfig,
    capture_attention,
)

B, T = 2, 6


def tiny(**overrides) -> DecoderConfig:
    base = dict(vocab_size=23, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=8, mlp_hidden=24, max_len=12)
    return DecoderConfig(**{**base, **overrides})


def normal(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def tokens(seed, shape=(B, T)):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 23, shape), jnp.int32)


# ----------------------------------------------------------------------------
# Independent numpy reference of one attention layer
# ----------------------------------------------------------------------------
def np_rope(x, positions, base=10000.0):
    """Half-rotation RoPE of x [B, T, H, D] at positions [T] (float64)."""
    d = x.shape[-1]
    freq = base ** (-np.arange(0, d, 2) / d)  # [D/2]
    ang = np.asarray(positions, np.float64)[:, None] * freq  # [T, D/2]
    cos, sin = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def np_layer_qk(attn: Attention, x):
    """Rotated q [B, T, H, D], k [B, T, Hkv, D] of layer ``attn`` on x [B, T, D_model]."""
    x = np.asarray(x, np.float64)
    q = np.einsum("btd,dnh->btnh", x, np.asarray(attn.q_proj[...], np.float64))
    k = np.einsum("btd,dkh->btkh", x, np.asarray(attn.k_proj[...], np.float64))
    pos = np.arange(x.shape[1])
    return np_rope(q, pos), np_rope(k, pos)


def np_weights(q, k, *, temperature=None, causal=True, same_segment=None):
    """Softmax weights [B, H, T, S] of q·k/sqrt(D) (/ temperature[h]), key head h // G."""
    h, hk = q.shape[2], k.shape[2]
    k = np.repeat(k, h // hk, axis=2)
    s = np.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])
    if temperature is not None:
        s = s / np.asarray(temperature, np.float64)[None, :, None, None]
    allowed = np.ones(s.shape, bool)
    if causal:
        allowed &= np.tril(np.ones(s.shape[-2:], bool))
    if same_segment is not None:
        allowed &= same_segment[:, None]
    s = np.where(allowed, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_layer(attn: Attention, x, *, temperature=None):
    """y [B, T, D_model] of a causal layer with RoPE (numpy float64)."""
    q, k = np_layer_qk(attn, x)
    v = np.einsum("btd,dkh->btkh", np.asarray(x, np.float64),
                  np.asarray(attn.v_proj[...], np.float64))
    w = np_weights(q, k, temperature=temperature)
    v = np.repeat(v, q.shape[2] // v.shape[2], axis=2)
    o = np.einsum("bhts,bshd->bthd", w, v)
    return np.einsum("bthd,hdm->btm", o, np.asarray(attn.o_proj[...], np.float64))


# ----------------------------------------------------------------------------
# A toy variant with its own parameters: a learnable temperature per head
# ----------------------------------------------------------------------------
TOY = "toy_temperature"


def toy_attention(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
                  kv_segment_ids=None, temperature=1.0):
    """softmax(scale · q·kᵀ / temperature[h]) v, temperature [H] (or a number)."""
    t = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (q.shape[2],))
    return A.dot_product_attention(q / t[None, None, :, None].astype(q.dtype), k, v,
                                   causal=causal, mask=mask, scale=scale,
                                   q_segment_ids=q_segment_ids,
                                   kv_segment_ids=kv_segment_ids)


def toy_impl(q, k, v, *, causal, mask, scale, q_segment_ids, kv_segment_ids, return_aux,
             temperature=1.0):
    out = toy_attention(q, k, v, causal=causal, mask=mask, scale=scale,
                        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                        temperature=temperature)
    return (out, {}) if return_aux else out


class Temperature(nnx.Module):
    """log temperature [H], random at init (heads differ), or log(temperature_init)."""

    init_options = ("temperature_init",)

    def __init__(self, num_heads, init, *, rngs):
        if init is None:
            raw = 0.3 * jax.random.normal(rngs.params(), (num_heads,))
        else:
            raw = jnp.full((num_heads,), math.log(init))
        self.log_t = nnx.Param(raw)

    def __call__(self, **_):
        return {"temperature": jnp.exp(self.log_t[...])}


def toy_params(config: VariantConfig, *, rngs):
    config.unknown_learn((), TOY)
    return Temperature(config.num_heads, config.options.get("temperature_init"), rngs=rngs)


@pytest.fixture
def toy():
    spec = A.register(AttentionSpec(
        TOY, reference=toy_attention, implementations=(Implementation("xla", toy_impl),),
        params=toy_params, description="test-only: softmax with a learnable temperature"))
    try:
        yield spec
    finally:
        A.unregister(TOY)
    assert TOY not in A.available()


def test_toy_variant_is_picked_up_by_the_model_config(toy):
    model = DecoderLM(tiny(attention=TOY), rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    log_t = [params["blocks"][i]["attn"]["variant_params"]["log_t"] for i in range(2)]
    assert all(p[...].shape == (4,) for p in log_t)
    assert float(jnp.std(log_t[0][...])) > 0.05  # random init: heads differ

    # the layer's output is the hand-computed one with its temperatures
    attn = model.blocks[0].attn
    x = normal(1, (B, T, 16))
    y, _ = attn(x, jnp.arange(T))
    ref = np_layer(attn, x, temperature=np.exp(np.asarray(attn.variant_params.log_t[...])))
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5)

    # every temperature receives a nonzero gradient through the whole model
    tok = tokens(2)

    def loss(m):
        logp = jax.nn.log_softmax(m(tok[:, :-1]))
        return -jnp.mean(jnp.take_along_axis(logp, tok[:, 1:, None], axis=-1))

    grads = nnx.jit(nnx.grad(loss))(model)  # one compile, not one per primitive
    for i in range(2):
        g = grads["blocks"][i]["attn"]["variant_params"]["log_t"][...]
        assert bool(jnp.all(jnp.isfinite(g))) and bool(jnp.all(g != 0))

    # temperature 1 is plain softmax attention: same parameters, same logits
    for block in model.blocks:
        block.attn.variant_params.log_t[...] = jnp.zeros(4)
    softmax = DecoderLM(tiny(attention="softmax"), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(np.asarray(model(tok)), np.asarray(softmax(tok)),
                               rtol=1e-5, atol=1e-5)


def test_init_only_options_reach_the_factory_not_the_variant(toy):
    # the spec rejects unknown options, so the call proves `temperature_init` was dropped
    attn = Attention(16, 4, 2, 8, attention=TOY, attention_options={"temperature_init": 2.0},
                     rngs=nnx.Rngs(0))
    np.testing.assert_allclose(np.exp(np.asarray(attn.variant_params.log_t[...])), 2.0,
                               rtol=1e-6)
    assert "temperature_init" not in attn.attention_options
    x = normal(3, (1, 5, 16))
    y, _ = attn(x, jnp.arange(5))
    np.testing.assert_allclose(np.asarray(y), np_layer(attn, x, temperature=np.full(4, 2.0)),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot learn"):
        Attention(16, 4, 2, 8, attention=TOY, learn=("alpha",), rngs=nnx.Rngs(0))


# ----------------------------------------------------------------------------
# Learnable α for entmax, reached from the model config
# ----------------------------------------------------------------------------
def test_entmax_learnable_alpha_from_the_config():
    cfg = tiny(attention="entmax", attention_options={"alpha": 1.8}, attention_learn=["alpha"])
    assert cfg.attention_learn == ("alpha",) and hash(cfg) == hash(cfg)
    learned = DecoderLM(cfg, rngs=nnx.Rngs(0))
    raw = nnx.state(learned, nnx.Param)["blocks"][1]["attn"]["variant_params"]["alpha_raw"]
    np.testing.assert_allclose(1 + jax.nn.sigmoid(raw[...]), 1.8, rtol=1e-6)
    # at init the learned per-head α equals the fixed α = 1.8 model (same projections)
    fixed = DecoderLM(tiny(attention="entmax", attention_options={"alpha": 1.8}),
                      rngs=nnx.Rngs(0))
    assert fixed.blocks[0].attn.variant_params is None
    tok = tokens(4)
    a, b = np.asarray(learned(tok)), np.asarray(fixed(tok))
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    # a different α per head changes the model
    learned.blocks[0].attn.variant_params.alpha_raw[...] = jnp.array([-2.0, -1.0, 1.0, 2.0])
    assert np.max(np.abs(np.asarray(learned(tok)) - b)) > 1e-3


@pytest.mark.parametrize("kwargs, match", [
    (dict(attention="softmax", learn=("alpha",)), "has none"),
    (dict(attention="entmax", learn=("beta",)), "cannot learn"),
    (dict(attention="entmax", learn="alpha"), "sequence of names"),
    (dict(attention="entmax", learn=("alpha",), attention_options={"alpha": 2.0}),
     r"\[1.01, 2\)"),
    (dict(attention=toy_attention, learn=("alpha",)), "has none"),
    (dict(attention=toy_attention, capture_weights=True), "weights"),
])
def test_variant_parameter_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Attention(16, 4, 2, 8, rngs=nnx.Rngs(0), **kwargs)


# ----------------------------------------------------------------------------
# Capabilities come from the spec
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("native", [True, False])
def test_segment_ids_native_only_when_the_spec_says_so(native):
    seen = {}

    def impl(q, k, v, *, causal, mask, scale, q_segment_ids, kv_segment_ids, return_aux):
        seen.update(ids=q_segment_ids is not None, mask=mask is not None)
        out = A.dot_product_attention(q, k, v, causal=causal, mask=mask, scale=scale,
                                      q_segment_ids=q_segment_ids,
                                      kv_segment_ids=kv_segment_ids)
        return (out, {}) if return_aux else out

    name = f"toy_segments_{native}"
    A.register(AttentionSpec(name, reference=A.dot_product_attention,
                             implementations=(Implementation("xla", impl),),
                             features=Features(segment_ids=native)))
    try:
        seg = jnp.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, -1]], jnp.int32)
        attn = Attention(16, 4, 2, 8, attention=name, rngs=nnx.Rngs(0))
        ref = Attention(16, 4, 2, 8, attention="softmax", rngs=nnx.Rngs(0))
        x = normal(5, (B, T, 16))
        y, _ = attn(x, jnp.arange(T), segment_ids=seg)
        assert seen == {"ids": native, "mask": not native}
        np.testing.assert_allclose(np.asarray(y),
                                   np.asarray(ref(x, jnp.arange(T), segment_ids=seg)[0]),
                                   rtol=1e-6, atol=1e-6)
    finally:
        A.unregister(name)


def test_plain_callable_gets_segment_ids_as_a_mask():
    got = {}

    def plain(q, k, v, *, causal=False, mask=None, scale=None):
        got["mask"] = mask
        return A.dot_product_attention(q, k, v, causal=causal, mask=mask, scale=scale)

    seg = jnp.array([[0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]], jnp.int32)
    Attention(16, 4, 2, 8, attention=plain, rngs=nnx.Rngs(0))(
        normal(6, (B, T, 16)), jnp.arange(T), segment_ids=seg)
    want = seg[:, :, None] == seg[:, None, :]
    np.testing.assert_array_equal(np.asarray(got["mask"])[:, 0], np.asarray(want))


# ----------------------------------------------------------------------------
# Attention-weights tap
# ----------------------------------------------------------------------------
def test_attention_weights_helper_matches_numpy_and_reproduces_the_output():
    q, k, v = normal(7, (B, 5, 4, 8)), normal(8, (B, 7, 2, 8)), normal(9, (B, 7, 2, 8))
    seg_q = jnp.array([[0, 0, 1, 1, 1], [0, 0, 0, 0, -1]], jnp.int32)
    seg_k = jnp.array([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, -1, -1]], jnp.int32)
    w = A.attention_weights(q, k, causal=True, q_segment_ids=seg_q, kv_segment_ids=seg_k)
    assert w.shape == (B, 4, 5, 7) and w.dtype == jnp.float32
    same = ((np.asarray(seg_q)[:, :, None] == np.asarray(seg_k)[:, None, :])
            & (np.asarray(seg_q)[:, :, None] >= 0) & (np.asarray(seg_k)[:, None, :] >= 0))
    with np.errstate(invalid="ignore"):
        ref = np_weights(np.asarray(q, np.float64), np.asarray(k, np.float64),
                         causal=True, same_segment=same)
    empty = np.isnan(ref).all(-1)  # a query that sees no key: zeros, not NaN
    assert empty.sum() >= 2 * 4  # a padding query and one cut off by causality, all heads
    ref = np.where(empty[..., None], 0.0, ref)
    np.testing.assert_allclose(np.asarray(w), ref, rtol=1e-5, atol=1e-6)
    out = jnp.einsum("BHTS,BSHD->BTHD", w, jnp.repeat(v, 2, axis=2))
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(A.dot_product_attention(
            q, k, v, causal=True, q_segment_ids=seg_q, kv_segment_ids=seg_k)),
        rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        A.attention_weights(q[:, :, :3], k)


def test_tap_captures_hand_computed_weights_and_leaves_the_output_unchanged():
    model = DecoderLM(tiny(), rngs=nnx.Rngs(0))
    tok = tokens(10)
    plain = np.asarray(model(tok))
    out, weights = capture_attention(model, tok)
    np.testing.assert_array_equal(np.asarray(out), plain)
    assert len(weights) == 2 and all(w.shape == (B, 4, T, T) for w in weights)
    assert not any(b.attn.attention_weights.enabled for b in model.blocks)  # restored

    _, inputs = capture_attention(model, tok, tap="inputs")
    assert len(inputs) == 2 and sorted(inputs[0]) == ["k", "q", "scale", "v"]
    x = model.embed[...][tok]
    for i, block in enumerate(model.blocks):
        q, k = np_layer_qk(block.attn, block.attn_norm(x))
        w = np.asarray(weights[i])
        np.testing.assert_allclose(w, np_weights(q, k), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)
        assert np.all(w[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0)
        # the inputs tap: the rotated q, k the variant received, and its scale
        np.testing.assert_allclose(np.asarray(inputs[i]["q"]), q, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(inputs[i]["k"]), k, rtol=1e-5, atol=1e-5)
        assert float(inputs[i]["scale"]) == pytest.approx(1 / math.sqrt(8))
        x, _ = block(x, jnp.arange(T))

    # the same under jit
    out_j, weights_j = nnx.jit(capture_attention)(model, tok)
    np.testing.assert_allclose(np.asarray(out_j), plain, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(weights_j[1]), np.asarray(weights[1]),
                               rtol=1e-6, atol=1e-7)


def test_tap_errors():
    with pytest.raises(ValueError, match="tap"):
        capture_attention(DecoderLM(tiny(num_layers=1), rngs=nnx.Rngs(0)), tokens(0),
                          tap="scores")
    with pytest.raises(ValueError, match="no Attention layer"):
        capture_attention(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), jnp.ones((1, 2)))


def test_tap_from_the_config_and_disabled_by_default():
    tok = tokens(11)
    on = DecoderLM(tiny(capture_attention_weights=True), rngs=nnx.Rngs(0))
    off = DecoderLM(tiny(), rngs=nnx.Rngs(0))
    out_on, sown = nnx.capture(on, nnx.Intermediate)(tok)
    out_off, nothing = nnx.capture(off, nnx.Intermediate)(tok)
    np.testing.assert_array_equal(np.asarray(out_on), np.asarray(out_off))
    assert len(jax.tree.leaves(nothing)) == 0
    w0 = sown["blocks"][0]["attn"]["attention_weights"]["weights"]
    _, weights = capture_attention(off, tok)
    np.testing.assert_array_equal(np.asarray(w0.get_value()[0]), np.asarray(weights[0]))
    off.set_attributes(AttentionTap, enabled=True)
    assert all(b.attn.attention_weights.enabled for b in off.blocks)


def test_tap_sees_packed_segments_and_the_kv_cache():
    model = DecoderLM(tiny(), rngs=nnx.Rngs(0))
    seg = jnp.array([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1]], jnp.int32)
    pos = jnp.array([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 0, 1]], jnp.int32)
    _, (w, _) = capture_attention(model, tokens(12), positions=pos, segment_ids=seg)
    same = np.asarray(seg)[:, :, None] == np.asarray(seg)[:, None, :]
    assert np.all(np.asarray(w)[~np.broadcast_to(same[:, None], w.shape)] == 0)
    np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, rtol=1e-6)

    # decoding: prefill 4 tokens, then one step; the step's weights cover the 5 filled
    # slots of the cache (zeros beyond) and equal the full forward's last row
    tok = tokens(13, (B, 5))
    _, full = capture_attention(model, tok)
    cache = model.init_cache(B, 8)
    _, cache = model(tok[:, :4], cache=cache)
    _, step = capture_attention(model, tok[:, 4:], cache=cache)
    for layer in range(2):
        s = np.asarray(step[layer])
        assert s.shape == (B, 4, 1, 8)
        assert np.all(s[..., 5:] == 0)
        np.testing.assert_allclose(s[..., :5], np.asarray(full[layer])[:, :, 4:5],
                                   rtol=1e-5, atol=1e-6)
