"""One ``pallas_call`` for every target, shared by the kernels of this package.

``pallas_call_per_platform`` returns either the interpret-mode call (CPU tests) or a
function that picks the compiler parameters per lowering platform with
``lax.platform_dependent``: Mosaic on TPU (every grid axis ``"parallel"``) and Triton on
GPU (``plgpu.CompilerParams``). A kernel may give TPU its own body (``tpu_kernel``,
``tpu_in_specs``, ``tpu_scratch_shapes``: e.g. operands left in HBM and copied tile by
tile into VMEM scratch); the interpreter then runs that body too, in the TPU interpret
mode (``pltpu.InterpretParams``: DMAs and semaphores simulated), so the CPU tests exercise
what Mosaic compiles. Imports only jax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu

__all__ = ["pallas_call_per_platform"]


def pallas_call_per_platform(kernel: Callable, *, grid, in_specs, out_specs, out_shape,
                             interpret: bool, name: str, num_warps: int = 4,
                             num_stages: int = 2, tpu_kernel: Callable | None = None,
                             tpu_in_specs: Sequence | None = None,
                             tpu_scratch_shapes: Sequence = ()) -> Callable:
    """``pl.pallas_call(kernel, ...)`` in interpret mode, or per lowering platform: TPU
    (Mosaic, all grid axes parallel), CUDA/ROCm (Triton with ``num_warps``/``num_stages``),
    and the default (CPU: JAX asks for interpret mode there).

    ``tpu_kernel`` (default: ``kernel``) with ``tpu_in_specs`` (default: ``in_specs``) and
    ``tpu_scratch_shapes`` is what Mosaic compiles; when ``tpu_kernel`` is given, interpret
    mode runs it in the TPU interpreter (``pltpu.InterpretParams()``) instead of ``kernel``.
    """

    def build(params, interp=False, tpu=False):
        body, specs, scratch = kernel, in_specs, ()
        if tpu and tpu_kernel is not None:
            body, specs, scratch = tpu_kernel, tpu_in_specs or in_specs, tuple(tpu_scratch_shapes)
        return pl.pallas_call(body, grid=grid, in_specs=specs, out_specs=out_specs,
                              out_shape=out_shape, compiler_params=params, interpret=interp,
                              scratch_shapes=scratch, name=name)

    if interpret:
        if tpu_kernel is not None:
            return build(None, pltpu.InterpretParams(), tpu=True)
        return build(None, True)
    tpu = pltpu.CompilerParams(dimension_semantics=("parallel",) * len(grid))
    gpu = plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)

    def run(*args):
        return lax.platform_dependent(
            *args,
            tpu=lambda *a: build(tpu, tpu=True)(*a),
            cuda=lambda *a: build(gpu)(*a),
            rocm=lambda *a: build(gpu)(*a),
            default=lambda *a: build(None)(*a),
        )

    return run
