"""Public blockwise pieces shared by every blockwise attention variant.

A blockwise variant (``core.blockwise_attention``, ``entmax.entmax_attention``, ...) never
builds the [T, S] score matrix: it cuts queries into blocks of ``block_q`` rows and keys
into blocks of ``block_kv``, pads both lengths to block multiples (the padding is masked),
and folds a function over the (query block, key block) tiles that can hold a visible
pair. This module holds, once, what they all need:

- :class:`BlockPlan` — the static description of a call (a hashable ``custom_vjp``
  nondiff argument) and :func:`block_plan`, which builds and validates it;
- padding and layout: :func:`pad_axis`, :func:`pad_inputs` (grouped queries
  [B, Tp, Hkv, G, D], keys/values [B, Sp, Hkv, D]), :func:`group_queries`,
  :func:`ungroup`, :func:`rows_to_heads`;
- masking: :class:`Masking` and :func:`pad_masking` (explicit mask and segment ids
  padded to the blocks, and the ALiBi slopes of :func:`alibi_slopes_array`),
  :func:`block_scores` (the scaled float32 tile scores plus the ALiBi bias, with
  everything invisible at ``-inf``);
- causal and sliding-window block ranges: :func:`kv_block_range` and :func:`q_block_range`
  (tiles entirely above the causal diagonal or outside the window are never visited, so
  the work per query block is O(window), not O(S); fully visible tiles skip masking), and
  the folds over them, :func:`fold_kv_blocks` and :func:`fold_q_blocks`;
- :func:`match_varying`: loop carries built from constants take the varying mesh axes of
  the inputs, so the loops type-check inside ``jax.shard_map``.

Layouts: head-major tiles are qb [B, Hkv, G, bq, D] and kb [B, Hkv, bk, D]; tile scores
are [B, Hkv, G, bq, bk]. Query head h = kv_head · G + g (G = H / Hkv).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int

__all__ = [
    "BlockPlan",
    "Masking",
    "alibi_slopes_array",
    "block_plan",
    "block_scores",
    "fold_kv_blocks",
    "fold_q_blocks",
    "group_mask",
    "group_queries",
    "kv_block_range",
    "match_varying",
    "pad_axis",
    "pad_inputs",
    "pad_masking",
    "q_block_range",
    "rows_to_heads",
    "same_segment",
    "two_loops",
    "ungroup",
    "varying_axes",
]


# ----------------------------------------------------------------------------
# The plan
# ----------------------------------------------------------------------------
class BlockPlan(NamedTuple):
    """Static description of a blockwise call (hashable: a ``custom_vjp`` nondiff arg).

    ``block_q``/``block_kv`` are already clipped to the lengths; padded lengths are
    ``q_padded = nq·block_q`` ≥ ``q_len`` and ``kv_padded = nk·block_kv`` ≥ ``kv_len``.
    Causal means key j is visible to query i when j ≤ i + ``q_offset``; ``window =
    (left, right)`` (or None) that it is visible when p - left ≤ j ≤ p + right, p = i +
    ``q_offset`` (``local_window_size`` of ``jax.nn.dot_product_attention``).
    """

    scale: float
    causal: bool
    block_q: int
    block_kv: int
    q_len: int
    kv_len: int
    q_offset: int
    acc_dtype: str = "float32"
    window: tuple[int, int] | None = None

    @property
    def acc(self) -> jnp.dtype:
        return jnp.dtype(self.acc_dtype)

    @property
    def num_q_blocks(self) -> int:
        return -(-self.q_len // self.block_q)

    @property
    def num_kv_blocks(self) -> int:
        return -(-self.kv_len // self.block_kv)

    @property
    def q_padded(self) -> int:
        return self.num_q_blocks * self.block_q

    @property
    def kv_padded(self) -> int:
        return self.num_kv_blocks * self.block_kv


def block_plan(*, q_len: int, kv_len: int, head_dim: int, scale: float | None, causal: bool,
               block_q: int, block_kv: int, acc_dtype, q_offset: int = 0,
               window: tuple[int, int] | None = None,
               name: str = "attention") -> BlockPlan:
    """The :class:`BlockPlan` of a call: blocks clipped to the lengths, ``scale`` defaulting
    to 1/sqrt(head_dim), ``window`` a (left, right) pair of non-negative ints or None;
    ``ValueError`` naming ``name`` for non-positive block sizes or a bad window."""
    if block_q <= 0 or block_kv <= 0:
        raise ValueError(f"{name}: block sizes must be positive, got block_q={block_q}, "
                         f"block_kv={block_kv}")
    return BlockPlan(
        scale=1.0 / math.sqrt(head_dim) if scale is None else float(scale),
        causal=bool(causal), block_q=min(block_q, q_len), block_kv=min(block_kv, kv_len),
        q_len=q_len, kv_len=kv_len, q_offset=int(q_offset),
        acc_dtype=jnp.dtype(acc_dtype).name, window=_window_pair(window, name))


def _window_pair(window, name: str) -> tuple[int, int] | None:
    if window is None:
        return None
    if (not isinstance(window, tuple) or len(window) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 0
                       for w in window)):
        raise ValueError(f"{name}: the sliding window must be a pair (left, right) of "
                         f"non-negative ints, got {window!r}")
    return window


# ----------------------------------------------------------------------------
# Padding and grouped-query layout
# ----------------------------------------------------------------------------
def pad_axis(x: Array, axis: int, size: int, value=0) -> Array:
    """Pad ``x`` at the end of ``axis`` to length ``size`` with ``value``."""
    pad = size - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


def group_queries(q: Float[Array, "B T H D"], kv_heads: int) -> Float[Array, "B T Hkv G D"]:
    """[B, T, H, D] -> [B, T, Hkv, G, D] with query head h = kv_head * G + g."""
    b, t, h, d = q.shape
    return q.reshape(b, t, kv_heads, h // kv_heads, d)


def ungroup(x: Array) -> Array:
    """[B, T, Hkv, G, ...] -> [B, T, H, ...]."""
    b, t, hk, g = x.shape[:4]
    return x.reshape(b, t, hk * g, *x.shape[4:])


def rows_to_heads(x: Array, q_len: int) -> Array:
    """Per-row statistics [B, Hkv, G, Tp] -> [B, T, H] (padding rows dropped)."""
    b, hk, g = x.shape[:3]
    return jnp.moveaxis(x[..., :q_len].reshape(b, hk * g, q_len), 1, 2)


def group_mask(mask: Bool[Array, "b h T S"], kv_heads: int) -> Array:
    """Boolean [b, h, T, S] (b, h may be 1) -> [b, Hkv|1, G|1, T, S] for grouped scores."""
    b, h, t, s = mask.shape
    if h == 1:
        return mask[:, :, None]
    return mask.reshape(b, kv_heads, h // kv_heads, t, s)


def pad_inputs(plan: BlockPlan, q: Float[Array, "B T H D"], k: Float[Array, "B S Hkv D"],
               v: Float[Array, "B S Hkv Dv"]):
    """(q [B, Tp, Hkv, G, D] grouped, k [B, Sp, Hkv, D], v [B, Sp, Hkv, Dv]), zero-padded
    to the plan's block multiples."""
    qh = pad_axis(group_queries(q, k.shape[2]), 1, plan.q_padded)
    return qh, pad_axis(k, 1, plan.kv_padded), pad_axis(v, 1, plan.kv_padded)


