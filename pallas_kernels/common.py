"""The helpers shared by the kernels of this package: one ``pallas_call`` for every target,
the dot precision rule and the tile helpers (``nt``/``nn``/``tn`` float32 dots, ``iota``,
``rowsum``, ``pad_to``, the smallest block ``min_block``). Imports only jax.

``pallas_call_per_platform`` returns either the interpret-mode call (CPU tests) or a
function that picks the compiler parameters per lowering platform with
``lax.platform_dependent``: Mosaic on TPU (every grid axis ``"parallel"``) and Triton on
GPU (``plgpu.CompilerParams``).

A kernel whose TPU form differs passes ``tpu=TpuCall(...)``, and the Mosaic branch uses its
kernel, grid, specs, VMEM scratch and dimension semantics instead. Two shapes of TPU form
exist here: a sequential grid axis with scratch accumulators (as jax's TPU flash attention
streams key blocks; the PLASH prototype kernel), and operands left in HBM
(``memory_space=pl.ANY``) copied tile by tile into VMEM scratch with async copies (the
entmax kernels' multi-pass solver), where Triton loops over whole-sequence blocks inside one
program. ``interpret="tpu"`` runs the TPU form in the TPU interpreter
(``pltpu.InterpretParams()``: DMAs and semaphores simulated), so the CPU tests exercise
what Mosaic compiles; ``interpret=True`` runs the generic (Triton) form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu

__all__ = ["TpuCall", "dot_precision", "pallas_call_per_platform"]


class TpuCall(NamedTuple):
    """The Mosaic (TPU) form of a call: its own kernel, grid, block specs, VMEM
    ``scratch_shapes`` and ``dimension_semantics`` (None: every axis ``"parallel"``; a
    sequential accumulation axis is ``"arbitrary"``). ``out_shape`` is the caller's."""

    kernel: Callable
    grid: tuple[int, ...]
    in_specs: Any
    out_specs: Any
    scratch_shapes: Sequence[Any] = ()
    dimension_semantics: tuple[str, ...] | None = None


def pallas_call_per_platform(kernel: Callable, *, grid, in_specs, out_specs, out_shape,
                             interpret: bool | str, name: str, num_warps: int = 4,
                             num_stages: int = 2, tpu: TpuCall | None = None) -> Callable:
    """``pl.pallas_call(kernel, ...)`` in interpret mode, or per lowering platform: TPU
    (Mosaic, all grid axes parallel — or the ``tpu`` form), CUDA/ROCm (Triton with
    ``num_warps``/``num_stages``), and the default (CPU: JAX asks for interpret mode there).
    ``interpret="tpu"`` interprets the ``tpu`` form (``ValueError`` without one)."""

    def build(params, interp=False):
        return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                              out_shape=out_shape, compiler_params=params, interpret=interp,
                              name=name)

    def build_tpu(interp=False):
        sem = tpu.dimension_semantics or ("parallel",) * len(tpu.grid)
        return pl.pallas_call(tpu.kernel, grid=tpu.grid, in_specs=tpu.in_specs,
                              out_specs=tpu.out_specs, out_shape=out_shape,
                              scratch_shapes=tuple(tpu.scratch_shapes),
                              compiler_params=None if interp else pltpu.CompilerParams(
                                  dimension_semantics=sem),
                              interpret=pltpu.InterpretParams() if interp else False,
                              name=name)

    if interpret == "tpu":
        if tpu is None:
            raise ValueError(f"{name}: interpret='tpu' needs a `tpu` form of the call")
        return build_tpu(True)
    if interpret:
        return build(None, True)
    tpu_params = pltpu.CompilerParams(dimension_semantics=("parallel",) * len(grid))
    gpu = plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    on_tpu = (lambda *a: build_tpu()(*a)) if tpu is not None else (
        lambda *a: build(tpu_params)(*a))

    def run(*args):
        return lax.platform_dependent(
            *args,
            tpu=on_tpu,
            cuda=lambda *a: build(gpu)(*a),
            rocm=lambda *a: build(gpu)(*a),
            default=lambda *a: build(None)(*a),
        )

    return run


def dot_precision(a, b):
    """The precision of a kernel's dot of ``a`` and ``b``: DEFAULT unless both operands are
    float32 (then JAX's configured one). Mosaic takes no float32 contract precision on bf16
    operands, so a user's ``jax_default_matmul_precision="highest"`` must not reach a bf16
    dot inside a kernel."""
    if a.dtype == jnp.float32 and b.dtype == jnp.float32:
        return None
    return lax.Precision.DEFAULT


# ----------------------------------------------------------------------------
# Tile helpers
# ----------------------------------------------------------------------------
F32 = jnp.float32


def nt(a, b, precision=None):
    """a [m, d] · b [n, d]ᵀ -> [m, n] float32 (precision: :func:`dot_precision` by default)."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())),
                           precision=dot_precision(a, b) if precision is None else precision,
                           preferred_element_type=F32)


def nn(a, b, precision=None):
    """a [m, d] · b [d, n] -> [m, n] float32."""
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                           precision=dot_precision(a, b) if precision is None else precision,
                           preferred_element_type=F32)


def tn(a, b, precision=None):
    """a [d, m]ᵀ · b [d, n] -> [m, n] float32."""
    return lax.dot_general(a, b, (((0,), (0,)), ((), ())),
                           precision=dot_precision(a, b) if precision is None else precision,
                           preferred_element_type=F32)


def iota(shape, dim):
    """int32 indices along ``dim`` of ``shape``."""
    return lax.broadcasted_iota(jnp.int32, shape, dim)


def rowsum(x):
    """Σ over axis 1, kept: [m, n] -> [m, 1]."""
    return jnp.sum(x, axis=1, keepdims=True)


def min_block(interpret: bool) -> int:
    """The smallest tile: 16 compiled (Triton's dot needs 16), 8 in the interpreter."""
    return 8 if interpret else 16


def pad_to(x, axis: int, size: int):
    """``x`` zero-padded at the end of ``axis`` to ``size``."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths)
