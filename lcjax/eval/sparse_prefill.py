"""Sparse prefill, dense decoding: :class:`SparsePrefillGenerator`, the generator
``lcjax.eval.evaluate`` runs for Token Sparse Attention as the paper's code does (its cache
keeps the full K/V), and the helpers it uses: :func:`with_layer_attention` (the same weights
with other attention per layer) and :func:`kept_fraction` (what a token-sparse layer keeps).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lcjax.attention.token_sparse import select_tokens, token_scores, token_sparse_attention
from lcjax.data import tokenizer as tok
from lcjax.nn import DecoderLM
from lcjax.nn.attention import capture_attention
from lcjax.nn.sampling import decode_from_caches, prefill

__all__ = ["SparsePrefillGenerator", "kept_fraction", "token_sparse_options",
           "with_layer_attention"]


# ----------------------------------------------------------------------------
# The same weights with other attention per layer
# ----------------------------------------------------------------------------
def with_layer_attention(model, attention, attention_options):
    """``model`` (a DecoderLM) with per-layer ``attention`` / ``attention_options`` (tuples,
    e.g. from ``lcjax.attention.token_sparse.layer_attention``), sharing its state."""
    cfg = dataclasses.replace(model.config, attention=tuple(attention),
                              attention_options=tuple(attention_options))
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: DecoderLM(cfg, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, nnx.state(model))


@functools.cache
def _selection_defaults() -> dict:
    """``token_sparse_attention``'s defaults of the options that decide the selection."""
    params = inspect.signature(token_sparse_attention).parameters
    return {k: params[k].default for k in ("coverage", "min_tokens", "window", "pool")}


def token_sparse_options(options: Mapping) -> dict:
    """The selection options of a token-sparse layer (its defaults filled in)."""
    defaults = _selection_defaults()
    return {**defaults, **{k: v for k, v in options.items() if k in defaults}}


def kept_fraction(q, k, opts: Mapping):
    """Per example: (kept fraction of (token, head) pairs, budget K) of the token-sparse
    selection of one layer on its inputs q [B, L, H, D], k [B, L, Hkv, D] (1 and L - W
    where the layer is dense)."""
    b, length = q.shape[:2]
    w, m, c = opts["window"], opts["min_tokens"], opts["coverage"]
    if length <= m + w or c == 0:
        return jnp.ones((b,), jnp.float32), jnp.full((b,), max(length - w, 0), jnp.int32)
    sel = select_tokens(token_scores(q, k, window=w, pool=opts["pool"]), coverage=c,
                        min_tokens=m, window=w)
    kept = jnp.mean(jnp.sum(sel.valid, axis=-1), axis=-1) / length
    return jnp.where(sel.dense, 1.0, kept).astype(jnp.float32), sel.budget


@functools.lru_cache(maxsize=64)
def _prefill_fn(graphdef, cache_len: int, sparse: tuple):
    """jit: (state, tokens [B, n]) -> (next-token logits at the last position [B, V],
    per-layer KVCache of ``cache_len`` slots holding the prompt's K/V, ((kept [B],
    budget [B]) per sparse layer)). The prefill is the library's
    (``lcjax.nn.sampling.prefill``: the prompt alone through the model, each layer's K/V
    into its cache), the one ``lcjax.nn.generate`` runs."""
    def run(state, tokens):
        model = nnx.merge(graphdef, state)
        b, n = tokens.shape
        logits, caches, inputs = prefill(model, tokens, jnp.full((b,), n, jnp.int32),
                                         cache_len, return_inputs=True)
        if inputs is None and sparse:  # no split-prefill layer: read the inputs for `kept`
            _, inputs = capture_attention(model, tokens, tap="inputs")
        kept = tuple(kept_fraction(inputs[i]["q"], inputs[i]["k"], dict(opts))
                     for i, opts in sparse)
        return logits[:, -1], caches, kept

    return jax.jit(run)


