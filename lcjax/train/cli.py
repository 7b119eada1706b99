"""``lcjax train``: train a byte-level DecoderLM on the Shakespeare split.

    lcjax train --config run.json
    lcjax train --steps 2000 --batch-size 16 --seq-len 256 --d-model 256 --out runs/a
    lcjax train --out runs/a --resume
    lcjax train --mesh data=2,context=4 ...                  # 8 devices: batch x sequence
    lcjax train --coordinator host0:8476 --num-processes 2 --process-id 0 --mesh ... # each host

The config file is ``{"model": {DecoderConfig fields}, "train": {TrainConfig
fields}}``; flags override it. ``model.dtype`` / ``param_dtype`` are dtype names
("bfloat16"). Writes ``OUT/checkpoints/``, ``OUT/metrics.jsonl`` and ``OUT/config.json``
(a valid ``--config``) and prints the final record as JSON. ``--resume`` continues from
the latest intact checkpoint; it fails, naming the fields, if the model or optimizer
config differs from the checkpoint's. ``--out`` must be new, empty or a run folder;
``--overwrite`` removes it first.

``--mesh data=N,context=M`` (``TrainConfig.mesh``) shards the batch over ``N`` devices and
the sequence over ``M`` (params replicated). ``--coordinator``/``--num-processes``/
``--process-id`` (or ``LCJAX_COORDINATOR``/``LCJAX_NUM_PROCESSES``/``LCJAX_PROCESS_ID``)
start JAX's multi-controller runtime first (:func:`lcjax.parallel.distributed.initialize`);
``--distributed`` lets JAX detect the cluster (Cloud TPU pod slices, SLURM, ...). Every
process runs the same command and builds only its rows of each batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from lcjax.data.tokenizer import VOCAB_SIZE
from lcjax.train.loop import TrainConfig, train

# flag -> TrainConfig field
_TRAIN_FLAGS = {
    "steps": int, "batch_size": int, "seq_len": int, "lr": float, "warmup_steps": int,
    "min_lr_ratio": float, "weight_decay": float, "grad_clip": float, "seed": int,
    "data_seed": int, "heldout_fraction": float, "split_seed": int, "eval_every": int,
    "eval_batches": int, "log_every": int, "ckpt_every": int, "keep_checkpoints": int,
    "grad_accum": int,
}
# flag -> DecoderConfig field
_MODEL_FLAGS = {
    "d_model": int, "num_layers": int, "num_heads": int, "num_kv_heads": int,
    "head_dim": int, "mlp_hidden": int, "max_len": int, "attention": str,
}
# a ~1M-parameter byte LM unless the config or flags say otherwise
DEFAULT_MODEL = {
    "vocab_size": VOCAB_SIZE, "d_model": 128, "num_layers": 4, "num_heads": 4,
    "num_kv_heads": 4, "head_dim": 32, "mlp_hidden": 344, "max_len": 1024,
}


def add_run_arguments(parser: argparse.ArgumentParser, config_help: str) -> None:
    """The flags every run command shares: ``--config`` (help ``config_help``), ``--out``
    (dest ``out_dir``), ``--resume`` and ``--no-progress`` (dest ``progress``), each None
    when not given so that a config file's value stands, and ``--overwrite`` (never part of
    a config: a copied ``config.json`` must not replace a folder)."""
    parser.add_argument("--config", help=config_help)
    parser.add_argument("--out", dest="out_dir", help="run folder (checkpoints, metrics.jsonl)")
    parser.add_argument("--resume", action="store_true", default=None,
                        help="continue from the latest checkpoint in --out")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                        help="no progress bar")
    parser.add_argument("--overwrite", action="store_true",
                        help="remove --out first (a folder that is not an lcjax run is "
                        "refused without it)")


def add_field_flags(parser, fields: dict[str, type], defaults, *,
                    notes: dict[str, str] | None = None) -> None:
    """One ``--field-name TYPE`` flag (dest ``field_name``, default None) per entry of
    ``fields`` (field -> int / float / str), its help the value on ``defaults``."""
    notes = notes or {}
    for name, typ in fields.items():
        parser.add_argument("--" + name.replace("_", "-"), type=typ, dest=name,
                            metavar=typ.__name__.upper(),
                            help=f"default {getattr(defaults, name)}" + notes.get(name, ""))


def read_config(path: str | None, sections: tuple[str, ...]) -> dict:
    """The JSON object of a ``--config`` file (``{}`` for None).

    Raises:
      ValueError: a top-level key outside ``sections``.
    """
    if not path:
        return {}
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    unknown = set(spec) - set(sections)
    if unknown:
        raise ValueError(f"{path}: unknown sections {sorted(unknown)}")
    return spec


def merge_flags(fields: dict, args: argparse.Namespace, names, cls, what: str) -> dict:
    """``fields`` (a config file's section) updated with the flags ``names`` of ``args``
    that were given (not None).

    Raises:
      ValueError: a resulting key that is not a field of the dataclass ``cls``.
    """
    out = dict(fields)
    out.update({k: v for k in names if (v := getattr(args, k, None)) is not None})
    unknown = set(out) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"unknown {what} fields {sorted(unknown)}")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``lcjax train`` flags to ``parser``."""
    add_run_arguments(parser, "JSON file: {'model': {...}, 'train': {...}}")
    parser.add_argument("--document-mask", dest="document_mask", action="store_true",
                        default=None, help="attention stays inside each packed document")
    parser.add_argument("--mesh", help="device mesh, e.g. data=2,context=4: batch sharded on "
                        "data, sequence on context (default: one device)")
    dist = parser.add_argument_group("multi-process (jax.distributed)")
    dist.add_argument("--coordinator", help="host:port of process 0 (env LCJAX_COORDINATOR)")
    dist.add_argument("--num-processes", type=int, metavar="INT",
                      help="number of processes (env LCJAX_NUM_PROCESSES)")
    dist.add_argument("--process-id", type=int, metavar="INT",
                      help="this process, 0 .. N-1 (env LCJAX_PROCESS_ID)")
    dist.add_argument("--distributed", action="store_true",
                      help="let JAX detect the cluster (TPU pod slice, SLURM, ...)")
    add_field_flags(parser, _TRAIN_FLAGS, TrainConfig(), notes={"eval_batches": " (-1: all)"})
    model = parser.add_argument_group("model (lcjax.nn.DecoderConfig)")
    for name, typ in _MODEL_FLAGS.items():
        model.add_argument("--" + name.replace("_", "-"), type=typ, dest="model_" + name,
                           metavar=typ.__name__.upper(), help=f"default {DEFAULT_MODEL.get(name)}"
                           if name in DEFAULT_MODEL else None)


def _model_config(fields: dict):
    import jax.numpy as jnp

    from lcjax.nn import DecoderConfig

    fields = dict(fields)
    for key in ("dtype", "param_dtype"):
        if isinstance(fields.get(key), str):
            fields[key] = jnp.dtype(fields[key])
    return DecoderConfig(**fields)


def configs_from_args(args: argparse.Namespace) -> tuple[dict, TrainConfig]:
    """(model config fields, TrainConfig) from ``--config`` then the flags."""
    spec = read_config(args.config, ("model", "train"))
    model = {**DEFAULT_MODEL, **spec.get("model", {})}
    model.update({k: v for k in _MODEL_FLAGS if (v := getattr(args, "model_" + k)) is not None})
    flags = [*_TRAIN_FLAGS, "out_dir", "resume", "progress", "document_mask", "mesh"]
    train_fields = merge_flags(spec.get("train", {}), args, flags, TrainConfig, "train")
    if (train_fields.get("eval_batches") or 0) < 0:
        train_fields["eval_batches"] = None
    return model, TrainConfig(**train_fields)


def initialize_distributed(args: argparse.Namespace) -> bool:
    """Starts the multi-process runtime from the flags (or the environment); True if the
    run has several processes (see :func:`lcjax.parallel.distributed.initialize`)."""
    from lcjax.parallel import distributed

    return distributed.initialize(
        getattr(args, "coordinator", None), getattr(args, "num_processes", None),
        getattr(args, "process_id", None), auto=bool(getattr(args, "distributed", False)))


def run(args: argparse.Namespace) -> int:
    """Runs ``lcjax train``; returns the exit status."""
    model_fields, cfg = configs_from_args(args)
    initialize_distributed(args)
    result = train(_model_config(model_fields), cfg, overwrite=args.overwrite)
    tps = result.tokens_per_s
    final = {"step": result.step, "tokens_per_s": None if tps != tps else round(tps, 1)}
    if result.history:
        final["loss"] = result.history[-1]["loss"]
    if result.evals:
        final.update(result.evals[-1])
    import jax

    if jax.process_index() == 0:
        print(json.dumps(final))
    return 0
