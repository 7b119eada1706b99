"""Retrieval-head score: which heads attend to the needle at the answer position.

The head-level check of the LPS paper (ICML 2026; the public notebooks of
OpenDFM/long-context-heads, read for the method): run needle prompts through the model,
take each (layer, head)'s attention row at the answer position (the last prompt token, the
one that predicts the answer's first token); the head succeeds on a prompt if the position
of the needle's first answer token is among its ``top_k`` (10) most attended positions.
The success rate per head is correlated (Pearson, Spearman) with the static scores of
:mod:`lcjax.analysis.lps`.

    success = retrieval_success(model, prompts, answer_positions)        # [L, H] in [0, 1]
    stats = correlate(success, model_lps(model))   # {"lps": {"pearson", "spearman"}, ...}
    scatter_plot(success, model_lps(model), "scatter.png")
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from lcjax.nn import capture_attention
from lcjax.optional import require

__all__ = ["answer_position", "retrieval_success", "correlate", "spearman", "pearson",
           "scatter_plot"]


def answer_position(tokens: Sequence[int], answer: Sequence[int], *, before: int | None = None
                    ) -> int:
    """Position of the first token of the first occurrence of ``answer`` in ``tokens``
    (searching ``tokens[:before]``); ``ValueError`` if it does not occur."""
    tokens = list(np.asarray(tokens).tolist())[:before]
    answer = list(np.asarray(answer).tolist())
    if not answer:
        raise ValueError("answer_position: `answer` is empty")
    for i in range(len(tokens) - len(answer) + 1):
        if tokens[i:i + len(answer)] == answer:
            return i
    raise ValueError(f"answer_position: the answer tokens {answer[:8]} do not occur in the "
                     f"{len(tokens)} prompt tokens")


def retrieval_success(model, prompts: Sequence[Sequence[int]], answer_positions: Sequence[int],
                      *, top_k: int = 10, query_position: int = -1) -> np.ndarray:
    """Per-head success rates [L, H]: the fraction of prompts whose answer position is in
    the head's ``top_k`` attended key positions at query ``query_position`` (default the
    last prompt token). ``model``: a :class:`lcjax.nn.DecoderLM` whose variant has dense
    weights (softmax, blockwise, entmax, ...); prompts are run one at a time, int [T_i]."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    if len(prompts) != len(answer_positions) or not prompts:
        raise ValueError(f"retrieval_success: need as many answer positions as prompts (>= 1), "
                         f"got {len(prompts)} prompts and {len(answer_positions)} positions")
    if top_k < 1:
        raise ValueError(f"retrieval_success: `top_k` must be >= 1, got {top_k}")

    @nnx.jit
    def rows(m, tokens):
        _, weights = capture_attention(m, tokens)
        return jnp.stack([w[0, :, query_position, :] for w in weights])  # [L, H, T]

    hits = None
    for tokens, pos in zip(prompts, answer_positions):
        tokens = np.asarray(tokens, np.int32)
        if not 0 <= int(pos) < tokens.shape[0]:
            raise ValueError(f"retrieval_success: answer position {pos} outside the prompt "
                             f"of {tokens.shape[0]} tokens")
        att = np.asarray(jax.device_get(rows(model, jnp.asarray(tokens[None]))))
        k = min(top_k, att.shape[-1])
        top = np.argpartition(-att, k - 1, axis=-1)[..., :k]
        hit = (top == int(pos)).any(-1)
        hits = hit.astype(np.float64) if hits is None else hits + hit
    return hits / len(prompts)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties averaged."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for value in np.unique(x):
        tie = x == value
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def pearson(x, y) -> float:
    """Pearson correlation of two flat arrays (nan when either is constant)."""
    x, y = np.ravel(np.asarray(x, np.float64)), np.ravel(np.asarray(y, np.float64))
    if x.shape != y.shape or x.size < 2:
        raise ValueError(f"pearson: need two arrays of one size >= 2, got {x.shape}, {y.shape}")
    dx, dy = x - x.mean(), y - y.mean()
    den = np.sqrt((dx * dx).sum() * (dy * dy).sum())
    return float((dx * dy).sum() / den) if den > 0 else float("nan")


def spearman(x, y) -> float:
    """Spearman rank correlation (Pearson of the tie-averaged ranks)."""
    return pearson(_ranks(np.ravel(x)), _ranks(np.ravel(y)))


def correlate(success: np.ndarray, result) -> dict[str, dict[str, float]]:
    """Pearson and Spearman correlations of the success rates [L, H] with the LPS result's
    ``lps``, ``s_dist``, ``s_erank`` and ``score`` over all heads."""
    success = np.asarray(success)
    if success.shape != result.score.shape:
        raise ValueError(f"correlate: success {success.shape} and scores {result.score.shape} "
                         f"must both be [layers, heads]")
    return {name: {"pearson": pearson(getattr(result, name), success),
                   "spearman": spearman(getattr(result, name), success)}
            for name in ("lps", "s_dist", "s_erank", "score")}


def scatter_plot(success: np.ndarray, result, path: str | os.PathLike, *,
                 title: str = "retrieval-head success vs static scores") -> None:
    """Scatter PNG: success rate against lps, s_dist and s_erank (one panel each)."""
    with require("eval", "lcjax.analysis.retrieval_heads (plots)"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = correlate(success, result)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharey=True)
    for ax, name in zip(axes, ("lps", "s_dist", "s_erank")):
        ax.scatter(np.ravel(getattr(result, name)), np.ravel(success), s=10, alpha=0.6)
        ax.set_xlabel(name)
        ax.set_title(f"Pearson {stats[name]['pearson']:.2f}, "
                     f"Spearman {stats[name]['spearman']:.2f}", fontsize=9)
    axes[0].set_ylabel("success rate (answer in top-k)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