# ----------------------------------------------------------------------------
# Masking
# ----------------------------------------------------------------------------
class Masking(NamedTuple):
    """Blockwise masking inputs, padded to the blocks (a pytree; any field may be None).

    mask: bool [b, h|1, Tp|1, Sp|1]; q_segment_ids: int [B, Tp]; kv_segment_ids: int [B, Sp].
    Padding is marked as not attendable (False / segment -1).
    alibi_slopes: float [H] (accumulation dtype), the ALiBi bias -m_h·|i + offset - j| added
    to every tile's scores (Press et al., 2022; 0 = no bias for that head); alibi_offset:
    int32 [] (may be traced, e.g. a KV-cache index), the position of query 0 relative to
    key 0 for the bias, on top of the plan's ``q_offset``. Neither masks anything.
    """

    mask: Array | None = None
    q_segment_ids: Array | None = None
    kv_segment_ids: Array | None = None
    alibi_slopes: Array | None = None
    alibi_offset: Array | None = None

    @property
    def dense(self) -> bool:
        """Whether any per-element masking is present (beyond causal and padding)."""
        return any(x is not None for x in (self.mask, self.q_segment_ids, self.kv_segment_ids))


def alibi_slopes_array(alibi_slopes, heads: int, *, dtype=jnp.float32,
                       name: str = "attention") -> Array | None:
    """The ``alibi_slopes`` option as a float array [heads] (None stays None).

    Accepts a sequence or array of shape [heads] (a slope per query head; 0 = no bias);
    ``ValueError`` naming ``name`` for another shape or a non-real dtype. Slopes are
    constants of the method: they get no gradient.
    """
    if alibi_slopes is None:
        return None
    arr = jnp.asarray(alibi_slopes)
    if arr.shape != (heads,) or not (jnp.issubdtype(arr.dtype, jnp.floating)
                                     or jnp.issubdtype(arr.dtype, jnp.integer)):
        raise ValueError(f"{name}: `alibi_slopes` must be a real array of shape [heads] = "
                         f"({heads},), got shape {arr.shape} and dtype {arr.dtype}")
    return lax.stop_gradient(arr.astype(dtype))


