"""Checkpoint readers are read-only and take the latest intact step: a reader loading a run
30 times while it trains (`--ckpt-every 1`) never disturbs it and always gets a complete step;
a corrupt latest step falls back to the previous one with a warning naming the file, or fails
in one line naming every step's file; a resume skips (and sets aside) a corrupt step; a
truncated last line of metrics.jsonl is dropped and the resume rewrites the log cleanly."""

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from lcjax.nn import DecoderConfig
from lcjax.train import TrainConfig, read_jsonl, train
from lcjax.train import checkpoint as ckpt
from lcjax.train.metrics import truncate_jsonl

ROOT = Path(__file__).resolve().parents[1]
MODEL = dict(d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, mlp_hidden=64,
             max_len=64)
LOADS = 30


def _cli_args(steps: int) -> list[str]:
    train_flags = dict(steps=steps, batch_size=2, seq_len=16, warmup_steps=1, ckpt_every=1,
                       log_every=1, eval_batches=0, keep_checkpoints=3)
    return ["train", "--no-progress", *[a for k, v in {**MODEL, **train_flags}.items()
                                        for a in ("--" + k.replace("_", "-"), str(v))]]


# `lcjax train` that, while the file $READING exists, waits after each save (at most 10 s)
# until the reader has finished one more load (it writes its count to $READS): the run
# advances at most about one step per load, so the reader's 30 loads overlap it however
# fast either side is; the run then finishes at full speed.
PACED_CLI = """
import os, sys, time
from lcjax.train import checkpoint

save, reading, reads = checkpoint.save_checkpoint, os.environ["READING"], os.environ["READS"]

def count():
    try:
        with open(reads) as f:
            return f.read()
    except OSError:
        return ""

seen = [count()]

def paced(*args, **kwargs):
    save(*args, **kwargs)
    deadline = time.monotonic() + 10
    while os.path.exists(reading) and count() == seen[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    seen[0] = count()

checkpoint.save_checkpoint = paced
from lcjax.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _env(**extra):
    env = dict(os.environ, JAX_PLATFORMS="cpu", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _read_step(run: Path) -> dict:
    """What `lcjax serve` / `lcjax eval --model` do (load_model), plus the step it read."""
    model = ckpt.load_model(run)
    _, params, rest = nnx.split(model, nnx.Param, ...)
    manager = ckpt.checkpoint_reader(run / "checkpoints")
    try:
        return ckpt.restore_params(manager, params, rest=rest)
    finally:
        manager.close()


def _first_step(run: Path, child: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not (run / "checkpoints").is_dir() or not [
            n for n in os.listdir(run / "checkpoints") if n.isdigit()]:
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "no checkpoint after 120 s"
        time.sleep(0.05)


def test_reader_hammering_a_training_run(tmp_path):
    run, steps, reading, reads = tmp_path / "run", 40, tmp_path / "reading", tmp_path / "reads"
    script = tmp_path / "paced_cli.py"
    script.write_text(PACED_CLI)
    reading.touch()
    child = subprocess.Popen([sys.executable, str(script), *_cli_args(steps), "--out", str(run)],
                             cwd=ROOT, env=_env(READING=str(reading), READS=str(reads)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _first_step(run, child)
        seen, during = [], 0
        for _ in range(LOADS):
            got = _read_step(run)
            # a complete step: its meta is the step's, every parameter is there and finite
            assert got["meta"]["step"] == got["step"]
            assert sorted(got["meta"]["params"]) == sorted(ckpt.param_shapes(got["params"]))
            assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(got["params"]))
            seen.append(got["step"])
            during += child.poll() is None
            (tmp_path / "reads.tmp").write_text(str(len(seen)))
            os.replace(tmp_path / "reads.tmp", reads)
        reading.unlink()
        out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["step"] == steps
    assert during == LOADS, f"training ended before the reader finished ({during}/{LOADS})"
    assert seen == sorted(seen) and len(set(seen)) > 1, seen  # it read a moving run
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == list(range(1, steps + 1))
    assert sorted(os.listdir(run / "checkpoints")) == [str(s) for s in
                                                       (steps - 2, steps - 1, steps)]


class _VanishingSteps:
    """A manager whose first ``fails`` reloads raise ``error`` (a step deleted mid-listing)."""

    def __init__(self, error, fails):
        self.error, self.fails, self.reloads = error, fails, 0

    def reload(self):
        self.reloads += 1
        if self.reloads <= self.fails:
            raise self.error("step 11 went away")

    def all_steps(self):
        return [12, 13, 14]


@pytest.mark.parametrize("error", [FileNotFoundError, NotADirectoryError])
def test_list_steps_retries_a_step_deleted_while_listing(error):
    """Both ways orbax reports a step the writer deletes under it (seen in the hammer test:
    the folder vanishes between its exists() and is_dir() checks) make the listing retry;
    past the attempts the error is raised."""
    manager = _VanishingSteps(error, fails=3)
    assert ckpt.list_steps(manager) == [12, 13, 14] and manager.reloads == 4
    with pytest.raises(error):
        ckpt.list_steps(_VanishingSteps(error, fails=5), attempts=5)


# ---- corrupt steps and truncated logs, in process ------------------------------------------

TRAIN = dict(steps=4, batch_size=2, seq_len=16, warmup_steps=1, ckpt_every=1, log_every=1,
             eval_batches=0, progress=False, keep_checkpoints=3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run folder with steps 2, 3, 4 and the losses of the uninterrupted run."""
    out = tmp_path_factory.mktemp("run") / "r"
    result = train(DecoderConfig(vocab_size=259, **MODEL), TrainConfig(**TRAIN, out_dir=str(out)))
    return out, result.losses


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _params(run: Path, step: int | None = None) -> list:
    return [np.asarray(x) for x in jax.tree.leaves(
        nnx.state(ckpt.load_model(run, step=step), nnx.Param))]


