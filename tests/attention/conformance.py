"""The attention conformance suite: one base that runs for every registered spec and
every one of its implementations (see ``docs/attention.md``).

:class:`ConformanceSuite` is parametrised, when pytest collects it, over
``[(spec.name, impl.name) for spec in lcjax.attention.specs() for impl in
spec.implementations]`` (aliases, ``spec.alias_of``, under their method), so a variant
gets every check by registering its spec. A
subclass may set ``VARIANTS`` to a fixed list of (spec name, implementation name)
pairs, resolved when each test runs (a test that registers a toy spec in a fixture
runs the same checks on it).

For each (spec, implementation) and each call it makes, the expected outcome follows
from the declared features: a feature the spec lacks must raise ``ValueError``, one the
implementation lacks (but the spec has) ``NotImplementedError`` when the implementation
is named explicitly, and a declared one must agree with ``spec.reference`` (called with
the same options minus the implementation-only ones) within ``spec.tolerance`` /
``spec.grad_tolerance`` times max(1, max |reference|). Every call passes
``spec.test_options``.

Checks: forward (causal and not, cross lengths, GQA, explicit and broadcast masks,
segment ids with padding, ragged lengths that are not multiples of the test block
sizes, an explicit scale, ``return_lse``, a sliding window ``local_window_size`` causal and
not, an additive ``bias``); gradients w.r.t. q, k, v; ``jit``; ``vmap``
over an extra leading axis; ``jax.shard_map`` over heads and over batch on the 8 CPU
devices (forward and gradient); bf16 and fp16 (finite, close, dtype kept); rows with
nothing to attend to are exactly zero; bad shapes raise ``ValueError`` while tracing
(under ``jax.eval_shape``, so before any compilation); ``aux`` keys equal ``spec.aux``.
"""

from __future__ import annotations

import dataclasses
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from lcjax import attention

OK = "ok"


def cases() -> list[tuple[str, str]]:
    """Every registered (spec name, implementation name), in registry order; an alias
    (``spec.alias_of``: an old name of one implementation of another method) is checked
    under its method."""
    return [(s.name, i.name) for s in attention.specs() if s.alias_of is None
            for i in s.implementations]


