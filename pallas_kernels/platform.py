"""One ``pallas_call`` for every target, shared by the kernels of this package.

``pallas_call_per_platform`` returns either the interpret-mode call (CPU tests) or a
function that picks the compiler parameters per lowering platform with
``lax.platform_dependent``: Mosaic on TPU (every grid axis ``"parallel"``) and Triton on
GPU (``plgpu.CompilerParams``). Imports only jax.
"""

from __future__ import annotations

from collections.abc import Callable

from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu

__all__ = ["pallas_call_per_platform"]


def pallas_call_per_platform(kernel: Callable, *, grid, in_specs, out_specs, out_shape,
                             interpret: bool, name: str, num_warps: int = 4,
                             num_stages: int = 2) -> Callable:
    """``pl.pallas_call(kernel, ...)`` in interpret mode, or per lowering platform: TPU
    (Mosaic, all grid axes parallel), CUDA/ROCm (Triton with ``num_warps``/``num_stages``),
    and the default (CPU: JAX asks for interpret mode there)."""

    def build(params, interp=False):
        return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                              out_shape=out_shape, compiler_params=params, interpret=interp,
                              name=name)

    if interpret:
        return build(None, True)
    tpu = pltpu.CompilerParams(dimension_semantics=("parallel",) * len(grid))
    gpu = plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)

    def run(*args):
        return lax.platform_dependent(
            *args,
            tpu=lambda *a: build(tpu)(*a),
            cuda=lambda *a: build(gpu)(*a),
            rocm=lambda *a: build(gpu)(*a),
            default=lambda *a: build(None)(*a),
        )

    return run
