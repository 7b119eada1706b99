"""The disentangled attention-only transformer of the induction-heads-as-smoothing study,
with weights that can be set analytically to the soft-matching and Dirichlet estimators.

The disentangled transformer is that of Nichani, Damian & Lee ("How Transformers Learn
Causal Structure with Gradient Descent", ICML 2024): the residual stream is the
*concatenation* of the embedding and every layer's output, and a head's scores are a
bilinear form of the stream, ``score(p, j) = h_p^T A h_j``. The ICML 2026 study of
induction heads as smoothing estimators uses it with ``k`` previous-token heads, then a
matching head; our construction follows ``docs/induction_smoothing.md``.

Input: tokens ``[B, T]`` of a BOS-prefixed chain (``lcjax.data.markov.sample_chains(...,
bos=True)``): position 0 is BOS (id ``V``), position ``p >= 1`` holds chain token
``x_{p-1}``. With ``V' = V + 1`` and ``L = max_len``::

    h0_p = [onehot_{V'}(token_p), onehot_L(p)]                          D0 = V' + L
    a^i  = causal_softmax(h0 A1_i h0^T),  u^i_p = sum_j a^i_{pj} h0_j     i = 1..k (layer 1)
    h1_p = [h0_p, u^1_p, ..., u^k_p]                                   D1 = (k + 1) D0
    b    = causal_softmax(h1 A2 h1^T)                                  (layer 2: matching)
    q_p  = sum_j b_{pj} softmax(h1_j W)                                next-token law [V]
    logits_p = log q_p

The readout is the attention-weighted mixture of per-position votes ``softmax(h1_j W)``, so
the output is a distribution by construction; a linear unembedding followed by a softmax
could not equal a count ratio exactly. All of ``A1 [k, D0, D0]``, ``A2 [D1, D1]``,
``W [D1, V]`` are ordinary trainable parameters (random init, or :func:`build`).

:func:`build` sets them (``gamma`` = :data:`GAMMA`, hard attention up to ``e^{-100}``):

* previous-token head ``i``: ``A1_i[pos p, pos p-i] = gamma`` (``p >= i``) and
  ``A1_i[pos p, pos 0] += gamma / 2`` for every ``p`` — head ``i`` copies the token ``i``
  back, or BOS where that is before the chain;
* matching head: ``A2[tok x_t, tok u^1] = A2[tok u^{i-1}, tok u^i] = beta`` on the chain
  tokens (BOS's coordinate 0: BOS matches nothing), so ``score(p, j) = beta o_t(j)`` with
  the overlap ``o`` of :func:`lcjax.analysis.smoothing.soft_matching` (``t = p - 1``);
  through the query's position one-hot (every position maps to the same row) a constant
  is added per key position: ``-P`` at positions ``1..k`` (chain indices ``< k`` are no
  observations) and at BOS ``beta k + log(V alpha)`` (``alpha > 0``; then BOS weighs
  ``V alpha`` exact matches) or ``-P / 2`` (``alpha = 0``; BOS wins only when nothing else
  is there);
* votes: ``W[tok v, v] = gamma`` for chain tokens, ``W[tok BOS] = 0`` (BOS votes uniform).

Then ``q_p`` is :func:`~lcjax.analysis.smoothing.soft_matching` (``beta``, ``alpha``) of
row ``t = p - 1`` (BOS contributes ``alpha`` to every token) and, with ``beta`` =
:data:`BETA_HARD`, :func:`~lcjax.analysis.smoothing.additive` — to float32 rounding. Row 0
(BOS) predicts uniform.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = ["BETA_HARD", "GAMMA", "DisentangledConfig", "DisentangledTransformer", "build",
           "forward"]

GAMMA = 200.0  # hard-attention scale of the analytic previous-token heads and votes
BETA_HARD = 30.0  # matching scale of the analytic additive estimator: partial matches e^-30


@dataclasses.dataclass(frozen=True)
class DisentangledConfig:
    """``order`` = ``k`` previous-token heads; ``vocab`` = ``V`` chain tokens (BOS = ``V``);
    ``max_len`` = the longest input (one-hot positions); ``init_scale``: std of the random
    init."""

    order: int
    vocab: int
    max_len: int = 256
    init_scale: float = 0.02

    def __post_init__(self):
        if not isinstance(self.order, int) or self.order < 1:
            raise ValueError(f"DisentangledConfig.order must be an int >= 1; got {self.order!r}")
        if not isinstance(self.vocab, int) or self.vocab < 2:
            raise ValueError(f"DisentangledConfig.vocab must be an int >= 2; got {self.vocab!r}")
        if self.max_len < self.order + 2:
            raise ValueError(f"DisentangledConfig.max_len must be >= order + 2; got "
                             f"{self.max_len}")

    @property
    def d0(self) -> int:
        return self.vocab + 1 + self.max_len

    @property
    def d1(self) -> int:
        return (self.order + 1) * self.d0


def _causal_softmax(scores: jax.Array) -> jax.Array:
    t = scores.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    return jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)


@functools.partial(jax.jit, static_argnames=("cfg", "return_attention"))
def forward(params: dict, tokens: jax.Array, cfg: DisentangledConfig, *,
            return_attention: bool = False):
    """``tokens [B, T] -> logits [B, T, V]`` (float32 log-probabilities; module docstring).

    ``params``: ``{"prev": [k, D0, D0], "match": [D1, D1], "vote": [D1, V]}``. With
    ``return_attention`` also ``(prev [B, k, T, T], match [B, T, T])`` attention weights.
    """
    b, t = tokens.shape
    h0 = jnp.concatenate([jax.nn.one_hot(tokens, cfg.vocab + 1, dtype=jnp.float32),
                          jnp.broadcast_to(jnp.eye(t, cfg.max_len, dtype=jnp.float32),
                                           (b, t, cfg.max_len))], axis=-1)
    prev = _causal_softmax(jnp.einsum("btd,hde,bse->bhts", h0, params["prev"], h0))
    u = jnp.einsum("bhts,bsd->bthd", prev, h0).reshape(b, t, cfg.order * cfg.d0)
    h1 = jnp.concatenate([h0, u], axis=-1)
    match = _causal_softmax(jnp.einsum("btd,de,bse->bts", h1, params["match"], h1))
    votes = jax.nn.softmax(h1 @ params["vote"], axis=-1)
    q = jnp.einsum("bts,bsv->btv", match, votes)
    logits = jnp.log(jnp.maximum(q, jnp.finfo(jnp.float32).tiny))
    return (logits, (prev, match)) if return_attention else logits


class DisentangledTransformer(nnx.Module):
    """The disentangled attention-only transformer (module docstring) as an NNX module:
    ``model(tokens [B, T]) -> logits [B, T, V]``; trainable by ``lcjax.train.train`` with
    ``model_fn=lambda cfg, rngs: DisentangledTransformer(cfg, rngs=rngs)``."""

    def __init__(self, cfg: DisentangledConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        k1, k2, k3 = jax.random.split(rngs.params(), 3)
        s = cfg.init_scale
        self.prev = nnx.Param(s * jax.random.normal(k1, (cfg.order, cfg.d0, cfg.d0)))
        self.match = nnx.Param(s * jax.random.normal(k2, (cfg.d1, cfg.d1)))
        self.vote = nnx.Param(s * jax.random.normal(k3, (cfg.d1, cfg.vocab)))

    def params(self) -> dict:
        return {"prev": self.prev[...], "match": self.match[...], "vote": self.vote[...]}

    def _check(self, tokens) -> jax.Array:
        tokens = jnp.asarray(tokens)
        if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"tokens must be int [B, T]; got {tokens.dtype} {tokens.shape}")
        if tokens.shape[1] > self.cfg.max_len:
            raise ValueError(f"T = {tokens.shape[1]} > max_len = {self.cfg.max_len}")
        if not isinstance(tokens, jax.core.Tracer) and tokens.size and (
                int(tokens.min()) < 0 or int(tokens.max()) > self.cfg.vocab):
            raise ValueError(f"tokens must lie in [0, {self.cfg.vocab}] (BOS = "
                             f"{self.cfg.vocab}); got [{int(tokens.min())}, {int(tokens.max())}]")
        return tokens

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return forward(self.params(), self._check(tokens), self.cfg)

    def attention(self, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(prev [B, k, T, T], match [B, T, T])``: the two layers' attention weights."""
        return forward(self.params(), self._check(tokens), self.cfg, return_attention=True)[1]