def same_segment(q_segment_ids: Int[Array, "B T"], kv_segment_ids: Int[Array, "B S"]
                 ) -> Bool[Array, "B T S"]:
    """[B, T, S]: query and key share a segment id; negative ids (padding) match nothing."""
    same = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
    return same & (q_segment_ids[:, :, None] >= 0) & (kv_segment_ids[:, None, :] >= 0)


def pad_masking(plan: BlockPlan, mask=None, q_segment_ids=None, kv_segment_ids=None, *,
                alibi_slopes=None, alibi_offset=0, heads: int | None = None,
                name: str = "attention") -> Masking:
    """The :class:`Masking` of a call: ``mask`` (bool, broadcastable to [B, H, T, S]) and
    segment ids padded to the plan's ``q_padded`` x ``kv_padded``; ``alibi_slopes``
    ([heads], see :func:`alibi_slopes_array`; ``heads`` is then required) and
    ``alibi_offset`` (int or int32 [], may be traced) for the ALiBi bias."""
    if alibi_slopes is not None:
        if heads is None:
            raise ValueError(f"{name}: pad_masking needs `heads` with `alibi_slopes`")
        alibi_slopes = alibi_slopes_array(alibi_slopes, heads, dtype=plan.acc, name=name)
        offset = jnp.asarray(alibi_offset)
        if offset.shape != () or not jnp.issubdtype(offset.dtype, jnp.integer):
            raise ValueError(f"{name}: `alibi_offset` must be an integer scalar, got shape "
                             f"{offset.shape} and dtype {offset.dtype}")
        alibi_offset = offset.astype(jnp.int32)
    else:
        alibi_offset = None
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError(f"{name}: pass both `q_segment_ids` and `kv_segment_ids`, or neither")
    tp, sp = plan.q_padded, plan.kv_padded
    if q_segment_ids is not None:
        q_segment_ids = pad_axis(jnp.asarray(q_segment_ids, jnp.int32), 1, tp, -1)
        kv_segment_ids = pad_axis(jnp.asarray(kv_segment_ids, jnp.int32), 1, sp, -1)
    if mask is not None:
        mask = jnp.asarray(mask)
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        t_dim = plan.q_len if mask.shape[2] != 1 else 1
        s_dim = plan.kv_len if mask.shape[3] != 1 else 1
        mask = jnp.broadcast_to(mask, tuple(mask.shape[:2]) + (t_dim, s_dim))
        if t_dim != 1:
            mask = pad_axis(mask, 2, tp, False)
        if s_dim != 1:
            mask = pad_axis(mask, 3, sp, False)
    return Masking(mask, q_segment_ids, kv_segment_ids, alibi_slopes, alibi_offset)


def _slice_mask(mask, qi, kj, plan: BlockPlan):
    """Dynamic [bq, bk] slice of a padded 4-D mask (size-1 dims stay size 1)."""
    starts = [0, 0, 0, 0]
    sizes = list(mask.shape)
    if mask.shape[2] != 1:
        starts[2], sizes[2] = qi * plan.block_q, plan.block_q
    if mask.shape[3] != 1:
        starts[3], sizes[3] = kj * plan.block_kv, plan.block_kv
    return lax.dynamic_slice(mask, starts, sizes)


