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

import jax
import jax.numpy as jnp
import numpy as np

from lcjax.attention.core import dot_product_attention, merge_attention, validate_qkv

__all__ = [
    "FlashBlockConfig",
    "external_attention",
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
    """

    reuse_ratio: float | None = None
    recompute_heads: tuple[tuple[bool, ...], ...] | None = None
    cos_threshold: float = 0.85
    lse_threshold: float = 0.05

    def __post_init__(self):
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
