"""Checks of a context-parallel configuration, raised as ``ValueError`` before any tracing
or compilation, naming the numbers.

A context-parallel call runs over a mesh (:mod:`lcjax.parallel.mesh`) whose ``"context"``
axis has size C (the Ulysses degree / ring size) and, optionally, a ``"data"`` axis that
shards the batch. The rules, per strategy:

- every strategy: the mesh has the axes it names; the global length T is a multiple of C
  (ring with zigzag balancing: of 2C); the batch B is a multiple of the data size;
- Ulysses and UPipe: the H query heads are a multiple of C (each device attends with H/C
  heads at a time in Ulysses, with one head per stage in UPipe); the Hkv key/value heads
  divide H and either are a multiple of C or divide C (then each kv head is replicated
  C/Hkv times, so every device holds the kv head its query heads use; gradients of the
  copies are summed);
- ring: nothing about heads (every device holds all heads), the variant must give a
  log-sum-exp (``features.lse``), since partial results are merged with it.
"""

from __future__ import annotations

from jax.sharding import Mesh

from lcjax.parallel.mesh import mesh_size

__all__ = ["check_axes", "check_batch", "check_heads", "check_length", "check_positive"]


def check_positive(name: str, **values) -> None:
    """Every value a positive int (``bool`` is not an int here)."""
    for arg, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}: `{arg}` must be a positive int, got {value!r}")


def check_axes(name: str, mesh, *axes: str) -> None:
    """``mesh`` (a Mesh or AbstractMesh) has every axis in ``axes``."""
    if mesh is None or getattr(mesh, "empty", False):
        raise ValueError(f"{name}: no mesh: pass `mesh=` or run under `jax.set_mesh(mesh)` "
                         f"(a mesh with axes {list(axes)}, e.g. lcjax.parallel.make_mesh)")
    missing = [a for a in axes if a not in mesh.axis_names]
    if missing:
        raise ValueError(f"{name}: the mesh has axes {list(mesh.axis_names)}, missing "
                         f"{missing} (needed: {list(axes)})")


def axis_size(mesh: Mesh, axis: str | None) -> int:
    """Size of ``axis`` (1 for ``None`` or an axis the mesh lacks)."""
    if axis is None:
        return 1
    if isinstance(mesh, Mesh):
        return mesh_size(mesh, axis)
    return int(dict(mesh.shape).get(axis, 1))


def check_length(name: str, seq_len: int, context: int, *, multiple: int = 1,
                 what: str = "context size") -> None:
    """``seq_len`` is a multiple of ``multiple * context``."""
    need = multiple * context
    if seq_len % need:
        times = f"{multiple} x " if multiple > 1 else ""
        raise ValueError(f"{name}: sequence length T={seq_len} is not a multiple of "
                         f"{times}the {what} {context} (= {need})")


def check_batch(name: str, batch: int, data: int) -> None:
    """``batch`` is a multiple of the data-axis size."""
    if batch % data:
        raise ValueError(f"{name}: batch B={batch} is not a multiple of the data axis "
                         f"size {data}")


def check_heads(name: str, heads: int, kv_heads: int, context: int) -> int:
    """Head rules of Ulysses and UPipe (module docstring); returns the kv replication
    factor R (1 when Hkv is a multiple of C, else C / Hkv)."""
    if kv_heads <= 0 or heads % kv_heads:
        raise ValueError(f"{name}: num_heads H={heads} must be a multiple of num_kv_heads "
                         f"Hkv={kv_heads}")
    if heads % context:
        raise ValueError(f"{name}: num_heads H={heads} is not divisible by the context "
                         f"size C={context}")
    if kv_heads % context == 0:
        return 1
    if context % kv_heads == 0:
        return context // kv_heads
    raise ValueError(f"{name}: num_kv_heads Hkv={kv_heads} must be a multiple of the context "
                     f"size C={context} or divide it (for replication of kv heads)")
