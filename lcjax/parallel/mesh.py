"""Device meshes for data and context (sequence) parallelism.

One mesh shape serves every strategy in :mod:`lcjax.parallel`: axis ``"data"`` shards
the batch, axis ``"context"`` shards the sequence. Activations ``x [B, T, d_model]`` are
placed as ``P("data", "context", None)`` and token batches ``[B, T]`` as
``P("data", "context")``. Axes are ``AxisType.Auto``, so ``jax.jit`` propagates shardings
from placed inputs and ``jax.shard_map`` takes ``in_specs``/``out_specs`` as usual.

    mesh = make_mesh(data=2, context=4)          # 8 devices
    x = jax.device_put(x, activation_sharding(mesh))
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = [
    "ACTIVATION_SPEC",
    "CONTEXT",
    "DATA",
    "TOKEN_SPEC",
    "activation_sharding",
    "make_mesh",
    "parse_mesh",
    "mesh_size",
    "token_sharding",
]

DATA, CONTEXT = "data", "context"
ACTIVATION_SPEC = P(DATA, CONTEXT, None)  # x: [B, T, d_model]
TOKEN_SPEC = P(DATA, CONTEXT)  # tokens, targets, positions, segment ids: [B, T]


def make_mesh(*, data: int = 1, context: int | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``("data", "context")`` mesh of ``data * context`` devices (Auto axes).

    ``context=None`` takes every device not used by ``data``. Works with one device
    (``make_mesh()`` is a 1 x 1 mesh). Raises ``ValueError`` naming the numbers when
    the product does not equal the number of devices given (default: all devices).
    """
    devices = list(jax.devices() if devices is None else devices)
    if isinstance(data, bool) or not isinstance(data, int) or data < 1:
        raise ValueError(f"make_mesh: data must be a positive int; got {data!r}")
    if context is None:
        if len(devices) % data:
            raise ValueError(f"make_mesh: data={data} does not divide the {len(devices)} "
                             "devices")
        context = len(devices) // data
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"make_mesh: context must be a positive int; got {context!r}")
    if data * context != len(devices):
        raise ValueError(f"make_mesh: data * context = {data} * {context} = {data * context}"
                         f" but {len(devices)} devices are available")
    grid = np.asarray(devices, dtype=object).reshape(data, context)
    return Mesh(grid, (DATA, CONTEXT), axis_types=(AxisType.Auto, AxisType.Auto))


def parse_mesh(text: str) -> dict[str, int]:
    """``"data=2,context=4"`` -> ``{"data": 2, "context": 4}`` (the ``--mesh`` flag)."""
    sizes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name.strip() not in (DATA, CONTEXT) or not value.strip().isdigit():
            raise ValueError(f"--mesh: expected 'data=N,context=M', got {text!r}")
        sizes[name.strip()] = int(value)
    if not sizes:
        raise ValueError(f"--mesh: expected 'data=N,context=M', got {text!r}")
    return sizes


def activation_sharding(mesh: Mesh) -> NamedSharding:
    """``NamedSharding`` of activations ``[B, T, d_model]``: batch on data, T on context."""
    return NamedSharding(mesh, ACTIVATION_SPEC)


def token_sharding(mesh: Mesh) -> NamedSharding:
    """``NamedSharding`` of ``[B, T]`` arrays (tokens, targets, positions, segment ids)."""
    return NamedSharding(mesh, TOKEN_SPEC)


def mesh_size(mesh: Mesh, axis: str) -> int:
    """Size of ``axis`` in ``mesh`` (1 when the mesh lacks it)."""
    return int(dict(zip(mesh.axis_names, mesh.devices.shape)).get(axis, 1))