# ----------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    """One call: sizes, masking and options. ``mask``: None, "random" ([B, H, T, S] with
    row 3 empty) or "broadcast" ([T, S]); ``segments``: packed segments with padding;
    ``window``: ``local_window_size`` (left, right); ``bias``: a random [1, H, T, S] bias."""

    name: str
    causal: bool
    q_len: int = 24
    kv_len: int = 24
    heads: int = 4
    kv_heads: int = 2
    batch: int = 2
    head_dim: int = 16
    mask: str | None = None
    segments: bool = False
    scale: float | None = None
    return_lse: bool = False
    dtype: str = "float32"
    window: tuple[int, int] | None = None
    bias: bool = False


FORWARD_CASES = {c.name: c for c in (
    Case("causal", causal=True, kv_heads=4),
    Case("ragged_causal", causal=True, q_len=27, kv_len=27),
    Case("ragged_cross", causal=False, q_len=21, kv_len=37, scale=0.3),
    Case("mask", causal=False, kv_len=40, mask="random"),
    Case("mask_broadcast_causal", causal=True, q_len=21, kv_len=21, mask="broadcast"),
    Case("segments", causal=True, segments=True),
    Case("segments_cross", causal=False, q_len=21, kv_len=37, segments=True),
    Case("lse", causal=True, q_len=21, kv_len=37, return_lse=True),
    Case("window_causal", causal=True, q_len=27, kv_len=27, window=(5, 2)),
    Case("window_cross", causal=False, q_len=21, kv_len=37, window=(4, 9)),
    Case("bias", causal=True, q_len=21, kv_len=21, bias=True),
)}
GRAD_CASES = ("ragged_causal", "mask", "segments_cross", "window_cross")


def _key(*names) -> jax.Array:
    return jax.random.PRNGKey(zlib.crc32("/".join(map(str, names)).encode()))


def _segments(batch: int, length: int, cuts: tuple[int, ...], pad: int) -> jax.Array:
    """int32 [batch, length]: segments 0, 1, ... split at ``cuts``, the last ``pad``
    positions -1 (padding); batch row b shifts the cuts by b."""
    rows = []
    for b in range(batch):
        ids = np.zeros(length, np.int32)
        for c in cuts:
            ids[min(c + b, length):] += 1
        ids[length - pad - b:] = -1
        rows.append(ids)
    return jnp.asarray(np.stack(rows))


def make_inputs(case: Case, seed: str = "") -> dict:
    """Random q [B, T, H, D], k, v [B, S, Hkv, D] (float32, then cast to ``case.dtype``),
    and the case's mask / segment ids / bias (None when unused)."""
    kq, kk, kv, km = jax.random.split(_key(case.name, seed), 4)
    bias = None
    if case.bias:
        bias = jax.random.normal(_key("bias", case.name, seed),
                                 (1, case.heads, case.q_len, case.kv_len))
    dtype = jnp.dtype(case.dtype)
    q = jax.random.normal(kq, (case.batch, case.q_len, case.heads, case.head_dim))
    k = jax.random.normal(kk, (case.batch, case.kv_len, case.kv_heads, case.head_dim))
    v = jax.random.normal(kv, (case.batch, case.kv_len, case.kv_heads, case.head_dim))
    mask = q_seg = kv_seg = None
    if case.mask == "random":
        mask = jax.random.bernoulli(km, 0.6, (case.batch, case.heads, case.q_len, case.kv_len))
        mask = mask.at[:, :, 3].set(False)
    elif case.mask == "broadcast":
        mask = jax.random.bernoulli(km, 0.7, (case.q_len, case.kv_len))
    if case.segments:
        q_seg = _segments(case.batch, case.q_len, (case.q_len // 3,), 3)
        kv_seg = _segments(case.batch, case.kv_len, (case.kv_len // 2,), 2)
    return dict(q=q.astype(dtype), k=k.astype(dtype), v=v.astype(dtype), mask=mask,
                q_segment_ids=q_seg, kv_segment_ids=kv_seg, bias=bias)


# ----------------------------------------------------------------------------
# Calls
# ----------------------------------------------------------------------------
def resolve(variant: tuple[str, str]):
    """(spec name, implementation name) -> (spec, implementation), looked up now."""
    name, impl_name = variant
    spec = attention.spec(name)
    return spec, spec.implementation(impl_name)


def expected(spec, impl, case: Case, **extra) -> str | type[Exception]:
    """OK, or the exception the call must raise, from the declared features."""
    inputs = make_inputs(dataclasses.replace(case, batch=1))
    args = dict(causal=case.causal, mask=inputs["mask"], q_segment_ids=inputs["q_segment_ids"],
                return_lse=case.return_lse or extra.get("return_lse", False),
                bias=inputs["bias"], local_window_size=case.window)
    q, k = inputs["q"], inputs["k"]
    if spec.features.unsupported(q, k, **args):
        return ValueError
    if spec.features_of(impl.name).unsupported(q, k, **args):
        return NotImplementedError
    return OK


def call_options(spec, case: Case, impl=None, **extra) -> dict:
    """Keyword arguments for a call of ``case`` (test options — for ``impl``, the ones it
    takes among config fields —, scale, return_lse)."""
    test_options = spec.test_options if impl is None else spec.options_for(impl.name,
                                                                            spec.test_options)
    options = {**test_options, **extra}
    if case.scale is not None:
        options["scale"] = case.scale
    if case.return_lse:
        options["return_lse"] = True
    if case.window is not None:
        options["local_window_size"] = case.window
    return options


def variant_fn(spec, impl, case: Case, **extra):
    """``(q, k, v, mask, q_segment_ids, kv_segment_ids) -> result`` of the implementation."""
    options = call_options(spec, case, impl, **extra)

    def fn(q, k, v, mask=None, q_segment_ids=None, kv_segment_ids=None, bias=None):
        more = {} if bias is None else {"bias": bias}
        return spec(q, k, v, causal=case.causal, mask=mask, q_segment_ids=q_segment_ids,
                    kv_segment_ids=kv_segment_ids, implementation=impl.name, **options, **more)

    return fn


def reference_fn(spec, case: Case, **extra):
    """Same signature as :func:`variant_fn`, computing ``spec.reference`` in float32."""
    options = spec.reference_options(call_options(spec, case, **extra))
    options.pop("return_aux", None)

    def fn(q, k, v, mask=None, q_segment_ids=None, kv_segment_ids=None, bias=None):
        up = lambda x: x.astype(jnp.promote_types(x.dtype, jnp.float32))
        more = {} if bias is None else {"bias": bias}
        return spec.reference(up(q), up(k), up(v), causal=case.causal, mask=mask,
                              q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                              **options, **more)

    return fn


_REFERENCE_CACHE: dict = {}
_REFERENCE_JIT: dict = {}


def cotangent(case: Case, seed: str = "") -> jax.Array:
    """Random float32 [B, T, H, D] output cotangent for gradient checks of ``case``."""
    return jax.random.normal(_key("cot", case.name, seed),
                             (case.batch, case.q_len, case.heads, case.head_dim))


def reference_result(spec, case: Case, seed: str = "", *, grads: bool = False, **extra):
    """``spec.reference`` on ``make_inputs(case, seed)``, or (``grads=True``) its
    gradients w.r.t. q, k, v of sum(out * cotangent(case, seed)); memoised per
    (reference, case, seed, options), so variants sharing a reference compute it once."""
    options = spec.reference_options(call_options(spec, case, **extra))
    key = (spec.reference, case, seed, grads,
           tuple(sorted((k, repr(v)) for k, v in options.items())))
    if key not in _REFERENCE_CACHE:
        inputs = make_inputs(case, seed)
        if grads:  # the forward comes from the same program: memoised too
            fn = reference_fn(spec, case, **extra)
            out, _REFERENCE_CACHE[key] = _result_and_grads(fn, inputs, cotangent(case, seed))
            _REFERENCE_CACHE.setdefault((*key[:3], False, key[4]), out)
        else:  # one jitted reference per (reference, case, options), whatever the seed:
            fn_key = (key[0], key[1], key[4])  # the vmap test's seeds compile it once
            if fn_key not in _REFERENCE_JIT:
                _REFERENCE_JIT[fn_key] = jax.jit(reference_fn(spec, case, **extra))
            _REFERENCE_CACHE[key] = _REFERENCE_JIT[fn_key](**inputs)
    return _REFERENCE_CACHE[key]


def _masking(inputs: dict) -> dict:
    return {key: inputs[key] for key in ("mask", "q_segment_ids", "kv_segment_ids", "bias")}


def assert_close(got, want, tol: float, what: str):
    """Every leaf of ``got`` equals ``want`` within ``tol * max(1, max |want|)``; NaN-free."""
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert g.shape == w.shape, f"{what}: shape {g.shape} != reference {w.shape}"
        assert not np.isnan(g).any(), f"{what}: NaN in result"
        finite = np.isfinite(w)
        np.testing.assert_array_equal(np.isfinite(g), finite, err_msg=f"{what}: infinities")
        scale = max(1.0, float(np.abs(w[finite]).max(initial=0.0)))
        np.testing.assert_allclose(np.where(finite, g, 0), np.where(finite, w, 0),
                                   atol=tol * scale, rtol=0, err_msg=what)


def _result_and_grads(fn, inputs, cot):
    """``fn``'s result and the gradients w.r.t. q, k, v of sum(out * cot) (``out``: the
    first result with ``return_lse``) from ONE jitted program (the gradient program
    computes the forward anyway: one compile instead of two)."""

    def loss(q, k, v, masking):
        res = fn(q, k, v, **masking)
        out = res[0] if isinstance(res, tuple) else res
        return jnp.sum(out.astype(jnp.float32) * cot), res

    both = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    (_, res), grads = both(inputs["q"], inputs["k"], inputs["v"], _masking(inputs))
    return res, grads


def _expect_raise(err, fn, *args, **kwargs):
    with pytest.raises(err):
        fn(*args, **kwargs)


def prepare_call(variant: tuple[str, str], case: Case):
    """(spec, impl, inputs, fn) of ``case`` for ``variant``, or None once the call has
    raised what the declared features say it must (a case outside them)."""
    spec, impl = resolve(variant)
    inputs = make_inputs(case)
    fn = variant_fn(spec, impl, case)
    outcome = expected(spec, impl, case)
    if outcome is not OK:
        _expect_raise(outcome, fn, **inputs)
        return None
    return spec, impl, inputs, fn


def _mesh(axis: str):
    assert jax.device_count() == 8, "tests/conftest.py must provide 8 CPU devices"
    return jax.make_mesh((8,), (axis,), axis_types=(AxisType.Explicit,))


def _shard_case(spec, impl, axis: str) -> Case:
    """The largest-feature case an implementation supports for sharding over ``axis``."""
    feats = spec.features_of(impl.name)
    causal = feats.causal
    gqa = feats.gqa
    if axis == "heads":
        return Case(f"shard_{axis}", causal=causal, heads=16 if gqa else 8, kv_heads=8,
                    batch=2)
    return Case(f"shard_{axis}", causal=causal, heads=4, kv_heads=2 if gqa else 4, batch=8,
                segments=feats.segment_ids)


# ----------------------------------------------------------------------------
# The suite
# ----------------------------------------------------------------------------
class ConformanceSuite:
    """Every check, for every (spec, implementation) in ``VARIANTS`` (None: all
    registered when pytest collects the suite)."""

    VARIANTS: list[tuple[str, str]] | None = None

    def pytest_generate_tests(self, metafunc):
        if "variant" in metafunc.fixturenames:
            pairs = list(self.VARIANTS) if self.VARIANTS is not None else cases()
            metafunc.parametrize("variant", pairs, ids=[f"{s}-{i}" for s, i in pairs])

    # -- forward -------------------------------------------------------------
    @staticmethod
    def _check_forward(spec, impl, case: Case, inputs: dict, got):
        """The forward checks of ``case``: close to the reference, dtype kept, lse shape."""
        want = reference_result(spec, case)
        assert_close(got, want, spec.tolerance["float32"], f"{spec.name}/{impl.name} {case}")
        out = got[0] if case.return_lse else got
        assert out.dtype == inputs["q"].dtype
        if case.return_lse:
            assert got[1].shape == (case.batch, case.q_len, case.heads)
            assert got[1].dtype == jnp.float32

    @pytest.mark.parametrize("case_name", [n for n in FORWARD_CASES if n not in GRAD_CASES])
    def test_forward_matches_reference(self, variant, case_name):
        """The forward of every case but GRAD_CASES (checked by the gradient test, from the
        program that gives their gradients)."""
        case = FORWARD_CASES[case_name]
        if (call := prepare_call(variant, case)) is None:
            return
        spec, impl, inputs, fn = call
        self._check_forward(spec, impl, case, inputs, jax.jit(fn)(**inputs))

    # -- gradients -----------------------------------------------------------
    @pytest.mark.parametrize("case_name", GRAD_CASES)
    def test_gradients_match_reference(self, variant, case_name):
        """Forward (the same checks as the forward test) and dq, dk, dv of the case, from
        one jitted program; a case outside the declared features must raise as there."""
        case = FORWARD_CASES[case_name]
        if (call := prepare_call(variant, case)) is None:
            return
        spec, impl, inputs, fn = call
        got, grads = _result_and_grads(fn, inputs, cotangent(case))
        want = reference_result(spec, case, grads=True)  # memoises the reference forward
        self._check_forward(spec, impl, case, inputs, got)
        for name, g, w in zip("qkv", grads, want):
            assert_close(g, w, spec.grad_tolerance["float32"],
                         f"{spec.name}/{impl.name} d{name} {case_name}")

    # -- transformations -----------------------------------------------------
    def test_jit_equals_eager(self, variant):
        spec, impl = resolve(variant)
        case = self._main_case(spec, impl)
        inputs = make_inputs(case, "jit")
        fn = variant_fn(spec, impl, case)
        eager = fn(**inputs)
        jitted = jax.jit(fn)(**inputs)
        assert_close(jitted, eager, spec.tolerance["float32"], f"{spec.name}/{impl.name} jit")
        assert_close(jitted, reference_result(spec, case, "jit"), spec.tolerance["float32"],
                     f"{spec.name}/{impl.name} jit vs reference")

    def test_vmap_over_leading_axis(self, variant):
        spec, impl = resolve(variant)
        case = self._main_case(spec, impl)
        stacked = [make_inputs(case, f"vmap{i}") for i in range(3)]
        q, k, v = (jnp.stack([s[n] for s in stacked]) for n in "qkv")
        got = jax.jit(jax.vmap(variant_fn(spec, impl, case)))(q, k, v)
        want = jnp.stack([reference_result(spec, case, f"vmap{i}") for i in range(3)])
        assert got.shape == (3, case.batch, case.q_len, case.heads, case.head_dim)
        assert_close(got, want, spec.tolerance["float32"], f"{spec.name}/{impl.name} vmap")

    @pytest.mark.parametrize("axis", ["heads", "batch"])
    def test_shard_map(self, variant, axis):
        """jax.shard_map over heads (q, k, v split on their head axis) or batch (q, k, v
        and segment ids split on batch), 8 CPU devices: forward and gradients."""
        spec, impl = resolve(variant)
        case = _shard_case(spec, impl, axis)
        inputs = make_inputs(case)
        mesh = _mesh(axis)
        qkv_spec = P(None, None, axis, None) if axis == "heads" else P(axis)
        seg_names = ("q_segment_ids", "kv_segment_ids") if case.segments else ()
        place = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))
        args = [place(inputs[n], qkv_spec) for n in "qkv"]
        args += [place(inputs[n], P(axis)) for n in seg_names]
        fn = variant_fn(spec, impl, case)
        body = lambda q, k, v, *segs: fn(q, k, v, None, *segs)
        sharded = jax.shard_map(body, mesh=mesh,
                                in_specs=(qkv_spec,) * 3 + (P(axis),) * len(seg_names),
                                out_specs=qkv_spec, check_vma=impl.shard_map_check_vma)
        what = f"{spec.name}/{impl.name} shard_map over {axis}"
        cot = cotangent(case)

        def loss(q, k, v, *segs):  # forward and gradients in one jitted program
            out = sharded(q, k, v, *segs)
            return jnp.sum(out.astype(jnp.float32) * cot), out

        (_, got), g_got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2),
                                                     has_aux=True))(*args)
        assert_close(got, reference_result(spec, case), spec.tolerance["float32"], what)
        g_want = reference_result(spec, case, grads=True)
        for name, g, w in zip("qkv", g_got, g_want):
            assert_close(g, w, spec.grad_tolerance["float32"], f"d{name} {what}")

    # -- dtypes --------------------------------------------------------------
    @pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
    def test_low_precision(self, variant, dtype):
        """16-bit inputs: output keeps the dtype, is finite, and is close to the float32
        reference on the same (rounded) inputs; gradients are finite."""
        case = dataclasses.replace(self._main_case(*resolve(variant)), dtype=dtype)
        if (call := prepare_call(variant, case)) is None:
            return
        spec, impl, inputs, fn = call
        got, grads = _result_and_grads(fn, inputs, cotangent(case))
        assert got.dtype == jnp.dtype(dtype)
        assert_close(got, reference_result(spec, case), spec.tolerance[dtype],
                     f"{spec.name}/{impl.name} {dtype}")
        for name, g in zip("qkv", grads):
            assert g.dtype == jnp.dtype(dtype), f"d{name} dtype {g.dtype}"
            assert np.isfinite(np.asarray(g, np.float32)).all(), f"d{name} not finite ({dtype})"

    # -- contract details ----------------------------------------------------
    def test_empty_rows_are_exactly_zero(self, variant):
        """Rows that see no key (an all-False mask row; padded query segments) are
        exactly zero, other rows finite, gradients finite."""
        spec, impl = resolve(variant)
        feats = spec.features_of(impl.name)
        if not (feats.mask or feats.segment_ids):
            pytest.skip("without masks or segment ids no row can be empty")
        case = Case("empty", causal=feats.causal, kv_len=40,
                    kv_heads=2 if feats.gqa else 4, mask="random" if feats.mask else None,
                    segments=feats.segment_ids)
        if not feats.cross:
            case = dataclasses.replace(case, kv_len=case.q_len)
        inputs = make_inputs(case)
        if feats.mask:  # row 5 sees keys only above the diagonal in causal calls
            inputs["mask"] = inputs["mask"].at[:, :, 5, :6].set(False)
        fn = variant_fn(spec, impl, case)
        out, grads = _result_and_grads(fn, inputs, cotangent(case))
        out = np.asarray(out)
        visible = attention.build_mask(case.q_len, case.kv_len, causal=case.causal,
                                       mask=inputs["mask"], q_segment_ids=inputs["q_segment_ids"],
                                       kv_segment_ids=inputs["kv_segment_ids"])
        empty = ~np.broadcast_to(np.asarray(visible).any(-1),
                                 (case.batch, case.heads, case.q_len)).transpose(0, 2, 1)
        assert empty.any() and not empty.all()
        assert (out[empty] == 0).all(), "rows with no visible key must be exactly zero"
        assert np.isfinite(out).all()
        for name, g in zip("qkv", grads):
            assert np.isfinite(np.asarray(g)).all(), f"d{name} not finite with empty rows"

    def test_aux_keys_equal_spec(self, variant):
        """``return_aux=True`` -> (result, aux) with exactly ``spec.aux``'s keys (under
        jit; the eager call is the jit test's); the result matches the reference."""
        spec, impl = resolve(variant)
        case = self._main_case(spec, impl)
        inputs = make_inputs(case, "jit")
        out, aux = jax.jit(variant_fn(spec, impl, case, return_aux=True))(**inputs)
        assert set(aux) == set(spec.aux), (sorted(aux), sorted(spec.aux))
        assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(aux))
        assert_close(out, reference_result(spec, case, "jit"), spec.tolerance["float32"],
                     f"{spec.name}/{impl.name} output with return_aux")

    BAD_SHAPES = {
        "q_rank": (dict(q=(2, 24, 4)), "`q`"),
        "k_v_len": (dict(v=(2, 20, 2, 16)), "`k` and `v`"),
        "heads": (dict(k=(2, 24, 3, 16), v=(2, 24, 3, 16)), "heads"),
        "batch": (dict(k=(3, 24, 2, 16), v=(3, 24, 2, 16)), "batch"),
        "head_dim": (dict(k=(2, 24, 2, 8), v=(2, 24, 2, 8)), "head_dim"),
        "mask_shape": (dict(mask=(2, 4, 24, 23)), "`mask`"),
        "mask_dtype": (dict(mask_dtype=jnp.float32), "`mask`"),
        "segment_shape": (dict(q_segment_ids=(2, 23)), "`q_segment_ids`"),
        "segment_alone": (dict(only_q_segments=True), "segment"),
        "integer_q": (dict(q_dtype=jnp.int32), "`q`"),
    }

    @pytest.mark.parametrize("bad", list(BAD_SHAPES))
    def test_bad_input_raises_value_error_before_compiling(self, variant, bad):
        """Bad shapes raise ValueError naming the argument, while tracing under
        ``jax.eval_shape`` (so before any compilation)."""
        spec, impl = resolve(variant)
        change, match = self.BAD_SHAPES[bad]
        shapes = dict(q=(2, 24, 4, 16), k=(2, 24, 2, 16), v=(2, 24, 2, 16), mask=None,
                      q_segment_ids=None)
        shapes.update({n: s for n, s in change.items() if n in shapes})
        q_dtype = change.get("q_dtype", jnp.float32)
        arrays = {n: jax.ShapeDtypeStruct(shapes[n], q_dtype if n == "q" else jnp.float32)
                  for n in "qkv"}
        if shapes["mask"] is not None or "mask_dtype" in change:
            arrays["mask"] = jax.ShapeDtypeStruct(shapes["mask"] or (24, 24),
                                                  change.get("mask_dtype", jnp.bool_))
        if shapes["q_segment_ids"] is not None or change.get("only_q_segments"):
            arrays["q_segment_ids"] = jax.ShapeDtypeStruct(shapes["q_segment_ids"] or (2, 24),
                                                           jnp.int32)
            if not change.get("only_q_segments"):
                arrays["kv_segment_ids"] = jax.ShapeDtypeStruct((2, 24), jnp.int32)
        fn = variant_fn(spec, impl, Case("bad", causal=spec.features.causal))
        with pytest.raises(ValueError, match=match):
            jax.eval_shape(fn, **arrays)

    def test_unknown_implementation_or_option_raises(self, variant):
        spec, impl = resolve(variant)
        q, k, v = (make_inputs(FORWARD_CASES["causal"])[n] for n in "qkv")
        with pytest.raises(ValueError, match="implementation"):
            spec(q, k, v, implementation="no-such-implementation")
        with pytest.raises(ValueError, match="no_such_option"):
            spec(q, k, v, implementation=impl.name, no_such_option=1)

    # -- helpers -------------------------------------------------------------
    @staticmethod
    def _main_case(spec, impl) -> Case:
        """A GQA call with cross lengths, causal where declared, within the features."""
        feats = spec.features_of(impl.name)
        return Case("main", causal=feats.causal, q_len=21 if feats.cross else 24,
                    kv_len=37 if feats.cross else 24, kv_heads=2 if feats.gqa else 4)


__all__ = ["FORWARD_CASES", "GRAD_CASES", "Case", "ConformanceSuite", "cases", "make_inputs",
           "reference_fn", "reference_result", "cotangent", "resolve", "variant_fn", "expected",
           "assert_close", "prepare_call"]
