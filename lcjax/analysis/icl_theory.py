r"""Closed-form error of linear-attention in-context regression on a prompt of several tasks
(in-context continual learning), its bias / variance / interference decomposition,
forgetting, and a Monte Carlo estimate of each quantity with a 99% confidence interval.

After Li, Ding & Hu, "Understanding Generalization and Forgetting in In-Context Continual
Learning" (ICML 2026, arXiv:2605.28705). The paper's exact statements are not public in full
text here; the setting below is defined precisely in ``docs/continual_icl.md``, where every
formula is derived.

Setting. Task τ = 0..T-1 contributes a block of n_τ consecutive pairs to the prompt,
x ~ N(0, I_d), y = w_τᵀx + ε, ε ~ N(0, σ_τ²), everything independent. The predictor
(:func:`lcjax.attention.icl_predict`) is ŷ(x_q) = x_qᵀ Γ h, h = (1/M) Σ_{i∈P} y_i x_i over
the M visible pairs P: all of them (unmasked LSA) or the first p (masked, a query after
position p). If m_τ of the visible pairs come from task τ (π_τ = m_τ/M), a query of task
q (x_q, y_q = w_qᵀx_q + ε_q fresh) has, given the task vectors,

    E(ŷ - y_q)² = ‖Γ w̄ - w_q‖² + (1/M²) Σ_τ m_τ [‖Γw_τ‖² + (‖w_τ‖² + σ_τ²)‖Γ‖_F²] + σ_q²,
    w̄ = Σ_τ π_τ w_τ,

split as bias ‖(Γ - I)w_q‖², variance (the second term with every w_τ replaced by w_q),
noise σ_q², and interference = the rest (exactly 0 when every visible task has w_τ = w_q).
Averaged over Gaussian tasks w_τ = √ρ w₀ + √(1-ρ) u_τ (w₀, u_τ ~ N(0, (s/d) I), so
E‖w_τ‖² = s and corr(w_τ, w_σ) = ρ), with F = ‖Γ‖_F², t = tr Γ:

    bias = (s/d)‖Γ - I‖_F²,   variance = (F/M²) Σ_τ m_τ (s/d + s + σ_τ²),
    interference = (s/d)(1 - ρ)[(Σ_τ π_τ² - 1) F + 2(1 - π_q) t].

Forgetting of task t (masked predictor): its error at the end of the prompt minus its error
right after its own block. The unmasked predictor sees the whole prompt from every query
position, so its errors do not depend on the task order and it does not forget.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lcjax.attention.linear import icl_predict

__all__ = ["Estimate", "ErrorTerms", "Z99", "continual_errors", "error_terms", "forgetting",
           "lsa_error", "monte_carlo_forgetting", "monte_carlo_terms", "optimal_gamma",
           "prefix_counts"]

Z99 = 2.5758293035489004  # two-sided 99% normal quantile
TERMS = ("bias", "variance", "interference", "noise", "total")


class ErrorTerms(NamedTuple):
    """Expected squared error of a query and its parts (total = the sum of the others)."""

    bias: float
    variance: float
    interference: float
    noise: float
    total: float


class Estimate(NamedTuple):
    """A Monte Carlo mean and the half-width of its 99% confidence interval."""

    mean: float
    half_width: float

    def covers(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (widened by 1e-6·max(1, |value|): the
        float32 rounding of the simulation, which matters only for exact zeros)."""
        value = float(value)
        return abs(value - self.mean) <= self.half_width + 1e-6 * max(1.0, abs(value))


# ----------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------
def _counts(counts, name="counts") -> np.ndarray:
    c = np.asarray(counts)
    if c.ndim != 1 or c.size == 0 or not np.issubdtype(c.dtype, np.integer) or (c < 0).any():
        raise ValueError(f"{name} must be a non-empty 1-D array of non-negative ints, got "
                         f"{counts!r}")
    if c.sum() < 1:
        raise ValueError(f"{name}: at least one visible pair is needed, got {counts!r}")
    return c.astype(np.int64)


