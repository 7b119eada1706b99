r"""α-entmax attention, blockwise (AdaSplash-2 in XLA).

Sparse attention with the α-entmax mapping (Peters, Niculae & Martins 2019; Correia,
Niculae & Martins 2019) in place of softmax, computed the way AdaSplash does it
(Gonçalves, Treviso & Martins, "AdaSplash: Adaptive Sparse Flash Attention", 2025, and
its v2, AdaSplash-2, with the histogram-initialised threshold): the [T, S] score matrix
is never built; the threshold τ of every query row is found by passes over key blocks,
and the output pass skips key tiles that hold no weight.

Per query row i of head h (q [B, T, H, D], k, v [B, S, Hkv, D], key head h // (H/Hkv)):

    x_ij = scale · q_i·k_j            (masked keys excluded),
    z_ij = (α_h - 1)·(x_ij - max_j x_ij),
    p_ij = [z_ij - τ_i]₊^{1/(α_h-1)},  τ_i such that Σ_j p_ij = 1,
    out_i = Σ_j p_ij v_j              [B, T, H, Dv].

α is a Python number > 1 (1.5 = entmax-1.5, 2 = sparsemax) or an array [H] (one per
query head, differentiable: see ``lcjax.entmax.alpha_from_param``). A row with no
visible key gives zeros.

Passes, for each query block of ``block_q`` rows (all inside ``lax.map``; key blocks of
``block_kv`` entirely above the causal diagonal are never visited):

1. row max of x.
2. origin (histogram and Newton solvers): with A = {z > -1}, n_A = |A|, the power-mean
   bound t₀ = max(-1, mean_A z - n_A^{1-α}) ≤ τ (α ≤ 2), as in ``lcjax.entmax``.
3. histogram (α ∈ {1.5, 2} only): at the ``bins`` edges e_j = t₀ + j·w, w = -t₀/bins,
   the row sums K_j = #{z > e_j}, S_j = Σ[z - e_j]₊, Q_j = Σ[z - e_j]₊² [B, Hkv, G, bq,
   bins]; f(e_j) = Q_j - 1 (α = 1.5) or S_j - 1 (α = 2) brackets τ in one bin, f' at the
   bin's two edges is -2S or -K, and τ₀ = the root of the cubic Hermite interpolant.
   (``lcjax.entmax._histogram`` does the same on a whole row in three reductions; it is
   not blockwise, so this module accumulates the per-edge sums over key blocks and
   finishes with the same closed forms and ``_hermite_root``. The per-edge sums are the
   top-down accumulation of AdaSplash-2's per-bin count / Σd / Σd², without cancellation.)
4. solver steps, one pass each: K, S, Q (α = 1.5: the exact quadratic step, Halley where
   it has no root; α = 2: Newton, exact once the support is found) or, for any other
   α ≤ 2, P = Σ[z-τ]₊^c and -f' = c·Σ[z-τ]₊^{c-1}, c = 1/(α-1) (safeguarded Newton; f is
   convex for α ≤ 2, so from the lower bound t₀ it climbs monotonically); bisection on
   [max z - 1, max z - S^{1-α}] for α > 2 (f concave, f' unbounded at the breakpoints) or
   with ``solver="bisect"``. Every step is ``lcjax.entmax._step`` (bracket update and
   bisection safeguard), until |Σp - 1| < tol or ``n_iter`` steps. A row that meets the
   tolerance takes one last step from the sums of that pass (exact on a fixed support for
   α ∈ {1.5, 2}, quadratic for Newton), so τ is accurate to rounding rather than to tol at
   no extra pass. Each pass also records, per (batch, head, key block), the gap
   g = max (z - τ) over the tile at the τ it used; after the loop a tile may hold weight
   only if g > min over the block's rows of (τ_final - τ_used) — a z > τ_final implies
   z - τ_used > τ_final - τ_used — so no element is lost when the last step lowers τ
   (the rule "mask with the smaller of the τ used for the mask and the final τ").
5. output: Σ_j p_ij v_j and Σ_j p_ij over those tiles only (a key block with no such tile
   for any batch or head of the query block is skipped with ``lax.cond``); out = Σ p v / Σ p,
   so Σp = 1 to rounding. The same pass records the exact live tiles (some p > 0) for the
   backward pass and ``block_sparsity``.

Backward (``jax.custom_vjp``; p recomputed per tile from the saved row shift m_i, τ_i and
Σp, dead tiles skipped). With s_ij = p_ij^{2-α} on the support (0 elsewhere),
dp_ij = dO_i·v_j:

    pass 1:  σ_i = Σ_j s_ij,  ρ_i = Σ_j s_ij dp_ij                 [B, Hkv, G, T]
    pass 2:  ds_ij = s_ij (dp_ij - ρ_i/σ_i),
             dq_i = scale Σ_j ds_ij k_j,  dk_j = scale Σ_i ds_ij q_i,  dv_j = Σ_i p_ij dO_i,

and, for an array α (``lcjax.entmax`` docstring: ∂p/∂α = (p - ŝ)/(α-1)² - (p log p - ŝH)/(α-1),
ŝ = s/σ, H = Σ p log p), pass 1 also accumulates Σ p dp, H and Σ p log p dp, and

    dα_h = Σ_{b,i} [(Σ p dp - ρ/σ)/(α-1)² - (Σ p log p dp - H ρ/σ)/(α-1)].

Pass 2 scans key blocks (FlashAttention-2 order, dq accumulated in place) like
``lcjax.attention.core``'s blockwise backward.

``return_aux=True`` returns ``(out, aux)``: ``tau`` [B, T, H] float32 in the
``lcjax.entmax`` convention (p = [(α-1)x - τ]₊^{1/(α-1)}; +inf for an empty row; no
gradient), ``iterations`` [B, T, H] int32 (solver steps after the initialisation), and
``block_sparsity``: the fraction of (batch, head, query block, key block) tiles, among the
tiles at or below the causal diagonal (all tiles when not causal), in which no visible
(query, key) pair has a score above τ (the fraction a sparse kernel skips).

Masks, GQA layout, block scores and the causal block ranges come from
``lcjax.attention.core``; the per-row math from ``lcjax.entmax``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lcjax.attention.core import (
    _block_scores,
    _BlockPlan,
    _kv_range,
    _pad_axis,
    _q_range,
    default_scale,
    group_queries,
    pad_masking,
    stat_dtype,
    ungroup,
    validate_qkv,
)
from lcjax.entmax import (
    ALPHA_ARRAY_FLOOR,
    _hermite_root,
    _power,
    _row_shift,
    _row_sums,
    _scores,
    _step,
    split_alpha,
)

__all__ = ["entmax_attention", "sparsemax_attention"]

SOLVERS = ("histogram", "newton", "bisect")
IMPLEMENTATIONS = (None, "xla", "pallas")
_KERNEL_MODULE = "pallas_kernels.entmax_attention"
_NAME = "entmax_attention"


class _Cfg(NamedTuple):
    """Static configuration (hashable; the custom_vjp's nondiff argument)."""

    plan: _BlockPlan
    alpha: float | None  # static α, or None for a per-head array α
    kind: str  # step kind for lcjax.entmax._step: "quadratic" | "newton" | "bisect"
    init: str  # "histogram" | "origin" | "bracket"
    n_iter: int
    bins: int
    tol: float


# ----------------------------------------------------------------------------
# Blockwise helpers
# ----------------------------------------------------------------------------
def _fold_kv(cfg: _Cfg, qi, nk: int, qb, k, masking, body, carry, live=None):
    """carry = body(kj, scores [B, Hkv, G, bq, bk], carry) over the key blocks visible to
    query block ``qi`` (causal blocks above the diagonal skipped; unmasked blocks first).
    With ``live`` [nk] bool, blocks with ``live[kj]`` False are skipped."""
    plan = cfg.plan

    def step(kj, carry, masked):
        kb = lax.dynamic_slice_in_dim(k, kj * plan.block_kv, plan.block_kv, axis=1)
        s = _block_scores(plan, qb, jnp.swapaxes(kb, 1, 2), masking, qi, kj, masked=masked)
        return body(kj, s, carry)

    def maybe(kj, carry, masked):
        if live is None:
            return step(kj, carry, masked)
        return lax.cond(live[kj], functools.partial(step, masked=masked),
                        lambda kj, c: c, kj, carry)

    first, end = _static_kv_range(plan, qi, nk, masking)
    return _two_loops(0, first, end, functools.partial(maybe, masked=False),
                      functools.partial(maybe, masked=True), carry)


def _static_kv_range(plan: _BlockPlan, qi, nk: int, masking):
    """``core._kv_range`` with Python ints where they are static (not causal), so that
    statically empty loops are not built."""
    if plan.causal:
        return _kv_range(plan, qi, nk, masking)
    dense = any(x is not None for x in masking)
    return (0 if dense else min(plan.kv_len // plan.block_kv, nk)), nk


def _two_loops(lo, mid, hi, body_a, body_b, carry):
    """fori_loop(lo, mid, body_a) then fori_loop(mid, hi, body_b), omitting a loop whose
    Python-int bounds make it empty (less to compile)."""
    static = isinstance(lo, int) and isinstance(mid, int)
    if not (static and mid <= lo):
        carry = lax.fori_loop(lo, mid, body_a, carry)
    if not (isinstance(mid, int) and isinstance(hi, int) and hi <= mid):
        carry = lax.fori_loop(mid, hi, body_b, carry)
    return carry


def _am1(cfg: _Cfg, alpha):
    """α - 1: a Python float, or [1, Hkv, G, 1, 1] from the per-head array [Hkv, G]."""
    if cfg.alpha is not None:
        return cfg.alpha - 1.0
    return (alpha - 1.0)[None, :, :, None, None]


def _pass_stats(cfg: _Cfg, z, tau, am1):
    """Row sums of one key block at τ: (P = Σ[z-τ]₊^c, stats for ``_step``)."""
    u = jnp.maximum(z - tau, 0.0)
    if cfg.kind == "quadratic":  # α = 1.5: K, S, Q
        k, s, q = _row_sums(jnp.sign(u), u, u * u)
        return q, (k, s, q)
    if cfg.kind == "bisect":
        (p,) = _row_sums(_power(u, cfg.alpha, am1))
        return p, (p, p, p)
    if cfg.alpha == 2.0:  # Newton, -f' = K
        k, s = _row_sums(jnp.sign(u), u)
        return s, (k, s, s)
    # any other α: P = Σ u^c, -f' = c Σ u^{c-1} (0 off the support, also for c < 1)
    pos = u > 0
    lu = jnp.log(jnp.where(pos, u, 1.0))
    c = 1.0 / am1
    p, d = _row_sums(jnp.where(pos, jnp.exp(c * lu), 0.0),
                     jnp.where(pos, jnp.exp((c - 1.0) * lu), 0.0))
    return p, (c * d, p, p)


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


def _histogram_init(cfg: _Cfg, qi, nk, qb, k, masking, zfun, origin, dt):
    """Adapter of ``lcjax.entmax._histogram`` to blockwise accumulation: one pass for the
    per-edge row sums, then the same bracket and Hermite initial iterate."""
    bins, a_s = cfg.bins, cfg.alpha
    w = -origin / bins  # [..., bq, 1]
    edges = origin + w * jnp.arange(bins, dtype=dt)  # [..., bq, bins]

    def body(kj, s, acc):
        u = jnp.maximum(zfun(s)[..., None, :] - edges[..., :, None], 0.0)  # [.., bins, bk]
        g, d = _row_sums(u * u, u) if a_s == 1.5 else _row_sums(u, jnp.sign(u))
        return _add(acc, (g[..., 0], d[..., 0]))

    zero = jnp.zeros(edges.shape, dt)
    G, D = _fold_kv(cfg, qi, nk, qb, k, masking, body, (zero, zero))
    G = jnp.concatenate([G, jnp.zeros_like(G[..., :1])], axis=-1)  # e_bins = max z = 0
    D = jnp.concatenate([D, jnp.zeros_like(D[..., :1])], axis=-1)
    j = jnp.clip(jnp.sum((G[..., :bins] >= 1.0).astype(jnp.int32), -1, keepdims=True) - 1,
                 0, bins - 1)
    a = origin + w * j.astype(dt)
    b = jnp.where(j == bins - 1, 0.0, origin + w * (j + 1).astype(dt))
    Fa = jnp.take_along_axis(G, j, axis=-1) - 1.0
    Fb = jnp.take_along_axis(G, j + 1, axis=-1) - 1.0
    Da = jnp.take_along_axis(D, j, axis=-1)
    Db = jnp.take_along_axis(D, j + 1, axis=-1)
    lo, hi = a, b
    if a_s == 1.5:
        d0, d1 = -2.0 * Da, -2.0 * Db
    else:
        d0, d1 = -Da, -Db
        eps = 1e-6 if dt == jnp.float32 else 1e-12
        t_a = a + Fa / jnp.where(Da > 0, Da, 1.0)  # (S-1)/K over a top set: a lower bound
        t_b = jnp.where(Db > 0, b + Fb / jnp.where(Db > 0, Db, 1.0), a)
        lo = jnp.clip(jnp.maximum(t_a, t_b) - eps, a, b)
    h = b - a
    t0 = jnp.clip(a + h * _hermite_root(Fa, Fb, d0, d1, h), lo, hi)
    return lo, hi, t0


class _RowState(NamedTuple):
    m: jax.Array  # row shift (max x), [.., bq, 1]
    tau: jax.Array  # shifted τ (+inf for empty rows)
    iters: jax.Array  # int32 solver steps
    live: jax.Array  # bool [B, Hkv, G, nk]: tile may hold a z > τ (a superset)


def _solve_block(cfg: _Cfg, qi, qb, k, masking, alpha, nk: int) -> _RowState:
    """τ of the ``block_q`` rows of query block ``qi`` (head-major qb [B, Hkv, G, bq, D])."""
    plan = cfg.plan
    dt = plan.acc
    am1 = _am1(cfg, alpha)
    b, hk, g, bq = qb.shape[:4]
    row = (b, hk, g, bq, 1)

    def fold(body, carry, live=None):
        return _fold_kv(cfg, qi, nk, qb, k, masking, body, carry, live)

    # 1. row max; padded query rows are empty
    xmax = fold(lambda kj, s, c: jnp.maximum(c, jnp.max(s, -1, keepdims=True)),
                jnp.full(row, -jnp.inf, dt))
    valid_q = (qi * plan.block_q + jnp.arange(plan.block_q) < plan.q_len)[:, None]
    xmax = jnp.where(valid_q, xmax, -jnp.inf)
    m, xmax = _row_shift(xmax, dt)  # max over a size-1 axis: the mapping of lcjax.entmax
    dead = xmax == -jnp.inf

    def zfun(s):
        return _scores(s, m, am1, dt)

    n = float(plan.kv_len)
    hi = -jnp.power(jnp.asarray(n, dt), -jnp.asarray(am1, dt)) + jnp.zeros(row, dt)
    lo = jnp.full(row, -1.0, dt)
    if cfg.init == "bracket":
        t0 = 0.5 * (lo + hi)
    else:
        # 2. origin: power-mean lower bound of τ (valid for α ≤ 2)
        def body(kj, s, acc):
            u0 = jnp.maximum(zfun(s) + 1.0, 0.0)
            return _add(acc, _row_sums(jnp.sign(u0), u0))

        n_a, s_a = fold(body, (jnp.zeros(row, dt), jnp.zeros(row, dt)))
        n_a = jnp.maximum(n_a, 1.0)
        origin = s_a / n_a - 1.0 - jnp.power(n_a, -jnp.asarray(am1, dt))
        origin = jnp.maximum(origin - 8 * jnp.finfo(dt).eps, -1.0)
        origin = jnp.where(jnp.asarray(am1) <= 1.0, origin, -1.0)
        if cfg.init == "histogram":
            # 3. histogram bracket and Hermite initial iterate
            lo, hi, t0 = _histogram_init(cfg, qi, nk, qb, k, masking, zfun, origin, dt)
        else:
            lo, t0 = origin, origin
    t0 = jnp.where(dead, jnp.inf, t0)

    # 4. solver passes; each also records, per tile, the gap max (z - τ) at the τ it used
    def cond(state):
        i, *_, done, _, _ = state
        return (i <= cfg.n_iter) & ~jnp.all(done)

    def body(state):
        i, tau, lo, hi, iters, done, tau_fin, _ = state

        def acc_stats(kj, s, acc):
            z = zfun(s)
            p, stats = _pass_stats(cfg, z, tau, am1)
            gap = lax.dynamic_update_index_in_dim(acc[2], jnp.max(z - tau, axis=(-2, -1)), kj,
                                                  axis=-1)
            return _add(acc[0], p), _add(acc[1], stats), gap

        zero = jnp.zeros(row, dt)
        p, stats, gap = fold(acc_stats, (zero, (zero, zero, zero),
                                         jnp.full((b, hk, g, nk), -jnp.inf, dt)))
        f = p - 1.0
        new_tau, lo, hi = _step(cfg.kind, tau, f, stats, lo, hi)
        polished = jnp.clip(_polish(cfg.kind, tau, f, stats), lo, hi)
        if cfg.alpha is None:  # heads with α > 2 (f concave, f' unbounded): bisection
            concave = jnp.asarray(am1) > 1.0
            new_tau = jnp.where(concave, 0.5 * (lo + hi), new_tau)
            polished = jnp.where(concave, tau, polished)
        converged = jnp.abs(f) < cfg.tol
        stop = done | converged | (i >= cfg.n_iter) | (new_tau == tau)
        tau_fin = jnp.where(stop & ~done, jnp.where(converged, polished, tau), tau_fin)
        iters = jnp.where(stop, iters, iters + 1)
        return i + 1, jnp.where(stop, tau, new_tau), lo, hi, iters, stop, tau_fin, gap

    state = (jnp.int32(0), t0, lo, hi, jnp.zeros(row, jnp.int32), dead, t0,
             jnp.full((b, hk, g, nk), -jnp.inf, dt))
    _, tau, _, _, iters, _, tau_fin, gap = lax.while_loop(cond, body, state)
    # z > τ_fin implies z - τ > τ_fin - τ ≥ min over the block's rows: a tile whose gap is at
    # most that minimum holds no weight (the kernel rule "mask at min(τ_mask, τ_final)")
    shift = jnp.min(jnp.where(dead, jnp.inf, tau_fin - tau), axis=(-2, -1))  # [B, Hkv, G]
    return _RowState(m, tau_fin, iters, gap > shift[..., None])


def _polish(kind: str, tau, f, stats):
    """One more step from the last pass's sums, for rows with |f| < tol: exact on the same
    support for α = 1.5 (quadratic) and α = 2 (Newton), quadratically convergent for the
    Newton step of any other α, so the τ handed on is accurate to rounding, not to tol."""
    if kind == "bisect":
        return tau
    k, s, _ = stats
    if kind == "quadratic":
        disc = s * s - k * f
        cand = tau + f / (s + jnp.sqrt(jnp.maximum(disc, 0.0)))
        ok = (s > 0) & (disc >= 0)
    else:
        cand = tau + f / jnp.where(k > 0, k, 1.0)
        ok = k > 0
    return jnp.where(ok & jnp.isfinite(cand), cand, tau)


def _probs(cfg: _Cfg, s, m, tau, am1, inv_total=None):
    """p = [z - τ]₊^c (times 1/Σp when given) and u = [z - τ]₊ for one tile."""
    u = jnp.maximum(_scores(s, m, am1, cfg.plan.acc) - tau, 0.0)
    p = _power(u, cfg.alpha, am1)
    return (p if inv_total is None else p * inv_total), u


def _sgrad(cfg: _Cfg, p, u, inv_total, alpha):
    """s = p^{2-α} on the support (0 elsewhere), for normalised p."""
    if cfg.alpha == 1.5:
        return u * jnp.sqrt(inv_total)
    if cfg.alpha == 2.0:
        return jnp.sign(u)
    two_m_a = 2.0 - (cfg.alpha if cfg.alpha is not None else alpha[None, :, :, None, None])
    pos = p > 0
    return jnp.where(pos, jnp.exp(two_m_a * jnp.log(jnp.where(pos, p, 1.0))), 0.0)


# ----------------------------------------------------------------------------
# Forward and backward
# ----------------------------------------------------------------------------
def _rows_out(x, b, hk, g, tp):
    """lax.map output [nq, B, Hkv, G, bq, 1] -> [B, Hkv, G, Tp]."""
    return jnp.moveaxis(x[..., 0], 0, 3).reshape(b, hk, g, tp)


def _forward(cfg: _Cfg, q, k, v, masking, alpha):
    """Padded q [B, Tp, Hkv, G, D], k [B, Sp, Hkv, D], v [B, Sp, Hkv, Dv], α [Hkv, G] ->
    out [B, Tp, Hkv, G, Dv] (acc dtype) and row data [B, Hkv, G, Tp]: m, τ, 1/Σp, iterations,
    and live tiles [nq, B, Hkv, G, nk]."""
    plan = cfg.plan
    b, tp, hk, g, _ = q.shape
    dv = v.shape[-1]
    nq, nk = tp // plan.block_q, k.shape[1] // plan.block_kv
    am1 = _am1(cfg, alpha)

    def one_q_block(qi):
        qb = lax.dynamic_slice_in_dim(q, qi * plan.block_q, plan.block_q, axis=1)
        qb = jnp.transpose(qb, (0, 2, 3, 1, 4))  # [B, Hkv, G, bq, D]
        rs = _solve_block(cfg, qi, qb, k, masking, alpha, nk)

        def body(kj, s, acc):  # 5. output pass over live tiles; records the exact live tiles
            p, _ = _probs(cfg, s, rs.m, rs.tau, am1)
            vb = lax.dynamic_slice_in_dim(v, kj * plan.block_kv, plan.block_kv, axis=1)
            pv = jnp.einsum("bkgts,bskd->bkgtd", p.astype(v.dtype), vb,
                            preferred_element_type=plan.acc)
            live = lax.dynamic_update_index_in_dim(acc[2], jnp.any(p > 0, axis=(-2, -1)), kj,
                                                   axis=-1)
            return acc[0] + pv, acc[1] + jnp.sum(p, -1, keepdims=True), live

        acc0 = (jnp.zeros((b, hk, g, plan.block_q, dv), plan.acc),
                jnp.zeros((b, hk, g, plan.block_q, 1), plan.acc),
                jnp.zeros((b, hk, g, nk), bool))
        live_any = jnp.any(rs.live, axis=(0, 1, 2))
        pv, total, live = _fold_kv(cfg, qi, nk, qb, k, masking, body, acc0, live=live_any)
        inv_total = jnp.where(total > 0, 1.0 / jnp.where(total > 0, total, 1.0), 0.0)
        out = jnp.transpose(pv * inv_total, (0, 3, 1, 2, 4))
        return out, (rs.m, rs.tau, inv_total, rs.iters), live

    out, rows, live = lax.map(one_q_block, jnp.arange(nq))
    out = jnp.moveaxis(out, 0, 1).reshape(b, tp, hk, g, dv)
    rows = tuple(_rows_out(r, b, hk, g, tp) for r in rows)
    return out, rows, live


def _backward(cfg: _Cfg, q, k, v, masking, alpha, rows, live, d_out):
    """dq, dk, dv (layouts of q, k, v) and dα [Hkv, G]; all inputs in the acc dtype."""
    plan = cfg.plan
    head_major = functools.partial(jnp.transpose, axes=(0, 2, 3, 1, 4))
    q, d_out = head_major(q), head_major(d_out)  # [B, Hkv, G, Tp, D]
    k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [B, Hkv, Sp, D]
    b, hk, g, tp, d = q.shape
    sp = k.shape[2]
    nq, nk = tp // plan.block_q, sp // plan.block_kv
    am1 = _am1(cfg, alpha)
    m, tau, inv_total, _ = rows
    live_any = jnp.any(live, axis=(1, 2, 3))  # [nq, nk]
    learn = cfg.alpha is None

    def rows_of(x, qi):
        return lax.dynamic_slice_in_dim(x, qi * plan.block_q, plan.block_q, axis=3)[..., None]

    def tile(qi, kj, masked):
        qb = lax.dynamic_slice_in_dim(q, qi * plan.block_q, plan.block_q, axis=3)
        kb = lax.dynamic_slice_in_dim(k, kj * plan.block_kv, plan.block_kv, axis=2)
        vb = lax.dynamic_slice_in_dim(v, kj * plan.block_kv, plan.block_kv, axis=2)
        dob = lax.dynamic_slice_in_dim(d_out, qi * plan.block_q, plan.block_q, axis=3)
        s = _block_scores(plan, qb, kb, masking, qi, kj, masked=masked)
        it = rows_of(inv_total, qi)
        p, u = _probs(cfg, s, rows_of(m, qi), rows_of(tau, qi), am1, it)
        sg = _sgrad(cfg, p, u, it, alpha)
        dp = jnp.einsum("bkgtd,bksd->bkgts", dob, vb, preferred_element_type=plan.acc)
        return qb, kb, dob, p, sg, dp

    # pass 1: σ = Σ s, ρ = Σ s dp (and, for an array α, Σ p dp, H = Σ p log p, Σ p log p dp)
    def sums_block(qi):
        def body(kj, acc, masked):
            _, _, _, p, sg, dp = tile(qi, kj, masked)
            new = [sg, sg * dp]
            if learn:
                pos = p > 0
                plogp = jnp.where(pos, p * jnp.log(jnp.where(pos, p, 1.0)), 0.0)
                new += [p * dp, plogp, plogp * dp]
            return _add(acc, _row_sums(*new))

        def step(kj, acc, masked):
            return lax.cond(live_any[qi, kj], functools.partial(body, masked=masked),
                            lambda kj, c: c, kj, acc)

        acc = tuple(jnp.zeros((b, hk, g, plan.block_q, 1), plan.acc)
                    for _ in range(5 if learn else 2))
        first, end = _static_kv_range(plan, qi, nk, masking)
        return _two_loops(0, first, end, functools.partial(step, masked=False),
                          functools.partial(step, masked=True), acc)

    sums = tuple(_rows_out(x, b, hk, g, tp) for x in lax.map(sums_block, jnp.arange(nq)))
    sigma, rho = sums[0], sums[1]
    r = jnp.where(sigma > 0, rho / jnp.where(sigma > 0, sigma, 1.0), 0.0)  # Σ ŝ dp

    # pass 2: dq, dk, dv, one scan over key blocks
    def dkv_for_block(dq, kj):
        def body(qi, carry, masked):
            dk, dv, dq = carry
            qb, kb, dob, p, sg, dp = tile(qi, kj, masked)
            ds = sg * (dp - rows_of(r, qi))
            dk = dk + jnp.einsum("bkgts,bkgtd->bksd", ds, qb, preferred_element_type=plan.acc)
            dv = dv + jnp.einsum("bkgts,bkgtd->bksd", p, dob, preferred_element_type=plan.acc)
            dq_b = lax.dynamic_slice_in_dim(dq, qi * plan.block_q, plan.block_q, axis=3)
            dq_b = dq_b + jnp.einsum("bkgts,bksd->bkgtd", ds, kb, preferred_element_type=plan.acc)
            return dk, dv, lax.dynamic_update_slice_in_dim(dq, dq_b, qi * plan.block_q, axis=3)

        def step(qi, carry, masked):
            return lax.cond(live_any[qi, kj], functools.partial(body, masked=masked),
                            lambda qi, c: c, qi, carry)

        carry = (jnp.zeros((b, hk, plan.block_kv, d), plan.acc),
                 jnp.zeros((b, hk, plan.block_kv, v.shape[-1]), plan.acc), dq)
        start, first_clean = _q_range(plan, kj, nq, masking)
        dk, dv, dq = _two_loops(start, first_clean, nq, functools.partial(step, masked=True),
                                functools.partial(step, masked=False), carry)
        return dq, (jnp.swapaxes(dk * plan.scale, 1, 2), jnp.swapaxes(dv, 1, 2))

    dq = jnp.zeros((b, hk, g, tp, d), plan.acc)
    dq, (dk, dv) = lax.scan(dkv_for_block, dq, jnp.arange(nk))
    dq = (dq * plan.scale).transpose(0, 3, 1, 2, 4)
    dk = jnp.moveaxis(dk, 0, 1).reshape(b, sp, hk, d)
    dv = jnp.moveaxis(dv, 0, 1).reshape(b, sp, hk, v.shape[-1])
    if not learn:
        return dq, dk, dv, jnp.zeros_like(alpha)
    p_dp, ent, plogp_dp = sums[2:]
    am1 = (alpha - 1.0)[None, :, :, None]
    d_alpha = (p_dp - r) / (am1 * am1) - (plogp_dp - ent * r) / am1  # [B, Hkv, G, Tp]
    return dq, dk, dv, jnp.sum(d_alpha, axis=(0, 3))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _entmax_core(cfg: _Cfg, q, k, v, masking, alpha):
    out, rows, live = _forward(cfg, q, k, v, masking, alpha)
    return out, rows[0], rows[1], rows[3], live


def _entmax_core_fwd(cfg, q, k, v, masking, alpha):
    out, rows, live = _forward(cfg, q, k, v, masking, alpha)
    return (out, rows[0], rows[1], rows[3], live), (q, k, v, masking, alpha, rows, live)


def _entmax_core_bwd(cfg, res, cotangents):
    q, k, v, masking, alpha, rows, live = res
    up = functools.partial(jnp.asarray, dtype=cfg.plan.acc)
    dq, dk, dv, da = _backward(cfg, up(q), up(k), up(v), masking, alpha, rows, live,
                               up(cotangents[0]))
    d_masking = jax.tree.map(lambda x: None, masking)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), d_masking, da


_entmax_core.defvjp(_entmax_core_fwd, _entmax_core_bwd)


# ----------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------
def _parse_alpha(alpha, heads: int):
    """(static α or None, array α [H] or None); ValueError for α ≤ 1 or a bad shape."""
    a_static, arr = split_alpha(alpha, _NAME)
    if arr is None:
        return a_static, None
    if arr.shape not in ((), (heads,)):
        raise ValueError(
            f"{_NAME}: `alpha` must be a number or an array of shape [heads] = ({heads},), "
            f"got shape {arr.shape}"
        )
    return None, jnp.broadcast_to(arr, (heads,))


def _pick_implementation(implementation, a_static, mask, q_segment_ids):
    """"xla" or "pallas"; None picks the kernel on GPU/TPU when it is installed and supports
    the call (a Python-number α, no mask or segment ids)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"{_NAME}: `implementation` must be one of {IMPLEMENTATIONS}, got {implementation!r}"
        )
    on_accel = jax.default_backend() in ("gpu", "cuda", "rocm", "tpu")
    if implementation == "xla" or (implementation is None and not on_accel):
        return "xla"
    unsupported = [what for what, bad in (
        ("a per-head (array) alpha", a_static is None),
        ("mask", mask is not None),
        ("q_segment_ids/kv_segment_ids", q_segment_ids is not None),
    ) if bad]
    has_kernel = importlib.util.find_spec(_KERNEL_MODULE) is not None
    if implementation is None:
        return "pallas" if has_kernel and not unsupported else "xla"
    if not has_kernel:
        raise ValueError(f"{_NAME}: implementation='pallas' needs the kernel module "
                         f"{_KERNEL_MODULE}, which is not installed")
    if unsupported:
        raise ValueError(f"{_NAME}: implementation='pallas' does not support "
                         f"{', '.join(unsupported)}; use implementation='xla'")
    return "pallas"


def _call_kernel(q, k, v, *, alpha, causal, scale, n_iter, bins, tol, tiles, return_aux):
    """``pallas_kernels.entmax_attention.entmax_attention_pallas`` (imported here, never at
    module import), with its aux mapped to ours: ``tau`` as is, ``block_sparsity`` from its
    live tiles [B, H, nq, nk]; ``iterations`` only if the kernel reports it. ``tiles``:
    (block_q, block_kv), or None for the kernel's default ``BlockSizes``."""
    kernel = importlib.import_module(_KERNEL_MODULE)
    extra = {} if n_iter is None else {"n_iter": n_iter}
    if tol is not None:
        extra["tol"] = tol
    sizes = kernel.BlockSizes.get_default()
    if tiles is not None:
        sizes = kernel.BlockSizes(block_q=tiles[0], block_k=tiles[1])
    res = kernel.entmax_attention_pallas(
        q, k, v, alpha=alpha, causal=causal, scale=scale, bins=bins, block_sizes=sizes,
        interpret=jax.default_backend() == "cpu", return_aux=return_aux, **extra)
    if not return_aux:
        return res
    out, kaux = res
    live = kaux["live"]  # [B, H, nq, nk]
    nq, nk = live.shape[-2:]

    def tile(b, n):  # the kernel's clamp of a tile size (pallas_kernels._block: >= 16)
        return min(b, max(16, 1 << (n - 1).bit_length()))

    bq, bk = tile(sizes.block_q, q.shape[1]), tile(sizes.block_k, k.shape[1])
    in_range = np.ones((nq, nk), bool)
    if causal:
        in_range = np.arange(nk)[None, :] * bk <= (np.arange(nq) * bq + bq - 1)[:, None]
    counted = int(in_range.sum()) * live.shape[0] * live.shape[1]
    aux = {"tau": kaux["tau"],
           "block_sparsity": ((counted - jnp.sum(live & in_range)) / counted).astype(jnp.float32)}
    if "iterations" in kaux:
        aux["iterations"] = kaux["iterations"]
    return out, aux


def entmax_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    alpha=1.5,
    causal: bool = False,
    mask: jax.Array | None = None,
    scale: float | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    solver: str = "histogram",
    n_iter: int | None = None,
    bins: int = 8,
    tol: float | None = None,
    block_q: int = 128,
    block_kv: int = 128,
    implementation: str | None = None,
    return_aux: bool = False,
):
    """α-entmax attention, blockwise: out_i = Σ_j p_ij v_j, p_i = entmax_α(scale·q_i·K^T).

    Args:
      q: [B, T, H, D]; k: [B, S, Hkv, D]; v: [B, S, Hkv, Dv]; H % Hkv == 0.
      alpha: a Python number > 1 (1.5: entmax-1.5; 2: sparsemax), or a float array of
        shape [H] or [] (per head, differentiable, clamped to ≥ 1.001 where its gradient
        is zero; e.g. ``lcjax.entmax.alpha_from_param(raw)``).
      causal: query i sees keys j <= i; key blocks above the diagonal are skipped.
      mask: bool broadcastable to [B, H, T, S], True = may attend.
      scale: score scale, default 1/sqrt(D).
      q_segment_ids, kv_segment_ids: int [B, T], [B, S]; attend within a segment,
        negative ids are padding.
      solver: ``"histogram"`` (AdaSplash-2 init, then exact quadratic / Newton steps; for
        α ∉ {1.5, 2} or an array α, Newton from the power-mean lower bound, and bisection
        for α > 2), ``"newton"`` (no histogram: Newton-type steps from that lower bound) or
        ``"bisect"``.
      n_iter: cap on solver steps (default 10 after the histogram, else 50; the loop ends
        as soon as every row of a query block meets ``tol``).
      bins: histogram edges, 2, 4 or 8.
      tol: stop when |Σp - 1| < tol (default 1e-5; 1e-12 in float64).
      block_q, block_kv: tile sizes of the XLA path (clipped to T and S; lengths need not
        divide them), and of the kernel with ``implementation="pallas"``.
      implementation: None, ``"xla"`` or ``"pallas"``. None runs the Pallas kernel
        (``pallas_kernels.entmax_attention``, imported lazily) on GPU/TPU when it is
        installed and supports the call — a Python-number α, no ``mask`` or segment ids —
        with the kernel's default tiles, and the XLA path otherwise; ``"pallas"`` raises
        ``ValueError`` where the kernel cannot serve the call (the kernel validates its
        tiles; on CPU it runs in interpret mode). The kernel chooses its own solver
        (``solver`` is for the XLA path) and its aux has ``tau`` and ``block_sparsity``
        (``iterations`` only if it reports them).
      return_aux: also return a dict with ``tau`` [B, T, H] float32 (``lcjax.entmax``
        convention, +inf for empty rows, no gradient), ``iterations`` [B, T, H] int32 and
        ``block_sparsity`` (float32 scalar: fraction of (batch, head, query block, key
        block) tiles at or below the causal diagonal — all tiles if not causal — with no
        weight above τ).

    Returns: [B, T, H, Dv] in q's dtype, and the aux dict when ``return_aux``.
    """
    shapes = validate_qkv(q, k, v, mask=mask, name=_NAME)
    if shapes.q_len == 0 or shapes.kv_len == 0:
        raise ValueError(f"{_NAME}: empty sequence: q {q.shape}, k {k.shape}")
    a_static, a_arr = _parse_alpha(alpha, shapes.heads)
    if solver not in SOLVERS:
        raise ValueError(f"{_NAME}: `solver` must be one of {SOLVERS}, got {solver!r}")
    if bins not in (2, 4, 8):
        raise ValueError(f"{_NAME}: `bins` must be 2, 4 or 8, got {bins}")
    if block_q <= 0 or block_kv <= 0:
        raise ValueError(f"{_NAME}: block sizes must be positive, got block_q={block_q}, "
                         f"block_kv={block_kv}")
    if n_iter is not None and int(n_iter) < 0:
        raise ValueError(f"{_NAME}: `n_iter` must be >= 0, got {n_iter}")
    impl = _pick_implementation(implementation, a_static, mask, q_segment_ids)
    if impl == "pallas":
        tiles = (block_q, block_kv) if implementation == "pallas" else None
        return _call_kernel(q, k, v, alpha=a_static, causal=causal, scale=scale, n_iter=n_iter,
                            bins=bins, tol=tol, tiles=tiles, return_aux=return_aux)

    acc = stat_dtype(q, k, v)
    exact = a_static in (1.5, 2.0)
    if solver == "bisect" or (a_static is not None and a_static > 2.0):
        kind, init = "bisect", "bracket"  # α > 2: f is concave with unbounded f'
    else:
        kind = "quadratic" if a_static == 1.5 else "newton"
        init = "histogram" if solver == "histogram" and exact else "origin"
    if n_iter is None:
        n_iter = 10 if init == "histogram" else 50
    if tol is None:
        tol = 1e-12 if acc == jnp.float64 else 1e-5
    block_q = min(block_q, shapes.q_len)
    block_kv = min(block_kv, shapes.kv_len)
    plan = _BlockPlan(scale=default_scale(shapes.head_dim, scale), causal=bool(causal),
                      block_q=block_q, block_kv=block_kv, q_len=shapes.q_len,
                      kv_len=shapes.kv_len, q_offset=0, acc_dtype=acc.name)
    cfg = _Cfg(plan, a_static, kind, init, int(n_iter), int(bins), float(tol))
    tp = -(-shapes.q_len // block_q) * block_q
    sp = -(-shapes.kv_len // block_kv) * block_kv
    masking = pad_masking(mask, q_segment_ids, kv_segment_ids, shapes.q_len, shapes.kv_len,
                          tp, sp, name=_NAME)
    hk, g = shapes.kv_heads, shapes.groups
    if a_arr is None:
        alpha_hg = jnp.zeros((hk, g), acc)  # unused placeholder
    else:
        alpha_hg = jnp.maximum(a_arr.astype(acc), ALPHA_ARRAY_FLOOR).reshape(hk, g)
    qh = _pad_axis(group_queries(q, hk), 1, tp)
    out, m_rows, tau, iters, live = _entmax_core(cfg, qh, _pad_axis(k, 1, sp), _pad_axis(v, 1, sp),
                                         masking, alpha_hg)
    out = ungroup(out[:, : shapes.q_len]).astype(q.dtype)
    if not return_aux:
        return out

    def per_row(x):  # [B, Hkv, G, Tp] -> [B, T, H]
        x = x[..., : shapes.q_len].reshape(shapes.batch, shapes.heads, shapes.q_len)
        return jnp.moveaxis(x, 1, 2)

    # τ in the entmax convention for the scores x: (α-1)·m + τ_shifted (m = row max)
    am1 = (a_static - 1.0) if a_arr is None else (alpha_hg - 1.0)[None, :, :, None]
    tau_conv = jnp.where(jnp.isfinite(tau), lax.stop_gradient(tau + am1 * m_rows), jnp.inf)
    nq, nk = tp // block_q, sp // block_kv
    in_range = np.ones((nq, nk), bool)
    if causal:
        last_q = np.arange(nq) * block_q + block_q - 1
        in_range = np.arange(nk)[None, :] <= (last_q // block_kv)[:, None]
    counted = int(in_range.sum()) * shapes.batch * shapes.heads
    n_dead = counted - jnp.sum(live & jnp.asarray(in_range)[:, None, None, None, :])
    aux = {
        "tau": per_row(tau_conv).astype(jnp.float32),
        "iterations": per_row(iters),
        "block_sparsity": (n_dead / counted).astype(jnp.float32),
    }
    return out, aux


def sparsemax_attention(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
                        kv_segment_ids=None, **options):
    """Sparsemax attention: :func:`entmax_attention` with α = 2 (same options)."""
    return entmax_attention(q, k, v, alpha=2.0, causal=causal, mask=mask, scale=scale,
                            q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                            **options)
