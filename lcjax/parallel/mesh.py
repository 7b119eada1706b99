"""Device meshes for data and context (sequence) parallelism.

One mesh shape serves every strategy in :mod:`lcjax.parallel`: axis ``"data"`` shards
the batch, axis ``"context"`` shards the sequence. Activations ``x [B, T, d_model]`` are
placed as ``P("data", "context", None)`` and token batches ``[B, T]`` as
``P("data", "context")``. Axes are ``AxisType.Auto``, so ``jax.jit`` propagates shardings
from placed inputs and ``jax.shard_map`` takes ``in_specs``/``out_specs`` as usual.

The hybrid strategy (``"usp"``: Ulysses over ``"context"``, ring over ``"ring"``) takes a
mesh with a third axis, ``make_mesh(data=, ring=, context=)`` -> axes ``("data", "ring",
"context")``; the sequence is then sharded over both, ring-major:
``P("data", ("ring", "context"))`` (:func:`sequence_axes`; :func:`token_sharding` and
:func:`activation_sharding` follow the mesh).

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
    "RING",
    "TOKEN_SPEC",
    "activation_sharding",
    "make_mesh",
    "parse_mesh",
    "mesh_size",
    "sequence_axes",
    "token_sharding",
]

DATA, CONTEXT, RING = "data", "context", "ring"
ACTIVATION_SPEC = P(DATA, CONTEXT, None)  # x: [B, T, d_model]
TOKEN_SPEC = P(DATA, CONTEXT)  # tokens, targets, positions, segment ids: [B, T]


def make_mesh(*, data: int = 1, context: int | None = None, ring: int | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``("data", "context")`` mesh of ``data * context`` devices (Auto axes); with
    ``ring`` a ``("data", "ring", "context")`` mesh of ``data * ring * context`` (the
    hybrid "usp" strategy: ring attention over ``"ring"``, Ulysses over ``"context"``).

    ``context=None`` takes every device not used by ``data`` (and ``ring``). Works with one
    device (``make_mesh()`` is a 1 x 1 mesh). Raises ``ValueError`` naming the numbers when
    the product does not equal the number of devices given (default: all devices).
    """
    devices = list(jax.devices() if devices is None else devices)
    for name, value in (("data", data), ("ring", 1 if ring is None else ring)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"make_mesh: {name} must be a positive int; got {value!r}")
    other = data * (1 if ring is None else ring)
    if context is None:
        if len(devices) % other:
            raise ValueError(f"make_mesh: data={data}" + ("" if ring is None else
                             f" x ring={ring}") + f" does not divide the {len(devices)} "
                             "devices")
        context = len(devices) // other
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"make_mesh: context must be a positive int; got {context!r}")
    if other * context != len(devices):
        sizes = f"{data} * {context}" if ring is None else f"{data} * {ring} * {context}"
        what = "data * context" if ring is None else "data * ring * context"
        raise ValueError(f"make_mesh: {what} = {sizes} = {other * context}"
                         f" but {len(devices)} devices are available")
    if ring is None:
        grid = np.asarray(devices, dtype=object).reshape(data, context)
        return Mesh(grid, (DATA, CONTEXT), axis_types=(AxisType.Auto, AxisType.Auto))
    grid = np.asarray(devices, dtype=object).reshape(data, ring, context)
    return Mesh(grid, (DATA, RING, CONTEXT), axis_types=(AxisType.Auto,) * 3)


def parse_mesh(text: str) -> dict[str, int]:
    """``"data=2,context=4"`` -> ``{"data": 2, "context": 4}`` (the ``--mesh`` flag);
    ``"data=2,ring=2,context=2"`` adds the ring axis of the "usp" strategy."""
    sizes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name.strip() not in (DATA, CONTEXT, RING) or not value.strip().isdigit():
            raise ValueError(f"--mesh: expected 'data=N,context=M' (and optionally "
                             f"'ring=R'), got {text!r}")
        sizes[name.strip()] = int(value)
    if not sizes:
        raise ValueError(f"--mesh: expected 'data=N,context=M', got {text!r}")
    return sizes


def sequence_axes(mesh) -> str | tuple[str, str]:
    """The mesh axes the sequence is sharded over: ``"context"``, or ``("ring",
    "context")`` (ring-major) on a mesh with a ``"ring"`` axis."""
    return (RING, CONTEXT) if RING in mesh.axis_names else CONTEXT


def activation_sharding(mesh: Mesh) -> NamedSharding:
    """``NamedSharding`` of activations ``[B, T, d_model]``: batch on data, T on the
    sequence axes (:func:`sequence_axes`)."""
    return NamedSharding(mesh, P(DATA, sequence_axes(mesh), None))


def token_sharding(mesh: Mesh) -> NamedSharding:
    """``NamedSharding`` of ``[B, T]`` arrays (tokens, targets, positions, segment ids)."""
    return NamedSharding(mesh, P(DATA, sequence_axes(mesh)))


def mesh_size(mesh: Mesh, axis: str) -> int:
    """Size of ``axis`` in ``mesh`` (1 when the mesh lacks it)."""
    return int(dict(zip(mesh.axis_names, mesh.devices.shape)).get(axis, 1))