def analytic_params(cfg: DisentangledConfig, *, beta: float, alpha: float) -> dict:
    """The weights of :func:`build` (float32 numpy): soft matching at ``beta`` with BOS
    pseudo-count ``alpha`` (module docstring)."""
    k, v, big_l = cfg.order, cfg.vocab, cfg.max_len
    tok, pos = lambda block, i: block * cfg.d0 + i, lambda p: v + 1 + p
    prev = np.zeros((k, cfg.d0, cfg.d0), np.float32)
    rows = np.arange(big_l)
    for i in range(1, k + 1):
        prev[i - 1, pos(rows[i:]), pos(rows[i:] - i)] += GAMMA
        prev[i - 1, pos(rows), pos(0)] += GAMMA / 2
    match = np.zeros((cfg.d1, cfg.d1), np.float32)
    chain = np.arange(v)
    for i in range(1, k + 1):  # query: the token i - 1 back; key: the token i back
        match[tok(i - 1, chain), tok(i, chain)] = beta
    penalty = 2 * abs(beta) * k + 300.0
    keys = np.zeros(big_l, np.float32)
    keys[1:k + 1] = -penalty
    keys[0] = beta * k + math.log(v * alpha) if alpha > 0 else -penalty / 2
    match[pos(0):pos(big_l), pos(0):pos(big_l)] = keys[None, :]
    vote = np.zeros((cfg.d1, v), np.float32)
    vote[tok(0, chain), chain] = GAMMA
    return {"prev": prev, "match": match, "vote": vote}


