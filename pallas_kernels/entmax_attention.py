r"""α-entmax attention as Pallas kernels (AdaSplash-2), forward and backward.

AdaSplash: Gonçalves, Treviso & Martins, "AdaSplash: Adaptive Sparse Flash Attention"
(ICML 2025), and its v2 ("AdaSplash-2", histogram-initialised threshold); reference code
deep-spin/adasplash (``adasplash_v2.py``, ``triton_entmax_v2.py``) — read for the
algorithm, not copied. For each query row, with scores x = scale·q·kᵀ,

    z = (α-1)·x,   p_j = [z_j - τ]₊^{1/(α-1)},   τ such that Σ_j p_j = 1,

and out = p·V. The [T, S] score matrix is never stored: every phase below is a pass over
key blocks that recomputes the tile q·kᵀ. Notation and the solver follow
``lcjax/attention/entmax/mapping.py`` (its docstring has the maths); z is shifted by the row max, so
max z = 0, τ ∈ [-1, 0], and z is floored at -2 (masked scores land there and never count).

Forward (``_fwd_kernel``; grid (batch, head, query block), a ``lax.fori_loop`` over key
blocks inside each phase; key blocks above the causal diagonal or beyond the valid length
``kv_lengths[b]`` are never visited):

1. row max of z, and on the way the count n' and mean m' of a top set A' (the scores
   above the running max - 1): by Jensen, f(τ) ≥ n'(m' - τ)^{1/(α-1)} - 1 for any subset,
   so t₀ = max(max z - 1, m' - n'^{1-α}) ≤ τ* — the origin of
   ``lcjax.attention.entmax.mapping`` (AdaSplash-2
   uses max z - 1; the tighter origin keeps the bins informative on flat rows), here with
   no extra pass;
2. histogram (α ∈ {1.5, 2}): per bin b of y = z - t₀ ∈ [0, -t₀], ``bins`` bins of width
   w = -t₀/bins, the count, Σd and Σd² of the in-bin offsets d = y - b·w — ``bins``
   masked row sums, no scatter. From them, exactly and without cancellation, K, S, Q
   (count, Σ(y-e), Σ(y-e)²) of {y ≥ e} at every edge e_j = j·w, hence f and f' at every
   edge, in one pass. The last edge with f ≥ 0 and the next one bracket τ*; closed forms
   raise the lower end (α = 2: (S-1)/K over the top sets; α = 1.5: the root of
   Σ_A (y-t)² = 1 over the set A above the upper edge, all in the support); the first
   iterate is the root of the cubic Hermite interpolant through f, f' at both edges
   (``docs/entmax.md``, "histogram");
3. up to ``n_iter`` solver passes, each evaluating K, S, Q (or Σp for other α) at τ and
   taking the safeguarded step of ``docs/entmax.md`` (α = 1.5: root of the local
   quadratic, Halley where it has none; α = 2: Newton; other α > 1: bisection on
   [t₀, 0]), stopping early once every row of the block has |Σp - 1| < ``tol``. On
   random scores at temperatures 0.1-20 (S = 1024, ``bins=4``) τ reaches float32
   rounding after 1 step for α = 1.5 and 2 steps for α = 2 (``test_one_or_two_steps``);
4. live-tile mask: the last solver pass also records, per key block j, the gap
   g_j = max over the tile of (z - τ_build) at the τ it was run with; after the final step
   a tile is live iff g_j > min_rows (τ_final - τ_build). A weight z > τ_final then always
   lies in a live tile — this is the rule "τ_mask = min(τ used to build the mask, final
   τ)", and it fixes the case where a step lowers τ after the mask was built (a weight in
   (τ_final, τ_build] would otherwise be dropped);
5. output: p·V and Σp accumulated over live tiles only (dead ones skipped with
   ``lax.cond``), out = (Σ p v) / Σp — exact renormalisation at the final τ, as
   ``lcjax.attention.entmax.mapping`` does.

Saved per row: the row max (z units), τ (shifted units; 1e30 on a row with nothing to
attend to) and Σp; per (query block, key block): the live flag.

Backward (``jax.custom_vjp``): with p̂ = p/Σp recomputed from τ, s = p̂^{2-α} on the
support and dp = dO·Vᵀ, dx = s⊙(dp - δ), δ = Σ s·dp / Σ s (the (α-1) of z cancels the
exponent's 1/(α-1)); dq = scale·dx·K, dk = scale·dxᵀ·Q, dv = p̂ᵀ·dO.
``_dq_kernel`` (grid over query blocks) makes two passes over the live key blocks: the row
sums Σs, Σ s·dp, then dq; ``_dkv_kernel`` (grid over key blocks of each kv head) loops over
the query heads of its group and over the live query blocks. Backward block sizes may
differ from the forward ones: the live mask is carried over to their tiles by overlap.

Layout: our q [B, T, H, D], k/v [B, S, Hkv, D(v)] are transposed to [B, H, T, D] and
padded (T, S to the blocks, D to a power of two ≥ 16) in the wrapper, so every block's last
two dims are either a multiple of (8, 128) or the array's own (TPU) and every loaded tile
has a power-of-two size (Triton); per-row values are [block_q, 1] columns in the kernels and
are stored lane-dense, [B, H, T/block_q, 1, block_q] (``_rows_in``). Query head h reads
kv head h // (H/Hkv) through the index_map (grouped-query attention).

Targets: the same kernel bodies lower through Mosaic (TPU) and, with
``jax.experimental.pallas.triton.CompilerParams``, through Triton (GPU); the choice is
made per lowering platform with ``lax.platform_dependent``. Inside kernels there is no
sort, cumsum, scatter, 1-D ref or masked load: masks are ``jnp.where`` on iotas, the
per-tile flag is read as a vector reduction. On CPU use ``interpret=True``.

Memory: on GPU (Triton) a block is a pointer, so K and V of one head (Q, dO and the row
statistics of one group in dk/dv) are passed as whole-sequence blocks and sliced per tile.
On TPU a BlockSpec block is copied into VMEM whole, so the TPU body (``_Seq``) leaves
those operands in HBM (``pl.ANY``) and copies the tiles it reads into two-slot VMEM
scratch buffers (``pltpu.make_async_copy``): the dense passes (row max, histogram,
solver) double-buffer (``_stream``: tile j+1 is copied while tile j is computed), the
passes over live tiles only (output, dq, dk/dv) copy each live tile when they reach it, so
a dead tile is neither copied nor computed. Per program, VMEM then holds (Pallas
double-buffers the pipelined blocks; a [1, n] f32/int32 row pads to 8 sublanes, 32·n B):

  forward  2·(bq·(D + Dv)·e + 5·32·bq + 32·nk) + 2·bk·(D + Dv)·e
  dq       2·(bq·(2D + Dv)·e + (4 + [α array])·32·bq + 32·nk) + 2·bk_dq·(D + Dv)·e
  dk/dv    2·(2·bk·(D + Dv)·e + G·32·nq) + 2·bq·(D + Dv)·e + 4·64·bq

bytes (bq, bk the kernel's tiles, e the bytes per element, nk, nq the key/query tile
counts rounded up to a power of two: the live flags), plus the [bq, bk] f32 temporaries of
a tile and the f32 accumulators ([bq, Dv] forward, [bq, D] dq, [bk, D] + [bk, Dv] dk/dv).
With the default 128×128 tiles, D = Dv = 128 and bf16 the forward's blocks and buffers
are 0.8 MiB at S = 1M; the live flags (32 B per tile) are the only term that grows with
the sequence (256 KiB at S = 1M). Per-row statistics live in HBM lane-dense (below). The
interpreter runs the TPU body in the TPU interpret mode (``pltpu.InterpretParams``: DMAs
and semaphores simulated), so the CPU tests check what Mosaic compiles; the Triton body
differs only in how ``_Seq`` reads a tile.
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
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.common import (
    F32,
    TpuCall,
    iota,
    min_block,
    nn,
    nt,
    pad_to,
    pallas_call_per_platform,
    rowsum,
    tn,
)
from pallas_kernels.entmax_rules import alpha_cotangent, hermite_root, polish_step, solver_step

__all__ = ["BlockSizes", "entmax_attention_pallas", "entmax_attention_reference",
           "unsupported_block_sizes"]

_NAME = "entmax_attention_pallas"
NEG = -1e30  # a masked score (finite, so no inf - inf inside the kernels)
BIG = 1e30  # τ of a row with nothing to attend to: every z - τ is -1e30, p = 0
_TINY = 1e-30


@dataclasses.dataclass(frozen=True, slots=True)
class BlockSizes:
    """Tile sizes: powers of two ≥ 16, clamped to the (power-of-two rounded) lengths.

    Attributes:
      block_q: query rows per program of the forward kernel.
      block_k: keys per tile of the forward kernel — the granularity of the live-tile mask.
      block_q_dq, block_k_dq: tiles of the dq kernel (default: the forward ones).
      block_q_dkv, block_k_dkv: tiles of the dk/dv kernel (default: the forward ones).
    """

    block_q: int
    block_k: int
    block_q_dq: int | None = None
    block_k_dq: int | None = None
    block_q_dkv: int | None = None
    block_k_dkv: int | None = None

    @classmethod
    def get_default(cls) -> BlockSizes:
        return cls(block_q=128, block_k=128)


class _Config(NamedTuple):
    alpha: float | None  # static α, or None: per-head α read from the kernels' alpha input
    causal: bool
    scale: float
    kind: str  # solver step: "quadratic" | "newton" | "bisect"
    init: str  # "histogram" | "origin" | "bracket"
    n_iter: int
    bins: int
    tol: float
    kv_len: int  # S (the bracket's upper end -S^{1-α})
    q_len: int  # true T (rows beyond it are padding)
    groups: int  # H // Hkv
    bq: int
    bk: int
    bq_dq: int
    bk_dq: int
    bq_dkv: int
    bk_dkv: int
    interpret: bool


# ----------------------------------------------------------------------------
# Small in-kernel helpers (2-D only: they lower through Mosaic and Triton alike)
# ----------------------------------------------------------------------------
def _rowmax(x):
    return jnp.max(x, axis=1, keepdims=True)


def _pick(vec, idx):
    """vec[0, idx] of an int32 [1, n] vector as a scalar (a masked reduction: no dynamic
    lane indexing, which TPU vector registers do not have)."""
    return jnp.max(jnp.where(iota(vec.shape, 1) == idx, vec, 0))


def _cdiv(a, b: int):
    return lax.div(a + (b - 1), b)


def _n_key_blocks(L, qi, bq: int, bk: int, n_blocks: int, causal: bool):
    """Key blocks a query block must visit: below the valid length and the causal diagonal."""
    n = jnp.minimum(_cdiv(jnp.maximum(L, 0), bk), n_blocks)
    if causal:
        n = jnp.minimum(n, _cdiv((qi + 1) * bq, bk))
    return n


def _key_slice(j, bk: int):
    return pl.ds(pl.multiple_of(j * bk, bk), bk)


class _Seq(NamedTuple):
    """A sequence-long operand [..., N, d], read one [n, d] tile at a time.

    Triton: ``ref`` is the block the BlockSpec made resident and ``lead`` the indices
    still to apply in front of the rows (``()`` or a query head of the group). TPU (and
    its interpreter): ``ref`` is the whole array left in HBM (``pl.ANY``), ``lead`` its
    (batch, head) and each tile is copied into the VMEM scratch ``buf`` (semaphore
    ``sem``) when read — VMEM holds two tiles (``buf`` [2, n, d], ``sem`` [2]: one slot
    for a synchronous read, both for ``_stream``), whatever the sequence length."""

    ref: object
    lead: tuple = ()
    buf: object = None
    sem: object = None

    def tile(self, j, n: int):
        """Rows [j·n, (j+1)·n) of a [..., N, d] operand; of a per-row statistic stored as
        [..., N/n, 1, n] (``_rows_in``), the [n, 1] column of block j. On TPU a copy into
        slot 0, awaited."""
        if self.buf is None:
            return self.shape(self.ref[(*self.lead, *self.index(j, n))])
        copy = self.copy(j, n, 0)
        copy.start()
        copy.wait()
        return self.shape(self.buf[0])

    def index(self, j, n: int) -> tuple:
        return (j,) if self.ref.shape[-2] == 1 else (_key_slice(j, n),)

    def shape(self, x):
        return x.T if self.ref.shape[-2] == 1 else x

    def copy(self, j, n: int, slot):
        """The DMA of tile j into buffer slot ``slot`` (TPU only)."""
        src = self.ref.at[(*self.lead, *self.index(j, n))]
        return pltpu.make_async_copy(src, self.buf.at[slot], self.sem.at[slot])

    def length(self) -> int:
        return self.ref.shape[-2]


def _scores(q, k, c: float, qpos0, kpos0, L, causal: bool):
    """c·q·kᵀ with masked entries at NEG ([bq, bk], float32)."""
    x = nt(q, k) * c
    kpos = kpos0 + iota((1, x.shape[1]), 1)
    valid = kpos < L
    if causal:
        valid = valid & (kpos <= qpos0 + iota((x.shape[0], 1), 0))
    return jnp.where(valid, x, NEG)


def _is(alpha, value: float) -> bool:
    """Whether α is the static number ``value`` (never for a per-head α, a traced array)."""
    return isinstance(alpha, float) and alpha == value


def _shifted(x, mz):
    """z - max z, floored at -2 (masked and dead entries end there, below every τ)."""
    return jnp.maximum(x - mz, -2.0)


def _weights(u, alpha: float):
    """[u]₊^{1/(α-1)} for u ≥ 0 (the unnormalised entmax weight); α a static float or a
    per-head [1, 1] array."""
    if _is(alpha, 1.5):
        return u * u
    if _is(alpha, 2.0):
        return u
    pos = u > 0
    return jnp.where(pos, jnp.exp(jnp.log(jnp.maximum(u, _TINY)) / (alpha - 1.0)), 0.0)


def _sens(u, alpha: float):
    """u^{(2-α)/(α-1)} on the support: s = p^{2-α} up to a per-row factor."""
    if _is(alpha, 1.5):
        return u
    if _is(alpha, 2.0):
        return (u > 0).astype(F32)
    pos = u > 0
    e = (2.0 - alpha) / (alpha - 1.0)
    return jnp.where(pos, jnp.exp(e * jnp.log(jnp.maximum(u, _TINY))), 0.0)


def _sens_scale(l, alpha: float):
    """The per-row factor (Σp)^{α-2} that turns _sens(u) into p̂^{2-α}, p̂ = p/Σp."""
    pos = l > 0
    if _is(alpha, 2.0):
        return jnp.ones_like(l)
    if _is(alpha, 1.5):
        return jnp.where(pos, lax.rsqrt(jnp.where(pos, l, 1.0)), 0.0)
    return jnp.where(pos, jnp.exp((alpha - 2.0) * jnp.log(jnp.where(pos, l, 1.0))), 0.0)


def _inv(l):
    pos = l > 0
    return jnp.where(pos, 1.0 / jnp.where(pos, l, 1.0), 0.0)


def _resolve(solver: str, alpha: float | None) -> tuple[str, str]:
    """(step kind, initialisation) of ``solver`` at a static α, or None for a per-head
    α
    (the rule of ``lcjax.attention.entmax.mapping.SolverConfig.resolve``: Newton from the
    power-mean origin,
    and bisection on the heads with α > 2)."""
    if solver == "bisect" or (alpha is not None and alpha > 2.0):
        return "bisect", "bracket"
    kind = "quadratic" if _is(alpha, 1.5) else "newton"
    return kind, ("histogram" if solver == "histogram" and alpha in (1.5, 2.0) else "origin")


# ----------------------------------------------------------------------------
# Threshold initialisation from the histogram (elementwise on [bq, 1] statistics)
# ----------------------------------------------------------------------------
def _histogram_init(stats, alpha: float, bins: int, t0, w):
    """Bracket (lo, hi) ∋ τ* and first iterate τ₀ (z units) from per-bin statistics.

    The bins split [t0, 0] (t0 ≤ τ*) into ``bins`` bins of width w; ``stats`` holds, per
    bin b, (count, Σd, Σd²) of the offsets d = y - b·w of the scores y = z - t0 that fall
    in [b·w, (b+1)·w) (the top bin also holds y = -t0, the row max)."""
    zero = jnp.zeros_like(t0)
    K, S, Q = [zero] * (bins + 1), [zero] * (bins + 1), [zero] * (bins + 1)
    for j in range(bins):  # top-down sums about edge e_j = t0 + j·w: every term is ≥ 0
        kj, sj, qj = zero, zero, zero
        for b in range(j, bins):
            cnt, sd, sd2 = stats[b]
            off = (b - j) * w
            kj = kj + cnt
            sj = sj + sd + cnt * off
            qj = qj + sd2 + 2.0 * off * sd + cnt * (off * off)
        K[j], S[j], Q[j] = kj, sj, qj
    G = Q if alpha == 1.5 else S  # f(e_j) + 1
    f = [g - 1.0 for g in G]  # f[bins] = -1: nothing above max z
    n_pos = sum((f[j] >= 0).astype(F32) for j in range(bins))
    jstar = jnp.clip(n_pos - 1.0, 0.0, bins - 1.0)

    def select(vals, shift):
        out = vals[shift]
        for j in range(1, bins):
            out = jnp.where(jstar == j, vals[j + shift], out)
        return out

    fa, fb = select(f, 0), select(f, 1)
    ka, kb = select(K, 0), select(K, 1)
    sa, sb = select(S, 0), select(S, 1)
    a = t0 + jstar * w
    b = jnp.where(jstar == bins - 1, 0.0, a + w)
    eps = 1e-6
    if alpha == 1.5:
        da, db = -2.0 * sa, -2.0 * sb
        # Σ_A (y - t)² = 1 over A = {y ≥ b} (all in the support at τ* ≤ b): a lower bound
        disc = jnp.maximum(sb * sb - kb * fb, 0.0)
        den = sb + jnp.sqrt(disc)
        t_a = jnp.where(den > 0, b + fb / jnp.where(den > 0, den, 1.0), a)
        lo = jnp.clip(t_a - eps, a, b)
    else:
        da, db = -ka, -kb
        # (S - 1)/K over a top set is a lower bound of τ* (τ* is their maximum)
        t_a = a + fa / jnp.where(ka > 0, ka, 1.0)
        t_b = jnp.where(kb > 0, b + fb / jnp.where(kb > 0, kb, 1.0), a)
        lo = jnp.clip(jnp.maximum(t_a, t_b) - eps, a, b)
    hi = b
    tau0 = jnp.clip(a + (b - a) * hermite_root(fa, fb, da, db, b - a), lo, hi)
    return lo, hi, tau0


# ----------------------------------------------------------------------------
# Forward kernel
# ----------------------------------------------------------------------------
def _stream(seqs, lo, hi, n: int, body, carry):
    """``fori_loop`` over tiles j ∈ [lo, hi) of every ``_Seq`` in ``seqs``:
    carry = body(j, [tile j of each], carry). On TPU the copy of tile j + 1 (into the
    other buffer slot) runs while tile j is computed (double buffering)."""
    if seqs[0].buf is None:
        return lax.fori_loop(lo, hi, lambda j, c: body(j, [s.tile(j, n) for s in seqs], c),
                             carry)

    def start(j, slot):
        for seq in seqs:
            seq.copy(j, n, slot).start()

    @pl.when(lo < hi)
    def _():
        start(lo, 0)

    def step(j, c):
        slot = lax.rem(j - lo, 2)
        for seq in seqs:
            seq.copy(j, n, slot).wait()

        @pl.when(j + 1 < hi)
        def _():
            start(j + 1, 1 - slot)

        return body(j, [seq.shape(seq.buf[slot]) for seq in seqs], c)

    return lax.fori_loop(lo, hi, step, carry)


def _seqs(refs, lead, scratch):
    """A ``_Seq`` per ref: resident blocks (no scratch: Triton), or arrays in HBM read
    through the scratch ``(*buffers, semaphores)`` (TPU), ``lead`` their (batch, head)."""
    if not scratch:
        return [_Seq(r) for r in refs]
    *bufs, sems = scratch
    return [_Seq(r, lead, buf, sems.at[i]) for i, (r, buf) in enumerate(zip(refs, bufs))]


def _kv_lead(groups: int):
    """(batch, kv head) of the program's query head (grids over (batch, head, block))."""
    return pl.program_id(0), lax.div(pl.program_id(1), groups)


