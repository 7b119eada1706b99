r"""α-entmax attention (AdaSplash-2), blockwise: one spec, an XLA path and a Pallas kernel.

Sparse attention with the α-entmax mapping (Peters, Niculae & Martins 2019; Correia,
Niculae & Martins 2019) in place of softmax, computed the way AdaSplash does it
(Gonçalves, Treviso & Martins, "AdaSplash: Adaptive Sparse Flash Attention", 2025, and its
v2, AdaSplash-2, with the histogram-initialised threshold). Per query row i of head h
(q [B, T, H, D], k, v [B, S, Hkv, D], key head h // (H/Hkv)):

    x_ij = scale · q_i·k_j  (masked keys excluded),   z_ij = (α_h - 1)(x_ij - max_j x_ij),
    p_ij = [z_ij - τ_i]₊^{1/(α_h-1)},  τ_i such that Σ_j p_ij = 1,   out_i = Σ_j p_ij v_j.

The [T, S] scores are never built: per query block, one pass over key blocks gives the row
max and the power-mean origin together (and keeps each row's max per key block), one the
histogram (α ∈ {1.5, 2}), one each solver step (:func:`lcjax.entmax.solver_step`; a
converged row takes :func:`lcjax.entmax.polish_step` from the same sums), and the output
pass visits only the tiles the τ_build/τ_final rule keeps live. The histogram and solver
passes skip the key blocks in which, for every row of the query block, the largest z is at
or below the row's lower bound of τ (the histogram origin; the bracket's lo): their terms
[z - e]₊ and [z - τ]₊ vanish there, and such a block holds no weight at the final τ.
``docs/entmax.md`` has the derivation (edges, per-edge sums, Hermite root, steps, the tile
rule, the backward and dα); the step and histogram rules are those of
:mod:`lcjax.entmax`, the tiling that of :mod:`lcjax.attention.blocks`.

Registered specs: ``"entmax"`` and ``"sparsemax"`` (α = 2), implementations ``"pallas"``
(``pallas_kernels.entmax_attention``; it raises ``NotImplementedError`` with the reason
where it cannot serve a call: no GPU/TPU unless ``interpret=True``, a mask or
segment ids, ALiBi slopes, float64) and ``"xla"`` (everything, including the ALiBi bias
``alibi_slopes`` [H] / ``alibi_offset`` of the shared tile-score function). Both take the
one :class:`EntmaxConfig` (solver settings shared through :class:`lcjax.entmax.SolverConfig`,
block sizes) and return
the same ``aux``: ``tau`` [B, T, H] float32 (entmax convention p = [(α-1)x - τ]₊^{1/(α-1)},
+inf for an empty row, no gradient), ``iterations`` [B, T, H] int32 (solver steps after the
initialisation) and ``block_sparsity`` (float32: the fraction of (batch, head, query block,
key block) tiles at or below the causal diagonal — all tiles if not causal — in which no
visible pair has weight).

α is a Python number > 1 or a float array [H] (per head, differentiable: see
``lcjax.entmax.alpha_from_param``). A row with no visible key gives zeros.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from lcjax.attention.base import (
    AttentionSpec,
    Features,
    Implementation,
    LearnedParams,
    pallas_skip_on_cpu,
    resolve_kernel,
)
from lcjax.attention.blocks import (
    BlockPlan,
    Masking,
    alibi_slopes_array,
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
from lcjax.attention.core import (
    alibi_bias,
    build_mask,
    stat_dtype,
    validate_qkv,
    window_size,
)
from lcjax.entmax import (
    ALPHA_ARRAY_FLOOR,
    ResolvedSolver,
    SolverConfig,
    entmax,
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
    split_alpha,
)
from pallas_kernels.entmax_rules import alpha_cotangent

__all__ = ["AUX", "EntmaxConfig", "entmax_attention", "entmax_attention_reference",
           "sparsemax_attention"]

_KERNEL_MODULE = "pallas_kernels.entmax_attention"
_NAME = "entmax_attention"
AUX = {"tau": "[B, T, H] float32", "iterations": "[B, T, H] int32",
       "block_sparsity": "[] float32"}


# ----------------------------------------------------------------------------
# The one configuration
# ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class EntmaxConfig:
    """Settings of α-entmax attention, the same for the XLA path and the Pallas kernel.

    solver, bins, n_iter, tol: the threshold solver (:class:`lcjax.entmax.SolverConfig`,
      which holds the defaults and the rules that resolve them).
    block_q, block_kv: tiles of the forward (and of the kernel's backward unless its
      ``block_sizes`` say otherwise). The XLA path clips them to T and S; the kernel needs
      powers of two ≥ 16 (≥ 8 in interpret mode) and raises ``NotImplementedError`` else.
    """

    solver: str = SolverConfig.solver
    bins: int = SolverConfig.bins
    n_iter: int | None = None
    tol: float | None = None
    block_q: int = 128
    block_kv: int = 128

    def __post_init__(self):
        self.solver_config  # noqa: B018 — validates the solver fields
        for name in ("block_q", "block_kv"):
            val = getattr(self, name)
            if not isinstance(val, numbers.Integral) or val <= 0:
                raise ValueError(f"{_NAME}: block sizes must be positive, got "
                                 f"block_q={self.block_q}, block_kv={self.block_kv}")

    @property
    def solver_config(self) -> SolverConfig:
        try:
            return SolverConfig(self.solver, self.bins, self.n_iter, self.tol)
        except ValueError as e:
            raise ValueError(f"{_NAME}: {str(e).removeprefix('SolverConfig: ')}") from None


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
    then the bracket and Hermite iterate of :func:`lcjax.entmax.histogram_init`."""
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
        f = p - 1.0
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
        return i + 1, jnp.where(stop, tau, new_tau), lo, hi, iters, stop, tau_fin, gap

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
            new = [sg, sg * dp]
            if learn:
                pos = p > 0
                plogp = jnp.where(pos, p * jnp.log(jnp.where(pos, p, 1.0)), 0.0)
                new += [p * dp, plogp, plogp * dp]
            return _add(acc, row_sums(*new))

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
    if not learn:
        return dq, dk, dv, jnp.zeros_like(alpha)
    p_dp, ent, plogp_dp = sums[2:]
    d_alpha = alpha_cotangent(p_dp, r, ent, plogp_dp, (alpha - 1.0)[None, :, :, None])
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
# Implementations
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


