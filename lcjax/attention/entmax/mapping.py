r"""The α-entmax mapping: sparsemax, entmax-1.5, bisection and the histogram-initialised
threshold solver of AdaSplash-2, with a ``jax.custom_vjp`` that also gives ∂/∂α.

α-entmax (Peters, Niculae & Martins, 2019, "Sparse Sequence-to-Sequence Models";
Correia, Niculae & Martins, 2019, "Adaptively Sparse Transformers") maps scores ``x``
along one axis to a probability vector

    p_i = [z_i - τ]₊^{1/(α-1)},   z = (α-1)·x,   τ such that Σ_i p_i = 1,

for α > 1 (α → 1⁺ is softmax, α = 2 is sparsemax). The threshold follows the
convention of the ``entmax`` package, τ ∈ [max z - 1, max z - n^{1-α}], and solves
f(τ) = Σ_i [z_i - τ]₊^c - 1 = 0 with c = 1/(α-1); f is decreasing in τ, and convex
for α ≤ 2.

Threshold methods (``entmax_threshold``; every one vectorised over rows):

* ``"sort"`` — exact, α ∈ {1.5, 2} only. Sparsemax: τ = (Σ_{i≤k} z_(i) - 1)/k with k the
  largest index such that 1 + k z_(k) > Σ_{i≤k} z_(i) (Michelot 1986; Martins & Astudillo
  2016). Entmax-1.5 (Peters et al. 2019, Algorithm 2): for the top-k of the sorted z,
  running mean M_k and mean of squares, τ_k = M_k - sqrt((1 - k(M2_k - M_k²))/k); the
  support is the largest k with τ_k ≤ z_(k).
* ``"bisect"`` — any α > 1 (also an array α, e.g. per head): halve
  [max z - 1, max z - n^{1-α}] until |f(τ)| < tol or ``n_iter`` halvings (the
  ``entmax`` package's ``entmax_bisect``, with an early stop).
* ``"histogram"`` — the histogram initialisation of AdaSplash-2 (ICML 2026,
  following AdaSplash: Gonçalves, Treviso & Martins, "AdaSplash:
  Adaptive Sparse Flash Attention", ICML 2025) for α = 1.5 and α = 2; any other α, and any
  array α, falls back to ``"bisect"``. With the row max shifted to 0, ``_histogram`` makes
  four vectorised passes (no sort, no scatter: each pass is a few fused row sums, which a
  Pallas kernel accumulates tile by tile, one query row per program):

  0. origin t₀ = max(max z - 1, m_A - n_A^{1-α}), where A = {z > max z - 1} has n_A
     elements of mean m_A: by the power-mean inequality, Σ_A (z - τ)₊^c ≥ n_A (m_A - τ)^c,
     so f(t₀) ≥ 0 and t₀ ≤ τ*. AdaSplash-2 uses t₀ = max z - 1; the tighter origin is our
     addition (inferred, not in the paper): it keeps the bins informative on low-temperature
     rows whose scores span much less than 1, where fixed bins of width 1/8 see one bin.
  1. ``bins`` ∈ {2, 4, 8} bins of width w = (max z - t₀)/bins ≤ 1/bins; at each bin edge
     e_j = t₀ + j·w the pass accumulates G_j = Σ_i (z_i - e_j)₊^c (c = 2 for α = 1.5: the
     count K, sum S and sum of squares Q of the histogram accumulated from the top bin down
     and centred on the edge, Q - 2eS + Ke², but summed directly so that no cancellation
     occurs; c = 1 for α = 2: S - eK). f(e_j) = G_j - 1 is exact, and the last edge with
     G_j ≥ 1 gives the bracket τ* ∈ [a, b] = [e_j, e_j + w], of width ≤ 1/bins.
  2. the slopes at a and b: f' = -2S (α = 1.5) or -K (α = 2) from S = Σ(z - e)₊, K = #{z > e}.
     For α = 2, the closed forms (S - 1)/K over {z > a} and over {z > b} are lower bounds
     of τ* (sparsemax's τ* is the largest such value over top sets) and raise the bracket's
     low end. The first iterate τ₀ is the root in [a, b] of the cubic Hermite interpolant
     of f through the exact f and f' at a and b (f is C¹ for α = 1.5).
  3. each solver step evaluates K, S, Q at τ in one pass and takes, for α = 1.5, the
     closed-form threshold of the current candidate support, the smaller root of
     Σ_{z>τ} (z - t)² = 1, i.e. t = S'/K - sqrt((1 - (Q' - S'²/K))/K) with S', Q' the raw
     sums — computed as τ + F/(S + sqrt(S² - K·F)), F = Q - 1, without cancellation. f is
     piecewise quadratic, so this step is exact as soon as the support is right (Halley's
     step where that quadratic has no root); for α = 2, Newton τ + F/K, which is the same
     closed form (S' - 1)/K and is exact once the support is right; f is convex, so a
     Newton step is a lower bound and is raised to the bracket's low end. Steps that leave
     the bracket become bisection. It stops when |f(τ)| < tol (1e-5), after ``n_iter``
     steps, or when τ no longer moves in floating point. ``iterations`` counts the steps
     after the initialisation: on Gaussian rows ≥ 99% finish in 0–2 steps (tested).

  On XLA:CPU the solver is written with min/max and per-row scalars only: a ``clip`` or a
  per-element ``where`` inside a fused row reduction costs 5–10x the reduction there.

The mapping (``entmax``, ``entmax15``, ``sparsemax``, ``entmax_bisect``) runs in float32
for bf16/fp16/float32 inputs (float64 stays float64), returns the input dtype, and
renormalises p by the Σp it measured at the final τ (so Σp = 1 to rounding for every
method; with the default tol the solver's p is within ~1e-5 of the exact one). Rows are
first shifted by their max, and z is floored at max z - 2 (no element below max z - 1 can
be in the support), so logits near -1000 in fp16/bf16 or one huge logit give finite,
one-hot outputs; ``-inf`` is a masked element; a row that is all ``-inf`` gives zeros
(its threshold is reported as +inf); in a row holding +inf the +inf entries share the mass.
``entmax15`` and ``sparsemax`` default to the histogram solver: the exact sort
(``method="sort"``) is kept for reference, but XLA:CPU sorts 4096-wide rows ~50x slower
than it computes a softmax (``python -m experiments.entmax.bench``, part (d)).

Gradient (``jax.custom_vjp``). On the support, ∂p_i/∂z_i-direction: with
s_i = p_i^{2-α} (0 off the support) and c(α-1) = 1,

    ∂p/∂x = (α-1)·∂p/∂z = diag(s) - s sᵀ/Σs,   so   dx = s⊙g - (sᵀg/Σs)·s

(the (α-1) from z = (α-1)x cancels the c of the power, as in the ``entmax`` package's
``EntmaxBisectFunction``). For α, differentiate p_i = exp(c·log(z_i - τ)) with
dc/dα = -c² and dτ/dα from Σ_i ∂p_i/∂α = 0; writing x_i = (p_i^{α-1} + τ)/(α-1) on the
support gives, with ŝ = s/Σs and H = Σ p log p,

    ∂p/∂α = (p - ŝ)/(α-1)² - (p⊙log p - ŝ·H)/(α-1),   dα = Σ_i g_i ∂p_i/∂α,

which matches ``EntmaxBisectFunction.backward``; both are checked against finite
differences in float64 in ``tests/test_entmax_mapping.py``. The threshold function itself
is not differentiable (``entmax_threshold`` returns it under ``stop_gradient``).

α arguments: a Python number must be > 1 (``ValueError`` otherwise, naming α = 1 as
softmax); a NumPy array is checked the same way; a JAX array (possibly traced, e.g. a
learned per-head α) is clamped to ≥ 1.001, where the gradient w.r.t. α is zero. An array α
is broadcastable against x and has size 1 along ``axis`` (e.g. [heads, 1, 1] for
[batch, heads, q, k] scores). ``alpha_from_param`` maps an unconstrained parameter to
α ∈ [1.01, 2].
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

from pallas_kernels import entmax_rules as rules

__all__ = [
    "ALPHA_ARRAY_FLOOR",
    "ResolvedSolver",
    "SolverConfig",
    "alpha_from_param",
    "entmax",
    "entmax15",
    "entmax_bisect",
    "entmax_power",
    "entmax_threshold",
    "OriginSums",
    "hermite_root",
    "histogram_bracket",
    "histogram_edges",
    "histogram_init",
    "histogram_pick_bin",
    "max_shift",
    "origin_sums_init",
    "origin_sums_update",
    "polish_step",
    "power_mean_origin",
    "row_shift",
    "row_sums",
    "shifted_scores",
    "solver_step",
    "solver_sums",
    "sparsemax",
    "split_alpha",
]

METHODS = ("auto", "sort", "bisect", "histogram")
ALPHA_ARRAY_FLOOR = 1.001  # a JAX-array α is clamped to at least this
_Z_FLOOR = -2.0  # shifted z below max z - 1 is never in the support; clamp to keep it finite


class _Config(NamedTuple):
    alpha: float | None  # static α (Python number) or None for an array α
    method: str  # "sort" | "bisect" | "histogram" (resolved; never "auto")
    n_iter: int
    bins: int
    tol: float


# ----------------------------------------------------------------------------
# Argument handling
# ----------------------------------------------------------------------------
def _compute_dtype(dtype, name: str):
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{name}: `x` must be floating point, got dtype {dtype}")
    return jnp.promote_types(dtype, jnp.float32)


def _normalize_axis(axis: int, ndim: int, name: str) -> int:
    if ndim == 0:
        raise ValueError(f"{name}: `x` must have at least one dimension, got a scalar")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: `axis`={axis} out of range for `x` of rank {ndim}")
    return axis % ndim


def split_alpha(alpha, name: str):
    """(static α, None) for a Python number, else (None, floating array α).

    A number or NumPy array α ≤ 1 raises ``ValueError`` (α = 1 is softmax, α < 1 is not
    a sparse mapping); a JAX array (possibly traced) is left for the caller to clamp.
    """
    if isinstance(alpha, numbers.Real) and not isinstance(alpha, bool):
        a = float(alpha)
        if not a > 1.0:
            raise ValueError(
                f"{name}: `alpha` must be > 1 (alpha = 1 is softmax; alpha < 1 is not a "
                f"sparse mapping), got {alpha}"
            )
        return a, None
    if isinstance(alpha, np.ndarray) and not np.all(alpha > 1.0):
        raise ValueError(f"{name}: every `alpha` must be > 1, got min {np.min(alpha)}")
    arr = jnp.asarray(alpha)
    if not jnp.issubdtype(arr.dtype, jnp.floating):
        arr = arr.astype(jnp.float32)
    return None, arr


def _parse_alpha(alpha, shape, axis: int, name: str):
    """Return (static α or None, array α with x's rank and size 1 along axis, or None)."""
    a_static, arr = split_alpha(alpha, name)
    if arr is None:
        return a_static, None
    ndim = len(shape)
    if arr.ndim > ndim:
        raise ValueError(
            f"{name}: `alpha` of shape {arr.shape} has more dimensions than `x` {tuple(shape)}"
        )
    arr = arr.reshape((1,) * (ndim - arr.ndim) + arr.shape)
    for d, (got, want) in enumerate(zip(arr.shape, shape)):
        if d == axis and got != 1:
            raise ValueError(
                f"{name}: `alpha` of shape {arr.shape} must have size 1 along the reduced "
                f"axis {axis} of `x` {tuple(shape)}"
            )
        if got not in (1, want):
            raise ValueError(
                f"{name}: `alpha` of shape {arr.shape} does not broadcast to `x` {tuple(shape)}"
            )
    return None, arr


def _resolve_method(method: str, alpha_static, name: str) -> str:
    if method not in METHODS:
        raise ValueError(f"{name}: `method` must be one of {METHODS}, got {method!r}")
    exact = alpha_static in (1.5, 2.0)
    if method == "auto":
        return "histogram" if exact else "bisect"
    if method == "sort" and not exact:
        raise ValueError(
            f"{name}: method='sort' is exact only for a Python-number alpha of 1.5 or 2, "
            f"got alpha={alpha_static if alpha_static is not None else 'an array'}"
        )
    if method == "histogram" and not exact:
        return "bisect"  # documented fallback: the closed forms exist for α = 1.5 and 2 only
    return method


def default_n_iter(init: str) -> int:
    """Cap on solver steps: 10 after the histogram initialisation (rows finish in 0-2), 50
    from the power-mean origin or a bracket (Newton or bisection)."""
    return 10 if init == "histogram" else 50


def default_tol(dtype) -> float:
    """|Σp - 1| tolerance: 1e-5 (1e-12 in float64)."""
    return 1e-12 if jnp.dtype(dtype) == jnp.float64 else 1e-5


DEFAULT_BINS = 8
SOLVERS = ("histogram", "newton", "bisect")


class ResolvedSolver(NamedTuple):
    """The solver of one call (hashable): step ``kind`` for :func:`solver_step`
    ("quadratic" | "newton" | "bisect"), ``init`` ("histogram" | "origin" | "bracket"),
    and the numbers."""

    kind: str
    init: str
    n_iter: int
    bins: int
    tol: float


@dataclasses.dataclass(frozen=True)
class SolverConfig:
    """Settings of the blockwise threshold solver of α-entmax attention, shared by its XLA
    path (``lcjax.attention.entmax``) and its Pallas kernel
    (``pallas_kernels.entmax_attention``), which receives every value from here.

    solver: ``"histogram"`` (AdaSplash-2 initialisation for α ∈ {1.5, 2}, then the exact
      quadratic / Newton steps; other α ≤ 2: Newton from the power-mean origin; α > 2 or an
      array α with heads > 2: bisection), ``"newton"`` (no histogram) or ``"bisect"``.
    bins: histogram edges, 2, 4 or 8.
    n_iter: cap on solver steps (None: :func:`default_n_iter`).
    tol: stop once |Σp - 1| < tol (None: :func:`default_tol` of the compute dtype).
    See ``docs/entmax.md`` for the derivation.
    """

    solver: str = "histogram"
    bins: int = DEFAULT_BINS
    n_iter: int | None = None
    tol: float | None = None

    def __post_init__(self):
        if self.solver not in SOLVERS:
            raise ValueError(f"SolverConfig: `solver` must be one of {SOLVERS}, "
                             f"got {self.solver!r}")
        if self.bins not in (2, 4, 8):
            raise ValueError(f"SolverConfig: `bins` must be 2, 4 or 8, got {self.bins}")
        if self.n_iter is not None and (not isinstance(self.n_iter, numbers.Integral)
                                        or self.n_iter < 0):
            raise ValueError(f"SolverConfig: `n_iter` must be an integer >= 0, "
                             f"got {self.n_iter}")
        if self.tol is not None and not float(self.tol) > 0:
            raise ValueError(f"SolverConfig: `tol` must be > 0, got {self.tol}")

    def resolve(self, alpha_static: float | None, dtype) -> ResolvedSolver:
        """The step kind, initialisation and numbers for a static α (None: an array α)."""
        if self.solver == "bisect" or (alpha_static is not None and alpha_static > 2.0):
            kind, init = "bisect", "bracket"  # α > 2: f is concave with unbounded f'
        else:
            kind = "quadratic" if alpha_static == 1.5 else "newton"
            exact = alpha_static in (1.5, 2.0)
            init = "histogram" if self.solver == "histogram" and exact else "origin"
        n_iter = default_n_iter(init) if self.n_iter is None else int(self.n_iter)
        tol = default_tol(dtype) if self.tol is None else float(self.tol)
        return ResolvedSolver(kind, init, n_iter, int(self.bins), tol)


def _make_config(alpha_static, method, n_iter, bins, tol, cdt, name) -> _Config:
    if bins not in (2, 4, 8):
        raise ValueError(f"{name}: `bins` must be 2, 4 or 8, got {bins}")
    if n_iter is None:
        n_iter = default_n_iter("bracket" if method == "bisect" else "histogram")
    if int(n_iter) < 0:
        raise ValueError(f"{name}: `n_iter` must be >= 0, got {n_iter}")
    if tol is None:
        tol = default_tol(cdt)
    return _Config(alpha_static, method, int(n_iter), int(bins), float(tol))


# ----------------------------------------------------------------------------
# Row-wise building blocks (last axis; a Pallas kernel reuses them per row)
# ----------------------------------------------------------------------------
def row_shift(x, cdt):
    """Per-row shift m and row max (compute dtype).

    m = max x for a finite max, 0 for an all -inf row, and the largest finite float for a row
    holding +inf, so that ``_scores`` needs no per-element selects: a +inf entry maps to
    z = 0 and every other entry of its row to the floor (the +inf entries share the mass,
    the limit of huge logits)."""
    xmax = jnp.max(x, axis=-1, keepdims=True).astype(cdt)
    return max_shift(xmax, cdt), xmax


def max_shift(xmax, cdt):
    """The shift m of :func:`row_shift` for a given row max (finite: itself; -inf: 0;
    +inf: the largest finite float)."""
    big = jnp.asarray(jnp.finfo(cdt).max, cdt)
    return jnp.where(xmax == jnp.inf, big, jnp.where(xmax == -jnp.inf, 0.0, xmax))


class OriginSums(NamedTuple):
    """Running sums of the one-pass row max and power-mean origin (``docs/entmax.md``,
    "one pass for the max and the origin"): ``xmax`` the running row max of x, ``n`` the
    count and ``s`` = Σ (z + 1) of the set A' of scores that were above the running max - 1
    (in z units) when seen, with z taken relative to the current max. A' ⊇ A (the set of
    the two-pass origin) and equals it when no later block raises the max."""

    xmax: jax.Array
    n: jax.Array
    s: jax.Array


def origin_sums_init(shape, cdt) -> OriginSums:
    """Empty sums for rows of ``shape`` (..., 1)."""
    zero = jnp.zeros(shape, cdt)
    return OriginSums(jnp.full(shape, -jnp.inf, cdt), zero, zero)


def origin_sums_update(acc: OriginSums, x, am1, cdt) -> OriginSums:
    """Fold one block of scores x [..., n] into ``acc``: the max moves to m' ≥ m, every
    counted z + 1 moves by (α-1)(m - m') (the rescaling of online softmax, additive here),
    and the block's scores with z > -1 relative to m' join A'."""
    xmax = jnp.maximum(acc.xmax, jnp.max(x, axis=-1, keepdims=True).astype(cdt))
    m_old, m_new = max_shift(acc.xmax, cdt), max_shift(xmax, cdt)
    u0 = jnp.maximum(shifted_scores(x, m_new, am1, cdt) + 1.0, 0.0)
    n_b, s_b = row_sums(jnp.sign(u0), u0)
    s = acc.s + acc.n * (am1 * (m_old - m_new))  # n = 0 on rows not seen yet
    return OriginSums(xmax, acc.n + n_b, s + s_b)


def shifted_scores(x, m, am1, cdt):
    """z = (α-1)(x - m) in the compute dtype, floored at -2 (no element below max z - 1 is in
    the support); +inf maps to 0 in a +inf row. Elementwise, so XLA fuses it into every pass
    and z is never stored. (Written with min/max only: on XLA:CPU a clamp or a select in a
    fused reduction costs ~5-10x more than the reduction itself.)"""
    big = jnp.asarray(jnp.finfo(cdt).max, cdt)
    return jnp.maximum(am1 * (jnp.minimum(x.astype(cdt), big) - m), _Z_FLOOR)


def row_sums(*ops):
    """Σ over the last axis of several arrays in one variadic reduction (one pass; XLA:CPU
    runs sibling ``jnp.sum``s as a slow multi-output fusion)."""
    init = tuple(jnp.zeros((), o.dtype) for o in ops)
    out = lax.reduce(ops, init, lambda a, b: tuple(u + v for u, v in zip(a, b)),
                     (ops[0].ndim - 1,))
    return tuple(o[..., None] for o in out)


def entmax_power(u, alpha_static, am1):
    """[u]₊^{1/(α-1)} for u ≥ 0 (0 where u = 0)."""
    if alpha_static == 1.5:
        return u * u
    if alpha_static == 2.0:
        return u
    pos = u > 0  # the select keeps autodiff through this NaN-free at u = 0
    return jnp.where(pos, jnp.exp(jnp.log(jnp.where(pos, u, 1.0)) / am1), 0.0)


def solver_sums(z, tau, kind: str, alpha_static, am1):
    """Row sums of one pass at τ (last axis; a blockwise caller adds them over key blocks):
    ``(P, (k, s, q))`` with P = Σ[z-τ]₊^{1/(α-1)} (f = P - 1) and the statistics of
    :func:`solver_step`: α = 1.5 K = #{z > τ}, S = Σ[z-τ]₊, Q = Σ[z-τ]₊² (P = Q); α = 2
    (newton) K, S (P = S); any other α with ``kind="newton"``: -f' = c·Σ[z-τ]₊^{c-1}
    (c = 1/(α-1)) in the first slot; ``kind="bisect"``: P only (repeated)."""
    u = jnp.maximum(z - tau, 0.0)
    if kind == "quadratic":  # α = 1.5
        k, s, q = row_sums(jnp.sign(u), u, u * u)
        return q, (k, s, q)
    if kind == "bisect":
        (p,) = row_sums(entmax_power(u, alpha_static, am1))
        return p, (p, p, p)
    if alpha_static == 2.0:
        k, s = row_sums(jnp.sign(u), u)
        return s, (k, s, s)
    pos = u > 0  # 0 off the support, also for c - 1 < 0
    lu = jnp.log(jnp.where(pos, u, 1.0))
    c = 1.0 / am1
    p, d = row_sums(jnp.where(pos, jnp.exp(c * lu), 0.0),
                    jnp.where(pos, jnp.exp((c - 1.0) * lu), 0.0))
    return p, (c * d, p, p)


def solver_step(kind, tau, f, stats, lo, hi):
    """Safeguarded update from the pass's ``stats`` = (k, s, ·): lo/hi from the sign of f,
    then a Newton-type step or bisection (``pallas_kernels.entmax_rules.solver_step``)."""
    k, s, _ = stats
    return rules.solver_step(kind, tau, f, k, s, lo, hi)

def _solve(zfun, tau0, lo, hi, done0, kind, alpha_static, am1, n_iter, tol):
    """Iterate from τ₀ until |f(τ)| < tol or n_iter steps. Returns τ, f(τ), steps used.

    ``zfun()`` recomputes the scores inside the loop body, so each step is one read of x.
    """
    f0 = jnp.full_like(tau0, -1.0)
    it0 = jnp.zeros(tau0.shape, jnp.int32)

    def cond(state):
        i, _, _, _, _, _, done = state
        return (i <= n_iter) & ~jnp.all(done)

    def body(state):
        i, tau, lo, hi, fval, iters, done = state
        p, stats = solver_sums(zfun(), tau, kind, alpha_static, am1)
        f = p - 1.0
        new_tau, lo, hi = solver_step(kind, tau, f, stats, lo, hi)
        # also stop when no representable progress is left (long, flat rows in float32
        # can have |f'| so large that |f| < tol is below the resolution of τ)
        stop = done | (jnp.abs(f) < tol) | (i >= n_iter) | (new_tau == tau)
        tau_out = jnp.where(stop, tau, new_tau)
        fval = jnp.where(done, fval, f)
        iters = jnp.where(stop, iters, iters + 1)
        return i + 1, tau_out, lo, hi, fval, iters, stop

    state = (jnp.int32(0), tau0, lo, hi, f0, it0, done0)
    _, tau, _, _, fval, iters, _ = lax.while_loop(cond, body, state)
    return tau, fval, iters


def power_mean_origin(n_a, s_a, am1):
    """Origin t₀ = max(-1, m_A - n_A^{1-α}) ≤ τ* of the histogram (shifted units, max z = 0)
    from the count n_A and s_A = Σ_A (z + 1) of a set A of scores (``docs/entmax.md``,
    "origin"; valid for α ≤ 2, else -1)."""
    dt = s_a.dtype
    n_a = jnp.maximum(n_a, 1.0)
    origin = s_a / n_a - 1.0 - jnp.power(n_a, -jnp.asarray(am1, dt))
    origin = jnp.maximum(origin - 8 * jnp.finfo(dt).eps, -1.0)
    return jnp.where(jnp.asarray(am1) <= 1.0, origin, -1.0)


def histogram_edges(origin, bins: int):
    """Edges e_j = t₀ + j·w, j < bins, w = -t₀/bins: ([..., bins], w [..., 1])."""
    w = -origin / bins
    return origin + w * jnp.arange(bins, dtype=origin.dtype), w


def histogram_pick_bin(G, origin, w):
    """The bin of τ* from the per-edge sums G_j = Σ (z - e_j)₊^{1/(α-1)} [..., bins]:
    j = the last edge with G_j ≥ 1; returns (j [..., 1], a = e_j, b = e_{j+1} (0 for the
    top bin), f(a), f(b))."""
    bins = G.shape[-1]
    G = jnp.concatenate([G, jnp.zeros_like(G[..., :1])], axis=-1)  # e_bins = max z = 0
    j = jnp.clip(jnp.sum((G[..., :bins] >= 1.0).astype(jnp.int32), -1, keepdims=True) - 1,
                 0, bins - 1)
    a = origin + w * j.astype(G.dtype)
    b = jnp.where(j == bins - 1, 0.0, a + w)
    return (j, a, b, jnp.take_along_axis(G, j, axis=-1) - 1.0,
            jnp.take_along_axis(G, j + 1, axis=-1) - 1.0)


def histogram_init(a, b, fa, fb, da, db, alpha_static: float):
    """Bracket (lo, hi) ∋ τ* and first iterate τ₀ on the bin [a, b] from f and the slope
    sums at both edges (``da``/``db``: S = Σ(z-e)₊ for α = 1.5, f' = -2S; K = #{z > e} for
    α = 2, f' = -K). τ₀ is the root of the cubic Hermite interpolant; for α = 2 the closed
    forms (S - 1)/K over {z > a} and {z > b} are lower bounds of τ* and raise lo."""
    lo, hi = a, b
    if alpha_static == 1.5:
        d0, d1 = -2.0 * da, -2.0 * db
    else:
        d0, d1 = -da, -db
        eps = 1e-6 if a.dtype == jnp.float32 else 1e-12
        t_a = a + fa / jnp.where(da > 0, da, 1.0)
        t_b = jnp.where(db > 0, b + fb / jnp.where(db > 0, db, 1.0), a)
        lo = jnp.clip(jnp.maximum(t_a, t_b) - eps, a, b)
    h = b - a
    return lo, hi, jnp.clip(a + h * hermite_root(fa, fb, d0, d1, h), lo, hi)


def _histogram(z, bins, alpha_static):
    """The histogram initialisation on one whole row of shifted scores z (max z = 0,
    z ≥ -2), in z units: the origin pass, the per-edge sums G_j in one broadcast reduction,
    the slope sums at the bin's two edges in another (``docs/entmax.md``). Returns the
    bracket (lo, hi) ∋ τ* (hi - lo ≤ 1/bins) and the first iterate τ₀."""
    am1 = alpha_static - 1.0
    u0 = jnp.maximum(z + 1.0, 0.0)
    n_a, s_a = row_sums(jnp.sign(u0), u0)
    origin = power_mean_origin(n_a, s_a, am1)
    edges, w = histogram_edges(origin, bins)  # [..., bins]
    u = jnp.maximum(z[..., None, :] - edges[..., :, None], 0.0)
    G = jnp.sum(u * u if alpha_static == 1.5 else u, axis=-1)
    _, a, b, fa, fb = histogram_pick_bin(G, origin, w)
    ab = jnp.concatenate([a, b], axis=-1)
    v = jnp.maximum(z[..., None, :] - ab[..., :, None], 0.0)
    D = jnp.sum(v if alpha_static == 1.5 else jnp.sign(v), axis=-1)
    return histogram_init(a, b, fa, fb, D[..., :1], D[..., 1:], alpha_static)


def polish_step(kind: str, tau, f, stats):
    """One more step from the last pass's ``stats`` for rows with |f| < tol: τ accurate to
    rounding, not to tol, at no extra pass (``pallas_kernels.entmax_rules.polish_step``)."""
    k, s, _ = stats
    return rules.polish_step(kind, tau, f, k, s)

hermite_root = rules.hermite_root  # root in [0, 1] of the cubic Hermite interpolant

def _threshold(zfun, am1, dead, n, cdt, cfg: _Config):
    """τ (shifted units, max z = 0), f(τ) = Σp - 1 (None for sort), steps used."""
    a_s = cfg.alpha
    if cfg.method == "sort":
        z = zfun()
        tau = _tau_sort15(z) if a_s == 1.5 else _tau_sort2(z)
        return tau, None, jnp.zeros(tau.shape, jnp.int32)
    if cfg.method == "histogram":
        lo, hi, t0 = _histogram(zfun(), cfg.bins, a_s)
        kind = "quadratic" if a_s == 1.5 else "newton"
    else:
        lo = jnp.full(dead.shape, -1.0, cdt)
        hi = -jnp.power(jnp.asarray(float(n), cdt), -am1) + jnp.zeros(dead.shape, cdt)
        t0 = 0.5 * (lo + hi)
        kind = "bisect"
    return _solve(zfun, t0, lo, hi, dead, kind, a_s, am1, cfg.n_iter, cfg.tol)


def _safe_sqrt(v):
    pos = v > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, v, 1.0)), 0.0)


