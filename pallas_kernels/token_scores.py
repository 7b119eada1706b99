r"""The scoring pass of Token Sparse Attention as Pallas kernels.

Token Sparse Attention (public code dongwonjo/Token-Sparse-Attention,
``sparse_attn/token_sparse/kernel.py``, two Triton kernels — read for the algorithm, not
copied) scores every prefix key by the attention the last W queries pay it. With
q [B, L, H, D], k [B, L, Hkv, D] (query head h reads kv head h // (H/Hkv)), window rows
i ∈ [P, L), P = L - W, and s_ij = scale · q_i·k_j:

    m_i = max_j s_ij,   l_i = Σ_j e^{s_ij - m_i}        (over all L keys; causal: j ≤ i)
    a[j] = (1/W) Σ_i e^{s_ij - m_i} / l_i,   j < P      (prefix keys: visible to every row)

Two kernels over a (batch, head, key block) grid, every axis parallel, so neither the
[L, L] nor the [W, L] matrix is stored and per-program memory does not grow with L:

1. ``_stats_kernel``: the W window rows of one head against one key block of its kv head:
   the block's softmax statistics (m_b, l_b) per row, written per block; the blocks are
   merged outside the kernel (m = max_b m_b, l = Σ_b l_b e^{m_b - m}, an [nk, W] array);
2. ``_columns_kernel``: the window rows against one prefix key block, probabilities
   e^{s - m}/l, summed over the rows (column sums) and divided by W.

On TPU each program holds in VMEM the Wp window rows of its head, one [bk, D] key tile and
the [Wp, bk] float32 score tile (plus Mosaic's double buffers): O(Wp·(D + bk)) whatever L.
On GPU (Triton) the same tiles live in registers / shared memory. Masks are ``jnp.where``
on iotas (keys ≥ L, keys above the diagonal of a window row, padding rows ≥ W); masked
scores are a finite -1e30, so no inf - inf arises; a key block that a row cannot see at all
gets l_b = 0. The window is one block of Wp rows (W padded to a power of two ≥ 16, or ≥ 8
in interpret mode); compiled, Wp·bk is capped (:data:`MAX_TILE`) so the score tile fits
VMEM. Outputs are laid out [.., nk, 1, Wp] (statistics, from key-major [bk, Wp] score
tiles) and [.., npb, 1, bk] (columns), so every block's last two dims equal the array's
(Mosaic accepts any bk) and no lane dimension of size 1 pads to 128 in HBM. Targets:
Mosaic (TPU) and Triton (GPU, ``plgpu.CompilerParams``), chosen per lowering platform with
``lax.platform_dependent``; on CPU use ``interpret=True``. No sort, cumsum or scatter
inside the kernels.

The scores feed a discrete selection: they carry no gradient (inputs are
``lax.stop_gradient``-ed, so ``jax.grad`` through a caller is defined and never enters the
kernels). :func:`token_scores_reference` is the dense pure-jnp computation beside it.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common import (
    F32,
    iota,
    min_block,
    nt,
    pad_to,
    pallas_call_per_platform,
)

__all__ = ["MAX_TILE", "BlockSizes", "merge_stats", "token_scores_pallas",
           "token_scores_reference", "unsupported_block_sizes"]

_NAME = "token_scores_pallas"
NEG = -1e30
# Compiled, the padded window Wp times block_kv is at most this: the [Wp, bk] float32 score
# tile and its exponentials (~3 such tiles live at once) stay within a few MiB of VMEM.
MAX_TILE = 1 << 18


@dataclasses.dataclass(frozen=True, slots=True)
class BlockSizes:
    """Tile sizes. ``block_kv``: keys per tile, a power of two ≥ 16 (≥ 8 in interpret
    mode), clamped to the power-of-two rounded length; on TPU the column kernel's output
    tiles want a multiple of 128 (the default) or the whole padded prefix."""

    block_kv: int = 512

    @classmethod
    def get_default(cls) -> BlockSizes:
        return cls(block_kv=512)


class _Config(NamedTuple):
    window: int  # W
    length: int  # L
    scale: float
    causal: bool
    groups: int
    bk: int
    interpret: bool


def _stats_kernel(q_ref, k_ref, m_ref, l_ref, *, cfg: _Config):
    """Softmax statistics of the window rows over key block j = program_id(2), as [1, Wp]
    rows (the scores are computed key-major, [bk, Wp], so the reductions give lane rows and
    the per-block outputs are not padded to 128 lanes per window row)."""
    j = pl.program_id(2)
    q = q_ref[...]
    wp, bk = q.shape[0], cfg.bk
    q_pos = (cfg.length - cfg.window) + iota((1, wp), 1)
    s = nt(k_ref[...], q) * cfg.scale                           # [bk, Wp]
    k_pos = j * bk + iota((bk, 1), 0)
    valid = k_pos < cfg.length
    if cfg.causal:
        valid = valid & (k_pos <= q_pos)
    s = jnp.where(valid, s, NEG)
    m = jnp.max(s, axis=0, keepdims=True)
    l = jnp.sum(jnp.where(valid, jnp.exp(s - m), 0.0), axis=0, keepdims=True)
    m_ref[...] = m
    l_ref[...] = l


def merge_stats(m_blocks: jax.Array, l_blocks: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Merge per-key-block softmax statistics [..., nk, Wp] over the block axis:
    m = max_b m_b, l = Σ_b l_b e^{m_b - m} -> ([..., Wp], [..., Wp])."""
    m = jnp.max(m_blocks, axis=-2)
    l = jnp.sum(l_blocks * jnp.exp(m_blocks - m[..., None, :]), axis=-2)
    return m, l


