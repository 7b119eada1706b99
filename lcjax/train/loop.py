"""Training loop for next-token language models on packed byte data.

AdamW (decoupled weight decay on matrices only) after global-norm clipping, with
linear warmup then cosine decay. The learning rate of update ``k = 1..S`` is::

    lr_k = lr * k / W                                                 k <= W
    lr_k = lr_end + (lr - lr_end) * (1 + cos(pi * (k - W) / (S - W))) / 2      k > W

with ``W = warmup_steps``, ``S = steps`` and ``lr_end = lr * min_lr_ratio``.
The step is one ``jax.jit``-compiled pure function over ``nnx.split`` state
(parameters, other model state, optax state) whose buffers are donated. A run
with ``out_dir`` checkpoints everything, including the grain iterator state, so
a resumed run reproduces the uninterrupted one bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from lcjax.data import pipeline, tokenizer
from lcjax.data.corpus import shakespeare_split
from lcjax.train import checkpoint, metrics


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of a run. ``batch_size`` is global; ``seq_len`` is ``T``."""

    steps: int = 1000
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 3e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    seed: int = 0  # model initialisation
    data_seed: int = 0  # shuffle order of the training windows
    heldout_fraction: float = 0.1  # of Shakespeare works, when no docs are given
    split_seed: int = 0
    eval_every: int = 0  # 0: evaluate only after the last step
    eval_batches: int | None = 16  # None: the whole held-out set
    log_every: int = 10  # host syncs (history, JSONL, progress bar) every this many steps
    ckpt_every: int = 0  # 0: checkpoint only at the end (or where the run stops)
    keep_checkpoints: int = 3
    out_dir: str | None = None  # checkpoints/ and metrics.jsonl; None: neither
    resume: bool = False
    progress: bool = True

    def __post_init__(self):
        for name in ("steps", "batch_size", "seq_len", "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1; got {getattr(self, name)}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(
                f"need 0 <= warmup_steps < steps; got warmup_steps={self.warmup_steps}, "
                f"steps={self.steps}"
            )


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
      history: one record per step run in this call: ``step`` (1-based update
        number), ``loss`` (nats/token), ``lr``, ``grad_norm``.
      evals: held-out records: ``step``, ``eval_loss``, ``eval_bpb``, ``eval_tokens``.
      step: the last completed step.
      model: the trained model.
      tokens_per_s: training throughput over the steps after the first log interval
        (which includes compilation); NaN when there were none.
    """

    history: list[dict]
    evals: list[dict]
    step: int
    model: nnx.Module
    tokens_per_s: float = math.nan

    @property
    def losses(self) -> list[float]:
        """Per-step training losses, in step order."""
        return [r["loss"] for r in self.history]


OPT_FIELDS = ("lr", "warmup_steps", "steps", "min_lr_ratio", "weight_decay", "b1", "b2", "eps",
              "grad_clip")


def optimizer_hparams(cfg: TrainConfig) -> dict[str, float]:
    """The optimizer's hyper-parameters, as float32 scalars for the jitted step."""
    return {k: np.float32(getattr(cfg, k)) for k in OPT_FIELDS}