def _fwd_kernel(len_ref, alpha_ref, q_ref, k_ref, v_ref, o_ref, mz_ref, tau_ref, l_ref, it_ref,
                live_ref, taub_ref, *scratch, cfg: _Config):
    bq, bk, bins = cfg.bq, cfg.bk, cfg.bins
    K, V = _seqs((k_ref, v_ref), _kv_lead(cfg.groups), scratch)
    alpha = cfg.alpha if cfg.alpha is not None else alpha_ref[...]  # float or [1, 1]
    am1 = alpha - 1.0
    c = cfg.scale * am1
    qi = pl.program_id(2)
    L = jnp.max(len_ref[...])
    nkb = _n_key_blocks(L, qi, bq, bk, K.length() // bk, cfg.causal)
    qpos0 = qi * bq
    q = q_ref[...]
    live_shape = live_ref.shape  # (1, NKP)
    kiota = iota(live_shape, 1)
    zeros = jnp.zeros((bq, 1), F32)

    def x_tile(j, k=None):  # scores of key tile j (k: the tile, if already read)
        k = K.tile(j, bk) if k is None else k
        return _scores(q, k, c, qpos0, j * bk, L, cfg.causal)

    # 1. one pass: row max (z units) and the count and Σ(z - max) of the set A' of scores
    # above the running max - 1 when seen, for the origin t0 = mean_A' - |A'|^{1-α} ≤ τ*
    # (docs/entmax.md, "one pass for the max and the origin")
    def max_body(j, k, carry):
        m, cnt, s = carry
        x = x_tile(j, *k)
        m_new = jnp.maximum(m, _rowmax(x))
        sel = (x > m_new - 1.0) & (x > 0.5 * NEG)
        s = s + cnt * (m - m_new) + rowsum(jnp.where(sel, x - m_new, 0.0))
        return m_new, cnt + rowsum(sel.astype(F32)), s

    xmax, cnt, ssum = _stream([K], 0, nkb, bk, max_body,
                              (jnp.full((bq, 1), NEG, F32), zeros, zeros))
    rows = qpos0 + iota((bq, 1), 0)
    dead = (xmax < 0.5 * NEG) | (rows >= cfg.q_len)
    mz = jnp.where(dead, 0.0, xmax)
    n_a = jnp.maximum(cnt, 1.0)
    t0 = ssum / n_a - _inv_power(n_a, alpha) - 8 * float(np.finfo(np.float32).eps)
    if cfg.alpha is None:  # the origin is a bound for α ≤ 2 only
        t0 = jnp.where(am1 <= 1.0, jnp.maximum(t0, -1.0), -1.0)
        hi = zeros - jnp.exp(-am1 * float(np.log(cfg.kv_len)))
    else:
        t0 = jnp.maximum(t0, -1.0) if alpha <= 2.0 else jnp.full((bq, 1), -1.0, F32)
        hi = jnp.full((bq, 1), -float(cfg.kv_len) ** (-am1), F32)  # τ ≤ max z - S^{1-α}

    def z_tile(j, k=None):
        return _shifted(x_tile(j, k), mz)

    # 2. initialisation: histogram of z on [t0, 0] (α ∈ {1.5, 2}), the origin, or a bracket
    if cfg.init == "histogram":
        w = -t0 / bins
        inv_w = 1.0 / w

        def hist_body(j, k, acc):
            y = z_tile(j, *k) - t0
            idx = jnp.minimum(jnp.floor(y * inv_w), bins - 1.0)  # y < 0: no bin
            d = y - idx * w
            out = []
            for b in range(bins):
                sel = (idx == b).astype(F32)
                sd = sel * d
                out += [acc[3 * b] + rowsum(sel), acc[3 * b + 1] + rowsum(sd),
                        acc[3 * b + 2] + (rowsum(sd * d) if alpha == 1.5 else 0.0)]
            return tuple(out)

        acc = _stream([K], 0, nkb, bk, hist_body, (zeros,) * (3 * bins))
        stats = [acc[3 * b:3 * b + 3] for b in range(bins)]
        lo, hi, tau0 = _histogram_init(stats, alpha, bins, t0, w)
    elif cfg.init == "origin":
        lo, tau0 = t0, t0
    else:
        lo = jnp.full((bq, 1), -1.0, F32)
        tau0 = 0.5 * (lo + hi)
    tau0 = jnp.where(dead, BIG, tau0)

    # 3. solver passes (the loop of lcjax.attention.entmax): each evaluates the sums at τ
    # and records the per-tile gap max (z - τ); a row stops when |f| < tol (taking the
    # polish step), after n_iter steps, or when τ no longer moves
    def stats_body(tau):
        def body(j, k, carry):
            kk, ss, pp, gaps = carry
            z = z_tile(j, *k)
            u = jnp.maximum(z - tau, 0.0)
            gaps = jnp.where(kiota == j, jnp.max(z - tau), gaps)
            if cfg.kind == "bisect":
                return kk, ss, pp + rowsum(_weights(u, alpha)), gaps
            if _is(alpha, 1.5) or _is(alpha, 2.0):
                kk, ss = kk + rowsum((u > 0).astype(F32)), ss + rowsum(u)
                return kk, ss, pp + (rowsum(u * u) if _is(alpha, 1.5) else rowsum(u)), gaps
            # any other α: P = Σ u^c and -f' = c·Σ u^{c-1}
            return kk + rowsum(_sens(u, alpha)) / am1, ss, pp + rowsum(_weights(u, alpha)), gaps
        return body

    def solve_cond(state):
        it, *_, done, _, _ = state
        return (it <= cfg.n_iter) & (jnp.min(done) < 0.5)

    def solve_body(state):
        it, tau, lo, hi, iters, done, tau_fin, _ = state
        gaps0 = jnp.full(live_shape, NEG, F32)
        kk, ss, pp, gaps = _stream([K], 0, nkb, bk, stats_body(tau),
                                   (zeros, zeros, zeros, gaps0))
        f = pp - 1.0
        new_tau, lo, hi = solver_step(cfg.kind, tau, f, kk, ss, lo, hi)
        polished = jnp.clip(polish_step(cfg.kind, tau, f, kk, ss), lo, hi)
        if cfg.alpha is None and cfg.kind != "bisect":  # a head with α > 2: bisection
            concave = am1 > 1.0
            new_tau = jnp.where(concave, 0.5 * (lo + hi), new_tau)
            polished = jnp.where(concave, tau, polished)
        was_done = done > 0.5
        converged = jnp.abs(f) < cfg.tol
        stop = was_done | converged | (it >= cfg.n_iter) | (new_tau == tau)
        tau_fin = jnp.where(stop & ~was_done, jnp.where(converged, polished, tau), tau_fin)
        iters = jnp.where(stop, iters, iters + 1)
        tau_next = jnp.where(stop, tau, new_tau)
        return it + 1, tau_next, lo, hi, iters, stop.astype(F32), tau_fin, gaps

    state = (jnp.int32(0), tau0, lo, hi, jnp.zeros((bq, 1), jnp.int32), dead.astype(F32),
             tau0, jnp.full(live_shape, NEG, F32))
    _, tau_build, _, _, iters, _, tau, gaps = lax.while_loop(solve_cond, solve_body, state)
    # 4. the τ_build/τ_final rule: z > τ implies z - τ_build > τ - τ_build ≥ the minimum
    shift = jnp.min(jnp.where(dead, BIG, tau - tau_build))
    maybe_live = (gaps > shift).astype(jnp.int32)

    # 5. output over the tiles that may be live; records the exact live tiles (some p > 0)
    def out_body(j, carry):
        def on(carry):
            acc, l, live = carry
            p = _weights(jnp.maximum(z_tile(j) - tau, 0.0), alpha)
            v = V.tile(j, bk)
            hit = (jnp.max(p) > 0).astype(jnp.int32)
            return acc + nn(p.astype(v.dtype), v), l + rowsum(p), jnp.where(kiota == j, hit,
                                                                               live)

        return lax.cond(_pick(maybe_live, j) > 0, on, lambda carry: carry, carry)

    acc0 = (jnp.zeros(o_ref.shape, F32), zeros, jnp.zeros(live_shape, jnp.int32))
    acc, l, live = lax.fori_loop(0, nkb, out_body, acc0)
    o_ref[...] = (acc * _inv(l)).astype(o_ref.dtype)
    mz_ref[...] = mz.T  # per-row statistics are stored lane-dense, [1, bq]
    tau_ref[...] = tau.T
    l_ref[...] = l.T
    it_ref[...] = iters.T
    live_ref[...] = live
    taub_ref[...] = tau_build.T


def _inv_power(n, alpha: float):
    """n^{1-α} for n ≥ 1."""
    if _is(alpha, 1.5):
        return lax.rsqrt(n)
    if _is(alpha, 2.0):
        return 1.0 / n
    return jnp.exp((1.0 - alpha) * jnp.log(n))


# ----------------------------------------------------------------------------
# Backward kernels
# ----------------------------------------------------------------------------
def _dq_kernel(len_ref, alpha_ref, q_ref, k_ref, v_ref, do_ref, mz_ref, tau_ref, l_ref,
               live_ref, dq_ref, delta_ref, *rest, cfg: _Config):
    bq, bk = cfg.bq_dq, cfg.bk_dq
    learn = cfg.alpha is None  # per-head α: also the rows' ∂L/∂α (da_ref)
    da_ref, scratch = rest[:learn], rest[learn:]
    K, V = _seqs((k_ref, v_ref), _kv_lead(cfg.groups), scratch)
    alpha = alpha_ref[...] if learn else cfg.alpha
    c = cfg.scale * (alpha - 1.0)
    qi = pl.program_id(2)
    L = jnp.max(len_ref[...])
    nkb = _n_key_blocks(L, qi, bq, bk, K.length() // bk, cfg.causal)
    qpos0 = qi * bq
    q, do = q_ref[...], do_ref[...]
    mz, tau = mz_ref[...].T, tau_ref[...].T  # [1, bq] rows -> [bq, 1] columns
    live = live_ref[...]
    l = l_ref[...].T
    kappa = _sens_scale(l, alpha)
    inv_l, log_l = _inv(l), jnp.log(jnp.where(l > 0, l, 1.0))

    def tile(j):
        k, v = K.tile(j, bk), V.tile(j, bk)
        z = _shifted(_scores(q, k, c, qpos0, j * bk, L, cfg.causal), mz)
        u = jnp.maximum(z - tau, 0.0)
        return k, u, _sens(u, alpha), nt(do, v)

    def sums_body(j, carry):
        def on(carry):
            _, u, r, dp = tile(j)
            new = [r, r * dp]
            if learn:  # p̂ = p/Σp, log p̂ on the support, for Σ p̂ dp, H, Σ p̂ log p̂ dp
                p = _weights(u, alpha) * inv_l
                logp = jnp.log(jnp.maximum(u, _TINY)) / (alpha - 1.0) - log_l
                plogp = jnp.where(u > 0, p * logp, 0.0)
                new += [p * dp, plogp, plogp * dp]
            return tuple(acc + rowsum(x) for acc, x in zip(carry, new))

        return lax.cond(_pick(live, j) > 0, on, lambda carry: carry, carry)

    zeros = jnp.zeros((bq, 1), F32)
    sums = lax.fori_loop(0, nkb, sums_body, (zeros,) * (5 if learn else 2))
    delta = sums[1] * _inv(sums[0])
    if learn:
        p_dp, ent, plogp_dp = sums[2:]
        da_ref[0][...] = alpha_cotangent(p_dp, delta, ent, plogp_dp, alpha - 1.0).T

    def dq_body(j, dq):
        def on(dq):
            k, _, r, dp = tile(j)
            ds = kappa * r * (dp - delta)
            return dq + nn(ds.astype(k.dtype), k)

        return lax.cond(_pick(live, j) > 0, on, lambda dq: dq, dq)

    dq = lax.fori_loop(0, nkb, dq_body, jnp.zeros(q.shape, F32))
    dq_ref[...] = (dq * cfg.scale).astype(dq_ref.dtype)
    delta_ref[...] = delta.T


def _dkv_kernel(len_ref, alpha_ref, q_ref, k_ref, v_ref, do_ref, mz_ref, tau_ref, l_ref,
                delta_ref, live_ref, dk_ref, dv_ref, *scratch, cfg: _Config):
    bq, bk, G = cfg.bq_dkv, cfg.bk_dkv, cfg.groups
    b, hkv, kj = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    seqs = _seqs((q_ref, do_ref, mz_ref, tau_ref, l_ref, delta_ref), (), scratch)

    def group_head(g):  # the sequences of query head g of the group
        lead = (b, hkv * G + g) if scratch else (g,)
        return [seq._replace(lead=lead) for seq in seqs]

    L = jnp.max(len_ref[...])
    n_qblocks = seqs[0].length() // bq
    kpos0 = kj * bk
    q_lo = lax.div(kpos0, bq) if cfg.causal else 0  # first query block that sees this block
    q_hi = jnp.where(kpos0 < L, n_qblocks, q_lo)  # a block past the length: nothing to do
    k, v = k_ref[...], v_ref[...]

    def head_body(g, carry):
        Q, DO, MZ, TAU, LS, DELTA = group_head(g)
        live = live_ref[g]
        alpha = alpha_ref[g] if cfg.alpha is None else cfg.alpha  # query head g of the group
        c = cfg.scale * (alpha - 1.0)

        def q_body(i, carry):
            def on(carry):
                dk, dv = carry
                q, do = Q.tile(i, bq), DO.tile(i, bq)
                mz, tau = MZ.tile(i, bq), TAU.tile(i, bq)
                l, delta = LS.tile(i, bq), DELTA.tile(i, bq)
                z = _shifted(_scores(q, k, c, i * bq, kpos0, L, cfg.causal), mz)
                u = jnp.maximum(z - tau, 0.0)
                p = _weights(u, alpha) * _inv(l)
                dp = nt(do, v)
                ds = _sens_scale(l, alpha) * _sens(u, alpha) * (dp - delta)
                dv = dv + tn(p.astype(do.dtype), do)
                dk = dk + tn(ds.astype(q.dtype), q)
                return dk, dv

            return lax.cond(_pick(live, i) > 0, on, lambda carry: carry, carry)

        return lax.fori_loop(q_lo, q_hi, q_body, carry)

    init = (jnp.zeros(k.shape, F32), jnp.zeros(v.shape, F32))
    dk, dv = lax.fori_loop(0, G, head_body, init)
    dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------
# pallas_call plumbing
# ----------------------------------------------------------------------------


def _row_spec(bq):
    """Block i of a per-row statistic [B, H, nq, 1, bq] (``_rows_in``)."""
    return pl.BlockSpec((None, None, None, 1, bq), lambda b, h, i: (b, h, i, 0, 0))


def _rows_in(x, bq: int):
    """A per-row statistic [B, H, Tp] as the kernels take it, [B, H, Tp/bq, 1, bq]: one
    lane-dense [1, bq] block per query block (an [n, 1] column would be stored padded to
    128 lanes on TPU, 128 times its size)."""
    B, H, Tp = x.shape
    return x.reshape(B, H, Tp // bq, 1, bq)


def _rows_out(x):
    """[B, H, nq, 1, bq] -> [B, H, Tp]."""
    return x.reshape(*x.shape[:2], -1)


def _len_spec():
    return pl.BlockSpec((None, 1, 1), lambda b, h, i: (b, 0, 0))


def _alpha_spec():
    """α of query head h from the [H, 1, 1] array (grids over (batch, head, block))."""
    return pl.BlockSpec((None, 1, 1), lambda b, h, i: (h, 0, 0))


_HBM = pl.BlockSpec(memory_space=pl.ANY)  # left in HBM: the TPU kernels copy tiles


def _fold_vmap(call, alpha_pos: int):
    """``call(*args)`` (every argument but the per-head α [H, 1, 1] at ``alpha_pos``, and
    every output, lead with the batch axis B) under ``vmap``: the mapped axis is folded
    into B. (Pallas's own batching rule adds a grid axis, which TPU does not allow on
    operands left in HBM.) A mapped α is refused: it would need a per-batch α."""

    @jax.custom_batching.custom_vmap
    def folded(*args):
        return tuple(call(*args))

    @folded.def_vmap
    def rule(axis_size, in_batched, *args):
        if in_batched[alpha_pos]:
            raise NotImplementedError(f"{_NAME}: vmap over a per-head `alpha` array is not "
                                      "supported; map over the batch of q, k, v instead")
        merged = [x if i == alpha_pos else
                  (x if in_batched[i] else jnp.broadcast_to(x, (axis_size, *x.shape)))
                  .reshape(axis_size * x.shape[int(in_batched[i])], *x.shape[1 + in_batched[i]:])
                  for i, x in enumerate(args)]
        outs = folded(*merged)
        return (tuple(o.reshape(axis_size, o.shape[0] // axis_size, *o.shape[1:])
                      for o in outs), (True,) * len(outs))

    return folded


def _tile_scratch(*tiles):
    """TPU scratch for ``_Seq`` reads: a two-slot VMEM buffer per tile (shape, dtype), and
    a DMA semaphore per slot."""
    return [pltpu.VMEM((2, *shape), dtype) for shape, dtype in tiles] + [
        pltpu.SemaphoreType.DMA((len(tiles), 2))]


def _pallas_call(kernel, *, grid, in_specs, out_specs, out_shape, interpret: bool | str,
                 name: str,
                 tpu_in_specs, tpu_scratch_shapes):
    """:func:`pallas_call_per_platform` with the TPU form of an entmax kernel: the same body,
    its long operands left in HBM (``tpu_in_specs``) and copied tile by tile into
    ``tpu_scratch_shapes``. ``interpret="tpu"`` runs that TPU form in the TPU interpreter
    (the tests check what Mosaic compiles); ``interpret=True`` the generic form in the plain
    interpreter (no ordered effects: it can sit in a ``lax.platform_dependent`` branch)."""
    tpu = TpuCall(kernel, grid, tpu_in_specs, out_specs, tpu_scratch_shapes)
    return pallas_call_per_platform(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                                    out_shape=out_shape, interpret=interpret,
                                    name=name, tpu=tpu)


def _forward(q, k, v, lens, alpha, cfg: _Config):
    B, H, Tp, Dp = q.shape
    Sp, Dvp = k.shape[2], v.shape[3]
    G, bq, bk = cfg.groups, cfg.bq, cfg.bk
    nq, nk = Tp // bq, Sp // bk
    nkp = pl.next_power_of_2(nk)
    row = jax.ShapeDtypeStruct((B, H, nq, 1, bq), F32)
    head = [_len_spec(), _alpha_spec(),
            pl.BlockSpec((None, None, bq, Dp), lambda b, h, i: (b, h, i, 0))]
    kernel = functools.partial(_fwd_kernel, cfg=cfg)
    outs = _pallas_call(
        kernel,
        grid=(B, H, nq),
        in_specs=head + [
            pl.BlockSpec((None, None, Sp, Dp), lambda b, h, i: (b, lax.div(h, G), 0, 0)),
            pl.BlockSpec((None, None, Sp, Dvp), lambda b, h, i: (b, lax.div(h, G), 0, 0)),
        ],
        tpu_in_specs=head + [_HBM, _HBM],
        tpu_scratch_shapes=_tile_scratch(((bk, Dp), k.dtype), ((bk, Dvp), v.dtype)),
        out_specs=[
            pl.BlockSpec((None, None, bq, Dvp), lambda b, h, i: (b, h, i, 0)),
            _row_spec(bq), _row_spec(bq), _row_spec(bq), _row_spec(bq),
            pl.BlockSpec((None, None, None, 1, nkp), lambda b, h, i: (b, h, i, 0, 0)),
            _row_spec(bq),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((B, H, Tp, Dvp), q.dtype), row, row, row,
            jax.ShapeDtypeStruct((B, H, nq, 1, bq), jnp.int32),
            jax.ShapeDtypeStruct((B, H, nq, 1, nkp), jnp.int32), row,
        ],
        interpret=cfg.interpret,
        name="entmax_attention_fwd",
    )(lens, alpha, q, k, v)
    out, mz, tau, l, iters, live, taub = outs
    mz, tau, l, iters, taub = map(_rows_out, (mz, tau, l, iters, taub))
    return out, mz, tau, l, iters, live[:, :, :, 0, :nk], taub


def _regrid(live, bq_f: int, bk_f: int, bq: int, bk: int, Tp: int, Sp: int):
    """Live flags of the forward tiles -> flags of (bq, bk) tiles: live if any overlapping
    forward tile is (a plain-XLA product of small 0/1 matrices, outside the kernels)."""
    if (bq, bk) == (bq_f, bk_f):
        return live

    def overlap(n: int, b_new: int, b_old: int):
        new = np.arange(n // b_new)[:, None]
        old = np.arange(n // b_old)[None, :]
        ok = (old * b_old < (new + 1) * b_new) & ((old + 1) * b_old > new * b_new)
        return jnp.asarray(ok, F32)

    oq, ok = overlap(Tp, bq, bq_f), overlap(Sp, bk, bk_f)
    hits = jnp.einsum("ij,bhjk,lk->bhil", oq, live.astype(F32), ok)
    return (hits > 0).astype(jnp.int32)


def _backward(q, k, v, lens, alpha, mz, tau, l, live, d_out, cfg: _Config):
    """[dq, dk, dv] and, for a per-head α (``cfg.alpha`` None), the rows' ∂L/∂α
    [B, H, Tp] (summed into dα by ``_core_bwd``)."""
    B, H, Tp, Dp = q.shape
    Hkv, Sp, Dvp = k.shape[1], k.shape[2], v.shape[3]
    G = cfg.groups
    # dq (+ δ) over query blocks
    bq, bk = cfg.bq_dq, cfg.bk_dq
    live_q = _regrid(live, cfg.bq, cfg.bk, bq, bk, Tp, Sp)
    nq, nk = Tp // bq, Sp // bk
    nkp = pl.next_power_of_2(nk)
    live_q = jnp.pad(live_q, ((0, 0), (0, 0), (0, 0), (0, nkp - nk)))[:, :, :, None, :]
    learn = cfg.alpha is None
    q_spec = [_len_spec(), _alpha_spec(),
              pl.BlockSpec((None, None, bq, Dp), lambda b, h, i: (b, h, i, 0))]
    rest = [pl.BlockSpec((None, None, bq, Dvp), lambda b, h, i: (b, h, i, 0)),
            _row_spec(bq), _row_spec(bq), _row_spec(bq),
            pl.BlockSpec((None, None, None, 1, nkp), lambda b, h, i: (b, h, i, 0, 0))]
    kernel = functools.partial(_dq_kernel, cfg=cfg)
    dq, delta, *da_rows = _pallas_call(
        kernel,
        grid=(B, H, nq),
        in_specs=q_spec + [
            pl.BlockSpec((None, None, Sp, Dp), lambda b, h, i: (b, lax.div(h, G), 0, 0)),
            pl.BlockSpec((None, None, Sp, Dvp), lambda b, h, i: (b, lax.div(h, G), 0, 0)),
        ] + rest,
        tpu_in_specs=q_spec + [_HBM, _HBM] + rest,
        tpu_scratch_shapes=_tile_scratch(((bk, Dp), k.dtype), ((bk, Dvp), v.dtype)),
        out_specs=[
            pl.BlockSpec((None, None, bq, Dp), lambda b, h, i: (b, h, i, 0)),
            _row_spec(bq),
        ] + [_row_spec(bq)] * learn,
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((B, H, nq, 1, bq), F32)]
        + [jax.ShapeDtypeStruct((B, H, nq, 1, bq), F32)] * learn,
        interpret=cfg.interpret,
        name="entmax_attention_dq",
    )(lens, alpha, q, k, v, d_out, *[_rows_in(x, bq) for x in (mz, tau, l)], live_q)
    delta, da_rows = _rows_out(delta), [_rows_out(x) for x in da_rows]
    # dk, dv over key blocks of each kv head (looping over its G query heads)
    bq, bk = cfg.bq_dkv, cfg.bk_dkv
    live_k = _regrid(live, cfg.bq, cfg.bk, bq, bk, Tp, Sp)
    nq, nk = Tp // bq, Sp // bk
    nqp = pl.next_power_of_2(nq)
    live_k = jnp.pad(jnp.swapaxes(live_k, 2, 3), ((0, 0), (0, 0), (0, 0), (0, nqp - nq)))
    live_k = live_k[:, :, :, None, :]  # [B, H, nk, 1, nqp]
    group_rows = pl.BlockSpec((None, G, nq, 1, bq), lambda b, g, j: (b, g, 0, 0, 0))
    alpha_spec = pl.BlockSpec((G, 1, 1), lambda b, g, j: (g, 0, 0))  # the group's heads' α
    k_spec = pl.BlockSpec((None, None, bk, Dp), lambda b, g, j: (b, g, j, 0))
    v_spec = pl.BlockSpec((None, None, bk, Dvp), lambda b, g, j: (b, g, j, 0))
    live_spec = pl.BlockSpec((None, G, None, 1, nqp), lambda b, g, j: (b, g, j, 0, 0))
    kernel = functools.partial(_dkv_kernel, cfg=cfg)
    dk, dv = _pallas_call(
        kernel,
        grid=(B, Hkv, nk),
        in_specs=[
            _len_spec(), alpha_spec,
            pl.BlockSpec((None, G, Tp, Dp), lambda b, g, j: (b, g, 0, 0)),
            k_spec, v_spec,
            pl.BlockSpec((None, G, Tp, Dvp), lambda b, g, j: (b, g, 0, 0)),
            group_rows, group_rows, group_rows, group_rows, live_spec,
        ],
        tpu_in_specs=[_len_spec(), alpha_spec, _HBM, k_spec, v_spec] + [_HBM] * 5 + [live_spec],
        tpu_scratch_shapes=_tile_scratch(((bq, Dp), q.dtype), ((bq, Dvp), d_out.dtype),
                                         *[((1, bq), F32)] * 4),
        out_specs=[
            pl.BlockSpec((None, None, bk, Dp), lambda b, g, j: (b, g, j, 0)),
            pl.BlockSpec((None, None, bk, Dvp), lambda b, g, j: (b, g, j, 0)),
        ],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        interpret=cfg.interpret,
        name="entmax_attention_dkv",
    )(lens, alpha, q, k, v, d_out, *[_rows_in(x, bq) for x in (mz, tau, l, delta)], live_k)
    return [dq, dk, dv, *da_rows]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _core(q, k, v, lens, alpha, cfg: _Config):
    return _fold_vmap(functools.partial(_forward, cfg=cfg), 4)(q, k, v, lens, alpha)


def _core_fwd(q, k, v, lens, alpha, cfg):
    outs = _fold_vmap(functools.partial(_forward, cfg=cfg), 4)(q, k, v, lens, alpha)
    _, mz, tau, l, _, live, _ = outs
    return outs, (q, k, v, lens, alpha, mz, tau, l, live)


def _core_bwd(cfg, res, cts):
    q, k, v, lens, alpha, mz, tau, l, live = res
    dq, dk, dv, *da_rows = _fold_vmap(functools.partial(_backward, cfg=cfg), 4)(
        q, k, v, lens, alpha, mz, tau, l, live, cts[0].astype(q.dtype))
    # ∂L/∂α_h: the rows' contributions summed over batch and queries (padded rows give 0)
    d_alpha = (jnp.sum(da_rows[0], axis=(0, 2))[:, None, None].astype(alpha.dtype) if da_rows
               else jnp.zeros_like(alpha))
    return dq, dk, dv, np.zeros(lens.shape, jax.dtypes.float0), d_alpha


_core.defvjp(_core_fwd, _core_bwd)


# ----------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------
def _check_alpha(alpha, heads: int):
    """(static α, None) for a Python number > 1 (the kernels are specialised on it), or
    (None, float32 α [H, 1, 1]) for a floating JAX/NumPy array of shape [] or [H]."""
    if isinstance(alpha, bool):
        raise ValueError(f"{_NAME}: `alpha` must be a number > 1 or a float array [heads], "
                         f"got {alpha!r}")
    if isinstance(alpha, numbers.Real):
        if not float(alpha) > 1.0:
            raise ValueError(f"{_NAME}: `alpha` must be > 1 (alpha = 1 is softmax), got {alpha}")
        return float(alpha), None
    shape = getattr(alpha, "shape", None)
    dtype = getattr(alpha, "dtype", None)
    if shape not in ((), (heads,)) or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"{_NAME}: `alpha` must be a Python number > 1 or a floating array of shape [] "
            f"or [heads] = ({heads},), got {type(alpha).__name__} shape {shape} dtype {dtype}")
    if isinstance(alpha, np.ndarray) and not np.all(alpha > 1.0):
        raise ValueError(f"{_NAME}: every `alpha` must be > 1, got min {np.min(alpha)}")
    arr = jnp.broadcast_to(jnp.asarray(alpha, F32), (heads,))
    return None, arr[:, None, None]


def _check_qkv(q, k, v, name: str = _NAME):
    """(B, T, H, D, S, Hkv, Dv); ValueError naming the argument and shapes otherwise."""
    for arg, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name}: `{arg}` must be rank 4 [batch, len, heads, head_dim], "
                             f"got shape {getattr(x, 'shape', None)}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name}: `{arg}` must be floating point, got dtype {x.dtype}")
    (B, T, H, D), (_, S, Hkv, Dk) = q.shape, k.shape
    if k.shape[0] != B or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"{name}: batch/kv shapes differ: q {q.shape}, k {k.shape}, "
                         f"v {v.shape}")
    if Dk != D:
        raise ValueError(f"{name}: head_dim of `q` {q.shape} and `k` {k.shape} differ")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"{name}: heads of `q` ({H}) must be a multiple of kv_heads of `k` "
                         f"({Hkv}); got q {q.shape}, k {k.shape}")
    return B, T, H, D, S, Hkv, v.shape[3]


