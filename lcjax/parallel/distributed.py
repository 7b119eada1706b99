"""Multi-process runs: JAX's multi-controller runtime, and arrays that span processes.

Every process runs the same program (SPMD, "multi-controller"): it calls
:func:`initialize` first, then sees all ``jax.devices()`` of the job (only its
``jax.local_devices()`` are addressable) and builds a ``("data", "context")`` mesh over
them (:func:`lcjax.parallel.make_mesh`). A jitted step over global arrays is then one
program across the processes; XLA inserts the collectives (gloo on CPU, NCCL on GPU,
ICI/DCN on TPU).

Data: each process builds only the rows of the global batch its devices hold
(:func:`process_rows`), and :func:`global_batch` assembles the global ``jax.Array``
with ``jax.make_array_from_process_local_data``; a process whose devices hold only part
of the sequence axis (``context`` spans processes) gives its full rows and each device
takes its slice of ``T``. Parameters and optimizer state are replicated
(:func:`replicate`: every process holds the same values, e.g. initialised from the same
seed).

    initialize()                  # LCJAX_COORDINATOR / LCJAX_NUM_PROCESSES / LCJAX_PROCESS_ID
    mesh = make_mesh(data=2, context=4)          # 8 devices over, say, 2 processes
    index, count = process_rows(mesh)            # this process's share of the batch rows
    batch = global_batch(local_batch, mesh)      # [B / count, T] per process -> [B, T]

On CPU the cross-process collectives are gloo's (``jax_cpu_collectives_implementation``,
whose default in jax 0.10 is already ``"gloo"``), which is how the multi-process path is
tested on one machine over 127.0.0.1.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from lcjax.parallel.mesh import CONTEXT, DATA, RING, mesh_size, sequence_axes

__all__ = ["ENV_COORDINATOR", "ENV_NUM_PROCESSES", "ENV_PROCESS_ID", "global_batch",
           "initialize", "process_rows", "replicate"]

ENV_COORDINATOR = "LCJAX_COORDINATOR"
ENV_NUM_PROCESSES = "LCJAX_NUM_PROCESSES"
ENV_PROCESS_ID = "LCJAX_PROCESS_ID"
_JAX_ENV = "JAX_COORDINATOR_ADDRESS"  # JAX's own: jax.distributed.initialize() reads it
_ADDRESS = re.compile(r"^\[?[A-Za-z0-9_.:\-]+\]?:\d{1,5}$")


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, auto: bool = False,
               local_device_ids: Sequence[int] | None = None,
               initialization_timeout: int = 300) -> bool:
    """Starts JAX's multi-controller runtime (``jax.distributed.initialize``) if asked to.

    Call it in every process before anything touches a device. Each argument falls back
    to an environment variable: ``LCJAX_COORDINATOR`` (``host:port`` of process 0, which
    runs the coordination service), ``LCJAX_NUM_PROCESSES``, ``LCJAX_PROCESS_ID``. With
    none of the three set, it defers to JAX's own configuration when
    ``JAX_COORDINATOR_ADDRESS`` is set or ``auto`` is true: ``jax.distributed.initialize()``
    without arguments reads ``JAX_COORDINATOR_ADDRESS``/``JAX_NUM_PROCESSES``/
    ``JAX_PROCESS_ID`` or detects the cluster (Cloud TPU pod slices, SLURM, Open MPI,
    Kubernetes). Otherwise the run is single-process and nothing happens.

    Args:
      coordinator_address: ``"host:port"`` of process 0 (all processes give the same).
      num_processes: the number of processes ``N`` (1: nothing to start).
      process_id: this process's index in ``0 .. N - 1``.
      auto: with nothing given, let JAX detect the cluster.
      local_device_ids: restrict this process to these local devices (e.g. one GPU per
        process); default all.
      initialization_timeout: seconds to wait for all processes to connect.

    Returns:
      True if the runtime was started by this call (or already was), False for a
      single-process run.

    Raises:
      ValueError: some but not all of the three are given, a malformed address, or
        ``process_id`` outside ``0 .. num_processes - 1`` — before anything starts.
    """
    address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    count = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    index = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    if jax.distributed.is_initialized():
        return True
    if address is None and count is None and index is None:
        if auto or os.environ.get(_JAX_ENV):
            jax.distributed.initialize(local_device_ids=local_device_ids,
                                       initialization_timeout=initialization_timeout)
            return True
        return False
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or count < 1):
        raise ValueError(f"initialize: num_processes must be a positive int; got {count!r}")
    if count == 1 and index in (None, 0):
        return False
    missing = [name for name, v in (("coordinator_address", address),
                                    ("num_processes", count), ("process_id", index))
               if v is None]
    if missing:
        raise ValueError(
            f"initialize: a multi-process run needs coordinator_address, num_processes and "
            f"process_id (flags --coordinator/--num-processes/--process-id or "
            f"{ENV_COORDINATOR}/{ENV_NUM_PROCESSES}/{ENV_PROCESS_ID}); missing {missing} "
            f"(got coordinator_address={address!r}, num_processes={count!r}, "
            f"process_id={index!r})")
    if not _ADDRESS.match(address):
        raise ValueError(f"initialize: coordinator_address must be 'host:port'; got {address!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"initialize: process_id must be in 0 .. {count - 1} "
                         f"(num_processes={count}); got {index!r}")
    jax.distributed.initialize(address, count, index, local_device_ids=local_device_ids,
                               initialization_timeout=initialization_timeout)
    return True


def process_rows(mesh: Mesh, process_index: int | None = None) -> tuple[int, int]:
    """``(shard_index, shard_count)``: which block of the global batch rows a process holds.

    The batch axis is sharded over ``"data"``; a process holds the data-axis rows of the
    mesh where its devices sit. They must form one contiguous block of
    ``mesh_size(mesh, "data") / shard_count`` rows, the same size for every process
    (processes that share rows, e.g. when ``"context"`` spans processes, get the same
    index). The process then holds global batch rows
    ``[shard_index * B / shard_count, (shard_index + 1) * B / shard_count)`` — what
    ``lcjax.data.make_dataset(..., shard_index=, shard_count=)`` builds.

    Raises:
      ValueError: the mesh has no device of this process, or puts a process's devices on
        rows that are not one block of the common size.
    """
    pid = jax.process_index() if process_index is None else process_index
    devices = np.asarray(mesh.devices)
    if DATA in mesh.axis_names:
        devices = np.moveaxis(devices, mesh.axis_names.index(DATA), 0)
    else:
        devices = devices[None]
    rows_of = {}  # process -> sorted data-axis rows its devices are on
    for row in range(devices.shape[0]):
        for d in devices[row].reshape(-1):
            rows_of.setdefault(d.process_index, set()).add(row)
    if pid not in rows_of:
        raise ValueError(f"process_rows: the mesh has no device of process {pid}")
    sizes = {len(r) for r in rows_of.values()}
    size = len(rows_of[pid])
    for p, rows in rows_of.items():
        rows = sorted(rows)
        if (len(sizes) != 1 or rows != list(range(rows[0], rows[0] + size))
                or rows[0] % size):
            raise ValueError(
                f"process_rows: process {p} has devices on data-axis rows {rows} of "
                f"{devices.shape[0]}; each process must hold one block of the same size "
                f"(sizes {sorted(sizes)}): order the mesh's devices by process")
    rows = sorted(rows_of[pid])
    return rows[0] // size, devices.shape[0] // size


def _batch_spec(key: str, ndim: int, mesh) -> P:
    if ndim == 2 and key in ("inputs", "targets", "loss_mask", "weights", "positions",
                             "segment_ids"):
        return P(DATA, sequence_axes(mesh))
    return P(DATA)


def global_batch(batch: dict, mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows of a batch dict -> global arrays on ``mesh``.

    Token arrays (``inputs``, ``targets``, ``loss_mask``, ``weights``, ``positions``,
    ``segment_ids``: ``[B_local, T]``) are placed as ``P("data", "context")`` (with a
    ``"ring"`` axis: ``P("data", ("ring", "context"))``), any other
    key as ``P("data")`` on its leading axis. ``B_local`` rows are the process's block
    (:func:`process_rows`): the global batch has ``B = B_local * shard_count`` rows. In a
    single process ``B_local = B`` and this is ``jax.device_put`` with those shardings.

    Raises:
      ValueError: ``B`` not divisible by the ``data`` size or ``T`` by the ``context``
        size (naming the numbers), before anything is compiled.
    """
    _, count = process_rows(mesh)
    data = mesh_size(mesh, DATA)
    context = mesh_size(mesh, CONTEXT) * mesh_size(mesh, RING)
    out = {}
    for key, value in batch.items():
        value = np.asarray(value) if not isinstance(value, jax.Array) else value
        rows = value.shape[0] * count
        if rows % data:
            raise ValueError(f"batch[{key!r}]: the global batch of {rows} rows does not split "
                             f"over the mesh's data={data} devices")
        spec = _batch_spec(key, value.ndim, mesh)
        if spec != P(DATA) and value.shape[1] % context:
            raise ValueError(f"batch[{key!r}]: sequence length T={value.shape[1]} is not "
                             f"divisible by the mesh's context={context}")
        out[key] = jax.make_array_from_process_local_data(
            NamedSharding(mesh, spec), np.asarray(value), (rows, *value.shape[1:]))
    return out


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Every array leaf of ``tree`` replicated over ``mesh`` (``P()``), in any process.

    Each process must hold the same values (e.g. parameters initialised from the same
    seed); typed PRNG keys keep their implementation. Leaves that are not arrays pass.
    """
    sharding = NamedSharding(mesh, P())

    def put(x):
        if _is_key(x):
            return jax.random.wrap_key_data(put(jax.random.key_data(x)),
                                            impl=jax.random.key_impl(x))
        if not isinstance(x, jax.Array | np.ndarray | np.generic):
            return x
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(put, tree)
