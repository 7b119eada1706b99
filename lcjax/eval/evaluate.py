"""``evaluate``: one evaluator for lcjax models, Python callables and OpenAI-compatible
endpoints, over the tasks of a suite, with a resumable results file.

    results = evaluate(model_or_dir_or_fn_or_endpoint, "ruler", lengths=(1024, 2048),
                       depths=(0, 0.5, 1), n_per_cell=4, seed=0,
                       results_file="out/results.jsonl", resume=True)
    results.summary["tasks"]["niah_single_1"]["cells"]   # per length and depth
    write_report(results, "out")                         # results.json/.md, heat maps

The target is dispatched on its type: an ``lcjax.nn.DecoderLM``, a training run folder
(``lcjax train --out DIR``, read by :func:`lcjax.train.checkpoint.load_model`), an
:class:`~lcjax.eval.endpoint.EndpointConfig`, or any callable
``generate(prompts: list[str]) -> list[str]``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from lcjax.data.items import DEFAULT_DEPTHS, EvalItem, build_items, resolve_suite
from lcjax.data.model_tokenizers import ByteTokenizer
from lcjax.data.suites import Suite
from lcjax.eval.endpoint import EndpointConfig, endpoint_runner
from lcjax.eval.results import ResultsFile, make_record, read_results, summarize
from lcjax.eval.runners import (  # noqa: F401  (with_attention re-exported)
    Runner,
    callable_runner,
    load_target,
    model_runner,
    with_attention,
)
from lcjax.train.checkpoint import with_attention as switch

__all__ = ["EvalResults", "evaluate", "max_answer_tokens", "make_runner"]

ANSWER_MARGIN = 16


@dataclasses.dataclass
class EvalResults:
    """What :func:`evaluate` returns: the run's ``config``, one record per item (in item
    order; see :mod:`lcjax.eval.results`) and their :func:`~lcjax.eval.results.summarize`."""

    config: dict
    records: list[dict]

    @property
    def summary(self) -> dict:
        return summarize(self.records)

    def to_dict(self) -> dict:
        return {"config": self.config, "summary": self.summary, "records": self.records}


def max_answer_tokens(items: Sequence[EvalItem], margin: int = ANSWER_MARGIN) -> int:
    """New tokens to generate: the longest answer in bytes (a byte-token count, an upper
    bound for other tokenizers) plus ``margin``."""
    return max(len(it.answer) for it in items) + margin


def _is_model(target) -> bool:
    return hasattr(target, "config") and hasattr(target, "init_cache")


def make_runner(target: Any, *, max_new_tokens: int, batch_size: int = 8,
                attention: str | None = None, min_bucket: int = 64, attention_options=None,
                tokenizer=None) -> tuple[Runner, str]:
    """``(runner, backend description)`` for a model, model folder (run or Hugging Face),
    endpoint or callable (``min_bucket``: the models' smallest padded-length step, see
    :func:`lcjax.eval.runners.bucket_length`; ``tokenizer``: a model's own tokenizer
    object, see :func:`lcjax.eval.runners.model_runner`)."""
    if isinstance(target, str | os.PathLike) and not isinstance(target, EndpointConfig):
        if not os.path.isdir(target):
            raise ValueError(f"evaluate: `target` {os.fspath(target)!r} is not a directory "
                             "(give a model, a run or HF folder, an EndpointConfig or a "
                             "callable)")
        model, tok = load_target(target, attention=attention,
                                 attention_options=attention_options)

        runner_tok = None if isinstance(tok, ByteTokenizer) else tok
        return (model_runner(model, max_new_tokens=max_new_tokens, batch_size=batch_size,
                             min_bucket=min_bucket, tokenizer=runner_tok, logprobs=True),
                f"model {os.path.abspath(target)} attention={model.config.attention}")
    if _is_model(target):
        model = target
        if attention is not None or attention_options is not None:
            model = switch(target, attention, attention_options)
        tok = tokenizer if hasattr(tokenizer, "decode") else None
        return (model_runner(model, max_new_tokens=max_new_tokens, batch_size=batch_size,
                             min_bucket=min_bucket, tokenizer=tok, logprobs=True),
                f"model {type(model).__name__} attention={model.config.attention}")
    if attention is not None or attention_options is not None:
        raise ValueError("evaluate: `attention` / `attention_options` apply to lcjax models "
                         "only")
    if isinstance(target, EndpointConfig):
        return endpoint_runner(target, max_tokens=max_new_tokens), "endpoint " + target.describe()
    if callable(target):
        name = getattr(target, "__qualname__", type(target).__name__)
        return callable_runner(target, batch_size=batch_size), f"callable {name}"
    raise ValueError(f"evaluate: cannot evaluate a {type(target).__name__}: give an lcjax "
                     "model, a run folder, an EndpointConfig or a callable")


def _counter(tokenizer):
    """What item lengths count: ``tokenizer.encode`` of a tokenizer object, a callable
    as it is, None (bytes)."""
    if tokenizer is None or callable(tokenizer) and not hasattr(tokenizer, "decode"):
        return tokenizer
    return lambda text: tokenizer.encode(text)


def _with_suite_metrics(suite: Suite, item: EvalItem, record: dict) -> dict:
    """``record`` with ``suite_metrics`` from the suite's ``score`` hook (if it has one).

    A hook that raises on this item's prediction fails the item (``error`` names the
    exception, scores 0) and the empty reply is scored instead, as for any failed item; a
    hook that cannot score the empty reply either is broken for every item, so that raises.
    """
    if suite.score is None:
        return record
    try:
        metrics = suite.score(item.sample, record["prediction"] or "")
    except Exception as e:  # one item's bad prediction fails the item, not the run
        if record["prediction"] is None:
            raise
        record = make_record(item, None, f"suite score hook failed: {type(e).__name__}: {e}")
        metrics = suite.score(item.sample, "")
    record["suite_metrics"] = dict(metrics)
    return record


def _check_header(path: str, saved: dict | None, header: dict) -> None:
    if saved is None:
        return
    diffs = [f"{k}: file {saved.get(k)!r}, this run {header[k]!r}"
             for k in header if saved.get(k) != header[k]]
    if diffs:
        raise ValueError(f"results file {path!r} was written by another run ("
                         + "; ".join(diffs) + "): use a fresh file")


def _load_folder(target: str | os.PathLike, attention: str | None, attention_options: Any,
                 tokenizer: Any) -> tuple[Any, Any]:
    """A run folder's model, and the tokenizer that sizes the items: ``tokenizer`` if
    given, else the folder's own (None for the byte tokenizer)."""
    target, own = load_target(target, attention=attention, attention_options=attention_options)
    tokenizer = tokenizer if tokenizer is not None or isinstance(own, ByteTokenizer) \
        else own
    return target, tokenizer