def _prepare(q, k, v, alpha):
    """Validated (shapes, static α, array α [H]) of a call."""
    shapes = validate_qkv(q, k, v, name=_NAME)
    if shapes.q_len == 0 or shapes.kv_len == 0:
        raise ValueError(f"{_NAME}: empty sequence: q {q.shape}, k {k.shape}")
    return (shapes, *_parse_alpha(alpha, shapes.heads))


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


def _xla(q: Float[Array, "B T H D"], k: Float[Array, "B S Hkv D"],
         v: Float[Array, "B S Hkv Dv"], *, causal=False, mask=None, scale=None,
         q_segment_ids=None, kv_segment_ids=None, return_aux=False, alpha=1.5,
         solver=EntmaxConfig.solver, bins=EntmaxConfig.bins, n_iter=EntmaxConfig.n_iter,
         tol=EntmaxConfig.tol, block_q=EntmaxConfig.block_q, block_kv=EntmaxConfig.block_kv,
         alibi_slopes=None, alibi_offset=0, local_window_size=None):
    """The XLA implementation (every feature; see the module docstring). ``alibi_slopes``
    [H] / ``alibi_offset``: the ALiBi bias of ``lcjax.attention.core.alibi_bias``, added in
    the shared tile-score function (``blocks.block_scores``). ``local_window_size``: the
    sliding window of ``lcjax.attention.core.window_mask``; key blocks outside it are
    never visited (solver, output and backward passes)."""
    config = EntmaxConfig(solver, bins, n_iter, tol, block_q, block_kv)
    shapes, a_static, a_arr = _prepare(q, k, v, alpha)
    acc = stat_dtype(q, k, v)
    plan = block_plan(q_len=shapes.q_len, kv_len=shapes.kv_len, head_dim=shapes.head_dim,
                      scale=scale, causal=causal, block_q=config.block_q,
                      block_kv=config.block_kv, acc_dtype=acc,
                      window=window_size(local_window_size, name=_NAME), name=_NAME)
    cfg = _Cfg(plan, a_static, config.solver_config.resolve(a_static, acc))
    masking = pad_masking(plan, mask, q_segment_ids, kv_segment_ids, alibi_slopes=alibi_slopes,
                          alibi_offset=alibi_offset, heads=shapes.heads, name=_NAME)
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


