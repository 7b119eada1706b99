"""Hybrid (USP-style; Fang & Zhao, 2024, "USP: a unified sequence parallelism approach")
context parallelism: Ulysses over one mesh axis, ring attention over another.

The sequence is sharded over both axes, ring-major: device (r, u) of a (ring R, ulysses U)
grid holds slice r·U + u of T/(R U). An all-to-all over the Ulysses axis
(:func:`lcjax.parallel.ulysses.seq_to_heads`) gives each device heads [u H/U, (u+1) H/U)
of the contiguous chunk r of T/R; ring attention (:func:`lcjax.parallel.ring.ring_local`,
zigzag-balanced when causal) runs over the ring axis on those heads; the inverse
all-to-all brings the output back. kv heads follow Ulysses' rules over U (replicated when
Hkv < U).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
from jax.sharding import PartitionSpec as P

from lcjax.attention import AttentionSpec
from lcjax.parallel.common import resolve_mesh, resolve_variant
from lcjax.parallel.ring import from_zigzag, ring_local, to_zigzag
from lcjax.parallel.ulysses import heads_to_seq, replicate_kv, seq_to_heads
from lcjax.parallel.validation import axis_size, check_batch, check_heads, check_length

__all__ = ["usp_attention"]


def usp_attention(q, k, v, *, mesh=None, ulysses_axis: str, ring_axis: str,
                  causal: bool = False, variant: str | Callable = "softmax",
                  scale: float | None = None, balance: str | None = "zigzag",
                  data_axis: str | None = None, **options):
    """q [B, T, H, D], k, v [B, T, Hkv, D] sharded ``P(data_axis, (ring_axis, ulysses_axis),
    None, None)`` -> out [B, T, H, D], same sharding. ``variant`` must give a log-sum-exp."""
    name = "usp_attention"
    axes = (ulysses_axis, ring_axis) + (() if data_axis is None else (data_axis,))
    mesh = resolve_mesh(name, mesh, *axes)
    u, r = axis_size(mesh, ulysses_axis), axis_size(mesh, ring_axis)
    zigzag = causal and balance == "zigzag" and r > 1
    check_length(name, q.shape[1], u * r, multiple=2 if zigzag else 1,
                 what=f"context size {r} (ring) x {u} (ulysses)")
    check_batch(name, q.shape[0], axis_size(mesh, data_axis))
    repeats = check_heads(name, q.shape[2], k.shape[2], u)
    attn, check_vma = resolve_variant(variant, options)
    if isinstance(attn, AttentionSpec) and not attn.features.lse:
        raise ValueError(f"{name}: variant {attn.name!r} gives no log-sum-exp "
                         "(features.lse=False), which the ring part merges partials with")
    ring = functools.partial(ring_local, axis=ring_axis, size=r, attn=attn, causal=causal,
                             balance="zigzag" if zigzag else None, scale=scale, **options)

    def local(q, k, v):
        k, v = replicate_kv(k, repeats), replicate_kv(v, repeats)
        q, k, v = (seq_to_heads(x, ulysses_axis) for x in (q, k, v))  # chunk r of T/R
        if zigzag:
            q, k, v = (to_zigzag(x, ring_axis, r) for x in (q, k, v))
        out = ring(q, k, v)
        if zigzag:
            out = from_zigzag(out, ring_axis, r)
        return heads_to_seq(out, ulysses_axis)

    spec = P(data_axis, (ring_axis, ulysses_axis), None, None)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec,
                         check_vma=check_vma)(q, k, v)
