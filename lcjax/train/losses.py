"""Loss hooks for task training: next-token NLL that weighs the answer bytes.

A retrieval or extraction sample (``lcjax.data.ruler.make_batch``, the rows of
``lcjax.data.sources.TaskSource``) is a long prompt followed by a short answer; the batch's
bool ``loss_mask`` marks the targets that are answer bytes. Plain NLL over every target is
dominated by the prompt (a 256-byte row with a 4-byte answer spends 98% of its loss on the
haystack), so a small model learns the haystack's statistics long before it learns to
retrieve. :func:`answer_weighted_nll` keeps the other targets in the loss at a small weight
``ε`` (``other_weight``): for targets ``y_{b,t}`` with log-probabilities ``log p`` ::

    w_{b,t} = 1      if loss_mask[b, t]                      (an answer byte)
            = ε      if not loss_mask[b, t] and y_{b,t} != PAD
            = 0      if y_{b,t} == PAD
    loss    = Σ_{b,t} w_{b,t} · (−log p(y_{b,t})) / Σ_{b,t} w_{b,t}

with ``Σ w`` reported as ``loss_weight`` (the train loop combines micro-batches and eval
batches by it) and the NLL of the answer bytes alone as ``answer_nll``. ``ε = 0`` trains on
the answers only; ``ε = 1`` is the plain NLL of :func:`lcjax.train.metrics.nll_loss`.

    from lcjax.train import answer_weighted_loss, train
    train(model_cfg, cfg, dataset=ds, loss_fn=answer_weighted_loss(0.1))
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from lcjax.data.tokenizer import PAD
from lcjax.train.metrics import LOSS_WEIGHT, model_logits, target_weights, weighted_nll

__all__ = ["DEFAULT_OTHER_WEIGHT", "answer_weighted_loss", "answer_weighted_nll", "context_lm_loss",
           "answer_weights"]

DEFAULT_OTHER_WEIGHT = 0.1


def _check_other_weight(other_weight) -> float:
    try:
        w = float(other_weight)
    except (TypeError, ValueError):
        raise ValueError(f"answer_weighted_nll: `other_weight` must be a number in [0, 1], "
                         f"got {other_weight!r}") from None
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"answer_weighted_nll: `other_weight` must lie in [0, 1], got {w}")
    return w


def answer_weights(batch: Mapping[str, Any], other_weight: float = DEFAULT_OTHER_WEIGHT
                   ) -> jax.Array:
    """float32 ``[B, T]`` target weights: 1 on answer bytes (``loss_mask``), ``other_weight``
    on the other real targets, 0 on PAD targets."""
    w = _check_other_weight(other_weight)
    if "loss_mask" not in batch:
        raise ValueError("answer_weighted_nll: the batch has no `loss_mask` (bool [B, T], True "
                         "on answer targets); keys: " + ", ".join(sorted(batch)))
    targets, mask = batch["targets"], batch["loss_mask"]
    if tuple(mask.shape) != tuple(targets.shape):
        raise ValueError(f"answer_weighted_nll: `loss_mask` has shape {tuple(mask.shape)}, "
                         f"`targets` {tuple(targets.shape)}")
    real = targets != PAD
    return jnp.where(mask & real, 1.0, jnp.where(real, w, 0.0)).astype(jnp.float32)


def answer_weighted_nll(model: Any, batch: Mapping[str, Any], rng: jax.Array | None = None,
                        *, other_weight: float = DEFAULT_OTHER_WEIGHT):
    """The loss hook: answer-weighted mean next-token NLL (module docstring).

    Args:
      model: maps ``inputs`` (``[B, T]``, plus ``positions``/``segment_ids`` when the batch
        has them) to logits ``[B, T, V]``.
      batch: ``inputs``, ``targets`` (int ``[B, T]``, PAD = no target) and ``loss_mask``
        (bool ``[B, T]``, True on answer targets).
      rng: unused.
      other_weight: ``ε``, the weight of the non-answer real targets, in [0, 1].

    Returns:
      ``(loss, {"loss_weight": Σ w, "answer_nll": (mean NLL of answer bytes, their count)})``.
    """
    del rng
    weights = answer_weights(batch, other_weight)
    logits = model_logits(model, batch)
    loss, total = weighted_nll(logits, batch["targets"], weights)
    on_answer = (batch["loss_mask"] & (batch["targets"] != PAD)).astype(jnp.float32)
    answer = weighted_nll(logits, batch["targets"], on_answer)
    return loss, {LOSS_WEIGHT: total, "answer_nll": answer}


def answer_weighted_loss(other_weight: float = DEFAULT_OTHER_WEIGHT):
    """:func:`answer_weighted_nll` with ``other_weight`` fixed: a ``loss_fn`` for
    ``lcjax.train.train`` (the value is checked now, not at the first step)."""
    _check_other_weight(other_weight)
    return functools.partial(answer_weighted_nll, other_weight=other_weight)


def context_lm_loss(model: Any, batch, rng: jax.Array | None = None):
    """The loss hook of ContextLM: ``CE + λ · L_ctx`` (module docstring), for
    ``lcjax.train.train(..., loss_fn=context_lm_loss)``.

    CE is the weighted mean next-token NLL of :func:`lcjax.train.metrics.nll_loss` (PAD
    targets, ``loss_mask``, ``weights``); λ and the kind of ℓ come from
    ``model.config.context_lm``. A model without ContextLM (``context_lm=None``, or not a
    ``DecoderLM``) gets CE alone, exactly ``nll_loss``; so does λ = 0.

    Returns:
      ``(loss, {"loss_weight": Σ w, "nll": (CE, Σ w), "context_loss": (L_ctx, pairs)})``.
    """
    del rng
    cl = getattr(getattr(model, "config", None), "context_lm", None)
    weights = target_weights(batch)
    if cl is None:
        nll, total = weighted_nll(model_logits(model, batch), batch["targets"], weights)
        return nll, {LOSS_WEIGHT: total}
    kw = {k: batch[k] for k in ("positions", "segment_ids") if k in batch}
    logits, aux = model(batch["inputs"], return_aux=True, **kw)
    nll, total = weighted_nll(logits, batch["targets"], weights)
    ctx, pairs = aux["context_loss"]
    loss = nll if float(cl.weight) == 0 else nll + float(cl.weight) * ctx
    return loss, {LOSS_WEIGHT: total, "nll": (nll, total), "context_loss": (ctx, pairs)}
