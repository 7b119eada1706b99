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

__all__ = ["check_usp", "usp_attention", "usp_local"]


def check_usp(name: str, seq_len: int, batch: int, heads: int, kv_heads: int, mesh, *,
              ulysses_axis: str, ring_axis: str, data_axis: str | None, causal: bool,
              balance, attn) -> tuple[int, int, int, bool]:
    """The hybrid's rules (``ValueError`` naming the numbers): T a multiple of R U (2 R U
    when zigzag-balanced), B of the data size, Ulysses' head rules over U, a variant with a
    log-sum-exp. Returns ``(U, R, kv replication factor, zigzag)``."""
    u, r = axis_size(mesh, ulysses_axis), axis_size(mesh, ring_axis)
    zigzag = causal and balance == "zigzag" and r > 1
    check_length(name, seq_len, u * r, multiple=2 if zigzag else 1,
                 what=f"context size (ring {r} x ulysses {u})")
    check_batch(name, batch, axis_size(mesh, data_axis))
    repeats = check_heads(name, heads, kv_heads, u)
    if isinstance(attn, AttentionSpec) and not attn.features.lse:
        raise ValueError(f"{name}: variant {attn.name!r} gives no log-sum-exp "
                         "(features.lse=False), which the ring part merges partials with")
    return u, r, repeats, zigzag


def usp_local(q, k, v, *, ulysses_axis: str, ring_axis: str, ring_size: int, attn: Callable,
              causal: bool, zigzag: bool, kv_repeats: int = 1, scale=None, **options):
    """The hybrid inside ``shard_map``: local q [B, L, H, D], k, v [B, L, Hkv, D] (slice
    r U + u of the sequence on device (r, u)) -> local out [B, L, H, D]."""
    k, v = replicate_kv(k, kv_repeats), replicate_kv(v, kv_repeats)
    q, k, v = (seq_to_heads(x, ulysses_axis) for x in (q, k, v))  # chunk r of T/R, H/U heads
    if zigzag:
        q, k, v = (to_zigzag(x, ring_axis, ring_size) for x in (q, k, v))
    out = ring_local(q, k, v, axis=ring_axis, size=ring_size, attn=attn, causal=causal,
                     balance="zigzag" if zigzag else None, scale=scale, **options)
    if zigzag:
        out = from_zigzag(out, ring_axis, ring_size)
    return heads_to_seq(out, ulysses_axis)


def usp_attention(q, k, v, *, mesh=None, ulysses_axis: str, ring_axis: str,
                  causal: bool = False, variant: str | Callable = "softmax",
                  scale: float | None = None, balance: str | None = "zigzag",
                  data_axis: str | None = None, **options):
    """q [B, T, H, D], k, v [B, T, Hkv, D] sharded ``P(data_axis, (ring_axis, ulysses_axis),
    None, None)`` -> out [B, T, H, D], same sharding. ``variant`` must give a log-sum-exp."""
    name = "usp_attention"
    axes = (ulysses_axis, ring_axis) + (() if data_axis is None else (data_axis,))
    mesh = resolve_mesh(name, mesh, *axes)
    attn, check_vma = resolve_variant(variant, options)
    _, r, repeats, zigzag = check_usp(
        name, q.shape[1], q.shape[0], q.shape[2], k.shape[2], mesh, ulysses_axis=ulysses_axis,
        ring_axis=ring_axis, data_axis=data_axis, causal=causal, balance=balance, attn=attn)
    local = functools.partial(usp_local, ulysses_axis=ulysses_axis, ring_axis=ring_axis,
                              ring_size=r, attn=attn, causal=causal, zigzag=zigzag,
                              kv_repeats=repeats, scale=scale, **options)
    spec = P(data_axis, (ring_axis, ulysses_axis), None, None)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec,
                         check_vma=check_vma)(q, k, v)
