"""``lcjax train``: train a byte-level DecoderLM on the Shakespeare split or your own text.

    lcjax train --config run.json
    lcjax train --steps 2000 --batch-size 16 --seq-len 256 --d-model 256 --out runs/a
    lcjax train --out runs/a --resume                        # the run's own config.json
    lcjax train --out runs/a --resume --steps 4000           # extend a finished run
    lcjax train --data notes.jsonl --out runs/b              # your text (bytes tokenizer)
    lcjax train --init runs/a --attention performer --attention-options '{"num_features": 32}'
    lcjax train --init hf_model/ --data corpus/ --steps 200 --lr 1e-4 --out runs/ft
    lcjax train --mesh data=2,context=4 ...                  # 8 devices: batch x sequence
    lcjax train --coordinator host0:8476 --num-processes 2 --process-id 0 --mesh ... # each host

The config file is ``{"model": {DecoderConfig fields}, "train": {TrainConfig
fields}, "data": {"path": FILE|DIR|null}, "init": {"path": HF_DIR|RUN|null}}`` (every
section optional); flags override it. ``model.dtype`` / ``param_dtype`` are dtype names
("bfloat16"). Writes ``OUT/checkpoints/``, ``OUT/metrics.jsonl`` and ``OUT/config.json``
(all four sections: a valid ``--config``) and prints the final record as JSON.

``--resume`` continues from the latest complete checkpoint of ``OUT`` with the run's stored
``OUT/config.json`` (then ``--config``, then flags, override it); it fails, naming the fields,
if the model or optimizer/data config then differs from the checkpoint's. ``--steps N`` past
the stored ``steps`` extends the run: the learning-rate schedule is always the one of the
config's ``steps`` (warm-up, then cosine to ``min_lr_ratio·lr`` at step N), so the steps after
the old end follow the longer schedule — a finished run that had decayed steps back up; with
``--min-lr-ratio 1`` an extended run equals one planned at N from the start. The default
warm-up is ``min(100, steps // 10)``, stored in config.json as a number (an extension keeps
it).

``--data FILE|DIR``: plain-text files (one document each) and ``.jsonl`` files (one
document per line, its ``"text"``), tokenized as bytes; ``heldout_fraction`` of the
documents (shuffled by ``split_seed``; of a single document, its tail) is held out for
evaluation. Default: the Shakespeare split. ``--init HF_DIR|RUN`` starts from a Hugging Face
checkpoint folder (``lcjax.interop.hf.load_hf``, float32; its tokenizer must be a byte
tokenizer, e.g. one written by ``save_hf``) or an ``lcjax train --out`` folder
(``load_model``): the architecture is the checkpoint's (only ``--attention``,
``--attention-options`` and ``--max-len`` may change it), the optimizer starts fresh.
``--attention-options JSON``: the variant's keyword options (a JSON object).

User errors (a bad flag value, a missing file, a folder that is not a run, a resume that
contradicts the checkpoint) raise :class:`lcjax.errors.UsageError`: ``lcjax`` prints one line
and exits with status 2. Errors while training keep their traceback.

``--out`` must be new, empty or a run folder; ``--overwrite`` removes it first
(refused together with ``--resume``).

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
import os

from lcjax.attention import AttentionSpec, available, get
from lcjax.data.text_files import read_documents
from lcjax.data.tokenizer import VOCAB_SIZE
from lcjax.errors import UsageError
from lcjax.interop.hf import load_hf
from lcjax.nn import DecoderLM
from lcjax.parallel import distributed
from lcjax.train.checkpoint import check_out_dir, load_model, model_config_from_dict
from lcjax.train.loop import RESUME_FIELDS, TrainConfig, config_dict, train

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
                        help="continue from the latest checkpoint in --out, with the run's "
                        "stored config (flags override it)")
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
        try:
            spec = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: need a JSON object of sections {list(sections)}")
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


# sections of a run's config (``--config`` and ``OUT/config.json``)
SECTIONS = ("model", "train", "data", "init")
# model fields a flag may set on top of an --init checkpoint's architecture
INIT_MODEL_FIELDS = ("attention", "attention_options", "max_len")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``lcjax train`` flags to ``parser``."""
    add_run_arguments(parser, "JSON file: {'model': {...}, 'train': {...}, 'data': {'path': "
                      "...}, 'init': {'path': ...}} (sections optional)")
    parser.add_argument("--data", metavar="FILE|DIR",
                        help="train on your text: plain-text files (one document each) and "
                        ".jsonl files (a \"text\" field per line), bytes tokenizer "
                        "(default: the Shakespeare split)")
    parser.add_argument("--init", metavar="HF_DIR|RUN",
                        help="start from a Hugging Face checkpoint folder or an `lcjax train "
                        "--out` folder (its architecture; fresh optimizer)")
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
    add_field_flags(parser, _TRAIN_FLAGS, TrainConfig(steps=1000), notes={
        "eval_batches": " (-1: all)",
        "steps": "; with --resume past a finished run's steps: extends it, the LR schedule "
                 "becoming the one of the new total (see docs/training.md)",
        "warmup_steps": " at the default --steps (min(100, steps // 10))"})
    model = parser.add_argument_group("model (lcjax.nn.DecoderConfig)")
    for name, typ in _MODEL_FLAGS.items():
        extra = {"choices": available()} if name == "attention" else {}
        model.add_argument("--" + name.replace("_", "-"), type=typ, dest="model_" + name,
                           metavar=typ.__name__.upper() if not extra else None,
                           help=f"default {DEFAULT_MODEL.get(name, 'softmax')}", **extra)
    model.add_argument("--attention-options", dest="model_attention_options", metavar="JSON",
                       help="the attention variant's keyword options, a JSON object, e.g. "
                       "'{\"num_features\": 32}'")