def _per_task(value, t: int, name: str) -> np.ndarray:
    v = np.broadcast_to(np.asarray(value, np.float64), (t,)) if np.ndim(value) == 0 else \
        np.asarray(value, np.float64)
    if v.shape != (t,) or (v < 0).any():
        raise ValueError(f"`{name}` must be a non-negative scalar or [{t}], got {value!r}")
    return v


def _gamma(gamma, d: int) -> np.ndarray:
    g = np.asarray(gamma, np.float64)
    g = g * np.eye(d) if g.ndim == 0 else g
    if g.shape != (d, d):
        raise ValueError(f"`gamma` must be a scalar or [{d}, {d}], got shape {g.shape}")
    return g


def _query(query, t: int) -> int:
    if not isinstance(query, (int, np.integer)) or not 0 <= query < t:
        raise ValueError(f"`query` must be a task index in [0, {t}), got {query!r}")
    return int(query)


def prefix_counts(block_sizes: Sequence[int], position: int | None) -> np.ndarray:
    """Pairs of each task among the first ``position`` pairs of the prompt (blocks in
    order; None = the whole prompt). [T] int."""
    sizes = _counts(block_sizes, "block_sizes")
    if position is None:
        return sizes
    if not 0 <= position <= sizes.sum():
        raise ValueError(f"`position` must be in [0, {sizes.sum()}], got {position}")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return np.clip(position - starts, 0, sizes)


# ----------------------------------------------------------------------------
# Closed forms
# ----------------------------------------------------------------------------
def error_terms(counts, query: int, *, gamma, noise_var, tasks=None, d: int | None = None,
                w_norm2: float = 1.0, rho: float = 0.0) -> ErrorTerms:
    """Expected squared error of a task-``query`` query when ``counts[τ]`` pairs of task τ
    are visible (module docstring).

    Args:
      counts: [T] visible pairs per task (M = Σ counts ≥ 1).
      query: index of the query's task.
      gamma: Γ [d, d] or a scalar γ (Γ = γI).
      noise_var: σ_τ², scalar or [T].
      tasks: [T, d] task vectors: the error given them; None: averaged over the Gaussian
        task model with ``d``, ``w_norm2`` = s = E‖w‖² and correlation ``rho``.
    """
    m = _counts(counts).astype(np.float64)
    t = m.size
    query = _query(query, t)
    sig2 = _per_task(noise_var, t, "noise_var")
    big_m = m.sum()
    if tasks is None:
        if d is None or d < 1:
            raise ValueError(f"`d` (a positive int) is needed without `tasks`, got {d!r}")
        if not 0.0 <= rho <= 1.0 or w_norm2 < 0:
            raise ValueError(f"need 0 <= rho <= 1 and w_norm2 >= 0, got {rho}, {w_norm2}")
        g = _gamma(gamma, d)
        f, tr, s = float(np.sum(g * g)), float(np.trace(g)), float(w_norm2)
        pi = m / big_m
        bias = s / d * float(np.sum((g - np.eye(d)) ** 2))
        variance = f / big_m ** 2 * float(np.sum(m * (s / d + s + sig2)))
        interference = s / d * (1 - rho) * ((np.sum(pi ** 2) - 1) * f + 2 * (1 - pi[query]) * tr)
    else:
        w = np.asarray(tasks, np.float64)
        if w.ndim != 2 or w.shape[0] != t:
            raise ValueError(f"`tasks` must be [T={t}, d], got shape {w.shape}")
        d = w.shape[1]
        g = _gamma(gamma, d)
        f = float(np.sum(g * g))
        wq = w[query]
        wbar = (m[:, None] * w).sum(0) / big_m
        bias = float(np.sum((g @ wq - wq) ** 2))
        variance = float(np.sum(m * (np.sum((g @ wq) ** 2) + (wq @ wq + sig2) * f))) / big_m ** 2
        full = float(np.sum((g @ wbar - wq) ** 2)) + float(np.sum(
            m * (np.sum((w @ g.T) ** 2, -1) + (np.sum(w * w, -1) + sig2) * f))) / big_m ** 2
        interference = full - bias - variance
    noise = float(sig2[query])
    total = bias + variance + float(interference) + noise
    return ErrorTerms(float(bias), float(variance), float(interference), noise, float(total))


