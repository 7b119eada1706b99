"""Writing TableLong items to JSONL shards with several processes, and reading them back.

:func:`write_shards` cuts indices ``0..n-1`` into shards of ``shard_size`` consecutive
items; a worker makes shard ``k`` (``shard-00000k.jsonl``: items ``k * shard_size ...``, one
JSON object a line, nothing else) from ``(seed, index)`` alone, so the files are the same
for any number of workers. It returns the summary (task / language / format mix, length
statistics, ``bugs``, items/s). :class:`ShardSource` is a grain ``RandomAccessDataSource``
over a folder of shards; :class:`TableLongSource` makes items on the fly.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import pathlib
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from lcjax.data.suites import as_tokenizer
from lcjax.data.tablelong.items import check_item_args, dumps, generate_item
from lcjax.data.writes import check_writable, replace_folder

__all__ = ["ShardSource", "TableLongSource", "write_shards"]


def _shard_name(k: int) -> str:
    return f"shard-{k:06d}.jsonl"


def _make_shard(job: tuple) -> dict:
    out, k, start, stop, seed, kwargs = job
    stats: collections.Counter = collections.Counter()
    tasks, langs, fmts, lengths = (collections.Counter(), collections.Counter(),
                                   collections.Counter(), [])
    cpu0 = time.process_time()
    path = pathlib.Path(out) / _shard_name(k)
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for i in range(start, stop):
            item = generate_item(seed, i, stats=stats, **kwargs)
            f.write(dumps(item) + "\n")
            tasks[item["task"]] += 1
            langs[item["language"]] += 1
            fmts[item["format"]] += 1
            lengths.append(item["length"])
    os.replace(tmp, path)
    return {"items": stop - start, "tasks": tasks, "languages": langs, "formats": fmts,
            "lengths": lengths, "stats": stats, "cpu": time.process_time() - cpu0}


def _jax_started() -> bool:
    """Whether JAX has started a backend (and its threads) in this process: importing jax
    alone does not (``lcjax.data`` imports it). Unknown counts as started."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None:
        return False
    return bool(getattr(bridge, "_backends", True))


def _context():
    # fork is fast, but unsafe once JAX runs its threads: spawn then
    return multiprocessing.get_context("spawn" if _jax_started() else "fork")


def check_shard_args(n: int, *, min_len: int, max_len: int, workers: int = 1,
                     shard_size: int = 256, tokenizer: Any = None, **kwargs) -> None:
    """Every argument of :func:`write_shards` but the folder, checked without creating
    anything; ``ValueError`` naming the bad one."""
    if n < 1 or workers < 1 or shard_size < 1:
        raise ValueError(f"write_shards: n, workers and shard_size must be >= 1, got {n}, "
                         f"{workers}, {shard_size}")
    unknown = sorted(set(kwargs) - {"tasks", "languages", "formats"})
    if unknown:
        raise ValueError(f"write_shards: unknown arguments {unknown}")
    check_item_args(min_len=min_len, max_len=max_len, **kwargs)
    as_tokenizer(tokenizer)  # ValueError for what cannot count tokens


def write_shards(out: str | os.PathLike, n: int, *, min_len: int, max_len: int, seed: int = 0,
                 workers: int = 1, shard_size: int = 256, tokenizer: Any = None,
                 progress: bool = True, overwrite: bool = False, **kwargs) -> dict:
    """Writes items ``0..n-1`` of ``seed`` to ``out/shard-*.jsonl`` and ``out/summary.json``.

    ``kwargs`` go to :func:`lcjax.data.tablelong.items.make_item` (``tasks``, ``languages``,
    ``formats``); ``tokenizer`` must be picklable for ``workers > 1``. Every argument is
    checked before anything is created. The shards are written into a temporary folder
    beside ``out`` that then replaces it whole (:func:`lcjax.data.writes.replace_folder`):
    a folder that already holds files is refused unless ``overwrite``, never mixed, and a
    failed run leaves ``out`` as it was. Returns the summary: ``items``, ``seconds``,
    ``items_per_s`` (wall clock, start-up included), ``cpu_seconds`` / ``items_per_cpu_s``
    (the workers' CPU time making items: what the rate would be per free core), the
    ``tasks`` / ``languages`` / ``formats`` mix, ``length`` (min / mean / max tokens of the
    contexts), ``bugs`` (Python-SQLite disagreements, never emitted), ``redraws`` and
    ``length_misses``.

    Raises:
      ValueError: a bad argument, or ``out`` holds files and ``overwrite`` is False.
    """
    check_shard_args(n, min_len=min_len, max_len=max_len, workers=workers,
                     shard_size=shard_size, tokenizer=tokenizer, **kwargs)
    check_writable(out, overwrite=overwrite)
    with replace_folder(out, overwrite=overwrite) as tmp:
        summary = _write_into(tmp, n, min_len=min_len, max_len=max_len, seed=seed,
                              workers=workers, shard_size=shard_size, tokenizer=tokenizer,
                              progress=progress, **kwargs)
    return summary


