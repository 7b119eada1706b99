"""Runners: what turns a list of prompts into answers, one protocol for every backend.

A runner is ``run(prompts: list[bytes]) -> iterator of (i, text, error)``: for each prompt
i, in any order (the order in which answers finish), either its answer ``text`` (error
None) or an ``error`` message (text None). The evaluator records each pair as it arrives.
A runner may yield a fourth element, a dict of extra record fields: :func:`model_runner`
with ``logprobs=True`` gives ``{"logprobs": [float]}``, the log-probs ``generate`` computed
for the generated tokens (a final stop token included).

* :func:`callable_runner`: any Python ``generate(prompts: list[str]) -> list[str]``, called
  on chunks of ``batch_size`` prompts; an exception or a malformed return value becomes an
  error for every prompt of its chunk.
* :func:`model_runner`: an ``lcjax.nn.DecoderLM`` over the byte tokenizer: prompts bucketed
  by length (a few padded lengths, a fixed batch size: few compiles), each batch prefilled
  and greedily decoded through the KV cache by one :func:`lcjax.nn.generate` call.
* :func:`lcjax.eval.endpoint.endpoint_runner`: an OpenAI-compatible HTTP endpoint.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from lcjax.data import tokenizer as tok
from lcjax.data.model_tokenizers import ByteTokenizer, HFTokenizer, read_json
from lcjax.interop.hf import load_hf
from lcjax.nn import DecoderLM, generate
from lcjax.train.checkpoint import load_model

__all__ = [
    "Runner",
    "bucket_length",
    "callable_runner",
    "length_buckets",
    "load_target",
    "model_runner",
    "with_attention",
]

Runner = Callable[[list[bytes]], Iterator[tuple[int, "str | None", "str | None"]]]


def _text(prompt: bytes) -> str:
    return prompt.decode("utf-8", "replace")


def _chunks(indices: Sequence[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(indices), size):
        yield list(indices[start:start + size])


def callable_runner(fn: Callable[[list[str]], Sequence[str]], *, batch_size: int = 16) -> Runner:
    """A runner around ``fn(prompts: list[str]) -> list[str]`` (UTF-8 decoded prompts)."""
    if not callable(fn):
        raise ValueError(f"callable_runner: `fn` must be callable, got {fn!r}")
    if batch_size < 1:
        raise ValueError(f"callable_runner: `batch_size` must be >= 1, got {batch_size}")

    def run(prompts: list[bytes]):
        for chunk in _chunks(range(len(prompts)), batch_size):
            try:
                texts = fn([_text(prompts[i]) for i in chunk])
                texts = list(texts)
            except Exception as e:  # the item fails, not the run
                for i in chunk:
                    yield i, None, f"{type(e).__name__}: {e}"
                continue
            if len(texts) != len(chunk):
                for i in chunk:
                    yield i, None, (f"generate returned {len(texts)} texts for {len(chunk)} "
                                    "prompts")
                continue
            for i, t in zip(chunk, texts):
                if isinstance(t, bytes):
                    t = _text(t)
                if isinstance(t, str):
                    yield i, t, None
                else:
                    yield i, None, f"generate returned a {type(t).__name__}, not a str"

    return run


def bucket_length(n: int, *, min_bucket: int = 64) -> int:
    """``n`` rounded up to a multiple of ``max(min_bucket, 2**(ceil(log2 n) - 3))``: at most
    about 8 buckets per octave, so padding adds at most a quarter of ``n`` (or
    ``min_bucket``)."""
    if n < 1:
        raise ValueError(f"bucket_length: `n` must be >= 1, got {n}")
    step = max(min_bucket, 2 ** max(math.ceil(math.log2(n)) - 3, 0))
    return -(-n // step) * step


def length_buckets(lengths: Sequence[int], batch_size: int, *,
                   min_bucket: int = 64) -> list[tuple[int, list[int]]]:
    """Batches ``(padded length, indices)`` of at most ``batch_size`` items with the same
    :func:`bucket_length`, shortest first."""
    by_bucket: dict[int, list[int]] = {}
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        by_bucket.setdefault(bucket_length(lengths[i], min_bucket=min_bucket), []).append(i)
    return [(p, chunk) for p, idx in sorted(by_bucket.items())
            for chunk in _chunks(idx, batch_size)]


def with_attention(model, attention: str):
    """``model`` (a ``DecoderLM``) with the attention variant ``attention`` in every layer,
    sharing its parameters (e.g. ``"blockwise"`` for a long prefill)."""
    from flax import nnx

    cfg = dataclasses.replace(model.config, attention=attention)
    shell = nnx.eval_shape(lambda: DecoderLM(cfg, rngs=nnx.Rngs(0)))
    graphdef, want = nnx.split(shell)
    _, state = nnx.split(model)
    if _layout(want) != _layout(state):
        raise ValueError(f"with_attention: variant {attention!r} takes other parameters than "
                         f"the model's {model.config.attention!r}")
    return nnx.merge(graphdef, state)


def _layout(tree) -> list:
    """Paths and shapes of a tree's leaves (to compare two model states)."""
    import jax

    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(jax.tree_util.keystr(p), tuple(np.shape(x))) for p, x in flat]


