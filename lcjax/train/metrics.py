"""Losses and metrics: next-token NLL with PAD masking, bits per byte, JSONL logs.

Bits per byte of a byte-level model is the mean next-token loss in nats over the
real (non-PAD) targets divided by ``ln 2``: one token is one byte, so no
token-to-byte ratio is needed. BOS/EOS targets (two per document) are counted.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable

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
    """All records of a JSONL file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