def _tau_sort15(z):
    """Exact entmax-1.5 threshold of p = [z - τ]₊² (Peters et al. 2019, Alg. 2)."""
    n = z.shape[-1]
    zs = -jnp.sort(-z, axis=-1)
    k = jnp.arange(1, n + 1, dtype=z.dtype)
    mean = jnp.cumsum(zs, axis=-1) / k
    mean_sq = jnp.cumsum(zs * zs, axis=-1) / k
    delta = (1.0 - k * (mean_sq - mean * mean)) / k
    tau = mean - _safe_sqrt(delta)
    support = jnp.sum((tau <= zs).astype(jnp.int32), axis=-1, keepdims=True)
    return jnp.take_along_axis(tau, jnp.maximum(support, 1) - 1, axis=-1)


def _tau_sort2(z):
    """Exact sparsemax threshold of p = [z - τ]₊."""
    n = z.shape[-1]
    zs = -jnp.sort(-z, axis=-1)
    k = jnp.arange(1, n + 1, dtype=z.dtype)
    cs = jnp.cumsum(zs, axis=-1) - 1.0
    support = jnp.sum((k * zs > cs).astype(jnp.int32), axis=-1, keepdims=True)
    support = jnp.maximum(support, 1)
    return jnp.take_along_axis(cs, support - 1, axis=-1) / support.astype(z.dtype)


