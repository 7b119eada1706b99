"""Losses and metrics: next-token NLL with PAD masking, the default loss hook, bits per
byte, JSONL logs.

A loss hook is ``loss_fn(model, batch, rng) -> (loss, metrics)``; :func:`nll_loss` is the
default. ``metrics["loss_weight"]`` (optional) is what the loss is a mean over: the train
loop weights micro-batches (``grad_accum``) and eval batches by it, so a weighted mean
normalised per micro-batch combines into the weighted mean of the whole batch.

Bits per byte of a byte-level model is the mean next-token loss in nats over the
real (non-PAD) targets divided by ``ln 2``: one token is one byte, so no
token-to-byte ratio is needed. BOS/EOS targets (two per document) are counted.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from lcjax.data.tokenizer import PAD


def token_nll(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-token negative log-likelihood in nats and the real-token mask.

    Args:
      logits: ``[B, T, V]`` (any float dtype; computed in float32).
      targets: int ``[B, T]``; PAD marks positions without a target.

    Returns:
      ``(nll, mask)``: float32 ``[B, T]`` (zero where masked) and bool ``[B, T]``.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    mask = targets != PAD
    safe = jnp.where(mask, targets, 0)
    nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    return jnp.where(mask, nll, 0.0), mask


def mean_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean NLL (nats) over real targets; logits ``[B, T, V]``, targets ``[B, T]``."""
    nll, mask = token_nll(logits, targets)
    return nll.sum() / jnp.maximum(mask.sum(), 1)


LOSS_WEIGHT = "loss_weight"  # the metric a loss hook reports its normaliser under


def target_weights(batch: Mapping[str, Any]) -> jax.Array:
    """float32 ``[B, T]`` weight of each target of a batch dict.

    ``(targets != PAD) * loss_mask * weights``, each optional factor counting as 1 when the
    batch does not carry it: PAD targets never count, ``loss_mask`` (bool) selects and
    ``weights`` (float) weighs.
    """
    w = (batch["targets"] != PAD).astype(jnp.float32)
    if "loss_mask" in batch:
        w = w * batch["loss_mask"].astype(jnp.float32)
    if "weights" in batch:
        w = w * batch["weights"].astype(jnp.float32)
    return w


def model_logits(model: Any, batch: Mapping[str, Any]) -> jax.Array:
    """``model(inputs, positions=..., segment_ids=...)``, passing only the keys the batch has.

    A model that takes tokens alone works with batches that carry neither key.
    """
    kw = {k: batch[k] for k in ("positions", "segment_ids") if k in batch}
    return model(batch["inputs"], **kw)


def weighted_nll(
    logits: jax.Array, targets: jax.Array, weights: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``(sum(w * nll) / sum(w), sum(w))``: the weighted mean NLL (nats) and its normaliser.

    Returns 0 for a batch with no weight.
    """
    nll, _ = token_nll(logits, targets)
    total = weights.sum()
    return (nll * weights).sum() / jnp.where(total > 0, total, 1.0), total


def nll_loss(model: Any, batch: Mapping[str, Any], rng: jax.Array | None = None):
    """The default loss (and eval) hook: weighted mean next-token NLL.

    Args:
      model: maps ``inputs`` (and ``positions``/``segment_ids`` when the batch has them)
        to logits ``[B, T, V]``.
      batch: the batch dict (see :func:`target_weights` for the weights).
      rng: unused.

    Returns:
      ``(loss, {"loss_weight": total weight})``.
    """
    del rng
    loss, total = weighted_nll(model_logits(model, batch), batch["targets"],
                               target_weights(batch))
    return loss, {LOSS_WEIGHT: total}


def bits_per_byte(sum_nats: float, num_tokens: int) -> float:
    """``sum_nats / (num_tokens * ln 2)``: bits per byte of a byte-level model."""
    return float(sum_nats) / max(int(num_tokens), 1) / math.log(2)


def append_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> None:
    """Appends one JSON object per line to ``path`` (created with its folder if needed)."""
    records = list(records)
    if not records:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """All records of a JSONL file.

    A last line that does not parse (a write cut short by a crash) is dropped with a
    warning; :func:`truncate_jsonl` (run by every resume) then rewrites the file without it.

    Raises:
      ValueError: a line before the last does not parse (naming the file and line).
    """
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    records = []
    for i, (n, line) in enumerate(lines):
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            if i + 1 < len(lines):
                raise ValueError(f"{os.fspath(path)}, line {n}: not JSON ({exc})") from exc
            warnings.warn(f"{os.fspath(path)}, line {n}: ignoring a truncated last record "
                          f"({exc})", stacklevel=2)
    return records


def truncate_jsonl(path: str | os.PathLike, max_step: int) -> None:
    """Drops the records of ``path`` whose ``step`` is above ``max_step`` (no-op if absent).

    A resumed run calls it with the restored step, so steps logged after the checkpoint by
    the interrupted run are not logged twice. The file is replaced atomically.
    """
    if not os.path.exists(path):
        return
    kept = [r for r in read_jsonl(path) if r.get("step", 0) <= max_step]
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, path)