def _check_model(model):
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab is None:
        raise ValueError(f"model_runner: `model` must be an lcjax.nn.DecoderLM, got "
                         f"{type(model).__name__}")
    if vocab < tok.VOCAB_SIZE:
        raise ValueError(f"model_runner: the model's vocab_size={vocab} is smaller than the "
                         f"byte tokenizer's {tok.VOCAB_SIZE} (BOS/EOS/PAD)")


def load_target(path, *, attention: str | None = None, attention_options=None):
    """``(model, tokenizer)`` of a model folder: an ``lcjax train`` run (``load_model``,
    the byte tokenizer) or a Hugging Face checkpoint folder (``load_hf``, its
    ``tokenizer.json``), with ``attention`` / ``attention_options`` switched on (the
    variant's own parameters initialised, see :mod:`lcjax.nn.pretrained`)."""
    path = os.fspath(path)
    cfg = read_json(os.path.join(path, "config.json"))
    if not cfg:
        raise ValueError(f"evaluate: {path!r} has no config.json (expected an `lcjax train` "
                         "run folder or a Hugging Face checkpoint folder)")
    if "model" in cfg:
        return (load_model(path, attention=attention, attention_options=attention_options),
                ByteTokenizer())

    model, _ = load_hf(path, attention=attention, attention_options=attention_options)
    return model, HFTokenizer(path)


def _extra(out, r: int, count: int, logprobs: bool) -> tuple:
    """``({"logprobs": row r's first count log-probs},)`` with ``logprobs``, else ()."""
    if not logprobs:
        return ()
    return ({"logprobs": [float(x) for x in np.asarray(out.logprobs[r, :count])]},)


