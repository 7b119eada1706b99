"""Ahead-of-time compilation for a TPU topology from any host (CPU included).

The TPU compiler ships in libtpu (``pip install "lcjax[tpu]"``). With it,
``jax.experimental.topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")``
describes a pod slice without any TPU attached, and ``jax.jit(f).trace(*structs).lower()
.compile()`` over ``jax.ShapeDtypeStruct``s placed on its devices runs the real compiler:
VMEM and HBM overflows are compile errors, and ``memory_analysis()`` gives per-chip bytes
(MaxText's ``train_compile.py`` checks pod configurations this way).

    devices = topology_devices("v5p:2x2x2")              # 8 TPU devices, no TPU needed
    x = struct((1, 131072, 8, 128), "bfloat16", devices) # replicated on those devices
    compiled = compile_for(fn, x, x, x)
    memory_report(compiled, "v5p:2x2x2")                  # bytes per chip

Only one process may load libtpu at a time unless ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``
(:func:`topology_devices` sets it when unset, so parallel test workers can compile).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "HBM_BYTES_PER_CHIP",
    "TOPOLOGIES",
    "compile_for",
    "memory_report",
    "struct",
    "topology_devices",
    "topology_mesh",
]

GiB = 1 << 30
# HBM per chip by TPU generation (public Cloud TPU system-architecture pages).
HBM_BYTES_PER_CHIP = {"v4": 32 * GiB, "v5e": 16 * GiB, "v5p": 95 * GiB, "v6e": 32 * GiB}
# Topology names tried with libtpu 0.0.42 (chips per dimension, 'x'-separated).
TOPOLOGIES = ("v4:2x2x1", "v5e:2x2", "v5e:4x4", "v5e:16x16", "v5p:2x2x1", "v5p:2x2x2",
              "v5p:4x4x4", "v6e:2x2", "v6e:4x4")
_NAME = re.compile(r"^(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})$")


def _check_topology(name: str) -> str:
    """The TPU generation of ``name`` ('v5e', ...); ``ValueError`` naming the known ones."""
    match = _NAME.match(name or "")
    if match is None:
        raise ValueError(f"unknown TPU topology {name!r}: expected GEN:AxB[xC] with GEN in "
                         f"{sorted(HBM_BYTES_PER_CHIP)}, e.g. one of {list(TOPOLOGIES)}")
    return match.group(1)


@functools.cache
def topology_devices(name: str) -> tuple[jax.Device, ...]:
    """The TPU devices of topology ``name`` (e.g. ``"v5e:2x2"``), usable as compile targets
    from any host. ``ValueError`` for an unknown name; ``ImportError`` naming the ``tpu``
    extra when libtpu is missing."""
    _check_topology(name)
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    try:
        import libtpu  # noqa: F401
    except ImportError as err:
        raise ImportError("compiling for a TPU topology needs libtpu: "
                          "pip install 'lcjax[tpu]'") from err
    from jax.experimental import topologies

    try:
        return tuple(topologies.get_topology_desc(topology_name=name, platform="tpu").devices)
    except Exception as err:  # libtpu's own message for a name it does not know
        raise ValueError(f"TPU topology {name!r} rejected by libtpu: {err}") from None


def hbm_bytes_per_chip(name: str) -> int:
    """HBM capacity of one chip of topology ``name``, in bytes."""
    return HBM_BYTES_PER_CHIP[_check_topology(name)]


def topology_mesh(name: str, axes: Sequence[tuple[str, int]] | None = None) -> Mesh:
    """A mesh over the devices of ``name``: ``axes`` as (axis name, size) pairs whose sizes
    multiply to the device count; default one axis ``"x"`` over all devices."""
    devices = topology_devices(name)
    axes = list(axes) if axes else [("x", len(devices))]
    sizes = [size for _, size in axes]
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(f"mesh axes {axes} multiply to {int(np.prod(sizes))}, but topology "
                         f"{name!r} has {len(devices)} devices")
    return Mesh(np.array(devices).reshape(sizes), tuple(axis for axis, _ in axes))


def struct(shape: Sequence[int], dtype, devices_or_mesh, spec: PartitionSpec | None = None
           ) -> jax.ShapeDtypeStruct:
    """A ``ShapeDtypeStruct`` placed on TPU devices: sharded by ``spec`` over a mesh, or
    replicated (``spec=None``) on a mesh / on the first device of a device list."""
    if isinstance(devices_or_mesh, Mesh):
        mesh = devices_or_mesh
    else:
        mesh = Mesh(np.array(list(devices_or_mesh)[:1]), ("x",))
    sharding = NamedSharding(mesh, spec if spec is not None else PartitionSpec())
    return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype) if isinstance(dtype, str)
                                else dtype, sharding=sharding)


def compile_for(fn: Callable, *args, static_argnums=(), **jit_kwargs):
    """``jax.jit(fn).trace(*args).lower().compile()``: the target is the devices of the
    arguments' shardings (TPU structs from :func:`struct` compile with libtpu)."""
    return jax.jit(fn, static_argnums=static_argnums, **jit_kwargs).trace(*args).lower().compile()


def memory_report(compiled, topology: str | None = None) -> dict[str, int | float]:
    """Per-chip bytes of a compiled program: arguments, outputs, temporaries, generated code
    and their total (arguments + outputs - aliased + temporaries); with ``topology``, also
    the chip's HBM capacity and the fraction used."""
    stats = compiled.memory_analysis()
    report = {
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
        "temp_bytes": int(stats.temp_size_in_bytes),
        "code_bytes": int(stats.generated_code_size_in_bytes),
    }
    report["total_bytes"] = (report["argument_bytes"] + report["output_bytes"]
                             - report["alias_bytes"] + report["temp_bytes"])
    # host (pinned) memory: what an offloading program keeps off the chip, not in the total
    report["host_bytes"] = sum(int(getattr(stats, f"host_{k}_size_in_bytes", 0) or 0)
                               for k in ("argument", "output", "temp"))
    if topology is not None:
        report["hbm_bytes"] = hbm_bytes_per_chip(topology)
        report["hbm_fraction"] = report["total_bytes"] / report["hbm_bytes"]
    return report
