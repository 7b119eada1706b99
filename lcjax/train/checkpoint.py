"""orbax checkpoints of a training run: parameters, other model state, optimizer
state, step and the grain iterator state, saved together and atomically.

Layout of ``directory/<step>/`` (an ``ocp.args.Composite``)::

    params     StandardSave   nnx.Param state
    rest       StandardSave   other nnx state (RNG keys as raw key data), if any
    opt_state  StandardSave   optax state
    data       JsonSave       grain iterator state, e.g. {"next_index": 8}
    meta       JsonSave       step, the configs and the parameter shapes

orbax writes each step to a temporary folder and renames it when complete, so a
crash (even SIGKILL mid-save) never leaves a half-written latest checkpoint: the
previous one stays the latest, and the leftover temporary folder is removed when the
next manager opens the directory. The manager keeps the last ``max_to_keep``. Saving
is synchronous: the train step donates its buffers.

A resume first reads ``meta`` alone (:func:`read_meta`) and compares it with the new
run's (:func:`check_resume`), so a different model or optimizer config fails with the
names and both values of the fields that differ instead of an orbax shape error.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp


def checkpoint_manager(
    directory: str | os.PathLike, *, max_to_keep: int = 3
) -> ocp.CheckpointManager:
    """A manager for ``directory`` keeping the last ``max_to_keep`` steps."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False,
        cleanup_tmp_directories=True,
    )
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _keys_to_data(tree: Any) -> Any:
    """Typed PRNG key arrays -> their uint32 key data (orbax stores plain arrays)."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _data_to_keys(tree: Any, like: Any) -> Any:
    """Inverse of :func:`_keys_to_data`, taking key implementations from ``like``."""
    return jax.tree.map(
        lambda x, l: jax.random.wrap_key_data(x, impl=jax.random.key_impl(l)) if _is_key(l) else x,
        tree,
        like,
    )


def _uncommit(tree: Any) -> Any:
    """Single-process: restored arrays as uncommitted default-device arrays, like freshly
    initialised ones, so jit reuses the executables it compiled for those."""
    if jax.process_count() > 1:
        return tree
    return jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), tree)


def _abstract(tree: Any) -> Any:
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, _keys_to_data(tree))


def save_checkpoint(
    manager: ocp.CheckpointManager,
    step: int,
    *,
    params: Any,
    rest: Any,
    opt_state: Any,
    data_state: dict,
    meta: dict | None = None,
) -> None:
    """Saves one training state at ``step`` (blocking until it is on disk)."""
    items = {
        "params": ocp.args.StandardSave(params),
        "opt_state": ocp.args.StandardSave(opt_state),
        "data": ocp.args.JsonSave(data_state),
        "meta": ocp.args.JsonSave({"step": int(step), **(meta or {})}),
    }
    if jax.tree.leaves(rest):
        items["rest"] = ocp.args.StandardSave(_keys_to_data(rest))
    manager.save(int(step), args=ocp.args.Composite(**items), force=True)
    manager.wait_until_finished()


def restore_checkpoint(
    manager: ocp.CheckpointManager,
    *,
    params: Any,
    rest: Any,
    opt_state: Any = None,
    step: int | None = None,
    uncommit: bool = True,
) -> dict | None:
    """Restores ``step`` (default: the latest) into the structure of the given trees.

    Each array is restored onto the sharding of its counterpart in the given trees
    (orbax reads only the shards each device needs), whatever mesh wrote it: give trees
    placed on a new mesh (or ``jax.ShapeDtypeStruct``s with ``sharding=``) to restore onto
    that mesh.

    Args:
      manager: from :func:`checkpoint_manager`.
      params, rest, opt_state: trees (or abstract trees) giving structure, shapes
        and dtypes of what to restore; ``opt_state=None`` restores the model state only
        (no optimizer or data state); ``rest`` None or empty skips the other model state.
      step: which checkpoint; None = latest.
      uncommit: in a single process, return uncommitted default-device arrays (like
        freshly initialised ones, so jit reuses its executables); False keeps the
        restored shardings (a run on a mesh).

    Returns:
      None if there is no checkpoint, else a dict with ``params``, ``rest``, ``meta``,
      ``step`` and, unless ``opt_state`` is None, ``opt_state`` and ``data_state``
      (``rest`` is the given ``rest`` when the checkpoint has none or it was skipped).
    """
    step = manager.latest_step() if step is None else step
    if step is None:
        return None
    items = {"params": ocp.args.StandardRestore(_abstract(params)),
             "meta": ocp.args.JsonRestore()}
    if opt_state is not None:
        items["opt_state"] = ocp.args.StandardRestore(_abstract(opt_state))
        items["data"] = ocp.args.JsonRestore()
    has_rest = bool(jax.tree.leaves(rest))
    if has_rest:
        items["rest"] = ocp.args.StandardRestore(_abstract(rest))
    out = manager.restore(step, args=ocp.args.Composite(**items))
    keep = _uncommit if uncommit else (lambda tree: tree)
    result = {
        "params": keep(out["params"]),
        "rest": _data_to_keys(keep(out["rest"]), rest) if has_rest else rest,
        "meta": dict(out["meta"]),
        "step": int(step),
    }
    if opt_state is not None:
        result.update(opt_state=keep(out["opt_state"]), data_state=dict(out["data"]))
    return result


def read_meta(manager: ocp.CheckpointManager, step: int | None = None) -> dict | None:
    """The ``meta`` item of ``step`` (default: the latest) alone; None without checkpoints."""
    step = manager.latest_step() if step is None else step
    if step is None:
        return None
    return dict(manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
                ["meta"])


def param_shapes(params: Any) -> dict[str, list]:
    """``{path: [shape, dtype]}`` of a parameter tree, JSON-ready (stored in ``meta``)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    return {jax.tree_util.keystr(path, simple=True, separator="/"):
            [list(x.shape), str(x.dtype)] for path, x in flat}