def block_scores(plan: BlockPlan, qb: Float[Array, "B Hkv G bq D"],
                 kb: Float[Array, "B Hkv bk D"], masking: Masking, qi, kj, *,
                 masked: bool) -> Float[Array, "B Hkv G bq bk"]:
    """Scaled scores ``scale · qb · kbᵀ`` (accumulation dtype) of the tile (qi, kj), plus
    the ALiBi bias ``-m_h·|i + q_offset + alibi_offset - j|`` when ``masking.alibi_slopes``
    is set, with invisible pairs (key padding, above the causal diagonal, mask, other
    segment) at -inf. This is the one tile-score function of every blockwise variant.

    With ``masked=False`` the caller guarantees that every pair of the tile is visible
    (see :func:`kv_block_range`) and masking is skipped (the bias is still added).
    """
    s = jnp.einsum("bkgtd,bksd->bkgts", qb, kb, preferred_element_type=plan.acc)
    s = s * plan.acc.type(plan.scale)
    q_pos = qi * plan.block_q + jnp.arange(plan.block_q)
    k_pos = kj * plan.block_kv + jnp.arange(plan.block_kv)
    if masking.alibi_slopes is not None:
        hk, g = qb.shape[1], qb.shape[2]
        dist = jnp.abs(q_pos[:, None] + plan.q_offset + masking.alibi_offset - k_pos[None, :])
        slopes = masking.alibi_slopes.reshape(1, hk, g, 1, 1)
        s = s - slopes * dist.astype(plan.acc)[None, None, None]
    if not masked:
        return s
    valid = jnp.broadcast_to(k_pos[None, :] < plan.kv_len, (plan.block_q, plan.block_kv))
    if plan.causal:
        valid = valid & (k_pos[None, :] <= q_pos[:, None] + plan.q_offset)
    if plan.window is not None:
        left, right = plan.window
        p = q_pos[:, None] + plan.q_offset
        valid = valid & (k_pos[None, :] >= p - left) & (k_pos[None, :] <= p + right)
    keep = valid[None, None, None]
    if masking.mask is not None:
        keep = keep & group_mask(_slice_mask(masking.mask, qi, kj, plan), kb.shape[1])
    if masking.q_segment_ids is not None:
        qs = lax.dynamic_slice_in_dim(masking.q_segment_ids, qi * plan.block_q, plan.block_q,
                                      axis=1)
        ks = lax.dynamic_slice_in_dim(masking.kv_segment_ids, kj * plan.block_kv,
                                      plan.block_kv, axis=1)
        keep = keep & same_segment(qs, ks)[:, None, None]
    return jnp.where(keep, s, -jnp.inf)


# ----------------------------------------------------------------------------
# Causal block ranges and the folds over them
# ----------------------------------------------------------------------------
def kv_block_range(plan: BlockPlan, qi, masking: Masking):
    """(start, first masked key block, end) for query block ``qi``: key blocks
    [start, first) are fully visible (no masking needed), [first, end) need masking; blocks
    before ``start`` lie entirely left of the sliding window (start = 0 without one), blocks
    from ``end`` on entirely above the causal diagonal or right of the window, and are
    skipped. Python ints when neither causal nor windowed (statically empty loops are then
    not built). With a window every visited block is masked (first = start)."""
    if plan.window is not None:
        return _window_kv_range(plan, qi)
    first, end = _causal_kv_range(plan, qi, masking)
    return 0, first, end