def _forward(x, alpha, cfg: _Config):
    """x [..., n] (any float dtype) and α [..., 1] (compute dtype) -> p in the compute
    dtype, τ (entmax convention), steps used."""
    cdt = alpha.dtype
    am1 = (cfg.alpha - 1.0) if cfg.alpha is not None else (alpha - 1.0)
    m, xmax = row_shift(x, cdt)
    dead = xmax == -jnp.inf

    def zfun():
        return shifted_scores(x, m, am1, cdt)

    tau, fval, iters = _threshold(zfun, am1, dead, x.shape[-1], cdt, cfg)
    p = entmax_power(jnp.maximum(zfun() - tau, 0.0), cfg.alpha, am1)
    total = jnp.sum(p, axis=-1, keepdims=True) if fval is None else 1.0 + fval
    scale = jnp.where(dead | (total <= 0), 0.0, 1.0 / jnp.where(total > 0, total, 1.0))
    p = p * scale  # a per-row factor, not a per-element select
    tau_conv = jnp.where(jnp.isfinite(xmax), tau + am1 * xmax, jnp.inf)
    return p, tau_conv, iters


# ----------------------------------------------------------------------------
# custom_vjp
# ----------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _entmax_core(x, alpha, cfg: _Config):
    return _forward(x, alpha, cfg)[0]


