"""Attention core: validation, masks, grouped-query layout, reference attention,
blockwise online-softmax attention with log-sum-exp, and LSE merging.

Every attention variant in lcjax follows one contract (see DESIGN.md)::

    out = variant(q, k, v, *, causal=False, mask=None, scale=None, **options)
    q: [B, T, H, D]   k, v: [B, S, Hkv, D]   H % Hkv == 0   ->  out: [B, T, H, D]

``mask`` is boolean, broadcastable to [B, H, T, S], True = may attend. Softmax
statistics are float32 whatever the input dtype; a query row with nothing to attend
to returns zeros (and log-sum-exp ``-inf``), never NaN.

The blockwise path is the online softmax of Milakov & Gimelshein (2018) as used by
FlashAttention (Dao et al., 2022): for each query block, running max ``m``, running
normaliser ``l`` and running numerator ``acc`` are updated over key blocks,

    m' = max(m, rowmax(S_j)),  l' = e^{m-m'} l + rowsum(e^{S_j - m'}),
    acc' = e^{m-m'} acc + e^{S_j - m'} V_j,   out = acc / l,   lse = m + log l,

so the [T, S] score matrix is never built for the whole sequence. Its gradient is a
``jax.custom_vjp`` that recomputes the probabilities block by block from the saved
log-sum-exp (the FlashAttention-2 backward).

This module is the one place for masks, the reference attention and the LSE merge;
every other variant calls into it.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from lcjax.attention.blocks import (
    BlockPlan,
    Masking,
    alibi_slopes_array,
    block_plan,
    block_scores,
    fold_kv_blocks,
    fold_q_blocks,
    group_mask,
    group_queries,
    match_varying,
    pad_axis,
    pad_inputs,
    pad_masking,
    rows_to_heads,
    same_segment,
    ungroup,
    varying_axes,
)

__all__ = [
    "AttentionShapes",
    "validate_qkv",
    "causal_mask",
    "window_mask",
    "window_size",
    "validate_bias",
    "block_causal_mask",
    "segment_mask",
    "lengths_to_segment_ids",
    "build_mask",
    "alibi_bias",
    "default_scale",
    "stat_dtype",
    "varying_axes",
    "match_varying",
    "causal_linear_sums",
    "group_queries",
    "ungroup",
    "dot_product_attention",
    "grouped_scores",
    "softmax_rows",
    "blockwise_attention",
    "blockwise_attention_bwd",
    "merge_attention",
]


# ----------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------
class AttentionShapes(NamedTuple):
    """Sizes of one attention call: batch, q_len, heads, head_dim, kv_len, kv_heads, value dim."""

    batch: int
    q_len: int
    heads: int
    head_dim: int
    kv_len: int
    kv_heads: int
    value_dim: int

    @property
    def groups(self) -> int:
        return self.heads // self.kv_heads


def validate_qkv(q, k, v, *, mask=None, name: str = "attention") -> AttentionShapes:
    """Check the attention contract and return the sizes; raise ``ValueError`` otherwise."""
    for arg, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(
                f"{name}: `{arg}` must be rank 4 [batch, len, heads, head_dim], "
                f"got shape {getattr(x, 'shape', None)}"
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name}: `{arg}` must be floating point, got dtype {x.dtype}")
    b, t, h, d = q.shape
    bk, s, hk, dk = k.shape
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"{name}: `k` and `v` must agree on [batch, kv_len, kv_heads], got k {k.shape}, "
            f"v {v.shape}"
        )
    if bk != b:
        raise ValueError(f"{name}: batch of `q` {q.shape} and `k` {k.shape} differ")
    if dk != d:
        raise ValueError(f"{name}: head_dim of `q` {q.shape} and `k` {k.shape} differ")
    if hk == 0 or h % hk:
        raise ValueError(
            f"{name}: heads of `q` ({h}) must be a multiple of kv_heads of `k` ({hk}); "
            f"got q {q.shape}, k {k.shape}"
        )
    if mask is not None:
        mask_shape = jnp.shape(mask)
        if len(mask_shape) > 4:
            raise ValueError(f"{name}: `mask` has rank {len(mask_shape)} > 4: {mask_shape}")
        full = (b, h, t, s)
        padded = (1,) * (4 - len(mask_shape)) + tuple(mask_shape)
        for got, want in zip(padded, full):
            if got not in (1, want):
                raise ValueError(
                    f"{name}: `mask` of shape {mask_shape} does not broadcast to "
                    f"[batch, heads, q_len, kv_len] = {list(full)}"
                )
        if jnp.result_type(mask) != jnp.bool_:
            raise ValueError(f"{name}: `mask` must be boolean, got dtype {jnp.result_type(mask)}")
    return AttentionShapes(b, t, h, d, s, hk, v.shape[-1])


def stat_dtype(*arrays) -> jnp.dtype:
    """Dtype of softmax statistics: float32 for 16/32-bit inputs, float64 for float64."""
    return jnp.promote_types(jnp.result_type(*arrays), jnp.float32)


def default_scale(head_dim: int, scale: float | None) -> float:
    """``scale`` or 1/sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