def model_runner(model, *, max_new_tokens: int, batch_size: int = 8, bos: bool = True,
                 stop_tokens: Sequence[int] = (tok.EOS,), min_bucket: int = 64,
                 tokenizer=None, logprobs: bool = False) -> Runner:
    """A runner decoding greedily with an ``lcjax.nn.DecoderLM`` over the byte tokenizer,
    or over ``tokenizer`` (``encode(text) -> ids`` with its special tokens, ``decode``,
    ``eos_ids`` the stop tokens, ``pad_id``; e.g. ``lcjax.data.model_tokenizers.HFTokenizer``).

    Row layout: ``[BOS] + prompt`` (``bos=True``, the layout ``lcjax.data.ruler.make_batch``
    trains on), right-padded with PAD to :func:`bucket_length`; every batch has
    ``batch_size`` rows (a short last batch is filled with one-token rows), so each
    padded length compiles once. The answer is the generated bytes up to a stop token,
    specials and ids beyond the byte vocabulary dropped, decoded as UTF-8. With
    ``logprobs`` each answer also yields ``{"logprobs": [...]}``: ``generate``'s log-probs of
    the generated tokens (``return_logprobs``), a final stop token included.
    """
    if tokenizer is not None:
        return _tokenizer_runner(model, tokenizer, max_new_tokens=max_new_tokens,
                                 batch_size=batch_size, min_bucket=min_bucket,
                                 logprobs=logprobs)
    _check_model(model)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"model_runner: `max_new_tokens` must be an int >= 1, got "
                         f"{max_new_tokens!r}")
    if batch_size < 1:
        raise ValueError(f"model_runner: `batch_size` must be >= 1, got {batch_size}")

    def run(prompts: list[bytes]):
        ids = [tok.encode(p, bos=bos) for p in prompts]
        if any(len(x) == 0 for x in ids):
            raise ValueError("model_runner: an empty prompt (use bos=True)")
        for p, chunk in length_buckets([len(x) for x in ids], batch_size,
                                       min_bucket=min_bucket):
            rows = np.full((batch_size, p), tok.PAD, np.int32)
            rows[:, 0] = tok.BOS if bos else ids[chunk[0]][0]
            lens = np.ones(batch_size, np.int32)
            for r, i in enumerate(chunk):
                rows[r, :len(ids[i])] = ids[i]
                lens[r] = len(ids[i])
            out = generate(model, rows, max_new_tokens, prompt_lengths=lens,
                           stop_tokens=tuple(stop_tokens), pad_id=tok.PAD,
                           return_logprobs=logprobs)
            tokens, ends = np.asarray(out.tokens), np.asarray(out.lengths)
            for r, i in enumerate(chunk):
                gen = tokens[r, lens[r]:ends[r]]
                yield (i, tok.decode(gen[gen < 256]), None,
                       *_extra(out, r, len(gen), logprobs))

    return run


def _tokenizer_runner(model, tokenizer, *, max_new_tokens: int, batch_size: int,
                      min_bucket: int, logprobs: bool = False) -> Runner:
    """:func:`model_runner` with a model's own tokenizer: prompts encoded by
    ``tokenizer.encode``, padded with ``tokenizer.pad_id``, stopped by its ``eos_ids``,
    answers decoded by ``tokenizer.decode`` (the stop token dropped)."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"model_runner: `max_new_tokens` must be an int >= 1, got "
                         f"{max_new_tokens!r}")
    stops = tuple(int(i) for i in tokenizer.eos_ids)
    pad = int(tokenizer.pad_id)

    def run(prompts: list[bytes]):
        ids = [np.asarray(tokenizer.encode(_text(p)), np.int32) for p in prompts]
        for i in [i for i, x in enumerate(ids) if len(x) == 0]:
            yield i, None, "empty prompt after tokenization"
        keep = [i for i, x in enumerate(ids) if len(x)]
        for p, chunk in length_buckets([len(ids[i]) for i in keep], batch_size,
                                       min_bucket=min_bucket):
            chunk = [keep[j] for j in chunk]
            rows = np.full((batch_size, p), pad, np.int32)
            lens = np.ones(batch_size, np.int32)
            for r, i in enumerate(chunk):
                rows[r, :len(ids[i])] = ids[i]
                lens[r] = len(ids[i])
            out = generate(model, rows, max_new_tokens, prompt_lengths=lens,
                           stop_tokens=stops, pad_id=pad, return_logprobs=logprobs)
            tokens, ends = np.asarray(out.tokens), np.asarray(out.lengths)
            for r, i in enumerate(chunk):
                gen = tokens[r, lens[r]:ends[r]]
                yield (i, tokenizer.decode(gen[~np.isin(gen, stops)]), None,
                       *_extra(out, r, len(gen), logprobs))

    return run
