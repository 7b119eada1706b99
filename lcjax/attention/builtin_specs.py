"""The built-in attention methods: the one place that lists them (modelled on tokamax's
``_src/ops/attention/api.py``).

Method modules only *declare* their :class:`~lcjax.attention.AttentionSpec`; nothing
registers on import. ``lcjax.attention`` calls :func:`register_builtins` once, so the
registry holds exactly :data:`BUILTIN_SPECS`, whatever the order of imports or of this
tuple (each spec is registered under its own name; a spec built from another, as ASEntmax
from entmax, uses the other's object, not the registry).
"""

from __future__ import annotations

from lcjax.attention.base import AttentionSpec
from lcjax.attention.entmax.length_scaling import ASENTMAX, SSMAX
from lcjax.attention.entmax.method import ENTMAX, SPARSEMAX
from lcjax.attention.linear import LINEAR
from lcjax.attention.nystrom import NYSTROM
from lcjax.attention.performer import PERFORMER
from lcjax.attention.plash import PLASH
from lcjax.attention.registry import register
from lcjax.attention.softmax import BLOCKWISE, JAX, SOFTMAX
from lcjax.attention.token_sparse import TOKEN_SPARSE

__all__ = ["BUILTIN_SPECS", "register_builtins"]

# "blockwise" and "jax" are aliases of two implementations of "softmax" (kept for a release)
BUILTIN_SPECS: tuple[AttentionSpec, ...] = (
    SOFTMAX, BLOCKWISE, JAX,
    ENTMAX, SPARSEMAX, ASENTMAX, SSMAX,
    LINEAR, NYSTROM, PERFORMER,
    PLASH, TOKEN_SPARSE,
)


def register_builtins() -> None:
    """Register every spec of :data:`BUILTIN_SPECS` under its name (idempotent)."""
    for spec in BUILTIN_SPECS:
        register(spec)