def optimal_gamma(d: int, counts, query: int, *, noise_var, w_norm2: float = 1.0,
                  rho: float = 0.0) -> float:
    """γ* minimising the expected error (Gaussian task model) over Γ = γI; by rotation
    invariance and convexity it is also the best Γ among all d×d matrices:

        γ* = s(ρ + (1-ρ)π_q) / [s(ρ + (1-ρ)Σπ_τ²) + (1/M²) Σ_τ m_τ (s + d(s + σ_τ²))].

    One task of n pairs: γ* = n s / (s(n + 1) + d(s + σ²)) (n/(n + d + 1) for s = d, σ = 0).
    """
    m = _counts(counts).astype(np.float64)
    query = _query(query, m.size)
    sig2 = _per_task(noise_var, m.size, "noise_var")
    pi, s = m / m.sum(), float(w_norm2)
    num = s * (rho + (1 - rho) * pi[query])
    den = s * (rho + (1 - rho) * np.sum(pi ** 2)) + float(
        np.sum(m * (s + d * (s + sig2)))) / m.sum() ** 2
    return float(num / den)


def lsa_error(d: int, n: int, w_norm2: float, noise_var: float,
              gamma: float | None = None) -> float:
    """Single-task error of LSA with Γ = γI on n pairs, for any w with ‖w‖² = ``w_norm2``:

        (1 - γ)² ‖w‖² + γ² [(d + 1)‖w‖² + d σ²] / n + σ²

    (γ = 1: ‖w‖²(d + 1)/n + σ²(1 + d/n); the (d + 1) is the Wishart E[(XᵀX)²] = n(n + d + 1)I
    at work). ``gamma=None``: γ* of :func:`optimal_gamma`, giving the minimum
    s·b/(s + b) + σ² with b = [(d + 1)s + dσ²]/n."""
    if n < 1 or d < 1:
        raise ValueError(f"lsa_error: need n >= 1 and d >= 1, got n={n}, d={d}")
    if gamma is None:
        gamma = optimal_gamma(d, [n], 0, noise_var=noise_var, w_norm2=w_norm2)
    w = np.zeros((1, d))
    w[0, 0] = math.sqrt(w_norm2)
    return error_terms([n], 0, gamma=gamma, noise_var=noise_var, tasks=w).total


def continual_errors(block_sizes, *, gamma, noise_var, masked: bool, tasks=None,
                     d: int | None = None, w_norm2: float = 1.0,
                     rho: float = 0.0) -> dict[str, list[ErrorTerms]]:
    """Per task t, the error right after its block (``"after"``) and at the end of the
    prompt (``"end"``): masked, the query after block t sees blocks 0..t; unmasked, every
    query sees the whole prompt. ``"forgetting"``: end total - after total, per task."""
    sizes = _counts(block_sizes, "block_sizes")
    kw = dict(gamma=gamma, noise_var=noise_var, tasks=tasks, d=d, w_norm2=w_norm2, rho=rho)
    ends = np.cumsum(sizes)
    after = [error_terms(prefix_counts(sizes, int(ends[t]) if masked else None), t, **kw)
             for t in range(sizes.size)]
    end = [error_terms(sizes, t, **kw) for t in range(sizes.size)]
    return {"after": after, "end": end,
            "forgetting": [e.total - a.total for a, e in zip(after, end, strict=True)]}