# ----------------------------------------------------------------------------
# Masks (True = may attend)
# ----------------------------------------------------------------------------
def causal_mask(q_len: int, kv_len: int, *, q_offset=0) -> jax.Array:
    """[q_len, kv_len] mask: query i (absolute position i + q_offset) sees keys j <= i + q_offset.

    ``q_offset=0`` is the top-left alignment of ``jax.nn.dot_product_attention``;
    ``q_offset = kv_len - q_len`` aligns the last query with the last key (decoding).
    """
    q_pos = jnp.arange(q_len)[:, None] + q_offset
    return jnp.arange(kv_len)[None, :] <= q_pos


def window_size(local_window_size, *, name: str = "attention") -> tuple[int, int] | None:
    """``local_window_size`` as ``(left, right)`` (None stays None), as in
    ``jax.nn.dot_product_attention``: an int w means (w, w). ``ValueError`` naming ``name``
    and the value for anything but non-negative Python ints."""
    if local_window_size is None:
        return None
    pair = ((local_window_size, local_window_size) if not isinstance(local_window_size,
                                                                      (tuple, list))
            else tuple(local_window_size))
    if len(pair) != 2 or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 0
                                 for w in pair):
        raise ValueError(f"{name}: `local_window_size` must be a non-negative int or a pair "
                         f"(left, right) of them, got {local_window_size!r}")
    return int(pair[0]), int(pair[1])


def window_mask(q_len: int, kv_len: int, window: tuple[int, int], *, q_offset=0) -> jax.Array:
    """[q_len, kv_len] sliding-window mask: query i (absolute position p = i + q_offset)
    sees keys j with p - left <= j <= p + right (``window = (left, right)``; the
    ``local_window_size`` of ``jax.nn.dot_product_attention``, top-left aligned at
    ``q_offset=0``). With ``causal`` as well, a query sees its ``left`` predecessors and
    itself."""
    left, right = window
    q_pos = jnp.arange(q_len)[:, None] + q_offset
    k_pos = jnp.arange(kv_len)[None, :]
    return (k_pos >= q_pos - left) & (k_pos <= q_pos + right)


def validate_bias(bias, shapes: AttentionShapes, *, name: str = "attention") -> None:
    """``bias`` must be a real array of rank <= 4 broadcastable to [B, H, T, S] (the
    additive logit bias of ``jax.nn.dot_product_attention``); ``ValueError`` naming the
    shapes otherwise."""
    if bias is None:
        return
    shape = tuple(jnp.shape(bias))
    full = (shapes.batch, shapes.heads, shapes.q_len, shapes.kv_len)
    padded = (1,) * (4 - len(shape)) + shape
    if len(shape) > 4 or any(got not in (1, want) for got, want in zip(padded, full)):
        raise ValueError(f"{name}: `bias` of shape {list(shape)} does not broadcast to "
                         f"[batch, heads, q_len, kv_len] = {list(full)}")
    if not jnp.issubdtype(jnp.result_type(bias), jnp.floating):
        raise ValueError(f"{name}: `bias` must be floating point, got dtype "
                         f"{jnp.result_type(bias)}")


def block_causal_mask(q_len: int, kv_len: int, block_size: int, *, q_offset=0,
                      own_block: bool = True) -> jax.Array:
    """[q_len, kv_len] block-causal mask: query i (absolute position i + q_offset) sees
    key j iff ``j // block_size <= (i + q_offset) // block_size`` — every earlier block and
    the whole of its own block (bidirectional inside a block, as in block diffusion,
    Arriola et al., ICLR 2025). ``own_block=False`` gives the strict version ``<``
    (earlier blocks only). With ``block_size=1`` it is :func:`causal_mask`."""
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_causal_mask: `block_size` must be a positive int, "
                         f"got {block_size!r}")
    q_block = (jnp.arange(q_len)[:, None] + q_offset) // block_size
    kv_block = jnp.arange(kv_len)[None, :] // block_size
    return kv_block <= q_block if own_block else kv_block < q_block


def segment_mask(q_segment_ids: jax.Array, kv_segment_ids: jax.Array) -> jax.Array:
    """[B, 1, T, S] mask: a query attends to keys of the same segment id.

    Segment ids are int [B, T] / [B, S]; negative ids mark padding and attend nowhere.
    """
    return same_segment(q_segment_ids, kv_segment_ids)[:, None]


def lengths_to_segment_ids(lengths: jax.Array, max_len: int) -> jax.Array:
    """[B] valid lengths -> [B, max_len] segment ids: 0 inside, -1 (padding) beyond."""
    return jnp.where(jnp.arange(max_len)[None, :] < lengths[:, None], 0, -1).astype(jnp.int32)