def _entmax_core_fwd(x, alpha, cfg):
    p = _forward(x, alpha, cfg)[0]
    return p, (p, alpha, jnp.zeros((), x.dtype))


def _entmax_core_bwd(cfg, res, g):
    p, alpha, x_like = res
    g = g.astype(p.dtype)
    a = cfg.alpha if cfg.alpha is not None else alpha
    pos = p > 0
    if cfg.alpha == 1.5:
        s = jnp.sqrt(p)
    elif cfg.alpha == 2.0:
        s = jnp.sign(p)
    else:
        s = jnp.where(pos, jnp.exp((2.0 - a) * jnp.log(jnp.where(pos, p, 1.0))), 0.0)
    s_sum = jnp.sum(s, axis=-1, keepdims=True)
    s_sum = jnp.where(s_sum > 0, s_sum, 1.0)
    shat = s / s_sum
    dx = (s * g - shat * jnp.sum(s * g, axis=-1, keepdims=True)).astype(x_like.dtype)
    if cfg.alpha is not None:  # a Python-number α is not differentiable
        return dx, jnp.zeros_like(alpha)
    am1 = alpha - 1.0
    plogp = jnp.where(pos, p * jnp.log(jnp.where(pos, p, 1.0)), 0.0)
    ent = jnp.sum(plogp, axis=-1, keepdims=True)
    dp_dalpha = (p - shat) / (am1 * am1) - (plogp - shat * ent) / am1
    return dx, jnp.sum(g * dp_dalpha, axis=-1, keepdims=True)


