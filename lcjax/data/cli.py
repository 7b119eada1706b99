"""``lcjax data``: dataset generation.

    lcjax data tablelong --n 10000 --min-len 4k --max-len 32k --out data/tablelong --workers 2

``tablelong`` writes ``OUT/shard-*.jsonl`` (TableLong items, one JSON object a line;
``lcjax.data.tablelong.ShardSource`` reads them as a grain source) and ``OUT/summary.json``,
shows a progress bar and prints the summary: the task / language / format mix, context
lengths, Python-SQLite disagreements (``bugs``: never emitted) and items/s. Lengths count
UTF-8 bytes (``--tokenizer`` names a Hugging Face ``tokenizer.json`` to count its tokens);
``k`` = 1024. The files depend on ``--seed`` only, not on ``--workers``.

Every argument is checked before anything is written. The shards go to a temporary folder
beside ``OUT`` that then becomes ``OUT``: a folder that already holds files is refused
unless ``--overwrite`` (then replaced whole, never mixed), and a failed run leaves no trace.
"""

from __future__ import annotations

import argparse
import json

from lcjax.data.items import parse_lengths
from lcjax.data.suites import load_tokenizer_file
from lcjax.data.tablelong.shards import check_shard_args, write_shards
from lcjax.data.writes import check_writable
from lcjax.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``lcjax data`` subcommands to ``parser``."""
    sub = parser.add_subparsers(dest="dataset", required=True)
    p = sub.add_parser("tablelong", help="TableLong items: tables + verified questions")
    p.add_argument("--n", type=int, default=10_000, help="number of items (default 10000)")
    p.add_argument("--min-len", default="4k", help="min context tokens, e.g. 4k (default)")
    p.add_argument("--max-len", default="32k", help="max context tokens, e.g. 32k (default)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    p.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    p.add_argument("--shard-size", type=int, default=256, help="items per shard (default 256)")
    p.add_argument("--tasks", default=None, help="comma-separated question types (default all)")
    p.add_argument("--languages", default=None, help="comma-separated languages (default all)")
    p.add_argument("--formats", default=None, help="comma-separated formats (default all)")
    p.add_argument("--tokenizer", default=None,
                   help="Hugging Face tokenizer.json whose tokens lengths count (default bytes)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out whole if it already holds files (refused otherwise)")


def _one_length(text: str, flag: str) -> int:
    values = parse_lengths(text)
    if len(values) != 1:
        raise UsageError(f"{flag}: give one length, got {text!r}")
    return values[0]


def _names(text: str | None):
    return None if text is None else tuple(x.strip() for x in text.split(",") if x.strip())


def run(args: argparse.Namespace) -> int:
    if args.dataset != "tablelong":
        raise UsageError(f"unknown dataset {args.dataset!r}")
    kwargs = {k: v for k, v in (("tasks", _names(args.tasks)),
                                ("languages", _names(args.languages)),
                                ("formats", _names(args.formats))) if v is not None}
    min_len, max_len = _one_length(args.min_len, "--min-len"), _one_length(args.max_len,
                                                                          "--max-len")
    check_writable(args.out, overwrite=args.overwrite)  # before loading a tokenizer
    try:  # the user's arguments: a one-line error (exit 2), before anything is created
        tokenizer = None if args.tokenizer is None else load_tokenizer_file(args.tokenizer)
        check_shard_args(args.n, min_len=min_len, max_len=max_len, workers=args.workers,
                         shard_size=args.shard_size, tokenizer=tokenizer, **kwargs)
    except ValueError as e:
        raise UsageError(str(e)) from None
    summary = write_shards(args.out, args.n, min_len=min_len, max_len=max_len, seed=args.seed,
                           workers=args.workers, shard_size=args.shard_size,
                           tokenizer=tokenizer, progress=args.progress,
                           overwrite=args.overwrite, **kwargs)
    print(json.dumps(summary, indent=1, ensure_ascii=False))
    print(f"tablelong: {summary['items']} items in {summary['seconds']:.1f} s = "
          f"{summary['items_per_s']:.1f} items/s with {args.workers} worker(s) "
          f"({summary['items_per_cpu_s']:.1f} items per CPU second of generation); "
          f"Python-SQLite disagreements (not emitted): {summary['bugs']}")
    return 0
