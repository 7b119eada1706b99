"""Plackett–Luce distributions over ordered selections (AutoSelect, the ICML 2026 AutoSelect paper).

AutoSelect (demonstration selection as a sequential decision) shows that the optimum of its
KL-regularised objective is a Plackett–Luce ranking over demonstration sequences. For scores
``s ∈ R^n`` an ordered selection ``σ = (σ_1, …, σ_k)`` of ``k`` distinct items out of ``n``
has probability ::

    p(σ | s) = Π_{i=1..k} exp(s_{σ_i}) / Σ_{j ∉ {σ_1..σ_{i-1}}} exp(s_j)
    log p    = Σ_i [ s_{σ_i} − logsumexp_{j not yet chosen} s_j ]

(``k = n``: a full permutation). Sampling without replacement from it is Gumbel-top-k:
perturb ``s_j + G_j`` with i.i.d. standard Gumbel noise and take the ``k`` largest, in
decreasing order. Expectations ``E_σ[f(σ)]`` are exact by enumeration of the
``n!/(n-k)!`` ordered subsets for small pools, or Monte Carlo over Gumbel-top-k samples.

All functions are pure ``jax.numpy`` and jit/vmap-able (``k`` is static: it is a shape).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["check_selection", "ordered_subsets", "pl_log_prob", "gumbel_top_k",
           "pl_expectation", "MAX_ENUMERATION"]

MAX_ENUMERATION = 100_000  # largest number of ordered subsets pl_expectation enumerates


def check_selection(n: int, k: int) -> None:
    """ValueError unless ``1 <= k <= n`` (ints): a selection of ``k`` of ``n`` items."""
    if not isinstance(n, (int, np.integer)) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"n and k must be ints, got n={n!r}, k={k!r}")
    if n < 1 or k < 1:
        raise ValueError(f"need n >= 1 and k >= 1, got n={n}, k={k}")
    if k > n:
        raise ValueError(f"cannot select k={k} distinct items out of n={n} (k > n)")


def ordered_subsets(n: int, k: int) -> np.ndarray:
    """Every ordered selection of ``k`` distinct items of ``range(n)``: int32 ``[n!/(n-k)!, k]``
    in lexicographic order."""
    check_selection(n, k)
    return np.asarray(list(itertools.permutations(range(n), k)), np.int32).reshape(-1, k)


def _check_scores(scores: jax.Array) -> None:
    if scores.ndim != 1 or not jnp.issubdtype(scores.dtype, jnp.floating):
        raise ValueError(f"scores must be a float vector [n], got {scores.dtype}{scores.shape}")


def pl_log_prob(scores: jax.Array, order: jax.Array) -> jax.Array:
    """log p(σ | s) of an ordered selection under Plackett–Luce.

    Args:
      scores: float ``[n]`` (logits; the distribution is invariant to adding a constant).
      order: int ``[k]``, distinct item indices, ``k <= n``; ``order[0]`` is chosen first.

    Returns:
      float scalar ``Σ_i s_{σ_i} − logsumexp_{j ∉ σ_{<i}} s_j``. Batch with ``jax.vmap``.
    """
    scores = jnp.asarray(scores)
    _check_scores(scores)
    if order.ndim != 1:
        raise ValueError(f"order must be an int vector [k], got shape {order.shape}")
    check_selection(scores.shape[0], order.shape[0])
    scores = scores.astype(jnp.promote_types(scores.dtype, jnp.float32))
    picked = jax.nn.one_hot(order, scores.shape[0], dtype=bool)               # [k, n]
    chosen_before = (jnp.cumsum(picked, axis=0) - picked).astype(bool)        # [k, n]
    remaining = jnp.where(chosen_before, -jnp.inf, scores[None, :])           # [k, n]
    return jnp.sum(scores[order] - jax.nn.logsumexp(remaining, axis=-1))


def gumbel_top_k(key: jax.Array, scores: jax.Array, k: int) -> jax.Array:
    """One Plackett–Luce sample without replacement: ``top_k(s + Gumbel noise)``.

    Args:
      key: PRNG key. scores: float ``[n]``. k: static, ``1 <= k <= n``.

    Returns:
      int32 ``[k]``, the items in the order drawn (largest perturbed score first).
    """
    scores = jnp.asarray(scores)
    _check_scores(scores)
    check_selection(scores.shape[0], k)
    noise = jax.random.gumbel(key, scores.shape, jnp.promote_types(scores.dtype, jnp.float32))
    return jax.lax.top_k(scores + noise, k)[1].astype(jnp.int32)


def pl_expectation(fn: Callable[[jax.Array], jax.Array], scores: jax.Array, k: int, *,
                   key: jax.Array | None = None, num_samples: int | None = None) -> jax.Array:
    """``E_{σ ~ PL(s)}[fn(σ)]`` over ordered selections of ``k`` of the ``n`` items.

    Without ``num_samples``: exact, ``Σ_σ p(σ) fn(σ)`` over all ``n!/(n-k)!`` ordered subsets
    (at most :data:`MAX_ENUMERATION`). With ``num_samples`` (and ``key``): the Monte Carlo mean
    of ``fn`` over that many Gumbel-top-k samples. ``fn`` maps an int ``[k]`` order to a
    scalar (it is vmapped); the exact form is differentiable in ``scores``.
    """
    scores = jnp.asarray(scores)
    _check_scores(scores)
    n = scores.shape[0]
    check_selection(n, k)
    if num_samples is None:
        count = math.perm(n, k)
        if count > MAX_ENUMERATION:
            raise ValueError(f"{count} ordered subsets of {k} of {n} items exceed "
                             f"{MAX_ENUMERATION}; pass num_samples= and key= for Monte Carlo")
        orders = jnp.asarray(ordered_subsets(n, k))
        probs = jnp.exp(jax.vmap(pl_log_prob, (None, 0))(scores, orders))
        return jnp.sum(probs * jax.vmap(fn)(orders))
    if key is None or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"Monte Carlo needs a key and num_samples >= 1, got "
                         f"key={key!r}, num_samples={num_samples!r}")
    orders = jax.vmap(gumbel_top_k, (0, None, None))(jax.random.split(key, num_samples),
                                                     scores, k)
    return jnp.mean(jax.vmap(fn)(orders))