_entmax_core.defvjp(_entmax_core_fwd, _entmax_core_bwd)


# ----------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------
def _prepare(x, alpha, axis, method, n_iter, bins, tol, name):
    x = jnp.asarray(x)
    cdt = _compute_dtype(x.dtype, name)
    axis = _normalize_axis(axis, x.ndim, name)
    a_s, a_arr = _parse_alpha(alpha, x.shape, axis, name)
    method = _resolve_method(method, a_s, name)
    cfg = _make_config(a_s, method, n_iter, bins, tol, cdt, name)
    xl = jnp.moveaxis(x, axis, -1)  # cast to the compute dtype inside, pass by pass
    if a_arr is None:
        al = jnp.ones(xl.shape[:-1] + (1,), cdt)
    else:
        a_arr = jnp.maximum(a_arr.astype(cdt), ALPHA_ARRAY_FLOOR)
        al = jnp.moveaxis(a_arr, axis, -1)
        al = jnp.broadcast_to(al, xl.shape[:-1] + (1,))
    return x, xl, al, axis, cfg


def entmax(
    x: jax.Array,
    alpha=1.5,
    axis: int = -1,
    method: str = "auto",
    *,
    n_iter: int | None = None,
    bins: int = 8,
    tol: float | None = None,
) -> jax.Array:
    """α-entmax of ``x`` along ``axis``: p = [(α-1)x - τ]₊^{1/(α-1)}, Σp = 1.

    Args:
      x: floating scores, any shape; ``-inf`` marks masked entries.
      alpha: a Python number > 1, or an array broadcastable against ``x`` with size 1
        along ``axis`` (differentiable; clamped to ≥ 1.001).
      axis: the axis that sums to one.
      method: ``"auto"`` (``"histogram"`` for α ∈ {1.5, 2}, else ``"bisect"``), ``"sort"``,
        ``"bisect"`` or ``"histogram"`` (α = 1.5 or 2; otherwise bisection).
      n_iter: cap on solver steps (default 50 for bisection, 10 after the histogram).
      bins: histogram bins, 2, 4 or 8, over [t₀, max z] with t₀ ≥ max z - 1 (width ≤ 1/bins).
      tol: stop when |Σp - 1| < tol (default 1e-5; 1e-12 in float64).

    Returns: an array of ``x``'s shape and dtype.
    """
    x, xl, al, axis, cfg = _prepare(x, alpha, axis, method, n_iter, bins, tol, "entmax")
    p = _entmax_core(xl, al, cfg)
    return jnp.moveaxis(p, -1, axis).astype(x.dtype)