def _resumed_records(results_file: str | os.PathLike, header: dict, items: Sequence,
                     *, resume: bool, retry_errors: bool) -> dict[tuple, dict]:
    """The records of ``results_file`` this run keeps, by item key: those of an item with
    the same prompt (and without an error, with ``retry_errors``). A file with records
    needs ``resume``; its header must equal ``header``."""
    saved_header, saved = read_results(results_file)
    if saved and not resume:
        raise ValueError(f"results file {os.fspath(results_file)!r} has {len(saved)} "
                         "records: pass resume=True (--resume) or a fresh file")
    _check_header(os.fspath(results_file), saved_header, header)
    return {it.key: saved[it.key] for it in items if it.key in saved
            and saved[it.key].get("prompt_sha") == it.prompt_sha
            and not (retry_errors and saved[it.key].get("error") is not None)}


def _run_items(runner: Any, suite: Suite, todo: Sequence, done: dict[tuple, dict],
               out: ResultsFile | None, bar: Any) -> None:
    """Runs ``todo``'s prompts through ``runner``, adding each finished item's record to
    ``done`` (and ``out``) as it comes; closes ``bar`` and ``out`` at the end."""
    errors = sum(r.get("error") is not None for r in done.values())
    try:
        for i, text, error, *extra in runner([it.prompt for it in todo]):
            record = {**make_record(todo[i], text, error), **(extra[0] if extra else {})}
            record = _with_suite_metrics(suite, todo[i], record)
            done[todo[i].key] = record
            if out is not None:
                out.append(record)
            errors += error is not None
            bar.update(1)
            bar.set_postfix(errors=errors)
    finally:
        bar.close()
        if out is not None:
            out.close()