def _pallas(q: Float[Array, "B T H D"], k: Float[Array, "B S Hkv D"],
            v: Float[Array, "B S Hkv Dv"], *, causal=False, mask=None, scale=None,
            q_segment_ids=None, kv_segment_ids=None, return_aux=False, alpha=1.5,
            solver=EntmaxConfig.solver, bins=EntmaxConfig.bins, n_iter=EntmaxConfig.n_iter,
            tol=EntmaxConfig.tol, block_q=EntmaxConfig.block_q,
            block_kv=EntmaxConfig.block_kv, block_sizes=None, interpret=None,
            alibi_slopes=None, alibi_offset=0):
    """The Pallas kernel (``pallas_kernels.entmax_attention``), given every solver setting
    of the one :class:`EntmaxConfig`; ``NotImplementedError`` (before any computation)
    where it cannot serve the call. ``block_sizes``: the kernel's ``BlockSizes`` (backward
    tiles too), instead of ``block_q``/``block_kv``; ``interpret``: None = on CPU."""
    config = EntmaxConfig(solver, bins, n_iter, tol, block_q, block_kv)
    shapes, a_static, a_arr = _prepare(q, k, v, alpha)
    kernel, interpret = resolve_kernel(_KERNEL_MODULE, interpret)
    gaps = [what for what, bad in (
        ("mask", mask is not None),
        ("q_segment_ids/kv_segment_ids", q_segment_ids is not None),
        ("alibi_slopes (the XLA path adds ALiBi)", alibi_slopes is not None),
        ("float64 (the kernel computes in float32)", stat_dtype(q, k, v) == jnp.float64),
    ) if bad]
    if gaps:
        raise NotImplementedError("does not support " + ", ".join(gaps))
    sizes = block_sizes or kernel.BlockSizes(block_q=config.block_q, block_k=config.block_kv)
    reason = kernel.unsupported_block_sizes(sizes, interpret=interpret)
    if reason:
        if block_sizes is None:  # name the options the user gave, not the kernel's fields
            reason = (reason.replace("block_sizes.block_q ", "block_q ")
                      .replace("block_sizes.block_k ", "block_kv "))
        raise NotImplementedError(reason)
    sol = config.solver_config.resolve(a_static, jnp.float32)
    # an array α [H]: traced, differentiable through the kernel (its backward returns dα),
    # clamped as in the XLA path
    kernel_alpha = a_static if a_arr is None else jnp.maximum(a_arr.astype(jnp.float32),
                                                              ALPHA_ARRAY_FLOOR)
    res = kernel.entmax_attention_pallas(
        q, k, v, alpha=kernel_alpha, causal=causal, scale=scale, solver=config.solver,
        n_iter=sol.n_iter, bins=sol.bins, tol=sol.tol, block_sizes=sizes,
        interpret=interpret, return_aux=return_aux)
    if not return_aux:
        return res
    out, aux = res
    return out, {key: aux[key] for key in AUX}


# ----------------------------------------------------------------------------
# Reference, public functions, specs
# ----------------------------------------------------------------------------
def entmax_attention_reference(
    q: Float[Array, "B T H D"], k: Float[Array, "B S Hkv D"], v: Float[Array, "B S Hkv Dv"],
    *, alpha=1.5, causal: bool = False, mask: Bool[Array, "..."] | None = None,
    scale: float | None = None, q_segment_ids: Int[Array, "B T"] | None = None,
    kv_segment_ids: Int[Array, "B S"] | None = None, alibi_slopes=None, alibi_offset=0,
    local_window_size=None,
) -> Float[Array, "B T H Dv"]:
    """Dense exact α-entmax attention under the full contract (mask, segment ids, GQA,
    array α, ALiBi ``alibi_slopes`` [H] / ``alibi_offset``, the sliding window
    ``local_window_size`` of ``lcjax.attention.core.window_mask``): the [B, H, T, S]
    scores (plus
    ``lcjax.attention.core.alibi_bias``), ``lcjax.entmax.entmax`` over keys (the exact sort
    for α ∈ {1.5, 2}, bisection to rounding otherwise) and p·V."""
    shapes = validate_qkv(q, k, v, mask=mask, name="entmax_attention_reference")
    a_static, a_arr = _parse_alpha(alpha, shapes.heads)
    acc = stat_dtype(q, k, v)
    g = shapes.groups
    scale = 1.0 / np.sqrt(shapes.head_dim) if scale is None else scale
    kk = jnp.repeat(k, g, axis=2).astype(acc)
    x = scale * jnp.einsum("bthd,bshd->bhts", q.astype(acc), kk)
    if alibi_slopes is not None:
        slopes = alibi_slopes_array(alibi_slopes, shapes.heads, dtype=acc, name=_NAME)
        x = x + alibi_bias(shapes.q_len, shapes.kv_len, slopes, q_offset=alibi_offset,
                           dtype=acc)[None]
    full = build_mask(shapes.q_len, shapes.kv_len, causal=causal, mask=mask,
                      q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                      window=window_size(local_window_size, name=_NAME))
    if full is not None:
        x = jnp.where(full, x, -jnp.inf)
    if a_static in (1.5, 2.0):
        p = entmax(x, a_static, axis=-1, method="sort")
    else:
        a = a_static if a_arr is None else a_arr.astype(acc)[None, :, None, None]
        p = entmax(x, a, axis=-1, method="bisect", n_iter=200, tol=1e-30)
    vv = jnp.repeat(v, g, axis=2).astype(acc)
    return jnp.einsum("bhts,bshd->bthd", p, vv).astype(q.dtype)