def sparsemax(x: jax.Array, axis: int = -1, *, method: str = "auto") -> jax.Array:
    """Sparsemax (α = 2): the Euclidean projection of ``x`` onto the simplex.

    ``method="sort"`` is the exact sort-based algorithm; the default (``"auto"`` =
    ``"histogram"``) runs the histogram-initialised Newton solver to |Σp - 1| < 1e-5 and
    renormalises — it agrees with the sort to float32 rounding and avoids a sort, which
    XLA:CPU runs ~50x slower than a softmax on 4096-wide rows.
    """
    return entmax(x, 2.0, axis, method)


def entmax15(x: jax.Array, axis: int = -1, *, method: str = "auto") -> jax.Array:
    """1.5-entmax: p = [x/2 - τ]₊².

    ``method="sort"`` is the exact sort-based algorithm (running mean and mean of squares);
    the default (``"auto"`` = ``"histogram"``) is the histogram-initialised solver (see
    ``sparsemax`` for why).
    """
    return entmax(x, 1.5, axis, method)


def entmax_bisect(
    x: jax.Array,
    alpha=1.5,
    axis: int = -1,
    n_iter: int | None = None,
    *,
    tol: float | None = None,
) -> jax.Array:
    """α-entmax for any α > 1 by bisection on τ (α may be a per-row/per-head array)."""
    return entmax(x, alpha, axis, "bisect", n_iter=n_iter, tol=tol)


