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
next *writer* (:func:`checkpoint_manager`, i.e. a resumed run) opens the directory. The
manager keeps the last ``max_to_keep``. Saving is synchronous: the train step donates its
buffers.

Readers (:func:`load_model`, ``lcjax serve``, ``lcjax eval --model``) open the folder with
:func:`checkpoint_reader`: read-only, so they create nothing and never delete a running
save's temporary folder, and they may load a run while it trains. Every restore without an
explicit step goes through :func:`restore_latest_intact`: the latest step that restores;
a step the writer deleted meanwhile (``max_to_keep``) is skipped silently, a corrupt one
with a warning naming its file and the step loaded instead, and when none restores the
error is one line naming each step's file.

A resume first reads ``meta`` alone (:func:`read_meta`) and compares it with the new
run's (:func:`check_resume`), so a different model or optimizer config fails with the
names and both values of the fields that differ instead of an orbax shape error.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from lcjax.data.writes import check_removable
from lcjax.errors import UsageError
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.nn.pretrained import init_variant_params


def checkpoint_manager(
    directory: str | os.PathLike, *, max_to_keep: int = 3
) -> ocp.CheckpointManager:
    """A manager for ``directory`` keeping the last ``max_to_keep`` steps."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False,
        cleanup_tmp_directories=True,
    )
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def checkpoint_reader(directory: str | os.PathLike) -> ocp.CheckpointManager:
    """A read-only manager for ``directory``: creates no folder, deletes nothing (a running
    save's temporary folder stays), saves nothing.

    Raises:
      ValueError: ``directory`` is not a folder.
    """
    path = os.path.abspath(directory)
    if not os.path.isdir(path):
        raise ValueError(f"no checkpoint folder {path!r}")
    options = ocp.CheckpointManagerOptions(
        read_only=True, create=False, cleanup_tmp_directories=False, max_to_keep=None,
        save_interval_steps=0, enable_async_checkpointing=False, lightweight_initialize=True,
    )
    absl = logging.getLogger("absl")  # orbax logs a warning for every read-only manager
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        return ocp.CheckpointManager(path, options=options)
    finally:
        absl.setLevel(level)


def list_steps(manager: ocp.CheckpointManager, *, attempts: int = 50) -> list[int]:
    """The committed steps of ``manager``'s folder, read again from disk. A step the writer
    deletes while they are listed (orbax stats each one) makes the listing retry: orbax
    then raises FileNotFoundError, or NotADirectoryError when the step folder vanishes
    between its ``exists()`` and ``is_dir()`` checks."""
    for _ in range(attempts - 1):
        try:
            manager.reload()
            return list(manager.all_steps())
        except (FileNotFoundError, NotADirectoryError):
            time.sleep(0.01)
    manager.reload()
    return list(manager.all_steps())


class ConfigMismatch(ValueError):
    """A resume whose config differs from the checkpoint's (:func:`check_resume`): not a
    corrupt step, so :func:`restore_latest_intact` does not fall back past it."""


_LOCAL_FILE = re.compile(r'local file "([^"]+)"')


def _bad_json_file(step_dir: str) -> str | None:
    """The first JSON item file (``<item>/metadata``) of ``step_dir`` that does not parse."""
    for item in sorted(os.listdir(step_dir)) if os.path.isdir(step_dir) else ():
        path = os.path.join(step_dir, item, "metadata")
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    json.load(f)
            except (ValueError, UnicodeDecodeError):
                return path
    return None


def describe_failure(step_dir: str, exc: BaseException) -> str:
    """One line: the file of ``step_dir`` that failed to read (from the error or, for a
    JSON error, the item that does not parse) and the error's first line, ≤ 200 chars."""
    text = str(exc)
    files = _LOCAL_FILE.findall(text)
    path = max(files, key=len) if files else None
    if path is None:
        path = _bad_json_file(step_dir)
    first = text.split(" [tensorstore_spec", 1)[0].splitlines()[0] if text else ""
    code = first.split(":", 1)[0]
    if files and '": ' in first:  # TensorStore: "CODE: opening ...: ... file "X": the cause"
        first = (f"{code}: " if code.isupper() else "") + first.rsplit('": ', 1)[1]
    first = first if len(first) <= 200 else first[:197] + "..."
    return f"{path or step_dir}: {type(exc).__name__}: {first}"


def restore_latest_intact(manager: ocp.CheckpointManager, restore: Callable[[int], Any],
                          *, attempts: int = 20) -> tuple[int, Any] | None:
    """``(step, restore(step))`` for the latest step of ``manager`` that restores.

    The step list is re-read before each try, so a reader may run beside the training run
    that writes the folder: a step the writer deleted meanwhile (or whose read failed while
    a newer step appeared) is retried on the new latest step without a warning (at most
    ``attempts`` times). A step that still is the latest and fails is corrupt: the previous
    step is tried, and on success one warning names each corrupt step's file and the step
    loaded. :class:`ConfigMismatch` from ``restore`` passes through.

    Returns:
      None if the folder has no step.

    Raises:
      ValueError: steps exist but none restores (one line naming each step's file), or
        the steps changed under ``attempts`` reads in a row.
    """
    bad: dict[int, str] = {}
    races = 0
    while steps := [s for s in list_steps(manager) if s not in bad]:
        step = max(steps)
        try:
            out = restore(step)
        except ConfigMismatch:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of a listed step is reported
            _ignore_closed_loop_callbacks()
            live = [s for s in list_steps(manager) if s not in bad]
            if step in live and max(live) == step:  # still there and still the latest: corrupt
                bad[step] = describe_failure(os.path.join(manager.directory, str(step)), exc)
                continue
            races += 1
            if races >= attempts:
                raise ValueError(f"checkpoints in {os.fspath(manager.directory)} kept changing "
                                 f"while being read ({attempts} tries)") from exc
            time.sleep(0.05)
            continue
        if bad:
            warnings.warn(f"corrupt checkpoint step(s) {_listing(bad)}; loaded step {step}, "
                          "the latest intact one", stacklevel=2)
        return step, out
    if bad:
        raise ValueError(f"no intact checkpoint in {os.fspath(manager.directory)}: "
                         f"{_listing(bad)}")
    return None


def _ignore_closed_loop_callbacks() -> None:
    """After a failed orbax restore, the TensorStore reads still in flight finish on the event
    loop orbax has closed, and each prints ``RuntimeError: Event loop is closed`` through
    ``sys.unraisablehook`` (60+ traceback lines for one corrupt step, after the real error
    was reported). From the first failure on, exactly those are dropped; every other
    unraisable exception goes to the previous hook."""
    previous = sys.unraisablehook
    if getattr(previous, "lcjax_closed_loop_filter", False):
        return

    def hook(unraisable):
        exc = unraisable.exc_value
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        previous(unraisable)

    hook.lcjax_closed_loop_filter = True
    sys.unraisablehook = hook


def _listing(bad: dict[int, str]) -> str:
    return "; ".join(f"{s} ({why})" for s, why in sorted(bad.items(), reverse=True))


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
      step: which checkpoint; None = the latest intact one (:func:`restore_latest_intact`).
      uncommit: in a single process, return uncommitted default-device arrays (like
        freshly initialised ones, so jit reuses its executables); False keeps the
        restored shardings (a run on a mesh).

    Returns:
      None if there is no checkpoint, else a dict with ``params``, ``rest``, ``meta``,
      ``step`` and, unless ``opt_state`` is None, ``opt_state`` and ``data_state``
      (``rest`` is the given ``rest`` when the checkpoint has none or it was skipped).
    """
    def restore(s: int) -> dict:
        return _restore_step(manager, s, params=params, rest=rest, opt_state=opt_state,
                             uncommit=uncommit)

    return _at_step(manager, step, restore)


def _at_step(manager: ocp.CheckpointManager, step: int | None, restore: Callable[[int], Any]):
    """``restore(step)``, its failure as one line naming the file; ``step=None``: the latest
    intact step (:func:`restore_latest_intact`), None without checkpoints."""
    if step is None:
        found = restore_latest_intact(manager, restore)
        return None if found is None else found[1]
    try:
        return restore(int(step))
    except ConfigMismatch:
        raise
    except Exception as exc:
        _ignore_closed_loop_callbacks()
        where = os.path.join(os.fspath(manager.directory), str(step))
        raise ValueError(f"cannot read checkpoint step {step}: {describe_failure(where, exc)}"
                         ) from exc


def _restore_step(manager: ocp.CheckpointManager, step: int, *, params: Any, rest: Any,
                  opt_state: Any, uncommit: bool) -> dict:
    """:func:`restore_checkpoint` of one given step, orbax's errors as they come."""
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
    """The ``meta`` item of ``step`` (default: the latest intact one) alone; None without
    checkpoints."""
    return _at_step(manager, step, lambda s: _meta_of(manager, s))


def _meta_of(manager: ocp.CheckpointManager, step: int) -> dict:
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
        raise ConfigMismatch("cannot resume: the checkpoint was written with a different config ("
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
    (default: the latest intact one) from ``DIR/checkpoints``. ``attention`` /
    ``attention_options`` replace the config's attention variant and options (e.g.
    ``"blockwise"`` for a long-context prefill, or ``"plash"`` on a model trained with
    softmax): the stored model is restored as trained, then :func:`with_attention` moves its
    parameters to the new variant and initialises that variant's own parameters
    (``calibration``: tokens for PLASH's data-dependent init). The folder is opened
    read-only: loading a run while it trains is safe (:func:`checkpoint_reader`,
    :func:`restore_latest_intact`).

    Raises:
      ValueError: no ``config.json``, no checkpoint in ``DIR/checkpoints``, or none that
        reads (one line naming the files).
    """
    import json

    from flax import nnx

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
    manager = checkpoint_reader(ckpt)  # read-only: the run may be training
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
    fresh (restored state None). A corrupt latest step is skipped with a warning
    (:func:`restore_latest_intact`) and set aside (:func:`set_aside_after`).

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

        def restore(step: int) -> dict:
            check_resume(_meta_of(manager, step), meta, fields)
            return _restore_step(manager, step, params=params, rest=rest, opt_state=opt_state,
                                 uncommit=uncommit)

        step, restored = restore_latest_intact(manager, restore)
        set_aside_after(manager, step)
    except Exception:
        manager.close()
        raise
    return manager, restored


def set_aside_after(manager: ocp.CheckpointManager, step: int) -> list[str]:
    """Renames the steps after ``step`` (corrupt ones a resume skipped) to
    ``<step>.corrupt[-k]``, kept for inspection but no longer steps, so the resumed run can
    save those step numbers again. Returns the new paths."""
    moved = []
    for later in sorted(s for s in manager.all_steps() if s > step):
        src = os.path.join(os.fspath(manager.directory), str(later))
        dst, k = f"{src}.corrupt", 1
        while os.path.exists(dst):
            dst, k = f"{src}.corrupt-{k}", k + 1
        if jax.process_index() == 0:
            os.rename(src, dst)
        moved.append(dst)
    if moved:
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("lcjax_set_aside_corrupt_steps")
        manager.reload()
    return moved


def is_run_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an lcjax run folder (``lcjax train`` / ``lcjax rl --out``): it has
    ``checkpoints/`` or a ``config.json`` of the form ``{"model": ..., "train" | "grpo": ...}``.
    """
    path = os.fspath(path)
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return True
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            spec = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(spec, dict) and "model" in spec and bool({"train", "grpo"} & set(spec))


def check_out_dir(out_dir: str | os.PathLike, *, resume: bool, overwrite: bool) -> None:
    """Raises what :func:`prepare_out_dir` would, without changing anything."""
    path = os.fspath(out_dir)
    if overwrite and resume:
        raise UsageError("out_dir: overwrite (--overwrite) and resume (--resume) exclude each "
                         "other")
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise UsageError(f"out_dir {path!r} is a file, not a folder")
    if overwrite:
        check_removable(path)
        return
    entries = sorted(os.listdir(path))
    if entries and not is_run_folder(path):
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise UsageError(f"out_dir {path!r} is not empty ({shown}) and is not an lcjax run "
                         "folder: choose a new folder, or replace it with overwrite=True "
                         "(--overwrite)")


def prepare_out_dir(out_dir: str | os.PathLike, *, resume: bool, overwrite: bool) -> None:
    """Guards a run's ``out_dir`` before anything is written to it.

    A missing or empty folder, or an lcjax run folder (:func:`is_run_folder`; whether it
    may be resumed is :func:`open_run`'s check), passes. Any other non-empty folder (a
    Hugging Face checkpoint, a dataset, ...) is refused. ``overwrite`` removes ``out_dir``
    whole first (a run or not), so the run starts fresh.

    Raises:
      ValueError: a non-empty folder that is not a run, without ``overwrite``; ``out_dir``
        is a file; ``overwrite`` with ``resume``; ``overwrite`` of the root, home or working
        folder (:func:`lcjax.data.writes.check_removable`).
    """
    check_out_dir(out_dir, resume=resume, overwrite=overwrite)
    path = os.fspath(out_dir)
    if overwrite and os.path.exists(path):
        if jax.process_index() == 0:
            shutil.rmtree(path)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("lcjax_overwrite_out_dir")
