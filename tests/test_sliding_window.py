"""The drop-in options of ``jax.nn.dot_product_attention`` in the attention contract:
``is_causal``, ``bias`` and ``local_window_size`` (sliding window), declared by
``Features.bias`` / ``Features.window``; block skipping outside the window; one ``causal``
default per method; sliding windows in ``lcjax.nn`` (KV-cache decoding) and in the HF
config mapping. References: ``jax.nn.dot_product_attention`` itself, dense masks built
here with numpy, and full forward passes without a cache.
"""

from __future__ import annotations

import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcjax import attention
from lcjax.attention.blocks import (
    Masking,
    block_plan,
    fold_kv_blocks,
    kv_block_range,
    q_block_range,
)

KEY = jax.random.PRNGKey(7)


def qkv(t=21, s=37, h=4, hk=2, d=8, seed=0, b=2):
    k1, k2, k3 = jax.random.split(jax.random.fold_in(KEY, seed), 3)
    return (jax.random.normal(k1, (b, t, h, d)), jax.random.normal(k2, (b, s, hk, d)),
            jax.random.normal(k3, (b, s, hk, d)))


def np_window(t, s, left, right, causal=False) -> np.ndarray:
    """[t, s]: query i sees key j iff i - left <= j <= i + right (and j <= i if causal)."""
    i, j = np.arange(t)[:, None], np.arange(s)[None, :]
    keep = (j >= i - left) & (j <= i + right)
    return keep & (j <= i) if causal else keep


OPTIONS = {"softmax": {}, "blockwise": {"block_q": 4, "block_kv": 8}, "jax": {}}
# every row sees a key in each case (jax.nn gives an empty row the mean of v, we give 0)
WINDOWS = [(3, True, 21, 21), ((4, 3), False, 21, 37), ((6, 0), False, 27, 27),
           ((0, 40), False, 21, 37), ((2, 5), True, 19, 19)]


@pytest.mark.parametrize("window,causal,t,s", WINDOWS)
@pytest.mark.parametrize("name", list(OPTIONS))
def test_window_equals_jax_nn_forward_and_gradients(name, window, causal, t, s):
    q, k, v = qkv(t, s)
    cot = jax.random.normal(jax.random.fold_in(KEY, 99), q.shape)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * cot)

    ours = lambda q, k, v: attention.get(name)(q, k, v, causal=causal, local_window_size=window,
                                               **OPTIONS[name])
    want = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                        local_window_size=window)
    np.testing.assert_allclose(jax.jit(ours)(q, k, v), want(q, k, v), atol=2e-6)
    g_ours = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2)))(q, k, v)
    g_want = jax.grad(loss(want), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_ours, g_want):
        np.testing.assert_allclose(a, b, atol=2e-5)


@pytest.mark.parametrize("shape", [(1, 4, 21, 37), (2, 1, 1, 37), (4, 21, 37)])
@pytest.mark.parametrize("name", ["softmax", "jax"])
def test_bias_equals_jax_nn_with_its_gradient(name, shape):
    q, k, v = qkv()
    bias = jax.random.normal(jax.random.fold_in(KEY, 5), shape)
    cot = jax.random.normal(jax.random.fold_in(KEY, 98), q.shape)
    bias4 = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)  # jax.nn wants rank 4

    def ours(q, k, v, bias):
        return jnp.sum(attention.get(name)(q, k, v, bias=bias, local_window_size=(5, 9)) * cot)

    def want(q, k, v, bias):
        out = jax.nn.dot_product_attention(q, k, v, bias=bias.reshape(bias4.shape),
                                           local_window_size=(5, 9))
        return jnp.sum(out * cot)

    np.testing.assert_allclose(  # the outputs, elementwise
        attention.get(name)(q, k, v, bias=bias, local_window_size=(5, 9)),
        jax.nn.dot_product_attention(q, k, v, bias=bias4, local_window_size=(5, 9)), atol=2e-6)
    g_got = jax.jit(jax.grad(ours, argnums=(0, 1, 2, 3)))(q, k, v, bias)
    g_ref = jax.grad(want, argnums=(0, 1, 2, 3))(q, k, v, bias)
    for a, b in zip(g_got, g_ref):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=2e-5)
    assert float(jnp.abs(g_got[3]).max()) > 1e-3  # the bias really gets a gradient