def entmax_threshold(
    x: jax.Array,
    alpha=1.5,
    axis: int = -1,
    method: str = "histogram",
    *,
    n_iter: int | None = None,
    bins: int = 8,
    tol: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Threshold τ of α-entmax (entmax-package convention, p = [(α-1)x - τ]₊^{1/(α-1)}).

    Returns ``(tau, iterations)``, both of ``x``'s shape with size 1 along ``axis``: τ in
    the compute dtype (float32, or float64) under ``stop_gradient`` (+inf for an all-masked
    row), and int32 solver steps per row (0 for ``"sort"``; bisection halvings; steps after
    the histogram initialisation). ``method="histogram"`` falls back to bisection unless α
    is the Python number 1.5 or 2.
    """
    x, xl, al, axis, cfg = _prepare(
        x, alpha, axis, method, n_iter, bins, tol, "entmax_threshold"
    )
    _, tau, iters = _forward(lax.stop_gradient(xl), lax.stop_gradient(al), cfg)
    return jnp.moveaxis(tau, -1, axis), jnp.moveaxis(iters, -1, axis)


def histogram_bracket(
    x: jax.Array, alpha: float = 1.5, axis: int = -1, bins: int = 8
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The histogram initialisation alone: ``(t_lo, t_hi, t_init)`` (entmax convention) with
    t_lo ≤ τ* ≤ t_hi, t_hi - t_lo ≤ 1/bins, for α = 1.5 or 2 (a Python number)."""
    name = "histogram_bracket"
    x = jnp.asarray(x)
    cdt = _compute_dtype(x.dtype, name)
    axis = _normalize_axis(axis, x.ndim, name)
    a_s, _ = _parse_alpha(alpha, x.shape, axis, name)
    if a_s not in (1.5, 2.0):
        raise ValueError(f"{name}: `alpha` must be 1.5 or 2, got {alpha}")
    if bins not in (2, 4, 8):
        raise ValueError(f"{name}: `bins` must be 2, 4 or 8, got {bins}")
    xl = lax.stop_gradient(jnp.moveaxis(x, axis, -1))
    am1 = a_s - 1.0
    m, xmax = row_shift(xl, cdt)
    out = _histogram(shifted_scores(xl, m, am1, cdt), bins, a_s)
    shift = jnp.where(jnp.isfinite(xmax), am1 * xmax, jnp.inf)
    return tuple(jnp.moveaxis(t + shift, -1, axis) for t in out)


def alpha_from_param(raw: jax.Array) -> jax.Array:
    """Learnable α: ``clip(1 + sigmoid(raw), 1.01, 2.0)``.

    ``raw`` is an unconstrained parameter (e.g. one per head; raw = 0 gives α = 1.5). The
    sigmoid keeps α in (1, 2), between softmax-like and sparsemax, so a learned α cannot
    drift to α ≤ 1 where entmax is undefined; the floor 1.01 keeps 1/(α-1) ≤ 100 (float32
    powers stay finite). The gradient is zero where the clip is active (raw < ≈ -4.6).
    """
    raw = jnp.asarray(raw)
    if not jnp.issubdtype(raw.dtype, jnp.floating):
        raw = raw.astype(jnp.float32)
    return jnp.clip(1.0 + jax.nn.sigmoid(raw), 1.01, 2.0)


def _entmax_reference(x: jax.Array, alpha: float, axis: int = -1) -> jax.Array:
    """Plain-jnp (autodiff, no custom_vjp) sort-based entmax for α ∈ {1.5, 2}; for tests."""
    xl = jnp.moveaxis(jnp.asarray(x), axis, -1)
    xl = xl.astype(jnp.promote_types(xl.dtype, jnp.float32))
    am1 = alpha - 1.0
    z = am1 * (xl - lax.stop_gradient(jnp.max(xl, axis=-1, keepdims=True)))
    tau = _tau_sort15(z) if alpha == 1.5 else _tau_sort2(z)
    p = entmax_power(jnp.maximum(z - tau, 0.0), alpha, am1)
    return jnp.moveaxis(p, -1, axis)

