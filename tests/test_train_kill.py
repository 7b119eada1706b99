"""A `lcjax train` process killed with SIGKILL in the middle of a checkpoint save leaves the
previous checkpoint intact, and `lcjax train --resume` continues from it to the same final
losses as an uninterrupted run (bit for bit)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flax import nnx

from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.train import TrainConfig, make_optimizer, read_jsonl
from lcjax.train import checkpoint as ckpt
from lcjax.train.loop import optimizer_hparams

ROOT = Path(__file__).resolve().parents[1]
MODEL = dict(d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, mlp_hidden=64,
             max_len=64)
TRAIN = dict(steps=6, batch_size=4, seq_len=16, warmup_steps=1, ckpt_every=2, log_every=1,
             eval_batches=0)
ARGS = ["train", "--no-progress", *[
    a for k, v in {**MODEL, **TRAIN}.items() for a in ("--" + k.replace("_", "-"), str(v))]]

# `lcjax train` whose save of step $STALL_STEP stops in the middle: orbax has opened the
# step's temporary folder and is writing its items when the meta item (the JSON holding
# {"step": ...}) blocks. Patches orbax's JSON handler, in the child process only.
STALLED_CLI = """
import os, sys, time
from orbax.checkpoint._src.handlers import json_checkpoint_handler as h

save, target = h.JsonCheckpointHandler._save_fn, int(os.environ["STALL_STEP"])

async def stalled(self, x, directory):
    if isinstance(x, dict) and x.get("step") == target:
        open(os.environ["STALL_MARKER"], "w").close()
        time.sleep(600)
    return await save(self, x, directory)

h.JsonCheckpointHandler._save_fn = stalled
from lcjax.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _env(cache: Path, **extra):
    # one persistent compilation cache: the three runs compile the same step once
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(cache), **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _logged(out: Path):
    return [{k: v for k, v in r.items() if k != "tokens_per_s"}
            for r in read_jsonl(out / "metrics.jsonl")]


def test_sigkill_during_checkpoint_save_then_resume(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    script, marker = tmp_path / "stalled_cli.py", tmp_path / "saving"
    script.write_text(STALLED_CLI)
    cli, cache = [sys.executable, "-m", "lcjax.cli"], tmp_path / "jax_cache"
    pipe = dict(cwd=ROOT, capture_output=True, text=True, timeout=300)
    straight = subprocess.run([*cli, *ARGS, "--out", str(a)], env=_env(cache), **pipe)
    assert straight.returncode == 0, straight.stderr[-2000:]

    killed = subprocess.Popen([sys.executable, str(script), *ARGS, "--out", str(b)],
                              env=_env(cache, STALL_STEP="4", STALL_MARKER=str(marker)),
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert killed.poll() is None, f"exited before the stalled save: {killed.communicate()}"
            assert time.monotonic() < deadline, "the save of step 4 never started"
            time.sleep(0.05)
        killed.send_signal(signal.SIGKILL)
        killed.wait(60)
    finally:
        killed.kill()
        killed.communicate()
    assert killed.returncode == -signal.SIGKILL

    # the save of step 4 was in progress: only orbax's temporary folder exists for it
    left = sorted(os.listdir(b / "checkpoints"))
    assert "2" in left and "4" not in left, left
    assert any(name.startswith("4.orbax-checkpoint-tmp") for name in left), left

    # the previous checkpoint restores (opening the manager removes the partial save)
    cfg = TrainConfig(**TRAIN)
    _, params, rest = nnx.split(DecoderLM(DecoderConfig(vocab_size=259, **MODEL),
                                          rngs=nnx.Rngs(0)), nnx.Param, ...)
    manager = ckpt.checkpoint_manager(b / "checkpoints")
    assert manager.latest_step() == 2
    restored = ckpt.restore_checkpoint(manager, params=params, rest=rest,
                                       opt_state=make_optimizer(**optimizer_hparams(cfg))
                                       .init(params))
    manager.close()
    assert restored["step"] == restored["meta"]["step"] == 2
    assert restored["data_state"] == {"next_index": 2}  # two batches consumed
    assert not any("tmp" in name for name in os.listdir(b / "checkpoints"))

    resumed = subprocess.run([*cli, *ARGS, "--out", str(b), "--resume"], env=_env(cache),
                             **pipe)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final = lambda text: {k: v for k, v in json.loads(text.strip().splitlines()[-1]).items()
                          if k != "tokens_per_s"}
    assert final(resumed.stdout) == final(straight.stdout)
    # every step logged once (the killed run's steps 3-4 were dropped on resume), same values
    assert [r["step"] for r in _logged(b)] == list(range(1, 7))
    assert _logged(b) == _logged(a)  # loss, lr, grad_norm of every step, bit for bit
    assert sorted(os.listdir(b / "checkpoints")) == ["2", "4", "6"]