def forgetting(block_sizes, task: int, *, gamma, noise_var, tasks=None, d: int | None = None,
               w_norm2: float = 1.0, rho: float = 0.0) -> float:
    """Forgetting of ``task`` by the masked predictor: error at the end of the prompt minus
    error right after the task's own block (negative = positive backward transfer)."""
    sizes = _counts(block_sizes, "block_sizes")
    task = _query(task, sizes.size)
    kw = dict(gamma=gamma, noise_var=noise_var, tasks=tasks, d=d, w_norm2=w_norm2, rho=rho)
    right_after = error_terms(prefix_counts(sizes, int(np.cumsum(sizes)[task])), task, **kw)
    return error_terms(sizes, task, **kw).total - right_after.total


# ----------------------------------------------------------------------------
# Monte Carlo
# ----------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("d", "num_prompts", "num_queries",
                                             "random_tasks"))
def _mc_samples(key, tasks, gamma, noise_var, w_norm2, rho, query, visible, owner, *, d,
                num_prompts, num_queries, random_tasks):
    """Per-prompt sample means [2, 5, num_prompts] of bias, variance, interference, noise
    and total (see :func:`monte_carlo_terms`), from the predictor reading the whole prompt
    (row 0, unmasked) and its first ``visible`` pairs (row 1, masked). ``query`` and
    ``visible`` are traced, and so is ``owner`` [N] (the task of each pair): one compilation
    per prompt shape (T, N, d)."""
    b, nq, t = num_prompts, num_queries, tasks.shape[0]
    n = owner.shape[0]
    # one Gaussian draw split into its parts (one threefry expansion: compiles ~3x faster)
    sizes = {"w": (t + 1) * d, "x": n * d, "eps": n, "xq": nq * d, "eq": nq}
    z = jax.random.normal(key, (b, sum(sizes.values())))
    parts = dict(zip(sizes, jnp.split(z, np.cumsum(list(sizes.values()))[:-1], axis=1),
                     strict=True))
    if random_tasks:  # w_τ = √ρ w0 + √(1-ρ) u_τ, w0, u ~ N(0, (s/d) I)
        zw = parts["w"].reshape(b, t + 1, d) * jnp.sqrt(w_norm2 / d)
        w = jnp.sqrt(rho) * zw[:, :1] + jnp.sqrt(1 - rho) * zw[:, 1:]      # [B, T, d]
    else:
        w = jnp.broadcast_to(tasks, (b, t, d))
    x = parts["x"].reshape(b, n, d)
    eps = parts["eps"] * jnp.sqrt(noise_var[owner])
    y = jnp.einsum("bnd,bnd->bn", x, w[:, owner]) + eps
    wq = w[:, query]                                                      # [B, d]
    # the same prompt, every pair of task q (the same op: exactly y when all tasks are w_q)
    y_same = jnp.einsum("bnd,bnd->bn", x, jnp.broadcast_to(wq[:, None], x.shape)) + eps
    xq = parts["xq"].reshape(b, nq, d)
    eq = parts["eq"] * jnp.sqrt(noise_var[query])
    yq = jnp.einsum("bqd,bd->bq", xq, wq) + eq
    signal_g = jnp.einsum("bqd,de,be->bq", xq, gamma, wq)                # x_qᵀ Γ w_q
    bias = jnp.mean((signal_g - jnp.einsum("bqd,bd->bq", xq, wq)) ** 2, -1)
    noise = jnp.mean(eq ** 2, -1)
    out = []
    for vis in (None, jnp.full((nq,), visible, jnp.int32)):
        pred = icl_predict(x, y, xq, gamma, visible=vis)
        pred_same = icl_predict(x, y_same, xq, gamma, visible=vis)
        total = jnp.mean((pred - yq) ** 2, -1)
        same = jnp.mean((pred_same - yq) ** 2, -1)
        variance = jnp.mean((pred_same - signal_g) ** 2, -1)
        out.append(jnp.stack([bias, variance, total - same, noise, total]))
    return jnp.stack(out)


def _estimate(samples) -> Estimate:
    s = np.asarray(samples, np.float64)
    return Estimate(float(s.mean()), float(Z99 * s.std(ddof=1) / math.sqrt(s.size)))


