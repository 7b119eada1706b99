r"""PLASH's query-to-enriched-prototype attention as a Pallas kernel.

PLASH (prototype attention with randomized polynomial enrichment; the construction is ours,
``docs/plash.md``, after the PLASH abstract (ICML 2026) — there is no
public code) compresses the keys of one (batch, KV head) into M clusters around prototypes
p_m and keeps per cluster a small table of statistics. This kernel is the query side: every
query q attends by exact softmax to the M enriched prototypes. With scale s, the table
(means over the cluster's keys; residual rᵢ = kᵢ − p_{a(i)}) and the sketch
φⱼ(x)_t = D^{-1/2} Π_{l≤j} (W_{j,l} x)_t (``docs/plash.md`` §1):

    ȳ_m = s q·μ_m,  a_m = s‖q‖R_m,  σ̄²_m = s²‖q‖²τ_m
    ū_m = min(a_m, a_m²/2, log(1 + g(a_m) σ̄²_m)),  g(a) = (eᵃ − 1 − a)/a²
    Ẑ_m = 1 + ȳ_m + Σ_{j=2}^{p} (sʲ/j!) φⱼ(q)·Ē_{m,j}
    λ_m = log n_m + s q·p_m + clip(log Ẑ_m, ȳ_m, ȳ_m + ū_m)   (ȳ_m if Ẑ_m ≤ 0; −∞ if n_m = 0)
    δ_m = s (Ḡ_m φ₁(q) − u_m (q·μ_m)),   r_m = ρ_m min(1, β_m)
    β_m = min(max(e^{a_m} − 1, 1 − e^{−a_m−ū_m}), e^{a_m} σ̄_m + e^{ū_m} − 1)
    ũ_m = u_m + δ_m min(1, r_m/‖δ_m‖)
    out(q) = Σ_m softmax(λ)_m ũ_m,    lse(q) = logsumexp_m λ_m

Kernels (grid (batch, KV head, row block)): the rows are the queries of the KV head's whole
GQA group (G·T rows share its prototypes); the query's sketch features are computed once
per row block, then an online softmax over blocks of ``block_m`` prototypes (as flash
attention does over keys): logits, the clipped log-partition, and the value shift of the
block. On GPU (Triton) and in the interpreter (``_kernel``) one program loops over the
prototype blocks with ``lax.fori_loop`` (the tables stay in HBM, each step loads its
block); on TPU (``_kernel_tpu``, Mosaic copies every BlockSpec block into VMEM) the
prototype blocks are a fourth, sequential grid axis: a program holds one block's tiles
(Ḡ [block_m·dv, D] is the largest) and carries (m, l, acc) in VMEM scratch, so per-program
VMEM depends on block_q, block_m, d, dv, D — not on T, nor on M. The per-prototype value
shifts are a [rows, block_m·dv] tile: one matmul φ₁(q)·Ḡᵀ with the block's Ḡ
flattened to [block_m·dv, D]; the per-prototype norms ‖δ_m‖² and the weighted sum over the
block's prototypes are matmuls with 0/1 block-indicator matrices built from iotas, so
there is no reshape, gather, sort, cumsum or scatter in the kernel, only 2-D tiles.
Per-prototype scalars (log n, R, τ, ρ, live) arrive as a [M, 16] table whose columns are
turned into [1, block_m] rows by masked reductions (no dynamic lane indexing). ``expm1``
has no Mosaic lowering: it is exp(x) − 1 with a cubic Taylor branch for |x| < 1e-3.

Backward (``jax.custom_vjp``): the VJP of :func:`prototype_attention_reference`, the
pure-jnp computation of the same function (XLA, recomputed from the saved inputs, scanned
over blocks of ``block_q_bwd`` rows with the table cotangents summed in the carry). The
backward of this map costs what its forward costs (the T·M·dv·D value term dominates
both) and its inputs are small per-cluster tables, so a second kernel would buy no
asymptotic saving; the XLA VJP is exact, and it keeps one formula for the gradient that
the PLASH XLA path and its finite-difference tests already check. Each step holds the
[block_q_bwd, M, dv] value shifts of its rows.

Layout: q [B, K, R, d] (R = G·T rows); the table per (B, K) as in :class:`Table`; all
math in float32. The wrapper pads d, D, dv to powers of two ≥ 16, M to a power of two ≥
``block_m`` and R to ``block_q`` (zeros; padded prototypes are empty, padded sketch
columns are zero features). Targets: Mosaic (TPU) and Triton (GPU) per lowering platform
(``pallas_kernels.common``); on CPU use ``interpret=True``. Imports only jax and numpy.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
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
    pallas_call_per_platform,
    rowsum,
)

__all__ = ["BlockSizes", "Table", "prototype_attention_pallas", "prototype_attention_reference",
           "unsupported_block_sizes"]

_NAME = "prototype_attention_pallas"
NEG = -1e30  # logit of an empty (or padded) prototype: finite, so no inf - inf in the kernel
_EXP_CAP = 60.0  # as lcjax.attention.plash: e^a beyond this only enters through a min
_SCALARS = 16  # columns of the per-prototype scalar table (a power of two for Triton)
# columns of the scalar table
_LOGN, _LIVE, _RADIUS, _TAU, _RHO = range(5)


@dataclasses.dataclass(frozen=True, slots=True)
class BlockSizes:
    """Tile sizes, powers of two (≥ 16 compiled, ≥ 8 in interpret mode), clamped to the
    power-of-two rounded sizes.

    Attributes:
      block_q: query rows per program (rows of a KV head's GQA group).
      block_m: prototypes per step of the in-kernel loop (the value tile is
        [block_q, block_m·dv]).
      block_q_bwd: query rows per step of the backward (a scan of the reference's VJP over
        row blocks); None: the largest power of two with block_q_bwd·M·dv ≤ 2²² elements.
    """

    block_q: int = 128
    block_m: int = 16
    block_q_bwd: int | None = None

    @classmethod
    def get_default(cls) -> BlockSizes:
        return cls(block_q=128, block_m=16)


class Table(NamedTuple):
    """Per-cluster statistics of one (batch, KV head), [B, K, M, ...] (float32).

    live: n_m > 0 (bool); logn: log n_m (any value where not live); protos: p_m [M, d];
    mu: mean residual μ_m [M, d]; e: mean sketched residual moments Ē_{m,j}, j = 2…degree,
    [J, M, D] (J = max(degree − 1, 1); unused when degree = 1); u: value mean u_m [M, dv];
    g: mean v φ₁(r)ᵀ, Ḡ_m [M, dv, D]; radius: key radius R_m [M]; tau: residual spread
    τ_m [M]; rho: value radius ρ_m [M]."""

    live: jax.Array
    logn: jax.Array
    protos: jax.Array
    mu: jax.Array
    e: jax.Array
    u: jax.Array
    g: jax.Array
    radius: jax.Array
    tau: jax.Array
    rho: jax.Array


class _Config(NamedTuple):
    scale: float
    degree: int
    sketch_dim: int  # true D (the 1/sqrt(D) of the features)
    dsp: int  # padded D
    mp: int  # padded M
    dvp: int
    bq: int
    bm: int
    jp: int  # padded J


# ----------------------------------------------------------------------------
# Shared elementwise pieces (used by the kernel and the reference alike)
# ----------------------------------------------------------------------------
def _expm1(x):
    """e^x − 1 without ``lax.expm1`` (no Mosaic rule): Taylor to x³ for |x| < 1e-3."""
    small = jnp.abs(x) < 1e-3
    return jnp.where(small, x * (1.0 + x * (0.5 + x / 6.0)), jnp.exp(x) - 1.0)


def _bennett_log(a, var):
    """log(1 + g(a)·var), g(a) = (eᵃ − 1 − a)/a² (g(0) = 1/2)."""
    small = a < 1e-3
    a_s = jnp.where(small, 1.0, jnp.minimum(a, _EXP_CAP))
    g = jnp.where(small, 0.5 + a / 6.0, (_expm1(a_s) - a_s) / (a_s * a_s))
    return jnp.log1p(g * var)


def _logit_parts(s, qn, y0, qmu, zsk, logn, radius, tau, rho):
    """The logits λ [.., M] and the value radius r [.., M] from the query's
    scores y0 = s q·p, qmu = q·μ, the sketch sum zsk = Σⱼ sʲ/j! φⱼ(q)·Ē_j, and the
    per-prototype rows (broadcast over queries)."""
    ybar = s * qmu
    a = s * qn * radius
    var = (s * qn) * (s * qn) * tau
    ubar = jnp.minimum(jnp.minimum(a, 0.5 * a * a), _bennett_log(a, var))
    ubar = jnp.where(a > _EXP_CAP, a, ubar)
    zhat = 1.0 + ybar + zsk
    pos = zhat > 0
    logz = jnp.log(jnp.where(pos, zhat, 1.0))
    zeta = jnp.where(pos, jnp.minimum(jnp.maximum(logz, ybar), ybar + ubar), ybar)
    lam = logn + y0 + zeta
    tau_pos = tau > 0
    sig = s * qn * jnp.where(tau_pos, jnp.sqrt(jnp.where(tau_pos, tau, 1.0)), 0.0)
    ea = jnp.exp(jnp.minimum(a, _EXP_CAP))
    beta1 = jnp.maximum(ea - 1.0, -_expm1(-a - ubar))
    beta2 = jnp.where(sig > 0, ea * sig, 0.0) + _expm1(jnp.minimum(ubar, _EXP_CAP))
    r = rho * jnp.minimum(1.0, jnp.minimum(beta1, beta2))
    return lam, r


def _shrink(dn, r):
    """min(1, r/‖δ‖) with a finite gradient everywhere."""
    over = dn > r
    return jnp.where(over, r / jnp.where(over, dn, 1.0), 1.0)


# ----------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------
# Full float32 matmuls (no TF32 / single bf16 pass): the 0/1 indicator products must
# reproduce the values they select.
_HIGHEST = lax.Precision.HIGHEST


def _nt(a, b):  # a [m, k] · b [n, k]ᵀ in float32, at HIGHEST precision
    return nt(a, b, _HIGHEST)


def _nn(a, b):  # a [m, k] · b [k, n], at HIGHEST precision
    return nn(a, b, _HIGHEST)


def _setup(q_ref, w_ref, cfg: _Config):
    """Per row block: the rows q [bq, dp], their norms [bq, 1], the sketch features φⱼ(q)
    [bq, D] (j = 1…degree) and the loop constants (0/1 indicator matrices)."""
    s, bm, dvp, dsp = cfg.scale, cfg.bm, cfg.dvp, cfg.dsp
    q = q_ref[...].astype(F32)                                   # [bq, dp]
    sq = rowsum(q * q)
    qn = jnp.where(sq > 0, jnp.sqrt(jnp.where(sq > 0, sq, 1.0)), 0.0)  # [bq, 1]
    feats, start = [], 0
    inv = 1.0 / math.sqrt(cfg.sketch_dim)
    for j in range(1, cfg.degree + 1):
        f = None
        for l in range(j):
            w = w_ref[(start + l) * dsp:(start + l + 1) * dsp, :]
            proj = _nt(q, w)
            f = proj if f is None else f * proj
        feats.append(f * inv)
        start += j
    coef = [s ** j / math.factorial(j) for j in range(2, cfg.degree + 1)]
    eye = iota((bm, bm), 0) == iota((bm, bm), 1)
    lane = iota((bm, _SCALARS), 1)
    # block indicators: expand[m, i] = (i // dv == m); collapse[i, c] = (i % dv == c)
    col_i = iota((bm, bm * dvp), 1)
    row_m = iota((bm, bm * dvp), 0)
    expand = ((col_i >= row_m * dvp) & (col_i < (row_m + 1) * dvp)).astype(F32)
    flat_i = iota((bm * dvp, dvp), 0)
    collapse = (jnp.bitwise_and(flat_i, dvp - 1) == iota((bm * dvp, dvp), 1)).astype(F32)
    return q, qn, feats, (coef, eye, lane, expand, collapse)


def _block(cfg: _Config, rows, consts, tiles, carry):
    """One step of the online softmax over prototypes: ``rows`` = (q, qn, feats) of the
    row block, ``tiles`` = the block's (scalars [bm, 16], p [bm, dp], μ [bm, dp],
    [Ē_j [bm, D] for j ≥ 2], Ḡ [bm·dv, D], u [bm, dv]); carry (m, l, acc) [bq, 1|1|dv]."""
    s = cfg.scale
    q, qn, feats = rows
    coef, eye, lane, expand, collapse = consts
    sc, pb, mub, ejs, gb, ub = tiles
    m_run, l_run, acc = carry

    def scalar_row(c):
        """Column c of the [bm, 16] scalar block as a [1, bm] row."""
        col = rowsum(jnp.where(lane == c, sc, 0.0))              # [bm, 1]
        return jnp.sum(jnp.where(eye, col, 0.0), axis=0, keepdims=True)

    live = scalar_row(_LIVE) > 0.5
    logn = scalar_row(_LOGN)
    radius, tau, rho = (scalar_row(c) for c in (_RADIUS, _TAU, _RHO))
    y0 = s * _nt(q, pb)                                            # [bq, bm]
    qmu = _nt(q, mub)
    zsk = jnp.zeros_like(y0)
    for j, (c, ej) in enumerate(zip(coef, ejs)):
        zsk = zsk + c * _nt(feats[j + 1], ej)
    lam, r = _logit_parts(s, qn, y0, qmu, zsk, logn, radius, tau, rho)
    lam = jnp.where(live, lam, NEG)
    # value shifts of the block's prototypes: [bq, bm·dv]
    u_flat = jnp.sum(expand * _nt(ub, collapse), axis=0, keepdims=True)  # [1, bm·dv]
    delta = s * (_nt(feats[0], gb) - u_flat * _nn(qmu, expand))
    dsq = _nt(delta * delta, expand)                                # [bq, bm]
    dn = jnp.where(dsq > 0, jnp.sqrt(jnp.where(dsq > 0, dsq, 1.0)), 0.0)
    shrink = _shrink(dn, r)
    # online softmax over prototype blocks
    m_new = jnp.maximum(m_run, jnp.max(lam, axis=1, keepdims=True))
    alpha = jnp.exp(m_run - m_new)
    p = jnp.where(live, jnp.exp(lam - m_new), 0.0)
    contrib = _nn(p, ub) + _nn(_nn(p * shrink, expand) * delta, collapse)
    return m_new, l_run * alpha + rowsum(p), acc * alpha + contrib


def _init(bq, dvp):
    return (jnp.full((bq, 1), NEG, F32), jnp.zeros((bq, 1), F32),
            jnp.zeros((bq, dvp), F32))


def _finish(carry, o_ref, lse_ref):
    m_run, l_run, acc = carry
    pos = l_run > 0
    o_ref[...] = (acc / jnp.where(pos, l_run, 1.0)).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(pos, m_run + jnp.log(jnp.where(pos, l_run, 1.0)), NEG)


def _kernel(q_ref, w_ref, p_ref, mu_ref, e_ref, u_ref, g_ref, sc_ref, o_ref, lse_ref, *,
            cfg: _Config):
    """Triton / interpreter form: whole tables per program (on a GPU they stay in HBM and
    each loop step loads its block), a ``fori_loop`` over prototype blocks."""
    bm, dvp = cfg.bm, cfg.dvp
    q, qn, feats, consts = _setup(q_ref, w_ref, cfg)

    def body(jb, carry):
        rows = pl.ds(pl.multiple_of(jb * bm, bm), bm)
        tiles = (sc_ref[rows, :], p_ref[rows, :], mu_ref[rows, :],
                 [e_ref[j, rows, :] for j in range(cfg.degree - 1)],
                 g_ref[pl.ds(pl.multiple_of(jb * bm * dvp, bm * dvp), bm * dvp), :],
                 u_ref[rows, :])
        return _block(cfg, (q, qn, feats), consts, tiles, carry)

    carry = lax.fori_loop(0, cfg.mp // bm, body, _init(q.shape[0], dvp))
    _finish(carry, o_ref, lse_ref)


def _kernel_tpu(q_ref, w_ref, p_ref, mu_ref, e_ref, u_ref, g_ref, sc_ref, o_ref, lse_ref,
                m_sc, l_sc, acc_sc, *, cfg: _Config):
    """Mosaic form: grid (batch, KV head, row block, prototype block), the last axis
    sequential; each program gets one prototype block's tiles in VMEM and carries the online
    softmax in VMEM scratch (m, l [bq, 1], acc [bq, dv]); outputs are written at the last
    prototype block. Per-program VMEM is independent of T and of M."""
    jb = pl.program_id(3)

    @pl.when(jb == 0)
    def _():
        m0, l0, a0 = _init(m_sc.shape[0], cfg.dvp)
        m_sc[...], l_sc[...], acc_sc[...] = m0, l0, a0

    q, qn, feats, consts = _setup(q_ref, w_ref, cfg)
    tiles = (sc_ref[...], p_ref[...], mu_ref[...],
             [e_ref[j] for j in range(cfg.degree - 1)], g_ref[...], u_ref[...])
    m_new, l_new, acc_new = _block(cfg, (q, qn, feats), consts, tiles,
                                   (m_sc[...], l_sc[...], acc_sc[...]))
    m_sc[...], l_sc[...], acc_sc[...] = m_new, l_new, acc_new

    @pl.when(jb == pl.num_programs(3) - 1)
    def _():
        _finish((m_sc[...], l_sc[...], acc_sc[...]), o_ref, lse_ref)


# ----------------------------------------------------------------------------
# Wrapper
# ----------------------------------------------------------------------------
def unsupported_block_sizes(block_sizes: BlockSizes, *, interpret: bool) -> str | None:
    """Why the kernel cannot run these tiles (None if it can)."""
    if not isinstance(block_sizes, BlockSizes):
        return f"block_sizes must be a BlockSizes, got {type(block_sizes).__name__}"
    low = min_block(interpret)
    names = ("block_q", "block_m") + (("block_q_bwd",) if block_sizes.block_q_bwd is not None
                                      else ())
    for name in names:
        val = getattr(block_sizes, name)
        if isinstance(val, bool) or not isinstance(val, numbers.Integral) or val < low or (
                val & (val - 1)):
            return f"block_sizes.{name} must be a power of two >= {low}, got {val!r}"
    return None


def _pow2(n: int, low: int) -> int:
    return max(low, 1 << max(int(n) - 1, 0).bit_length())


def _pad(x, sizes):
    return jnp.pad(x, [(0, t - n) for n, t in zip(x.shape, sizes)])


def _check(q, table: Table, w, degree):
    if getattr(q, "ndim", None) != 4:
        raise ValueError(f"{_NAME}: `q` must be [batch, kv_heads, rows, head_dim], got shape "
                         f"{getattr(q, 'shape', None)}")
    if not isinstance(table, Table):
        raise ValueError(f"{_NAME}: `table` must be a Table, got {type(table).__name__}")
    if isinstance(degree, bool) or not isinstance(degree, numbers.Integral) or degree < 1:
        raise ValueError(f"{_NAME}: `degree` must be an int >= 1, got {degree!r}")
    b, kk, _, d = q.shape
    m = table.protos.shape[2]
    dv, dsk = table.g.shape[-2:]
    want = {"live": (b, kk, m), "logn": (b, kk, m), "protos": (b, kk, m, d),
            "mu": (b, kk, m, d), "e": (b, kk, max(degree - 1, 1), m, dsk), "u": (b, kk, m, dv),
            "g": (b, kk, m, dv, dsk), "radius": (b, kk, m), "tau": (b, kk, m),
            "rho": (b, kk, m)}
    for name, shape in want.items():
        got = tuple(getattr(table, name).shape)
        if got != shape:
            raise ValueError(f"{_NAME}: `table.{name}` must have shape {shape} (from q "
                             f"{tuple(q.shape)}, M={m}, dv={dv}, D={dsk}), got {got}")
    count = degree * (degree + 1) // 2
    if tuple(w.shape) != (count, dsk, d):
        raise ValueError(f"{_NAME}: `w` must have shape {(count, dsk, d)} (degree {degree}), "
                         f"got {tuple(w.shape)}")
    return b, kk, d, m, dv, dsk


# Compiled, the [block_q, block_m·dv] float32 value tile and its temporaries take ~8x its
# size of VMEM: 2^18 elements (1 MiB) compiles on v5e's 16 MiB scoped VMEM, 2^20 needs 33 MiB
# (libtpu 0.0.42, block_q 128, dv 128, block_m 16 vs 64; tests/tpu/test_dispatch.py).
MAX_VALUE_TILE = 1 << 19


def _forward(q, table: Table, w, *, scale, degree, block_sizes, interpret):
    b, kk, d, m, dv, dsk = _check(q, table, w, degree)
    rows = q.shape[2]
    low = min_block(interpret)
    bq = min(block_sizes.block_q, _pow2(rows, low))
    bm = min(block_sizes.block_m, _pow2(m, low))
    dp, dsp, dvp = _pow2(d, 16), _pow2(dsk, 16), _pow2(dv, 16)
    if interpret is False and bq * bm * dvp > MAX_VALUE_TILE:
        raise ValueError(f"prototype_attention_pallas: the value tile block_q × block_m × dv = "
                         f"{bq} × {bm} × {dvp} = {bq * bm * dvp} float32 exceeds "
                         f"{MAX_VALUE_TILE} (it and its temporaries would not fit the TPU's "
                         "scoped VMEM); use smaller block_q or block_m")
    mp = _pow2(m, bm)
    jp = _pow2(max(degree - 1, 1), 1)
    count = degree * (degree + 1) // 2
    cp = _pow2(count, 1)
    rp = -(-rows // bq) * bq
    cfg = _Config(scale=float(scale), degree=int(degree), sketch_dim=int(dsk), dsp=dsp, mp=mp,
                  dvp=dvp, bq=bq, bm=bm, jp=jp)
    f32 = lambda x: x.astype(F32)
    qp = _pad(f32(q), (b, kk, rp, dp))
    wp = _pad(f32(w), (cp, dsp, dp)).reshape(cp * dsp, dp)
    pp = _pad(f32(table.protos), (b, kk, mp, dp))
    mup = _pad(f32(table.mu), (b, kk, mp, dp))
    ep = _pad(f32(table.e), (b, kk, jp, mp, dsp))
    up = _pad(f32(table.u), (b, kk, mp, dvp))
    gp = _pad(f32(table.g), (b, kk, mp, dvp, dsp)).reshape(b, kk, mp * dvp, dsp)
    live = table.live.astype(bool)
    cols = [jnp.where(live, f32(table.logn), 0.0), live.astype(F32), f32(table.radius),
            f32(table.tau), f32(table.rho)]
    sc = jnp.stack(cols + [jnp.zeros_like(cols[0])] * (_SCALARS - len(cols)), axis=-1)
    sc = _pad(sc, (b, kk, mp, _SCALARS))
    q_spec = pl.BlockSpec((None, None, bq, dp), lambda i, j, r, *_: (i, j, r, 0))
    w_spec = pl.BlockSpec((cp * dsp, dp), lambda i, j, r, *_: (0, 0))
    out_specs = [pl.BlockSpec((None, None, bq, dvp), lambda i, j, r, *_: (i, j, r, 0)),
                 pl.BlockSpec((None, None, bq, 1), lambda i, j, r, *_: (i, j, r, 0))]
    whole = lambda *shape: pl.BlockSpec((None, None) + shape,
                                        lambda i, j, r: (i, j) + (0,) * len(shape))
    # TPU: one prototype block per program along a sequential 4th grid axis
    tile = lambda *shape: pl.BlockSpec((None, None) + shape,
                                       lambda i, j, r, mb: (i, j, mb) + (0,) * (len(shape) - 1))
    grid = (b, kk, rp // bq)
    tpu = TpuCall(
        functools.partial(_kernel_tpu, cfg=cfg), grid + (mp // bm,),
        in_specs=[q_spec, w_spec, tile(bm, dp), tile(bm, dp),
                  pl.BlockSpec((None, None, jp, bm, dsp), lambda i, j, r, mb: (i, j, 0, mb, 0)),
                  tile(bm, dvp), tile(bm * dvp, dsp), tile(bm, _SCALARS)],
        out_specs=out_specs,
        scratch_shapes=[pltpu.VMEM((bq, 1), F32), pltpu.VMEM((bq, 1), F32),
                        pltpu.VMEM((bq, dvp), F32)],
        dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))
    out, lse = pallas_call_per_platform(
        functools.partial(_kernel, cfg=cfg), grid=grid,
        in_specs=[q_spec, w_spec, whole(mp, dp), whole(mp, dp), whole(jp, mp, dsp),
                  whole(mp, dvp), whole(mp * dvp, dsp), whole(mp, _SCALARS)],
        out_specs=out_specs,
        out_shape=[jax.ShapeDtypeStruct((b, kk, rp, dvp), F32),
                   jax.ShapeDtypeStruct((b, kk, rp, 1), F32)],
        interpret=interpret, name="plash_prototype_attention", tpu=tpu,
    )(qp, wp, pp, mup, ep, up, gp, sc)
    lse = lse[:, :, :rows, 0]
    return out[:, :, :rows, :dv], jnp.where(lse > 0.5 * NEG, lse, -jnp.inf)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _attend(q, table, w, scale, degree, block_sizes, interpret):
    return _forward(q, table, w, scale=scale, degree=degree, block_sizes=block_sizes,
                    interpret=interpret)


def _attend_fwd(q, table, w, scale, degree, block_sizes, interpret):
    return _attend(q, table, w, scale, degree, block_sizes, interpret), (q, table, w)


# Rows of q per step of the backward: the reference's VJP holds [rows, M, dv] float32
# tensors (a few of them), so a step touches about this many elements of each.
_BWD_ELEMENTS = 1 << 22


def _bwd_rows(block_sizes: BlockSizes, m: int, dv: int) -> int:
    """Rows per backward step: ``block_q_bwd``, or a power of two with rows·M·dv ≲
    ``_BWD_ELEMENTS``."""
    if block_sizes.block_q_bwd is not None:
        return block_sizes.block_q_bwd
    return max(8, 1 << max((_BWD_ELEMENTS // max(m * dv, 1)).bit_length() - 1, 0))


def _attend_bwd(scale, degree, block_sizes, interpret, res, cot):
    """The reference's VJP, a scan over blocks of query rows (``_bwd_rows``): the table and
    sketch cotangents are summed in the carry, so no [R, M, dv] tensor of all R rows is
    built (R = G·T is the whole sequence in the non-causal call)."""
    q, table, w = res
    ref = lambda q_, t_, w_: prototype_attention_reference(q_, t_, w_, scale=scale,
                                                           degree=degree)
    rows, m, dv = q.shape[2], table.u.shape[2], table.u.shape[3]
    step_rows = _bwd_rows(block_sizes, m, dv)
    if step_rows >= rows:
        return jax.vjp(ref, q, table, w)[1](cot)
    n = -(-rows // step_rows)
    split = lambda x: jnp.moveaxis(_pad(x, x.shape[:2] + (n * step_rows,) + x.shape[3:])
                                   .reshape(x.shape[:2] + (n, step_rows) + x.shape[3:]), 2, 0)
    dout, dlse = cot

    def body(acc, xs):
        qc, dout_c, dlse_c = xs
        dq, dt, dw = jax.vjp(ref, qc, table, w)[1]((dout_c, dlse_c))
        return jax.tree.map(jnp.add, acc, (dt, dw)), dq

    zeros = jax.tree.map(jnp.zeros_like, (table, w))
    (dt, dw), dq = lax.scan(body, zeros, (split(q), split(dout), split(dlse)))
    dq = jnp.moveaxis(dq, 0, 2).reshape(q.shape[:2] + (n * step_rows,) + q.shape[3:])
    return dq[:, :, :rows], dt, dw


_attend.defvjp(_attend_fwd, _attend_bwd)


def prototype_attention_pallas(q: jax.Array, table: Table, w: jax.Array, *, scale: float,
                               degree: int, block_sizes: BlockSizes | None = None,
                               interpret: bool | str = False) -> tuple[jax.Array, jax.Array]:
    """Exact softmax of each query row to the enriched prototypes (module docstring).

    Args:
      q: [B, K, R, d] query rows of each KV head (its GQA group's queries, flattened).
      table: the per-cluster :class:`Table`, [B, K, M, ...].
      w: the sketch's Rademacher matrices [degree·(degree+1)/2, D, d]
        (``lcjax.attention.plash.plash_sketch``).
      scale: s. degree: the logit enrichment's degree p.
      block_sizes: :class:`BlockSizes` (default ``BlockSizes.get_default()``).
      interpret: run in the Pallas interpreter (required on CPU); ``"tpu"`` interprets the
        Mosaic form (prototype blocks on a sequential grid axis, VMEM scratch carry).

    Returns:
      (out [B, K, R, dv] float32, lse [B, K, R] float32, −inf where no prototype is live).
      Differentiable in q, every table entry and w (backward: the reference's VJP).
    """
    bs = BlockSizes.get_default() if block_sizes is None else block_sizes
    if interpret not in (True, False, "tpu"):
        raise ValueError(f"{_NAME}: `interpret` must be True, False or 'tpu', got "
                         f"{interpret!r}")
    reason = unsupported_block_sizes(bs, interpret=bool(interpret))
    if reason:
        raise ValueError(f"{_NAME}: {reason}")
    _check(q, table, w, degree)
    table = table._replace(live=lax.stop_gradient(table.live.astype(F32)))
    interpret = interpret if interpret == "tpu" else bool(interpret)
    return _attend(q, table, w, float(scale), int(degree), bs, interpret)


def prototype_attention_reference(q: jax.Array, table: Table, w: jax.Array, *, scale: float,
                                  degree: int) -> tuple[jax.Array, jax.Array]:
    """The same map in pure jnp (dense [R, M] and [R, M, dv] tensors): (out, lse)."""
    _check(q, table, w, degree)
    s = float(scale)
    f32 = lambda x: x.astype(F32)
    q, w = f32(q), f32(w)
    dsk = w.shape[1]
    proj = jnp.einsum("bkrd,nDd->bkrnD", q, w)
    feats, start = [], 0
    for j in range(1, degree + 1):
        f = proj[..., start, :]
        for l in range(1, j):
            f = f * proj[..., start + l, :]
        feats.append(f / math.sqrt(dsk))
        start += j
    sq = jnp.sum(q * q, -1, keepdims=True)
    qn = jnp.where(sq > 0, jnp.sqrt(jnp.where(sq > 0, sq, 1.0)), 0.0)   # [B, K, R, 1]
    y0 = s * jnp.einsum("bkrd,bkmd->bkrm", q, f32(table.protos))
    qmu = jnp.einsum("bkrd,bkmd->bkrm", q, f32(table.mu))
    zsk = jnp.zeros_like(y0)
    for j in range(2, degree + 1):
        zsk = zsk + (s ** j / math.factorial(j)) * jnp.einsum(
            "bkrD,bkmD->bkrm", feats[j - 1], f32(table.e)[:, :, j - 2])
    row = lambda x: f32(x)[:, :, None, :]
    live = table.live.astype(bool)[:, :, None, :]
    lam, r = _logit_parts(s, qn, y0, qmu, zsk, jnp.where(live, row(table.logn), 0.0),
                          row(table.radius), row(table.tau), row(table.rho))
    lam = jnp.where(live, lam, -jnp.inf)
    u = f32(table.u)[:, :, None]                                       # [B, K, 1, M, dv]
    delta = s * (jnp.einsum("bkrD,bkmvD->bkrmv", feats[0], f32(table.g)) - u * qmu[..., None])
    dsq = jnp.sum(delta * delta, -1)
    dn = jnp.where(dsq > 0, jnp.sqrt(jnp.where(dsq > 0, dsq, 1.0)), 0.0)
    ut = u + delta * _shrink(dn, r)[..., None]
    mx = jnp.max(lam, -1, keepdims=True)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    p = jnp.exp(lam - mx)
    l = jnp.sum(p, -1, keepdims=True)
    pos = l > 0
    out = jnp.einsum("bkrm,bkrmv->bkrv", p / jnp.where(pos, l, 1.0), ut)
    lse = jnp.where(pos, mx + jnp.log(jnp.where(pos, l, 1.0)), -jnp.inf)[..., 0]
    return out, lse
