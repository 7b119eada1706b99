"""In-context smoothing estimators for order-k Markov chains, and the Bayes-optimal loss.

After the ICML 2026 study of induction heads as smoothing estimators (transformers trained
on order-k Markov chains implement soft context matching, weighted exponentially by
overlap, and a BOS token adds Dirichlet pseudo-counts); the classical estimators are
maximum likelihood, additive (Lidstone) smoothing and Jelinek & Mercer (1980)
interpolation (as in Chen & Goodman, "An empirical study of smoothing techniques for
language modeling", 1999). Derivations: ``docs/induction_smoothing.md``.

Conventions (every estimator). ``tokens`` ``x_0..x_{T-1}`` (int ``[T]`` or ``[B, T]``,
values in ``[0, V)``); the result ``p`` is float32 ``[T, V]`` (``[B, T, V]``) with row
``t`` the prediction of ``x_{t+1}`` from ``x_0..x_t``. The context of row ``t`` is its
last ``m`` tokens ``s_t = (x_{t-m+1}, ..., x_t)``; the *observations* up to row ``t`` are
the positions ``j`` with ``m <= j <= t``, each a next token ``x_j`` after its context
``(x_{j-m}, ..., x_{j-1})``. The order-``m`` counts are::

    N_t^m(v) = #{ j in [m, t] : x_{j-i} = x_{t+1-i} for i = 1..m,  x_j = v },
    N_t^m    = sum_v N_t^m(v).

Tokens before ``x_0`` do not exist and match nothing, so a row ``t < m - 1`` has no
order-``m`` evidence. **A row without evidence predicts the uniform ``1/V``** (for the
additive estimator that is what its formula gives anyway).

* :func:`ml_kgram`: ``N_t^k(v) / N_t^k``.
* :func:`additive`: ``(N_t^k(v) + alpha) / (N_t^k + V alpha)``, the posterior mean of
  ``P(. | s_t)`` under the ``Dirichlet(alpha)`` prior: the Bayes predictor of
  :func:`lcjax.data.markov.sample_chains` chains with that ``alpha``.
* :func:`jelinek_mercer`: ``p^{-1} = 1/V``; for ``m = 0..k``,
  ``p^m = lambda_m N_t^m(v) / N_t^m + (1 - lambda_m) p^{m-1}`` where ``N_t^m > 0``, else
  ``p^m = p^{m-1}``; the result is ``p^k`` (interpolation down to the uniform model).
* :func:`soft_matching`: every observation ``j in [k, t]`` is scored by the overlap of its
  context with the current one, ``o_t(j) = #{ i in 1..k : x_{j-i} = x_{t+1-i} }``, and
  weighted by ``exp(beta o_t(j))``; with a pseudo-count ``alpha >= 0`` weighted like an
  exact match (what a BOS token contributes in the disentangled transformer)::

      p_t(v) = (sum_j e^{beta o_t(j)} [x_j = v] + alpha e^{beta k})
               / (sum_j e^{beta o_t(j)} + V alpha e^{beta k}).

  ``beta -> inf`` gives :func:`ml_kgram` (``alpha = 0``) and :func:`additive` on rows with
  an exact match; ``beta = 0`` the unigram of ``x_k..x_t`` (plus ``alpha``).

All four are ``jnp`` and jit-able (``order``/``vocab`` static; ``alpha``, ``beta``,
``lambdas`` may be traced); a ``[B, T]`` input is vmapped. Out-of-range tokens raise
``ValueError`` when the tokens are concrete (not under jit).

:func:`bayes_optimal_loss` is the exact expected next-token cross-entropy of the Bayes
predictor at every row (exhaustive enumeration, tiny cases);
:func:`bayes_loss_monte_carlo` estimates the same numbers, with standard errors, from
sampled chains.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from lcjax.data.markov import check_tokens, sample_chains

__all__ = [
    "ESTIMATORS",
    "additive",
    "bayes_loss_monte_carlo",
    "bayes_optimal_loss",
    "context_counts",
    "cross_entropy",
    "jelinek_mercer",
    "ml_kgram",
    "overlap",
    "soft_matching",
]


def _check(tokens, order, vocab: int | None) -> jax.Array:
    if not isinstance(order, int) or isinstance(order, bool) or order < 0:
        raise ValueError(f"`order` must be an int >= 0; got {order!r}")
    if vocab is not None and (not isinstance(vocab, int) or isinstance(vocab, bool)
                              or vocab < 2):
        raise ValueError(f"`vocab` must be an int >= 2; got {vocab!r}")
    if jnp.ndim(tokens) not in (1, 2):
        raise ValueError(f"`tokens` must be [T] or [B, T]; got shape {jnp.shape(tokens)}")
    if not jnp.issubdtype(jnp.result_type(tokens), jnp.integer):
        raise ValueError(f"`tokens` must be integers; got dtype {jnp.result_type(tokens)}")
    if vocab is not None and not isinstance(tokens, jax.core.Tracer):
        check_tokens(np.asarray(tokens), vocab)
    return jnp.asarray(tokens, jnp.int32)


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _apply(row, x, order, vocab, *params):
    """``row(x [T], order, vocab, *params) -> [T, ...]``, vmapped over ``x [B, T]``; one
    compiled program per (estimator, shape, order, vocab)."""
    f = lambda r, *p: row(r, order, vocab, *p)
    if x.ndim == 2:
        return jax.vmap(f, in_axes=(0,) + (None,) * len(params))(x, *params)
    return f(x, *params)


def _shift(x: jax.Array, lag: int, fill: int) -> jax.Array:
    """``y[t] = x[t - lag]`` (``fill`` where ``t < lag``)."""
    if lag == 0:
        return x
    return jnp.concatenate([jnp.full((lag,), fill, x.dtype), x[:-lag]])[: x.shape[0]]


def _overlap(x: jax.Array, order: int) -> jax.Array:
    """int32 ``[T, T]``: ``O[t, j] = #{i in 1..order : x_{j-i} = x_{t+1-i}}`` (existing ones)."""
    t = x.shape[0]
    out = jnp.zeros((t, t), jnp.int32)
    for i in range(1, order + 1):
        query = _shift(x, i - 1, -1)  # x_{t+1-i}
        key = _shift(x, i, -2)  # x_{j-i}; the two fills never match
        out = out + (query[:, None] == key[None, :]).astype(jnp.int32)
    return out


