"""The one training loop: packed documents or any dataset of batch dicts, a loss hook and
an eval hook, gradient accumulation, exact orbax resume. See ``docs/training.md``.

    train(model_cfg, cfg, train_docs=docs)                      # packed byte windows
    train(model_cfg, cfg, dataset=ds, loss_fn=my_loss)          # any batches, any loss

A batch is a dict of arrays whose leading axis is the batch: int ``inputs`` and
``targets`` ``[B, T]`` (PAD targets carry no loss), optional bool ``loss_mask``, float
``weights``, int ``positions`` and ``segment_ids`` ``[B, T]`` (negative = padding), and
any other keys the loss hook reads. ``loss_fn(model, batch, rng) -> (loss, metrics)``
(default :func:`lcjax.train.metrics.nll_loss`, the weighted mean NLL) is differentiated;
the loss logged at step ``k`` is the one computed before update ``k``. ``metrics`` are
scalars (or ``(value, weight)`` pairs) logged under their own names;
``metrics["loss_weight"]``, if given, is the normaliser of the loss, used to combine
micro-batches and eval batches exactly.

Optimizer: AdamW (decoupled weight decay on matrices only) after global-norm clipping,
with linear warmup then cosine decay. The learning rate of update ``k = 1..S`` is::

    lr_k = lr * k / W                                                 k <= W
    lr_k = lr_end + (lr - lr_end) * (1 + cos(pi * (k - W) / (S - W))) / 2      k > W

with ``W = warmup_steps`` (default ``min(100, S // 10)``), ``S = steps`` and
``lr_end = lr * min_lr_ratio``. A resume may raise ``steps`` (extend a finished run): the
schedule is always the one of the config's ``steps``, so updates after the old end follow
the cosine over the new ``S`` (a run that had decayed to ``lr_end`` steps back up to
``lr_{k}`` of the longer schedule); with ``min_lr_ratio = 1`` (constant after warm-up) the
extended run equals one planned at the new length from the start.
The step is one ``jax.jit``-compiled pure function over ``nnx.split`` state
(parameters, other model state, optax state) whose buffers are donated; with
``grad_accum = N`` it splits each batch into N micro-batches of consecutive rows and
scans over them, so the update equals that of the whole batch. A run with ``out_dir``
checkpoints everything, including the dataset iterator state, so a resumed run
reproduces the uninterrupted one bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm.auto import tqdm

from lcjax.data import pipeline, tokenizer
from lcjax.data.corpus import shakespeare_split
from lcjax.nn import DecoderLM  # imported here: lcjax.nn is optional for the loop
from lcjax.parallel import distributed
from lcjax.parallel.mesh import CONTEXT, DATA, make_mesh, mesh_size, parse_mesh
from lcjax.train import checkpoint, metrics

LossFn = Callable[[nnx.Module, dict, jax.Array], tuple[jax.Array, Mapping[str, jax.Array]]]
# names a loss hook's metrics may not take: the loop's own record fields
RESERVED_METRICS = ("step", "loss", "lr", "grad_norm", "tokens_per_s")
# keys of the batch schema that have the shape [B, T] of ``inputs``
BATCH_KEYS = ("inputs", "targets", "loss_mask", "weights", "positions", "segment_ids")
_TRAIN_RNG, _EVAL_RNG = 0x7472, 0x6576  # fold_in salts of the hooks' rng streams


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of a run. ``batch_size`` is global; ``seq_len`` is ``T``.

    ``batch_size``, ``seq_len``, ``data_seed``, ``heldout_fraction``, ``split_seed`` and
    ``document_mask`` shape the packed-documents path; a ``dataset=`` decides its own
    batches. ``grad_accum`` splits every batch into that many micro-batches.
    """

    steps: int = 1000
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 3e-3
    warmup_steps: int | None = None  # None: min(100, steps // 10)
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
    grad_accum: int = 1  # micro-batches per update: each batch is split into this many
    document_mask: bool = False  # packed documents: attention stays inside each document
    # "data=2,context=4": batch rows sharded on "data", the sequence on "context" (params
    # replicated); None: one device (several processes: data over every device)
    mesh: str | None = None

    def __post_init__(self):
        for name in ("steps", "batch_size", "seq_len", "log_every", "keep_checkpoints",
                     "grad_accum"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1; got {getattr(self, name)}")
        if self.warmup_steps is None:
            object.__setattr__(self, "warmup_steps", default_warmup(self.steps))
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(
                f"need 0 <= warmup_steps < steps; got warmup_steps={self.warmup_steps}, "
                f"steps={self.steps}"
            )
        if self.mesh is not None:
            parse_mesh(self.mesh)  # ValueError for a malformed spec, before anything runs


def default_warmup(steps: int) -> int:
    """The warm-up of a config that names none: ``min(100, steps // 10)`` (valid for any
    ``steps >= 1``)."""
    return min(100, steps // 10)


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
      history: one record per step run in this call: ``step`` (1-based update
        number), ``loss`` (the loss hook's value before the update; nats/token by
        default), the hook's metrics under their own names, ``lr``, ``grad_norm``,
        ``tokens_per_s``.
      evals: held-out records: ``step``, ``eval_loss``, ``eval_tokens`` (real targets),
        ``eval_bpb`` (default eval hook only) and ``eval_<name>`` per eval metric.
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
# what a resume must share with the checkpoint: section of the meta -> fields (None: all)
RESUME_FIELDS = {
    "model_config": None,
    "params": None,
    # not "steps": a resume may extend the schedule (module docstring)
    "train_config": (*(f for f in OPT_FIELDS if f != "steps"), "seed", "data_seed",
                     "batch_size", "seq_len", "document_mask", "heldout_fraction",
                     "split_seed"),
}


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


def _value_and_grad(loss_fn: LossFn, graphdef, params, rest, batch, rng, wrt=nnx.Param):
    """``(loss, metrics, new_rest, grads)`` of ``loss_fn`` at ``params`` (grads w.r.t. them:
    the variables that the nnx filter ``wrt`` selects)."""
    model = nnx.merge(graphdef, params, rest)

    def f(m):
        loss, mets = loss_fn(m, batch, rng)
        return loss, _check_metrics(loss, mets)

    (loss, mets), grads = nnx.value_and_grad(  # carries RNG counts
        f, has_aux=True, argnums=nnx.DiffState(0, wrt))(model)
    _, _, rest = nnx.split(model, wrt, ...)
    return loss.astype(jnp.float32), mets, rest, grads


def _check_metrics(loss: Any, mets: Any) -> dict[str, tuple[jax.Array, jax.Array | None]]:
    """The hook's metrics as ``name -> (value, weight or None)``, float32 scalars.

    A metric is a scalar (combined over micro-batches and eval batches with the
    ``loss_weight``) or a ``(value, weight)`` pair (combined with its own weight).
    TypeError/ValueError for a malformed hook result.
    """
    if jnp.shape(loss) != ():
        raise ValueError(f"the loss hook must return a scalar loss; got shape {jnp.shape(loss)}")
    if not isinstance(mets, Mapping):
        raise TypeError(f"the loss hook must return (loss, metrics: dict); got {type(mets)}")
    out = {}
    for k, v in mets.items():
        if not isinstance(k, str) or k in RESERVED_METRICS:
            raise ValueError(f"metric name {k!r} is reserved or not a string "
                             f"(reserved: {RESERVED_METRICS})")
        v, w = v if isinstance(v, tuple | list) and k != metrics.LOSS_WEIGHT else (v, None)
        if jnp.shape(v) != () or (w is not None and jnp.shape(w) != ()):
            raise ValueError(f"metric {k!r} must be a scalar or a (scalar, weight) pair")
        f32 = lambda x: lax.stop_gradient(jnp.asarray(x).astype(jnp.float32))
        out[k] = (f32(v), None if w is None else f32(w))
    return out


def _accumulate(loss_fn: LossFn, graphdef, params, rest, batch, rng, n: int, wrt=nnx.Param):
    """:func:`_value_and_grad` over ``n`` micro-batches (consecutive rows), combined exactly.

    Micro-batch ``i`` (rng ``fold_in(rng, i)``) weighs ``w_i = metrics["loss_weight"]``
    (1 if absent): loss, metrics and gradients are ``sum_i w_i x_i / sum_i w_i``, which
    for a loss normalised by ``w_i`` is the loss of the whole batch normalised by
    ``sum_i w_i``. A ``(value, weight)`` metric is combined with its own weight.
    Gradients accumulate in float32.
    """
    micro = jax.tree.map(lambda x: x.reshape(n, x.shape[0] // n, *x.shape[1:]), batch)

    def one(params, rest, mb, i):
        loss, mets, rest, grads = _value_and_grad(
            loss_fn, graphdef, params, rest, mb, jax.random.fold_in(rng, i), wrt)
        lw = mets.pop(metrics.LOSS_WEIGHT, (jnp.float32(1.0), None))[0]
        grads = jax.tree.map(lambda g: g.astype(jnp.float32) * lw, grads)
        weighted = {k: (w * v, w) for k, (v, mw) in mets.items()
                    for w in [lw if mw is None else mw]}
        return rest, (lw, lw * loss, weighted, grads)

    first = jax.tree.map(lambda x: x[0], micro)
    shapes = jax.eval_shape(lambda p, r: one(p, r, first, 0)[1], params, rest)
    zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def body(carry, xs):  # params ride in the carry: nnx variables must be of this trace
        params, rest, acc = carry
        rest, contrib = one(params, rest, *xs)
        return (params, rest, jax.tree.map(jnp.add, acc, contrib)), None

    (_, rest, (w, loss, mets, grads)), _ = lax.scan(
        body, (params, rest, zero), (micro, jnp.arange(n)))
    den = lambda w: jnp.where(w > 0, w, 1.0)
    grads = jax.tree.map(lambda g, p: (g / den(w)).astype(p.dtype), grads, params)
    return loss / den(w), {k: v / den(mw) for k, (v, mw) in mets.items()}, rest, grads


def make_train_step(graphdef: nnx.GraphDef, loss_fn: LossFn | None = None,
                    grad_accum: int = 1, mesh: Mesh | None = None, *,
                    wrt: Any = nnx.Param) -> Callable:
    """Jitted ``(params, rest, opt_state, batch, hparams, rng) -> (params, rest, opt_state,
    stats)``.

    ``batch`` is a batch dict (module docstring); ``hparams`` is
    :func:`optimizer_hparams`; ``rng`` is the key handed to ``loss_fn`` (default
    :func:`metrics.nll_loss`). ``stats`` holds scalar ``loss`` (before the update),
    ``grad_norm`` (before clipping) and the hook's metrics (without ``loss_weight``).
    With ``grad_accum = N`` the ``B`` rows are split into N micro-batches of ``B / N``
    consecutive rows, scanned in order (see :func:`_accumulate`). The first three
    arguments are donated. With a ``mesh`` it runs under ``jax.set_mesh(mesh)`` and every
    output is replicated on it (``out_shardings``); place the inputs with
    :func:`lcjax.parallel.distributed.replicate` and
    :func:`lcjax.parallel.distributed.global_batch`, and XLA partitions the step from the
    batch's ``P("data", "context")``. ``wrt``: the nnx filter of the trained variables
    (``params`` must be ``nnx.split(model, wrt, ...)[1]``; the rest rides in ``rest``).
    """
    loss_fn = metrics.nll_loss if loss_fn is None else loss_fn

    def step(params, rest, opt_state, batch, hparams, rng):
        if grad_accum == 1:
            loss, mets, rest, grads = _value_and_grad(loss_fn, graphdef, params, rest, batch,
                                                      rng, wrt)
            mets = {k: v for k, (v, _) in mets.items() if k != metrics.LOSS_WEIGHT}
        else:
            loss, mets, rest, grads = _accumulate(loss_fn, graphdef, params, rest, batch, rng,
                                                  grad_accum, wrt)
        tx = make_optimizer(**hparams)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, rest, opt_state, {"loss": loss, "grad_norm": optax.global_norm(grads),
                                         **mets}

    return _under_mesh(jax.jit(step, donate_argnums=(0, 1, 2), **_replicated_outputs(mesh)),
                       mesh)


def _replicated_outputs(mesh: Mesh | None) -> dict:
    return {} if mesh is None else {"out_shardings": NamedSharding(mesh, PartitionSpec())}


def _under_mesh(fn: Callable, mesh: Mesh | None) -> Callable:
    """``fn`` called under ``jax.set_mesh(mesh)``, so what it traces finds the mesh
    (``jax.sharding.get_abstract_mesh()``: the context-parallel attention layers)."""
    if mesh is None:
        return fn

    @functools.wraps(fn)
    def call(*args):
        with jax.set_mesh(mesh):
            return fn(*args)

    return call


def make_eval_step(graphdef: nnx.GraphDef, eval_fn: LossFn | None = None,
                   mesh: Mesh | None = None) -> Callable:
    """Jitted ``(params, rest, batch, rng) -> (loss, metrics)`` of ``eval_fn`` (default
    :func:`metrics.nll_loss`), float32 scalars.

    The model runs in evaluation mode (``model.eval()``: no dropout); its state changes
    (RNG counts) are dropped. With a ``mesh`` the outputs are replicated on it.
    """
    eval_fn = metrics.nll_loss if eval_fn is None else eval_fn

    def step(params, rest, batch, rng):
        model = nnx.merge(graphdef, params, rest)
        model.eval()
        loss, mets = eval_fn(model, batch, rng)
        return jnp.asarray(loss).astype(jnp.float32), _check_metrics(loss, mets)

    return _under_mesh(jax.jit(step, **_replicated_outputs(mesh)), mesh)


@functools.lru_cache(maxsize=16)
def cached_train_step(graphdef: nnx.GraphDef, loss_fn: LossFn | None, grad_accum: int,
                      mesh: Mesh | None = None, wrt: Any = nnx.Param) -> Callable:
    """One compiled train step per (model, loss hook, grad_accum, mesh, wrt): each shape
    compiles once."""
    return make_train_step(graphdef, loss_fn, grad_accum, mesh, wrt=wrt)


@functools.lru_cache(maxsize=16)
def _eval_step(graphdef: nnx.GraphDef, eval_fn: LossFn | None,
               mesh: Mesh | None = None) -> Callable:
    return make_eval_step(graphdef, eval_fn, mesh)


def run_mesh(cfg: TrainConfig) -> Mesh | None:
    """The run's ``("data", "context")`` mesh over all devices: ``cfg.mesh`` parsed
    (``"data=2"`` alone gives ``context`` every remaining device); without one, None in a
    single process and ``data=jax.device_count()`` (pure data parallelism) in several.

    Raises:
      ValueError: the mesh's size is not the number of devices (naming both).
    """
    if cfg.mesh is not None:
        return make_mesh(**parse_mesh(cfg.mesh))
    if jax.process_count() > 1:
        return make_mesh(data=jax.device_count(), context=1)
    return None


def _check_mesh_shapes(cfg: TrainConfig, mesh: Mesh) -> None:
    data, context = mesh_size(mesh, DATA), mesh_size(mesh, CONTEXT) * mesh_size(mesh, "ring")
    if cfg.batch_size % (data * cfg.grad_accum):
        raise ValueError(f"TrainConfig.batch_size={cfg.batch_size} must be divisible by the "
                         f"mesh's data={data} times grad_accum={cfg.grad_accum}")
    if cfg.seq_len % context:
        raise ValueError(f"TrainConfig.seq_len={cfg.seq_len} must be divisible by the mesh's "
                         f"context={context} (times ring, if any)")


def _place_batch(batch: dict, *, mesh: Mesh, grad_accum: int) -> dict:
    """This process's rows -> the global batch on ``mesh``; its rows split into
    ``grad_accum`` micro-batches (ValueError naming the numbers)."""
    batch = distributed.global_batch(batch, mesh)
    rows = batch["inputs"].shape[0]
    if rows % grad_accum:
        raise ValueError(f"a batch of {rows} rows does not split into grad_accum={grad_accum} "
                         "micro-batches")
    return batch


def as_batch(batch: Any, grad_accum: int = 1) -> dict:
    """Checks a batch dict against the schema (module docstring); numpy/jax arrays out.

    Raises:
      ValueError: a missing ``inputs``/``targets``, a schema key whose shape is not that
        of ``inputs`` ``[B, T]``, a non-numeric value, a value without the leading batch
        axis, or ``B`` not divisible by ``grad_accum``.
    """
    if not isinstance(batch, Mapping):
        raise TypeError(f"a batch must be a dict of arrays; got {type(batch).__name__}")
    missing = [k for k in ("inputs", "targets") if k not in batch]
    if missing:
        raise ValueError(f"batch lacks {missing}; it has {sorted(batch)}")
    out = {k: v if isinstance(v, jax.Array) else np.asarray(v) for k, v in batch.items()}
    shape = out["inputs"].shape
    if len(shape) != 2:
        raise ValueError(f"batch['inputs'] must be [B, T]; got shape {shape}")
    for k, v in out.items():
        if v.dtype.kind not in "biuf":
            raise ValueError(f"batch[{k!r}] must be numeric or bool; got dtype {v.dtype}")
        if k in BATCH_KEYS and v.shape != shape:
            raise ValueError(f"batch[{k!r}] has shape {v.shape}; inputs have {shape}")
        if v.ndim == 0 or v.shape[0] != shape[0]:
            raise ValueError(f"batch[{k!r}] (shape {v.shape}) must have the batch size "
                             f"{shape[0]} as its leading axis")
    if shape[0] % grad_accum:
        raise ValueError(f"a batch of {shape[0]} rows does not split into "
                         f"grad_accum={grad_accum} micro-batches")
    return out


def _pad_batch(batch: dict, rows: int) -> dict:
    """Pads a short last batch to ``rows`` rows: PAD inputs/targets (no loss), segment id
    -1 (padding), zeros elsewhere (no ``loss_mask``, no ``weights``)."""
    n = batch["inputs"].shape[0]
    if n == rows:
        return batch
    fill = {"inputs": tokenizer.PAD, "targets": tokenizer.PAD, "segment_ids": -1}
    return {k: np.pad(np.asarray(v), [(0, rows - n)] + [(0, 0)] * (v.ndim - 1),
                      constant_values=fill.get(k, 0)) for k, v in batch.items()}


def evaluate(
    eval_step: Callable,
    params: Any,
    rest: Any,
    dataset: Iterable[dict],
    *,
    max_batches: int | None = None,
    rng: jax.Array | None = None,
    bpb: bool = True,
    place: Callable[[dict], dict] | None = None,
) -> dict:
    """Held-out loss and metrics of ``eval_step`` (:func:`make_eval_step`) over ``dataset``.

    Batches (at most ``max_batches``; a short one is padded to the first one's rows) are
    combined weighted by their ``loss_weight`` metric (1 if absent; a ``(value, weight)``
    metric by its own weight), so the default hook gives total nats / total real targets.
    Batch ``i`` gets ``fold_in(rng, i)``. ``place`` maps each (padded) batch onto the
    devices, e.g. ``lambda b: global_batch(b, mesh)``; the target count is taken from the
    placed (global) batch.

    Returns:
      ``{"eval_loss", "eval_bpb" (if bpb: eval_loss / ln 2, bits per byte of a byte
      model), "eval_tokens" (non-PAD targets), "eval_<metric>"...}``.
    """
    rng = jax.random.key(0) if rng is None else rng
    sums: dict[str, tuple[float, float]] = {}  # name -> (sum of weight * value, weight)
    tokens, rows = 0, None
    for i, batch in enumerate(dataset):
        if max_batches is not None and i >= max_batches:
            break
        batch = as_batch(batch)
        rows = batch["inputs"].shape[0] if rows is None else rows
        batch = _pad_batch(batch, rows)
        if place is not None:
            batch = place(batch)
        tokens += int(jax.device_get(jnp.sum(batch["targets"] != tokenizer.PAD)))
        loss, mets = jax.device_get(
            eval_step(params, rest, batch, jax.random.fold_in(rng, i)))
        lw = float(mets.pop(metrics.LOSS_WEIGHT, (1.0, None))[0])
        for k, (v, w) in {"loss": (loss, None), **mets}.items():
            w = lw if w is None else float(w)
            s, t = sums.get(k, (0.0, 0.0))
            sums[k] = (s + w * float(v), t + w)
    mean = {k: s / t if t > 0 else math.nan for k, (s, t) in sums.items()}
    out = {"eval_loss": mean.pop("loss", math.nan)}
    if bpb:
        out["eval_bpb"] = out["eval_loss"] / math.log(2)
    out["eval_tokens"] = tokens
    out.update({f"eval_{k}": v for k, v in mean.items()})
    return out


class _Batches:
    """A dataset's batches in order, with a JSON-ready state for the checkpoint.

    A ``grain.MapDataset`` is read through :func:`pipeline.make_iterator`; an iterable
    whose iterator has ``get_state``/``set_state`` (grain ``IterDataset``) is restored
    through them; any other iterable is re-iterated and fast-forwarded past the batches
    already consumed (state ``{"batches": n}``), which needs it to yield the same
    sequence again.
    """

    def __init__(self, dataset: Any, state: dict | None):
        if isinstance(dataset, grain.MapDataset):
            self._it = pipeline.make_iterator(dataset, state)
        else:
            self._it = iter(dataset)
        self._stateful = all(callable(getattr(self._it, a, None))
                             for a in ("get_state", "set_state"))
        self.count = 0
        if state is not None and not isinstance(dataset, grain.MapDataset):
            if self._stateful:
                self._it.set_state(state)
            else:
                for _ in range(state["batches"]):
                    self._next()

    def _next(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            raise ValueError(
                f"the dataset ran out after {self.count} batches; train() takes one batch "
                "per step (repeat it, e.g. grain's ds.repeat())") from None
        self.count += 1
        return batch

    def __next__(self) -> Any:
        return self._next()

    def state(self) -> dict:
        return self._it.get_state() if self._stateful else {"batches": self.count}


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
    return DecoderLM(model_cfg, rngs=rngs)


def _check_model_cfg(model_cfg: Any) -> None:
    vocab = getattr(model_cfg, "vocab_size", tokenizer.VOCAB_SIZE)
    if vocab < tokenizer.VOCAB_SIZE:
        raise ValueError(f"model vocab_size={vocab} < byte tokenizer's {tokenizer.VOCAB_SIZE}")


def _check_train_args(cfg: TrainConfig, train_docs: Any, eval_docs: Any, dataset: Any,
                      eval_dataset: Any, overwrite: bool) -> None:
    """Refuses conflicting data arguments and a foreign ``cfg.out_dir``, before any work."""
    if dataset is not None and train_docs is not None:
        raise ValueError("give train_docs or dataset, not both")
    if eval_dataset is not None and eval_docs is not None:
        raise ValueError("give eval_docs or eval_dataset, not both")
    if dataset is not None and cfg.document_mask:
        raise ValueError("TrainConfig.document_mask applies to packed documents; a dataset "
                         "masks attention by carrying segment_ids")
    if cfg.out_dir is not None:  # refuse a foreign out_dir before any work
        checkpoint.check_out_dir(cfg.out_dir, resume=cfg.resume, overwrite=overwrite)


def _train_data(model_cfg: Any, cfg: TrainConfig, mesh: Mesh | None, train_docs: Any,
                eval_docs: Any, dataset: Any, eval_dataset: Any
                ) -> tuple[Any, Any, int | None]:
    """``(dataset, eval_dataset, eval_batches)`` of a run (:func:`train`'s data arguments).

    Documents are packed into ``[batch_size, seq_len]`` windows, this process's rows of
    the mesh's data axis only; without documents or a dataset, the Shakespeare split.
    With several processes evaluation reads whole batches only, as many as the shortest
    shard has. ``cfg.eval_batches == 0`` disables evaluation (``eval_dataset`` None).
    """
    shard_index, shard_count = (0, 1) if mesh is None else distributed.process_rows(mesh)
    if mesh is not None and dataset is None:
        _check_mesh_shapes(cfg, mesh)
    if dataset is None:
        _check_model_cfg(model_cfg)
        if train_docs is None and eval_docs is None:
            train_docs, eval_docs = shakespeare_split(cfg.heldout_fraction, cfg.split_seed)
        if train_docs is None:
            raise ValueError("eval_docs without train_docs (or dataset)")
        dataset = pipeline.make_dataset(
            train_docs, seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.data_seed,
            segments=cfg.document_mask, shard_index=shard_index, shard_count=shard_count,
        )
    eval_batches = cfg.eval_batches
    if eval_docs and cfg.eval_batches != 0:
        # several processes: whole batches only, as many as the shortest shard has
        eval_dataset = pipeline.make_dataset(
            eval_docs, seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.data_seed,
            num_epochs=1, drop_remainder=shard_count > 1, segments=cfg.document_mask,
            shard_index=shard_index, shard_count=shard_count,
        )
        if shard_count > 1:
            from jax.experimental import multihost_utils

            fewest = int(np.min(multihost_utils.process_allgather(np.int32(len(eval_dataset)))))
            eval_batches = fewest if eval_batches is None else min(eval_batches, fewest)
    if cfg.eval_batches == 0:
        eval_dataset = None
    return dataset, eval_dataset, eval_batches


def _init_state(model_cfg: Any, cfg: TrainConfig, model_fn: Callable | None, wrt: Any,
                mesh: Mesh | None) -> tuple[nnx.GraphDef, tuple[Any, Any, Any], dict]:
    """``(graphdef, (params, rest, opt_state), hparams)`` of a fresh model and optimizer.

    ``params`` are the ``wrt`` variables, ``rest`` the others; on a mesh all three are
    replicated.
    """
    model = (model_fn or _default_model_fn)(model_cfg, nnx.Rngs(cfg.seed))
    graphdef, params, rest = nnx.split(model, wrt, ...)
    hparams = optimizer_hparams(cfg)
    opt_state = make_optimizer(**hparams).init(params)
    if mesh is not None:  # replicated state, batches sharded P("data", "context")
        params, rest, opt_state = distributed.replicate((params, rest, opt_state), mesh)
    return graphdef, (params, rest, opt_state), hparams


def _run_meta(model_cfg: Any, cfg: TrainConfig, params: Any) -> dict:
    """The checkpoint's JSON metadata: both configs and the parameter shapes."""
    return json.loads(json.dumps({
        "model_config": config_dict(model_cfg), "train_config": config_dict(cfg),
        "params": checkpoint.param_shapes(params),
    }))


def _open_run(cfg: TrainConfig, meta: dict, state: tuple[Any, Any, Any], *,
              mesh: Mesh | None, overwrite: bool, extra_config: Mapping[str, Any] | None):
    """Opens ``cfg.out_dir`` (checkpoints, ``metrics.jsonl``, ``config.json``), resuming.

    Returns ``(manager, log_path, state, data_state, step)``: ``state = (params, rest,
    opt_state)`` restored onto this run's mesh when a checkpoint is resumed, else the
    given one; ``manager``/``log_path`` None without ``out_dir``. A resumed run's
    ``metrics.jsonl`` is cut back to its checkpoint's step.
    """
    if cfg.out_dir is None:
        return None, None, state, None, 0
    params, rest, opt_state = state
    data_state, step = None, 0
    checkpoint.prepare_out_dir(cfg.out_dir, resume=cfg.resume, overwrite=overwrite)
    manager, restored = checkpoint.open_run(  # restored onto this run's mesh
        os.path.join(cfg.out_dir, "checkpoints"), resume=cfg.resume, meta=meta,
        fields=RESUME_FIELDS, params=params, rest=rest, opt_state=opt_state,
        max_to_keep=cfg.keep_checkpoints, uncommit=mesh is None,
    )
    if restored is not None:
        params, rest, opt_state = (restored[k] for k in ("params", "rest", "opt_state"))
        data_state, step = restored["data_state"], restored["step"]
        if step > cfg.steps:
            manager.close()
            raise ValueError(f"cannot resume: the checkpoint is at step {step}, past "
                             f"steps={cfg.steps} (a resume may extend a run, not shorten "
                             "it)")
    log_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    if jax.process_index() == 0:
        metrics.truncate_jsonl(log_path, step)  # what a killed run logged past `step`
        with open(os.path.join(cfg.out_dir, "config.json"), "w", encoding="utf-8") as f:
            json.dump({"model": meta["model_config"], "train": meta["train_config"],
                       **(extra_config or {})}, f, indent=2)
    return manager, log_path, (params, rest, opt_state), data_state, step


def _step_records(steps: Sequence[int], stats: Sequence[dict], lrs: Any,
                  tokens_per_s: float) -> list[dict]:
    """One log record per step: ``step``, ``loss``, the hook's metrics, ``lr``,
    ``grad_norm``, ``tokens_per_s`` (``stats`` are host dicts; their ``loss`` is popped)."""
    return [
        {"step": k, "loss": float(s.pop("loss")), **{m: float(v) for m, v in s.items()
                                                     if m != "grad_norm"},
         "lr": float(lr), "grad_norm": float(s["grad_norm"]), "tokens_per_s": tokens_per_s}
        for k, s, lr in zip(steps, stats, lrs)
    ]


class _StepLog:
    """The run's log: step stats are kept on device until :meth:`flush`, which fetches
    them, writes their records (:func:`_step_records`) to ``history``, ``log_path``
    (process 0) and the progress bar, and times the interval since the last flush.

    ``tokens_per_s`` is the mean over every interval but the first (which includes
    compilation); time spent evaluating or checkpointing is left out
    (:meth:`restart_clock`).
    """

    def __init__(self, sched: Callable[[Any], jax.Array], log_path: str | None, bar: Any):
        self.sched, self.log_path, self.bar = sched, log_path, bar
        self.history: list[dict] = []
        self.evals: list[dict] = []
        self.pending: list[tuple[int, Any, int]] = []  # (step, device stats, tokens)
        self.timed_tokens, self.timed_s = 0, 0.0
        self.t0, self.first_flush = time.perf_counter(), True

    def add(self, step: int, stats: Any, tokens: int) -> None:
        self.pending.append((step, stats, tokens))

    def restart_clock(self) -> None:
        self.t0 = time.perf_counter()

    def flush(self) -> None:
        if not self.pending:
            return
        stats = jax.device_get([s for _, s, _ in self.pending])
        dt = time.perf_counter() - self.t0
        tokens = sum(n for _, _, n in self.pending)
        tps = tokens / dt
        if not self.first_flush:  # the first interval includes compilation
            self.timed_tokens, self.timed_s = self.timed_tokens + tokens, self.timed_s + dt
        steps = [k for k, _, _ in self.pending]
        lrs = np.asarray(self.sched(np.array(steps)))
        records = _step_records(steps, stats, lrs, tps)
        self.history.extend(records)
        if self.log_path and jax.process_index() == 0:
            metrics.append_jsonl(self.log_path, records)
        self.bar.update(len(self.pending))
        shown = {k: v for k, v in records[-1].items() if k not in ("step", "lr", "tokens_per_s")}
        self.bar.set_postfix({k: f"{v:.4g}" for k, v in shown.items()} | {"tok_s": f"{tps:.3g}"})
        self.pending.clear()
        self.t0, self.first_flush = time.perf_counter(), False

    def log_eval(self, record: dict) -> None:
        self.evals.append(record)
        if self.log_path and jax.process_index() == 0:
            metrics.append_jsonl(self.log_path, [record])
        self.bar.write(json.dumps(record))

    @property
    def tokens_per_s(self) -> float:
        return self.timed_tokens / self.timed_s if self.timed_s > 0 else math.nan


def _due(step: int, every: int | None, at_end: bool) -> bool:
    """Whether a periodic action (eval, checkpoint) runs after ``step``."""
    return bool(at_end or (every and step % every == 0))


def _run_steps(cfg: TrainConfig, state: tuple[Any, Any, Any], step: int, last: int, *,
               batches: _Batches, train_step: Callable, hparams: dict,
               place: Callable | None, log: _StepLog, run_eval: Callable | None,
               save: Callable | None) -> tuple[tuple[Any, Any, Any], int]:
    """Updates ``step + 1 .. last``; returns ``(state, last)``.

    Update ``k`` takes the next batch and ``fold_in(train_rng, k)``. Logs every
    ``cfg.log_every`` steps and at ``last``; ``run_eval(step, params, rest) -> record``
    every ``cfg.eval_every`` steps and at ``cfg.steps``; ``save(step, state,
    data_state)`` every ``cfg.ckpt_every`` steps and at ``last``.
    """
    params, rest, opt_state = state
    train_rng = jax.random.fold_in(jax.random.key(cfg.seed), _TRAIN_RNG)
    while step < last:
        batch = as_batch(next(batches), cfg.grad_accum if place is None else 1)
        if place is not None:
            batch = place(batch)
        params, rest, opt_state, stats = train_step(
            params, rest, opt_state, batch, hparams, jax.random.fold_in(train_rng, step + 1))
        step += 1
        log.add(step, stats, batch["inputs"].size)
        if step % cfg.log_every == 0 or step == last:
            log.flush()
        if run_eval is not None and _due(step, cfg.eval_every, at_end=step == cfg.steps):
            log.flush()
            log.log_eval(run_eval(step, params, rest))
            log.restart_clock()
        if save is not None and _due(step, cfg.ckpt_every, at_end=step == last):
            log.flush()
            save(step, (params, rest, opt_state), batches.state())
            log.restart_clock()
    log.flush()
    return (params, rest, opt_state), step


def _eval_record(step: int, params: Any, rest: Any, *, eval_step: Callable,
                 dataset: Iterable[dict], **kwargs: Any) -> dict:
    """``{"step": step, **evaluate(eval_step, params, rest, dataset, **kwargs)}``."""
    return {"step": step, **evaluate(eval_step, params, rest, dataset, **kwargs)}


def _save(step: int, state: tuple[Any, Any, Any], data_state: dict, *, manager: Any,
          meta: dict) -> None:
    """Checkpoints ``state = (params, rest, opt_state)`` and the data state at ``step``."""
    params, rest, opt_state = state
    checkpoint.save_checkpoint(manager, step, params=params, rest=rest, opt_state=opt_state,
                               data_state=data_state, meta=meta)


def train(
    model_cfg: Any,
    cfg: TrainConfig,
    *,
    train_docs: Sequence[pipeline.DocLike] | None = None,
    eval_docs: Sequence[pipeline.DocLike] | None = None,
    dataset: Iterable[dict] | None = None,
    eval_dataset: Iterable[dict] | None = None,
    loss_fn: LossFn | None = None,
    eval_fn: LossFn | None = None,
    model_fn: Callable[[Any, nnx.Rngs], nnx.Module] | None = None,
    stop_at: int | None = None,
    wrt: Any = nnx.Param,
    overwrite: bool = False,
    extra_config: Mapping[str, Any] | None = None,
) -> TrainResult:
    """Trains a model on packed documents or on a dataset of batch dicts; resumes from
    ``cfg.out_dir``.

    Args:
      model_cfg: the model's config (e.g. ``lcjax.nn.DecoderConfig``).
      cfg: the run's hyper-parameters.
      train_docs, eval_docs: documents, packed into windows of ``cfg.seq_len`` (with
        ``segment_ids``/``positions`` when ``cfg.document_mask``); with neither these nor
        ``dataset``, the Shakespeare split ``shakespeare_split(cfg.heldout_fraction,
        cfg.split_seed)``. Empty or None ``eval_docs`` (with ``train_docs`` given)
        disables evaluation.
      dataset: instead of ``train_docs``: a ``grain.MapDataset`` or any iterable of batch
        dicts (module docstring), one per step, consumed in order (it decides shuffling
        and epochs; running out is an error). Its iterator state is checkpointed.
      eval_dataset: instead of ``eval_docs``: a re-iterable of batch dicts, read from the
        start at each evaluation (at most ``cfg.eval_batches`` batches).
      loss_fn: ``(model, batch, rng) -> (loss, metrics)``, differentiated w.r.t. the
        parameters; default :func:`metrics.nll_loss`. ``rng`` is a fresh key per step
        (and per micro-batch) derived from ``cfg.seed`` and the step.
      eval_fn: the same shape, for evaluation; default :func:`metrics.nll_loss`.
      model_fn: ``(model_cfg, rngs) -> module``; default ``lcjax.nn.DecoderLM``. The
        default hooks call it as ``model(inputs)`` plus ``positions=``/``segment_ids=``
        when the batch carries them.
      stop_at: stop (and checkpoint) after this step though the schedule runs
        to ``cfg.steps`` — what an interrupted run does.
      wrt: nnx filter of the variables trained (differentiated, updated, held in the
        optimizer state, checkpointed as ``params``); default every ``nnx.Param``. E.g.
        ``lcjax.nn.lora.LoRAParam`` trains only LoRA adapters: the base parameters ride
        frozen in the other state.
      overwrite: remove ``cfg.out_dir`` first (``--overwrite``); without it a non-empty
        ``out_dir`` that is not an lcjax run folder is refused
        (:func:`lcjax.train.checkpoint.prepare_out_dir`).
      extra_config: more top-level sections of ``out_dir/config.json`` (JSON values)
        beside ``"model"`` and ``"train"``, e.g. ``lcjax train``'s data source, so that a
        resume can read them back.

    Returns:
      A :class:`TrainResult`.

    Raises:
      ValueError: conflicting arguments; a non-empty ``out_dir`` that is not a run
        folder (without ``overwrite``); a fresh run (``resume=False``) into an
        ``out_dir`` that has checkpoints; a resume whose model config, parameter shapes
        or optimizer/data config (:data:`RESUME_FIELDS`) differ from the checkpoint's;
        a resume whose checkpoint is past ``cfg.steps``.
    """
    _check_train_args(cfg, train_docs, eval_docs, dataset, eval_dataset, overwrite)
    mesh = run_mesh(cfg)
    dataset, eval_dataset, eval_batches = _train_data(
        model_cfg, cfg, mesh, train_docs, eval_docs, dataset, eval_dataset)
    graphdef, state, hparams = _init_state(model_cfg, cfg, model_fn, wrt, mesh)
    place = None if mesh is None else functools.partial(
        _place_batch, mesh=mesh, grad_accum=cfg.grad_accum)
    meta = _run_meta(model_cfg, cfg, state[0])
    manager, log_path, state, data_state, step = _open_run(
        cfg, meta, state, mesh=mesh, overwrite=overwrite, extra_config=extra_config)
    run_eval = None if eval_dataset is None else functools.partial(
        _eval_record, eval_step=_eval_step(graphdef, eval_fn, mesh), dataset=eval_dataset,
        max_batches=eval_batches, bpb=eval_fn is None, place=place,
        rng=jax.random.fold_in(jax.random.key(cfg.seed), _EVAL_RNG))
    log = _StepLog(lr_schedule(cfg), log_path,
                   tqdm(total=cfg.steps, initial=step, disable=not cfg.progress, desc="train"))
    (params, rest, _), step = _run_steps(
        cfg, state, step, cfg.steps if stop_at is None else min(stop_at, cfg.steps),
        batches=_Batches(dataset, data_state), hparams=hparams, place=place, log=log,
        train_step=cached_train_step(graphdef, loss_fn, cfg.grad_accum, mesh, wrt),
        run_eval=run_eval,
        save=None if manager is None else functools.partial(_save, manager=manager, meta=meta))
    log.bar.close()
    if manager is not None:
        manager.close()
    return TrainResult(log.history, log.evals, step, nnx.merge(graphdef, params, rest),
                       log.tokens_per_s)
