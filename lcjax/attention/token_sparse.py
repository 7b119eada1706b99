r"""Token Sparse Attention: per-head token compression before attention and decompression
after it, composable with any attention variant.

Method of "Token Sparse Attention" (public code dongwonjo/Token-Sparse-Attention,
``sparse_attn/token_sparse/sparse_cluster.py``; PyTorch, batch 1, prefill only — read for
the algorithm, not copied). For a prefill of length L (q [B, L, H, D], k, v [B, L, Hkv, D],
RoPE already applied), window W, prefix P = L - W:

1. **Score** (:func:`token_scores`): for each prefix key j < P and query head h,

       a_h[j] = (1/W) Σ_{i = P}^{L-1} softmax_j'(scale · q_i·k_j')[j]

   (the softmax runs over all L keys, causal inside the window), then an average pool of
   kernel ``pool`` with zero padding counted (``avg_pool1d(kernel, padding=kernel//2)``):
   ā_h[j] = (1/pool) Σ_{|t| ≤ pool//2} a_h[j + t], a = 0 outside [0, P). Computed by key
   blocks with an online softmax (two passes: row statistics m, l of the W window rows,
   then column sums of e^{s - m}/l); the [L, L] matrix is never built, nor the [W, L] one.
2. **Budget** ("dynamic token coverage", :func:`select_tokens`): with the head average
   g = mean_h ā_h normalised, ĝ = g / (Σ_j g_j + 1e-8), sorted ascending, c = cumsum,

       n = #{c < coverage};   dense if n = 0;   n_drop = n + 1;
       K = max(min_tokens, P - n_drop),

   one K per example (the public code's ``.item()`` limits it to batch 1).
3. **Select** per query head the top-K prefix keys of ā_h plus the W window tokens, sorted
   ascending (so causality on the compressed set is causality on the original positions).
4. **Compress** (gather the Q, K, V rows of the selected tokens, per head), run the
   **inner** attention variant on the compressed set (any registry name or callable;
   causal on the compressed order), **decompress** (scatter the outputs back into zeros:
   a skipped token gets 0 from that head and the residual stream carries it on).
   The default inner variant is ``"blockwise"`` (exact softmax by key blocks): no default
   call builds an [L, L] or [W, L] matrix, so it compiles at 128K tokens on one TPU chip.

Dense attention (the inner variant on the whole sequence) exactly when L ≤ min_tokens + W,
``coverage == 0``, or, per example, n = 0. A call outside the method's domain — a KV-cache
decoding step or cross attention (kv_len ≠ q_len) — is dense too, as decoding is in the
public code; such a call and a too-short one warn once (per reason, per process) and set
``aux["dense"]``.

**Ragged rows** (segment ids, or a ``mask``): each row is laid out over its own tokens
(segment id ≥ 0, and for a key-padding mask [B|1, 1, 1, L] the keys it allows): its window
is its last W tokens, its prefix the others, scored by those window queries over the keys
they may see (causal, same segment, ``mask``), with its own budget and dense decision (a
row with ≤ min_tokens + W tokens is dense); the inner variant gets the selected tokens'
own segment ids and the mask gathered onto them. A right-padded row gives what the row
alone gives; its padding positions get 0 (on a sparse row; a dense row is the inner
variant's own output there).

Beyond the public code (``docs/token_sparse.md``):

- batch > 1 and static shapes: ``capacity`` fixes the number of prefix slots K_max, so the
  call jits, vmaps and batches with a different K (and different tokens) per example and
  head; slots past an example's K are marked invalid (index L, so they sort last). Under
  ``causal`` no used query sees them (their own rows are dropped), so the inner variant
  gets no extra masking; without ``causal`` segment id -1 hides them. Without
  ``capacity`` K_max is the largest K of the batch when
  the scores are concrete (eager), else P (every prefix slot: exact but no saving);
- ``share="kv_group"``: one selection per GQA group (the mean of the group's normalised
  scores), so K/V are gathered once per kv head; ``share="head"`` is the paper's;
- any inner variant (its own dispatch picks its Pallas kernel where one can serve);
- a Pallas kernel for the scoring pass (``pallas_kernels.token_scores``), the spec's
  ``"pallas"`` implementation;
- layer choice by representation drift (:func:`drift_per_layer`, :func:`sparse_layers`):
  layers whose mean ‖h_out - h_in‖ / ‖h_in‖ is at or below the median are made sparse.

Registered spec: ``"token_sparse"`` (implementations ``"pallas"`` and ``"xla"``, sharing
:class:`TokenScoresConfig`); its reference is dense attention restricted to the selected
tokens (:func:`token_sparse_reference`).
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from lcjax.attention.base import (
    AttentionSpec,
    Features,
    Implementation,
    pallas_skip_on_cpu,
    resolve_kernel,
    validate_segment_ids,
)
from lcjax.attention.blocks import group_queries, match_varying, pad_axis
from lcjax.attention.core import default_scale, stat_dtype, validate_qkv
from lcjax.attention.registry import get
from lcjax.attention.registry import spec as spec_of

__all__ = [
    "AUX",
    "TOKEN_SPARSE",
    "TokenScoresConfig",
    "TokenSelection",
    "drift_per_layer",
    "layer_attention",
    "pool_scores",
    "select_tokens",
    "sparse_layers",
    "token_scores",
    "token_sparse_attention",
    "token_sparse_reference",
]

_NAME = "token_sparse_attention"
_KERNEL_MODULE = "pallas_kernels.token_scores"
SHARES = ("head", "kv_group")
AUX = {
    "indices": "[B, H, K] int32: selected token positions per query head, ascending; "
               "L marks an unused slot",
    "valid": "[B, H, K] bool: slot holds a selected token",
    "kept_fraction": "[B] float32: selected (token, head) pairs / (L·H); 1 when dense",
    "budget": "[B] int32: K of the coverage budget (before capacity); L - W when dense",
    "dense": "[B] bool: the example was computed by dense attention",
}


# ----------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TokenScoresConfig:
    """Key-block size of the scoring pass, shared by the XLA path and the Pallas kernel
    (which needs a power of two ≥ 8 in interpret mode, ≥ 16 compiled, and raises
    ``NotImplementedError`` otherwise)."""

    block_kv: int = 512

    def __post_init__(self):
        val = self.block_kv
        if isinstance(val, bool) or not isinstance(val, numbers.Integral) or val <= 0:
            raise ValueError(f"TokenScoresConfig: `block_kv` must be a positive int, got {val!r}")


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{_NAME}: `{name}` must be an int >= {low}, got {value!r}")
    return int(value)


def _check_options(*, coverage, min_tokens, window, pool, capacity, share) -> None:
    """ValueError naming the option and its value (before any computation)."""
    if isinstance(coverage, bool) or not isinstance(coverage, numbers.Real) or not (
            0.0 <= float(coverage) < 1.0):
        raise ValueError(f"{_NAME}: `coverage` must be a Python number in [0, 1), got "
                         f"{coverage!r}")
    _check_int("min_tokens", min_tokens, 0)
    _check_int("window", window, 1)
    _check_int("pool", pool, 1)
    if pool % 2 == 0:
        raise ValueError(f"{_NAME}: `pool` must be odd (avg_pool1d with padding pool//2 keeps "
                         f"the length only then), got {pool}")
    if capacity is not None:
        _check_int("capacity", capacity, 1)
    if share not in SHARES:
        raise ValueError(f"{_NAME}: `share` must be one of {SHARES}, got {share!r}")


# ----------------------------------------------------------------------------
# 1. Scores
# ----------------------------------------------------------------------------
def _scores_xla(q, k, *, window: int, causal: bool, scale: float, block_kv: int):
    """Mean window probabilities [B, H, P] (unpooled) by key blocks, in the statistics
    dtype: pass 1 the online (m, l) of the W window rows over all keys, pass 2 the column
    sums of e^{s - m} / l over the prefix key blocks."""
    b, s_len, hk, d = k.shape
    h = q.shape[2]
    g = h // hk
    acc = stat_dtype(q, k)
    w, p_len = window, s_len - window
    bk = min(block_kv, s_len)
    nk = -(-s_len // bk)
    qw = jnp.transpose(group_queries(q[:, s_len - w:], hk), (0, 2, 3, 1, 4))  # [B,Hkv,G,W,D]
    kp = jnp.swapaxes(pad_axis(k, 1, nk * bk), 1, 2)  # [B, Hkv, Sp, D]
    q_pos = p_len + jnp.arange(w)

    def tile(kj):
        kb = lax.dynamic_slice_in_dim(kp, kj * bk, bk, axis=2)
        sc = jnp.einsum("bkgwd,bksd->bkgws", qw, kb, preferred_element_type=acc)
        k_pos = kj * bk + jnp.arange(bk)
        valid = k_pos[None, :] < s_len
        if causal:
            valid = valid & (k_pos[None, :] <= q_pos[:, None])
        return jnp.where(valid, sc * acc.type(scale), -jnp.inf), k_pos

    def stats(carry, kj):
        m, l = carry
        sc, _ = tile(kj)
        m_new = jnp.maximum(m, jnp.max(sc, axis=-1))
        l = l * jnp.exp(m - m_new) + jnp.sum(jnp.exp(sc - m_new[..., None]), axis=-1)
        return (m_new, l), None

    init = match_varying((jnp.full((b, hk, g, w), -jnp.inf, acc),
                          jnp.zeros((b, hk, g, w), acc)), q, k)
    # every window row sees key 0, so m is finite after the first block
    (m, l), _ = lax.scan(stats, init, jnp.arange(nk))
    n_prefix = -(-p_len // bk)

    def column_sums(kj):
        sc, k_pos = tile(kj)
        prob = jnp.exp(sc - m[..., None]) / l[..., None]
        return jnp.where(k_pos < p_len, jnp.sum(prob, axis=-2), 0.0)  # [B, Hkv, G, bk]

    cols = lax.map(column_sums, jnp.arange(n_prefix))  # [n, B, Hkv, G, bk]
    cols = jnp.moveaxis(cols, 0, 3).reshape(b, h, n_prefix * bk)[..., :p_len]
    return cols / acc.type(w)


def pool_scores(scores: Float[Array, "B H P"], pool: int) -> Float[Array, "B H P"]:
    """Average pool along the last axis, kernel ``pool`` (odd), stride 1, zero padding
    ``pool // 2`` counted in the mean (``torch.nn.functional.avg_pool1d``'s default):
    out[j] = (1/pool) Σ_{|t| ≤ pool//2} x[j + t], x = 0 outside."""
    if pool == 1:
        return scores
    r = pool // 2
    total = lax.reduce_window(scores, jnp.zeros((), scores.dtype), lax.add, (1, 1, pool),
                              (1, 1, 1), ((0, 0), (0, 0), (r, r)))
    return total / scores.dtype.type(pool)


def _check_scoring(q, k, window: int, name: str):
    if getattr(q, "ndim", None) != 4 or getattr(k, "ndim", None) != 4:
        raise ValueError(f"{name}: `q` and `k` must be rank 4 [batch, len, heads, head_dim], "
                         f"got q {getattr(q, 'shape', None)}, k {getattr(k, 'shape', None)}")
    b, t, h, d = q.shape
    if k.shape[0] != b or k.shape[3] != d or k.shape[2] == 0 or h % k.shape[2]:
        raise ValueError(f"{name}: `k` {k.shape} does not fit `q` {q.shape} (batch, head_dim, "
                         f"heads % kv_heads == 0)")
    if k.shape[1] != t:
        raise ValueError(f"{name}: scoring is for self-attention prefill: q_len {t} must equal "
                         f"kv_len {k.shape[1]}")
    if not 1 <= window < t:
        raise ValueError(f"{name}: `window` must be in [1, len) = [1, {t}), got {window}")


def token_scores(
    q: Float[Array, "B L H D"],
    k: Float[Array, "B L Hkv D"],
    *,
    window: int = 128,
    pool: int = 7,
    causal: bool = True,
    scale: float | None = None,
    block_kv: int = TokenScoresConfig.block_kv,
) -> Float[Array, "B H P"]:
    """Importance of each prefix key: ā_h[j], j < P = L - ``window`` (module docstring, 1).

    Args:
      q: [B, L, H, D]; k: [B, L, Hkv, D] (RoPE applied; query head h uses kv head h // G).
      window: W, the last W queries score the keys.
      pool: odd average-pool kernel (1: no pooling).
      causal: the window rows see keys ≤ their position (else all L keys).
      scale: default 1/sqrt(D).
      block_kv: keys per block of the scoring pass.

    Returns:
      float32 (float64 for float64 inputs) [B, H, L - W]; no gradient (a selection
      statistic: the selection it feeds is discrete).
    """
    _check_scoring(q, k, window, "token_scores")
    _check_int("pool", pool, 1)
    if pool % 2 == 0:
        raise ValueError(f"token_scores: `pool` must be odd, got {pool}")
    TokenScoresConfig(block_kv)
    q, k = lax.stop_gradient(q), lax.stop_gradient(k)
    raw = _scores_xla(q, k, window=window, causal=causal,
                      scale=default_scale(q.shape[-1], scale), block_kv=block_kv)
    return pool_scores(raw, pool)


# ----------------------------------------------------------------------------
# 2-3. Budget and selection
# ----------------------------------------------------------------------------
class TokenSelection(NamedTuple):
    """Selected tokens. ``indices`` int32 [B, Hs, C + W] ascending (Hs = H for
    ``share="head"``, Hkv for ``"kv_group"``; C the capacity), the unused slots at the end
    holding L; ``valid`` bool, the same shape (indices < L); ``budget`` int32 [B] (K of the
    coverage rule, before the capacity; P for a dense example); ``dense`` bool [B] (the
    rule drops nothing: n = 0)."""

    indices: Array
    valid: Array
    budget: Array
    dense: Array


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def coverage_budget(scores: Float[Array, "B H P"], *, coverage: float, min_tokens: int):
    """(budget K [B] int32, dense [B] bool) of the dynamic-coverage rule (module docstring,
    2) on pooled scores [B, H, P]; a dense example gets K = P."""
    p_len = scores.shape[-1]
    g = jnp.mean(scores.astype(jnp.promote_types(scores.dtype, jnp.float32)), axis=1)
    g = g / (jnp.sum(g, axis=-1, keepdims=True) + 1e-8)
    cum = jnp.cumsum(jnp.sort(g, axis=-1), axis=-1)
    n = jnp.sum(cum < coverage, axis=-1).astype(jnp.int32)
    dense = n == 0
    budget = jnp.maximum(min_tokens, p_len - (n + 1))
    return jnp.where(dense, p_len, jnp.minimum(budget, p_len)).astype(jnp.int32), dense


def select_tokens(
    scores: Float[Array, "B H P"],
    *,
    coverage: float = 0.005,
    min_tokens: int = 1024,
    window: int = 128,
    capacity: int | None = None,
    share: str = "head",
    kv_heads: int | None = None,
) -> TokenSelection:
    """Per-head top-K prefix tokens plus the window (module docstring, 2-3).

    Args:
      scores: pooled scores [B, H, P] (:func:`token_scores`), P = L - window.
      coverage, min_tokens: the budget rule; ``window``: W (the window tokens are always
        kept).
      capacity: static number C of prefix slots (K > C keeps the top C; K < C leaves
        C - K slots unused); None: the largest K of the batch if ``scores`` is concrete,
        else P.
      share: ``"head"`` (one selection per query head) or ``"kv_group"`` (one per GQA
        group of H / ``kv_heads`` query heads, ranked by the group's mean normalised score).

    Returns:
      :class:`TokenSelection`.
    """
    _check_options(coverage=coverage, min_tokens=min_tokens, window=window, pool=1,
                   capacity=capacity, share=share)
    if getattr(scores, "ndim", None) != 3:
        raise ValueError(f"select_tokens: `scores` must be [batch, heads, prefix], got shape "
                         f"{getattr(scores, 'shape', None)}")
    b, h, p_len = scores.shape
    if p_len < 1:
        raise ValueError(f"select_tokens: empty prefix: scores {scores.shape}")
    if share == "kv_group" and (kv_heads is None or kv_heads <= 0 or h % kv_heads):
        raise ValueError(f"select_tokens: share='kv_group' needs `kv_heads` dividing the "
                         f"{h} heads, got {kv_heads!r}")
    length = p_len + window
    pos = jnp.arange(length)
    prefix = jnp.broadcast_to(pos < p_len, (b, length))
    win_pos = jnp.broadcast_to(pos[p_len:].astype(jnp.int32), (b, window))
    return _select_rows(pad_axis(scores, 2, length), prefix, win_pos, jnp.zeros((b,), bool),
                        coverage=coverage, min_tokens=min_tokens, capacity=capacity,
                        share=share, kv_heads=kv_heads)


# ----------------------------------------------------------------------------
# Ragged rows: segment ids and masks
# ----------------------------------------------------------------------------
def _as_mask4(mask) -> Array | None:
    """``mask`` broadcastable to [B, H, T, S] as a rank-4 bool array (size-1 axes kept)."""
    if mask is None:
        return None
    m = jnp.asarray(mask, bool)
    return m.reshape((1,) * (4 - m.ndim) + m.shape)


def _row_layout(length: int, window: int, q_segment_ids, mask4):
    """Per row b: which tokens exist and which form its window.

    A token exists (``valid`` [B, L]) when its segment id is >= 0 (all, without segment
    ids) and, for a key-padding mask (shape [B|1, 1, 1, L]), when the mask lets it be
    attended. The window is the row's last ``window`` existing tokens, the prefix the
    others. Returns (valid [B, L] bool, prefix [B, L] bool, window positions [B, W] int32
    ascending, L where a row has fewer than W tokens; tokens per row [B] int32)."""
    valid = jnp.ones((1, length), bool)
    if q_segment_ids is not None:
        valid = jnp.asarray(q_segment_ids) >= 0
    if mask4 is not None and mask4.shape[1] == 1 and mask4.shape[2] == 1:
        valid = valid & mask4[:, 0, 0, :]
    from_end = jnp.cumsum(valid[:, ::-1].astype(jnp.int32), axis=1)[:, ::-1]
    win = valid & (from_end <= window)
    pos = jnp.arange(length, dtype=jnp.int32)
    top, _ = lax.top_k(jnp.where(win, pos, -1), window)
    win_pos = jnp.sort(jnp.where(top < 0, length, top), axis=-1).astype(jnp.int32)
    return valid, valid & ~win, win_pos, jnp.sum(valid, axis=1).astype(jnp.int32)


def _gather_rows(x, b: int, idx):
    """x [B|1, ...] at per-row positions idx [B, n] of axis 1 -> [B, n, ...]."""
    x = jnp.broadcast_to(x, (b,) + x.shape[1:])
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


def _scores_rows(q, k, *, win_pos, valid, prefix, q_segment_ids, kv_segment_ids, mask4,
                 causal: bool, scale: float, block_kv: int):
    """Mean window probabilities [B, H, L] (unpooled, 0 outside each row's prefix) for
    ragged rows: the window queries are each row's ``win_pos``; a window query sees the
    existing keys of its segment (causally, under ``causal``) that ``mask4`` allows.
    The same two key-block passes as :func:`_scores_xla`."""
    b, s_len, hk, d = k.shape
    h = q.shape[2]
    g = h // hk
    acc = stat_dtype(q, k)
    w = win_pos.shape[1]
    row_ok = win_pos < s_len  # [B, W]
    qpos = jnp.minimum(win_pos, s_len - 1)
    qw = _gather_rows(q, b, qpos)  # [B, W, H, D]
    qw = jnp.transpose(group_queries(qw, hk), (0, 2, 3, 1, 4))  # [B, Hkv, G, W, D]
    bk = min(block_kv, s_len)
    nk = -(-s_len // bk)
    kp = jnp.swapaxes(pad_axis(k, 1, nk * bk), 1, 2)  # [B, Hkv, Sp, D]
    kvalid = pad_axis(jnp.broadcast_to(valid, (b, s_len)), 1, nk * bk)
    kseg = qseg = None
    if q_segment_ids is not None:
        kseg = pad_axis(jnp.asarray(kv_segment_ids), 1, nk * bk)
        qseg = _gather_rows(jnp.asarray(q_segment_ids), b, qpos)  # [B, W]
    mrows = None
    if mask4 is not None:  # the window queries' rows [B, Hm, W, L]
        m = mask4 if mask4.shape[2] == 1 else jax.vmap(
            lambda mb, r: mb[:, r, :])(jnp.broadcast_to(mask4, (b,) + mask4.shape[1:]), qpos)
        m = jnp.broadcast_to(m, (b, m.shape[1], w, s_len))
        mrows = pad_axis(m.reshape(b, -1, 1, w, s_len) if m.shape[1] == 1
                         else m.reshape(b, hk, g, w, s_len), 4, nk * bk)

    def tile(kj):
        kb = lax.dynamic_slice_in_dim(kp, kj * bk, bk, axis=2)
        sc = jnp.einsum("bkgwd,bksd->bkgws", qw, kb, preferred_element_type=acc)
        k_pos = kj * bk + jnp.arange(bk)
        ok = lax.dynamic_slice_in_dim(kvalid, kj * bk, bk, axis=1)[:, None, :]  # [B, 1, bk]
        ok = ok & row_ok[:, :, None]
        if causal:
            ok = ok & (k_pos[None, None, :] <= qpos[:, :, None])
        if kseg is not None:
            ks = lax.dynamic_slice_in_dim(kseg, kj * bk, bk, axis=1)
            ok = ok & (qseg[:, :, None] == ks[:, None, :])
        ok = ok[:, None, None]  # [B, 1, 1, W, bk]
        if mrows is not None:
            ok = ok & lax.dynamic_slice_in_dim(mrows, kj * bk, bk, axis=4)
        return jnp.where(ok, sc * acc.type(scale), -jnp.inf)

    def stats(carry, kj):
        m, l = carry
        sc = tile(kj)
        m_new = jnp.maximum(m, jnp.max(sc, axis=-1))
        safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        l = l * jnp.exp(jnp.where(jnp.isfinite(m), m - safe, -jnp.inf)) + jnp.sum(
            jnp.exp(sc - safe[..., None]), axis=-1)
        return (m_new, l), None

    init = match_varying((jnp.full((b, hk, g, w), -jnp.inf, acc),
                          jnp.zeros((b, hk, g, w), acc)), q, k)
    (m, l), _ = lax.scan(stats, init, jnp.arange(nk))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    inv_l = jnp.where(l > 0, 1.0 / jnp.where(l > 0, l, 1.0), 0.0)  # a query seeing nothing: 0

    def column_sums(kj):
        prob = jnp.exp(tile(kj) - m[..., None]) * inv_l[..., None]
        return jnp.sum(prob, axis=-2)  # [B, Hkv, G, bk]

    cols = lax.map(column_sums, jnp.arange(nk))  # [nk, B, Hkv, G, bk]
    cols = jnp.moveaxis(cols, 0, 3).reshape(b, h, nk * bk)[..., :s_len]
    return jnp.where(prefix[:, None, :], cols / acc.type(w), 0.0)


def _select_rows(pooled, prefix, win_pos, short, *, coverage, min_tokens, capacity, share,
                 kv_heads):
    """The budget and per-head selection (module docstring, 2-3) of each row on pooled
    scores [B, H, L] over that row's ``prefix`` [B, L]; ``win_pos`` [B, W] (L = none) is
    always kept; ``short`` [B] rows are dense. Returns :class:`TokenSelection` (budget
    P_b for a dense row)."""
    b, h, length = pooled.shape
    acc = jnp.promote_types(pooled.dtype, jnp.float32)
    pooled = jnp.where(prefix[:, None, :], pooled.astype(acc), 0.0)
    p_b = jnp.sum(prefix, axis=1).astype(jnp.int32)
    g = jnp.mean(pooled, axis=1)
    g = g / (jnp.sum(g, axis=-1, keepdims=True) + 1e-8)
    # the prefix values (<= 1) sort before the others (2), whose running sums exceed 1
    cum = jnp.cumsum(jnp.sort(jnp.where(prefix, g, 2.0), axis=-1), axis=-1)
    n = jnp.sum(cum < coverage, axis=-1).astype(jnp.int32)
    dense = (n == 0) | short
    budget = jnp.minimum(jnp.maximum(min_tokens, p_b - (n + 1)), p_b)
    budget = jnp.where(dense, p_b, budget).astype(jnp.int32)
    norm = pooled / (jnp.sum(pooled, axis=-1, keepdims=True) + 1e-8)
    if share == "kv_group":
        norm = jnp.mean(norm.reshape(b, kv_heads, h // kv_heads, length), axis=2)
    norm = jnp.where(prefix[:, None, :], norm, -jnp.inf)
    p_max = length - win_pos.shape[1]
    if capacity is None:
        if _is_concrete(budget):
            kb = np.asarray(budget)[~np.asarray(dense)]
            capacity = int(kb.max()) if kb.size else p_max
        else:
            capacity = p_max
    cap = max(min(int(capacity), p_max), 1)
    _, top = lax.top_k(norm, cap)  # [B, Hs, C], best first (ties: lower index first)
    rank_ok = jnp.arange(cap)[None, None, :] < budget[:, None, None]
    chosen = jnp.where(rank_ok, top, length)
    win = jnp.broadcast_to(win_pos[:, None, :], chosen.shape[:2] + win_pos.shape[1:])
    indices = jnp.sort(jnp.concatenate([chosen, win.astype(chosen.dtype)], axis=-1),
                       axis=-1).astype(jnp.int32)
    return TokenSelection(indices, indices < length, budget, dense)


# ----------------------------------------------------------------------------
# 4. Compress, inner attention, decompress
# ----------------------------------------------------------------------------
def _resolve_inner(inner):
    """The inner variant (a registry name or a callable); ValueError for anything else."""
    if isinstance(inner, str):
        if inner == "token_sparse":
            raise ValueError(f"{_NAME}: `inner` cannot be 'token_sparse' itself")
        return get(inner)
    if callable(inner):
        return inner
    raise ValueError(f"{_NAME}: `inner` must be a registry name or a callable, got {inner!r}")


def _inner_call(fn, q, k, v, *, causal, scale, options, q_segment_ids=None,
                kv_segment_ids=None, mask=None):
    kw = dict(options)
    if q_segment_ids is not None:
        kw.update(q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
    if mask is not None:
        kw["mask"] = mask
    return fn(q, k, v, causal=causal, scale=scale, **kw)


def _compressed_mask(mask4, idx, share: str, h: int):
    """``mask4`` [B|1, H|1, L|1, L] on each head's selected tokens ``idx`` [B, Hs, K'],
    shaped for the folded inner call: [B·H, 1, K'|1, K'] (``share="head"``) or
    [B·Hkv, G|1, K'|1, K'] (``"kv_group"``)."""
    mb, mh, mq, _ = mask4.shape
    b, hs, kk = idx.shape
    bi = jnp.arange(b).reshape(b, 1, 1, 1) if mb > 1 else 0
    if share == "head":
        hi = jnp.arange(h).reshape(1, h, 1, 1) if mh > 1 else 0
        rq = idx[..., :, None] if mq > 1 else 0
        m = mask4[bi, hi, rq, idx[..., None, :]]  # [B, H, K'|1, K']
        return m.reshape(b * h, 1, m.shape[-2], kk)
    g = h // hs
    bi = bi if mb == 1 else bi[..., None]
    hi = (jnp.arange(hs)[:, None] * g + jnp.arange(g)[None, :]).reshape(1, hs, g, 1, 1) \
        if mh > 1 else 0
    rq = idx[:, :, None, :, None] if mq > 1 else 0
    m = mask4[bi, hi, rq, idx[:, :, None, None, :]]  # [B, Hkv, G|1, K'|1, K']
    return m.reshape(b * hs, m.shape[2], m.shape[3], kk)


def _sparse_attention(q, k, v, sel: TokenSelection, *, causal, scale, inner_fn, inner_options,
                      share: str, padded: bool, segment_ids=None, mask4=None):
    """Gather per head, inner attention on the compressed set, scatter back into zeros.

    Heads (or kv groups) are folded into the batch axis of the inner call, so each has its
    own token set: [B·H, K', 1, D] (``share="head"``) or [B·Hkv, K', G, D] (``"kv_group"``);
    unused slots (last in every row) get segment id -1 when ``padded`` or with
    ``segment_ids`` (q [B, L], kv [B, L]: the selected tokens keep their own segment ids,
    so packed segments stay apart); ``mask4`` (rank 4) is gathered onto the selected tokens."""
    b, length, h, d = q.shape
    hk, dv = k.shape[2], v.shape[3]
    g = h // hk
    idx = jnp.minimum(sel.indices, length - 1)
    kk = idx.shape[-1]
    qt, kt, vt = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # [B, heads, L, D]
    if share == "head":
        qc = jnp.take_along_axis(qt, idx[..., None], axis=2)  # [B, H, K', D]
        ig = idx.reshape(b, hk, g, kk, 1)
        kc = jnp.take_along_axis(kt[:, :, None], ig, axis=3).reshape(b, h, kk, d)
        vc = jnp.take_along_axis(vt[:, :, None], ig, axis=3).reshape(b, h, kk, dv)
        fold = lambda x: x.reshape(b * h, kk, 1, x.shape[-1])
        qf, kf, vf = fold(qc), fold(kc), fold(vc)
        heads_idx = sel.indices
    else:
        qg = qt.reshape(b, hk, g, length, d)
        qc = jnp.take_along_axis(qg, idx[:, :, None, :, None], axis=3)  # [B, Hkv, G, K', D]
        qf = jnp.transpose(qc, (0, 1, 3, 2, 4)).reshape(b * hk, kk, g, d)
        kf = jnp.take_along_axis(kt, idx[..., None], axis=2).reshape(b * hk, kk, 1, d)
        vf = jnp.take_along_axis(vt, idx[..., None], axis=2).reshape(b * hk, kk, 1, dv)
        heads_idx = jnp.repeat(sel.indices, g, axis=1)
    def compress(ids):
        rows = jnp.take_along_axis(jnp.asarray(ids, jnp.int32)[:, None, :], idx, axis=2)
        return jnp.where(sel.valid, rows, -1).astype(jnp.int32).reshape(-1, kk)

    q_seg = kv_seg = None
    if segment_ids is not None:
        q_seg, kv_seg = compress(segment_ids[0]), compress(segment_ids[1])
    elif padded:
        q_seg = kv_seg = jnp.where(sel.valid, 0, -1).astype(jnp.int32).reshape(-1, kk)
    mask = None if mask4 is None else _compressed_mask(mask4, idx, share, h)
    out = _inner_call(inner_fn, qf, kf, vf, causal=causal, scale=scale, options=inner_options,
                      q_segment_ids=q_seg, kv_segment_ids=kv_seg, mask=mask)
    if share == "head":
        out = out.reshape(b, h, kk, dv)
    else:
        out = jnp.transpose(out.reshape(b, hk, kk, g, dv), (0, 1, 3, 2, 4)).reshape(b, h, kk, dv)
    bi = jnp.arange(b)[:, None, None]
    hi = jnp.arange(h)[None, :, None]
    full = jnp.zeros((b, h, length, dv), out.dtype).at[bi, hi, heads_idx].set(out, mode="drop")
    return jnp.swapaxes(full, 1, 2).astype(q.dtype)


def _dense_aux(b: int, h: int, length: int, window: int):
    idx = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, h, length))
    return {"indices": idx, "valid": jnp.ones((b, h, length), bool),
            "kept_fraction": jnp.ones((b,), jnp.float32),
            "budget": jnp.full((b,), max(length - window, 0), jnp.int32),
            "dense": jnp.ones((b,), bool)}


_WARNED: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    """Warn ``message`` the first time ``key`` comes up in this process."""
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(f"{_NAME}: {message}", stacklevel=5)


def _dense_reason(length: int, kv_len: int, min_tokens: int, window: int):
    """(key, message) saying why a call is dense by the method's domain, or None."""
    if kv_len != length:
        return "cross", (f"kv_len {kv_len} != q_len {length} (a KV-cache decoding step or "
                         f"cross attention): the method selects tokens in a self-attention "
                         f"prefill only and decodes densely, so this call is dense "
                         f"(aux['dense'] is True)")
    if length <= min_tokens + window:
        return "short", (f"length {length} <= min_tokens + window = {min_tokens} + {window}: "
                         f"dense by the method's rule (aux['dense'] is True); pass a smaller "
                         f"`min_tokens` / `window` to make short sequences sparse")
    return None


def _select_ragged(q, k, *, q_segment_ids, kv_segment_ids, mask4, causal, scale, block_kv,
                   coverage, min_tokens, window, pool, capacity, share):
    """The selection of rows with segment ids or a mask, over each row's own tokens: per-row
    windows and budgets (:func:`_row_layout`), the scores of :func:`_scores_rows` (by
    ``block_kv`` key blocks). Returns (selection, the segment ids the sparse pass masks with,
    tokens per row [B])."""
    b, length = q.shape[:2]
    valid, prefix, win_pos, n_tok = _row_layout(length, window, q_segment_ids, mask4)
    valid = jnp.broadcast_to(valid, (b, length))
    prefix = jnp.broadcast_to(prefix, (b, length))
    win_pos = jnp.broadcast_to(win_pos, (b, window))
    n_tok = jnp.broadcast_to(n_tok, (b,))
    raw = _scores_rows(lax.stop_gradient(q), lax.stop_gradient(k), win_pos=win_pos,
                       valid=valid, prefix=prefix, q_segment_ids=q_segment_ids,
                       kv_segment_ids=kv_segment_ids, mask4=mask4, causal=causal,
                       scale=scale, block_kv=block_kv)
    sel = _select_rows(pool_scores(raw, pool), prefix, win_pos, n_tok <= min_tokens + window,
                       coverage=coverage, min_tokens=min_tokens, capacity=capacity,
                       share=share, kv_heads=k.shape[2])
    own = jnp.where(valid, 0, -1).astype(jnp.int32)
    segments = (own, own) if q_segment_ids is None else (q_segment_ids, kv_segment_ids)
    return sel, segments, n_tok


def _selection_aux(sel, per_row, *, heads: int, share: str) -> dict:
    """The ``aux`` dict of a sparse call: indices/valid per query head ([B, H, ...]; repeated
    over the group when selections are shared per KV head), the kept fraction [B] (1 for a
    dense row), budget and dense flags."""
    g = heads // sel.valid.shape[1]
    valid = sel.valid if share == "head" else jnp.repeat(sel.valid, g, axis=1)
    indices = sel.indices if share == "head" else jnp.repeat(sel.indices, g, axis=1)
    kept = jnp.sum(valid, axis=(1, 2)) / (heads * jnp.maximum(per_row, 1)).astype(jnp.float32)
    kept = jnp.where(sel.dense, 1.0, kept).astype(jnp.float32)
    return {"indices": indices, "valid": valid, "kept_fraction": kept,
            "budget": sel.budget, "dense": sel.dense}


def _token_sparse(q, k, v, *, causal, mask, scale, q_segment_ids, kv_segment_ids, return_aux,
                  coverage, min_tokens, window, pool, capacity, share, inner, inner_options,
                  scorer: Callable, block_kv: int):
    """The method, with the raw (unpooled) scoring pass ``scorer(q, k, window=, causal=,
    scale=) -> [B, H, P]`` of one implementation (rows without segment ids or mask), and
    :func:`_scores_rows` (by ``block_kv`` key blocks) for ragged rows."""
    shapes = validate_qkv(q, k, v, mask=mask, name=_NAME)
    _check_options(coverage=coverage, min_tokens=min_tokens, window=window, pool=pool,
                   capacity=capacity, share=share)
    validate_segment_ids(q, k, q_segment_ids, kv_segment_ids, name=_NAME)
    inner_fn = _resolve_inner(inner)
    inner_options = dict(inner_options or {})
    b, length, h = shapes.batch, shapes.q_len, shapes.heads
    reason = _dense_reason(length, shapes.kv_len, min_tokens, window)
    if reason is not None or float(coverage) == 0.0:
        if reason is not None:
            _warn_once(*reason)
        out = _inner_call(inner_fn, q, k, v, causal=causal, scale=scale, options=inner_options,
                          q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                          mask=mask)
        return (out, _dense_aux(b, h, length, window)) if return_aux else out
    sc = default_scale(shapes.head_dim, scale)
    ragged = mask is not None or q_segment_ids is not None
    mask4 = _as_mask4(mask)
    segments = None
    if ragged:  # per-row windows, budgets and selections over each row's own tokens
        sel, segments, per_row = _select_ragged(
            q, k, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, mask4=mask4,
            causal=causal, scale=sc, block_kv=block_kv, coverage=coverage,
            min_tokens=min_tokens, window=window, pool=pool, capacity=capacity, share=share)
    else:
        raw = scorer(lax.stop_gradient(q), lax.stop_gradient(k), window=window, causal=causal,
                     scale=sc)
        sel = select_tokens(pool_scores(raw, pool), coverage=coverage, min_tokens=min_tokens,
                            window=window, capacity=capacity, share=share,
                            kv_heads=shapes.kv_heads)
        per_row = jnp.full((b,), length, jnp.int32)
    cap = sel.indices.shape[-1] - window
    # Unused slots sit after every used one (index L sorts last). Causal, no used query
    # sees them and their own rows are dropped by the scatter, so they need no masking;
    # not causal, segment id -1 hides them (always given to ragged rows).
    if _is_concrete(sel.budget):  # eager: exact padding and dense decisions
        kb, dn = np.asarray(sel.budget), np.asarray(sel.dense)
        padded = not causal and bool(np.any(kb[~dn] < cap))
        any_dense = bool(dn.any())
    else:
        padded = not causal and cap > min_tokens  # K >= min_tokens fills min_tokens slots
        any_dense = None

    def dense():
        return _inner_call(inner_fn, q, k, v, causal=causal, scale=scale,
                           options=inner_options, q_segment_ids=q_segment_ids,
                           kv_segment_ids=kv_segment_ids, mask=mask)

    if any_dense is True and bool(np.all(np.asarray(sel.dense))):
        out = dense()
    else:
        sparse = lambda: _sparse_attention(q, k, v, sel, causal=causal, scale=scale,
                                           inner_fn=inner_fn, inner_options=inner_options,
                                           share=share, padded=padded, segment_ids=segments,
                                           mask4=mask4)

        def with_dense():
            return jnp.where(sel.dense[:, None, None, None], dense(), sparse())

        if any_dense is None:
            out = lax.cond(jnp.any(sel.dense), with_dense, sparse)
        else:
            out = with_dense() if any_dense else sparse()
    return (out, _selection_aux(sel, per_row, heads=h, share=share)) if return_aux else out


def _xla(q: Float[Array, "B L H D"], k: Float[Array, "B L Hkv D"],
         v: Float[Array, "B L Hkv Dv"], *, causal=False, mask=None, scale=None,
         q_segment_ids=None, kv_segment_ids=None, return_aux=False, coverage=0.005,
         min_tokens=1024, window=128, pool=7, capacity=None, share="head", inner="blockwise",
         inner_options=None, block_kv=TokenScoresConfig.block_kv):
    """The XLA implementation: scoring by :func:`token_scores`' blockwise pass."""
    TokenScoresConfig(block_kv)

    def scorer(q, k, *, window, causal, scale):
        return _scores_xla(q, k, window=window, causal=causal, scale=scale, block_kv=block_kv)

    return _token_sparse(q, k, v, causal=causal, mask=mask, scale=scale,
                         q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                         return_aux=return_aux, coverage=coverage, min_tokens=min_tokens,
                         window=window, pool=pool, capacity=capacity, share=share,
                         inner=inner, inner_options=inner_options, scorer=scorer,
                         block_kv=block_kv)


def _pallas(q: Float[Array, "B L H D"], k: Float[Array, "B L Hkv D"],
            v: Float[Array, "B L Hkv Dv"], *, causal=False, mask=None, scale=None,
            q_segment_ids=None, kv_segment_ids=None, return_aux=False, coverage=0.005,
            min_tokens=1024, window=128, pool=7, capacity=None, share="head", inner="blockwise",
            inner_options=None, block_kv=TokenScoresConfig.block_kv, block_sizes=None,
            interpret=None):
    """The scoring pass as the Pallas kernel ``pallas_kernels.token_scores`` (the rest —
    budget, gather, the inner variant with its own dispatch, scatter — is the XLA path's).
    ``block_sizes``: the kernel's ``BlockSizes`` instead of ``block_kv``; ``interpret``:
    None = on CPU. ``NotImplementedError`` (before any computation) where it cannot serve."""
    TokenScoresConfig(block_kv)
    kernel, interpret = resolve_kernel(_KERNEL_MODULE, interpret)
    if stat_dtype(q, k, v) == jnp.float64:
        raise NotImplementedError("does not support float64 (the kernel computes in float32)")
    sizes = block_sizes or kernel.BlockSizes(block_kv=block_kv)
    reason = kernel.unsupported_block_sizes(sizes, interpret=interpret)
    if reason:
        raise NotImplementedError(reason)

    def scorer(q, k, *, window, causal, scale):
        return kernel.token_scores_pallas(q, k, window=window, causal=causal, scale=scale,
                                          block_sizes=sizes, interpret=interpret)

    return _token_sparse(q, k, v, causal=causal, mask=mask, scale=scale,
                         q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                         return_aux=return_aux, coverage=coverage, min_tokens=min_tokens,
                         window=window, pool=pool, capacity=capacity, share=share,
                         inner=inner, inner_options=inner_options, scorer=scorer,
                         block_kv=block_kv)


# ----------------------------------------------------------------------------
# Reference and public function
# ----------------------------------------------------------------------------
def _reference_selection(q, k, *, causal, scale, coverage, min_tokens, window, pool, capacity,
                         share, q_segment_ids=None, kv_segment_ids=None, mask4=None):
    """Dense, slow selection: bool [B, H, L] (True = token kept for that head). Rows are
    laid out by :func:`_row_layout` (all tokens and the last W as the window without
    segment ids or mask)."""
    b, length, h, d = q.shape
    hk = k.shape[2]
    g = h // hk
    acc = stat_dtype(q, k)
    valid, prefix, win_pos, n_tok = _row_layout(length, window, q_segment_ids, mask4)
    valid = jnp.broadcast_to(valid, (b, length))
    prefix = jnp.broadcast_to(prefix, (b, length))
    win_pos = jnp.broadcast_to(win_pos, (b, window))
    short = jnp.broadcast_to(n_tok, (b,)) <= min_tokens + window
    kr = jnp.repeat(k, g, axis=2).astype(acc)
    x = jnp.einsum("bthd,bshd->bhts", q.astype(acc), kr) * default_scale(d, scale)
    vis = jnp.broadcast_to(valid[:, None, None, :], x.shape)
    if causal:
        vis = vis & jnp.tril(jnp.ones((length, length), bool))
    if q_segment_ids is not None:
        vis = vis & (q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :])
    if mask4 is not None:
        vis = vis & mask4
    rows = jnp.minimum(win_pos, length - 1)[:, None, :, None]
    xw = jnp.take_along_axis(jnp.where(vis, x, -jnp.inf), rows, axis=2)  # [B, H, W, L]
    seen = jnp.any(jnp.isfinite(xw), axis=-1, keepdims=True) & (win_pos < length)[:, None, :,
                                                                                  None]
    probs = jnp.where(seen, jax.nn.softmax(jnp.where(seen, xw, 0.0), axis=-1), 0.0)
    a = jnp.where(prefix[:, None, :], jnp.sum(probs, axis=2) / window, 0.0)  # [B, H, L]
    r = pool // 2
    padded = jnp.pad(a, ((0, 0), (0, 0), (r, r)))
    pooled = sum(padded[..., t:t + length] for t in range(pool)) / pool
    pooled = jnp.where(prefix[:, None, :], pooled, 0.0)
    p_b = jnp.sum(prefix, axis=-1)
    gm = jnp.mean(pooled, axis=1)
    gm = gm / (jnp.sum(gm, -1, keepdims=True) + 1e-8)
    ordered = jnp.sort(jnp.where(prefix, gm, jnp.inf), -1)
    n = jnp.sum(jnp.isfinite(ordered) & (jnp.cumsum(jnp.where(jnp.isfinite(ordered), ordered,
                                                                0.0), -1) < coverage), -1)
    dense = (n == 0) | short
    budget = jnp.where(dense, p_b, jnp.clip(p_b - n - 1, min_tokens, p_b))
    if capacity is not None:
        budget = jnp.minimum(budget, capacity)
    norm = pooled / (jnp.sum(pooled, -1, keepdims=True) + 1e-8)
    if share == "kv_group":
        norm = jnp.repeat(jnp.mean(norm.reshape(b, hk, g, length), axis=2), g, axis=1)
    norm = jnp.where(prefix[:, None, :], norm, -jnp.inf)
    order = jnp.argsort(-norm, axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1, stable=True)  # rank of each token, 0 = best
    keep = (rank < budget[:, None, None]) & prefix[:, None, :]
    keep = keep | (valid & ~prefix)[:, None, :] | dense[:, None, None]
    return lax.stop_gradient(keep)


def token_sparse_reference(
    q: Float[Array, "B T H D"], k: Float[Array, "B S Hkv D"], v: Float[Array, "B S Hkv Dv"],
    *, causal: bool = False, mask: Bool[Array, "..."] | None = None, scale: float | None = None,
    q_segment_ids: Int[Array, "B T"] | None = None,
    kv_segment_ids: Int[Array, "B S"] | None = None, coverage: float = 0.005,
    min_tokens: int = 1024, window: int = 128, pool: int = 7, capacity: int | None = None,
    share: str = "head", inner="blockwise", inner_options=None,
) -> Float[Array, "B T H Dv"]:
    """Exact slow token-sparse attention: the selection from dense [L, L] scores (softmax,
    pool by shifted sums, sort-based budget, argsort ranks; per row over its own tokens
    with segment ids or a mask), then the inner variant's reference with the mask "query
    and key both selected for this head" (and causal, the segment ids and ``mask``): a
    skipped query row is empty, hence exactly 0 — on sparse rows; a dense row is the inner
    reference itself. Outside the sparse domain (module docstring) it is the inner
    reference itself."""
    shapes = validate_qkv(q, k, v, mask=mask, name="token_sparse_reference")
    _check_options(coverage=coverage, min_tokens=min_tokens, window=window, pool=pool,
                   capacity=capacity, share=share)
    if isinstance(inner, str):
        inner_spec = spec_of(inner)
        ref = inner_spec.reference
        inner_options = inner_spec.reference_options(dict(inner_options or {}))
    else:
        ref, inner_options = inner, dict(inner_options or {})
    length = shapes.q_len
    sparse_domain = (_dense_reason(length, shapes.kv_len, min_tokens, window) is None
                     and float(coverage) > 0.0)
    if sparse_domain:
        mask4 = _as_mask4(mask)
        keep = _reference_selection(q, k, causal=causal, scale=scale, coverage=coverage,
                                    min_tokens=min_tokens, window=window, pool=pool,
                                    capacity=capacity, share=share,
                                    q_segment_ids=q_segment_ids,
                                    kv_segment_ids=kv_segment_ids, mask4=mask4)
        both = keep[:, :, :, None] & keep[:, :, None, :]
        mask = both if mask4 is None else both & mask4
    return _inner_call(ref, q, k, v, causal=causal, scale=scale, options=inner_options,
                       q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, mask=mask)


def token_sparse_attention(
    q: Float[Array, "B L H D"],
    k: Float[Array, "B L Hkv D"],
    v: Float[Array, "B L Hkv Dv"],
    *,
    causal: bool = False,
    mask: Bool[Array, "..."] | None = None,
    scale: float | None = None,
    q_segment_ids: Int[Array, "B L"] | None = None,
    kv_segment_ids: Int[Array, "B L"] | None = None,
    coverage: float = 0.005,
    min_tokens: int = 1024,
    window: int = 128,
    pool: int = 7,
    capacity: int | None = None,
    share: str = "head",
    inner: str | Callable = "blockwise",
    inner_options: Mapping[str, Any] | None = None,
    implementation: str | None = None,
    return_aux: bool = False,
    **implementation_options,
):
    """Token Sparse Attention (module docstring): score, budget, per-head selection, the
    inner variant on the compressed tokens, outputs scattered back (zeros where skipped).

    Args:
      q: [B, L, H, D]; k: [B, L, Hkv, D]; v: [B, L, Hkv, Dv]; RoPE already applied.
      causal: causal prefill (pass ``causal=True``; False by default, as for every
        method and for ``attention.get("token_sparse")``).
      mask, q_segment_ids, kv_segment_ids: ragged rows, selected per row (module
        docstring); kv_len ≠ q_len (a decoding step over a KV cache) is dense.
      coverage: mass of the least important prefix tokens allowed to be dropped (a Python
        number in [0, 1); 0 = dense).
      min_tokens: the least number of prefix tokens kept; L ≤ min_tokens + window is dense.
      window: W, the last W tokens score the prefix and are always kept.
      pool: odd average-pool kernel over the scores.
      capacity: static number of prefix slots (jit/vmap with real savings); see
        :func:`select_tokens`.
      share: ``"head"`` or ``"kv_group"`` (see :func:`select_tokens`).
      inner: the attention variant run on the compressed set (a registry name or a
        callable under the contract), ``inner_options`` its keyword options. Default
        ``"blockwise"`` (online softmax by key blocks, the same function as ``"softmax"``
        without the [L, L] scores, so a default call stays O(L) in memory at long L).
      implementation: None, ``"pallas"`` (the scoring kernel) or ``"xla"``.
      return_aux: also return the aux dict (``AUX``: indices, valid, kept_fraction,
        budget, dense).
      implementation_options: ``block_kv`` (scoring key block), and the kernel's
        ``block_sizes`` / ``interpret``.

    Returns:
      [B, L, H, Dv] in q's dtype (and aux with ``return_aux``).
    """
    return TOKEN_SPARSE(q, k, v, causal=causal, mask=mask, scale=scale,
                        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                        implementation=implementation, return_aux=return_aux,
                        coverage=coverage, min_tokens=min_tokens, window=window, pool=pool,
                        capacity=capacity, share=share, inner=inner,
                        inner_options=inner_options, **implementation_options)


# ----------------------------------------------------------------------------
# Layer choice by representation drift
# ----------------------------------------------------------------------------
def drift_per_layer(model, batch: Int[Array, "B T"], *, positions=None) -> np.ndarray:
    """Mean representation drift of each decoder layer, d_l = mean_{b,t} ‖h_out - h_in‖ /
    ‖h_in‖ (h_in, h_out: the residual stream [B, T, D] before and after block l).

    ``model`` is an ``lcjax.nn.DecoderLM`` (duck-typed: ``embed``, ``embed_inputs``,
    ``blocks``, ``config``; each block maps (x, positions) to (x, cache)). Returns
    float64 [num_layers]."""
    tokens = jnp.asarray(batch)
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"drift_per_layer: `batch` must be int tokens [batch, len], got "
                         f"{tokens.dtype} {tokens.shape}")
    b, t = tokens.shape
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    from flax import nnx  # lcjax.nn imports this package: import nnx only when used

    @nnx.jit
    def drifts(model, tokens, positions):
        x = model.embed_inputs(jnp.take(model.embed[...], tokens, axis=0), positions)
        out = []
        for block in model.blocks:
            y, _ = block(x, positions)
            num = jnp.linalg.norm((y - x).astype(jnp.float32), axis=-1)
            den = jnp.linalg.norm(x.astype(jnp.float32), axis=-1)
            out.append(jnp.mean(num / jnp.maximum(den, 1e-12)))
            x = y
        return jnp.stack(out)

    drift = np.asarray(drifts(model, tokens, positions))
    return np.asarray(drift, np.float64)


def sparse_layers(drift: Sequence[float], rule: str | float = "median") -> tuple[int, ...]:
    """Layers to make sparse: drift at or below the median (``rule="median"``, the
    paper's 0.5 quantile) or below the given quantile (``rule=q`` in [0, 1])."""
    d = np.asarray(drift, np.float64)
    if d.ndim != 1 or d.size == 0 or not np.all(np.isfinite(d)):
        raise ValueError(f"sparse_layers: `drift` must be a non-empty finite 1-D sequence, "
                         f"got {drift!r}")
    if rule == "median":
        q = 0.5
    elif isinstance(rule, numbers.Real) and not isinstance(rule, bool) and 0 <= rule <= 1:
        q = float(rule)
    else:
        raise ValueError(f"sparse_layers: `rule` must be 'median' or a quantile in [0, 1], "
                         f"got {rule!r}")
    threshold = np.quantile(d, q)
    return tuple(int(i) for i in np.nonzero(d <= threshold)[0])


def layer_attention(num_layers: int, sparse: Sequence[int], *, sparse_variant="token_sparse",
                    sparse_options: Mapping[str, Any] | None = None, dense_variant="softmax",
                    dense_options: Mapping[str, Any] | None = None):
    """``(attention, attention_options)`` tuples for ``DecoderConfig``: ``sparse_variant``
    in the layers ``sparse``, ``dense_variant`` elsewhere."""
    bad = [i for i in sparse if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"layer_attention: layers {bad} outside [0, {num_layers})")
    chosen = set(sparse)
    names = tuple(sparse_variant if i in chosen else dense_variant for i in range(num_layers))
    opts = tuple(dict(sparse_options or {}) if i in chosen else dict(dense_options or {})
                 for i in range(num_layers))
    return names, opts


# ----------------------------------------------------------------------------
# The spec
# ----------------------------------------------------------------------------
_FEATURES = Features(lse=False)
# the scoring kernel has no segment ids or mask: ragged rows go to the XLA implementation
_PALLAS_FEATURES = Features(lse=False, mask=False, segment_ids=False,
                            dtypes=("float32", "bfloat16", "float16"))
# Tiny conformance shapes (L = 21..27) take the sparse path: P = L - 4 > min_tokens = 6,
# coverage 0.9 leaves K = min_tokens (the top 7 of ≤ 23 tokens always hold > 10% of the
# mass), so every head-sharding agrees with the reference, and capacity 10 > K leaves
# unused slots at the end of each row. Scoring blocks of 8 span several blocks.
_TEST_OPTIONS = {"coverage": 0.9, "min_tokens": 6, "window": 4, "pool": 3, "capacity": 10,
                 "block_kv": 8}

TOKEN_SPARSE = AttentionSpec(
    "token_sparse", reference=token_sparse_reference,
    implementations=(
        Implementation("pallas", _pallas, features=_PALLAS_FEATURES, config=TokenScoresConfig,
                       skip_unless_named=pallas_skip_on_cpu),
        Implementation("xla", _xla, config=TokenScoresConfig),
    ),
    features=_FEATURES, aux=AUX, test_options=_TEST_OPTIONS,
    benchmark_options={"coverage": 0.05, "min_tokens": 1024, "window": 128, "capacity": 2048,
                       "inner": "blockwise"},
    description="Token Sparse Attention: per-head token compression around any inner variant")
