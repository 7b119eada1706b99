"""AutoSelect (ICML 2026): choosing in-context demonstrations as a sequential decision.

A policy ``π`` picks the next demonstration given the query and the demonstrations chosen so
far, until ``k`` are chosen: ``π(σ | x) = Π_i π(σ_i | x, σ_{<i})``. Its target is the optimum
of the KL-regularised objective ``max_π E_π[R(σ)] − β KL(π ‖ p_ref)`` ::

    q(σ) ∝ p_ref(σ) · exp(R(σ) / β)

with ``R(σ)`` the LM's log-likelihood of the correct answer given the demonstrations in order
``σ`` (teacher forced). With ``p_ref`` Plackett–Luce (``lcjax.selection.plackett_luce``) and
an additive reward, ``q`` is Plackett–Luce too. The policy is trained with the policy-level
cross-entropy ``L(π) = −Σ_σ q(σ) log π(σ)`` (its minimiser over all distributions is ``q``;
as ``β → 0``, ``q`` concentrates on the best sequence), estimated over a candidate set
``σ_1..σ_M`` (enumerated, or sampled from a proposal ``μ``) with self-normalised weights ::

    w_m = softmax_m( log p_ref(σ_m) + R(σ_m)/β − log μ(σ_m) )

Pieces here: :class:`SelectionPolicy` (flax nnx scorer of the remaining candidates given the
query and the matrix of chosen demonstrations), :func:`policy_log_prob`,
:func:`policy_select`, :func:`kl_target_weights`, :func:`policy_cross_entropy`,
:func:`answer_log_likelihood` / :func:`demonstration_reward` (any lcjax LM,
``model(tokens) -> logits``), the baselines (:func:`random_selection`,
:func:`nearest_neighbour_selection`, :func:`best_of_k_selection`), and an in-context
classification task with a hidden rule (:func:`make_offset_episode`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lcjax.data.ruler import answer_rows
from lcjax.data.tokenizer import BOS, encode
from lcjax.selection.plackett_luce import check_selection
from lcjax.train.metrics import token_nll

__all__ = ["SelectionPolicy", "policy_log_prob", "policy_select", "kl_target_weights",
           "policy_cross_entropy", "answer_log_likelihood", "demonstration_reward",
           "random_selection", "nearest_neighbour_selection", "best_of_k_selection",
           "Episode", "make_offset_episode", "make_lookup_episode", "check_beta"]


class SelectionPolicy(nnx.Module):
    """Scores the remaining candidates given the query and the demonstrations chosen so far.

    With ``q = W_q x`` (query), ``C = W_c D`` (candidates ``D [n, F]``), ``M = W_m D`` (the
    chosen set's memory, a matrix masked to the chosen rows) and step ``i`` ::

        a     = softmax_{j chosen}(M_j · q / √h)          (attention of the query over the set)
        z     = q + Σ_j a_j M_j + E_step[i]                 (the state; a_j = 0 when none chosen)
        s_j   = u · tanh(W_z z + C_j) + C_j · z / √h        (−∞ for chosen j)

    ``__call__(query [F], candidates [n, F], chosen bool [n], step int) -> logits [n]``.
    """

    def __init__(self, feature_dim: int, hidden: int = 32, max_steps: int = 16, *,
                 rngs: nnx.Rngs):
        for name, v in (("feature_dim", feature_dim), ("hidden", hidden),
                        ("max_steps", max_steps)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"SelectionPolicy: `{name}` must be a positive int, got {v!r}")
        self.hidden, self.max_steps = hidden, max_steps
        self.query_proj = nnx.Linear(feature_dim, hidden, rngs=rngs)
        self.cand_proj = nnx.Linear(feature_dim, hidden, rngs=rngs)
        self.memory_proj = nnx.Linear(feature_dim, hidden, rngs=rngs)
        self.step_embed = nnx.Embed(max_steps, hidden, rngs=rngs)
        self.state_proj = nnx.Linear(hidden, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, 1, rngs=rngs)

    def __call__(self, query: jax.Array, candidates: jax.Array, chosen: jax.Array,
                 step) -> jax.Array:
        scale = 1.0 / np.sqrt(self.hidden)
        q = self.query_proj(query)                                   # [h]
        c = self.cand_proj(candidates)                               # [n, h]
        m = self.memory_proj(candidates)                             # [n, h]
        att = jnp.where(chosen, m @ q * scale, -jnp.inf)
        w = jnp.where(chosen, jax.nn.softmax(jnp.where(chosen.any(), att, 0.0)), 0.0)
        z = q + w @ m + self.step_embed(jnp.asarray(step, jnp.int32))
        logits = self.out(jnp.tanh(self.state_proj(z)[None, :] + c))[:, 0] + c @ z * scale
        return jnp.where(chosen, -jnp.inf, logits)


def _check_inputs(query, candidates, k: int) -> None:
    if candidates.ndim != 2 or query.ndim != 1 or query.shape[0] != candidates.shape[1]:
        raise ValueError(f"need query [F] and candidates [n, F], got {query.shape} and "
                         f"{candidates.shape}")
    check_selection(candidates.shape[0], k)


def policy_log_prob(policy: SelectionPolicy, query: jax.Array, candidates: jax.Array,
                    order: jax.Array) -> jax.Array:
    """``log π(σ | x) = Σ_i log softmax(policy(x, D, chosen_{<i}, i))[σ_i]``.

    Args: query ``[F]``, candidates ``[n, F]``, order int ``[k]`` (distinct).
    Returns: float scalar. Batch over orders with ``nnx.vmap`` or a loop.
    """
    k = order.shape[0]
    _check_inputs(query, candidates, k)
    if k > policy.max_steps:
        raise ValueError(f"k={k} exceeds the policy's max_steps={policy.max_steps}")
    chosen = jnp.zeros(candidates.shape[0], bool)
    total = jnp.zeros((), jnp.float32)
    for i in range(k):
        logp = jax.nn.log_softmax(policy(query, candidates, chosen, i))
        total = total + logp[order[i]]
        chosen = chosen.at[order[i]].set(True)
    return total


def policy_select(policy: SelectionPolicy, query: jax.Array, candidates: jax.Array, k: int,
                  key: jax.Array | None = None) -> jax.Array:
    """Sequential selection of ``k`` demonstrations: greedy (``key=None``: argmax of each
    step's logits) or sampled (Gumbel-argmax per step, an exact sample of ``π``); chosen
    candidates are masked out. Returns int32 ``[k]``."""
    _check_inputs(query, candidates, k)
    chosen = jnp.zeros(candidates.shape[0], bool)
    picks = []
    for i in range(k):
        logits = policy(query, candidates, chosen, i)
        if key is not None:
            logits = logits + jax.random.gumbel(jax.random.fold_in(key, i), logits.shape)
        j = jnp.argmax(logits).astype(jnp.int32)
        picks.append(j)
        chosen = chosen.at[j].set(True)
    return jnp.stack(picks)


def check_beta(beta) -> float:
    """``beta`` as a float; ValueError unless it is finite and > 0."""
    try:
        b = float(beta)
    except (TypeError, ValueError):
        raise ValueError(f"beta must be a positive number, got {beta!r}") from None
    if not np.isfinite(b) or b <= 0:
        raise ValueError(f"beta must be finite and > 0, got {beta!r}")
    return b


def kl_target_weights(rewards: jax.Array, beta, *, log_ref: jax.Array | None = None,
                      log_proposal: jax.Array | None = None) -> jax.Array:
    """Self-normalised weights of ``q(σ) ∝ p_ref(σ) exp(R(σ)/β)`` over a candidate set.

    Args:
      rewards: float ``[M]``, ``R(σ_m)``.
      beta: the KL temperature (> 0); small β puts the weight on the best sequence.
      log_ref: ``log p_ref(σ_m)`` ``[M]``; None = uniform reference.
      log_proposal: ``log μ(σ_m)`` when the set was sampled from ``μ`` (importance
        correction); None for an enumerated set (or one sampled from ``p_ref`` with
        ``log_ref=None``).

    Returns:
      float ``[M]``, ``softmax(log_ref + R/β − log_proposal)``, summing to 1.
    """
    b = check_beta(beta)
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be [M], got shape {rewards.shape}")
    logits = rewards / b
    for extra, name in ((log_ref, "log_ref"), (log_proposal, "log_proposal")):
        if extra is not None:
            extra = jnp.asarray(extra, jnp.float32)
            if extra.shape != rewards.shape:
                raise ValueError(f"{name} must have shape {rewards.shape}, got {extra.shape}")
            logits = logits + extra if name == "log_ref" else logits - extra
    return jax.nn.softmax(logits)


def policy_cross_entropy(policy: SelectionPolicy, query: jax.Array, candidates: jax.Array,
                         orders: jax.Array, weights: jax.Array) -> jax.Array:
    """The policy-level cross-entropy ``−Σ_m w_m log π(σ_m | x)``.

    Args: query ``[F]``, candidates ``[n, F]``, orders int ``[M, k]``, weights ``[M]``
    (from :func:`kl_target_weights`; treated as constants). Returns a float scalar.
    """
    if orders.ndim != 2 or weights.shape != orders.shape[:1]:
        raise ValueError(f"need orders [M, k] and weights [M], got {orders.shape} and "
                         f"{weights.shape}")
    logps = nnx.vmap(policy_log_prob, in_axes=(None, None, None, 0))(
        policy, query, candidates, orders)
    return -jnp.sum(jax.lax.stop_gradient(weights) * logps)


# ---------------------------------------------------------------- reward: the LM's likelihood

@nnx.jit
def _masked_loglik(model, inputs, targets, mask):
    nll, _ = token_nll(model(inputs), targets)
    return -jnp.sum(jnp.where(mask, nll, 0.0), axis=-1)


def answer_log_likelihood(model: Callable, prompts: Sequence[np.ndarray],
                          answers: Sequence[np.ndarray]) -> jax.Array:
    """``log p_LM(answer | prompt) = Σ_t log softmax(model(row))[t, answer_t]`` per row,
    teacher forced in one batched forward pass (rows of
    :func:`lcjax.data.ruler.answer_rows`: right-padded with PAD; the LM is causal).

    Args:
      model: an lcjax LM (nnx module, ``model(tokens [B, T]) -> logits [B, T, V]``).
      prompts, answers: M int token arrays each.

    Returns:
      float32 ``[M]``.
    """
    if any(len(a) == 0 for a in answers):
        raise ValueError("answer_log_likelihood: every answer needs at least one token")
    rows = answer_rows(prompts, answers)
    return _masked_loglik(model, *(jnp.asarray(rows[k])
                                   for k in ("inputs", "targets", "loss_mask")))


def demonstration_reward(model: Callable, demonstrations: Sequence[str], query: str,
                         answer: str, *, bos: bool = True
                         ) -> Callable[[np.ndarray], jax.Array]:
    """``R(σ) = log p_LM(answer | [BOS] demo_{σ_1} … demo_{σ_k} query)`` as a callable of
    int orders ``[M, k]`` (or ``[k]``) returning float32 ``[M]`` (or a scalar).

    Demonstrations, query and answer are text, byte-tokenised (``lcjax.data.tokenizer``) and
    concatenated as given (include separators such as newlines in the strings).
    """
    demos = [encode(d) for d in demonstrations]
    head = np.array([BOS], np.int32) if bos else np.zeros(0, np.int32)
    q, a = encode(query), encode(answer)

    def reward(orders) -> jax.Array:
        orders = np.asarray(orders)
        single = orders.ndim == 1
        orders = orders.reshape(1, -1) if single else orders
        check_selection(len(demos), orders.shape[1])
        prompts = [np.concatenate([head, *(demos[j] for j in o), q]) for o in orders]
        out = answer_log_likelihood(model, prompts, [a] * len(prompts))
        return out[0] if single else out

    return reward


# ---------------------------------------------------------------------------------- baselines

def random_selection(key: jax.Array, n: int, k: int) -> jax.Array:
    """``k`` distinct items of ``range(n)`` in uniformly random order: int32 ``[k]``."""
    check_selection(n, k)
    return jax.random.permutation(key, n)[:k].astype(jnp.int32)


def nearest_neighbour_selection(query: jax.Array, candidates: jax.Array, k: int) -> jax.Array:
    """The ``k`` candidates most cosine-similar to the query, the most similar LAST (nearest
    the query in the prompt): int32 ``[k]``."""
    query, candidates = jnp.asarray(query), jnp.asarray(candidates)
    _check_inputs(query, candidates, k)
    unit = lambda v: v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
    sims = unit(candidates) @ unit(query)
    return jax.lax.top_k(sims, k)[1][::-1].astype(jnp.int32)


def best_of_k_selection(reward: Callable[[np.ndarray], jax.Array], key: jax.Array, n: int,
                        k: int, num_tries: int) -> tuple[np.ndarray, float]:
    """Best of ``num_tries`` uniformly random orders by ``reward`` (orders ``[M, k]`` ->
    ``[M]``): ``(order int [k], its reward)``."""
    check_selection(n, k)
    if not isinstance(num_tries, int) or num_tries < 1:
        raise ValueError(f"num_tries must be a positive int, got {num_tries!r}")
    keys = jax.random.split(key, num_tries)
    orders = np.asarray(jax.vmap(lambda kk: random_selection(kk, n, k))(keys))
    values = np.asarray(reward(orders))
    best = int(np.argmax(values))
    return orders[best], float(values[best])


# ----------------------------------------------------------------------- task: hidden-rule ICL

@dataclasses.dataclass(frozen=True)
class Episode:
    """One selection problem: candidate demonstrations (text and features ``[n, F]``), the
    query (text, features ``[F]``), the answer text, and which candidates follow the rule."""

    demonstrations: tuple[str, ...]
    features: np.ndarray
    query: str
    query_features: np.ndarray
    answer: str
    consistent: np.ndarray


def _digit_features(x: int, y: int | None) -> np.ndarray:
    f = np.zeros(30, np.float32)
    f[x] = 1.0
    if y is not None:
        f[10 + y] = 1.0
        f[20 + (y - x) % 10] = 1.0
    return f


def make_offset_episode(rng: np.random.Generator, num_candidates: int, *,
                        distractor_fraction: float = 0.5) -> Episode:
    """In-context classification with a hidden rule ``y = (x + c) mod 10`` (``c`` drawn per
    episode), byte format ``"x:3 y:7\\n"``; a ``distractor_fraction`` of the candidates follow
    another offset, so choosing (and placing) the right demonstrations matters. Features:
    one-hot x ⊕ one-hot y ⊕ one-hot (y − x mod 10); the query's y-parts are zero."""
    if not isinstance(num_candidates, int) or num_candidates < 2:
        raise ValueError(f"num_candidates must be an int >= 2, got {num_candidates!r}")
    if not 0.0 <= distractor_fraction < 1.0:
        raise ValueError(f"distractor_fraction must lie in [0, 1), got {distractor_fraction}")
    c = int(rng.integers(10))
    wrong = (c + 1 + rng.integers(9, size=num_candidates)) % 10
    consistent = rng.random(num_candidates) >= distractor_fraction
    consistent[rng.integers(num_candidates)] = True
    xs = rng.integers(10, size=num_candidates)
    ys = np.where(consistent, (xs + c) % 10, (xs + wrong) % 10)
    xq = int(rng.integers(10))
    return Episode(
        demonstrations=tuple(f"x:{x} y:{y}\n" for x, y in zip(xs, ys)),
        features=np.stack([_digit_features(int(x), int(y)) for x, y in zip(xs, ys)]),
        query=f"x:{xq} y:", query_features=_digit_features(xq, None),
        answer=f"{(xq + c) % 10}\n", consistent=consistent)


def make_lookup_episode(rng: np.random.Generator, num_candidates: int, *,
                        distractor_fraction: float = 0.3, num_keys: int = 6) -> Episode:
    """In-context classification with a hidden per-episode lookup table: ``num_keys`` letters
    ``a, b, …`` each mapped to a random digit, byte format ``"x:c y:4\n"`` (an LM answers by
    finding the query's key among the demonstrations: induction). A ``distractor_fraction``
    of the candidates carry a wrong digit; the query's key has at least one consistent
    candidate. Features: one-hot key (10 slots) ⊕ one-hot digit ⊕ 10 zeros; the query's digit
    part is zero."""
    if not isinstance(num_candidates, int) or num_candidates < 2:
        raise ValueError(f"num_candidates must be an int >= 2, got {num_candidates!r}")
    if not 0.0 <= distractor_fraction < 1.0:
        raise ValueError(f"distractor_fraction must lie in [0, 1), got {distractor_fraction}")
    if not isinstance(num_keys, int) or not 1 <= num_keys <= 10:
        raise ValueError(f"num_keys must be an int in [1, 10], got {num_keys!r}")
    table = rng.integers(10, size=num_keys)
    keys = rng.integers(num_keys, size=num_candidates)
    consistent = rng.random(num_candidates) >= distractor_fraction
    anchor = int(rng.integers(num_candidates))
    consistent[anchor] = True
    ys = np.where(consistent, table[keys], (table[keys] + 1 + rng.integers(9, size=num_candidates))
                  % 10)
    xq = int(keys[anchor])
    feats = np.zeros((num_candidates, 30), np.float32)
    feats[np.arange(num_candidates), keys] = 1.0
    feats[np.arange(num_candidates), 10 + ys] = 1.0
    query_features = np.zeros(30, np.float32)
    query_features[xq] = 1.0
    letter = lambda i: chr(ord("a") + int(i))
    return Episode(
        demonstrations=tuple(f"x:{letter(x)} y:{y}\n" for x, y in zip(keys, ys)),
        features=feats, query=f"x:{letter(xq)} y:", query_features=query_features,
        answer=f"{table[xq]}\n", consistent=consistent)