def build_mask(
    q_len: int,
    kv_len: int,
    *,
    causal: bool = False,
    mask=None,
    q_segment_ids=None,
    kv_segment_ids=None,
    q_offset=0,
    window: tuple[int, int] | None = None,
):
    """Combine causal, explicit, segment and sliding-window (``window = (left, right)``,
    :func:`window_mask`) masks into one boolean broadcastable to [B, H, T, S]; ``None``
    when nothing is masked."""
    out = None

    def _and(a, b):
        return b if a is None else jnp.logical_and(a, b)

    if causal:
        out = _and(out, causal_mask(q_len, kv_len, q_offset=q_offset)[None, None])
    if window is not None:
        out = _and(out, window_mask(q_len, kv_len, window, q_offset=q_offset)[None, None])
    if mask is not None:
        m = jnp.asarray(mask)
        out = _and(out, m.reshape((1,) * (4 - m.ndim) + m.shape))
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("pass both `q_segment_ids` and `kv_segment_ids`, or neither")
    if q_segment_ids is not None:
        out = _and(out, segment_mask(q_segment_ids, kv_segment_ids))
    return out


def alibi_bias(q_len: int, kv_len: int, alibi_slopes, *, q_offset=0,
               dtype=jnp.float32) -> jax.Array:
    """Dense ALiBi bias [H, q_len, kv_len]: ``-m_h · |i + q_offset - j|`` (Press, Smith &
    Lewis, "Train Short, Test Long", ICLR 2022), added to the scaled scores.

    ``alibi_slopes``: [H] (0 = no bias for that head); ``q_offset`` (int or traced int
    scalar) is the position of query 0 relative to key 0 (a KV cache's index). Causal
    attention only sees j ≤ i + q_offset, where this is the paper's -m·(i - j); for
    bidirectional attention the distance is symmetric.
    """
    slopes = jnp.asarray(alibi_slopes, dtype)
    dist = jnp.abs(jnp.arange(q_len)[:, None] + q_offset - jnp.arange(kv_len)[None, :])
    return -slopes[:, None, None] * dist.astype(dtype)[None]