def _write_into(out: pathlib.Path, n: int, *, min_len: int, max_len: int, seed: int,
                workers: int, shard_size: int, tokenizer: Any, progress: bool,
                **kwargs) -> dict:
    """:func:`write_shards` into the existing empty folder ``out``."""
    from tqdm import tqdm

    kw = dict(min_len=min_len, max_len=max_len, tokenizer=tokenizer, **kwargs)
    jobs = [(str(out), k, a, min(a + shard_size, n), seed, kw)
            for k, a in enumerate(range(0, n, shard_size))]
    t0 = time.perf_counter()
    results = []
    bar = tqdm(total=n, disable=not progress, desc="tablelong", unit="item")
    try:
        if workers == 1:
            for job in jobs:
                results.append(_make_shard(job))
                bar.update(results[-1]["items"])
        else:
            with _context().Pool(workers) as pool:
                for r in pool.imap_unordered(_make_shard, jobs):
                    results.append(r)
                    bar.update(r["items"])
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    summary = _summary(results, seconds)
    summary.update(seed=int(seed), min_len=int(min_len), max_len=int(max_len),
                   workers=int(workers), shards=len(jobs))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    return summary


def _summary(results: list[dict], seconds: float) -> dict:
    total = collections.Counter()
    mix = {k: collections.Counter() for k in ("tasks", "languages", "formats")}
    lengths = []
    for r in results:
        total.update(r["stats"])
        for k in mix:
            mix[k].update(r[k])
        lengths.extend(r["lengths"])
    n = len(lengths)
    cpu = sum(r["cpu"] for r in results)
    return {"items": n, "seconds": round(seconds, 3), "items_per_s": round(n / seconds, 1),
            "cpu_seconds": round(cpu, 3), "items_per_cpu_s": round(n / max(cpu, 1e-9), 1),
            **{k: dict(sorted(v.items())) for k, v in mix.items()},
            "length": {"min": int(min(lengths)), "mean": round(float(np.mean(lengths)), 1),
                       "max": int(max(lengths))},
            "bugs": int(total["bugs"]), "redraws": int(total["redraws"]),
            "length_misses": int(total["length_misses"])}


class ShardSource:
    """A grain ``RandomAccessDataSource`` over ``folder/*.jsonl``: record ``i`` is the ``i``-th
    item line across the shards in name order (a dict)."""

    def __init__(self, folder: str | os.PathLike):
        self.paths = sorted(pathlib.Path(folder).glob("*.jsonl"))
        if not self.paths:
            raise ValueError(f"ShardSource: no *.jsonl shard in {os.fspath(folder)!r}")
        self._index: list[tuple[int, int]] = []   # (shard, byte offset)
        for s, path in enumerate(self.paths):
            offset = 0
            with open(path, "rb") as f:
                for line in f:
                    if line.strip():
                        self._index.append((s, offset))
                    offset += len(line)

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> dict:
        s, offset = self._index[int(index)]
        with open(self.paths[s], "rb") as f:
            f.seek(offset)
            return json.loads(f.readline())

    def __repr__(self) -> str:
        return f"ShardSource({len(self.paths)} shards, {len(self)} items)"


class TableLongSource:
    """A grain ``RandomAccessDataSource`` making item ``i`` of ``seed`` on request (the same
    item :func:`write_shards` writes at index ``i``)."""

    def __init__(self, num_records: int, *, min_len: int, max_len: int, seed: int = 0,
                 tokenizer: Any = None, **kwargs: Mapping):
        if num_records < 1:
            raise ValueError(f"TableLongSource: `num_records` must be >= 1, got {num_records}")
        self.num_records, self.seed = int(num_records), int(seed)
        self.kwargs = dict(min_len=min_len, max_len=max_len, tokenizer=tokenizer, **kwargs)

    def __len__(self) -> int:
        return self.num_records

    def __getitem__(self, index: int) -> dict:
        if not 0 <= int(index) < self.num_records:
            raise IndexError(f"TableLongSource: index {index} out of range "
                             f"[0, {self.num_records})")
        return generate_item(self.seed, int(index), **self.kwargs)

    def __repr__(self) -> str:
        return f"TableLongSource({self.num_records}, seed={self.seed}, {self.kwargs})"