def check_resume(saved: dict, current: dict, fields: dict[str, tuple[str, ...] | None]) -> None:
    """Raises ValueError if ``saved`` and ``current`` meta differ in a checked field.

    Args:
      saved: the checkpoint's meta (:func:`read_meta`).
      current: the resuming run's meta.
      fields: section -> the field names to compare (None: all fields of the section).
        Sections missing from ``saved`` (older checkpoints) are not checked.

    The message names every differing field as ``section.field`` with both values.
    """
    diffs = []
    for section, names in fields.items():
        if section not in saved:
            continue
        old, new = saved[section], current.get(section)
        if not isinstance(old, dict) or not isinstance(new, dict):
            if old != new:
                diffs.append(f"{section}: checkpoint {old!r}, this run {new!r}")
            continue
        keys = sorted(set(old) | set(new)) if names is None else names
        for k in keys:
            if k in old and old.get(k) != new.get(k):
                diffs.append(f"{section}.{k}: checkpoint {old.get(k)!r}, this run {new.get(k)!r}")
    if diffs:
        raise ValueError("cannot resume: the checkpoint was written with a different config ("
                         + "; ".join(diffs) + "). Use the same config or a fresh out_dir.")


def restore_params(manager: ocp.CheckpointManager, params: Any, *, step: int | None = None,
                   rest: Any = None) -> dict | None:
    """Restores only the model state of ``step`` (default: the latest): no optimizer state.

    Args:
      manager: from :func:`checkpoint_manager`.
      params: a tree (or abstract tree) giving the structure, shapes and dtypes of the
        parameters.
      rest: the same for the other model state, or None / an empty tree to skip it.

    Returns:
      None if there is no checkpoint, else ``{"params", "rest", "meta", "step"}``
      (``rest`` is the given ``rest`` when the checkpoint has none or it was skipped).
    """
    return restore_checkpoint(manager, params=params, rest=rest, step=step)


def model_config_from_dict(fields: dict) -> Any:
    """A ``lcjax.nn.DecoderConfig`` from its JSON form (``config.json``'s ``"model"``, which
    :func:`lcjax.train.config_dict` wrote: dtypes by name, tuples as lists)."""
    import jax.numpy as jnp

    from lcjax.nn import DecoderConfig

    fields = dict(fields)
    for key in ("dtype", "param_dtype"):
        if isinstance(fields.get(key), str):
            fields[key] = jnp.dtype(fields[key])
    if isinstance(fields.get("attention_learn"), list):
        fields["attention_learn"] = tuple(fields["attention_learn"])
    return DecoderConfig(**fields)