def entmax_attention(
    q: Float[Array, "B T H D"],
    k: Float[Array, "B S Hkv D"],
    v: Float[Array, "B S Hkv Dv"],
    *,
    alpha=1.5,
    causal: bool = False,
    mask: Bool[Array, "..."] | None = None,
    scale: float | None = None,
    q_segment_ids: Int[Array, "B T"] | None = None,
    kv_segment_ids: Int[Array, "B S"] | None = None,
    solver: str = EntmaxConfig.solver,
    n_iter: int | None = EntmaxConfig.n_iter,
    bins: int = EntmaxConfig.bins,
    tol: float | None = EntmaxConfig.tol,
    block_q: int = EntmaxConfig.block_q,
    block_kv: int = EntmaxConfig.block_kv,
    implementation: str | None = None,
    return_aux: bool = False,
    local_window_size: int | tuple[int, int] | None = None,
    **implementation_options,
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
      solver, n_iter, bins, tol, block_q, block_kv: the one :class:`EntmaxConfig` of both
        implementations (defaults and rules: :class:`lcjax.entmax.SolverConfig`).
      implementation: None (the Pallas kernel where it can serve the call — a GPU/TPU, no
        mask or segment ids, not float64; a number α or an array α, whose dα the kernel's
        backward returns — else XLA), ``"xla"`` or
        ``"pallas"`` (on CPU it runs in the Pallas interpreter; ``NotImplementedError``
        with the reason where it cannot serve the call).
      return_aux: also return ``aux`` (module docstring: tau, iterations, block_sparsity).
      local_window_size: int w or (left, right): query i sees keys j with
        i - left <= j <= i + right (``jax.nn.dot_product_attention``'s sliding window; key
        blocks outside it are skipped; the XLA path serves it).
      implementation_options: options of one implementation (the kernel's
        ``block_sizes``, ``interpret``); another implementation raises on them.

    Returns: [B, T, H, Dv] in q's dtype, and the aux dict when ``return_aux``.
    """
    return ENTMAX(q, k, v, causal=causal, mask=mask, scale=scale,
                  q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                  implementation=implementation, return_aux=return_aux, alpha=alpha,
                  local_window_size=local_window_size,
                  solver=solver, n_iter=n_iter, bins=bins, tol=tol, block_q=block_q,
                  block_kv=block_kv, **implementation_options)


def sparsemax_attention(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
                        kv_segment_ids=None, **options):
    """Sparsemax attention: :func:`entmax_attention` with α = 2 (same options)."""
    return entmax_attention(q, k, v, alpha=2.0, causal=causal, mask=mask, scale=scale,
                            q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                            **options)


def _with_alpha(fn, alpha: float):
    """``fn`` with α fixed (the "sparsemax" spec): its signature without ``alpha``, so the
    dispatcher rejects an ``alpha`` option."""

    @functools.wraps(fn)
    def fixed(q, k, v, **kw):
        return fn(q, k, v, alpha=alpha, **kw)

    sig = inspect.signature(fn)
    fixed.__signature__ = sig.replace(
        parameters=[p for p in sig.parameters.values() if p.name != "alpha"])
    del fixed.__wrapped__
    return fixed


_FEATURES = Features(window=True, dtypes=("float32", "bfloat16", "float16", "float64"))
# the kernel takes no mask, segment ids or sliding window (window=False): such calls go to XLA
_PALLAS_FEATURES = Features(mask=False, segment_ids=False, window=False,
                            dtypes=("float32", "bfloat16", "float16"))
_TEST_OPTIONS = {"block_q": 16, "block_kv": 16}  # tiny conformance shapes span several blocks


def _spec(name, alpha, description):
    fix = functools.partial(_with_alpha, alpha=alpha) if alpha else (lambda fn: fn)
    impls = (Implementation("pallas", fix(_pallas), features=_PALLAS_FEATURES,
                            config=EntmaxConfig, skip_unless_named=pallas_skip_on_cpu),
             Implementation("xla", fix(_xla), config=EntmaxConfig))
    ref = fix(entmax_attention_reference)
    # with a free alpha, a learnable per-head α (Attention(learn=("alpha",))), built by
    # lcjax.nn (variant_params.learnable_alpha)
    params = None if alpha else LearnedParams("learnable_alpha")
    return AttentionSpec(name, reference=ref, implementations=impls, features=_FEATURES,
                         aux=AUX, params=params, test_options=_TEST_OPTIONS,
                         description=description)


ENTMAX = _spec("entmax", None, "alpha-entmax sparse attention (AdaSplash-2)")
SPARSEMAX = _spec("sparsemax", 2.0, "alpha = 2 entmax (sparsemax) attention")