class SparsePrefillGenerator:
    """``generate(prompts: list[str]) -> list[str]`` for ``lcjax.eval.evaluate``: sparse
    prefill, dense decoding (as the paper's code runs: its cache keeps the full K/V).

    Prompts are encoded ``[BOS] + bytes`` and grouped by length; each group runs in rows
    of ``batch_size`` (a short group repeats its last row, so each length compiles once):

    * prefill: ``model`` on the whole prompt [B, n] — no cache, no padding, so its
      token-sparse layers run the method (scores from the last W queries, per-head top-K,
      inner attention on the kept tokens, zeros for the skipped ones); the first answer
      token is the argmax at the last position, and each layer's K/V (what its attention
      received: RoPE applied, from that layer's input, itself shaped by the sparse layers
      before it) fills a :class:`lcjax.nn.KVCache` of n + ``max_new_tokens`` - 1 slots;
    * decoding: ``decoder`` (the same weights with dense attention; a token-sparse layer
      with a cache is dense anyway) takes ``max_new_tokens`` - 1 greedy steps through
      the caches. The answer is the bytes before the first EOS (specials dropped), as
      ``lcjax.eval.model_runner`` returns it.

    ``kept`` collects, per answered prompt, ``{layer: kept fraction}`` and ``budgets``
    ``{layer: K}`` for the token-sparse layers of ``model`` (their options read from its
    config). With a dense ``model`` this is greedy decoding, equal to ``lcjax.nn.generate``.
    """

    def __init__(self, model, decoder=None, *, max_new_tokens: int, batch_size: int = 16):
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"SparsePrefillGenerator: `max_new_tokens` must be an int >= 1, "
                             f"got {max_new_tokens!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"SparsePrefillGenerator: `batch_size` must be an int >= 1, got "
                             f"{batch_size!r}")
        self.decoder = model if decoder is None else decoder
        self.graphdef, self.state = nnx.split(model)
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        cfg = model.config
        self.sparse = tuple(
            (i, tuple(sorted(token_sparse_options(opts).items())))
            for i in range(cfg.num_layers)
            for name, opts in [cfg.layer_attention(i)] if name == "token_sparse")
        self.kept: list[dict[int, float]] = []
        self.budgets: list[dict[int, int]] = []
        self.seconds = 0.0

    def prefill(self, tokens):
        """Rows [B, n] of one length -> (next-token logits after the prompt [B, V], the
        per-layer caches of n + ``max_new_tokens`` - 1 slots holding the prompt's K/V, per
        token-sparse layer (kept fraction [B], budget K [B]))."""
        tokens = np.asarray(tokens, np.int32)
        if tokens.ndim != 2 or not tokens.size:
            raise ValueError(f"SparsePrefillGenerator: `tokens` must be a non-empty "
                             f"[batch, len] array, got shape {tokens.shape}")
        prefill = _prefill_fn(self.graphdef, tokens.shape[1] + self.max_new_tokens - 1,
                              self.sparse)
        return prefill(self.state, tokens)

    def generate_tokens(self, tokens) -> tuple[np.ndarray, list]:
        """Rows [B, n] of one length -> (greedy tokens [B, max_new_tokens], PAD after an
        EOS; per sparse layer (kept [B], budget [B])). Decoding is
        ``lcjax.nn.sampling.decode_from_caches`` (``generate``'s own loop) with the dense
        ``decoder`` through the prefill's caches, positions continuing from the prompt."""
        last, caches, kept = self.prefill(tokens)
        out = decode_from_caches(self.decoder, last, caches, self.max_new_tokens,
                                 stop_tokens=(tok.EOS,), pad_id=tok.PAD)
        return np.asarray(out.tokens), [(np.asarray(a), np.asarray(b)) for a, b in kept]

    def __call__(self, prompts: Sequence[str]) -> list[str]:
        start = time.perf_counter()
        ids = [tok.encode(p, bos=True) for p in prompts]
        answers: list[str | None] = [None] * len(ids)
        kept: list[dict] = [{} for _ in ids]
        budgets: list[dict] = [{} for _ in ids]
        by_len: dict[int, list[int]] = {}
        for i, x in enumerate(ids):
            by_len.setdefault(len(x), []).append(i)
        for _, group in sorted(by_len.items()):
            for a in range(0, len(group), self.batch_size):
                chunk = group[a:a + self.batch_size]
                rows = np.stack([ids[i] for i in chunk]
                                + [ids[chunk[-1]]] * (self.batch_size - len(chunk)))
                out, layer_kept = self.generate_tokens(rows)
                for r, i in enumerate(chunk):
                    gen = out[r]
                    stop = np.nonzero(gen == tok.EOS)[0]
                    gen = gen[:stop[0]] if stop.size else gen
                    answers[i] = tok.decode(gen[gen < 256])
                    for (layer, _), (kf, bud) in zip(self.sparse, layer_kept):
                        kept[i][layer], budgets[i][layer] = float(kf[r]), int(bud[r])
        self.kept += kept
        self.budgets += budgets
        self.seconds += time.perf_counter() - start
        return answers
