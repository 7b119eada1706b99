"""Attention specs: one declaration per method, and tokamax-style dispatch.

Every attention method in lcjax declares one :class:`AttentionSpec`:

- ``reference``: a slow, exact function computing what the method computes (the
  conformance suite compares every implementation with it);
- ``implementations``: :class:`Implementation` objects in preference order (e.g. a
  Pallas kernel first, then the XLA path);
- ``features``: what the method supports (:class:`Features`);
- ``aux``: the documented schema of the ``aux`` dict returned with ``return_aux=True``,
  the same keys for every implementation;
- ``params``: optionally, a factory of the variant's learnable parameters for
  ``lcjax.nn.Attention`` (a learnable α, prototypes, gates, ...).

Calling a spec is calling the method under the attention contract::

    out = spec(q, k, v, *, causal=False, mask=None, scale=None, implementation=None,
               **options)

Dispatch follows openxla/tokamax (``_src/ops/attention/api.py``): with
``implementation=None`` the implementations are tried in order and one that cannot
serve the call raises :class:`NotImplementedError` (with the reason) *before* any
computation, so the next one is tried; an explicit ``implementation=`` that cannot
serve re-raises its reason. Shapes are validated once, here, before any
implementation runs (``ValueError`` naming the argument and the shapes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import jax.numpy as jnp

from lcjax.attention.core import validate_qkv

__all__ = ["AttentionSpec", "Features", "Implementation"]

ALL_DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclasses.dataclass(frozen=True)
class Features:
    """What a method (or one implementation of it) supports.

    causal / non_causal: ``causal=True`` / ``causal=False`` calls.
    mask: an explicit boolean ``mask``.  segment_ids: ``q_segment_ids`` / ``kv_segment_ids``.
    gqa: kv_heads < heads.  cross: kv_len != q_len.
    lse: ``return_lse=True`` (log-sum-exp [B, T, H] float32 as a second result).
    dtypes: input dtypes accepted (names, as ``jnp.dtype(x).name``).
    """

    causal: bool = True
    non_causal: bool = True
    mask: bool = True
    segment_ids: bool = True
    gqa: bool = True
    cross: bool = True
    lse: bool = False
    dtypes: tuple[str, ...] = ALL_DTYPES

    def unsupported(self, q, k, *, causal, mask, q_segment_ids, return_lse) -> list[str]:
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
            (f"dtype {jnp.dtype(q.dtype).name}", jnp.dtype(q.dtype).name not in self.dtypes),
        )
        return [what for what, bad in uses if bad]


@dataclasses.dataclass(frozen=True, eq=False)
class Implementation:
    """One way to compute a method.

    ``fn(q, k, v, *, causal, mask, scale, q_segment_ids, kv_segment_ids, return_aux,
    **options)`` computes the method; it raises ``NotImplementedError(reason)`` before
    any computation when it cannot serve the call (a platform, an option value, a
    traced argument it needs static). ``features`` default to the spec's. ``config``
    is the frozen dataclass of this implementation's settings (validated in its
    ``__post_init__``), documented for users and benchmarks.
    """

    name: str
    fn: Callable[..., Any]
    features: Features | None = None
    config: type | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionSpec:
    """The declaration of one attention method (see the module docstring).

    ``test_options``: keyword options the conformance suite and benchmarks pass on every
    call (e.g. small block sizes so tiny shapes exercise several blocks).
    ``tolerance``: absolute forward tolerance against ``reference`` per dtype name.
    ``params``: the variant's parameter factory, ``params(config, *, rngs) -> nnx.Module
    | None`` (or ``"package.module:attr"`` naming it, imported on first use, so a spec
    here can name a factory under ``lcjax.nn`` without an import cycle).
    ``lcjax.nn.Attention`` calls it once per layer with a ``lcjax.nn.VariantConfig``
    (sizes, dtypes, static options, ``learn``: the names the user asked to learn) and
    keeps the module; on every call the module gets ``x=, q=, k=, v=, positions=`` as
    keywords and returns a dict of keyword options for the variant, overriding static
    options of the same name (entmax: ``{"alpha": α [H]}``). The full protocol is in
    ``lcjax.nn.variant_params``.
    """

    name: str
    reference: Callable[..., Any]
    implementations: tuple[Implementation, ...]
    features: Features = Features()
    aux: Mapping[str, str] = dataclasses.field(default_factory=dict)
    params: Callable[..., Any] | str | None = None
    test_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tolerance: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: {"float64": 1e-10, "float32": 2e-5, "bfloat16": 3e-2,
                                 "float16": 3e-3})
    description: str = ""

    def __post_init__(self):
        if not self.implementations:
            raise ValueError(f"AttentionSpec {self.name!r}: needs at least one implementation")
        names = [i.name for i in self.implementations]
        if len(set(names)) != len(names):
            raise ValueError(f"AttentionSpec {self.name!r}: duplicate implementations {names}")
        for field in ("aux", "test_options", "tolerance"):
            object.__setattr__(self, field, MappingProxyType(dict(getattr(self, field))))

    @property
    def implementation_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.implementations)

    def implementation(self, name: str) -> Implementation:
        for impl in self.implementations:
            if impl.name == name:
                return impl
        raise ValueError(f"{self.name}: `implementation` must be None or one of "
                         f"{self.implementation_names}, got {name!r}")

    def features_of(self, name: str) -> Features:
        impl = self.implementation(name)
        return self.features if impl.features is None else impl.features

    def __call__(self, q, k, v, *, causal: bool = False, mask=None, scale=None,
                 implementation: str | None = None, q_segment_ids=None, kv_segment_ids=None,
                 return_aux: bool = False, **options):
        """The method under the attention contract; see the module docstring."""
        validate_qkv(q, k, v, mask=mask, name=self.name)
        if (q_segment_ids is None) != (kv_segment_ids is None):
            raise ValueError(f"{self.name}: pass both `q_segment_ids` and `kv_segment_ids` "
                             f"or neither")
        gaps = self.features.unsupported(q, k, causal=causal, mask=mask,
                                         q_segment_ids=q_segment_ids,
                                         return_lse=options.get("return_lse", False))
        if gaps:
            raise ValueError(f"{self.name}: does not support {', '.join(gaps)}")
        order = (self.implementations if implementation is None
                 else (self.implementation(implementation),))
        reasons = []
        for impl in order:
            feats = self.features if impl.features is None else impl.features
            gaps = feats.unsupported(q, k, causal=causal, mask=mask,
                                     q_segment_ids=q_segment_ids,
                                     return_lse=options.get("return_lse", False))
            try:
                if gaps:
                    raise NotImplementedError(f"does not support {', '.join(gaps)}")
                return impl.fn(q, k, v, causal=causal, mask=mask, scale=scale,
                               q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                               return_aux=return_aux, **options)
            except NotImplementedError as e:
                if implementation is not None:
                    raise NotImplementedError(
                        f"{self.name}: implementation {impl.name!r} cannot serve this call: "
                        f"{e}") from None
                reasons.append(f"{impl.name}: {e}")
        raise NotImplementedError(f"{self.name}: no implementation can serve this call ("
                                  + "; ".join(reasons) + ")")
