"""Per-item records, the resumable results file, and the metrics per task, length, depth.

A record is a JSON object::

    {"task", "length", "depth", "index", "prompt_sha", "references": [str],
     "prediction": str | null, "error": str | null,
     "string_match_all": float, "string_match_part": float}   # percent for this item

plus what the runner adds (an lcjax model's ``"logprobs": [float]``, one per generated token)

with the scores of ``lcjax.data.ruler.string_match_all`` / ``string_match_part`` on the
stripped prediction; an item with an error scores 0 and is counted in ``errors``.

The results file is JSONL: a header line ``{"header": {...}}`` (suite, seed, backend), then
one record per finished item, appended (and flushed) as items finish. A killed run leaves
at most a partial last line, which :func:`read_results` skips. A later record for the same
key replaces an earlier one.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lcjax.data.items import EvalItem, item_key
from lcjax.data.ruler import string_match_all, string_match_part

__all__ = [
    "METRICS",
    "ResultsFile",
    "make_record",
    "read_results",
    "record_key",
    "summarize",
]

METRICS = ("string_match_all", "string_match_part")


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def make_record(item: EvalItem, prediction: str | None, error: str | None) -> dict:
    """The record of ``item`` answered with ``prediction`` (or failed with ``error``)."""
    refs = [_text(r) for r in item.references]
    if error is None and prediction is None:
        raise ValueError("make_record: give a `prediction` or an `error`")
    if error is not None:
        scores = dict.fromkeys(METRICS, 0.0)
        prediction = None
    else:
        prediction = prediction.strip()
        scores = {"string_match_all": string_match_all([prediction], [refs]),
                  "string_match_part": string_match_part([prediction], [refs])}
    return {"task": item.task, "length": item.length, "depth": item.depth, "index": item.index,
            "prompt_sha": item.prompt_sha, "references": refs, "prediction": prediction,
            "error": error, **scores}


def record_key(record: Mapping) -> tuple:
    """``(task, length, depth, index)`` of a record."""
    return item_key(record["task"], record["length"], record["depth"], record["index"])


def read_results(path: str | os.PathLike) -> tuple[dict | None, dict[tuple, dict]]:
    """``(header or None, {key: latest record})`` of a results file (missing: empty).

    Lines that are not JSON objects (a partial line left by a killed run) are skipped
    with a warning."""
    header, records = None, {}
    if not os.path.exists(path):
        return header, records
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if "header" in obj:
                    header = header or obj["header"]
                else:
                    records[record_key(obj)] = obj
            except (ValueError, KeyError, TypeError):
                warnings.warn(f"{path}:{n}: skipping a line that is not a record", stacklevel=2)
    return header, records


class ResultsFile:
    """Appends records to a JSONL results file, one flushed line each."""

    def __init__(self, path: str | os.PathLike, header: dict):
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        fresh = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        self._f = open(self.path, "a+", encoding="utf-8")
        if not fresh:  # a killed writer may have left a partial line: end it
            self._f.seek(0, os.SEEK_END)
            self._f.seek(self._f.tell() - 1)
            if self._f.read(1) != "\n":
                self._f.write("\n")
        else:
            self._write({"header": header})

    def _write(self, obj: dict) -> None:
        self._f.write(json.dumps(obj) + "\n")
        self._f.flush()

    def append(self, record: dict) -> None:
        self._write(record)

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _stats(records: Sequence[Mapping]) -> dict:
    return {"n": len(records), "errors": sum(r["error"] is not None for r in records),
            **{m: _mean([r[m] for r in records]) for m in METRICS}}


def summarize(records: Iterable[Mapping]) -> dict[str, Any]:
    """Metrics (mean percent, errors scoring 0), item counts and error counts.

    Returns ``{"overall": stats, "tasks": {task: {"overall": stats, "lengths": {length:
    stats}, "cells": [{"length", "depth", **stats}, ...]}}}`` where stats is ``{"n",
    "errors", "string_match_all", "string_match_part"}``; cells sorted by length, depth
    (depth None for a task without depth); ``lengths`` keys are strings (JSON).
    """
    records = list(records)
    tasks: dict[str, dict] = {}
    for name in dict.fromkeys(r["task"] for r in records):
        mine = [r for r in records if r["task"] == name]
        lengths = sorted({r["length"] for r in mine})
        depths = sorted({r["depth"] for r in mine}, key=lambda d: -1.0 if d is None else d)
        cells = []
        for length in lengths:
            for depth in depths:
                cell = [r for r in mine if r["length"] == length and r["depth"] == depth]
                if cell:
                    cells.append({"length": length, "depth": depth, **_stats(cell)})
        tasks[name] = {"overall": _stats(mine),
                       "lengths": {str(n): _stats([r for r in mine if r["length"] == n])
                                   for n in lengths},
                       "cells": cells}
    return {"overall": _stats(records), "tasks": tasks}