def unsupported_block_sizes(block_sizes: BlockSizes, *, interpret: bool) -> str | None:
    """Why the kernel cannot run these tiles (None if it can): every size a power of two
    ≥ 16 (≥ 8 in interpret mode)."""
    low = min_block(interpret)
    for f in dataclasses.fields(block_sizes):
        val = getattr(block_sizes, f.name)
        if val is None and f.name not in ("block_q", "block_k"):
            continue
        if not isinstance(val, numbers.Integral) or val < low or val & (val - 1):
            return f"block_sizes.{f.name} must be a power of two >= {low}, got {val}"
    return None


def _block(value, length: int, interpret: bool) -> int:
    """A tile size clamped to the (power-of-two rounded) length."""
    low = min_block(interpret)
    return int(min(value, max(low, pl.next_power_of_2(length))))


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _block_sparsity(live, bq: int, bk: int, causal: bool):
    """Fraction of the tiles at or below the causal diagonal (all if not causal) with no
    weight, from the exact live flags [B, H, nq, nk]."""
    nq, nk = live.shape[-2:]
    in_range = np.ones((nq, nk), bool)
    if causal:
        in_range = np.arange(nk)[None, :] * bk <= (np.arange(nq) * bq + bq - 1)[:, None]
    counted = int(in_range.sum()) * live.shape[0] * live.shape[1]
    return ((counted - jnp.sum(live & in_range)) / counted).astype(F32)


