"""Ring attention (Liu, Zaharia & Abbeel, 2023) in ``jax.shard_map``.

Each of the C devices of the ``"context"`` axis holds a slice of the sequence of q, k, v
(all heads). In C steps, device r attends its queries to the key/value block it holds,
then passes that block to device r + 1 with ``lax.ppermute`` (the send of the next block
is issued beside the current block's attention, so XLA may overlap them); at step s it
holds the block of device j = (r - s) mod C. The partial results are exact attentions
over disjoint key sets, combined by :func:`lcjax.attention.core.merge_attention`:

    out = Σ_j e^{lse_j - L} out_j,   L = log Σ_j e^{lse_j}.

Causal load balancing (``balance="zigzag"``, the default for causal calls; Brandon et
al., 2023 call the striped relative of it "striped attention"): the sequence is cut
into 2C chunks and device r holds chunks r and 2C - 1 - r, so every device does the
same work at every step: step 0 its own two chunks, causally; at a step whose block
comes from j < r, all its queries against the block's first chunk; from j > r, its
second chunk of queries against the whole block. Inputs and outputs keep the natural
contiguous layout ``P(data, context)``: two ``ppermute``s move the half-slices into the
zigzag layout and two move the output back. ``balance=None`` keeps the contiguous
layout (step j < r: full; j > r: skipped — the last device does C times the work of
the first).

Backward (``jax.custom_vjp``, as in the FlashAttention-2 / ring-attention backward):
the forward saves only the local q, k, v, output and L; the backward passes the blocks
around the ring again together with their gradient accumulators dk, dv, recomputes each
step's partial (out_j, lse_j) and back-propagates it with cotangents
``d out_j = w_j dO`` and ``d lse_j = w_j (Σ_d dO (out_j - out) + dL)``, w_j = e^{lse_j - L}
(the exact chain rule of the merge), so memory stays one block per step. After C sends,
dk and dv are back on the device that owns the block.

The variant must return its log-sum-exp (``features.lse``: "softmax", "blockwise");
α-entmax has no such merge and is rejected (use Ulysses or UPipe for it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from lcjax.attention import AttentionSpec
from lcjax.attention.core import match_varying, merge_attention
from lcjax.parallel.common import resolve_mesh, resolve_variant
from lcjax.parallel.mesh import CONTEXT, DATA
from lcjax.parallel.validation import axis_size, check_batch, check_length

__all__ = ["BALANCES", "from_zigzag", "ring_attention", "ring_local", "ring_shift",
           "to_zigzag", "zigzag_chunks"]

BALANCES = ("zigzag", None)


def zigzag_chunks(rank: int, size: int) -> tuple[int, int]:
    """Global chunks (of 2 C) device ``rank`` holds in the zigzag layout."""
    return rank, 2 * size - 1 - rank


def _zigzag_dest(chunk: int, size: int) -> int:
    return chunk if chunk < size else 2 * size - 1 - chunk


def to_zigzag(x: jax.Array, axis: str, size: int) -> jax.Array:
    """Inside shard_map: the contiguous slice [B, L, ...] (chunks 2r, 2r + 1 of 2C) ->
    the zigzag slice (chunks r, 2C - 1 - r), by two ppermutes of half-slices."""
    half = x.shape[1] // 2
    even, odd = x[:, :half], x[:, half:]
    even = lax.ppermute(even, axis, [(r, _zigzag_dest(2 * r, size)) for r in range(size)])
    odd = lax.ppermute(odd, axis, [(r, _zigzag_dest(2 * r + 1, size)) for r in range(size)])
    r_even = lax.axis_index(axis) % 2 == 0  # then chunk r is even: it came in `even`
    first, second = jnp.where(r_even, even, odd), jnp.where(r_even, odd, even)
    return jnp.concatenate([first, second], axis=1)


def from_zigzag(x: jax.Array, axis: str, size: int) -> jax.Array:
    """Inverse of :func:`to_zigzag`."""
    half = x.shape[1] // 2
    first, second = x[:, :half], x[:, half:]
    r_even = lax.axis_index(axis) % 2 == 0
    even, odd = jnp.where(r_even, first, second), jnp.where(r_even, second, first)

    def even_chunk(r):
        return r if r % 2 == 0 else 2 * size - 1 - r

    def odd_chunk(r):
        return 2 * size - 1 - r if r % 2 == 0 else r

    even = lax.ppermute(even, axis, [(r, even_chunk(r) // 2) for r in range(size)])
    odd = lax.ppermute(odd, axis, [(r, odd_chunk(r) // 2) for r in range(size)])
    return jnp.concatenate([even, odd], axis=1)


def ring_shift(tree, axis: str, size: int):
    """Inside shard_map: every array of ``tree`` moves from device i to i + 1 (mod C)."""
    perm = [(i, (i + 1) % size) for i in range(size)]
    return jax.tree.map(lambda x: lax.ppermute(x, axis, perm), tree)


def _empty(q, v, *refs):
    """(zeros [B, T, H, Dv], lse -inf [B, T, H]): the attention to no key, varying over
    the mesh axes of ``refs`` (so lax.switch / scan branches agree)."""
    b, t, h = q.shape[:3]
    return match_varying((jnp.zeros((b, t, h, v.shape[-1]), q.dtype),
                          jnp.full((b, t, h), -jnp.inf, jnp.float32)), q, v, *refs)


def _step_fn(attn: Callable, causal: bool, balance, scale, options, axis: str, size: int):
    """(branches, index): ``branches[index(s)](q, k, v) -> (out_s, lse_s)`` is the
    attention of the local queries to the block held at step s (from device
    (r - s) mod C)."""

    def call(q, k, v, c):
        out, lse = attn(q, k, v, causal=c, scale=scale, return_lse=True, **options)
        return out, lse.astype(jnp.float32)

    if not causal:
        return (lambda q, k, v: call(q, k, v, False),), None

    def diagonal(q, k, v):
        return call(q, k, v, True)

    def skip(q, k, v):
        return _empty(q, v, k)

    def full(q, k, v):
        return call(q, k, v, False)

    def first_kv_chunk(q, k, v):  # zigzag, block from j < r
        half = k.shape[1] // 2
        return call(q, k[:, :half], v[:, :half], False)

    def second_q_chunk(q, k, v):  # zigzag, block from j > r
        half = q.shape[1] // 2
        out, lse = call(q[:, half:], k, v, False)
        zo, zl = _empty(q[:, :half], v, k)
        return jnp.concatenate([zo, out], axis=1), jnp.concatenate([zl, lse], axis=1)

    later = (first_kv_chunk, second_q_chunk) if balance == "zigzag" else (full, skip)

    def index(s):
        r = lax.axis_index(axis)
        j = (r - s) % size
        return jnp.where(s == 0, 0, jnp.where(j < r, 1, 2))

    return (diagonal, *later), index


def _by_branch(branches, index, s, *args):
    """``branches[index(s)](*args)`` (one branch: called directly)."""
    if index is None:
        return branches[0](*args)
    return lax.switch(index(s), branches, *args)


def ring_local(q, k, v, *, axis: str, size: int, attn: Callable, causal: bool,
               balance="zigzag", scale=None, return_lse: bool = False, **options):
    """Ring attention inside ``shard_map`` over ``axis`` (``size`` devices): local q
    [B, L, H, D], k, v [B, L, Hkv, D] in the layout ``balance`` names (zigzag: chunks
    r, 2C-1-r; None: contiguous) -> out [B, L, H, D] (and the float32 lse [B, L, H])."""
    branches, index = _step_fn(attn, causal, balance, scale, options, axis, size)

    def forward(q, k, v):
        out, lse = _empty(q, v, k)
        out = out.astype(jnp.float32)

        def body(carry, s):
            out, lse, kv = carry
            nxt = ring_shift(kv, axis, size)  # sent while this block is attended
            o_s, l_s = _by_branch(branches, index, s, q, *kv)
            out, lse = merge_attention(out, lse, o_s.astype(jnp.float32), l_s)
            return (out, lse, nxt), None

        (out, lse, _), _ = lax.scan(body, (out, lse, (k, v)), jnp.arange(size))
        return out.astype(q.dtype), lse

    @jax.custom_vjp
    def ring(q, k, v):
        return forward(q, k, v)

    def ring_fwd(q, k, v):
        out, lse = forward(q, k, v)
        return (out, lse), (q, k, v, out, lse)

    def ring_bwd(res, cot):
        q, k, v, out, lse = res
        d_out, d_lse = cot
        d_out = d_out.astype(jnp.float32)
        lse_safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
        zeros = lambda x: match_varying(jnp.zeros(x.shape, jnp.float32), q, k, v, d_out)
        out32 = out.astype(jnp.float32)

        def step_grads(fn):
            """The step's (dq, dk, dv), its pullback inside the branch (so a switch keeps
            no residuals of the other branches)."""

            def grads(q, k, v):
                (o_s, l_s), pull = jax.vjp(fn, q, k, v)
                w = jnp.where(jnp.isfinite(l_s), jnp.exp(l_s - lse_safe), 0.0)
                d_o = (w[..., None] * d_out).astype(o_s.dtype)
                d_l = w * (jnp.sum(d_out * (o_s.astype(jnp.float32) - out32), axis=-1)
                           + d_lse)
                return match_varying(pull((d_o, d_l)), q, k, v, d_out)

            return grads

        grad_branches = tuple(step_grads(fn) for fn in branches)

        def body(carry, s):
            kv, dkv, dq = carry
            dq_s, dk_s, dv_s = _by_branch(grad_branches, index, s, q, *kv)
            dkv = (dkv[0] + dk_s.astype(jnp.float32), dkv[1] + dv_s.astype(jnp.float32))
            kv, dkv = ring_shift((kv, dkv), axis, size)  # after C shifts: home again
            return (kv, dkv, dq + dq_s.astype(jnp.float32)), None

        init = ((k, v), (zeros(k), zeros(v)), zeros(q))
        (_, (dk, dv), dq), _ = lax.scan(body, init, jnp.arange(size))
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)

    ring.defvjp(ring_fwd, ring_bwd)
    out, lse = ring(q, k, v)
    return (out, lse) if return_lse else out


def ring_attention(q, k, v, *, mesh=None, causal: bool = False,
                   variant: str | Callable = "softmax", scale: float | None = None,
                   balance: str | None = "zigzag", data_axis: str | None = DATA,
                   context_axis: str = CONTEXT, **options):
    """Ring attention of global q [B, T, H, D], k, v [B, T, Hkv, D] sharded as
    ``P(data_axis, context_axis, None, None)`` (natural token order) -> out [B, T, H, D]
    in the same sharding.

    ``balance``: "zigzag" (causal load balancing; needs T a multiple of 2C) or None;
    ignored when not causal. ``variant`` must return a log-sum-exp (``return_lse``);
    ``options`` go to it. ``mesh``: default the one set by ``jax.set_mesh``.
    """
    name = "ring_attention"
    axes = (context_axis,) if data_axis is None else (data_axis, context_axis)
    mesh = resolve_mesh(name, mesh, *axes)
    if balance not in BALANCES:
        raise ValueError(f"{name}: `balance` must be one of {BALANCES}, got {balance!r}")
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"{name}: self-attention only: kv length {k.shape[1]} != q length "
                         f"{q.shape[1]}")
    c = axis_size(mesh, context_axis)
    zigzag = causal and balance == "zigzag" and c > 1
    check_length(name, q.shape[1], c, multiple=2 if zigzag else 1)
    check_batch(name, q.shape[0], axis_size(mesh, data_axis))
    attn, check_vma = resolve_variant(variant, options)
    if isinstance(attn, AttentionSpec) and not attn.features.lse:
        raise ValueError(f"{name}: variant {attn.name!r} gives no log-sum-exp "
                         f"(features.lse=False), which ring attention merges partials "
                         f"with; use ulysses_attention or upipe for it")
    local = functools.partial(ring_local, axis=context_axis, size=c, attn=attn,
                              causal=causal, balance="zigzag" if zigzag else None,
                              scale=scale, **options)

    def run(q, k, v):
        if zigzag:
            q, k, v = (to_zigzag(x, context_axis, c) for x in (q, k, v))
        out = local(q, k, v)
        return from_zigzag(out, context_axis, c) if zigzag else out

    spec = P(data_axis, context_axis, None, None)
    return jax.shard_map(run, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec,
                         check_vma=check_vma)(q, k, v)