def load_model(run_dir: str | os.PathLike, *, step: int | None = None,
               attention: str | None = None, attention_options=None,
               calibration=None) -> Any:
    """The ``lcjax.nn.DecoderLM`` of a training run folder (``lcjax train --out DIR``).

    Reads ``DIR/config.json`` (the model config) and the parameters of checkpoint ``step``
    (default: the latest) from ``DIR/checkpoints``. ``attention`` / ``attention_options``
    replace the config's attention variant and options (e.g. ``"blockwise"`` for a
    long-context prefill, or ``"plash"`` on a model trained with softmax): the stored
    model is restored as trained, then :func:`with_attention` moves its parameters to the
    new variant and initialises that variant's own parameters (``calibration``: tokens
    for PLASH's data-dependent init).

    Raises:
      ValueError: no ``config.json``, or no checkpoint in ``DIR/checkpoints``.
    """
    import json

    from flax import nnx

    from lcjax.nn import DecoderLM

    run_dir = os.fspath(run_dir)
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"load_model: `run_dir` {run_dir!r} has no config.json (expected the "
                         "folder of `lcjax train --out DIR`)")
    with open(path, encoding="utf-8") as f:
        fields = json.load(f)["model"]
    model = DecoderLM(model_config_from_dict(fields), rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    ckpt = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(ckpt):
        raise ValueError(f"load_model: `run_dir` {run_dir!r} has no checkpoints/ folder")
    manager = checkpoint_manager(ckpt)
    try:
        restored = restore_params(manager, params, step=step, rest=rest)
    finally:
        manager.close()
    if restored is None:
        raise ValueError(f"load_model: no checkpoint in {ckpt!r}")
    model = nnx.merge(graphdef, restored["params"], restored["rest"])
    if attention is None and attention_options is None:
        return model
    return with_attention(model, attention, attention_options, calibration=calibration)


def with_attention(model, attention=None, attention_options=None, *, calibration=None):
    """``model`` (a DecoderLM) with another attention variant: the checkpoint's parameters
    are shared, the new variant's own parameters initialised by
    :func:`lcjax.nn.pretrained.init_variant_params` (each logged), the old variant's own
    parameters dropped."""
    import dataclasses
    import logging

    from flax import nnx

    from lcjax.nn import DecoderLM
    from lcjax.nn.pretrained import init_variant_params

    changes = {}
    if attention is not None:
        changes["attention"] = attention
    if attention_options is not None:
        changes["attention_options"] = dict(attention_options)
    cfg = dataclasses.replace(model.config, **changes)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: DecoderLM(cfg, rngs=nnx.Rngs(0))))
    pure = nnx.to_pure_dict(nnx.state(model))
    for block in pure["blocks"].values():
        block["attn"].pop("variant_params", None)
    nnx.replace_by_pure_dict(state, pure)  # the variants' own parameters stay abstract
    out = nnx.merge(graphdef, state)
    report = init_variant_params(out, calibration=calibration)
    for name, how in report.items():
        logging.getLogger(__name__).info("load_model: initialised %s: %s", name, how)
    return out


def open_run(directory: str | os.PathLike, *, resume: bool, meta: dict,
             fields: dict[str, tuple[str, ...] | None], params: Any, rest: Any,
             opt_state: Any, max_to_keep: int = 3, uncommit: bool = True
             ) -> tuple[ocp.CheckpointManager, dict | None]:
    """Opens a run's checkpoint folder: the manager and, on a resume, the restored state.

    A fresh run (``resume=False``) into a folder that has checkpoints is refused; a resume
    first compares the latest checkpoint's meta with ``meta`` (:func:`check_resume` over
    ``fields``), then restores it into the structure of ``params``, ``rest`` and
    ``opt_state`` (:func:`restore_checkpoint`). A resume with no checkpoint yet starts
    fresh (restored state None).

    Returns:
      ``(manager, restored)``; the caller closes the manager.

    Raises:
      ValueError: checkpoints without ``resume``; a resume whose meta differs.
    """
    manager = checkpoint_manager(directory, max_to_keep=max_to_keep)
    latest = manager.latest_step()
    if latest is None:
        return manager, None
    try:
        if not resume:
            raise ValueError(f"{os.path.dirname(os.path.abspath(directory))} has checkpoints "
                             f"(latest step {latest}): resume with resume=True (--resume) or "
                             "train into a fresh out_dir")
        check_resume(read_meta(manager, latest), meta, fields)
        restored = restore_checkpoint(manager, params=params, rest=rest, opt_state=opt_state,
                                      step=latest, uncommit=uncommit)
    except Exception:
        manager.close()
        raise
    return manager, restored