def _json_object(text: str, flag: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{flag}: not JSON ({e.msg} at character {e.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: need a JSON object, got {text!r}")
    return value


def _latest_step(out_dir: str | None) -> int | None:
    """The latest complete checkpoint step in ``OUT/checkpoints`` (orbax names each step's
    folder by its number; temporary folders are not numbers), or None."""
    folder = os.path.join(out_dir or "", "checkpoints")
    if not out_dir or not os.path.isdir(folder):
        return None
    steps = [int(d) for d in os.listdir(folder) if d.isdigit()]
    return max(steps) if steps else None


def _read_config(path: str | None) -> dict:
    """:func:`read_config` of :data:`SECTIONS`, its errors as :class:`UsageError`."""
    try:
        spec = read_config(path, SECTIONS)
    except (OSError, ValueError) as e:
        raise UsageError(f"--config: {e}") from None
    for name, section in spec.items():
        if not isinstance(section, dict):
            raise UsageError(f"{path}: section {name!r} must be a JSON object")
    return spec


def stored_config(out_dir: str | None) -> dict:
    """The sections of the run ``OUT/config.json`` that ``--resume`` continues."""
    if not out_dir:
        raise UsageError("--resume needs --out DIR (the run to continue)")
    path = os.path.join(out_dir, "config.json")
    if not os.path.isfile(path):
        raise UsageError(f"--resume: {out_dir!r} is not an lcjax train run (no config.json); "
                         "train into it without --resume")
    spec = _read_config(path)
    if not isinstance(spec.get("model"), dict) or not isinstance(spec.get("train"), dict):
        raise UsageError(f"--resume: {path} has no 'model' and 'train' sections (not written "
                         "by lcjax train)")
    return spec


def run_spec(args: argparse.Namespace) -> dict:
    """The run's sections (:data:`SECTIONS`): the stored config on ``--resume``, then
    ``--config``, then the flags. The model section holds only what was given (no
    defaults)."""
    if getattr(args, "out_dir", None):  # a folder that is not a run: refused before reading
        check_out_dir(args.out_dir, resume=bool(getattr(args, "resume", None)),
                      overwrite=bool(getattr(args, "overwrite", False)))
    base = stored_config(args.out_dir) if getattr(args, "resume", None) else {}
    spec = _read_config(args.config)
    merged = {s: {**base.get(s, {}), **spec.get(s, {})} for s in SECTIONS}
    merged["model"].update({k: v for k in _MODEL_FLAGS
                            if (v := getattr(args, "model_" + k, None)) is not None})
    if (options := getattr(args, "model_attention_options", None)) is not None:
        merged["model"]["attention_options"] = _json_object(options, "--attention-options")
    flags = [*_TRAIN_FLAGS, "out_dir", "resume", "progress", "document_mask", "mesh"]
    try:
        merged["train"] = merge_flags(merged["train"], args, flags, TrainConfig, "train")
    except ValueError as e:
        raise UsageError(str(e)) from None
    if (merged["train"].get("eval_batches") or 0) < 0:
        merged["train"]["eval_batches"] = None
    for section, flag in (("data", "data"), ("init", "init")):
        if (value := getattr(args, flag, None)) is not None:
            merged[section]["path"] = os.path.abspath(value)
    return merged


def _check_attention(fields: dict) -> None:
    """Unknown variant names or option names, before anything is built."""
    names = fields.get("attention", "softmax")
    options = fields.get("attention_options") or {}
    for name, opts in zip(*((names, options) if isinstance(names, list | tuple)
                            else ([names], [options]))):
        if not isinstance(name, str):
            continue
        if name not in available():
            raise UsageError(f"unknown attention {name!r}; choose one of {available()}")
        fn = get(name)
        if isinstance(fn, AttentionSpec):
            unknown = sorted(o for o in opts if not any(i.takes(o) for i in fn.implementations))
            if unknown:
                known = sorted({o for i in fn.implementations for o in (i.options or ())})
                raise UsageError(f"--attention-options: {name!r} takes no option(s) {unknown}; "
                                 f"it takes {known}")


def _model_config(fields: dict):
    try:
        return model_config_from_dict(fields)
    except (TypeError, ValueError) as e:
        raise UsageError(f"model config: {e}") from None


def configs_from_args(args: argparse.Namespace) -> tuple[dict, TrainConfig]:
    """(model config fields, TrainConfig) from the stored config (``--resume``), ``--config``
    and the flags; the model fields start from :data:`DEFAULT_MODEL` (not for ``--init``:
    :func:`run` takes the checkpoint's)."""
    spec = run_spec(args)
    # a resumed run's stored model section is complete: no defaults under it
    model = dict(spec["model"]) if getattr(args, "resume", None) else {
        **DEFAULT_MODEL, **spec["model"]}
    try:
        cfg = TrainConfig(**spec["train"])
    except (TypeError, ValueError) as e:
        raise UsageError(f"train config: {e}") from None
    return model, cfg


def split_documents(docs: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, held-out) documents: ``round(fraction · n)`` documents (at least one when
    ``fraction > 0``, at most n − 1) chosen by ``seed``; a single document gives its tail
    ``fraction`` (of its bytes or characters) to held-out."""
    import numpy as np

    if fraction <= 0:
        return list(docs), []
    if len(docs) == 1:
        cut = int(round(len(docs[0]) * (1 - fraction)))
        return ([docs[0][:cut]], [docs[0][cut:]]) if 0 < cut < len(docs[0]) else (docs, [])
    order = np.random.default_rng(seed).permutation(len(docs))
    n_eval = min(max(1, round(fraction * len(docs))), len(docs) - 1)
    return [docs[i] for i in order[n_eval:]], [docs[i] for i in order[:n_eval]]


def _check_byte_tokenizer(path: str) -> None:
    """An HF folder with a tokenizer other than the byte tokenizer (``save_hf``'s) cannot
    be trained on byte ids."""
    tok_cfg = os.path.join(path, "tokenizer_config.json")
    if not (os.path.isfile(tok_cfg) or os.path.isfile(os.path.join(path, "tokenizer.json"))):
        return
    with open(tok_cfg, encoding="utf-8") if os.path.isfile(tok_cfg) else open(os.devnull) as f:
        text = f.read()
    if not text or json.loads(text).get("lcjax_tokenizer") != "bytes":
        raise UsageError(f"--init: {path!r} has its own tokenizer; lcjax train tokenizes "
                         "--data as bytes, which would be meaningless ids for it (fine-tune "
                         "with the Python API, train(dataset=...), on its tokens)")


def init_model(path: str, overrides: dict):
    """The model to start from: an HF checkpoint folder (``config.json`` with a
    ``model_type``) or an ``lcjax train --out`` folder, with ``overrides``
    (:data:`INIT_MODEL_FIELDS`) applied."""
    from flax import nnx

    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UsageError(f"--init: {path!r} is neither a Hugging Face checkpoint folder nor an "
                         "lcjax train run (no config.json)")
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        found = json.load(f)
    if "model_type" in found:
        import jax.numpy as jnp

        _check_byte_tokenizer(path)
        return load_hf(path, dtype=jnp.float32, **overrides)[0]
    if "model" not in found:
        raise UsageError(f"--init: {path}/config.json has neither 'model_type' (Hugging Face) "
                         "nor 'model' (lcjax train run)")

    try:
        model = load_model(path, attention=overrides.get("attention"))
    except ValueError as e:
        raise UsageError(f"--init: {e}") from None
    rest = {k: v for k, v in overrides.items() if k != "attention"}
    if not rest:
        return model
    new = DecoderLM(_model_config({**config_dict(model.config), **rest}), rngs=nnx.Rngs(0))
    nnx.update(new, nnx.state(model))
    return new


def _resume_conflicts(stored: dict, model: dict, cfg: TrainConfig) -> list[str]:
    """Fields in which this resume would differ from the stored run (what the checkpoint's
    own check would refuse later, said before anything is built)."""
    now = json.loads(json.dumps({"model": config_dict(_model_config(model)),
                                 "train": config_dict(cfg)}))
    names = {"model": sorted(set(stored["model"]) | set(now["model"])),
             "train": RESUME_FIELDS["train_config"]}
    return [f"{s}.{k}: stored {stored[s].get(k)!r}, now {now[s].get(k)!r}"
            for s, keys in names.items() for k in keys
            if k in stored[s] and stored[s].get(k) != now[s].get(k)]


def initialize_distributed(args: argparse.Namespace) -> bool:
    """Starts the multi-process runtime from the flags (or the environment); True if the
    run has several processes (see :func:`lcjax.parallel.distributed.initialize`)."""
    return distributed.initialize(
        getattr(args, "coordinator", None), getattr(args, "num_processes", None),
        getattr(args, "process_id", None), auto=bool(getattr(args, "distributed", False)))


def run(args: argparse.Namespace) -> int:
    """Runs ``lcjax train``; returns the exit status."""
    spec = run_spec(args)
    model_fields, cfg = configs_from_args(args)
    init_path, data_path = spec["init"].get("path"), spec["data"].get("path")
    latest = _latest_step(cfg.out_dir)
    if latest is not None and not cfg.resume and not args.overwrite:
        raise UsageError(f"{cfg.out_dir!r} holds a run (checkpoint at step {latest}): continue "
                         "it with --resume, or train into a fresh --out")
    if latest is not None and latest > cfg.steps and not args.overwrite:
        raise UsageError(f"--steps {cfg.steps}: the run is already at step {latest} (a resume "
                         "may extend a run, not shorten it)")
    model_fn = None
    if init_path is not None and latest is None:  # a resume with a checkpoint restores it
        if not cfg.resume:
            extra = sorted(set(spec["model"]) - set(INIT_MODEL_FIELDS))
            if extra:
                raise UsageError(f"--init: the architecture is the checkpoint's; only "
                                 f"{list(INIT_MODEL_FIELDS)} may be set, not {extra}")
        _check_attention({**spec["model"]})
        overrides = {k: spec["model"][k] for k in INIT_MODEL_FIELDS if k in spec["model"]}
        start = init_model(init_path, overrides)
        model_fields = config_dict(start.config)
        model_fn = lambda _cfg, _rngs: start  # noqa: E731
    _check_attention(model_fields)
    model_cfg = _model_config(model_fields)
    if cfg.resume and os.path.isfile(os.path.join(cfg.out_dir or "", "config.json")):
        conflicts = _resume_conflicts(stored_config(cfg.out_dir), model_fields, cfg)
        if conflicts:
            raise UsageError("--resume: these settings differ from the run's ("
                             + "; ".join(conflicts) + "); drop the flags or use a fresh --out")
    docs = {}
    if data_path is not None:
        try:
            documents = read_documents(data_path)
        except (OSError, ValueError) as e:
            raise UsageError(f"--data: {e}") from None
        docs = dict(zip(("train_docs", "eval_docs"),
                        split_documents(documents, cfg.heldout_fraction, cfg.split_seed)))
    initialize_distributed(args)
    result = train(model_cfg, cfg, model_fn=model_fn, **docs, overwrite=args.overwrite,
                   extra_config={"data": spec["data"], "init": spec["init"]})
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