def _mc(key, block_sizes, query, visible, *, gamma, noise_var, tasks, d, w_norm2, rho,
        num_prompts, num_queries):
    sizes = tuple(int(c) for c in _counts(block_sizes, "block_sizes"))
    t = len(sizes)
    query = _query(query, t)
    if tasks is not None:
        tasks = np.asarray(tasks, np.float32)
        if tasks.ndim != 2 or tasks.shape[0] != t:
            raise ValueError(f"`tasks` must be [T={t}, d], got shape {tasks.shape}")
        d = tasks.shape[1]
    elif d is None:
        raise ValueError("`d` is needed without `tasks`")
    g = jnp.asarray(_gamma(gamma, d), jnp.float32)
    sig2 = jnp.asarray(_per_task(noise_var, t, "noise_var"), jnp.float32)
    task_arr = jnp.zeros((t, d), jnp.float32) if tasks is None else jnp.asarray(tasks)
    visible = sum(sizes) if visible is None else int(visible)
    if not 0 <= visible <= sum(sizes):
        raise ValueError(f"`visible` must be in [0, {sum(sizes)}], got {visible}")
    return _mc_samples(key, task_arr, g, sig2, jnp.float32(w_norm2), jnp.float32(rho),
                       jnp.int32(query), jnp.int32(visible),
                       jnp.asarray(np.repeat(np.arange(t), sizes), jnp.int32), d=int(d),
                       num_prompts=num_prompts, num_queries=num_queries,
                       random_tasks=tasks is None)


def monte_carlo_terms(key, block_sizes, query: int, *, gamma, noise_var, visible=None,
                      tasks=None, d: int | None = None, w_norm2: float = 1.0, rho: float = 0.0,
                      num_prompts: int = 4096, num_queries: int = 16) -> dict[str, Estimate]:
    """Monte Carlo of :func:`error_terms` through the predictor itself.

    ``num_prompts`` prompts with blocks of ``block_sizes`` pairs (tasks given, or drawn from
    the Gaussian model per prompt); each is read by :func:`lcjax.attention.icl_predict`
    with ``visible`` leading pairs (None: all, unmasked) on ``num_queries`` fresh queries of
    task ``query``. Per prompt: total = mean (ŷ - y_q)²; the same prompt relabelled with
    w_q for every pair (same x, same noise) gives ŷ_s, and bias = mean (x_qᵀ(Γ - I)w_q)²,
    variance = mean (ŷ_s - x_qᵀΓw_q)², noise = mean ε_q², interference = total - mean
    (ŷ_s - y_q)². Each is the mean over prompts with a 99% CI (normal, across prompts).
    """
    s = _mc(key, block_sizes, query, visible, gamma=gamma, noise_var=noise_var,
            tasks=tasks, d=d, w_norm2=w_norm2, rho=rho, num_prompts=num_prompts,
            num_queries=num_queries)[0 if visible is None else 1]
    return {name: _estimate(s[i]) for i, name in enumerate(TERMS)}


def monte_carlo_forgetting(key, block_sizes, task: int, *, gamma, noise_var, tasks=None,
                           d: int | None = None, w_norm2: float = 1.0, rho: float = 0.0,
                           num_prompts: int = 4096, num_queries: int = 16) -> Estimate:
    """Monte Carlo of :func:`forgetting`: per prompt, the masked predictor's squared error
    on the same task-``task`` queries reading the whole prompt minus reading the prefix
    that ends with block ``task`` (paired), averaged over prompts, with a 99% CI."""
    sizes = _counts(block_sizes, "block_sizes")
    task = _query(task, sizes.size)
    s = _mc(key, sizes, task, int(np.cumsum(sizes)[task]), gamma=gamma,
            noise_var=noise_var, tasks=tasks, d=d, w_norm2=w_norm2, rho=rho,
            num_prompts=num_prompts, num_queries=num_queries)
    return _estimate(s[0, 4] - s[1, 4])