def cosine_lr(k, *, lr, warmup_steps, steps, min_lr_ratio):
    """Learning rate of update ``k`` (1-based; scalar or array): linear warmup, cosine decay.

    Traceable: the hyper-parameters may be traced scalars.
    """
    k = jnp.asarray(k, jnp.float32)
    end = lr * min_lr_ratio
    frac = jnp.clip((k - warmup_steps) / jnp.maximum(steps - warmup_steps, 1), 0.0, 1.0)
    cosine = end + (lr - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
    return jnp.where(k <= warmup_steps, lr * k / jnp.maximum(warmup_steps, 1), cosine)


def lr_schedule(cfg: TrainConfig) -> Callable[[Any], jax.Array]:
    """``k -> lr_k`` for updates ``k = 1..steps`` (see the module docstring)."""
    hp = optimizer_hparams(cfg)
    keys = ("lr", "warmup_steps", "steps", "min_lr_ratio")
    return lambda k: cosine_lr(k, **{n: hp[n] for n in keys})


def make_optimizer(
    *, lr, warmup_steps, steps, min_lr_ratio, weight_decay, b1, b2, eps, grad_clip
) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW with :func:`cosine_lr` (decay on ndim >= 2 only).

    The arguments may be traced scalars (``**optimizer_hparams(cfg)`` inside jit):
    the state's structure does not depend on their values, so one compiled step
    serves every setting.
    """
    sched = lambda count: cosine_lr(  # optax counts completed updates from 0
        count + 1, lr=lr, warmup_steps=warmup_steps, steps=steps, min_lr_ratio=min_lr_ratio
    )
    return optax.chain(
        optax.clip_by_global_norm(grad_clip),
        optax.adamw(
            sched, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
            mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p),
        ),
    )


def make_train_step(graphdef: nnx.GraphDef) -> Callable:
    """Jitted ``(params, rest, opt_state, batch, hparams) -> (params, rest, opt_state, stats)``.

    ``batch`` holds int32 ``inputs`` and ``targets`` ``[B, T]``; ``hparams`` is
    :func:`optimizer_hparams`; ``stats`` holds scalar ``loss`` (mean nats over
    real targets) and ``grad_norm`` (before clipping). The first three arguments
    are donated.
    """

    def step(params, rest, opt_state, batch, hparams):
        model = nnx.merge(graphdef, params, rest)
        loss_fn = lambda m: metrics.mean_loss(m(batch["inputs"]), batch["targets"])
        loss, grads = nnx.value_and_grad(loss_fn)(model)  # carries RNG-count updates
        _, params, rest = nnx.split(model, nnx.Param, ...)
        tx = make_optimizer(**hparams)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, rest, opt_state, {"loss": loss, "grad_norm": optax.global_norm(grads)}

    return jax.jit(step, donate_argnums=(0, 1, 2))


def make_eval_step(graphdef: nnx.GraphDef) -> Callable:
    """Jitted ``(params, rest, batch) -> (sum_nats, num_real_tokens)`` (float32, int32).

    The model runs in evaluation mode (``model.eval()``: no dropout).
    """

    def step(params, rest, batch):
        model = nnx.merge(graphdef, params, rest)
        model.eval()
        logits = model(batch["inputs"])
        nll, mask = metrics.token_nll(logits, batch["targets"])
        return nll.sum(), mask.sum()

    return jax.jit(step)


@functools.lru_cache(maxsize=16)
def _compiled(graphdef: nnx.GraphDef) -> tuple[Callable, Callable]:
    """(train_step, eval_step) shared by all runs of one model: each shape compiles once."""
    return make_train_step(graphdef), make_eval_step(graphdef)


def _pad_batch(batch: dict, rows: int) -> dict:
    """Pads a short last batch to ``rows`` rows of PAD (which carry no targets)."""
    n = batch["inputs"].shape[0]
    if n == rows:
        return batch
    pad = ((0, rows - n), (0, 0))
    return {k: np.pad(v, pad, constant_values=tokenizer.PAD) for k, v in batch.items()}


def evaluate(
    eval_step: Callable,
    params: Any,
    rest: Any,
    dataset: Any,
    *,
    batch_size: int,
    max_batches: int | None = None,
) -> dict:
    """Held-out loss over ``dataset`` (at most ``max_batches`` batches).

    Returns:
      ``{"eval_loss": nats/token, "eval_bpb": bits/byte, "eval_tokens": count}``.
    """
    total, count = 0.0, 0
    for i, batch in enumerate(dataset):
        if max_batches is not None and i >= max_batches:
            break
        s, c = jax.device_get(eval_step(params, rest, _pad_batch(batch, batch_size)))
        total, count = total + float(s), count + int(c)
    return {
        "eval_loss": total / max(count, 1),
        "eval_bpb": metrics.bits_per_byte(total, count),
        "eval_tokens": count,
    }


def _jsonable(x: Any) -> Any:
    """``x`` with anything JSON cannot hold (dtypes, callables, ...) as its string."""
    if isinstance(x, dict) or type(x).__name__ == "FrozenDict":
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, bool | int | float | str):
        return x
    try:
        return str(np.dtype(x))
    except TypeError:
        return getattr(x, "__name__", repr(x))


def config_dict(cfg: Any) -> Any:
    """A JSON-ready dict of a config dataclass (dtypes and callables by name)."""
    if dataclasses.is_dataclass(cfg):
        return _jsonable({f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    return _jsonable(cfg)


def _default_model_fn(model_cfg: Any, rngs: nnx.Rngs) -> nnx.Module:
    from lcjax.nn import DecoderLM  # imported here: lcjax.nn is optional for the loop

    return DecoderLM(model_cfg, rngs=rngs)


def _check_model_cfg(model_cfg: Any, cfg: TrainConfig) -> None:
    vocab = getattr(model_cfg, "vocab_size", tokenizer.VOCAB_SIZE)
    if vocab < tokenizer.VOCAB_SIZE:
        raise ValueError(f"model vocab_size={vocab} < byte tokenizer's {tokenizer.VOCAB_SIZE}")


def train(
    model_cfg: Any,
    cfg: TrainConfig,
    *,
    train_docs: Sequence[pipeline.DocLike] | None = None,
    eval_docs: Sequence[pipeline.DocLike] | None = None,
    model_fn: Callable[[Any, nnx.Rngs], nnx.Module] | None = None,
    stop_at: int | None = None,
) -> TrainResult:
    """Trains a language model on packed byte windows; resumes from ``cfg.out_dir``.

    Args:
      model_cfg: the model's config (e.g. ``lcjax.nn.DecoderConfig``).
      cfg: the run's hyper-parameters.
      train_docs, eval_docs: documents; both None = the Shakespeare split
        ``shakespeare_split(cfg.heldout_fraction, cfg.split_seed)``. Empty or None
        ``eval_docs`` (with ``train_docs`` given) disables evaluation.
      model_fn: ``(model_cfg, rngs) -> module`` mapping int ``[B, T]`` tokens to
        logits ``[B, T, V]``; default ``lcjax.nn.DecoderLM``.
      stop_at: stop (and checkpoint) after this step though the schedule runs
        to ``cfg.steps`` — what an interrupted run does.

    Returns:
      A :class:`TrainResult`.
    """
    _check_model_cfg(model_cfg, cfg)
    if jax.process_count() > 1:  # the pipeline shards by process; global batches are not built
        raise NotImplementedError("train() runs in one process; see lcjax.data.make_dataset")
    if train_docs is None and eval_docs is None:
        train_docs, eval_docs = shakespeare_split(cfg.heldout_fraction, cfg.split_seed)
    last = cfg.steps if stop_at is None else min(stop_at, cfg.steps)

    model = (model_fn or _default_model_fn)(model_cfg, nnx.Rngs(cfg.seed))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    train_step, eval_step = _compiled(graphdef)
    hparams = optimizer_hparams(cfg)
    tx = make_optimizer(**hparams)
    opt_state = tx.init(params)
    train_ds = pipeline.make_dataset(
        train_docs, seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.data_seed
    )
    data_state, step = None, 0

    manager = None
    if cfg.out_dir is not None:
        manager = checkpoint.checkpoint_manager(
            os.path.join(cfg.out_dir, "checkpoints"), max_to_keep=cfg.keep_checkpoints
        )
        if cfg.resume:
            restored = checkpoint.restore_checkpoint(
                manager, params=params, rest=rest, opt_state=opt_state
            )
            if restored is not None:
                params, rest, opt_state = (restored[k] for k in ("params", "rest", "opt_state"))
                data_state, step = restored["data_state"], restored["step"]
    meta = {"model_config": config_dict(model_cfg), "train_config": config_dict(cfg)}
    log_path = None if cfg.out_dir is None else os.path.join(cfg.out_dir, "metrics.jsonl")

    data_it = pipeline.make_iterator(train_ds, data_state)
    sched = lr_schedule(cfg)
    eval_ds = None
    if eval_docs and cfg.eval_batches != 0:
        eval_ds = pipeline.make_dataset(
            eval_docs, seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.data_seed,
            num_epochs=1, drop_remainder=False,
        )
    local_batch = cfg.batch_size // jax.process_count()

    history, evals, pending = [], [], []
    timed_tokens, timed_s = 0, 0.0
    t0, first_flush = time.perf_counter(), True
    bar = tqdm(total=cfg.steps, initial=step, disable=not cfg.progress, desc="train")

    def flush():
        nonlocal t0, first_flush, timed_tokens, timed_s
        if not pending:
            return
        stats = jax.device_get([s for _, s in pending])
        dt = time.perf_counter() - t0
        tokens = len(pending) * cfg.batch_size * cfg.seq_len
        tps = tokens / dt
        if not first_flush:  # the first interval includes compilation
            timed_tokens, timed_s = timed_tokens + tokens, timed_s + dt
        lrs = np.asarray(sched(np.array([k for k, _ in pending])))
        records = [
            {"step": k, "loss": float(s["loss"]), "lr": float(lr),
             "grad_norm": float(s["grad_norm"]), "tokens_per_s": tps}
            for (k, _), s, lr in zip(pending, stats, lrs)
        ]
        history.extend(records)
        if log_path and jax.process_index() == 0:
            metrics.append_jsonl(log_path, records)
        bar.update(len(pending))
        bar.set_postfix(loss=f"{records[-1]['loss']:.4f}", tok_s=f"{tps:.3g}")
        pending.clear()
        t0, first_flush = time.perf_counter(), False

    while step < last:
        batch = next(data_it)
        params, rest, opt_state, stats = train_step(params, rest, opt_state, batch, hparams)
        step += 1
        pending.append((step, stats))
        if step % cfg.log_every == 0 or step == last:
            flush()
        at_end = step == cfg.steps
        if eval_ds is not None and (at_end or (cfg.eval_every and step % cfg.eval_every == 0)):
            flush()
            record = {"step": step, **evaluate(
                eval_step, params, rest, eval_ds, batch_size=local_batch,
                max_batches=cfg.eval_batches,
            )}
            evals.append(record)
            if log_path and jax.process_index() == 0:
                metrics.append_jsonl(log_path, [record])
            bar.write(json.dumps(record))
            t0 = time.perf_counter()
        if manager is not None and (
            step == last or (cfg.ckpt_every and step % cfg.ckpt_every == 0)
        ):
            flush()
            checkpoint.save_checkpoint(
                manager, step, params=params, rest=rest, opt_state=opt_state,
                data_state=data_it.get_state(), meta=meta,
            )
            t0 = time.perf_counter()
    flush()
    bar.close()
    if manager is not None:
        manager.close()
    tps = timed_tokens / timed_s if timed_s > 0 else math.nan
    return TrainResult(history, evals, step, nnx.merge(graphdef, params, rest), tps)
