"""RoPE-perturbed self-distillation: one model, two views of a sequence that differ only in
their position ids.

Paper: "RoPE-perturbed self-distillation" for long-context robustness (no public code when
this was written; the parts marked *(inferred)* are our choices). A batch row is run twice
through the same model: with its original position ids (the teacher view) and with
perturbed ones (the student view) — token order, causal mask and segment ids unchanged.
With z^T, z^S the logits [B, T, V] of the two views, τ the temperature and
p = softmax(z / τ)::

    KL_t = Σ_v p^T_{t,v} (log p^T_{t,v} − log p^S_{t,v}),     p^T from stopgrad(z^T)
    loss = CE(z^T) + λ · τ² · Σ_t w_t KL_t / Σ_t w_t

CE is the weighted next-token NLL of the teacher view (``lcjax.train.metrics.nll_loss``'s
weights), so the teacher view is trained by CE only and no gradient of the KL term reaches
it. Options: ``symmetric`` (KL_t = ½ [KL(p^T ‖ p^S) + KL(p^S ‖ p^T)], the teacher still
stop-gradient), ``train_both`` (CE of both views, averaged: ½ [CE(z^T) + CE(z^S)]),
``kl_on`` (which positions count: "targets" = the CE weights w, "all" = every non-padding
position), ``temperature`` τ (the τ² factor keeps the gradient scale of Hinton et al.'s
distillation; ``metrics["kl"]`` is the KL at τ, without τ²).

Since RoPE scores depend on i − j only, a uniform shift of all position ids gives the same
logits (up to float rounding: KL ≈ 0); moving segments of ids changes the relative
distances between segments, which is what the student learns to be robust to.

Perturbations (:func:`perturb_positions`; each row draws its own, ``positions`` [B, T]):

- ``"shift"``: n + s_b, s_b uniform in [0, ``max_shift``] (or ``shift=`` fixed);
- ``"segment_swap"``: cut [0, T) into ``num_segments`` contiguous segments (random cuts,
  each at least ``min_len`` long), permute them at random (never the identity), and give
  segment i the ids it would have in the permuted layout (ids inside a segment stay
  consecutive; the first segment stays in place with ``keep_first=True``, e.g. for a
  system prompt; it then needs ``num_segments >= 3``);
- ``"gaps"``: after each token, with probability ``rate``, a gap of 1 .. ``max_gap`` unused
  ids (monotone ids with holes: the sequence looks longer);
- ``"random"``: T sorted distinct ids drawn uniformly from [0, ``max_position``)
  (``max_position`` default 2T; randomized positions of Ruoss et al., 2023);
- a callable ``(positions [B, T], rng) -> positions``.

*(inferred)*: the kinds and their option ranges; KL direction KL(teacher ‖ student); the
τ² factor; perturbing per row over the whole row (a packed row's documents are moved
together, their ids offset from the row's layout, relative ids inside a document kept
for "shift").

    from lcjax.train import distill_loss_fn, train
    train(model_cfg, cfg, dataset=ds, loss_fn=distill_loss_fn("segment_swap", weight=0.5))
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from lcjax.train.metrics import LOSS_WEIGHT, model_logits, target_weights, weighted_nll

__all__ = ["KINDS", "KL_ON", "distill_loss", "distill_loss_fn", "kl_divergence",
           "perturb_positions"]

# kind -> its options and their defaults (None: derived from T)
KINDS: dict[str, dict[str, Any]] = {
    "shift": {"max_shift": 1024, "shift": None},
    "segment_swap": {"num_segments": 2, "min_len": 1, "keep_first": False},
    "gaps": {"rate": 0.1, "max_gap": 16},
    "random": {"max_position": None},
}
KL_ON = ("targets", "all")


def _check_options(kind: str, options: Mapping[str, Any], t: int) -> dict[str, Any]:
    allowed = KINDS[kind]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"perturb_positions: kind={kind!r} takes the options "
                         f"{sorted(allowed)}, got {unknown}")
    o = {**allowed, **options}

    def int_at_least(name, lo):
        v = o[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"perturb_positions: `{name}` must be an int >= {lo}, got {v!r}")

    if kind == "shift":
        int_at_least("max_shift", 0)
        if o["shift"] is not None:
            int_at_least("shift", 0)
    elif kind == "segment_swap":
        int_at_least("num_segments", 2)
        int_at_least("min_len", 1)
        if o["keep_first"] and o["num_segments"] < 3:
            raise ValueError(f"perturb_positions: keep_first=True needs num_segments >= 3 "
                             f"(two segments to permute), got {o['num_segments']}")
        if o["num_segments"] * o["min_len"] > t:
            raise ValueError(f"perturb_positions: {o['num_segments']} segments of at least "
                             f"{o['min_len']} tokens do not fit in T={t}")
    elif kind == "gaps":
        if not 0.0 <= float(o["rate"]) <= 1.0:
            raise ValueError(f"perturb_positions: `rate` must lie in [0, 1], got {o['rate']!r}")
        int_at_least("max_gap", 1)
    elif kind == "random":
        o["max_position"] = 2 * t if o["max_position"] is None else o["max_position"]
        int_at_least("max_position", t)
    return o


def _segment_swap(pos, rng, *, num_segments, min_len, keep_first):
    """One row: pos [T] -> the ids of a random permutation of its segments."""
    t = pos.shape[0]
    n = num_segments
    # cuts 0 < b_1 < ... < b_{n-1} < T with gaps >= min_len: sorted draws from the slack
    k_cut, k_perm = jax.random.split(rng)
    slack = t - n * min_len
    extra = jnp.sort(jax.random.randint(k_cut, (n - 1,), 0, slack + 1))
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32),
                              (extra + min_len * jnp.arange(1, n)).astype(jnp.int32)])
    lengths = jnp.diff(jnp.concatenate([starts, jnp.full((1,), t, jnp.int32)]))
    first = 1 if keep_first else 0
    free = jax.random.permutation(k_perm, n - first).astype(jnp.int32)
    # never the identity: it would be no perturbation; then rotate the free segments by one
    free = jnp.where(jnp.all(free == jnp.arange(n - first)), jnp.roll(free, 1), free)
    order = jnp.concatenate([jnp.zeros((first,), jnp.int32), first + free])
    # new start of segment order[r] = Σ lengths of order[:r]
    new_start_in_order = jnp.cumsum(lengths[order]) - lengths[order]
    new_start = jnp.zeros((n,), jnp.int32).at[order].set(new_start_in_order.astype(jnp.int32))
    seg = jnp.searchsorted(starts, jnp.arange(t), side="right") - 1
    offset = new_start[seg] - starts[seg]
    return pos + offset


def perturb_positions(positions: jax.Array, rng: jax.Array, *,
                      kind: str | Callable = "segment_swap", **options) -> jax.Array:
    """Perturbed position ids (module docstring): int [T] or [B, T] -> the same shape
    (int32). Each row draws its perturbation from ``fold_in(rng, row)``.

    Raises:
      ValueError: an unknown kind or option, options out of range (naming them), or
        positions that are not an int [T] / [B, T] array.
    """
    positions = jnp.asarray(positions)
    if positions.ndim not in (1, 2) or not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"perturb_positions: `positions` must be int [T] or [B, T], got "
                         f"{positions.dtype} {positions.shape}")
    if callable(kind):
        if options:
            raise ValueError(f"perturb_positions: a callable kind takes no options, got "
                             f"{sorted(options)}")
        out = jnp.asarray(kind(positions, rng))
        if out.shape != positions.shape:
            raise ValueError(f"perturb_positions: the callable returned shape {out.shape}, "
                             f"expected {positions.shape}")
        return out.astype(jnp.int32)
    if kind not in KINDS:
        raise ValueError(f"perturb_positions: `kind` must be one of {sorted(KINDS)} or a "
                         f"callable, got {kind!r}")
    single = positions.ndim == 1
    pos = (positions[None] if single else positions).astype(jnp.int32)
    b, t = pos.shape
    o = _check_options(kind, options, t)
    keys = jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(b))
    if kind == "shift":
        if o["shift"] is not None:
            out = pos + o["shift"]
        else:
            s = jax.vmap(lambda k: jax.random.randint(k, (), 0, o["max_shift"] + 1))(keys)
            out = pos + s[:, None].astype(jnp.int32)
    elif kind == "segment_swap":
        out = jax.vmap(functools.partial(
            _segment_swap, num_segments=o["num_segments"], min_len=o["min_len"],
            keep_first=bool(o["keep_first"])))(pos, keys)
    elif kind == "gaps":
        def row(p, k):
            k1, k2 = jax.random.split(k)
            gap = jnp.where(jax.random.bernoulli(k1, float(o["rate"]), (t,)),
                            jax.random.randint(k2, (t,), 1, o["max_gap"] + 1), 0)
            return p + (jnp.cumsum(gap) - gap).astype(jnp.int32)  # gaps after each token
        out = jax.vmap(row)(pos, keys)
    else:  # random
        def row(p, k):
            del p
            ids = jnp.sort(jax.random.choice(k, o["max_position"], (t,), replace=False))
            return ids.astype(jnp.int32)
        out = jax.vmap(row)(pos, keys)
    return out[0] if single else out


def kl_divergence(teacher_logits: jax.Array, student_logits: jax.Array, *,
                  temperature: float = 1.0, symmetric: bool = False) -> jax.Array:
    """Per-position KL_t (module docstring) of logits [..., V] -> float32 [...]; the teacher
    is taken as given (the caller stops its gradient)."""
    lt = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
    ls = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    forward = jnp.sum(jnp.exp(lt) * (lt - ls), axis=-1)
    if not symmetric:
        return forward
    return 0.5 * (forward + jnp.sum(jnp.exp(ls) * (ls - lt), axis=-1))


def _check_distill(weight, temperature, kl_on) -> tuple[float, float]:
    try:
        w, tau = float(weight), float(temperature)
    except (TypeError, ValueError):
        raise ValueError(f"distill_loss: `weight` and `temperature` must be numbers, got "
                         f"{weight!r} and {temperature!r}") from None
    if not w >= 0:
        raise ValueError(f"distill_loss: `weight` must be >= 0, got {weight!r}")
    if not tau > 0:
        raise ValueError(f"distill_loss: `temperature` must be > 0, got {temperature!r}")
    if kl_on not in KL_ON:
        raise ValueError(f"distill_loss: `kl_on` must be one of {KL_ON}, got {kl_on!r}")
    return w, tau


def distill_loss(model: Any, batch: Mapping[str, Any], rng: jax.Array, *,
                 perturbation: str | Callable = "segment_swap", weight: float = 1.0,
                 perturbation_options: Mapping[str, Any] | None = None,
                 symmetric: bool = False, train_both: bool = False,
                 kl_on: str = "targets", temperature: float = 1.0):
    """The loss hook of RoPE-perturbed self-distillation (module docstring).

    Args:
      model: maps ``inputs`` with ``positions=`` (and ``segment_ids=`` when the batch has
        them) to logits [B, T, V], e.g. any ``lcjax.nn.DecoderLM`` with RoPE.
      batch: the train loop's batch dict; ``positions`` default to ``arange(T)``.
      rng: the step's key (the loop's ``rng``); it draws the perturbation.
      perturbation: a :func:`perturb_positions` kind or a callable
        ``(positions, rng) -> positions``; ``perturbation_options`` its options.
      weight: λ >= 0; symmetric, train_both, kl_on, temperature: module docstring.

    Returns:
      ``(loss, {"loss_weight": Σ w, "ce": (CE of the teacher view, Σ w), "kl": (mean KL_t,
      Σ_t w_kl)})`` (with ``train_both`` also ``"ce_student"``).
    """
    lam, tau = _check_distill(weight, temperature, kl_on)
    if rng is None:
        raise ValueError("distill_loss: `rng` (a PRNG key) is required: it draws the "
                         "perturbation")
    inputs = batch["inputs"]
    b, t = inputs.shape
    positions = batch.get("positions")
    positions = (jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)) if positions is None
                 else jnp.asarray(positions))
    moved = perturb_positions(positions, rng, kind=perturbation,
                              **dict(perturbation_options or {}))
    teacher_batch = {**batch, "positions": positions}
    student_batch = {**batch, "positions": moved}
    z_t = model_logits(model, teacher_batch)
    z_s = model_logits(model, student_batch)
    weights = target_weights(batch)
    ce, total = weighted_nll(z_t, batch["targets"], weights)
    mets = {LOSS_WEIGHT: total, "ce": (ce, total)}
    if train_both:
        ce_s, _ = weighted_nll(z_s, batch["targets"], weights)
        mets["ce_student"] = (ce_s, total)
        ce = 0.5 * (ce + ce_s)
    if kl_on == "targets":
        w_kl = weights
    else:
        seg = batch.get("segment_ids")
        w_kl = jnp.ones((b, t), jnp.float32) if seg is None else (seg >= 0).astype(jnp.float32)
    kl_t = kl_divergence(lax.stop_gradient(z_t), z_s, temperature=tau, symmetric=symmetric)
    n = w_kl.sum()
    kl = (kl_t * w_kl).sum() / jnp.where(n > 0, n, 1.0)
    mets["kl"] = (kl, n)
    loss = ce if lam == 0 else ce + lam * tau * tau * kl
    return loss, mets


def distill_loss_fn(perturbation: str | Callable = "segment_swap", **kwargs) -> Callable:
    """:func:`distill_loss` with its options fixed: a ``loss_fn`` for
    ``lcjax.train.train`` (the options are checked now, not at the first step)."""
    _check_distill(kwargs.get("weight", 1.0), kwargs.get("temperature", 1.0),
                   kwargs.get("kl_on", "targets"))
    if not callable(perturbation):
        if perturbation not in KINDS:
            raise ValueError(f"distill_loss: `perturbation` must be one of {sorted(KINDS)} or "
                             f"a callable, got {perturbation!r}")
        unknown = sorted(set(kwargs.get("perturbation_options") or {})
                         - set(KINDS[perturbation]))
        if unknown:
            raise ValueError(f"distill_loss: perturbation {perturbation!r} takes the options "
                             f"{sorted(KINDS[perturbation])}, got {unknown}")
    return functools.partial(distill_loss, perturbation=perturbation, **kwargs)