# ----------------------------------------------------------------------------
# Reference attention
# ----------------------------------------------------------------------------
def grouped_scores(q, k, *, causal: bool = False, mask=None, scale: float | None = None,
                   q_segment_ids=None, kv_segment_ids=None, q_offset=0,
                   alibi_slopes=None, alibi_offset=0, bias=None,
                   local_window_size=None) -> jax.Array:
    """Masked scores in the grouped layout: [B, Hkv, G, T, S] = scale · q·kᵀ in the
    statistics dtype (float32, float64 for float64 inputs), plus the ALiBi bias of
    :func:`alibi_bias` (``alibi_slopes`` [H], query 0 at ``q_offset + alibi_offset``) and
    ``bias`` (broadcastable to [B, H, T, S]), ``-inf`` where masked (``causal``, ``mask``,
    segment ids, the sliding window ``local_window_size``, combined by
    :func:`build_mask`). The one place the dense references (:func:`dot_product_attention`,
    ``lcjax.attention.weights``) score."""
    t, hk, d = q.shape[1], k.shape[2], q.shape[3]
    acc = stat_dtype(q, k)
    full_mask = build_mask(t, k.shape[1], causal=causal, mask=mask, q_segment_ids=q_segment_ids,
                           kv_segment_ids=kv_segment_ids, q_offset=q_offset,
                           window=window_size(local_window_size, name="attention"))
    qg = group_queries(q, hk)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=acc)
    scores = scores * acc.type(default_scale(d, scale))
    slopes = alibi_slopes_array(alibi_slopes, q.shape[2], dtype=acc, name="attention")
    if slopes is not None:
        alibi = alibi_bias(t, k.shape[1], slopes, q_offset=q_offset + alibi_offset, dtype=acc)
        scores = scores + alibi.reshape(1, hk, q.shape[2] // hk, t, k.shape[1])
    if bias is not None:
        b4 = jnp.asarray(bias, acc)
        b4 = b4.reshape((1,) * (4 - b4.ndim) + b4.shape)
        scores = scores + group_mask(b4, hk)
    if full_mask is not None:
        scores = jnp.where(group_mask(full_mask, hk), scores, -jnp.inf)
    return scores


def softmax_rows(scores: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Softmax over the last axis with masked (``-inf``) entries: (probs, m, l) with the
    safe row max m (0 for an empty row) and l = Σ e^{s - m} (both keepdims); an empty row
    has probs 0 and l = 0 (so m + log l = -inf).

    m is under ``stop_gradient``: probs and m + log l do not depend on the shift, and the
    gradient of ``max`` (ties found by ``scores == max``, divided by their count) is 0/0 = NaN
    when XLA computes the compared scores and the max in two fusions that round differently
    (seen at ``--xla_backend_optimization_level=0`` with an ALiBi bias)."""
    m = lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(scores - m_safe)
    l = jnp.sum(p, axis=-1, keepdims=True)
    return p / jnp.where(l > 0, l, 1.0), m_safe, l


def dot_product_attention(
    q,
    k,
    v,
    *,
    causal: bool = False,
    mask=None,
    scale: float | None = None,
    q_segment_ids=None,
    kv_segment_ids=None,
    q_offset=0,
    return_lse: bool = False,
    alibi_slopes=None,
    alibi_offset=0,
    bias=None,
    local_window_size=None,
):
    """Exact softmax attention, the reference every variant is tested against.

    out[b,i,h] = sum_j softmax_j(scale * q[b,i,h] . k[b,j,h//G] + bias_hij) v[b,j,h//G]

    Args:
      q: [B, T, H, D]; k: [B, S, Hkv, D]; v: [B, S, Hkv, Dv].
      causal: query i sees keys j <= i + q_offset.
      mask: boolean, broadcastable to [B, H, T, S]; True = may attend.
      scale: defaults to 1/sqrt(D).
      q_segment_ids, kv_segment_ids: int [B, T], [B, S]; attend within a segment,
        negative ids are padding.
      return_lse: also return the float32 log-sum-exp [B, T, H] (``-inf`` for empty rows).
      alibi_slopes: optional [H]; bias_hij = -m_h·|i + q_offset + alibi_offset - j|
        (:func:`alibi_bias`; 0 without slopes). alibi_offset: int or traced int scalar.
      bias: optional float, broadcastable to [B, H, T, S], added to bias_hij (the
        ``bias`` of ``jax.nn.dot_product_attention``; differentiable).
      local_window_size: optional int w or (left, right): query i sees keys j with
        i + q_offset - left <= j <= i + q_offset + right (:func:`window_mask`).

    Returns:
      [B, T, H, Dv] in q's dtype (and the lse when asked).
    """
    shapes = validate_qkv(q, k, v, mask=mask, name="dot_product_attention")
    acc = stat_dtype(q, k, v)
    alibi_slopes_array(alibi_slopes, shapes.heads, name="dot_product_attention")
    validate_bias(bias, shapes, name="dot_product_attention")
    window_size(local_window_size, name="dot_product_attention")
    scores = grouped_scores(q, k, causal=causal, mask=mask, scale=scale,
                            q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                            q_offset=q_offset, alibi_slopes=alibi_slopes,
                            alibi_offset=alibi_offset, bias=bias,
                            local_window_size=local_window_size)
    probs, m_safe, l = softmax_rows(scores)
    out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(v.dtype), v, preferred_element_type=acc)
    out = ungroup(out).astype(q.dtype)
    if not return_lse:
        return out
    lse = (m_safe + jnp.log(l))[..., 0]  # [B, Hkv, G, T]; log 0 = -inf for empty rows
    lse = jnp.moveaxis(lse.reshape(shapes.batch, shapes.heads, shapes.q_len), 1, 2)
    return out, lse


# ----------------------------------------------------------------------------
# LSE merge
# ----------------------------------------------------------------------------
def causal_linear_sums(qf: jax.Array, kf: jax.Array, v: jax.Array, *, chunk: int
                       ) -> jax.Array:
    """Causal (top-left) linear-attention sums, the one chunked scan of the linear variants.

    qf [B, H, T, m], kf [B, H, S, m] (queries and keys, or their feature maps), v [B, H, S, Dv]
    -> [B, H, T, Dv] with row i = Σ_{j ≤ i, j < S} (qf_i · kf_j) v_j. A ``lax.scan`` over
    chunks of ``chunk`` positions carries the state Σ kf_j v_jᵀ [B, H, m, Dv]; inside a chunk
    the lower-triangular part is a dense [C, C] product. Keys beyond the last query are never
    seen (cut); padded rows are zero. A normaliser Σ_{j ≤ i} qf_i · kf_j is the same sum with a
    column of ones appended to v (FAVOR+ uses that).
    """
    b, h, t, m = qf.shape
    nc = -(-t // chunk)
    length = nc * chunk

    def pad(x):
        x = lax.slice_in_dim(x, 0, min(x.shape[2], length), axis=2)
        return jnp.pad(x, [(0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)])

    qp, kp, vp = (jnp.moveaxis(pad(x).reshape(b, h, nc, chunk, -1), 2, 0) for x in (qf, kf, v))
    tri = jnp.tril(jnp.ones((chunk, chunk), qf.dtype))

    def step(state, xs):
        qc, kc, vc = xs
        inner = jnp.einsum("bhtm,bhsm->bhts", qc, kc) * tri
        out = (jnp.einsum("bhtm,bhmv->bhtv", qc, state)
               + jnp.einsum("bhts,bhsv->bhtv", inner, vc))
        return state + jnp.einsum("bhsm,bhsv->bhmv", kc, vc), out

    init = match_varying(jnp.zeros((b, h, m, v.shape[-1]), qf.dtype), qf, kf, v)
    _, outs = lax.scan(step, init, (qp, kp, vp))
    return jnp.moveaxis(outs, 0, 2).reshape(b, h, length, -1)[:, :, :t]


def merge_attention(out_a, lse_a, out_b, lse_b):
    """Merge two attentions of the same queries over disjoint key sets.

    out = (e^{lse_a} out_a + e^{lse_b} out_b) / (e^{lse_a} + e^{lse_b}),
    lse = log(e^{lse_a} + e^{lse_b}), stabilised by the max; ``-inf`` inputs
    (empty key sets) contribute nothing, and two empty parts give zeros.

    Args:
      out_a, out_b: [..., D] partial outputs (each already normalised).
      lse_a, lse_b: [...] float32 log-sum-exps (the leading shape of the outs).
    Returns:
      (out [..., D] in out_a's dtype, lse [...] float32).
    """
    acc = stat_dtype(lse_a, lse_b)
    lse_a = lse_a.astype(acc)
    lse_b = lse_b.astype(acc)
    m = jnp.maximum(lse_a, lse_b)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    wa = jnp.exp(lse_a - m_safe)
    wb = jnp.exp(lse_b - m_safe)
    total = wa + wb
    denom = jnp.where(total > 0, total, 1.0)
    out = wa[..., None] * out_a.astype(acc) + wb[..., None] * out_b.astype(acc)
    out = out / denom[..., None]
    lse = m_safe + jnp.log(total)
    return out.astype(out_a.dtype), lse


# ----------------------------------------------------------------------------
# Blockwise online-softmax attention
# ----------------------------------------------------------------------------
def _blockwise_forward(plan: BlockPlan, q, k, v, masking: Masking):
    """Padded inputs q [B, Tp, Hkv, G, D] (grouped), k [B, Sp, Hkv, D], v [B, Sp, Hkv, Dv]
    -> (out [B, Tp, Hkv, G, Dv] f32, lse [B, Hkv, G, Tp] f32).

    Blocks are moved to head-major one at a time, so no whole-sequence copy of the
    inputs is made.
    """
    b, tp, hk, g, d = q.shape
    dv = v.shape[-1]

    def one_q_block(qi):
        qb = lax.dynamic_slice_in_dim(q, qi * plan.block_q, plan.block_q, axis=1)
        qb = jnp.transpose(qb, (0, 2, 3, 1, 4))  # [B, Hkv, G, bq, D]

        def step(kj, s, carry):
            m, l, acc = carry
            vb = lax.dynamic_slice_in_dim(v, kj * plan.block_kv, plan.block_kv, axis=1)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            p = jnp.exp(s - m_safe[..., None])
            corr = jnp.exp(jnp.where(jnp.isfinite(m), m, m_safe) - m_safe)
            l = corr * l + jnp.sum(p, axis=-1)
            pv = jnp.einsum("bkgts,bksd->bkgtd", p.astype(v.dtype), jnp.swapaxes(vb, 1, 2),
                            preferred_element_type=plan.acc)
            return m_new, l, corr[..., None] * acc + pv

        carry = (
            jnp.full((b, hk, g, plan.block_q), -jnp.inf, plan.acc),
            jnp.zeros((b, hk, g, plan.block_q), plan.acc),
            jnp.zeros((b, hk, g, plan.block_q, dv), plan.acc),
        )
        carry = match_varying(carry, q, k, v, masking)
        m, l, acc = fold_kv_blocks(plan, qi, qb, k, masking, step, carry)
        out = acc / jnp.where(l > 0, l, 1.0)[..., None]
        lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)
        return jnp.transpose(out, (0, 3, 1, 2, 4)), lse

    outs, lses = lax.map(one_q_block, jnp.arange(plan.num_q_blocks))  # [nq, B, bq, Hkv, G, Dv]
    out = jnp.moveaxis(outs, 0, 1).reshape(b, tp, hk, g, dv)
    lse = jnp.moveaxis(lses, 0, 3).reshape(b, hk, g, tp)
    return out, lse


def _blockwise_backward(plan: BlockPlan, q, k, v, masking: Masking, lse, d_out, delta,
                        dk_init=None, dv_init=None):
    """FlashAttention-2 style backward, recomputing P block by block.

    Layouts as in :func:`_blockwise_forward` (lse and ``delta`` [B, Hkv, G, Tp]); returns
    dq, dk, dv in the layouts of q, k, v. With P = exp(S - lse),
    dP = dO V^T, delta = rowsum(dO * O) - d_lse:
      dS = P * (dP - delta),  dQ = scale dS K,  dK = scale dS^T Q,  dV = P^T dO.
    dk and dv are the loop's carries, each key block's share written into its slice in
    place; ``dk_init``/``dv_init`` (layouts of k, v, or None: zeros) are what they start
    from, so a caller that sums several backward passes (UPipe's query stages sharing one
    K/V chunk) adds into its accumulators without a second dk, dv buffer.
    """
    to_head_major = functools.partial(jnp.transpose, axes=(0, 2, 3, 1, 4))
    q, d_out = to_head_major(q), to_head_major(d_out)
    k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
    b, hk, g, tp, d = q.shape
    sp = k.shape[2]
    lse = jnp.where(jnp.isfinite(lse), lse, 0.0)

    def probs_and_ds(qi, kj, masked):
        qb = lax.dynamic_slice_in_dim(q, qi * plan.block_q, plan.block_q, axis=3)
        kb = lax.dynamic_slice_in_dim(k, kj * plan.block_kv, plan.block_kv, axis=2)
        vb = lax.dynamic_slice_in_dim(v, kj * plan.block_kv, plan.block_kv, axis=2)
        dob = lax.dynamic_slice_in_dim(d_out, qi * plan.block_q, plan.block_q, axis=3)
        lse_b = lax.dynamic_slice_in_dim(lse, qi * plan.block_q, plan.block_q, axis=3)
        delta_b = lax.dynamic_slice_in_dim(delta, qi * plan.block_q, plan.block_q, axis=3)
        s = block_scores(plan, qb, kb, masking, qi, kj, masked=masked)
        p = jnp.exp(s - lse_b[..., None])  # masked entries: exp(-inf) = 0
        dp = jnp.einsum("bkgtd,bksd->bkgts", dob, vb, preferred_element_type=plan.acc)
        ds = p * (dp - delta_b[..., None])
        return qb, kb, dob, p, ds

    def dkv_for_block(carry, kj):
        """Key block ``kj``: its dk, dv added into their slices, its contribution into
        the full dq."""
        dq, dk_all, dv_all = carry

        def step(qi, carry, masked):
            dk, dv, dq = carry
            qb, kb, dob, p, ds = probs_and_ds(qi, kj, masked)
            dk = dk + jnp.einsum("bkgts,bkgtd->bksd", ds, qb, preferred_element_type=plan.acc)
            dv = dv + jnp.einsum("bkgts,bkgtd->bksd", p, dob, preferred_element_type=plan.acc)
            dq_b = lax.dynamic_slice_in_dim(dq, qi * plan.block_q, plan.block_q, axis=3)
            dq_b = dq_b + jnp.einsum("bkgts,bksd->bkgtd", ds, kb, preferred_element_type=plan.acc)
            dq = lax.dynamic_update_slice_in_dim(dq, dq_b, qi * plan.block_q, axis=3)
            return dk, dv, dq

        carry = (
            jnp.zeros((b, hk, plan.block_kv, d), plan.acc),
            jnp.zeros((b, hk, plan.block_kv, v.shape[-1]), plan.acc),
            dq,
        )
        carry = match_varying(carry, q, k, v, masking, d_out, lse, delta)
        dk, dv, dq = fold_q_blocks(plan, kj, masking, step, carry)
        start = kj * plan.block_kv
        dk_all = lax.dynamic_update_slice_in_dim(dk_all, lax.dynamic_slice_in_dim(
            dk_all, start, plan.block_kv, axis=2) + dk * plan.scale, start, axis=2)
        dv_all = lax.dynamic_update_slice_in_dim(dv_all, lax.dynamic_slice_in_dim(
            dv_all, start, plan.block_kv, axis=2) + dv, start, axis=2)
        return (dq, dk_all, dv_all), None

    def start_from(init, like):  # [B, S, Hkv, D] (or None) -> the carry [B, Hkv, Sp, D]
        if init is None:
            return jnp.zeros(like.shape, plan.acc)
        init = jnp.swapaxes(init.astype(plan.acc), 1, 2)
        return jnp.pad(init, ((0, 0), (0, 0), (0, sp - init.shape[2]), (0, 0)))

    # one pass over key blocks (FlashAttention-2): P is recomputed once per block pair
    carry = (jnp.zeros((b, hk, g, tp, d), plan.acc), start_from(dk_init, k),
             start_from(dv_init, v))
    carry = match_varying(carry, q, k, v, masking, d_out, lse, delta)
    (dq, dk, dv), _ = lax.scan(dkv_for_block, carry, jnp.arange(plan.num_kv_blocks))
    dq = (dq * plan.scale).transpose(0, 3, 1, 2, 4)
    return dq, jnp.swapaxes(dk, 1, 2), jnp.swapaxes(dv, 1, 2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blockwise_core(plan: BlockPlan, q, k, v, masking):
    return _blockwise_forward(plan, q, k, v, masking)


def _blockwise_core_fwd(plan, q, k, v, masking):
    out, lse = _blockwise_forward(plan, q, k, v, masking)
    return (out, lse), (q, k, v, masking, out, lse)


def _blockwise_core_bwd(plan, residuals, cotangents):
    q, k, v, masking, out, lse = residuals
    d_out, d_lse = cotangents
    up = functools.partial(jnp.asarray, dtype=plan.acc)
    delta = jnp.einsum("btkgd,btkgd->bkgt", up(d_out), out) - up(d_lse)  # [B, Hkv, G, Tp]
    dq, dk, dv = _blockwise_backward(plan, up(q), up(k), up(v), masking, lse, up(d_out),
                                     delta)
    d_masking = jax.tree.map(lambda x: None, masking)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), d_masking


_blockwise_core.defvjp(_blockwise_core_fwd, _blockwise_core_bwd)


def blockwise_attention(
    q: Float[Array, "B T H D"],
    k: Float[Array, "B S Hkv D"],
    v: Float[Array, "B S Hkv Dv"],
    *,
    causal: bool = False,
    mask: Bool[Array, "..."] | None = None,
    scale: float | None = None,
    q_segment_ids: Int[Array, "B T"] | None = None,
    kv_segment_ids: Int[Array, "B S"] | None = None,
    q_offset: int = 0,
    block_q: int = 512,
    block_kv: int = 512,
    return_lse: bool = False,
    alibi_slopes: Float[Array, " H"] | None = None,
    alibi_offset: int | Int[Array, ""] = 0,
    local_window_size: int | tuple[int, int] | None = None,
) -> Float[Array, "B T H Dv"] | tuple[Float[Array, "B T H Dv"], Float[Array, "B T H"]]:
    """Exact softmax attention by online softmax over key blocks (FlashAttention in XLA).

    Same arguments and result as :func:`dot_product_attention`; memory is
    O(block_q * block_kv) per (batch, head) instead of O(T * S). With ``causal``, key
    blocks entirely above the diagonal are skipped (forward and backward). Lengths
    need not divide the block sizes (inputs are padded and the padding masked; the
    pieces are those of :mod:`lcjax.attention.blocks`). ``q_offset`` must be a Python
    int here. ``alibi_slopes`` [H] / ``alibi_offset`` (may be traced): the ALiBi bias of
    :func:`alibi_bias`, added in the one tile-score function
    (:func:`lcjax.attention.blocks.block_scores`), forward and backward.
    ``local_window_size`` (int w or (left, right)): the sliding window of
    :func:`window_mask`; key blocks wholly outside it are never visited (forward and
    backward), so the work is O(T · window) instead of O(T · S).

    Returns [B, T, H, Dv] (and the float32 lse [B, T, H] when ``return_lse``).
    """
    name = "blockwise_attention"
    shapes, plan, masking = _blockwise_setup(
        name, q, k, v, causal=causal, mask=mask, scale=scale, q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids, q_offset=q_offset, block_q=block_q, block_kv=block_kv,
        alibi_slopes=alibi_slopes, alibi_offset=alibi_offset,
        local_window_size=local_window_size)
    out, lse = _blockwise_core(plan, *pad_inputs(plan, q, k, v), masking)
    out = ungroup(out[:, : shapes.q_len]).astype(q.dtype)
    if not return_lse:
        return out
    return out, rows_to_heads(lse, shapes.q_len)


def _blockwise_setup(name, q, k, v, *, causal, mask, scale, q_segment_ids, kv_segment_ids,
                     q_offset, block_q, block_kv, alibi_slopes, alibi_offset,
                     local_window_size=None):
    """(shapes, plan, padded masking) of a blockwise call, its arguments checked."""
    shapes = validate_qkv(q, k, v, mask=mask, name=name)
    plan = block_plan(q_len=shapes.q_len, kv_len=shapes.kv_len, head_dim=shapes.head_dim,
                      scale=scale, causal=causal, block_q=block_q, block_kv=block_kv,
                      acc_dtype=stat_dtype(q, k, v), q_offset=q_offset,
                      window=window_size(local_window_size, name=name), name=name)
    masking = pad_masking(plan, mask, q_segment_ids, kv_segment_ids, alibi_slopes=alibi_slopes,
                          alibi_offset=alibi_offset, heads=shapes.heads, name=name)
    return shapes, plan, masking


def _heads_to_rows(x: jax.Array, kv_heads: int, padded: int, value) -> jax.Array:
    """Per-row statistics [B, T, H] -> [B, Hkv, G, Tp] (padding rows ``value``); the
    inverse of :func:`lcjax.attention.blocks.rows_to_heads`."""
    b, t, h = x.shape
    rows = jnp.moveaxis(x, 2, 1).reshape(b, kv_heads, h // kv_heads, t)
    return pad_axis(rows, 3, padded, value)


def blockwise_attention_bwd(
    q: Float[Array, "B T H D"],
    k: Float[Array, "B S Hkv D"],
    v: Float[Array, "B S Hkv Dv"],
    lse: Float[Array, "B T H"],
    d_out: Float[Array, "B T H Dv"],
    *,
    out: Float[Array, "B T H Dv"] | None = None,
    delta: Float[Array, "B T H"] | None = None,
    causal: bool = False,
    mask: Bool[Array, "..."] | None = None,
    scale: float | None = None,
    q_segment_ids: Int[Array, "B T"] | None = None,
    kv_segment_ids: Int[Array, "B S"] | None = None,
    q_offset: int = 0,
    block_q: int = 512,
    block_kv: int = 512,
    alibi_slopes: Float[Array, " H"] | None = None,
    alibi_offset: int | Int[Array, ""] = 0,
    dk_acc: Float[Array, "B S Hkv D"] | None = None,
    dv_acc: Float[Array, "B S Hkv Dv"] | None = None,
    local_window_size: int | tuple[int, int] | None = None,
) -> tuple[Float[Array, "B T H D"], Float[Array, "B S Hkv D"], Float[Array, "B S Hkv Dv"]]:
    """The gradient (dq, dk, dv) of exact softmax attention from its forward's results,
    without running the forward again: the FlashAttention-2 backward of
    :func:`blockwise_attention` (Dao, 2023), P recomputed block by block from the saved
    log-sum-exp.

    ``lse`` [B, T, H] is the forward's float32 log-sum-exp (``return_lse=True`` of
    :func:`blockwise_attention` or :func:`dot_product_attention`, which compute the same
    function), ``d_out`` the cotangent of its output (the lse's cotangent is taken as
    zero). The row statistic delta = Σ_d d_out · out comes from ``out`` [B, T, H, Dv], or
    is given precomputed as ``delta`` [B, T, H] (e.g. by a caller that holds ``out`` in
    another layout); exactly one of the two. ``dk_acc``, ``dv_acc`` (optional, shapes of
    k, v): accumulators the key and value gradients are added into, block by block in
    the loop's carry — (dq, dk_acc + dk, dv_acc + dv) in the accumulators' dtype, without
    a separate dk, dv buffer (a caller summing several passes over one K/V). The other
    arguments are those of the forward call and must equal them.
    """
    name = "blockwise_attention_bwd"
    if (out is None) == (delta is None):
        raise ValueError(f"{name}: pass exactly one of `out` and `delta`")
    shapes, plan, masking = _blockwise_setup(
        name, q, k, v, causal=causal, mask=mask, scale=scale, q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids, q_offset=q_offset, block_q=block_q, block_kv=block_kv,
        alibi_slopes=alibi_slopes, alibi_offset=alibi_offset,
        local_window_size=local_window_size)
    want = (shapes.batch, shapes.q_len, shapes.heads)
    kv_want = (shapes.batch, shapes.kv_len, shapes.kv_heads)
    for arg, x, shape in (("lse", lse, want), ("d_out", d_out, (*want, shapes.value_dim)),
                          ("out", out, (*want, shapes.value_dim)), ("delta", delta, want),
                          ("dk_acc", dk_acc, (*kv_want, k.shape[-1])),
                          ("dv_acc", dv_acc, (*kv_want, shapes.value_dim))):
        if x is not None and tuple(x.shape) != shape:
            raise ValueError(f"{name}: `{arg}` must have shape {list(shape)} (from q "
                             f"{q.shape}, v {v.shape}), got {list(x.shape)}")
    up = functools.partial(jnp.asarray, dtype=plan.acc)
    if delta is None:
        delta = jnp.einsum("bthd,bthd->bth", up(d_out), up(out))
    hk, tp = shapes.kv_heads, plan.q_padded
    qp, kp, vp = pad_inputs(plan, q, k, v)
    dop = pad_axis(group_queries(up(d_out), hk), 1, tp)
    dq, dk, dv = _blockwise_backward(
        plan, up(qp), up(kp), up(vp), masking, _heads_to_rows(up(lse), hk, tp, -jnp.inf),
        dop, _heads_to_rows(up(delta), hk, tp, 0.0), dk_init=dk_acc, dv_init=dv_acc)
    s = shapes.kv_len
    dk_dtype = k.dtype if dk_acc is None else dk_acc.dtype
    dv_dtype = v.dtype if dv_acc is None else dv_acc.dtype
    return (ungroup(dq[:, : shapes.q_len]).astype(q.dtype), dk[:, :s].astype(dk_dtype),
            dv[:, :s].astype(dv_dtype))
