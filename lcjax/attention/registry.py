"""Registry of attention variants by name: ``lcjax.attention.get(name)``.

Every registered function follows the attention contract of ``core.py``.
"""

from __future__ import annotations

from collections.abc import Callable

AttentionFn = Callable[..., object]

_REGISTRY: dict[str, AttentionFn] = {}


def register(name: str, fn: AttentionFn | None = None):
    """Register ``fn`` under ``name`` (usable as a decorator). Re-registering replaces."""

    def _add(f: AttentionFn) -> AttentionFn:
        _REGISTRY[name] = f
        return f

    return _add if fn is None else _add(fn)


def get(name_or_fn: str | AttentionFn) -> AttentionFn:
    """The variant registered as ``name``; a callable is returned unchanged."""
    if callable(name_or_fn):
        return name_or_fn
    try:
        return _REGISTRY[name_or_fn]
    except KeyError:
        raise ValueError(
            f"unknown attention variant {name_or_fn!r}; registered: {sorted(_REGISTRY)}"
        ) from None


def available() -> list[str]:
    """Names of all registered variants."""
    return sorted(_REGISTRY)