def _observed(t: int, order: int) -> jax.Array:
    """bool ``[T, T]``: ``j`` is an observation of row ``t`` (``order <= j <= t``)."""
    rows, cols = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
    return (cols <= rows) & (cols >= order)


def overlap(tokens, *, order: int) -> jax.Array:
    """``O[t, j]``: how many of the ``order`` tokens before position ``j`` equal the last
    ``order`` tokens of row ``t`` (aligned: ``x_{j-i}`` vs ``x_{t+1-i}``); ``[T, T]`` or
    ``[B, T, T]`` int32. Meaningful for observations ``order <= j <= t``."""
    x = _check(tokens, order, None)
    return _apply(lambda r, order, vocab: _overlap(r, order), x, order, None)


def _counts(x: jax.Array, order: int, vocab: int) -> jax.Array:
    """float32 ``[T, V]``: ``N_t^order(v)``."""
    exact = (_overlap(x, order) == order) & _observed(x.shape[0], order)
    return exact.astype(jnp.float32) @ jax.nn.one_hot(x, vocab, dtype=jnp.float32)


def context_counts(tokens, *, order: int, vocab: int) -> jax.Array:
    """The counts ``N_t^order(v)`` of every row (module docstring): ``[T, V]`` / ``[B, T, V]``."""
    x = _check(tokens, order, vocab)
    return _apply(_counts, x, order, vocab)


def _normalise_or_uniform(counts: jax.Array, fallback: jax.Array) -> jax.Array:
    total = counts.sum(-1, keepdims=True)
    return jnp.where(total > 0, counts / jnp.where(total > 0, total, 1.0), fallback)


def ml_kgram(tokens, *, order: int, vocab: int) -> jax.Array:
    """Maximum-likelihood order-``k`` estimate ``N_t^k(v) / N_t^k`` (uniform without evidence)."""
    return _apply(_ml_row, _check(tokens, order, vocab), order, vocab)


def _ml_row(r, order, vocab):
    return _normalise_or_uniform(_counts(r, order, vocab), jnp.float32(1.0 / vocab))


