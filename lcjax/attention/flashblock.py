"""FlashBlock: cached block-external attention for block-diffusion sampling.

Block diffusion (Arriola et al., ICLR 2025) denoises one block of ``b`` tokens in ``s``
steps; every step re-attends the block's queries to the whole history (the KV cache of
finished blocks) and to the block itself. FlashBlock (code: Caesarhhh/Flash_Block) splits
each query's attention into the **block-external** part (keys of the cache, ``out``) and
the **block-internal** part (keys of the current block, ``in``); with
``A_x = softmax(q K_xᵀ·scale) V_x`` and ``L_x = log Σ_j exp(q·k_j·scale)`` over part x,

    O = (e^{L_out} A_out + e^{L_in} A_in) / (e^{L_out} + e^{L_in})          (1)

which is exactly full attention over the union of the two key sets
(:func:`lcjax.attention.core.merge_attention`, stabilised by the max). The paper's
observation is that ``(A_out, L_out)`` barely moves across the denoising steps of a block,
so FlashBlock computes and caches it at the first step of a block and, at later steps,
recomputes only the (short) internal part and merges it with the cache by (1). Reuse is
exact when the block's queries do not change; otherwise it is an approximation, controlled
by two rules of the public code, both options of :class:`FlashBlockConfig`:

* **per-head recompute mask** (its video path): on a few calibration prompts, run the
  sampler without reuse and measure, per layer and head, the cosine between ``A_out`` at
  step 0 and at step ``s`` and the mean ``|L_out(s) - L_out(0)|``; a head whose cosine is
  below ``cos_threshold`` (0.85) or whose mean ``|ΔL|`` is above ``lse_threshold`` (0.05)
  always recomputes its external part (:func:`head_stability`, :func:`recompute_mask`);
* **token-count rule** (its diffusion-LM path): the history is reused while the number of
  tokens unmasked since it was last computed stays below ``reuse_ratio · b`` and the step
  is not the block's first (:func:`should_refresh`).

This module holds the pure attention functions and the two rules; the block-diffusion
sampler that calls them is :func:`lcjax.nn.diffusion.generate_blocks`
(``flashblock=FlashBlockConfig(...)``). FlashBlock is not an attention *variant* (it takes
two key sets and a cache, not the q/k/v contract), so it is not registered as a spec.
See ``docs/flashblock.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lcjax.attention.core import (
    dot_product_attention,
    grouped_scores,
    merge_attention,
    softmax_rows,
    ungroup,
    validate_qkv,
)
from lcjax.attention.token_sparse import pool_scores

__all__ = [
    "FlashBlockConfig",
    "HistorySelection",
    "external_attention",
    "history_scores",
    "select_history",
    "selection_mask",
    "sparse_external_attention",
    "dropped_attention",
    "sparse_flashblock_attention",
    "flashblock_attention",
    "should_refresh",
    "head_stability",
    "recompute_mask",
]


@dataclasses.dataclass(frozen=True)
class FlashBlockConfig:
    """Options of FlashBlock reuse (hashable: a static argument of the jitted sampler).

    Attributes:
      reuse_ratio: the token-count rule: at step ``s > 0`` of a block the cached
        ``(A_out, L_out)`` is reused while fewer than ``reuse_ratio · block_size`` tokens
        were unmasked since it was computed, and recomputed (and re-cached) otherwise.
        ``None``: always reuse after step 0 (the video path: reuse steps 1..s-1).
      recompute_heads: the per-head recompute mask, one tuple of ``num_heads`` bools per
        layer (True = this head recomputes its external part at every step), e.g. from
        :func:`lcjax.nn.diffusion.calibrate_recompute_heads`; None = no head.
      cos_threshold, lse_threshold: the calibration thresholds of :func:`recompute_mask`
        (the public code's 0.85 and 0.05).
      sparse_keep: compose with a sparse external part
        (:func:`sparse_flashblock_attention`): every step attends only these many history
        keys per head, selected at the refresh steps (the rules above) and reused between
        them; None = dense external part.
      sparse_residual: with ``sparse_keep``, cache the attention over the dropped keys at
        the refresh steps and merge it in at every step (FlashBlock's residual reuse);
        False = sparse attention alone.
      sparse_pool: odd average-pool kernel of the selection scores.
    """

    reuse_ratio: float | None = None
    recompute_heads: tuple[tuple[bool, ...], ...] | None = None
    cos_threshold: float = 0.85
    lse_threshold: float = 0.05
    sparse_keep: int | None = None
    sparse_residual: bool = True
    sparse_pool: int = 1

    def __post_init__(self):
        if self.sparse_keep is not None:
            if isinstance(self.sparse_keep, bool) or not isinstance(self.sparse_keep, int) or (
                    self.sparse_keep < 1):
                raise ValueError(f"FlashBlockConfig: `sparse_keep` must be None or a positive "
                                 f"int, got {self.sparse_keep!r}")
            if self.recompute_heads is not None:
                raise ValueError("FlashBlockConfig: `recompute_heads` applies to the dense "
                                 "external part; it cannot be combined with `sparse_keep`")
        if not isinstance(self.sparse_pool, int) or self.sparse_pool < 1 or (
                self.sparse_pool % 2 == 0):
            raise ValueError(f"FlashBlockConfig: `sparse_pool` must be an odd int >= 1, got "
                             f"{self.sparse_pool!r}")
        if self.reuse_ratio is not None and not (
                isinstance(self.reuse_ratio, int | float) and 0 < self.reuse_ratio <= 1):
            raise ValueError(f"FlashBlockConfig: `reuse_ratio` must be None or in (0, 1], "
                             f"got {self.reuse_ratio!r}")
        if not -1.0 <= float(self.cos_threshold) <= 1.0:
            raise ValueError(f"FlashBlockConfig: `cos_threshold` must be in [-1, 1], "
                             f"got {self.cos_threshold!r}")
        if float(self.lse_threshold) < 0:
            raise ValueError(f"FlashBlockConfig: `lse_threshold` must be >= 0, "
                             f"got {self.lse_threshold!r}")
        if self.recompute_heads is not None:
            heads = tuple(tuple(bool(h) for h in layer) for layer in self.recompute_heads)
            if len({len(layer) for layer in heads}) > 1:
                raise ValueError("FlashBlockConfig: every layer of `recompute_heads` needs the "
                                 f"same number of heads, got {[len(x) for x in heads]}")
            object.__setattr__(self, "recompute_heads", heads)


def external_attention(q, k, v, *, mask=None, scale: float | None = None):
    """Block-external part: ``(A_out [B, T, H, Dv], L_out [B, T, H] float32)`` of the
    block's queries q [B, T, H, D] over the history keys k, v [B, S, Hkv, D] (``mask``
    bool broadcastable to [B, H, T, S]); a query with no visible key has A_out = 0 and
    L_out = -inf, so it adds nothing in (1)."""
    return dot_product_attention(q, k, v, mask=mask, scale=scale, return_lse=True)


class HistorySelection(NamedTuple):
    """History keys kept by the sparse external part: ``indices`` int32 [B, H, K] (slots
    of the history, per query head, best first) and ``valid`` bool [B, H, K] (False: the
    slot holds no visible key — fewer than K were visible — and is ignored)."""

    indices: jax.Array
    valid: jax.Array


def history_scores(q, k, *, mask=None, scale: float | None = None, pool: int = 1):
    """Importance of each history key for the current block, per query head:

        a_h[j] = (1/T) Σ_{i < T} softmax_{j' visible}(scale · q_i·k_j')[j]

    (the block's T queries play the window of token-sparse scoring, Token Sparse
    Attention's a_h over the history instead of a prefix), then the average pool of
    :func:`lcjax.attention.token_sparse.pool_scores` (odd ``pool``, 1 = none).
    q [B, T, H, D], k [B, S, Hkv, D], ``mask`` broadcastable to [B, H, T, S]. Returns
    float32 [B, H, S]; a key no query sees scores -1 (below every visible key)."""
    validate_qkv(q, k, k, mask=mask, name="history_scores")
    probs, _, visible = _history_probs(q, k, mask=mask, scale=scale)
    return _scores_from_probs(probs, visible, pool)


def _history_probs(q, k, *, mask, scale):
    """Softmax of the block's queries over the history in the grouped layout: (probs
    [B, Hkv, G, T, S], L_out [B, Hkv, G, T] (-inf: nothing visible), visible [B, Hkv, G, S])."""
    scores = grouped_scores(q, k, mask=mask, scale=scale)
    probs, m, l = softmax_rows(scores)
    return probs, (m + jnp.log(l))[..., 0], jnp.any(jnp.isfinite(scores), axis=3)


def _scores_from_probs(probs, visible, pool):
    if not isinstance(pool, int) or pool < 1 or pool % 2 == 0:
        raise ValueError(f"history_scores: `pool` must be an odd int >= 1, got {pool!r}")
    b, hk, g, _, s = probs.shape
    a = pool_scores(jnp.mean(probs, axis=3).reshape(b, hk * g, s), pool)
    return jnp.where(visible.reshape(b, hk * g, s), a, -1.0).astype(jnp.float32)


def _select_and_drop(q, k, v, keep, *, mask, scale, pool):
    """One pass over the history at a refresh step: the scores, the selection and the
    dropped part from the same probabilities — with p the full softmax and D the dropped
    keys, m = Σ_{j∈D} p_j, A_drop = Σ_{j∈D} p_j v_j / m and L_drop = L_out + log m (so no
    second score pass; m = 0 gives zeros and -inf)."""
    b, t, h, _ = q.shape
    hk = k.shape[2]
    probs, lse, visible = _history_probs(q, k, mask=mask, scale=scale)
    selection = select_history(_scores_from_probs(probs, visible, pool), keep)
    kept = selection_mask(selection, k.shape[1]).reshape(b, hk, h // hk, 1, k.shape[1])
    dropped = jnp.where(kept, 0.0, probs)
    mass = jnp.sum(dropped, axis=-1)  # [B, Hkv, G, T]
    out = jnp.einsum("bkgts,bskd->btkgd", dropped.astype(v.dtype), v,
                     preferred_element_type=probs.dtype)
    out = ungroup(out / jnp.where(mass > 0, mass, 1.0)[..., None].transpose(0, 3, 1, 2, 4))
    l_drop = jnp.where(mass > 0, lse + jnp.log(jnp.where(mass > 0, mass, 1.0)), -jnp.inf)
    l_drop = jnp.moveaxis(l_drop.reshape(b, h, t), 1, 2)
    return selection, (out.astype(q.dtype), l_drop.astype(jnp.float32))


def select_history(scores, keep: int) -> HistorySelection:
    """The top-``keep`` history keys per query head of ``scores`` [B, H, S]
    (:func:`history_scores`; ties: the lower slot first); slots scoring -1 (invisible)
    are marked invalid. ``keep`` >= S keeps every visible key."""
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"select_history: `keep` must be a positive int, got {keep!r}")
    top, idx = lax.top_k(scores, min(keep, scores.shape[-1]))
    return HistorySelection(idx.astype(jnp.int32), top >= 0)


def selection_mask(selection: HistorySelection, history: int):
    """bool [B, H, S]: True at the valid selected slots of each head (S = ``history``)."""
    b, h, kk = selection.indices.shape
    bi = jnp.arange(b)[:, None, None]
    hi = jnp.arange(h)[None, :, None]
    return jnp.zeros((b, h, history), bool).at[bi, hi, selection.indices].max(
        selection.valid)


def sparse_external_attention(q, k, v, selection: HistorySelection, *, mask=None,
                              scale: float | None = None):
    """Softmax attention of q [B, T, H, D] over the selected history keys only, with its
    log-sum-exp: ``(A_sp [B, T, H, Dv], L_sp [B, T, H] float32)``.

    Each query head gathers its K keys and values (of its kv head, GQA h // G: one
    gather per kv head for the group's G·K slots) and attends over them (``mask``
    [B, H, T, S] gathered the same way, invalid slots masked), so the cost is that of K
    keys, not S. Equals dense attention with ``mask & selection_mask`` (the test's
    reference); a query with no selected visible key gets zeros and -inf."""
    validate_qkv(q, k, v, mask=mask, name="sparse_external_attention")
    b, t, h, d = q.shape
    s, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = h // hk
    idx, valid = selection
    kk = idx.shape[-1]
    if idx.shape != (b, h, kk) or valid.shape != idx.shape:
        raise ValueError(f"sparse_external_attention: selection must be [{b}, {h}, K], got "
                         f"indices {idx.shape}, valid {valid.shape}")
    flat = idx.reshape(b, hk, g * kk)[..., None]  # [B, Hkv, G·K, 1]
    kt, vt = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [B, Hkv, S, D]
    kg = jnp.take_along_axis(kt, flat, axis=2).reshape(b * h, kk, 1, d)
    vg = jnp.take_along_axis(vt, flat, axis=2).reshape(b * h, kk, 1, dv)
    keep = valid[:, :, None, :]  # [B, H, 1, K]
    if mask is not None:
        m = jnp.broadcast_to(jnp.asarray(mask), (b, h, t, s))
        keep = keep & jnp.take_along_axis(m, jnp.broadcast_to(idx[:, :, None, :],
                                                              (b, h, t, kk)), axis=3)
    keep = jnp.broadcast_to(keep, (b, h, t, kk)).reshape(b * h, 1, t, kk)
    qf = jnp.swapaxes(q, 1, 2).reshape(b * h, t, 1, d)
    out, lse = dot_product_attention(qf, kg, vg, mask=keep, scale=scale, return_lse=True)
    out = jnp.swapaxes(out.reshape(b, h, t, dv), 1, 2)
    return out, jnp.swapaxes(lse.reshape(b, h, t), 1, 2)


def dropped_attention(q, k, v, selection: HistorySelection, *, mask=None,
                      scale: float | None = None):
    """``(A_drop, L_drop)``: attention of q over the visible history keys *not* selected
    (dense, with ``mask & ~selection_mask``) — the residual FlashBlock caches when it is
    composed with a sparse external part. ``merge_attention`` of it with
    :func:`sparse_external_attention` is the full external attention."""
    b, _, h, _ = q.shape
    dropped = ~selection_mask(selection, k.shape[1])[:, :, None, :]
    m = dropped if mask is None else jnp.logical_and(mask, dropped)
    return dot_product_attention(q, k, v, mask=jnp.broadcast_to(m, (b, h) + m.shape[2:]),
                                 scale=scale, return_lse=True)


def sparse_flashblock_attention(
    q,
    k_ext,
    v_ext,
    k_in,
    v_in,
    *,
    keep: int,
    ext_mask=None,
    in_mask=None,
    scale: float | None = None,
    pool: int = 1,
    cache: tuple | None = None,
    residual: bool = True,
    return_cache: bool = False,
):
    """FlashBlock composed with a sparse external part (the paper's "residual reuse").

    The block-external part is computed over the ``keep`` history keys per head that the
    block's queries weigh most (:func:`history_scores`, :func:`select_history`) and
    merged by (1) with the exact block-internal part. Sparse attention alone drops the
    other keys' mass; with ``residual=True`` the attention over the *dropped* keys,
    ``(A_drop, L_drop)`` (:func:`dropped_attention`; computed from the same
    probabilities as the selection scores, one pass over the history), is computed once —
    when ``cache`` is None, i.e. at the first step of a block — and reused later, so the
    external part at step s is

        merge(sparse(q_s, kept keys), (A_drop, L_drop)(q_0))

    exact at step 0 and whenever the queries do not change; only the kept keys are
    recomputed with the current queries. ``cache`` = ``(selection, dropped or None)``
    from an earlier call's ``return_cache``: the selection is reused too (no scoring
    pass), as sparse attention for diffusion LMs reuses its pattern across steps.

    Args are those of :func:`flashblock_attention` plus ``keep`` (history keys per head;
    >= S keeps every visible key: exact FlashBlock), ``pool`` (scoring), ``cache``,
    ``residual`` and ``return_cache``. Returns out [B, T, H, Dv] (and the cache).
    """
    name = "sparse_flashblock_attention"
    validate_qkv(q, k_ext, v_ext, mask=ext_mask, name=name)
    validate_qkv(q, k_in, v_in, mask=in_mask, name=name)
    if cache is None and residual:
        selection, dropped = _select_and_drop(q, k_ext, v_ext, keep, mask=ext_mask,
                                              scale=scale, pool=pool)
    elif cache is None:
        selection = select_history(history_scores(q, k_ext, mask=ext_mask, scale=scale,
                                                  pool=pool), keep)
        dropped = None
    else:
        selection, dropped = cache
        if residual and dropped is None:
            raise ValueError(f"{name}: residual=True needs a cache holding the dropped part")
        if not residual:
            dropped = None
    a_out, l_out = sparse_external_attention(q, k_ext, v_ext, selection, mask=ext_mask,
                                             scale=scale)
    if dropped is not None:
        a_out, l_out = merge_attention(a_out, l_out, *dropped)
    a_in, l_in = dot_product_attention(q, k_in, v_in, mask=in_mask, scale=scale,
                                       return_lse=True)
    out, _ = merge_attention(a_in, l_in, a_out, l_out)
    out = out.astype(q.dtype)
    return (out, (selection, dropped)) if return_cache else out


def _heads_external(q, k, v, heads: tuple[int, ...], *, mask, scale):
    """External attention of the query heads ``heads`` only (static indices): each head
    gathered with its own kv head (GQA: h // G), so the cost is that of ``len(heads)``
    heads. Returns ([B, T, n, Dv], [B, T, n])."""
    groups = q.shape[2] // k.shape[2]
    idx = np.asarray(heads)
    kv_idx = idx // groups
    if mask is not None:
        mask = jnp.asarray(mask)
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        if mask.shape[1] != 1:
            mask = mask[:, idx]
    return dot_product_attention(q[:, :, idx], k[:, :, kv_idx], v[:, :, kv_idx], mask=mask,
                                 scale=scale, return_lse=True)


def flashblock_attention(
    q,
    k_ext,
    v_ext,
    k_in,
    v_in,
    *,
    ext_mask=None,
    in_mask=None,
    scale: float | None = None,
    external: tuple[jax.Array, jax.Array] | None = None,
    recompute_heads: Sequence[bool] | None = None,
    return_external: bool = False,
):
    """Attention of the current block's queries over history + block, by the LSE merge (1).

    Args:
      q: [B, T, H, D], the block's queries.
      k_ext, v_ext: [B, S, Hkv, D] / [B, S, Hkv, Dv], the history (KV cache); ``ext_mask``
        bool broadcastable to [B, H, T, S] (True = may attend).
      k_in, v_in: [B, T_in, Hkv, D] / [..., Dv], the block's own keys; ``in_mask``
        broadcastable to [B, H, T, T_in] (None: bidirectional inside the block).
      scale: default 1/sqrt(D).
      external: ``(A_out [B, T, H, Dv], L_out [B, T, H])`` cached at an earlier step, or
        None to compute it now from k_ext, v_ext.
      recompute_heads: with ``external``, a static sequence of H bools: those heads
        recompute their external part from k_ext, v_ext (only they are computed), the
        others reuse ``external``.
      return_external: also return the ``(A_out, L_out)`` used (the fresh one where
        computed) — what a sampler caches at the first step of a block.

    Returns:
      out [B, T, H, Dv] in q's dtype, and ``(A_out, L_out)`` with ``return_external``.
    """
    name = "flashblock_attention"
    validate_qkv(q, k_ext, v_ext, mask=ext_mask, name=name)
    validate_qkv(q, k_in, v_in, mask=in_mask, name=name)
    b, t, h, _ = q.shape
    dv = v_in.shape[-1]
    if v_ext.shape[-1] != dv:
        raise ValueError(f"{name}: value dims of `v_ext` {v_ext.shape} and `v_in` {v_in.shape} "
                         "differ")
    if external is None:
        if recompute_heads is not None:
            raise ValueError(f"{name}: `recompute_heads` needs a cached `external`")
        a_out, l_out = external_attention(q, k_ext, v_ext, mask=ext_mask, scale=scale)
    else:
        a_out, l_out = external
        if a_out.shape != (b, t, h, dv) or l_out.shape != (b, t, h):
            raise ValueError(f"{name}: `external` must be (A_out {(b, t, h, dv)}, L_out "
                             f"{(b, t, h)}), got {a_out.shape} and {l_out.shape}")
        if recompute_heads is not None:
            flags = tuple(bool(x) for x in recompute_heads)
            if len(flags) != h:
                raise ValueError(f"{name}: `recompute_heads` needs {h} entries (heads), "
                                 f"got {len(flags)}")
            heads = tuple(i for i, f in enumerate(flags) if f)
            if heads:
                a_new, l_new = _heads_external(q, k_ext, v_ext, heads, mask=ext_mask,
                                               scale=scale)
                idx = np.asarray(heads)
                a_out = a_out.at[:, :, idx].set(a_new.astype(a_out.dtype))
                l_out = l_out.at[:, :, idx].set(l_new.astype(l_out.dtype))
    a_in, l_in = dot_product_attention(q, k_in, v_in, mask=in_mask, scale=scale,
                                       return_lse=True)
    out, _ = merge_attention(a_in, l_in, a_out, l_out)
    out = out.astype(q.dtype)
    return (out, (a_out, l_out)) if return_external else out


def should_refresh(step: int, dirty: int, block_size: int, reuse_ratio: float | None) -> bool:
    """The token-count rule: recompute (and re-cache) the external part at ``step`` of a
    block iff it is the first step or ``dirty`` — tokens unmasked since the external part
    was last computed — has reached ``reuse_ratio · block_size``; ``reuse_ratio=None``
    never refreshes after step 0."""
    if step == 0:
        return True
    return reuse_ratio is not None and dirty >= reuse_ratio * block_size


def head_stability(externals: Sequence[tuple[jax.Array, jax.Array]]):
    """Cross-step stability of one layer's external attention over one block.

    Args:
      externals: ``[(A_out [B, T, H, Dv], L_out [B, T, H]) for each denoising step]``,
        computed without reuse, step 0 first (at least two steps).

    Returns:
      ``(cos [H], dlse [H])`` float32: the cosine between ``A_out`` at step 0 and at step
      ``s`` per (batch row, query, head) — a zero vector counts as cosine 1 with itself —
      and ``|L_out(s) - L_out(0)|`` (finite entries only), both averaged over rows,
      queries and the steps ``s >= 1``.
    """
    if len(externals) < 2:
        raise ValueError(f"head_stability: needs the externals of >= 2 steps, got "
                         f"{len(externals)}")
    a0, l0 = (jnp.asarray(x, jnp.float32) for x in externals[0])
    cos, dlse = [], []
    for a, lse in externals[1:]:
        a, lse = jnp.asarray(a, jnp.float32), jnp.asarray(lse, jnp.float32)
        dot = jnp.sum(a0 * a, axis=-1)
        norms = jnp.linalg.norm(a0, axis=-1) * jnp.linalg.norm(a, axis=-1)
        both_zero = (jnp.linalg.norm(a0, axis=-1) == 0) & (jnp.linalg.norm(a, axis=-1) == 0)
        c = jnp.where(norms > 0, dot / jnp.where(norms > 0, norms, 1.0), both_zero * 1.0)
        cos.append(jnp.mean(c, axis=(0, 1)))
        finite = jnp.isfinite(l0) & jnp.isfinite(lse)
        d = jnp.where(finite, jnp.abs(lse - l0), 0.0)
        dlse.append(jnp.sum(d, axis=(0, 1)) / jnp.maximum(jnp.sum(finite, axis=(0, 1)), 1))
    return jnp.mean(jnp.stack(cos), 0), jnp.mean(jnp.stack(dlse), 0)


def recompute_mask(cos, dlse, *, cos_threshold: float = 0.85,
                   lse_threshold: float = 0.05) -> tuple[bool, ...]:
    """Per-head recompute flags: ``cos < cos_threshold or dlse > lse_threshold``
    (``cos``, ``dlse`` [H] from :func:`head_stability`)."""
    cos, dlse = np.asarray(cos), np.asarray(dlse)
    return tuple(bool(x) for x in (cos < cos_threshold) | (dlse > lse_threshold))
