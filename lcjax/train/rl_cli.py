"""``lcjax rl``: GRPO with verifiable rewards on a trained byte-level model.

    lcjax rl --init runs/pretrain --items data/tablelong --out runs/grpo --steps 200
    lcjax rl --init runs/pretrain --items items.jsonl --out runs/grpo --resume
    lcjax rl --config grpo.json --init runs/pretrain --items items.jsonl --out runs/grpo

``--init`` is a ``lcjax train --out`` folder (its model is the initial policy and the frozen
reference). ``--items`` is a JSONL file or a folder of ``*.jsonl`` shards (read in sorted
order; ``--limit`` keeps the first N): objects with an ``answer`` and a ``prompt`` or
TableLong's ``context`` + ``question``. The reward is numeric match within ``--rel-tol`` /
``--abs-tol`` for numeric answers, exact match otherwise (:mod:`lcjax.train.rewards`). The
config file is ``{"grpo": {GRPOConfig fields}}``; flags override it. Writes
``OUT/checkpoints/``, ``OUT/metrics.jsonl`` and ``OUT/config.json`` and prints the last
step's record as JSON. See ``docs/grpo.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import typing

from lcjax.data.tokenizer import VOCAB_SIZE
from lcjax.train.checkpoint import load_model
from lcjax.train.cli import add_field_flags, add_run_arguments, merge_flags, read_config
from lcjax.train.metrics import read_jsonl
from lcjax.train.rewards import make_verifier
from lcjax.train.rl import GRPOConfig, train_grpo


def _flag_fields() -> dict[str, type]:
    """GRPOConfig fields settable by a flag (plain int / float / str ones) -> type."""
    hints = typing.get_type_hints(GRPOConfig)
    out = {}
    for f in dataclasses.fields(GRPOConfig):
        if hints[f.name] in (int, float, str) and f.name != "out_dir":
            out[f.name] = hints[f.name]
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``lcjax rl`` flags to ``parser``."""
    parser.add_argument("--init", required=True, help="`lcjax train --out` folder: the "
                        "initial policy and the reference")
    parser.add_argument("--items", required=True, help="a JSONL file or a folder of *.jsonl")
    parser.add_argument("--limit", type=int, help="use the first N items")
    add_run_arguments(parser, "JSON file: {'grpo': {GRPOConfig fields}}")
    parser.add_argument("--rel-tol", type=float, default=1e-6, help="numeric answers")
    parser.add_argument("--abs-tol", type=float, default=0.0, help="numeric answers")
    add_field_flags(parser, _flag_fields(), GRPOConfig())


def read_items(path: str, limit: int | None = None) -> list[dict]:
    """The JSON objects of a JSONL file, or of a folder's ``*.jsonl`` files in sorted order.

    Raises:
      ValueError: no such file, no shards, or no items.
    """
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.jsonl")))
    elif os.path.isfile(path):
        files = [path]
    else:
        raise ValueError(f"--items {path!r}: no such file or folder")
    items = []
    for name in files:
        items += read_jsonl(name)
        if limit is not None and len(items) >= limit:
            return items[:limit]
    if not items:
        raise ValueError(f"--items {path!r}: no items")
    return items


def config_from_args(args: argparse.Namespace) -> GRPOConfig:
    """GRPOConfig from ``--config`` then the flags."""
    spec = read_config(args.config, ("grpo",))
    names = [*_flag_fields(), "out_dir", "resume", "progress"]
    return GRPOConfig(**merge_flags(spec.get("grpo", {}), args, names, GRPOConfig, "grpo"))


def run(args: argparse.Namespace) -> int:
    """Runs ``lcjax rl``; returns the exit status."""
    cfg = config_from_args(args)
    items = read_items(args.items, args.limit)
    model = load_model(args.init)
    vocab = model.config.vocab_size
    if vocab < VOCAB_SIZE:
        raise ValueError(f"--init model has vocab_size={vocab} < the byte tokenizer's "
                         f"{VOCAB_SIZE}")
    result = train_grpo(model, cfg, items,
                        reward_fn=make_verifier(args.rel_tol, args.abs_tol),
                        overwrite=args.overwrite)
    print(json.dumps(result.history[-1] if result.history else {"step": result.step}))
    return 0