def additive(tokens, *, order: int, vocab: int, alpha) -> jax.Array:
    """Additive (Dirichlet posterior-mean) estimate ``(N_t^k(v) + alpha) / (N_t^k + V alpha)``.

    ``alpha > 0`` (checked when concrete).
    """
    x = _check(tokens, order, vocab)
    if not isinstance(alpha, jax.core.Tracer) and not float(alpha) > 0:
        raise ValueError(f"`alpha` must be > 0; got {alpha!r}")
    return _apply(_additive_row, x, order, vocab, jnp.float32(alpha))


def _additive_row(r, order, vocab, a):
    c = _counts(r, order, vocab)
    return (c + a) / (c.sum(-1, keepdims=True) + vocab * a)


def jelinek_mercer(tokens, *, order: int, vocab: int, lambdas) -> jax.Array:
    """Jelinek–Mercer interpolation of the ML estimates of orders ``0..k`` down to uniform.

    ``lambdas``: ``k + 1`` weights in ``[0, 1]``, ``lambdas[m]`` that of order ``m``
    (module docstring for the recursion).
    """
    x = _check(tokens, order, vocab)
    lam = jnp.asarray(lambdas, jnp.float32)
    if lam.shape != (order + 1,):
        raise ValueError(f"`lambdas` must have order + 1 = {order + 1} entries; got shape "
                         f"{lam.shape}")
    if not isinstance(lambdas, jax.core.Tracer) and not bool(jnp.all((lam >= 0) & (lam <= 1))):
        raise ValueError(f"`lambdas` must lie in [0, 1]; got {np.asarray(lam)}")
    return _apply(_jm_row, x, order, vocab, lam)


def _jm_row(r, order, vocab, lam):
    p = jnp.full((r.shape[0], vocab), 1.0 / vocab, jnp.float32)
    for m in range(order + 1):
        ml = _normalise_or_uniform(_counts(r, m, vocab), p)  # no evidence: p^{m-1}
        p = lam[m] * ml + (1.0 - lam[m]) * p
    return p


def soft_matching(tokens, *, order: int, vocab: int, beta, alpha=0.0) -> jax.Array:
    """Soft context matching: observations weighted by ``exp(beta * overlap)``, plus the
    pseudo-count ``alpha`` weighted as an exact match (module docstring).

    ``beta`` finite, ``alpha >= 0`` (checked when concrete); computed with the largest
    exponent subtracted, so any ``beta`` is stable.
    """
    x = _check(tokens, order, vocab)
    for name, v, ok in (("beta", beta, math.isfinite), ("alpha", alpha, lambda a: a >= 0)):
        if not isinstance(v, jax.core.Tracer) and not ok(float(v)):
            raise ValueError(f"`{name}` must be {'finite' if name == 'beta' else '>= 0'}; "
                             f"got {v!r}")
    return _apply(_soft_row, x, order, vocab, jnp.float32(beta), jnp.float32(alpha))


def _soft_row(r, order, vocab, b, a):
    score = b * (_overlap(r, order) - order).astype(jnp.float32)  # exact match: 0
    valid = _observed(r.shape[0], order)
    score = jnp.where(valid, score, -jnp.inf)
    top = jnp.max(score, axis=-1, keepdims=True)
    top = jnp.where(a > 0, jnp.maximum(top, 0.0), top)  # the pseudo-count's exponent is 0
    safe = jnp.where(jnp.isfinite(top), top, 0.0)
    w = jnp.where(valid, jnp.exp(score - safe), 0.0)
    num = w @ jax.nn.one_hot(r, vocab, dtype=jnp.float32) + a * jnp.exp(-safe)
    den = num.sum(-1, keepdims=True)
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 1.0 / vocab)


ESTIMATORS = {"ml_kgram": ml_kgram, "additive": additive, "jelinek_mercer": jelinek_mercer,
              "soft_matching": soft_matching}


def cross_entropy(probs, tokens) -> jax.Array:
    """``-log p_t(x_{t+1})`` of the rows ``t = 0..T-2``: ``[T-1]`` / ``[B, T-1]`` (nats;
    ``inf`` where an estimator gave the next token probability 0)."""
    probs, tokens = jnp.asarray(probs), jnp.asarray(tokens)
    nxt = tokens[..., 1:, None]
    return -jnp.log(jnp.take_along_axis(probs[..., :-1, :], nxt, axis=-1)[..., 0])


def _entropy(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)