@pytest.mark.parametrize("name", ["entmax", "sparsemax", "asentmax", "ssmax"])
@pytest.mark.parametrize("window,causal", [((4, 3), False), ((5, 0), True)])
def test_entmax_family_window_equals_reference_with_explicit_mask(name, window, causal):
    spec = attention.spec(name)
    q, k, v = qkv()
    mask = jnp.asarray(np_window(21, 37, *window, causal=causal))
    options = {"block_q": 4, "block_kv": 8}
    got = jax.jit(lambda q, k, v: spec(q, k, v, causal=causal, local_window_size=window,
                                       implementation="xla", **options))(q, k, v)
    want = spec.reference(q, k, v, mask=mask)
    np.testing.assert_allclose(got, want, atol=2e-5)
    unwindowed = spec.reference(q, k, v, causal=causal)
    assert float(jnp.abs(want - unwindowed).max()) > 1e-2  # the window changes the result


def test_entmax_window_gradients_and_block_sparsity():
    spec = attention.spec("entmax")
    q, k, v = qkv(t=32, s=32)
    cot = jax.random.normal(jax.random.fold_in(KEY, 3), q.shape)
    mask = jnp.asarray(np_window(32, 32, 3, 0, causal=True))
    fn = lambda q, k, v: jnp.sum(spec(q, k, v, causal=True, local_window_size=(3, 0),
                                      implementation="xla", block_q=8, block_kv=8) * cot)
    ref = lambda q, k, v: jnp.sum(spec.reference(q, k, v, mask=mask) * cot)
    for a, b in zip(jax.grad(fn, argnums=(0, 1, 2))(q, k, v),
                    jax.grad(ref, argnums=(0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(a, b, atol=1e-4)
    _, aux = spec(q, k, v, causal=True, local_window_size=(3, 0), implementation="xla",
                  block_q=8, block_kv=8, return_aux=True)
    # the sparsity counts only tiles inside the window: the diagonal and the one before it
    # (7 + 4 = 11 tiles of 16); all of them hold weight, so none is empty
    assert float(aux["block_sparsity"]) == 0.0


def test_entmax_pallas_declares_no_window_and_dispatch_serves_xla():
    spec = attention.spec("entmax")
    assert spec.features.window and not spec.features_of("pallas").window
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match="local_window_size"):
        spec(q, k, v, local_window_size=3, implementation="pallas")
    out = spec(q, k, v, local_window_size=3)  # CPU: the XLA path
    np.testing.assert_allclose(out, spec.reference(q, k, v, local_window_size=3), atol=2e-5)


# ----------------------------------------------------------------------------
# Block skipping
# ----------------------------------------------------------------------------
def _visited(plan, masking=None):
    """Tiles (qi, kj) visited by the kv-block folds (from kv_block_range) and by the
    q-block folds (from q_block_range)."""
    masking = Masking() if masking is None else masking
    by_q = {(qi, kj) for qi in range(plan.num_q_blocks)
            for kj in range(*(int(x) for x in np.asarray(kv_block_range(plan, qi,
                                                                        masking))[[0, 2]]))}
    by_k = {(qi, kj) for kj in range(plan.num_kv_blocks)
            for qi in range(*(int(x) for x in np.asarray(q_block_range(plan, kj,
                                                                       masking))[[0, 2]]))}
    return by_q, by_k


def _needed(plan):
    keep = np_window(plan.q_len, plan.kv_len, *plan.window, causal=plan.causal)
    keep = np.pad(keep, ((0, plan.q_padded - plan.q_len), (0, plan.kv_padded - plan.kv_len)))
    tiles = keep.reshape(plan.num_q_blocks, plan.block_q, plan.num_kv_blocks, plan.block_kv)
    return {tuple(x) for x in np.argwhere(tiles.any(axis=(1, 3)))}


@pytest.mark.parametrize("window,causal,t,s,bq,bk", [
    ((5, 2), False, 37, 53, 4, 8), ((7, 0), True, 40, 40, 8, 4), ((0, 9), False, 30, 30, 5, 3),
    ((16, 0), True, 64, 64, 16, 16), ((3, 3), False, 20, 50, 20, 7)])
def test_window_block_ranges_visit_exactly_the_tiles_with_a_visible_pair(window, causal, t, s,
                                                                         bq, bk):
    plan = block_plan(q_len=t, kv_len=s, head_dim=8, scale=None, causal=causal, block_q=bq,
                      block_kv=bk, acc_dtype=jnp.float32, window=window)
    by_q, by_k = _visited(plan)
    assert by_q == by_k == _needed(plan)


def test_blockwise_work_scales_with_the_window_not_the_length():
    """The kv-block fold of every query block runs its body (one tile: scores, softmax
    update) only on the tiles of the window: counted by a body that adds 1 per tile."""

    def tiles_visited(length, window):
        plan = block_plan(q_len=length, kv_len=length, head_dim=4, scale=None, causal=True,
                          block_q=64, block_kv=64, acc_dtype=jnp.float32, window=window)
        q = jnp.zeros((1, plan.q_padded, 1, 1, 4))
        k = jnp.zeros((1, plan.kv_padded, 1, 4))

        @jax.jit
        def count():
            def one(qi):
                qb = jnp.transpose(jax.lax.dynamic_slice_in_dim(q, qi * 64, 64, axis=1),
                                   (0, 2, 3, 1, 4))
                return fold_kv_blocks(plan, qi, qb, k, Masking(), lambda kj, s, c: c + 1,
                                      jnp.int32(0))
            return jnp.sum(jax.lax.map(one, jnp.arange(plan.num_q_blocks)))

        return int(count())

    # left window 64: two tiles per query block (its own and the one before), whatever S
    # is; 127 reaches a third (row 64 qi sees key 64 qi - 127, in block qi - 2)
    for length in (1024, 4096):
        assert tiles_visited(length, (64, 0)) == 2 * (length // 64) - 1
        assert tiles_visited(length, (127, 0)) == 3 * (length // 64) - 3
    full = tiles_visited(4096, None)
    assert full == 64 * 65 // 2  # causal without a window: the lower triangle
    assert tiles_visited(4096, (64, 0)) < full / 16


# ----------------------------------------------------------------------------
# The contract: alias, validation, declared features
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["softmax", "blockwise", "jax", "entmax", "linear"])
def test_is_causal_is_an_alias_of_causal(name):
    q, k, v = qkv(t=24, s=24)
    fn = attention.get(name)
    np.testing.assert_array_equal(fn(q, k, v, is_causal=True), fn(q, k, v, causal=True))
    np.testing.assert_array_equal(fn(q, k, v, is_causal=False), fn(q, k, v))
    np.testing.assert_array_equal(fn(q, k, v, causal=True, is_causal=True),
                                  fn(q, k, v, causal=True))
    with pytest.raises(ValueError, match=r"causal=True.*is_causal=False"):
        fn(q, k, v, causal=True, is_causal=False)
    with pytest.raises(ValueError, match=r"causal=False.*is_causal=True"):
        fn(q, k, v, causal=False, is_causal=True)


@pytest.mark.parametrize("window,match", [(-1, "-1"), ((3, -2), r"\(3, -2\)"),
                                          ((1, 2, 3), r"\(1, 2, 3\)"), (2.5, "2.5"),
                                          (True, "True")])
@pytest.mark.parametrize("name", ["softmax", "blockwise", "jax", "entmax"])
def test_bad_window_raises_value_error_naming_it(name, window, match):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=f"local_window_size.*{match}"):
        jax.eval_shape(lambda q, k, v: attention.get(name)(q, k, v, local_window_size=window),
                       q, k, v)


@pytest.mark.parametrize("shape", [(2, 3, 21, 37), (21, 36), (1, 1, 1, 1, 37)])
@pytest.mark.parametrize("name", ["softmax", "jax"])
def test_bad_bias_raises_value_error_naming_the_shapes(name, shape):
    q, k, v = qkv()
    bias = jnp.zeros(shape)
    with pytest.raises(ValueError, match=rf"`bias` of shape \[{', '.join(map(str, shape))}\]"
                                         r".*\[2, 4, 21, 37\]"):
        jax.eval_shape(lambda b: attention.get(name)(q, k, v, bias=b), bias)
    with pytest.raises(ValueError, match="floating"):
        attention.get(name)(q, k, v, bias=jnp.zeros((21, 37), jnp.int32))


def test_undeclared_features_raise_and_are_never_ignored():
    q, k, v = qkv(t=24, s=24)
    for spec in attention.specs():
        if not spec.features.window:
            with pytest.raises(ValueError, match="does not support local_window_size"):
                spec(q, k, v, local_window_size=3)
        if not spec.features.bias:
            with pytest.raises(ValueError, match="does not support bias"):
                spec(q, k, v, bias=jnp.ones((24, 24)))
    declared = {s.name for s in attention.specs() if s.features.window}
    assert {"softmax", "blockwise", "jax", "entmax", "sparsemax", "asentmax",
            "ssmax"} <= declared
    assert {s.name for s in attention.specs() if s.features.bias} >= {"softmax", "jax"}


def test_a_spec_declaring_a_window_its_function_cannot_take_is_refused():
    from lcjax.attention.base import AttentionSpec, Features, Implementation, with_empty_aux
    from lcjax.attention.core import dot_product_attention

    def no_window(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
                  kv_segment_ids=None):
        return dot_product_attention(q, k, v, causal=causal, mask=mask, scale=scale)

    with pytest.raises(TypeError, match="local_window_size"):
        AttentionSpec("toy_window", reference=dot_product_attention,
                      implementations=(Implementation("xla", with_empty_aux(no_window)),),
                      features=Features(window=True))


# ----------------------------------------------------------------------------
# One causal default per method
# ----------------------------------------------------------------------------
WRAPPERS = {
    "softmax": attention.dot_product_attention, "blockwise": attention.blockwise_attention,
    "jax": attention.jax_dot_product_attention, "entmax": attention.entmax_attention,
    "sparsemax": attention.sparsemax_attention, "linear": attention.linear_attention,
    "performer": attention.performer_attention, "plash": attention.plash_attention,
    "token_sparse": attention.token_sparse_attention,
}


def test_functional_wrappers_default_to_the_spec_causal():
    """Every method's function defaults to causal=False, as ``attention.get(name)`` (the
    contract) does; a spec without such a wrapper is named here (none is forgotten)."""
    spec_default = inspect.signature(attention.AttentionSpec.__call__).parameters["causal"]
    assert spec_default.default is None  # None = not given = False (is_causal may set it)
    without = {"asentmax", "ssmax", "nystrom"}  # no functional wrapper with `causal`
    assert set(WRAPPERS) | without >= {s.name for s in attention.specs()} - {"flashblock"}
    for name, fn in WRAPPERS.items():
        assert inspect.signature(fn).parameters["causal"].default is False, name


def test_token_sparse_function_and_spec_agree_without_causal():
    q, k, v = qkv(t=24, s=24, h=2, hk=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dense (short) calls warn once
        a = attention.token_sparse_attention(q, k, v, min_tokens=4, window=4, coverage=0.2)
        b = attention.get("token_sparse")(q, k, v, min_tokens=4, window=4, coverage=0.2)
        causal = attention.token_sparse_attention(q, k, v, causal=True, min_tokens=4, window=4,
                                                  coverage=0.2)
    np.testing.assert_array_equal(a, b)
    assert float(jnp.abs(a - causal).max()) > 1e-3


# ----------------------------------------------------------------------------
# lcjax.nn: sliding-window layers, KV-cache decoding, HF configs
# ----------------------------------------------------------------------------
def _tiny(**overrides):
    from lcjax.nn import DecoderConfig
    base = dict(vocab_size=17, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=8, mlp_hidden=48, max_len=24)
    return DecoderConfig(**{**base, **overrides})


def _model(config, seed=0):
    from flax import nnx

    from lcjax.nn import DecoderLM
    return DecoderLM(config, rngs=nnx.Rngs(seed))


@pytest.mark.parametrize("attention_name,options", [("softmax", {}),
                                                    ("blockwise", {"block_q": 2,
                                                                   "block_kv": 4})])
def test_sliding_window_decoder_generate_equals_full_forward_greedy(attention_name, options):
    """Ragged right-padded prompts through the KV cache, then greedy decoding: every row
    equals the greedy loop of full forward passes (no cache) of the windowed model, and
    the window changes the logits (layer 0 windowed, layer 1 full)."""
    from lcjax.nn import generate

    config = _tiny(attention=attention_name, attention_options=options, sliding_window=(3, None))
    model = _model(config, seed=1)
    plain = _model(_tiny(attention=attention_name, attention_options=options), seed=1)
    prompts = jnp.asarray(np.random.default_rng(3).integers(0, 17, (3, 7)), jnp.int32)
    lengths = np.array([7, 4, 6])
    n = 6
    out = generate(model, prompts, n, prompt_lengths=jnp.asarray(lengths))
    for b, length in enumerate(lengths):
        seq = np.asarray(prompts[b:b + 1, :length])
        for _ in range(n):
            nxt = np.argmax(np.asarray(model(jnp.asarray(seq)))[:, -1], axis=-1)
            seq = np.concatenate([seq, nxt[:, None]], axis=1)
        np.testing.assert_array_equal(np.asarray(out.tokens[b, :length + n]), seq[0])
    full = np.asarray(model(prompts))
    assert np.abs(full - np.asarray(plain(prompts))).max() > 1e-3
    np.testing.assert_allclose(full[:, :3], np.asarray(plain(prompts))[:, :3], atol=1e-5)


def test_windowed_layer_refuses_a_variant_without_the_feature():
    from flax import nnx

    from lcjax.nn import Attention
    with pytest.raises(ValueError, match="'linear' does not"):
        Attention(32, 4, 2, 8, attention="linear", local_window_size=(3, 0), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="sliding_window.*2 entries"):
        _tiny(sliding_window=(3, 4, 5))
    with pytest.raises(ValueError, match="positive int, got 0"):
        _tiny(sliding_window=0)
    with pytest.raises(ValueError, match="causal=True"):
        _tiny(sliding_window=4, causal=False)


def _hf(kind, **extra):
    base = dict(model_type=kind, vocab_size=17, hidden_size=32, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, intermediate_size=48)
    return {**base, **extra}


def test_hf_sliding_window_configs_map_per_layer_and_back():
    from lcjax.interop.hf import decoder_to_hf_config, hf_to_decoder_config

    cases = [
        (_hf("mistral", sliding_window=5), 5),
        (_hf("mistral", sliding_window=None), None),
        (_hf("qwen2", use_sliding_window=True, sliding_window=6, max_window_layers=2),
         (None, None, 6, 6)),
        (_hf("qwen2", use_sliding_window=False, sliding_window=6), None),
        (_hf("qwen3", use_sliding_window=True, sliding_window=6,
             layer_types=["sliding_attention", "full_attention"] * 2), (6, None, 6, None)),
        (_hf("llama"), None),
    ]
    for hf, want in cases:
        config = hf_to_decoder_config(hf)
        assert config.sliding_window == want, hf
        back = hf_to_decoder_config(decoder_to_hf_config(config))
        assert back.sliding_window == want, hf
    assert config.layer_window(0) is None
    assert hf_to_decoder_config(cases[0][0]).layer_window(2) == (4, 0)
    with pytest.raises(ValueError, match="layer_types"):
        hf_to_decoder_config(_hf("qwen2", use_sliding_window=True, sliding_window=6,
                                 layer_types=["chunked_attention"] * 4))
    with pytest.raises(ValueError, match="sliding_window"):
        hf_to_decoder_config(_hf("mistral", sliding_window=0))
    with pytest.raises(ValueError, match="one sliding_window"):
        decoder_to_hf_config(_tiny(sliding_window=(3, 4)))
