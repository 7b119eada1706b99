"""Training hooks of the block-diffusion model (:mod:`lcjax.nn.diffusion`): the
masked-diffusion loss :class:`MaskedDiffusionLoss` and the byte batches
:func:`diffusion_dataset` for :func:`lcjax.train.train` (the bound is in the docstring of
:mod:`lcjax.nn.diffusion`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lcjax.data import pipeline
from lcjax.data.corpus import shakespeare_split
from lcjax.nn.diffusion import MASK_ID, diffusion_logits, mask_blocks
from lcjax.train.metrics import LOSS_WEIGHT

__all__ = ["MaskedDiffusionLoss", "diffusion_dataset"]


@dataclasses.dataclass(frozen=True)
class MaskedDiffusionLoss:
    """The masked-diffusion loss as a ``loss_fn(model, batch, rng) -> (loss, metrics)``
    hook of :func:`lcjax.train.train` (module docstring); hashable, so the loop compiles
    its step once per (model, hook).

    Reads ``batch["inputs"]`` (clean tokens [B, L], L a multiple of ``block_size``).
    Metrics: ``loss_weight`` = B·L (the loss's normaliser), ``masked_nll`` = mean NLL of
    the masked tokens (weighted by their count), ``mask_fraction``.
    """

    block_size: int
    t_min: float = 1e-3
    mask_id: int = MASK_ID

    def __post_init__(self):
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"MaskedDiffusionLoss: `block_size` must be a positive int, "
                             f"got {self.block_size!r}")
        if not 0 < self.t_min < 1:
            raise ValueError(f"MaskedDiffusionLoss: `t_min` must be in (0, 1), got {self.t_min}")

    def __call__(self, model, batch, rng):
        x0 = batch["inputs"]
        x_t, masked, t = mask_blocks(x0, rng, self.block_size, t_min=self.t_min,
                                     mask_id=self.mask_id)
        logits = diffusion_logits(model, x_t, x0, self.block_size)
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, x0[..., None], axis=-1)[..., 0]
        m = masked.astype(jnp.float32)
        total = jnp.float32(x0.size)
        loss = jnp.sum(m * nll / t) / total
        count = jnp.sum(m)
        return loss, {LOSS_WEIGHT: total,
                      "masked_nll": (jnp.sum(m * nll) / jnp.maximum(count, 1.0), count),
                      "mask_fraction": count / total}


def diffusion_dataset(seq_len: int, batch_size: int, *, docs=None, seed: int = 0,
                      num_epochs: int | None = None):
    """Batches ``{"inputs", "targets"}`` int32 [batch_size, seq_len] of packed bytes (the
    Shakespeare training works by default, ``lcjax.data.corpus``) as a ``grain.MapDataset``
    for ``train(dataset=...)``; :class:`MaskedDiffusionLoss` reads ``inputs``."""
    if docs is None:
        docs = shakespeare_split()[0]
    return pipeline.make_dataset(docs, seq_len=seq_len, batch_size=batch_size, seed=seed,
                                 num_epochs=num_epochs)