def bayes_optimal_loss(length: int, *, order: int, vocab: int, alpha: float,
                       max_sequences: int = 1 << 18) -> np.ndarray:
    """The exact expected loss ``E[-log p_B(x_{t+1} | x_{<=t})]`` of the Bayes predictor
    ``p_B`` (:func:`additive` with the prior's ``alpha``) at rows ``t = 0..length-2`` of
    :func:`~lcjax.data.markov.sample_chains` chains: float64 ``[length - 1]``.

    Exact by enumeration: ``x_{t+1} | x_{<=t}`` has the law ``p_B`` itself under the prior,
    so the loss of row ``t`` is ``E[H(p_B(. | x_{<=t}))]``, summed over all ``V^{length-1}``
    prefixes ``x_0..x_{length-2}`` with their prior probability ``V^{-1} prod_t
    p_B(x_{t+1} | x_{<=t})`` (the Polya-urn marginal). Only float64 rounding is
    approximate. Rows ``t < k`` are ``log V`` exactly.

    Raises:
      ValueError: ``V^{length-1} > max_sequences`` (use :func:`bayes_loss_monte_carlo`).
    """
    if not isinstance(vocab, int) or vocab < 2 or not alpha > 0 or length < 2 or order < 0:
        raise ValueError(f"need vocab >= 2, alpha > 0, length >= 2, order >= 0; got vocab="
                         f"{vocab}, alpha={alpha}, length={length}, order={order}")
    n_seq = vocab ** (length - 1)
    if n_seq > max_sequences:
        raise ValueError(f"bayes_optimal_loss enumerates V^(length-1) = {n_seq} prefixes > "
                         f"max_sequences={max_sequences}; use bayes_loss_monte_carlo")
    seqs = np.array(list(itertools.product(range(vocab), repeat=length - 1)), np.int64)
    seqs = seqs.reshape(n_seq, length - 1)
    counts = np.zeros((n_seq, vocab**order, vocab))
    logp = np.full(n_seq, -math.log(vocab))  # x_0 is uniform
    rows = np.arange(n_seq)
    entropy = np.empty((n_seq, length - 1))
    for t in range(length - 1):
        if t >= order - 1:
            code = np.zeros(n_seq, np.int64)
            for i in range(order):  # the last `order` tokens, oldest most significant
                code = code * vocab + seqs[:, t - order + 1 + i]
            c = counts[rows, code]
            p = (c + alpha) / (c.sum(-1, keepdims=True) + vocab * alpha)
        else:
            code, p = None, np.full((n_seq, vocab), 1.0 / vocab)
        entropy[:, t] = _entropy(p)
        if t < length - 2:  # extend the sequence's probability by p_B(x_{t+1} | x_{<=t})
            nxt = seqs[:, t + 1]
            logp = logp + np.log(p[rows, nxt])
            if code is not None:
                counts[rows, code, nxt] += 1
    # E[H_t] = sum over the enumerated x_0..x_{length-2} of P(x) H_t(x_{<=t})
    return np.exp(logp) @ entropy


@functools.partial(jax.jit, static_argnames=("order", "vocab"))
def _entropy_rows(tokens, order, vocab, alpha):
    p = additive(tokens, order=order, vocab=vocab, alpha=alpha)
    return -(p * jnp.log(jnp.where(p > 0, p, 1.0))).sum(-1)


def bayes_loss_monte_carlo(rng, length: int, n: int, *, order: int, vocab: int, alpha: float,
                           chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Monte Carlo estimate of :func:`bayes_optimal_loss` from ``n`` sampled chains.

    Each chain contributes ``H(p_B(. | x_{<=t}))`` at every row (the Rao–Blackwellised
    form: the expectation over ``x_{t+1}`` is done exactly), so the estimate is unbiased.

    Returns:
      ``(mean, stderr)``: float64 ``[length - 1]`` each, the sample mean over chains and
      its standard error.
    """
    tokens, _ = sample_chains(rng, n, length, order=order, vocab=vocab, alpha=alpha)
    h = np.concatenate([np.asarray(_entropy_rows(jnp.asarray(tokens[i:i + chunk]), order,
                                                 vocab, jnp.float32(alpha)))
                        for i in range(0, n, chunk)])[:, :-1].astype(np.float64)
    stderr = h.std(0, ddof=1) / math.sqrt(n) if n > 1 else np.full(length - 1, np.nan)
    return h.mean(0), stderr