def build(estimator: str, *, order: int, vocab: int, max_len: int = 256,
          **params) -> DisentangledTransformer:
    """A :class:`DisentangledTransformer` whose weights implement ``estimator``.

    * ``"soft_matching"``, params ``beta`` (finite), ``alpha`` (``>= 0``, default 0): equals
      ``lcjax.analysis.smoothing.soft_matching(x, order=, vocab=, beta=, alpha=)``;
    * ``"additive"``, param ``alpha`` (``> 0``): equals ``smoothing.additive`` (BOS
      pseudo-counts, hard matching at ``beta`` = :data:`BETA_HARD`).

    Row ``p >= 1`` of the model on ``[BOS, x_0, ...]`` is row ``p - 1`` of the estimator
    on ``x``.
    """
    cfg = DisentangledConfig(order=order, vocab=vocab, max_len=max_len)
    allowed = {"soft_matching": {"beta", "alpha"}, "additive": {"alpha"}}
    if estimator not in allowed:
        raise ValueError(f"build: estimator must be one of {sorted(allowed)}; got {estimator!r}")
    if set(params) - allowed[estimator] or (estimator == "additive" and "alpha" not in params) \
            or (estimator == "soft_matching" and "beta" not in params):
        raise ValueError(f"build({estimator!r}) takes {sorted(allowed[estimator])}; got "
                         f"{sorted(params)}")
    alpha = float(params.get("alpha", 0.0))
    beta = float(params.get("beta", BETA_HARD))
    if not math.isfinite(beta) or alpha < 0 or (estimator == "additive" and alpha <= 0):
        raise ValueError(f"build: need a finite beta and alpha >= 0 (> 0 for additive); got "
                         f"beta={beta}, alpha={alpha}")
    model = DisentangledTransformer(cfg, rngs=nnx.Rngs(0))
    for name, value in analytic_params(cfg, beta=beta, alpha=alpha).items():
        getattr(model, name)[...] = jnp.asarray(value)
    return model
