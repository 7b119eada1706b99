"""The α-entmax threshold solver's per-row update rules, in plain jax.numpy.

One place for the rules that both the Pallas kernel (``pallas_kernels.entmax_attention``)
and the XLA paths (``lcjax.attention.entmax.mapping``, ``lcjax.attention.entmax``) apply to
per-row sums;
the derivation is in ``docs/entmax.md`` ("histogram", "steps"). With the shifted scores
z and u = [z - τ]₊, the solver tracks f(τ) = Σp - 1 and the sums k, s of the last pass:
α = 1.5: k = #{u > 0}, s = Σu (f = Σu² - 1); α = 2: k = #{u > 0} (f = Σu - 1); other
α: k = -f'(τ). This module imports only jax (kernels may import nothing else).

It also holds the one formula of the gradient with respect to α (``alpha_cotangent``),
used by the XLA attention backward and the kernel's dq pass.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["alpha_cotangent", "hermite_root", "polish_step", "solver_step"]


def hermite_root(f0, f1, d0, d1, h):
    """Root in [0, 1] of the cubic Hermite interpolant through (0, f0), (1, f1) with
    slopes d0·h, d1·h: secant start, four guarded Newton steps."""
    m0, m1 = d0 * h, d1 * h
    s = jnp.clip(f0 / jnp.where(f0 - f1 > 0, f0 - f1, 1.0), 0.0, 1.0)
    for _ in range(4):
        s2 = s * s
        s3 = s2 * s
        val = (2 * s3 - 3 * s2 + 1) * f0 + (s3 - 2 * s2 + s) * m0
        val = val + (3 * s2 - 2 * s3) * f1 + (s3 - s2) * m1
        der = (6 * s2 - 6 * s) * (f0 - f1) + (3 * s2 - 4 * s + 1) * m0 + (3 * s2 - 2 * s) * m1
        s = jnp.where(der < 0, jnp.clip(s - val / jnp.where(der < 0, der, -1.0), 0.0, 1.0), s)
    return s


def solver_step(kind: str, tau, f, k, s, lo, hi):
    """Safeguarded step -> (τ', lo', hi'): the bracket from the sign of f, then the exact
    local quadratic root (``kind="quadratic"``, α = 1.5; Halley where it has no root) or
    Newton (``"newton"``, -f' = k; from the lower bound for convex f), bisection where the
    candidate leaves the bracket (and always for ``"bisect"``)."""
    lo = jnp.where(f > 0, tau, lo)
    hi = jnp.where(f < 0, tau, hi)
    mid = 0.5 * (lo + hi)
    if kind == "bisect":
        return mid, lo, hi
    if kind == "newton":
        cand = jnp.maximum(tau + f / jnp.where(k > 0, k, 1.0), lo)
        ok = k > 0
    else:
        disc = s * s - k * f
        quad = tau + f / (s + jnp.sqrt(jnp.maximum(disc, 0.0)))
        halley = tau + 2.0 * f * s / (4.0 * s * s - f * k)
        cand = jnp.where(disc >= 0, quad, halley)
        ok = s > 0
    ok = ok & jnp.isfinite(cand) & (cand >= lo) & (cand <= hi) & (cand != tau)
    return jnp.where(ok, cand, mid), lo, hi


def polish_step(kind: str, tau, f, k, s):
    """One more step from the last pass's sums for a converged row: exact on a fixed
    support for α = 1.5 (quadratic) and α = 2 (Newton), quadratic convergence for Newton
    at other α, so τ is accurate to rounding rather than to tol, at no extra pass."""
    if kind == "bisect":
        return tau
    if kind == "quadratic":
        disc = s * s - k * f
        cand = tau + f / (s + jnp.sqrt(jnp.maximum(disc, 0.0)))
        ok = (s > 0) & (disc >= 0)
    else:
        cand = tau + f / jnp.where(k > 0, k, 1.0)
        ok = k > 0
    return jnp.where(ok & jnp.isfinite(cand), cand, tau)


def alpha_cotangent(p_g, shat_g, ent, plogp_g, am1):
    """Per-row ∂L/∂α of p = entmax_α(x) given the cotangent g = ∂L/∂p, from row sums.

    With s = p^{2-α} on the support, ŝ = s/Σs and H = Σ p log p,
    ∂p/∂α = (p - ŝ)/(α-1)² - (p⊙log p - ŝ·H)/(α-1) (``docs/entmax.md``, "backward"), so

        ∂L/∂α = (Σ p g - Σ ŝ g)/(α-1)² - (Σ p log p · g - H·Σ ŝ g)/(α-1),

    from ``p_g`` = Σ p g, ``shat_g`` = Σ ŝ g, ``ent`` = H and ``plogp_g`` = Σ p log p · g
    (for attention g_j = dO·v_j, so the sums are accumulated over key tiles); ``am1`` = α-1.
    """
    return (p_g - shat_g) / (am1 * am1) - (plogp_g - ent * shat_g) / am1