def _window_kv_range(plan: BlockPlan, qi):
    """(start, start, end): the key blocks holding a key in [p - left, p + right] for a
    query p of block ``qi`` (and j ≤ p when causal)."""
    nk = plan.num_kv_blocks
    left, right = plan.window
    first_q = qi * plan.block_q + plan.q_offset
    # the last real row (padding rows see nothing)
    last_q = jnp.minimum(first_q + plan.block_q, plan.q_len + plan.q_offset) - 1
    reach = last_q if plan.causal else last_q + right
    start = jnp.clip((first_q - left) // plan.block_kv, 0, nk)
    end = jnp.clip(reach // plan.block_kv + 1, start, nk)
    return start, start, end


def _causal_kv_range(plan: BlockPlan, qi, masking: Masking):
    nk = plan.num_kv_blocks
    clean = 0 if masking.dense else plan.kv_len // plan.block_kv  # no key padding
    if not plan.causal:
        return min(clean, nk), nk
    last_q = qi * plan.block_q + plan.block_q - 1 + plan.q_offset
    end = jnp.clip(last_q // plan.block_kv + 1, 0, nk)
    if masking.dense:
        return 0, end
    first_q = qi * plan.block_q + plan.q_offset
    clean = jnp.clip((first_q + 1) // plan.block_kv, 0, clean)
    return jnp.minimum(clean, end), end


def q_block_range(plan: BlockPlan, kj, masking: Masking):
    """(start, first fully visible query block, stop) for key block ``kj``: query blocks
    [start, first) need masking, [first, stop) see the whole key block; blocks before
    ``start`` lie entirely above the causal diagonal (or right of the sliding window),
    blocks from ``stop`` on (stop = nq without a window) entirely left of the window. With
    a window every visited block is masked (first = stop)."""
    nq = plan.num_q_blocks
    if plan.window is not None:
        left, right = plan.window
        first_k = kj * plan.block_kv - plan.q_offset  # query rows p - q_offset that see it
        last_k = first_k + plan.block_kv - 1
        lo = first_k if plan.causal else first_k - right
        start = jnp.clip(lo // plan.block_q, 0, nq)
        last_row = jnp.minimum(last_k + left, plan.q_len - 1)  # padding rows see nothing
        stop = jnp.where(lo > last_row, start, jnp.clip(last_row // plan.block_q + 1, start, nq))
        return start, stop, stop
    start, first = _causal_q_range(plan, kj, masking)
    return start, first, nq


def _causal_q_range(plan: BlockPlan, kj, masking: Masking):
    nq = plan.num_q_blocks
    start = 0
    if plan.causal:
        start = jnp.clip((kj * plan.block_kv - plan.q_offset) // plan.block_q, 0, nq)
    if masking.dense:
        return start, nq
    last_k = kj * plan.block_kv + plan.block_kv - 1
    first = start
    if plan.causal:
        first = jnp.clip(-(-(last_k - plan.q_offset) // plan.block_q), start, nq)
    padded = (kj + 1) * plan.block_kv > plan.kv_len
    return start, jnp.where(padded, nq, first)


def two_loops(lo, mid, hi, body_a: Callable, body_b: Callable, carry):
    """``fori_loop(lo, mid, body_a)`` then ``fori_loop(mid, hi, body_b)``, omitting a loop
    whose bounds make it empty at trace time (Python ints, or the same traced value: less
    to compile)."""
    if not (mid is lo or isinstance(lo, int) and isinstance(mid, int) and mid <= lo):
        carry = lax.fori_loop(lo, mid, body_a, carry)
    if not (hi is mid or isinstance(mid, int) and isinstance(hi, int) and hi <= mid):
        carry = lax.fori_loop(mid, hi, body_b, carry)
    return carry


def _skip_dead(body: Callable, live):
    """``body(i, carry)`` where ``live[i]``, identity elsewhere (``lax.cond``)."""
    if live is None:
        return body
    return lambda i, carry: lax.cond(live[i], body, lambda i, c: c, i, carry)


def fold_kv_blocks(plan: BlockPlan, qi, qb: Float[Array, "B Hkv G bq D"],
                   k: Float[Array, "B Sp Hkv D"], masking: Masking,
                   body: Callable[[Any, Array, Any], Any], carry, *, live=None):
    """``carry = body(kj, scores [B, Hkv, G, bq, bk], carry)`` over the key blocks visible
    to query block ``qi`` (unmasked blocks first; blocks above the causal diagonal or
    outside the sliding window never visited). With ``live`` (bool [nk]), blocks with
    ``live[kj]`` False are skipped."""

    def step(kj, carry, masked):
        kb = lax.dynamic_slice_in_dim(k, kj * plan.block_kv, plan.block_kv, axis=1)
        s = block_scores(plan, qb, jnp.swapaxes(kb, 1, 2), masking, qi, kj, masked=masked)
        return body(kj, s, carry)

    start, first, end = kv_block_range(plan, qi, masking)
    return two_loops(start, first, end, _skip_dead(functools.partial(step, masked=False), live),
                     _skip_dead(functools.partial(step, masked=True), live), carry)


def fold_q_blocks(plan: BlockPlan, kj, masking: Masking,
                  body: Callable[[Any, Any, bool], Any], carry, *, live=None):
    """``carry = body(qi, carry, masked)`` over the query blocks that see key block ``kj``
    (masked ones first); with ``live`` (bool [nq]), blocks with ``live[qi]`` False are
    skipped."""
    start, first_clean, stop = q_block_range(plan, kj, masking)
    return two_loops(start, first_clean, stop,
                     _skip_dead(functools.partial(body, masked=True), live),
                     _skip_dead(functools.partial(body, masked=False), live), carry)


# ----------------------------------------------------------------------------
# shard_map: varying mesh axes of loop carries
# ----------------------------------------------------------------------------
def varying_axes(*arrays) -> tuple[str, ...]:
    """Mesh axes along which any of ``arrays`` varies inside ``jax.shard_map`` (empty
    outside it). Reads the aval's varying-manual-axes set (``vma`` in newer JAX,
    ``manual_axis_type.varying`` in 0.10)."""
    axes: set[str] = set()
    for x in jax.tree.leaves(arrays):
        aval = jax.typeof(x)
        vma = getattr(aval, "vma", None)
        if vma is None:
            vma = getattr(getattr(aval, "manual_axis_type", None), "varying", ())
        axes.update(vma)
    return tuple(sorted(axes))


def match_varying(tree, *refs):
    """Mark loop-carry initial values built from constants as varying over the same
    mesh axes as ``refs``, so ``lax.fori_loop``/``while_loop``/``scan`` type-check under
    ``jax.shard_map`` (a no-op outside it)."""
    axes = set(varying_axes(*refs))
    if not axes:
        return tree

    def cast(x):
        missing = tuple(sorted(axes - set(varying_axes(x))))
        return lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(cast, tree)