def _columns_kernel(q_ref, m_ref, l_ref, k_ref, o_ref, *, cfg: _Config):
    j = pl.program_id(2)
    q = q_ref[...]
    wp, bk = q.shape[0], cfg.bk
    s = nt(q, k_ref[...]) * cfg.scale
    l = l_ref[...]
    p = jnp.exp(s - m_ref[...]) / jnp.where(l > 0, l, 1.0)
    k_pos = j * bk + iota((1, bk), 1)
    keep = (iota((wp, 1), 0) < cfg.window) & (k_pos < cfg.length - cfg.window)
    p = jnp.where(keep, p, 0.0)
    o_ref[...] = jnp.sum(p, axis=0, keepdims=True) * (1.0 / cfg.window)


def unsupported_block_sizes(block_sizes: BlockSizes, *, interpret: bool) -> str | None:
    """Why the kernels cannot run these tiles (None if they can)."""
    if not isinstance(block_sizes, BlockSizes):
        return f"block_sizes must be a BlockSizes, got {type(block_sizes).__name__}"
    low, val = min_block(interpret), block_sizes.block_kv
    if not isinstance(val, numbers.Integral) or val < low or val & (val - 1):
        return f"block_sizes.block_kv must be a power of two >= {low}, got {val}"
    return None


def _check(q, k, window, name):
    for arg, x in (("q", q), ("k", k)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name}: `{arg}` must be rank 4 [batch, len, heads, head_dim], "
                             f"got shape {getattr(x, 'shape', None)}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name}: `{arg}` must be floating point, got dtype {x.dtype}")
    (b, t, h, d), (bk_, s, hk, dk) = q.shape, k.shape
    if bk_ != b or dk != d or hk == 0 or h % hk:
        raise ValueError(f"{name}: `k` {k.shape} does not fit `q` {q.shape} (batch, head_dim, "
                         f"heads % kv_heads == 0)")
    if s != t:
        raise ValueError(f"{name}: q_len {t} must equal kv_len {s} (self-attention prefill)")
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or not (
            1 <= window < t):
        raise ValueError(f"{name}: `window` must be an int in [1, len) = [1, {t}), got "
                         f"{window!r}")
    return b, t, h, d, hk


