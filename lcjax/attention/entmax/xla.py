r"""α-entmax attention in XLA, blockwise (AdaSplash-2): the ``"xla"`` implementation of the
``"entmax"`` spec (declared in ``lcjax.attention.entmax.method``, whose docstring has the
equations, the options and the ``aux``).

The [T, S] scores are never built: per query block, one pass over key blocks gives the row
max and the power-mean origin together (and keeps each row's max per key block), one the
histogram (α ∈ {1.5, 2}), one each solver step (:func:`~lcjax.attention.entmax.mapping.
solver_step`; a converged row takes :func:`~lcjax.attention.entmax.mapping.polish_step` from
the same sums), and the output pass visits only the tiles the τ_build/τ_final rule keeps
live. The histogram and solver passes skip the key blocks in which, for every row of the
query block, the largest z is at or below the row's lower bound of τ (the histogram origin;
the bracket's lo): their terms [z - e]₊ and [z - τ]₊ vanish there, and such a block holds
no weight at the final τ. ``docs/entmax.md`` has the derivation (edges, per-edge sums,
Hermite root, steps, the tile rule, the backward and dα); the step and histogram rules are
those of :mod:`lcjax.attention.entmax.mapping`, the tiling that of
:mod:`lcjax.attention.blocks`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Bool, Float

from lcjax.attention.blocks import (
    BlockPlan,
    Masking,
    block_plan,
    block_scores,
    fold_kv_blocks,
    fold_q_blocks,
    match_varying,
    pad_inputs,
    pad_masking,
    rows_to_heads,
    ungroup,
)
from lcjax.attention.core import stat_dtype, window_size
from lcjax.attention.entmax.config import DEFAULT_CONFIG, NAME, EntmaxConfig, prepare_call
from lcjax.attention.entmax.mapping import (
    ALPHA_ARRAY_FLOOR,
    ResolvedSolver,
    entmax_power,
    histogram_edges,
    histogram_init,
    histogram_pick_bin,
    max_shift,
    origin_sums_init,
    origin_sums_update,
    polish_step,
    power_mean_origin,
    row_sums,
    shifted_scores,
    solver_step,
    solver_sums,
)
from pallas_kernels.entmax_rules import alpha_cotangent

__all__ = ["block_sparsity", "entmax_attention_xla"]


class _Cfg(NamedTuple):
    """Static configuration of the XLA path (hashable; the custom_vjp's nondiff arg)."""

    plan: BlockPlan
    alpha: float | None  # static α, or None for a per-head array α
    solver: ResolvedSolver


# ----------------------------------------------------------------------------
# Forward: threshold per query block
# ----------------------------------------------------------------------------
def _am1(cfg: _Cfg, alpha):
    """α - 1: a Python float, or [1, Hkv, G, 1, 1] from the per-head array [Hkv, G]."""
    if cfg.alpha is not None:
        return cfg.alpha - 1.0
    return (alpha - 1.0)[None, :, :, None, None]


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


def _histogram_pass(cfg: _Cfg, fold, zfun, origin):
    """Per-edge sums G_j, D_j over key blocks (D: Σ(z-e)₊ for α = 1.5, #{z > e} for α = 2),
    then the bracket and Hermite iterate of
    :func:`lcjax.attention.entmax.mapping.histogram_init`."""
    a_s = cfg.alpha
    edges, w = histogram_edges(origin, cfg.solver.bins)  # [..., bq, bins]

    def body(kj, s, acc):
        u = jnp.maximum(zfun(s)[..., None, :] - edges[..., :, None], 0.0)  # [.., bins, bk]
        g, d = row_sums(u * u, u) if a_s == 1.5 else row_sums(u, jnp.sign(u))
        return _add(acc, (g[..., 0], d[..., 0]))

    zero = jnp.zeros(edges.shape, edges.dtype)
    G, D = fold(body, (zero, zero))
    j, a, b, fa, fb = histogram_pick_bin(G, origin, w)
    D = jnp.concatenate([D, jnp.zeros_like(D[..., :1])], axis=-1)  # nothing above max z
    da, db = jnp.take_along_axis(D, j, axis=-1), jnp.take_along_axis(D, j + 1, axis=-1)
    return histogram_init(a, b, fa, fb, da, db, a_s)


class _RowState(NamedTuple):
    m: jax.Array  # row shift (max x), [.., bq, 1]
    tau: jax.Array  # shifted τ (+inf for empty rows)
    iters: jax.Array  # int32 solver steps
    live: jax.Array  # bool [B, Hkv, G, nk]: tile may hold a z > τ (a superset)


def _solver_update(cfg: _Cfg, am1, i, tau, f, stats, lo, hi, iters, done, tau_fin):
    """One solver step of every row from f = Σp - 1 and the pass's sums at τ: the next τ
    and bracket (:func:`~lcjax.attention.entmax.mapping.solver_step`; bisection for heads
    with α > 2), and, for a row that stops now (converged |f| < tol, out of steps, or a
    fixed point), its final τ (polished when converged). Returns (τ, lo, hi, iters, done,
    τ_final), all [B, Hkv, G, bq, 1]."""
    sol = cfg.solver
    new_tau, lo, hi = solver_step(sol.kind, tau, f, stats, lo, hi)
    polished = jnp.clip(polish_step(sol.kind, tau, f, stats), lo, hi)
    if cfg.alpha is None:  # heads with α > 2 (f concave, f' unbounded): bisection
        concave = jnp.asarray(am1) > 1.0
        new_tau = jnp.where(concave, 0.5 * (lo + hi), new_tau)
        polished = jnp.where(concave, tau, polished)
    converged = jnp.abs(f) < sol.tol
    stop = done | converged | (i >= sol.n_iter) | (new_tau == tau)
    tau_fin = jnp.where(stop & ~done, jnp.where(converged, polished, tau), tau_fin)
    iters = jnp.where(stop, iters, iters + 1)
    return jnp.where(stop, tau, new_tau), lo, hi, iters, stop, tau_fin


def _solve_block(cfg: _Cfg, qi, qb, k, masking: Masking, alpha, refs) -> _RowState:
    """τ of the ``block_q`` rows of query block ``qi`` (head-major qb [B, Hkv, G, bq, D])."""
    plan, sol = cfg.plan, cfg.solver
    dt = plan.acc
    am1 = _am1(cfg, alpha)
    b, hk, g, bq = qb.shape[:4]
    row = (b, hk, g, bq, 1)
    nk = plan.num_kv_blocks

    def fold(body, carry, live=None):
        carry = match_varying(carry, *refs)
        return fold_kv_blocks(plan, qi, qb, k, masking, body, carry, live=live)

    # 1. one pass: each row's max score per key block (what lets the later passes skip
    #    blocks; the row max is their max) and the power-mean origin (online, docs/entmax.md)
    def first_pass(kj, s, c):
        tile_max = lax.dynamic_update_index_in_dim(c[0], jnp.max(s, -1).astype(dt), kj, -1)
        return tile_max, (None if c[1] is None else origin_sums_update(c[1], s, am1, dt))

    acc0 = None if sol.init == "bracket" else origin_sums_init(row, dt)
    tile_max, acc = fold(first_pass, (jnp.full(row[:-1] + (nk,), -jnp.inf, dt), acc0))
    xmax = jnp.max(tile_max, -1, keepdims=True)  # [B, Hkv, G, bq, 1]
    valid_q = (qi * plan.block_q + jnp.arange(plan.block_q) < plan.q_len)[:, None]
    xmax = jnp.where(valid_q, xmax, -jnp.inf)  # padded query rows are empty
    m, dead = max_shift(xmax, dt), xmax == -jnp.inf

    def zfun(s):
        return shifted_scores(s, m, am1, dt)

    tile_zmax = jnp.where(valid_q, zfun(tile_max), -jnp.inf)  # [B, Hkv, G, bq, nk]

    def above(theta):
        """Key blocks holding some z > θ (θ [B, Hkv, G, bq, 1], per row), for any row and
        head: the others add nothing to a pass whose terms vanish at z ≤ θ."""
        return jnp.any(tile_zmax > theta, axis=(0, 1, 2, 3))

    hi = -jnp.power(jnp.asarray(float(plan.kv_len), dt), -jnp.asarray(am1, dt)) + jnp.zeros(row, dt)
    lo = jnp.full(row, -1.0, dt)
    if sol.init == "bracket":
        t0 = 0.5 * (lo + hi)
    else:
        origin = power_mean_origin(acc.n, acc.s, am1)
        if sol.init == "histogram":  # 2. histogram bracket and Hermite initial iterate
            lo, hi, t0 = _histogram_pass(
                cfg, functools.partial(fold, live=above(origin)), zfun, origin)
        else:
            lo, t0 = origin, origin
    t0 = jnp.where(dead, jnp.inf, t0)

    # 3. solver passes; each also records, per tile, the gap max (z - τ) at the τ it used
    def cond(state):
        i, *_, done, _, _ = state
        return (i <= sol.n_iter) & ~jnp.all(done)

    def body(state):
        i, tau, lo, hi, iters, done, tau_fin, _ = state

        def acc_stats(kj, s, acc):
            z = zfun(s)
            p, stats = solver_sums(z, tau, sol.kind, cfg.alpha, am1)
            gap = lax.dynamic_update_index_in_dim(acc[2], jnp.max(z - tau, axis=(-2, -1)), kj,
                                                  axis=-1)
            return _add(acc[0], p), _add(acc[1], stats), gap

        # a block with every z ≤ lo ≤ τ adds nothing, and stays dead at the final τ (≥ lo)
        zero = jnp.zeros(row, dt)
        p, stats, gap = fold(acc_stats, (zero, (zero, zero, zero),
                                         jnp.full((b, hk, g, nk), -jnp.inf, dt)),
                             live=above(lo))
        return (i + 1, *_solver_update(cfg, am1, i, tau, p - 1.0, stats, lo, hi, iters, done,
                                       tau_fin), gap)

    state = (jnp.int32(0), t0, lo, hi, jnp.zeros(row, jnp.int32), dead, t0,
             jnp.full((b, hk, g, nk), -jnp.inf, dt))
    state = match_varying(state, *refs)
    _, tau, _, _, iters, _, tau_fin, gap = lax.while_loop(cond, body, state)
    # the τ_build/τ_final rule: z > τ_fin implies z - τ > τ_fin - τ ≥ the block's minimum
    shift = jnp.min(jnp.where(dead, jnp.inf, tau_fin - tau), axis=(-2, -1))  # [B, Hkv, G]
    return _RowState(m, tau_fin, iters, gap > shift[..., None])


def _probs(cfg: _Cfg, s, m, tau, am1, inv_total=None):
    """p = [z - τ]₊^c (times 1/Σp when given) and u = [z - τ]₊ for one tile."""
    u = jnp.maximum(shifted_scores(s, m, am1, cfg.plan.acc) - tau, 0.0)
    p = entmax_power(u, cfg.alpha, am1)
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


def _rows_out(x, b, hk, g, tp):
    """lax.map output [nq, B, Hkv, G, bq, 1] -> [B, Hkv, G, Tp]."""
    return jnp.moveaxis(x[..., 0], 0, 3).reshape(b, hk, g, tp)


def _forward(cfg: _Cfg, q, k, v, masking: Masking, alpha):
    """Padded q [B, Tp, Hkv, G, D], k [B, Sp, Hkv, D], v [B, Sp, Hkv, Dv], α [Hkv, G] ->
    out [B, Tp, Hkv, G, Dv] (acc dtype), row data [B, Hkv, G, Tp] (m, τ, 1/Σp, iterations)
    and the exact live tiles [nq, B, Hkv, G, nk]."""
    plan = cfg.plan
    b, tp, hk, g, _ = q.shape
    dv = v.shape[-1]
    am1 = _am1(cfg, alpha)
    refs = (q, k, v, masking, alpha)

    def one_q_block(qi):
        qb = lax.dynamic_slice_in_dim(q, qi * plan.block_q, plan.block_q, axis=1)
        qb = jnp.transpose(qb, (0, 2, 3, 1, 4))  # [B, Hkv, G, bq, D]
        rs = _solve_block(cfg, qi, qb, k, masking, alpha, refs)

        def body(kj, s, acc):  # 4. output pass over live tiles; records the exact live tiles
            p, _ = _probs(cfg, s, rs.m, rs.tau, am1)
            vb = lax.dynamic_slice_in_dim(v, kj * plan.block_kv, plan.block_kv, axis=1)
            pv = jnp.einsum("bkgts,bskd->bkgtd", p.astype(v.dtype), vb,
                            preferred_element_type=plan.acc)
            live = lax.dynamic_update_index_in_dim(acc[2], jnp.any(p > 0, axis=(-2, -1)), kj,
                                                   axis=-1)
            return acc[0] + pv, acc[1] + jnp.sum(p, -1, keepdims=True), live

        acc0 = (jnp.zeros((b, hk, g, plan.block_q, dv), plan.acc),
                jnp.zeros((b, hk, g, plan.block_q, 1), plan.acc),
                jnp.zeros((b, hk, g, plan.num_kv_blocks), bool))
        acc0 = match_varying(acc0, *refs)
        live_any = jnp.any(rs.live, axis=(0, 1, 2))
        pv, total, live = fold_kv_blocks(plan, qi, qb, k, masking, body, acc0, live=live_any)
        inv_total = jnp.where(total > 0, 1.0 / jnp.where(total > 0, total, 1.0), 0.0)
        out = jnp.transpose(pv * inv_total, (0, 3, 1, 2, 4))
        return out, (rs.m, rs.tau, inv_total, rs.iters), live

    out, rows, live = lax.map(one_q_block, jnp.arange(plan.num_q_blocks))
    out = jnp.moveaxis(out, 0, 1).reshape(b, tp, hk, g, dv)
    rows = tuple(_rows_out(r, b, hk, g, tp) for r in rows)
    return out, rows, live


# ----------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------
def _backward_terms(p, sg, dp, learn: bool) -> list:
    """The per-tile terms the backward's first pass sums per row: ŝ and ŝ·dp, and for an
    array α also p·dp, p log p and p log p·dp (p [.., bq, bk], ŝ = p^{2-α} on the support,
    dp = dO·v)."""
    terms = [sg, sg * dp]
    if learn:
        pos = p > 0
        plogp = jnp.where(pos, p * jnp.log(jnp.where(pos, p, 1.0)), 0.0)
        terms += [p * dp, plogp, plogp * dp]
    return terms


def _alpha_grad(alpha, sums, r):
    """dα [Hkv, G] from the per-row sums of :func:`_backward_terms` (rows [B, Hkv, G, T, 1])
    and r = Σ ŝ dp / Σ ŝ (``pallas_kernels.entmax_rules.alpha_cotangent``)."""
    p_dp, ent, plogp_dp = sums[2:]
    d_alpha = alpha_cotangent(p_dp, r, ent, plogp_dp, (alpha - 1.0)[None, :, :, None])
    return jnp.sum(d_alpha, axis=(0, 3))


def _backward(cfg: _Cfg, q, k, v, masking: Masking, alpha, rows, live, d_out):
    """dq, dk, dv (layouts of q, k, v) and dα [Hkv, G]; all inputs in the acc dtype.

    With s = p^{2-α} on the support and dp = dO·v: pass 1 σ = Σ s, ρ = Σ s dp (and, for an
    array α, Σ p dp, H = Σ p log p, Σ p log p dp); pass 2 (one scan over key blocks) ds =
    s (dp - ρ/σ), dq = scale Σ ds k, dk = scale Σ ds q, dv = Σ p dO (``docs/entmax.md``).
    """
    plan = cfg.plan
    head_major = functools.partial(jnp.transpose, axes=(0, 2, 3, 1, 4))
    qh, doh = head_major(q), head_major(d_out)  # [B, Hkv, G, Tp, D]
    b, hk, g, tp, d = qh.shape
    sp = k.shape[1]
    am1 = _am1(cfg, alpha)
    m, tau, inv_total, _ = rows
    live_any = jnp.any(live, axis=(1, 2, 3))  # [nq, nk]
    learn = cfg.alpha is None
    refs = (q, k, v, masking, alpha, d_out)

    def rows_of(x, qi):
        return lax.dynamic_slice_in_dim(x, qi * plan.block_q, plan.block_q, axis=3)[..., None]

    def tile(qi, kj, s):
        vb = jnp.swapaxes(lax.dynamic_slice_in_dim(v, kj * plan.block_kv, plan.block_kv,
                                                   axis=1), 1, 2)
        dob = lax.dynamic_slice_in_dim(doh, qi * plan.block_q, plan.block_q, axis=3)
        it = rows_of(inv_total, qi)
        p, u = _probs(cfg, s, rows_of(m, qi), rows_of(tau, qi), am1, it)
        dp = jnp.einsum("bkgtd,bksd->bkgts", dob, vb, preferred_element_type=plan.acc)
        return dob, p, _sgrad(cfg, p, u, it, alpha), dp

    # pass 1: per-row sums over the live key blocks
    def sums_block(qi):
        qb = lax.dynamic_slice_in_dim(qh, qi * plan.block_q, plan.block_q, axis=3)

        def body(kj, s, acc):
            _, p, sg, dp = tile(qi, kj, s)
            return _add(acc, row_sums(*_backward_terms(p, sg, dp, learn)))

        acc = tuple(jnp.zeros((b, hk, g, plan.block_q, 1), plan.acc)
                    for _ in range(5 if learn else 2))
        acc = match_varying(acc, *refs)
        return fold_kv_blocks(plan, qi, qb, k, masking, body, acc, live=live_any[qi])

    sums = tuple(_rows_out(x, b, hk, g, tp) for x in lax.map(sums_block,
                                                               jnp.arange(plan.num_q_blocks)))
    sigma, rho = sums[0], sums[1]
    r = jnp.where(sigma > 0, rho / jnp.where(sigma > 0, sigma, 1.0), 0.0)  # Σ ŝ dp

    # pass 2: dq, dk, dv, one scan over key blocks
    def dkv_for_block(dq, kj):
        kb = jnp.swapaxes(lax.dynamic_slice_in_dim(k, kj * plan.block_kv, plan.block_kv,
                                                   axis=1), 1, 2)

        def body(qi, carry, masked):
            dk, dv, dq = carry
            qb = lax.dynamic_slice_in_dim(qh, qi * plan.block_q, plan.block_q, axis=3)
            s = block_scores(plan, qb, kb, masking, qi, kj, masked=masked)
            dob, p, sg, dp = tile(qi, kj, s)
            ds = sg * (dp - rows_of(r, qi))
            dk = dk + jnp.einsum("bkgts,bkgtd->bksd", ds, qb, preferred_element_type=plan.acc)
            dv = dv + jnp.einsum("bkgts,bkgtd->bksd", p, dob, preferred_element_type=plan.acc)
            dq_b = lax.dynamic_slice_in_dim(dq, qi * plan.block_q, plan.block_q, axis=3)
            dq_b = dq_b + jnp.einsum("bkgts,bksd->bkgtd", ds, kb, preferred_element_type=plan.acc)
            return dk, dv, lax.dynamic_update_slice_in_dim(dq, dq_b, qi * plan.block_q, axis=3)

        carry = (jnp.zeros((b, hk, plan.block_kv, d), plan.acc),
                 jnp.zeros((b, hk, plan.block_kv, v.shape[-1]), plan.acc), dq)
        carry = match_varying(carry, *refs)
        dk, dv, dq = fold_q_blocks(plan, kj, masking, body, carry, live=live_any[:, kj])
        return dq, (jnp.swapaxes(dk * plan.scale, 1, 2), jnp.swapaxes(dv, 1, 2))

    dq = match_varying(jnp.zeros((b, hk, g, tp, d), plan.acc), *refs)
    dq, (dk, dv) = lax.scan(dkv_for_block, dq, jnp.arange(plan.num_kv_blocks))
    dq = (dq * plan.scale).transpose(0, 3, 1, 2, 4)
    dk = jnp.moveaxis(dk, 0, 1).reshape(b, sp, hk, d)
    dv = jnp.moveaxis(dv, 0, 1).reshape(b, sp, hk, v.shape[-1])
    return dq, dk, dv, _alpha_grad(alpha, sums, r) if learn else jnp.zeros_like(alpha)


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
# The implementation
# ----------------------------------------------------------------------------
def block_sparsity(live: Bool[Array, "B H nq nk"], block_q: int, block_kv: int,
                   causal: bool, window: tuple[int, int] | None = None) -> Float[Array, ""]:
    """Fraction of the tiles at or below the causal diagonal (all if not causal) and
    inside the sliding window ``(left, right)`` (if any) that hold no weight, from the live
    flags of a [nq, nk] tile grid (per batch and head)."""
    nq, nk = live.shape[-2:]
    in_range = np.ones((nq, nk), bool)
    first_q = np.arange(nq)[:, None] * block_q
    last_q = first_q + block_q - 1
    first_k = np.arange(nk)[None, :] * block_kv
    if causal:
        in_range = first_k <= last_q
    if window is not None:
        in_range &= (first_k <= last_q + window[1]) & (first_k + block_kv - 1
                                                       >= first_q - window[0])
    counted = int(in_range.sum()) * live.shape[0] * live.shape[1]
    return ((counted - jnp.sum(live & in_range)) / counted).astype(jnp.float32)


def entmax_attention_xla(q: Float[Array, "B T H D"], k: Float[Array, "B S Hkv D"],
         v: Float[Array, "B S Hkv Dv"], *, causal=False, mask=None, scale=None,
         q_segment_ids=None, kv_segment_ids=None, return_aux=False, alpha=1.5,
         config: EntmaxConfig = DEFAULT_CONFIG,
         alibi_slopes=None, alibi_offset=0, local_window_size=None):
    """The XLA implementation (every feature; see ``lcjax.attention.entmax.method``), with
    the one :class:`EntmaxConfig` ``config``. ``alibi_slopes``
    [H] / ``alibi_offset``: the ALiBi bias of ``lcjax.attention.core.alibi_bias``, added in
    the shared tile-score function (``blocks.block_scores``). ``local_window_size``: the
    sliding window of ``lcjax.attention.core.window_mask``; key blocks outside it are
    never visited (solver, output and backward passes)."""
    shapes, a_static, a_arr = prepare_call(q, k, v, alpha)
    acc = stat_dtype(q, k, v)
    plan = block_plan(q_len=shapes.q_len, kv_len=shapes.kv_len, head_dim=shapes.head_dim,
                      scale=scale, causal=causal, block_q=config.block_q,
                      block_kv=config.block_kv, acc_dtype=acc,
                      window=window_size(local_window_size, name=NAME), name=NAME)
    cfg = _Cfg(plan, a_static, config.solver_config.resolve(a_static, acc))
    masking = pad_masking(plan, mask, q_segment_ids, kv_segment_ids, alibi_slopes=alibi_slopes,
                          alibi_offset=alibi_offset, heads=shapes.heads, name=NAME)
    hk, g = shapes.kv_heads, shapes.groups
    if a_arr is None:
        alpha_hg = jnp.zeros((hk, g), acc)  # unused placeholder
    else:
        alpha_hg = jnp.maximum(a_arr.astype(acc), ALPHA_ARRAY_FLOOR).reshape(hk, g)
    out, m_rows, tau, iters, live = _entmax_core(cfg, *pad_inputs(plan, q, k, v), masking,
                                                 alpha_hg)
    out = ungroup(out[:, : shapes.q_len]).astype(q.dtype)
    if not return_aux:
        return out
    # τ in the entmax convention for the scores x: (α-1)·m + τ_shifted (m = row max)
    am1 = (a_static - 1.0) if a_arr is None else (alpha_hg - 1.0)[None, :, :, None]
    tau_conv = jnp.where(jnp.isfinite(tau), lax.stop_gradient(tau + am1 * m_rows), jnp.inf)
    live = jnp.moveaxis(live, 0, -2).reshape(shapes.batch, shapes.heads, plan.num_q_blocks,
                                             plan.num_kv_blocks)
    return out, {"tau": rows_to_heads(tau_conv, shapes.q_len).astype(jnp.float32),
                 "iterations": rows_to_heads(iters, shapes.q_len),
                 "block_sparsity": block_sparsity(live, plan.block_q, plan.block_kv, causal,
                                                    plan.window)}
