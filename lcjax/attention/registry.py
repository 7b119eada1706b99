"""Registry of attention methods by name: each name holds one :class:`AttentionSpec`.

``lcjax.attention.get(name)`` returns the spec, which is itself the callable under the
attention contract (a callable passed to ``get`` is returned unchanged);
``lcjax.attention.spec(name)`` returns the spec for its declarations (implementations,
features, aux schema, parameter factory); ``specs()`` lists them all.
"""

from __future__ import annotations

from collections.abc import Callable

from lcjax.attention.base import AttentionSpec

AttentionFn = Callable[..., object]

_REGISTRY: dict[str, AttentionSpec] = {}


def register(spec: AttentionSpec) -> AttentionSpec:
    """Register ``spec`` under ``spec.name`` (re-registering a name replaces it)."""
    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"register: expected an AttentionSpec, got {type(spec).__name__}")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove ``name`` from the registry (tests that add a toy variant clean up with it)."""
    _REGISTRY.pop(name, None)


def spec(name: str) -> AttentionSpec:
    """The spec registered as ``name``; ``ValueError`` naming the registered ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown attention variant {name!r}; registered: {sorted(_REGISTRY)}"
        ) from None


def get(name_or_fn: str | AttentionFn) -> AttentionFn:
    """The variant registered as ``name`` (its spec, callable under the contract); a
    callable is returned unchanged."""
    if callable(name_or_fn):
        return name_or_fn
    return spec(name_or_fn)


def specs() -> list[AttentionSpec]:
    """All registered specs, sorted by name."""
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]


def available() -> list[str]:
    """Names of all registered variants."""
    return sorted(_REGISTRY)