def entmax_attention_pallas(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    alpha: float = 1.5,
    causal: bool = False,
    scale: float | None = None,
    kv_lengths: jax.Array | None = None,
    solver: str,
    n_iter: int,
    bins: int,
    tol: float,
    block_sizes: BlockSizes | None = None,
    interpret: bool | str = False,
    return_aux: bool = False,
):
    """α-entmax attention (AdaSplash-2) with Pallas kernels; differentiable in q, k, v (and
    in an array α).

    The solver settings have no defaults here: ``lcjax.attention.entmax`` passes every value
    of its one configuration (``lcjax.attention.entmax.mapping.SolverConfig``), so the kernel
    and the XLA
    path cannot drift apart; ``docs/entmax.md`` has the algorithm.

    Args:
      q: [B, T, H, D]; k: [B, S, Hkv, D]; v: [B, S, Hkv, Dv]; H % Hkv == 0.
      alpha: a Python number > 1 (the kernels are specialised on it: closed forms for 1.5
        and 2), or a float array [H] or [] — per query head, traced, differentiable (the
        backward returns dα; the caller keeps it > 1, e.g. ``lcjax.attention.entmax``
        clamps it to ``lcjax.attention.entmax.mapping.ALPHA_ARRAY_FLOOR``). An array α runs
        Newton from
        the power-mean origin (bisection on heads with α > 2), as the XLA path does.
      causal: query t attends to keys s ≤ t (top-left alignment).
      scale: score scale (default 1/sqrt(D)).
      kv_lengths: optional int [B]: keys s ≥ kv_lengths[b] are masked (a length 0 row
        returns zeros).
      solver: ``"histogram"``, ``"newton"`` or ``"bisect"`` (as ``SolverConfig``).
      n_iter: cap on solver steps (≥ 0); each pass is one q·kᵀ sweep.
      bins: histogram bins, 2, 4 or 8.
      tol: a row stops once |Σp - 1| < tol (and takes one last step from those sums).
      block_sizes: ``BlockSizes`` (default ``BlockSizes.get_default()``).
      interpret: run the kernels in the Pallas interpreter (required on CPU): True for the
        generic (Triton) form, ``"tpu"`` for the TPU form (operands in HBM, tiles copied into
        VMEM) in the TPU interpreter.
      return_aux: also return a dict with ``tau`` [B, T, H] (threshold in the convention
        p = [(α-1)·x - τ]₊^{1/(α-1)} on x = scale·q·kᵀ, +inf on empty rows),
        ``iterations`` [B, T, H] int32 (solver steps after the initialisation),
        ``block_sparsity`` (float32; the fraction of (batch, head, query block, key block)
        tiles at or below the causal diagonal without weight), ``tau_build`` (the τ the
        tile gaps were measured at) and ``live`` [B, H, nq, nk] (bool: tiles holding weight).

    Returns: [B, T, H, Dv] in q's dtype (and the aux dict when ``return_aux``).
    """
    B, T, H, D, S, Hkv, Dv = _check_qkv(q, k, v)
    a, alpha_arr = _check_alpha(alpha, H)
    if solver not in ("histogram", "newton", "bisect"):
        raise ValueError(f"{_NAME}: `solver` must be 'histogram', 'newton' or 'bisect', "
                         f"got {solver!r}")
    if bins not in (2, 4, 8):
        raise ValueError(f"{_NAME}: `bins` must be 2, 4 or 8, got {bins}")
    if not isinstance(n_iter, numbers.Integral) or n_iter < 0:
        raise ValueError(f"{_NAME}: `n_iter` must be an integer >= 0, got {n_iter}")
    if not tol > 0:
        raise ValueError(f"{_NAME}: `tol` must be > 0, got {tol}")
    bs = BlockSizes.get_default() if block_sizes is None else block_sizes
    if not isinstance(bs, BlockSizes):
        raise ValueError(f"{_NAME}: `block_sizes` must be a BlockSizes, got {type(bs).__name__}")
    reason = unsupported_block_sizes(bs, interpret=interpret)
    if reason:
        raise ValueError(f"{_NAME}: {reason}")
    if T == 0 or S == 0:
        raise ValueError(f"{_NAME}: empty sequence: q {q.shape}, k {k.shape}")
    if interpret not in (False, True, "tpu"):
        raise ValueError(f"{_NAME}: `interpret` must be False, True or 'tpu', got {interpret!r}")
    interp = interpret
    bq, bk = _block(bs.block_q, T, interp), _block(bs.block_k, S, interp)
    bq_dq = _block(bs.block_q_dq or bs.block_q, T, interp)
    bk_dq = _block(bs.block_k_dq or bs.block_k, S, interp)
    bq_dkv = _block(bs.block_q_dkv or bs.block_q, T, interp)
    bk_dkv = _block(bs.block_k_dkv or bs.block_k, S, interp)
    if kv_lengths is None:
        lens = jnp.full((B,), S, jnp.int32)
    else:
        kv_lengths = jnp.asarray(kv_lengths)
        if kv_lengths.shape != (B,) or not jnp.issubdtype(kv_lengths.dtype, jnp.integer):
            raise ValueError(
                f"{_NAME}: `kv_lengths` must be integer of shape [batch] = ({B},), got "
                f"{kv_lengths.dtype}{list(kv_lengths.shape)}"
            )
        lens = jnp.clip(kv_lengths, 0, S).astype(jnp.int32)
    kind, init = _resolve(solver, a)
    cfg = _Config(
        alpha=a, causal=bool(causal), scale=1.0 / np.sqrt(D) if scale is None else float(scale),
        kind=kind, init=init, n_iter=int(n_iter), bins=int(bins), tol=float(tol), kv_len=S,
        q_len=T, groups=H // Hkv, bq=bq, bk=bk, bq_dq=bq_dq, bk_dq=bk_dq, bq_dkv=bq_dkv,
        bk_dkv=bk_dkv, interpret=interp,
    )
    Tp = _round_up(T, max(bq, bq_dq, bq_dkv))
    Sp = _round_up(S, max(bk, bk_dq, bk_dkv))
    Dp, Dvp = max(16, pl.next_power_of_2(D)), max(16, pl.next_power_of_2(Dv))

    def prep(x, n, d):  # [B, N, h, d] -> [B, h, N_padded, d_padded]
        return pad_to(pad_to(jnp.swapaxes(x, 1, 2), 2, n), 3, d)

    if alpha_arr is None:
        alpha_arr = jnp.full((H, 1, 1), a, F32)  # unused by the kernels (static α)
    out, mz, tau, _, iters, live, taub = _core(
        prep(q, Tp, Dp), prep(k, Sp, Dp), prep(v, Sp, Dvp), lens[:, None, None], alpha_arr,
        cfg
    )
    out = jnp.swapaxes(out[:, :, :T, :Dv], 1, 2)
    if not return_aux:
        return out

    def per_row(t):  # [B, H, Tp] -> [B, T, H]
        return jnp.swapaxes(lax.stop_gradient(t)[:, :, :T], 1, 2)

    def conv(t):  # shifted z units -> entmax convention on x
        return per_row(jnp.where(tau >= 0.5 * BIG, jnp.inf, t + mz))

    nq, nk = -(-T // bq), -(-S // bk)
    live = lax.stop_gradient(live[:, :, :nq, :nk] > 0)
    aux = {"tau": conv(tau), "iterations": per_row(iters),
           "block_sparsity": _block_sparsity(live, bq, bk, causal),
           "tau_build": conv(taub), "live": live}
    return out, aux


# ----------------------------------------------------------------------------
# Dense reference (pure jnp)
# ----------------------------------------------------------------------------
def _threshold_sort(z, alpha: float):
    """Exact τ of p = [z - τ]₊^{1/(α-1)} for α ∈ {1.5, 2} by sorting (Peters et al. 2019,
    Alg. 2; Michelot 1986)."""
    n = z.shape[-1]
    zs = -jnp.sort(-z, axis=-1)
    kk = jnp.arange(1, n + 1, dtype=z.dtype)
    if alpha == 2.0:
        cs = jnp.cumsum(zs, axis=-1) - 1.0
        support = jnp.maximum(jnp.sum((kk * zs > cs).astype(jnp.int32), -1, keepdims=True), 1)
        return jnp.take_along_axis(cs, support - 1, axis=-1) / support.astype(z.dtype)
    mean = jnp.cumsum(zs, axis=-1) / kk
    delta = (1.0 - kk * (jnp.cumsum(zs * zs, axis=-1) / kk - mean * mean)) / kk
    pos = delta > 0  # a NaN-free gradient where delta <= 0 (entries past the support)
    tau = mean - jnp.where(pos, jnp.sqrt(jnp.where(pos, delta, 1.0)), 0.0)
    support = jnp.maximum(jnp.sum((tau <= zs).astype(jnp.int32), -1, keepdims=True), 1)
    return jnp.take_along_axis(tau, support - 1, axis=-1)


def _threshold_bisect(z, alpha: float, n_iter: int = 60):
    """τ by bisection on [max z - 1, max z] (any α > 1), then one Newton step from the
    bisected τ with that τ held constant: its value is τ to rounding and its derivative is
    the implicit one, ∂τ/∂z_j = u_j^{c-1} / Σ u^{c-1} (u = [z - τ]₊, c = 1/(α-1)), so
    autodiff through this reference is exact. (Differentiating the bisection loop itself
    gives a wrong gradient: its iterates move with z only through max z.)"""
    z0 = lax.stop_gradient(z)

    def halve(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        f = jnp.sum(_weights(jnp.maximum(z0 - mid, 0.0), alpha), -1, keepdims=True) - 1.0
        return jnp.where(f > 0, mid, lo), jnp.where(f > 0, hi, mid)

    hi = jnp.max(z0, axis=-1, keepdims=True)
    lo, hi = lax.fori_loop(0, n_iter, halve, (hi - 1.0, hi))
    tau = 0.5 * (lo + hi)
    u = jnp.maximum(z - tau, 0.0)
    f = jnp.sum(_weights(u, alpha), -1, keepdims=True) - 1.0
    slope = jnp.sum(_sens(u, alpha), -1, keepdims=True) / (alpha - 1.0)  # -f'(τ)
    return tau + f / jnp.where(slope > 0, slope, 1.0)


def entmax_attention_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    alpha: float = 1.5,
    causal: bool = False,
    scale: float | None = None,
    kv_lengths: jax.Array | None = None,
) -> jax.Array:
    """Dense α-entmax attention in plain jnp: the [B, H, T, S] scores, the exact τ (sort,
    α ∈ {1.5, 2}; bisection otherwise), p normalised, and p·V. Rows with no visible key
    give zeros."""
    B, T, H, D, S, Hkv, _ = _check_qkv(q, k, v, "entmax_attention_reference")
    if not isinstance(alpha, numbers.Real):
        raise ValueError(f"entmax_attention_reference: `alpha` must be a Python number > 1, "
                         f"got {type(alpha).__name__}")
    a, _ = _check_alpha(alpha, H)
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    kr = jnp.repeat(k, H // Hkv, axis=2).astype(F32)
    vr = jnp.repeat(v, H // Hkv, axis=2).astype(F32)
    x = jnp.einsum("bthd,bshd->bhts", q.astype(F32), kr) * scale
    visible = jnp.ones((B, 1, T, S), bool)
    if causal:
        visible = visible & jnp.tril(jnp.ones((T, S), bool))
    if kv_lengths is not None:
        visible = visible & (jnp.arange(S) < jnp.asarray(kv_lengths)[:, None])[:, None, None]
    z = (a - 1.0) * x
    zmax = jnp.max(jnp.where(visible, z, -jnp.inf), axis=-1, keepdims=True)
    z = jnp.where(visible, z - jnp.where(jnp.isfinite(zmax), zmax, 0.0), -2.0)
    tau = _threshold_sort(z, a) if a in (1.5, 2.0) else _threshold_bisect(z, a)
    p = jnp.where(visible, _weights(jnp.maximum(z - tau, 0.0), a), 0.0)
    total = jnp.sum(p, -1, keepdims=True)
    p = jnp.where(total > 0, p / jnp.where(total > 0, total, 1.0), 0.0)
    return jnp.einsum("bhts,bshd->bthd", p, vr).astype(q.dtype)