def token_scores_pallas(
    q: jax.Array,
    k: jax.Array,
    *,
    window: int,
    causal: bool = True,
    scale: float | None = None,
    block_sizes: BlockSizes | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Mean window attention on each prefix key (module docstring), unpooled.

    Args:
      q: [B, L, H, D]; k: [B, L, Hkv, D]; H % Hkv == 0.
      window: W in [1, L).
      causal: window row i sees keys j ≤ i (else all L keys).
      scale: default 1/sqrt(D).
      block_sizes: :class:`BlockSizes` (default ``BlockSizes.get_default()``).
      interpret: run in the Pallas interpreter (required on CPU).

    Returns:
      float32 [B, H, L - W], no gradient.
    """
    b, t, h, d, hk = _check(q, k, window, _NAME)
    bs = BlockSizes.get_default() if block_sizes is None else block_sizes
    reason = unsupported_block_sizes(bs, interpret=bool(interpret))
    if reason:
        raise ValueError(f"{_NAME}: {reason}")
    low = min_block(bool(interpret))
    bk = int(min(bs.block_kv, max(low, pl.next_power_of_2(t))))
    wp = max(low, pl.next_power_of_2(window))
    dp = max(16, pl.next_power_of_2(d))
    p_len = t - window
    nk, npb = -(-t // bk), -(-p_len // bk)
    cfg = _Config(window=int(window), length=t,
                  scale=1.0 / np.sqrt(d) if scale is None else float(scale),
                  causal=bool(causal), groups=h // hk, bk=bk, interpret=bool(interpret))
    q, k = lax.stop_gradient(q), lax.stop_gradient(k)
    qw = pad_to(pad_to(jnp.swapaxes(q[:, t - window:], 1, 2), 2, wp), 3, dp)  # [B,H,Wp,Dp]
    kp = pad_to(pad_to(jnp.swapaxes(k, 1, 2), 2, nk * bk), 3, dp)  # [B, Hkv, Sp, Dp]
    if not interpret and wp * bk > MAX_TILE:
        raise ValueError(f"{_NAME}: the window {window} (padded to {wp} rows) times block_kv "
                         f"{bk} is {wp * bk} score entries per tile, more than {MAX_TILE} "
                         f"(VMEM); pass block_sizes=BlockSizes(block_kv <= "
                         f"{max(low, MAX_TILE // wp)}) or a smaller window")
    g = cfg.groups
    kv_tile = pl.BlockSpec((None, None, bk, dp), lambda b_, h_, j: (b_, lax.div(h_, g), j, 0))
    q_tile = pl.BlockSpec((None, None, wp, dp), lambda b_, h_, j: (b_, h_, 0, 0))
    per_block = pl.BlockSpec((None, None, None, 1, wp), lambda b_, h_, j: (b_, h_, j, 0, 0))
    m_b, l_b = pallas_call_per_platform(
        functools.partial(_stats_kernel, cfg=cfg), grid=(b, h, nk),
        in_specs=[q_tile, kv_tile], out_specs=[per_block, per_block],
        out_shape=[jax.ShapeDtypeStruct((b, h, nk, 1, wp), F32)] * 2,
        interpret=cfg.interpret, name="token_scores_stats")(qw, kp)
    m, l = (x[..., None] for x in merge_stats(m_b[:, :, :, 0], l_b[:, :, :, 0]))
    row = pl.BlockSpec((None, None, wp, 1), lambda b_, h_, j: (b_, h_, 0, 0))
    cols = pallas_call_per_platform(
        functools.partial(_columns_kernel, cfg=cfg), grid=(b, h, npb),
        in_specs=[q_tile, row, row, kv_tile],
        out_specs=pl.BlockSpec((None, None, None, 1, bk), lambda b_, h_, j: (b_, h_, j, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((b, h, npb, 1, bk), F32),
        interpret=cfg.interpret, name="token_scores_columns")(qw, m, l, kp)
    return cols.reshape(b, h, npb * bk)[:, :, :p_len]


def token_scores_reference(q: jax.Array, k: jax.Array, *, window: int, causal: bool = True,
                           scale: float | None = None) -> jax.Array:
    """Dense pure-jnp scores: softmax of the W window rows over all keys, mean over the
    rows, prefix columns: float32 [B, H, L - W]."""
    b, t, h, d, hk = _check(q, k, window, "token_scores_reference")
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    kr = jnp.repeat(k, h // hk, axis=2).astype(F32)
    x = jnp.einsum("bwhd,bshd->bhws", q[:, t - window:].astype(F32), kr) * scale
    if causal:
        rows = (t - window) + jnp.arange(window)
        x = jnp.where(jnp.arange(t)[None, :] <= rows[:, None], x, -jnp.inf)
    return jnp.mean(jax.nn.softmax(x, axis=-1), axis=2)[..., : t - window]