def evaluate(
    target: Any,
    suite: str | Suite,
    lengths: Sequence[int],
    depths: Sequence[float] = DEFAULT_DEPTHS,
    n_per_cell: int = 4,
    seed: int = 0,
    *,
    tasks: Sequence[str] | None = None,
    tokenizer: Any = None,
    results_file: str | os.PathLike | None = None,
    resume: bool = False,
    retry_errors: bool = True,
    batch_size: int = 8,
    max_new_tokens: int | None = None,
    attention: str | None = None,
    progress: bool = True,
    min_bucket: int = 64,
    attention_options: Any = None,
) -> EvalResults:
    """Evaluate ``target`` on every item of ``suite`` (:func:`lcjax.data.items.build_items`).

    Args:
      target: an ``lcjax.nn.DecoderLM`` (greedy decoding of ``[BOS] + prompt`` over the byte
        tokenizer), a run folder, an :class:`EndpointConfig`, or a callable
        ``generate(prompts: list[str]) -> list[str]`` (called ``batch_size`` prompts at a time).
      suite: a registered suite name ("ruler", "nolima") or a ``Suite``.
      lengths, depths, n_per_cell, seed, tasks, tokenizer: the items (``build_items``).
      results_file: JSONL file the records are appended to as items finish (None: kept in
        memory only).
      resume: read ``results_file`` and skip the items it holds (same key and prompt). A
        file with records and ``resume=False`` is an error, as is a file from a run with
        another suite, seed or backend.
      retry_errors: with ``resume``, evaluate again the items recorded with an error.
      batch_size: rows per model batch / prompts per callable call.
      max_new_tokens: answer budget; default :func:`max_answer_tokens`.
      attention: for a model or run folder, the attention variant to decode with.
      progress: show a tqdm progress bar.
      min_bucket: for a model, prompts are padded to a multiple of at least this many
        tokens (:func:`lcjax.eval.runners.bucket_length`); one large value puts every
        prompt in one bucket (one compile of the decoder).

    Returns:
      :class:`EvalResults`, records in item order. A failed item (an exception in the
      callable, a failed or malformed endpoint reply) is a record with ``error`` set and
      scores 0; nothing about one item stops the run. When the suite has a ``score`` hook
      (:class:`~lcjax.data.suites.Suite`), every record also holds
      ``suite_metrics = suite.score(item.sample, prediction)`` (the empty reply for an
      error; resumed records without it are scored again from their prediction). An lcjax
      model's records also hold ``logprobs``: ``generate``'s log-probs of the generated
      tokens (a final stop token included), the numbers ``lcjax serve`` reports.
    """
    suite = resolve_suite(suite)
    if isinstance(target, str | os.PathLike) and not isinstance(target, EndpointConfig) \
            and os.path.isdir(target):  # load once: the folder's tokenizer sizes the items
        target, tokenizer = _load_folder(target, attention, attention_options, tokenizer)
        attention = attention_options = None
    skipped: list[str] = []
    items = build_items(suite, lengths, depths, n_per_cell, seed, tasks=tasks,
                        tokenizer=_counter(tokenizer), skipped=skipped)
    for note in skipped:
        print(f"evaluate: skipped {note}", file=sys.stderr)
    if not items:
        raise ValueError(f"evaluate: no item fits the requested lengths {list(lengths)}: "
                         + "; ".join(skipped))
    if max_new_tokens is None:
        max_new_tokens = max_answer_tokens(items)
    runner, backend = make_runner(target, max_new_tokens=max_new_tokens,
                                  batch_size=batch_size, attention=attention,
                                  min_bucket=min_bucket, attention_options=attention_options,
                                  tokenizer=tokenizer)
    header = {"suite": suite.name, "seed": int(seed), "backend": backend,
              "max_new_tokens": int(max_new_tokens)}
    done = ({} if results_file is None else
            _resumed_records(results_file, header, items, resume=resume,
                             retry_errors=retry_errors))
    todo = [it for it in items if it.key not in done]
    out = ResultsFile(results_file, header) if results_file is not None else None
    bar = tqdm(total=len(items), initial=len(done), disable=not progress, desc="eval",
               unit="item")
    _run_items(runner, suite, todo, done, out, bar)
    for it in items:
        if it.key in done and suite.score is not None and "suite_metrics" not in done[it.key]:
            done[it.key] = _with_suite_metrics(suite, it, dict(done[it.key]))
    config = {**header, "tasks": list(dict.fromkeys(it.task for it in items)),
              "lengths": [int(n) for n in lengths], "depths": [float(d) for d in depths],
              "n_per_cell": int(n_per_cell), "items": len(items),
              "resumed": len(items) - len(todo), "skipped": skipped}
    return EvalResults(config, [done[it.key] for it in items])
