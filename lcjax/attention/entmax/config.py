"""The one configuration of α-entmax attention (:class:`EntmaxConfig`, the same for the XLA
path and the Pallas kernel, passed whole to both), its ``aux`` schema and the validation of
a call's α shared by the implementations and the reference."""

from __future__ import annotations

import dataclasses
import numbers

import jax.numpy as jnp

from lcjax.attention.core import validate_qkv
from lcjax.attention.entmax.mapping import SolverConfig, split_alpha

__all__ = ["AUX", "DEFAULT_CONFIG", "NAME", "EntmaxConfig", "parse_alpha", "prepare_call"]

NAME = "entmax_attention"
AUX = {"tau": "[B, T, H] float32", "iterations": "[B, T, H] int32",
       "block_sparsity": "[] float32"}



# ----------------------------------------------------------------------------
# The one configuration
# ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class EntmaxConfig:
    """Settings of α-entmax attention, the same for the XLA path and the Pallas kernel.

    solver, bins, n_iter, tol: the threshold solver
      (:class:`lcjax.attention.entmax.mapping.SolverConfig`, which holds the defaults and
      the rules that resolve them).
    block_q, block_kv: tiles of the forward (and of the kernel's backward unless its
      ``block_sizes`` say otherwise). The XLA path clips them to T and S; the kernel needs
      powers of two ≥ 16 (≥ 8 in interpret mode) and raises ``NotImplementedError`` else.
    """

    solver: str = SolverConfig.solver
    bins: int = SolverConfig.bins
    n_iter: int | None = None
    tol: float | None = None
    block_q: int = 128
    block_kv: int = 128

    def __post_init__(self):
        self.solver_config  # noqa: B018 — validates the solver fields
        for name in ("block_q", "block_kv"):
            val = getattr(self, name)
            if not isinstance(val, numbers.Integral) or val <= 0:
                raise ValueError(f"{NAME}: block sizes must be positive, got "
                                 f"block_q={self.block_q}, block_kv={self.block_kv}")

    @property
    def solver_config(self) -> SolverConfig:
        try:
            return SolverConfig(self.solver, self.bins, self.n_iter, self.tol)
        except ValueError as e:
            raise ValueError(f"{NAME}: {str(e).removeprefix('SolverConfig: ')}") from None



DEFAULT_CONFIG = EntmaxConfig()


def parse_alpha(alpha, heads: int):
    """(static α or None, array α [H] or None); ValueError for α ≤ 1 or a bad shape."""
    a_static, arr = split_alpha(alpha, NAME)
    if arr is None:
        return a_static, None
    if arr.shape not in ((), (heads,)):
        raise ValueError(
            f"{NAME}: `alpha` must be a number or an array of shape [heads] = ({heads},), "
            f"got shape {arr.shape}"
        )
    return None, jnp.broadcast_to(arr, (heads,))



def prepare_call(q, k, v, alpha):
    """Validated (shapes, static α, array α [H]) of a call."""
    shapes = validate_qkv(q, k, v, name=NAME)
    if shapes.q_len == 0 or shapes.kv_len == 0:
        raise ValueError(f"{NAME}: empty sequence: q {q.shape}, k {k.shape}")
    return (shapes, *parse_alpha(alpha, shapes.heads))