def _truncate(path: Path, keep: int = 20) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def test_reader_creates_and_deletes_nothing(trained, tmp_path):
    run = _copy(trained[0], tmp_path / "r")
    tmp = run / "checkpoints" / "5.orbax-checkpoint-tmp-123"  # a save in progress
    (tmp / "params").mkdir(parents=True)
    before = sorted(p.relative_to(run).as_posix() for p in run.rglob("*"))
    ckpt.load_model(run)
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) == before
    with pytest.raises(ValueError, match="no checkpoint folder"):
        ckpt.checkpoint_reader(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("damage", ["meta", "array"])
def test_corrupt_latest_step_falls_back_with_warning(trained, tmp_path, damage):
    run = _copy(trained[0], tmp_path / "r")
    step4 = run / "checkpoints" / "4"
    victims = ([step4 / "meta" / "metadata"] if damage == "meta" else
               sorted((step4 / "params" / "d").iterdir()))
    for f in victims:
        _truncate(f)
    with pytest.warns(UserWarning) as record:
        params = _params(run)
    text = " ".join(str(w.message) for w in record)
    assert "loaded step 3" in text, text
    assert (str(victims[0]) if damage == "meta" else str(step4 / "params" / "d")) in text, text
    want = _params(trained[0], 3)
    assert all(np.array_equal(a, b) for a, b in zip(params, want, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(params, _params(trained[0], 4),
                                                         strict=True))


def test_no_intact_step_is_one_line_naming_the_files(trained, tmp_path):
    run = _copy(trained[0], tmp_path / "r")
    for step in (2, 3, 4):
        _truncate(run / "checkpoints" / str(step) / "meta" / "metadata")
    with pytest.raises(ValueError) as err:
        ckpt.load_model(run)
    message = str(err.value)
    assert "\n" not in message and len(message) < 1500, message
    for step in (2, 3, 4):
        assert str(run / "checkpoints" / str(step) / "meta" / "metadata") in message
    with pytest.raises(ValueError, match="cannot read checkpoint step 3: .*3/meta/metadata"):
        ckpt.load_model(run, step=3)


def test_resume_skips_a_corrupt_step_and_a_truncated_log_line(trained, tmp_path):
    src, losses = trained
    run = _copy(src, tmp_path / "r")
    _truncate(run / "checkpoints" / "4" / "meta" / "metadata")
    log = run / "metrics.jsonl"
    whole = log.read_text()
    log.write_text(whole + whole.splitlines()[1][:25])  # a write cut short by a crash
    with pytest.warns(UserWarning, match="truncated last record"):
        assert [r["step"] for r in read_jsonl(log)] == [1, 2, 3, 4]
    with pytest.warns(UserWarning, match=r"corrupt checkpoint step\(s\) 4 .*loaded step 3"):
        result = train(DecoderConfig(vocab_size=259, **MODEL),
                       TrainConfig(**TRAIN, out_dir=str(run), resume=True))
    assert result.step == 4 and [r["step"] for r in result.history] == [4]
    assert result.losses == losses[3:]  # the same loss at step 4 as the uninterrupted run
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rewritten cleanly: no truncated line left
        assert [r["step"] for r in read_jsonl(log)] == [1, 2, 3, 4]
    assert sorted(os.listdir(run / "checkpoints")) == ["2", "3", "4", "4.corrupt"]


def test_metrics_corrupt_middle_line_names_file_and_line(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not JSON"):
        read_jsonl(log)
    with pytest.raises(ValueError, match=r"line 2"):
        truncate_jsonl(log, 3)
