"""AttentionSpec, Implementation and the registry: tokamax-style dispatch (fall through
on NotImplementedError, explicit implementations re-raise), option routing (never
silently dropped), config validation, the aux check, and the registry functions."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcjax import attention
from lcjax.attention import AttentionSpec, Features, Implementation
from lcjax.attention.base import validate_segment_ids, with_empty_aux
from lcjax.attention.core import dot_product_attention


def _qkv(t=6, s=6, h=2, hk=2, d=4, seed=0):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (jax.random.normal(kq, (1, t, h, d)), jax.random.normal(kk, (1, s, hk, d)),
            jax.random.normal(kv, (1, s, hk, d)))


@dataclasses.dataclass(frozen=True)
class FastConfig:
    block: int = 2

    def __post_init__(self):
        if self.block <= 0:
            raise ValueError(f"FastConfig: `block` must be positive, got {self.block}")


def _toy_spec(calls, *, fast_features=None, spec_features=None, fast_aux=None):
    """Two implementations of softmax attention that record which one ran:
    "fast" (config FastConfig; declines odd q_len) and "slow" (takes ``chunk``)."""

    def fast(q, k, v, *, causal, mask, scale, q_segment_ids, kv_segment_ids, return_aux,
             block=2):
        if q.shape[1] % 2:
            raise NotImplementedError("needs an even q_len")
        calls.append(("fast", block))
        out = dot_product_attention(q, k, v, causal=causal, mask=mask, scale=scale,
                                    q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
        return (out, fast_aux if fast_aux is not None else {"n": jnp.ones(())}) if return_aux \
            else out

    def slow(q, k, v, *, causal, mask, scale, q_segment_ids, kv_segment_ids, return_aux,
             chunk=1):
        calls.append(("slow", chunk))
        out = dot_product_attention(q, k, v, causal=causal, mask=mask, scale=scale,
                                    q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
        return (out, {"n": jnp.zeros(())}) if return_aux else out

    return AttentionSpec(
        "toy_dispatch", reference=dot_product_attention, features=spec_features or Features(),
        implementations=(Implementation("fast", fast, features=fast_features, config=FastConfig),
                         Implementation("slow", slow)),
        aux={"n": "[] float32"})


def test_none_tries_in_order_and_falls_through():
    calls = []
    spec = _toy_spec(calls)
    q, k, v = _qkv(t=6)
    np.testing.assert_allclose(spec(q, k, v), dot_product_attention(q, k, v), atol=1e-6)
    q5, k5, v5 = _qkv(t=5)
    np.testing.assert_allclose(spec(q5, k5, v5), dot_product_attention(q5, k5, v5), atol=1e-6)
    assert calls == [("fast", 2), ("slow", 1)]


def test_fall_through_happens_while_tracing():
    calls = []
    spec = _toy_spec(calls)
    q, k, v = _qkv(t=5)
    jax.jit(lambda q, k, v: spec(q, k, v, causal=True)).trace(q, k, v)  # no compilation
    assert calls == [("slow", 1)]


def test_skip_unless_named_passes_over_only_when_none_is_named():
    calls = []
    base = _toy_spec(calls)
    fast = dataclasses.replace(base.implementations[0], skip_unless_named=lambda: "on CPU")
    spec = dataclasses.replace(base, implementations=(fast, base.implementations[1]))
    q, k, v = _qkv(t=6)
    spec(q, k, v)
    spec(q, k, v, implementation="fast")
    assert calls == [("slow", 1), ("fast", 2)]


def test_explicit_implementation_reraises_its_reason():
    spec = _toy_spec([])
    q, k, v = _qkv(t=5)
    with pytest.raises(NotImplementedError, match="'fast' cannot serve.*even q_len"):
        spec(q, k, v, implementation="fast")
    with pytest.raises(ValueError, match=r"one of \('fast', 'slow'\), got 'pallas'"):
        spec(q, k, v, implementation="pallas")


def test_no_implementation_lists_every_reason():
    calls = []
    spec = _toy_spec(calls)
    q, k, v = _qkv(t=5)
    with pytest.raises(NotImplementedError, match=r"fast: needs an even q_len; slow: does not "
                                                  r"take option\(s\) \['block'\]"):
        spec(q, k, v, block=3)  # fast can't serve odd T; slow does not take `block`
    assert calls == []


def test_implementation_features_decline_and_spec_features_reject():
    calls = []
    spec = _toy_spec(calls, fast_features=Features(mask=False))
    q, k, v = _qkv(t=6)
    mask = jnp.tril(jnp.ones((6, 6), bool))
    spec(q, k, v, mask=mask)
    assert calls == [("slow", 1)]
    with pytest.raises(NotImplementedError, match="does not support mask"):
        spec(q, k, v, mask=mask, implementation="fast")
    no_mask = _toy_spec(calls, spec_features=Features(mask=False),
                        fast_features=Features(mask=False))
    with pytest.raises(ValueError, match="toy_dispatch: does not support mask"):
        no_mask(q, k, v, mask=mask)


def test_an_option_is_routed_never_dropped():
    calls = []
    spec = _toy_spec(calls)
    q, k, v = _qkv(t=6)
    spec(q, k, v, block=3)
    spec(q, k, v, chunk=4)  # fast would serve T=6 but does not take `chunk`
    assert calls == [("fast", 3), ("slow", 4)]
    with pytest.raises(NotImplementedError, match=r"does not take option\(s\) \['chunk'\]"):
        spec(q, k, v, chunk=4, implementation="fast")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['blok'\]"):
        spec(q, k, v, blok=3)


def test_config_is_validated_before_the_implementation_runs():
    calls = []
    spec = _toy_spec(calls)
    q, k, v = _qkv(t=6)
    with pytest.raises(ValueError, match="FastConfig: `block` must be positive"):
        jax.eval_shape(lambda q: spec(q, k, v, block=0), q)
    assert calls == []
    spec(q, k, v, config=FastConfig(block=5))
    assert calls == [("fast", 5)]
    with pytest.raises(NotImplementedError, match="`config` is a FastConfig"):
        spec(q, k, v, config=FastConfig(), implementation="slow")
    with pytest.raises(ValueError, match="both as keywords and in `config`"):
        spec(q, k, v, config=FastConfig(), block=3)


def test_aux_must_match_the_schema():
    spec = _toy_spec([], fast_aux={"n": jnp.ones(()), "extra": jnp.ones(())})
    q, k, v = _qkv(t=6)
    with pytest.raises(TypeError, match=r"returned aux keys \['extra', 'n'\]"):
        spec(q, k, v, return_aux=True)
    out, aux = spec(q, k, v, return_aux=True, implementation="slow")
    assert set(aux) == {"n"} and out.shape == q.shape


def test_declarations_are_checked():
    def fn(q, k, v, *, causal, mask, scale):  # no segment ids, no return_aux
        return q

    with pytest.raises(TypeError, match="must take the keywords"):
        Implementation("xla", fn)
    with pytest.raises(TypeError, match="dataclass type"):
        Implementation("xla", with_empty_aux(dot_product_attention), config=dict)
    impl = Implementation("xla", with_empty_aux(dot_product_attention), features=Features(lse=True))
    with pytest.raises(ValueError, match=r"declares features the spec lacks: \['lse'\]"):
        AttentionSpec("x", reference=dot_product_attention, implementations=(impl,))
    with pytest.raises(ValueError, match="duplicate"):
        AttentionSpec("x", reference=dot_product_attention, implementations=(impl, impl),
                      features=Features(lse=True))
    with pytest.raises(ValueError, match="at least one"):
        AttentionSpec("x", reference=dot_product_attention, implementations=())


def test_with_empty_aux_keeps_the_signature():
    wrapped = with_empty_aux(dot_product_attention)
    params = inspect.signature(wrapped).parameters
    assert {"return_aux", "return_lse", "q_offset", "causal"} <= set(params)
    q, k, v = _qkv()
    out, aux = wrapped(q, k, v, return_aux=True)
    assert aux == {}
    np.testing.assert_array_equal(out, dot_product_attention(q, k, v))


def test_reference_options_drop_implementation_only_options():
    spec = attention.spec("blockwise")
    assert spec.reference_options({"block_q": 8, "block_kv": 8, "q_offset": 2}) == {
        "q_offset": 2}


@pytest.mark.parametrize("q_ids, kv_ids, match", [
    (np.zeros((1, 6), np.int32), None, "both"),
    (np.zeros((1, 5), np.int32), np.zeros((1, 6), np.int32), r"`q_segment_ids` must have "
                                                             r"shape \[batch, len\] = \[1, 6\]"),
    (np.zeros((1, 6), np.int32), np.zeros((2, 6), np.int32), "`kv_segment_ids` must have"),
    (np.zeros((1, 6), np.float32), np.zeros((1, 6), np.int32), "must be integer"),
])
def test_segment_ids_are_validated(q_ids, kv_ids, match):
    q, k, _ = _qkv()
    with pytest.raises(ValueError, match=match):
        validate_segment_ids(q, k, q_ids, kv_ids, name="t")


def test_blockwise_config_validates():
    assert attention.BlockwiseConfig(8, 16).block_kv == 16
    for bad in (dict(block_q=0), dict(block_kv=-1), dict(block_q=2.0), dict(block_q=True)):
        with pytest.raises(ValueError, match="BlockwiseConfig"):
            attention.BlockwiseConfig(**bad)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="BlockwiseConfig: `block_q`"):
        attention.get("blockwise")(q, k, v, block_q=0)


def test_jax_anchor_is_jax_nn_without_a_mask_and_zero_on_empty_rows():
    q, k, v = _qkv(t=6, s=9, h=4, hk=2)
    np.testing.assert_array_equal(
        attention.get("jax")(q, k, v, causal=True),
        jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla"))
    mask = jnp.ones((1, 4, 6, 9), bool).at[:, 1, 2].set(False)
    out = attention.get("jax")(q, k, v, mask=mask)
    assert (out[0, 2, 1] == 0).all()
    np.testing.assert_allclose(out, dot_product_attention(q, k, v, mask=mask), atol=1e-6)


# ----------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------
def test_registry_holds_specs_and_get_returns_the_callable():
    names = attention.available()
    assert {"softmax", "blockwise", "jax"} <= set(names)
    assert [s.name for s in attention.specs()] == sorted(names)
    for name in names:
        assert attention.get(name) is attention.spec(name)
        assert isinstance(attention.spec(name), AttentionSpec)
    fn = lambda q, k, v, **kw: q
    assert attention.get(fn) is fn
    with pytest.raises(ValueError, match="unknown attention variant 'nope'; registered"):
        attention.get("nope")
    with pytest.raises(TypeError, match="expected an AttentionSpec"):
        attention.register(fn)


def test_register_and_unregister():
    spec = _toy_spec([])
    try:
        assert attention.register(spec) is spec
        assert attention.get("toy_dispatch") is spec and "toy_dispatch" in attention.available()
    finally:
        attention.unregister("toy_dispatch")
    assert "toy_dispatch" not in attention.available()
    attention.unregister("toy_dispatch")  # removing a missing name is a no-op


def test_builtin_specs_are_registered_order_free_and_declare_params_as_data():
    """One place lists the built-in specs; registering them in any order gives the same
    registry; their learnable parameters are LearnedParams (data), each with a factory in
    lcjax.nn (the attention layer names nothing above it)."""
    from lcjax.attention import builtin_specs
    from lcjax.nn.variant_params import FACTORIES, resolve_params_factory

    before = {s.name: s for s in attention.specs()}
    assert {s.name for s in attention.BUILTIN_SPECS} <= set(before)
    try:
        for s in reversed(attention.BUILTIN_SPECS):
            attention.register(s)
        assert {s.name: s for s in attention.specs()} == before
    finally:
        builtin_specs.register_builtins()
    kinds = [s.params.kind for s in attention.BUILTIN_SPECS if s.params is not None]
    assert all(isinstance(s.params, (type(None), attention.LearnedParams))
               for s in attention.BUILTIN_SPECS)
    assert set(kinds) == {"learnable_alpha", "asentmax_params", "ssmax_params",
                          "plash_prototypes"} and set(kinds) <= set(FACTORIES)
    assert resolve_params_factory(attention.LearnedParams("learnable_alpha")) is (
        FACTORIES["learnable_alpha"])
    with pytest.raises(ValueError, match="no parameter factory of kind 'nope'"):
        resolve_params_factory(attention.LearnedParams("nope"))


def test_spec_module_does_not_shadow_the_spec_function():
    import importlib

    base = importlib.import_module("lcjax.attention.base")
    assert callable(attention.spec) and attention.spec("softmax").name == "softmax"
    assert base.AttentionSpec is AttentionSpec


def test_config_passed_whole_to_an_fn_that_takes_it():
    """An implementation whose fn takes ``config`` (and none of the fields) gets the one
    config object, built from fields or given whole; a bad field value is the config's
    ValueError, an unknown option still declines."""
    seen = []

    def fn(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
           kv_segment_ids=None, return_aux=False, config=FastConfig()):
        seen.append(config)
        out = dot_product_attention(q, k, v, causal=causal, mask=mask, scale=scale)
        return (out, {}) if return_aux else out

    impl = Implementation("xla", fn, config=FastConfig)
    assert impl.config_whole and impl.options == frozenset({"block"})
    spec = AttentionSpec("whole", reference=dot_product_attention, implementations=(impl,))
    q, k, v = _qkv()
    np.testing.assert_allclose(spec(q, k, v, block=3), dot_product_attention(q, k, v))
    spec(q, k, v, config=FastConfig(block=5))
    spec(q, k, v)
    assert seen == [FastConfig(block=3), FastConfig(block=5), FastConfig()]
    with pytest.raises(ValueError):
        spec(q, k, v, block=0)
    with pytest.raises(ValueError, match="unknown option"):
        spec(q, k, v, nope=1)
