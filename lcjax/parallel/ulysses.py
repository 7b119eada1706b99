"""DeepSpeed-Ulysses sequence parallelism (Jacobs et al., 2023) in ``jax.shard_map``.

Each of the C devices of the ``"context"`` axis holds a contiguous slice of the sequence,
q: [B, T/C, H, D], k, v: [B, T/C, Hkv, D]. One all-to-all per tensor re-shards them from
sequence to heads,

    all_to_all(x, split heads, gather sequence):  [B, T/C, H, D] -> [B, T, H/C, D],

so device r holds heads [r H/C, (r+1) H/C) over the whole sequence and runs any
registered attention variant on them unchanged (causal masks, segment ids and GQA
are those of a full-length call). A second all-to-all takes the output back to the
sequence layout, [B, T, H/C, D] -> [B, T/C, H, D].

Head order. The tiled all-to-all cuts the head axis into C contiguous chunks, so device
r's query heads h ∈ [r H/C, (r+1) H/C) use kv heads h // G (G = H/Hkv) ∈
[r Hkv/C, (r+1) Hkv/C) — exactly the kv chunk it receives when C divides Hkv: standard
GQA, no permutation of heads or weights. When Hkv < C (C a multiple of Hkv), each kv
head is repeated R = C/Hkv times before the all-to-all (``jnp.repeat`` along heads, whose
transpose sums the copies' gradients), so device r gets kv head r // R, the one its
H/C query heads use.

Public code this follows in spirit: MaxText's ``ulysses_attention`` (shard_map,
``lax.all_to_all(..., tiled=True)``); the kv replication is what verl users ask for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from lcjax.parallel.common import resolve_mesh, resolve_variant
from lcjax.parallel.mesh import CONTEXT, DATA
from lcjax.parallel.validation import axis_size, check_batch, check_heads, check_length

__all__ = ["heads_to_seq", "replicate_kv", "seq_to_heads", "ulysses_attention",
           "ulysses_local"]


def seq_to_heads(x: jax.Array, axis: str) -> jax.Array:
    """Inside shard_map: [B, L, h, D] (sequence slice r) -> [B, C L, h / C, D] (head
    chunk r of the whole sequence), one tiled all-to-all over ``axis``."""
    return lax.all_to_all(x, axis, split_axis=2, concat_axis=1, tiled=True)


def heads_to_seq(x: jax.Array, axis: str) -> jax.Array:
    """Inverse of :func:`seq_to_heads`: [B, C L, h / C, D] -> [B, L, h, D]."""
    return lax.all_to_all(x, axis, split_axis=1, concat_axis=2, tiled=True)


def replicate_kv(x: jax.Array, repeats: int) -> jax.Array:
    """[B, L, Hkv, D] -> [B, L, Hkv·R, D], head e·R + ρ = head e (gradients summed)."""
    return x if repeats == 1 else jnp.repeat(x, repeats, axis=2)


def ulysses_local(q, k, v, *, axis: str, attn: Callable, causal: bool, scale=None,
                  q_segment_ids=None, kv_segment_ids=None, kv_repeats: int = 1, **options):
    """Ulysses inside ``shard_map`` over ``axis``: local q [B, L, H, D], k, v [B, L, Hkv, D]
    (sequence slices, in device order) -> local out [B, L, H, D]. Segment ids (local
    [B, L]) are all-gathered to the full sequence."""
    k, v = replicate_kv(k, kv_repeats), replicate_kv(v, kv_repeats)
    qh, kh, vh = (seq_to_heads(x, axis) for x in (q, k, v))
    if q_segment_ids is not None:
        gather = functools.partial(lax.all_gather, axis_name=axis, axis=1, tiled=True)
        options.update(q_segment_ids=gather(q_segment_ids),
                       kv_segment_ids=gather(kv_segment_ids))
    out = attn(qh, kh, vh, causal=causal, scale=scale, **options)
    return heads_to_seq(out, axis)


def check_ulysses(name, q_shape, k_shape, mesh, data_axis, context_axis) -> int:
    """Shapes against the mesh (``ValueError``s); returns the kv replication factor."""
    c = axis_size(mesh, context_axis)
    check_length(name, q_shape[1], c)
    check_batch(name, q_shape[0], axis_size(mesh, data_axis))
    return check_heads(name, q_shape[2], k_shape[2], c)


def ulysses_attention(q, k, v, *, mesh=None, causal: bool = False,
                      variant: str | Callable = "softmax", scale: float | None = None,
                      q_segment_ids=None, kv_segment_ids=None, data_axis: str | None = DATA,
                      context_axis: str = CONTEXT, **options):
    """Ulysses attention of global q [B, T, H, D], k, v [B, T, Hkv, D] sequence-sharded
    as ``P(data_axis, context_axis, None, None)`` -> out [B, T, H, D], same sharding.

    ``variant``: a registry name or callable under the attention contract; ``options``
    go to it unchanged (e.g. ``block_q``, ``alpha`` as a number, ``implementation``).
    ``mesh``: default the one set by ``jax.set_mesh``. Self-attention only (the kv length
    is T). Raises ``ValueError`` before tracing for shapes the mesh cannot split
    (:mod:`lcjax.parallel.validation`).
    """
    name = "ulysses_attention"
    axes = (context_axis,) if data_axis is None else (data_axis, context_axis)
    mesh = resolve_mesh(name, mesh, *axes)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"{name}: self-attention only: kv length {k.shape[1]} != q length "
                         f"{q.shape[1]}")
    repeats = check_ulysses(name, q.shape, k.shape, mesh, data_axis, context_axis)
    attn, check_vma = resolve_variant(variant, options)
    spec = P(data_axis, context_axis, None, None)
    ids_spec = P(data_axis, context_axis)
    local = functools.partial(ulysses_local, axis=context_axis, attn=attn, causal=causal,
                              scale=scale, kv_repeats=repeats, **options)
    if q_segment_ids is None:
        fn = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec,
                           check_vma=check_vma)
        return fn(q, k, v)
    fn = jax.shard_map(lambda q, k, v, a, b: local(q, k, v, q_segment_ids=a, kv_segment_ids=b),
                       mesh=mesh, in_specs=(spec,) * 3 + (ids_spec,) * 2, out_specs=spec,
                       check_vma=check_vma)
    return fn(q, k, v, q_segment_ids, kv_segment_ids)
