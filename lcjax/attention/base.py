"""Attention specs: one declaration per method, and tokamax-style dispatch.

Every attention method in lcjax declares one :class:`AttentionSpec` (see
``docs/attention.md``):

- ``reference``: a slow, exact function computing what the method computes (the
  conformance suite, ``tests/attention/conformance.py``, compares every implementation
  with it);
- ``implementations``: :class:`Implementation` objects in preference order (e.g. a
  Pallas kernel first, then the XLA path), each owning its ``config`` dataclass;
- ``features``: what the method supports (:class:`Features`);
- ``aux``: the documented schema of the ``aux`` dict returned with ``return_aux=True``,
  the same keys for every implementation;
- ``params``: optionally, the variant's learnable parameters for ``lcjax.nn.Attention``
  (a learnable α, prototypes, gates, ...): a :class:`LearnedParams` declaration, which
  ``lcjax.nn`` turns into a module, or a factory callable.

Calling a spec is calling the method under the attention contract::

    out = spec(q, k, v, *, causal=False, mask=None, scale=None, implementation=None,
               q_segment_ids=None, kv_segment_ids=None, return_aux=False,
               bias=None, local_window_size=None, is_causal=None, **options)
    q: [B, T, H, D]; k: [B, S, Hkv, D]; v: [B, S, Hkv, Dv]  ->  out: [B, T, H, Dv]

``is_causal``, ``bias`` and ``local_window_size`` are those of
``jax.nn.dot_product_attention``: ``is_causal`` is another name of ``causal``; ``bias``
(float, broadcastable to [B, H, T, S]) is added to the scaled scores; ``local_window_size``
(int w = (w, w), or (left, right)) lets query i see keys j with i - left <= j <= i + right
(and j <= i with ``causal``). ``bias`` and ``local_window_size`` reach an implementation only
when given (normalised: the window as a (left, right) tuple), and only one whose features
declare them (``Features.bias`` / ``Features.window``).

With ``return_aux=True`` the result is ``(result, aux)``, where ``result`` is what the
call returns without it (``out``, or ``(out, lse)`` with ``return_lse=True``) and
``aux`` a dict with exactly the keys of ``spec.aux``.

Dispatch follows openxla/tokamax (``_src/ops/attention/api.py``): with
``implementation=None`` the implementations are tried in order, and one that cannot
serve the call raises :class:`NotImplementedError` (with the reason) *before* any
computation, so the next one is tried; an explicit ``implementation=`` that cannot
serve re-raises its reason. Before any implementation runs, the call is checked once
here: shapes (``ValueError`` naming the argument and the shapes), the features the
spec supports (``ValueError``), and option names (an option that no implementation
takes is a ``ValueError``; one that the tried implementation does not take makes it
decline with ``NotImplementedError``, so an option is never silently dropped).

Dispatch follows the *target*, not the host. A call that may reach a target-dependent
implementation (``Implementation.per_target``; by default the one named ``"pallas"``) is
traced once per target — ``"tpu"``, ``"gpu"``, ``"cpu"`` (:func:`lowering_target`) — and
``lax.platform_dependent`` keeps the branch of the platform the computation is lowered for
(the devices of the arguments' shardings: a TPU topology from ``lcjax.aot`` on a CPU host
gets the TPU branch). Per target:

- TPU / GPU: ``implementation=None`` tries the implementations in order, so the Pallas
  kernel, compiled (Mosaic on TPU, Triton on GPU), serves when it can, else the XLA path;
  ``implementation="pallas"`` runs the compiled kernel (``interpret=None``).
- CPU: ``implementation=None`` passes the Pallas implementation over (its interpreter is
  for tests) and the XLA path serves; ``implementation="pallas"`` runs the kernel in the
  Pallas interpreter (``interpret=None`` means "interpret exactly when lowering for CPU").

A target whose trace raises while another's serves gets a branch that raises the same
exception when, and only when, the computation is lowered for it (block sizes only the
interpreter takes work on CPU and fail when compiling for TPU — before compilation); when
every target raises, the call raises at once. Called eagerly (no ``jit``), only the
default device's target is traced. A call with no target-dependent implementation is
traced once, as before.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir
from jaxtyping import Array, Bool, Float, Int

from lcjax.attention.core import validate_bias, validate_qkv, window_size

__all__ = [
    "ALL_DTYPES",
    "CONTRACT_ARGS",
    "AttentionSpec",
    "Features",
    "LearnedParams",
    "Implementation",
    "keyword_names",
    "validate_segment_ids",
    "TARGETS",
    "lowering_target",
    "on_accelerator",
    "pallas_skip_on_cpu",
    "per_target",
    "resolve_kernel",
    "with_empty_aux",
]

ALL_DTYPES = ("float32", "bfloat16", "float16", "float64")
# Keywords the dispatcher passes to every implementation (besides q, k, v and options).
CONTRACT_ARGS = ("causal", "mask", "scale", "q_segment_ids", "kv_segment_ids", "return_aux")


@dataclasses.dataclass(frozen=True)
class Features:
    """What a method (or one implementation of it) supports.

    causal / non_causal: ``causal=True`` / ``causal=False`` calls.
    mask: an explicit boolean ``mask``.  segment_ids: ``q_segment_ids`` / ``kv_segment_ids``.
    gqa: kv_heads < heads.  cross: kv_len != q_len.
    lse: ``return_lse=True`` (log-sum-exp [B, T, H] float32 as a second result).
    bias: an additive ``bias`` broadcastable to [B, H, T, S] (``jax.nn`` semantics).
    window: a sliding window ``local_window_size`` (``jax.nn`` semantics).
    dtypes: input dtypes accepted (names, as ``jnp.dtype(x).name``).
    """

    causal: bool = True
    non_causal: bool = True
    mask: bool = True
    segment_ids: bool = True
    gqa: bool = True
    cross: bool = True
    lse: bool = False
    bias: bool = False
    window: bool = False
    dtypes: tuple[str, ...] = ALL_DTYPES

    def unsupported(self, q, k, *, causal, mask, q_segment_ids, return_lse, bias=None,
                    local_window_size=None) -> list[str]:
        """Names of the features a call uses that these features do not cover."""
        uses = (
            ("causal=True", bool(causal) and not self.causal),
            ("causal=False", not causal and not self.non_causal),
            ("mask", mask is not None and not self.mask),
            ("q_segment_ids/kv_segment_ids", q_segment_ids is not None and not self.segment_ids),
            ("grouped-query attention (kv_heads < heads)", k.shape[2] != q.shape[2]
             and not self.gqa),
            ("kv_len != q_len", k.shape[1] != q.shape[1] and not self.cross),
            ("return_lse", bool(return_lse) and not self.lse),
            ("bias", bias is not None and not self.bias),
            ("local_window_size", local_window_size is not None and not self.window),
            (f"dtype {jnp.dtype(q.dtype).name}", jnp.dtype(q.dtype).name not in self.dtypes),
        )
        return [what for what, bad in uses if bad]

    def exceeds(self, other: Features) -> list[str]:
        """Features supported here but not by ``other`` (an implementation may not
        support more than its spec)."""
        flags = [f.name for f in dataclasses.fields(self)
                 if f.name != "dtypes" and getattr(self, f.name) and not getattr(other, f.name)]
        return flags + [f"dtype {d}" for d in self.dtypes if d not in other.dtypes]


def keyword_names(fn: Callable) -> frozenset[str] | None:
    """Keyword parameter names of ``fn`` (None when it takes ``**kwargs``, i.e. any)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params
                     if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def with_empty_aux(fn: Callable) -> Callable:
    """Adapter for a function without an aux dict: ``return_aux=True`` gives
    ``(result, {})``. The adapter's signature is ``fn``'s plus ``return_aux``, so the
    dispatcher still sees which options ``fn`` takes."""

    @functools.wraps(fn)
    def impl(*args, return_aux: bool = False, **kwargs):
        out = fn(*args, **kwargs)
        return (out, {}) if return_aux else out

    sig = inspect.signature(fn)
    extra = inspect.Parameter("return_aux", inspect.Parameter.KEYWORD_ONLY, default=False)
    params = list(sig.parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        params.insert(len(params) - 1, extra)
    else:
        params.append(extra)
    impl.__signature__ = sig.replace(parameters=params)
    del impl.__wrapped__  # inspect.signature must read __signature__, not fn's
    return impl


def on_accelerator() -> bool:
    """Whether JAX's default backend is a GPU or TPU (where Pallas kernels compile)."""
    return jax.default_backend() in ("gpu", "cuda", "rocm", "tpu")


# The lowering target a dispatched call is being traced for ("tpu", "gpu": Pallas kernels
# compile; "cpu": only the Pallas interpreter runs them); None outside the per-target
# branches of :func:`per_target`.
_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("lcjax_target",
                                                                    default=None)
TARGETS = ("tpu", "gpu", "cpu")
_BACKEND_TARGET = {"tpu": "tpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu"}


def lowering_target() -> str:
    """``"tpu"``, ``"gpu"`` or ``"cpu"``: the target the call being traced is for.

    Inside a spec call that has a target-dependent implementation this is the branch of
    ``lax.platform_dependent`` being traced (so it follows the devices the computation is
    lowered for, e.g. a TPU topology from a CPU host); elsewhere (a kernel function
    called directly) it is JAX's default backend."""
    target = _TARGET.get()
    if target is not None:
        return target
    return _BACKEND_TARGET.get(jax.default_backend(), "cpu")


def pallas_skip_on_cpu() -> str | None:
    """The ``skip_unless_named`` rule of every Pallas implementation: for a CPU target a
    kernel runs only in the Pallas interpreter (for tests, ``implementation="pallas"``), so
    ``implementation=None`` passes it over; for a GPU or TPU target it may serve (None)."""
    if lowering_target() == "cpu":
        return ("CPU target: on CPU the kernel runs only in the Pallas interpreter, for "
                "tests (implementation='pallas')")
    return None


def resolve_kernel(module: str, interpret: bool | None):
    """``(kernel module, interpret flag)`` for a Pallas implementation: ``interpret=None``
    means interpret mode exactly when the lowering target is a CPU
    (:func:`lowering_target`); ``NotImplementedError`` (so dispatch falls through) when the
    kernel cannot run — a CPU target and ``interpret=False``, or the kernel module
    missing."""
    on_accel = lowering_target() != "cpu"
    interpret = (not on_accel) if interpret is None else bool(interpret)
    if not (on_accel or interpret):
        raise NotImplementedError("needs a GPU or TPU target (or interpret=True)")
    if importlib.util.find_spec(module) is None:
        raise NotImplementedError(f"needs the kernel module {module}")
    return importlib.import_module(module), interpret


# An identity whose lowering raises: what a per-target branch returns when the call cannot
# be served for that target but can for another (see :func:`per_target`). The error then
# surfaces when, and only when, the computation is lowered for that target.
_unservable_p = jex_core.Primitive("lcjax_unservable")
_unservable_p.multiple_results = True
_unservable_p.def_abstract_eval(lambda *avals, error, target: list(avals))


def _unservable_impl(*args, error, target):
    raise error


def _unservable_lowering(ctx, *args, error, target):
    raise error


def _unservable_jvp(primals, tangents, **params):
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return _unservable_p.bind(*primals, **params), _unservable_p.bind(*tangents, **params)


def _unservable_transpose(cts, *args, **params):
    return _unservable_p.bind(*[ad.instantiate_zeros(c) for c in cts], **params)


_unservable_p.def_impl(_unservable_impl)
mlir.register_lowering(_unservable_p, _unservable_lowering)
ad.primitive_jvps[_unservable_p] = _unservable_jvp
ad.primitive_transposes[_unservable_p] = _unservable_transpose
batching.primitive_batchers[_unservable_p] = (
    lambda args, dims, **params: (_unservable_p.bind(*args, **params), dims))


def _lowering_is_deferred() -> bool:
    """Whether a ``lax.platform_dependent`` here is staged out (under ``jit``/a trace),
    i.e. its branch is chosen at lowering rather than now."""
    probe = lax.platform_dependent(default=lambda: jnp.int32(0))
    return isinstance(probe, jax.core.Tracer)


def per_target(fn: Callable, *args):
    """``fn(*args)`` traced once per target of :data:`TARGETS` (with
    :func:`lowering_target` giving it) and chosen when lowering, by
    ``lax.platform_dependent``: the ``"tpu"`` trace for TPU, the ``"gpu"`` trace for CUDA
    and ROCm, the ``"cpu"`` trace for every other platform. Only the chosen branch is
    lowered.

    A target whose trace raises while another's succeeds gets a branch that raises the
    same exception when lowered for it (an explicit ``implementation="pallas"`` with block
    sizes only the interpreter takes still runs on CPU, and fails when compiled for a TPU,
    before compilation); when every trace raises, the error of the first target is
    raised now. Called eagerly, only the default device's target is traced and its error
    raised at once."""

    def branch(target: str) -> Callable:
        def run(*a):
            token = _TARGET.set(target)
            try:
                return fn(*a)
            except Exception as err:  # deferred to this target's lowering, or re-raised
                if not _lowering_is_deferred():
                    raise
                shaped = _first_served(fn, a, [t for t in TARGETS if t != target])
                if shaped is None:
                    raise
                err.add_note(f"(traced for a {target} target; raised when lowering for it)")
                leaves, tree = jax.tree_util.tree_flatten(shaped)
                return jax.tree_util.tree_unflatten(
                    tree, _unservable_p.bind(*leaves, error=err, target=target))
            finally:
                _TARGET.reset(token)
        return run

    gpu = branch("gpu")
    return lax.platform_dependent(*args, tpu=branch("tpu"), cuda=gpu, rocm=gpu,
                                  default=branch("cpu"))


def _first_served(fn: Callable, args, targets):
    """``fn(*args)`` traced for the first of ``targets`` it serves (None: none)."""
    for target in targets:
        _TARGET.set(target)
        try:
            return fn(*args)
        except Exception:  # noqa: S112 - this target cannot serve either; try the next
            continue
    return None


def _causal_alias(causal, is_causal, *, name: str) -> bool:
    """``causal`` or ``is_causal`` (``jax.nn.dot_product_attention``'s name), whichever is
    given (neither: False); ``ValueError`` when both are given and differ."""
    if is_causal is None:
        return bool(causal)
    if causal is not None and bool(causal) != bool(is_causal):
        raise ValueError(f"{name}: `causal={causal!r}` and `is_causal={is_causal!r}` differ; "
                         f"pass one of them")
    return bool(is_causal)


def _given(**kwargs) -> dict:
    """The keyword arguments that are not None."""
    return {key: val for key, val in kwargs.items() if val is not None}


def validate_segment_ids(q, k, q_segment_ids, kv_segment_ids, *, name: str) -> None:
    """Segment ids must come together, be integer, and have shapes [B, T] and [B, S]."""
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError(f"{name}: pass both `q_segment_ids` and `kv_segment_ids` or neither")
    if q_segment_ids is None:
        return
    for arg, ids, of, x in (("q_segment_ids", q_segment_ids, "q", q),
                            ("kv_segment_ids", kv_segment_ids, "k", k)):
        shape = tuple(jnp.shape(ids))
        if shape != tuple(x.shape[:2]):
            raise ValueError(f"{name}: `{arg}` must have shape [batch, len] = "
                             f"{list(x.shape[:2])} (from {of} {x.shape}), got {list(shape)}")
        if not jnp.issubdtype(jnp.result_type(ids), jnp.integer):
            raise ValueError(f"{name}: `{arg}` must be integer, got dtype {jnp.result_type(ids)}")


@dataclasses.dataclass(frozen=True, eq=False)
class Implementation:
    """One way to compute a method.

    ``fn(q, k, v, *, causal, mask, scale, q_segment_ids, kv_segment_ids, return_aux,
    **options)`` computes the method; it raises ``NotImplementedError(reason)`` before
    any computation when it cannot serve the call (a platform, an option value, a
    traced argument it needs static). ``features`` default to the spec's.

    ``config``: the frozen dataclass of this implementation's settings (block sizes,
    ...), whose ``__post_init__`` validates them. A call may pass its fields one by one or
    as ``config=Config(...)``; they are validated by building the config before ``fn``
    runs. ``fn`` takes either the fields as keywords, or (when it has a ``config`` keyword
    and none of the fields) the one config object, whole: ``fn(..., config=Config(...))``.

    ``check_vma``: whether ``fn`` type-checks under ``jax.shard_map`` with the default
    ``check_vma=True``. None means "unless the implementation is named ``"pallas"``":
    a ``pallas_call`` is accepted by ``shard_map`` only with ``check_vma=False``.

    ``skip_unless_named``: optional ``() -> reason or None``, asked only when the call
    names no implementation; a reason makes dispatch pass this one over (e.g. a Pallas
    kernel on CPU, where only its interpreter runs it: for tests, when named).

    ``per_target``: whether ``fn`` (or its ``skip_unless_named``) depends on the lowering
    target (:func:`lowering_target`: compiled kernels for TPU/GPU, the interpreter for
    CPU). None means "when named ``"pallas"``". A call that may reach such an
    implementation is traced once per target and the branch chosen when lowering
    (:func:`per_target`).
    """

    name: str
    fn: Callable[..., Any]
    features: Features | None = None
    config: type | None = None
    check_vma: bool | None = None
    skip_unless_named: Callable[[], str | None] | None = None
    per_target: bool | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Implementation: `name` must be a non-empty string, "
                             f"got {self.name!r}")
        if not callable(self.fn):
            raise TypeError(f"Implementation {self.name!r}: `fn` must be callable")
        if self.config is not None and not (isinstance(self.config, type)
                                            and dataclasses.is_dataclass(self.config)):
            raise TypeError(f"Implementation {self.name!r}: `config` must be a dataclass "
                            f"type, got {self.config!r}")
        names = keyword_names(self.fn)
        if names is not None:
            wanted = ("config",) if self.config_whole else self.config_fields
            missing = [a for a in CONTRACT_ARGS + wanted if a not in names]
            if missing:
                raise TypeError(f"Implementation {self.name!r}: `fn` must take the keywords "
                                f"{missing} (the contract and its config fields)")

    @property
    def config_fields(self) -> tuple[str, ...]:
        """Names of the options that form this implementation's config."""
        if self.config is None:
            return ()
        return tuple(f.name for f in dataclasses.fields(self.config))

    @property
    def config_whole(self) -> bool:
        """Whether ``fn`` takes the config object as ``config=`` (not its fields)."""
        names = keyword_names(self.fn)
        return (self.config is not None and names is not None and "config" in names
                and not any(f in names for f in self.config_fields))

    @property
    def options(self) -> frozenset[str] | None:
        """Keyword options ``fn`` takes beyond the contract (None: any); for ``fn`` taking
        the config whole, the config's fields (not ``config``, which every config takes)."""
        names = keyword_names(self.fn)
        if names is None:
            return None
        names = names - frozenset(CONTRACT_ARGS) - {"q", "k", "v"}
        if self.config_whole:
            names = (names - {"config"}) | frozenset(self.config_fields)
        return names

    @property
    def target_dependent(self) -> bool:
        """Whether calls of this implementation are traced per lowering target."""
        return self.name == "pallas" if self.per_target is None else bool(self.per_target)

    @property
    def shard_map_check_vma(self) -> bool:
        """``check_vma`` to pass to ``jax.shard_map`` around this implementation."""
        return self.name != "pallas" if self.check_vma is None else self.check_vma

    def takes(self, option: str) -> bool:
        """Whether ``option`` is one of this implementation's options."""
        if option == "config":
            return self.config is not None
        return self.options is None or option in self.options

    def prepare(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword options for ``fn``: raise ``NotImplementedError`` for options this
        implementation does not take, expand ``config=``, and validate config fields
        (the config's ``ValueError``)."""
        options = dict(options)
        config = options.pop("config", None)
        if config is not None:
            if self.config is None or not isinstance(config, self.config):
                want = self.config.__name__ if self.config else "no config"
                raise NotImplementedError(f"`config` is a {type(config).__name__}; this "
                                          f"implementation takes {want}")
            fields = dataclasses.asdict(config)
            both = sorted(set(fields) & set(options))
            if both:
                raise ValueError(f"options {both} given both as keywords and in `config`")
            options.update(fields)
        foreign = sorted(o for o in options if not self.takes(o))
        if foreign:
            raise NotImplementedError(f"does not take option(s) {foreign}")
        if self.config is not None:
            config = self.config(**{f: options[f] for f in self.config_fields if f in options})
            if self.config_whole:
                options = {key: val for key, val in options.items()
                           if key not in self.config_fields}
                options["config"] = config
        return options


@dataclasses.dataclass(frozen=True)
class LearnedParams:
    """A spec's declaration of learnable parameters, as data: ``lcjax.nn`` builds them.

    ``kind`` names the parameter module ``lcjax.nn.variant_params.build_variant_params``
    builds (``"learnable_alpha"``: entmax's α per head; ``"asentmax_params"``: ASEntmax's
    β, γ (and α); ``"ssmax_params"``: SSMax's s per head; ``"plash_prototypes"``: PLASH's
    prototypes [Hkv, M, D]). The attention layer names what to learn; it never imports
    ``lcjax.nn`` (which sits above it), not even through a string.
    """

    kind: str

    def __post_init__(self):
        if not isinstance(self.kind, str) or not self.kind:
            raise ValueError(f"LearnedParams: `kind` must be a non-empty string, "
                             f"got {self.kind!r}")

    @property
    def __name__(self) -> str:  # the name feature tables show for a spec's parameters
        return self.kind


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionSpec:
    """The declaration of one attention method (see the module docstring).

    ``aux``: key -> description (shape and dtype) of the ``aux`` dict; every
    implementation returns exactly these keys with ``return_aux=True``.
    ``test_options``: keyword options the conformance suite and the device check's
    correctness rows pass on every call (e.g. small block sizes so tiny shapes exercise
    several blocks); a config field goes only to the implementations that take it
    (:meth:`options_for`). ``benchmark_options``: the options timed runs at long lengths
    pass (``experiments/gpu_check.py``); empty means each implementation's own defaults.
    ``tolerance`` / ``grad_tolerance``: absolute forward / gradient tolerance against
    ``reference`` per dtype name (scaled by max(1, max |reference|)).
    ``params``: the variant's learnable parameters: a :class:`LearnedParams` declaration
    (built-in specs use these: the factory lives in ``lcjax.nn.variant_params``), or a
    factory ``params(config, *, rngs) -> nnx.Module | None`` (or, for a user's spec,
    ``"package.module:attr"`` naming one, imported on first use).
    ``lcjax.nn.Attention`` calls the factory once per layer with a ``lcjax.nn.VariantConfig``
    (sizes, dtypes, static options, ``learn``: the names the user asked to learn) and
    keeps the module; on every call the module gets ``x=, q=, k=, v=, positions=`` as
    keywords and returns a dict of keyword options for the variant, overriding static
    options of the same name (entmax: ``{"alpha": α [H]}``). The full protocol is in
    ``lcjax.nn.variant_params``.
    ``alias_of``: ``(method, implementation)`` for a spec that is an old name of one
    implementation of another method (:meth:`alias`); the conformance suite runs that
    implementation under its method, not again under the alias.
    """

    name: str
    reference: Callable[..., Any]
    implementations: tuple[Implementation, ...]
    features: Features = Features()
    aux: Mapping[str, str] = dataclasses.field(default_factory=dict)
    params: LearnedParams | Callable[..., Any] | str | None = None
    test_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    benchmark_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tolerance: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: {"float64": 1e-10, "float32": 2e-5, "bfloat16": 3e-2,
                                 "float16": 3e-3})
    description: str = ""
    grad_tolerance: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: {"float64": 1e-9, "float32": 1e-4, "bfloat16": 1e-1,
                                 "float16": 1e-2})
    alias_of: tuple[str, str] | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"AttentionSpec: `name` must be a non-empty string, "
                             f"got {self.name!r}")
        object.__setattr__(self, "implementations", tuple(self.implementations))
        if not self.implementations:
            raise ValueError(f"AttentionSpec {self.name!r}: needs at least one implementation")
        if not all(isinstance(i, Implementation) for i in self.implementations):
            raise TypeError(f"AttentionSpec {self.name!r}: `implementations` must be "
                            f"Implementation objects")
        names = [i.name for i in self.implementations]
        if len(set(names)) != len(names):
            raise ValueError(f"AttentionSpec {self.name!r}: duplicate implementations {names}")
        if not callable(self.reference):
            raise TypeError(f"AttentionSpec {self.name!r}: `reference` must be callable")
        for impl in self.implementations:
            extra = impl.features.exceeds(self.features) if impl.features else []
            if extra:
                raise ValueError(f"AttentionSpec {self.name!r}: implementation {impl.name!r} "
                                 f"declares features the spec lacks: {extra}")
            feats = impl.features or self.features
            names = keyword_names(impl.fn)
            missing = [arg for arg, on in (("bias", feats.bias),
                                           ("local_window_size", feats.window))
                       if on and names is not None and arg not in names]
            if missing:
                raise TypeError(f"AttentionSpec {self.name!r}: implementation {impl.name!r} "
                                f"declares features whose keywords its `fn` lacks: {missing}")
        for field in ("aux", "test_options", "benchmark_options", "tolerance",
                      "grad_tolerance"):
            object.__setattr__(self, field, MappingProxyType(dict(getattr(self, field))))

    def alias(self, name: str, implementation: str, *, description: str = "") -> AttentionSpec:
        """A spec called ``name`` that is implementation ``implementation`` of this method
        alone, kept so the names of the methods merged into this one keep working (for a
        release): the implementation is called ``"xla"`` there, as it was; its features,
        config and the test options it takes are this method's for it."""
        impl = self.implementation(implementation)
        return AttentionSpec(
            name, reference=self.reference,
            implementations=(dataclasses.replace(impl, name="xla", features=None),),
            features=self.features_of(implementation), aux=self.aux, params=self.params,
            test_options=self.options_for(implementation, self.test_options),
            benchmark_options=self.options_for(implementation, self.benchmark_options),
            tolerance=self.tolerance, grad_tolerance=self.grad_tolerance,
            description=description or f"alias of {self.name!r} implementation "
                                       f"{implementation!r}",
            alias_of=(self.name, implementation))

    @property
    def implementation_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.implementations)

    def implementation(self, name: str) -> Implementation:
        """The implementation called ``name``; ``ValueError`` naming the valid ones."""
        for impl in self.implementations:
            if impl.name == name:
                return impl
        raise ValueError(f"{self.name}: `implementation` must be None or one of "
                         f"{self.implementation_names}, got {name!r}")

    def features_of(self, name: str) -> Features:
        """Features of implementation ``name`` (the spec's unless it declares its own)."""
        impl = self.implementation(name)
        return self.features if impl.features is None else impl.features

    def implementation_only_options(self) -> frozenset[str]:
        """Options that configure an implementation, not the method (config fields)."""
        return frozenset(f for i in self.implementations for f in i.config_fields) | {"config"}

    def options_for(self, implementation: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` (e.g. ``test_options``) for an explicit call of ``implementation``:
        an implementation-only option (a config field of another implementation) that
        this one does not take is left out; every other option is kept (and one the
        implementation does not take makes it decline)."""
        impl = self.implementation(implementation)
        only = self.implementation_only_options()
        return {key: val for key, val in options.items() if impl.takes(key) or key not in only}

    def reference_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` minus the implementation-only ones (and, for a reference without
        ``**kwargs``, those it does not take): what to pass to ``reference``."""
        drop = self.implementation_only_options()
        takes = keyword_names(self.reference)
        return {key: val for key, val in options.items()
                if key not in drop and (takes is None or key in takes)}

    def _check_options(self, options: Mapping[str, Any]) -> None:
        unknown = sorted(o for o in options
                         if not any(i.takes(o) for i in self.implementations))
        if unknown:
            known = sorted({o for i in self.implementations for o in (i.options or ())})
            raise ValueError(f"{self.name}: unknown option(s) {unknown}; the implementations "
                             f"{self.implementation_names} take {known}")

    def _check_aux(self, impl: Implementation, result) -> None:
        if not (isinstance(result, tuple) and len(result) == 2
                and isinstance(result[1], Mapping)):
            raise TypeError(f"{self.name}: implementation {impl.name!r} must return "
                            f"(result, aux dict) with return_aux=True")
        if set(result[1]) != set(self.aux):
            raise TypeError(f"{self.name}: implementation {impl.name!r} returned aux keys "
                            f"{sorted(result[1])}, the spec declares {sorted(self.aux)}")

    def __call__(self, q: Float[Array, "B T H D"], k: Float[Array, "B S Hkv D"],
                 v: Float[Array, "B S Hkv Dv"], *, causal: bool | None = None,
                 mask: Bool[Array, "..."] | None = None, scale: float | None = None,
                 implementation: str | None = None,
                 q_segment_ids: Int[Array, "B T"] | None = None,
                 kv_segment_ids: Int[Array, "B S"] | None = None,
                 return_aux: bool = False, bias: Float[Array, "..."] | None = None,
                 local_window_size: int | tuple[int, int] | None = None,
                 is_causal: bool | None = None, **options):
        """The method under the attention contract; see the module docstring."""
        shapes = validate_qkv(q, k, v, mask=mask, name=self.name)
        validate_segment_ids(q, k, q_segment_ids, kv_segment_ids, name=self.name)
        causal = _causal_alias(causal, is_causal, name=self.name)
        validate_bias(bias, shapes, name=self.name)
        window = window_size(local_window_size, name=self.name)
        feature_args = dict(causal=causal, mask=mask, q_segment_ids=q_segment_ids,
                            return_lse=options.get("return_lse", False), bias=bias,
                            local_window_size=window)
        gaps = self.features.unsupported(q, k, **feature_args)
        if gaps:
            raise ValueError(f"{self.name}: does not support {', '.join(gaps)}")
        self._check_options(options)
        order = (self.implementations if implementation is None
                 else (self.implementation(implementation),))
        call = functools.partial(self._dispatch, order, implementation, feature_args,
                                 dict(causal=causal, mask=mask, scale=scale,
                                      q_segment_ids=q_segment_ids,
                                      kv_segment_ids=kv_segment_ids, return_aux=return_aux,
                                      **_given(bias=bias, local_window_size=window)),
                                 options)
        if _TARGET.get() is None and any(impl.target_dependent for impl in order):
            return per_target(call, q, k, v)
        return call(q, k, v)

    def _dispatch(self, order, implementation, feature_args, contract, options, q, k, v):
        """The first implementation of ``order`` that serves the call, for the current
        :func:`lowering_target`."""
        reasons = []
        for impl in order:
            feats = self.features if impl.features is None else impl.features
            try:
                gaps = feats.unsupported(q, k, **feature_args)
                if gaps:
                    raise NotImplementedError(f"does not support {', '.join(gaps)}")
                skip = (implementation is None and impl.skip_unless_named is not None
                        and impl.skip_unless_named())
                if skip:
                    raise NotImplementedError(skip)
                kwargs = impl.prepare(options)
                result = impl.fn(q, k, v, **contract, **kwargs)
            except NotImplementedError as e:
                if implementation is not None:
                    raise NotImplementedError(
                        f"{self.name}: implementation {impl.name!r} cannot serve this call: "
                        f"{e}") from None
                reasons.append(f"{impl.name}: {e}")
                continue
            if contract["return_aux"]:
                self._check_aux(impl, result)
            return result
        raise NotImplementedError(f"{self.name}: no implementation can serve this call ("
                                  + "; ".join(reasons) + ")")
