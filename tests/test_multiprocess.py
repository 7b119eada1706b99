"""Two processes on 127.0.0.1, 4 CPU devices each (gloo collectives), train one model on a
data=2,context=4 mesh spanning both, its attention layer context-parallel (Ulysses): each
process builds only its block of rows of every global batch, and the losses and held-out
loss are those of one process on one device trained on the same documents with the same
seed; the checkpoint the two processes wrote resumes in one process and continues the
same curve. The data pipeline's process blocks are checked against the one-process
batches directly."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import grain
import numpy as np
import pytest
from flax import nnx

from lcjax import data
from lcjax.parallel import init_layer_params, layer_apply
from lcjax.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]
MODEL = "one-layer ContextParallelLM"  # the model config the checkpoint's meta records
TRAIN = dict(steps=4, batch_size=8, seq_len=16, lr=1e-2, warmup_steps=1, log_every=1,
             eval_batches=0, progress=False)
_rng = np.random.default_rng(3)
DOCS = [_rng.integers(97, 123, n).astype(np.uint8).tobytes().decode() for n in (350, 260)]
HELD_OUT = [_rng.integers(97, 123, 300).astype(np.uint8).tobytes().decode()]

# one process of the job: LCJAX_* name the coordinator, the process count and this process
WORKER = """
import json, os, sys
from lcjax.parallel import distributed
assert distributed.initialize()                     # from LCJAX_COORDINATOR etc.
import jax
jax.config.update("jax_default_matmul_precision", "highest")
sys.path.insert(0, "tests")
from test_multiprocess import ContextParallelLM
from lcjax.parallel import make_mesh
from lcjax.train import TrainConfig, train
spec = json.loads(sys.argv[1])
assert (jax.process_count(), jax.device_count(), jax.local_device_count()) == (2, 8, 4)
mesh = make_mesh(data=2, context=4)
res = train(spec["model"], TrainConfig(**spec["train"]), train_docs=spec["docs"],
            eval_docs=spec["eval_docs"], stop_at=spec["stop_at"],
            model_fn=lambda _, rngs: ContextParallelLM("ulysses", rngs))
rows = distributed.process_rows(mesh)
print("RESULT " + json.dumps({"process": jax.process_index(), "rows": rows,
                              "losses": res.losses, "evals": res.evals}), flush=True)
"""


class ContextParallelLM(nnx.Module):
    """A one-layer byte LM whose attention layer (projections included) runs a context-
    parallel strategy of :func:`lcjax.parallel.layer_apply` on the mesh it finds in
    ``jax.set_mesh`` (which ``train(..., mesh=...)`` sets); ``"none"``: one device.
    logits = E^T (x + Attn(x)), x = E[tokens]; H=4, Hkv=2 (kv_heads < C=4 for Ulysses).
    Its config (:data:`MODEL`) is the same for every strategy, so the checkpoint of the
    Ulysses run resumes on one device ("none"); a resume checks every ``DecoderConfig``
    field, ``context_parallel`` included."""

    def __init__(self, strategy: str, rngs: nnx.Rngs):
        self.strategy = strategy
        self.embed = nnx.Embed(data.VOCAB_SIZE, 32, rngs=rngs)
        self.attn = nnx.Param(init_layer_params(rngs.params(), d_model=32, num_heads=4,
                                                num_kv_heads=2, head_dim=8))

    def __call__(self, tokens):
        x = self.embed(tokens)
        return self.embed.attend(x + layer_apply(self.strategy, dict(self.attn.get_value()), x))


def _one_device(_, rngs):
    return ContextParallelLM("none", rngs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("count", [2, 4])
def test_processes_take_their_rows_of_the_one_process_batches(count):
    """make_dataset(shard_index=p, shard_count=n) is rows [p B/n, (p+1) B/n) of the batch
    one process gets with the same seed, across an epoch boundary (reshuffled), with
    segments; a strided split of the windows would give other rows."""
    kw = dict(seq_len=8, batch_size=8, seed=11, segments=True)
    one = data.make_iterator(data.make_dataset(DOCS, shard_index=0, shard_count=1, **kw))
    its = [data.make_iterator(data.make_dataset(DOCS, shard_index=p, shard_count=count, **kw))
           for p in range(count)]
    epoch = data.num_windows(len(data.pack_stream(DOCS, 8)), 8) // 8 + 1
    for _ in range(epoch + 2):
        want, parts = next(one), [next(it) for it in its]
        assert all(p["inputs"].shape == (8 // count, 8) for p in parts)
        for key in want:
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), want[key])
        assert not np.array_equal(parts[0]["inputs"], parts[1]["inputs"])


def _held_out() -> grain.MapDataset:
    """The held-out batches of the 2-process run's eval (whole global batches only)."""
    return data.make_dataset(HELD_OUT, seq_len=TRAIN["seq_len"], batch_size=TRAIN["batch_size"],
                             seed=TrainConfig().data_seed, num_epochs=1, drop_remainder=True,
                             shard_index=0, shard_count=1)


def test_two_processes_train_like_one(tmp_path):
    out = tmp_path / "run"
    spec = {"model": MODEL, "docs": DOCS, "eval_docs": HELD_OUT, "stop_at": 2,
            "train": {**TRAIN, "mesh": "data=2,context=4", "out_dir": str(out),
                      "eval_batches": None, "eval_every": 2}}
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    # 4 devices per worker; the suite's LLVM opt level (tests/conftest.py) carries over
    opt = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if f.startswith("--xla_backend_optimization_level")]
    env.update(XLA_FLAGS=" ".join(["--xla_force_host_platform_device_count=4", *opt]),
               JAX_PLATFORMS="cpu",
               LCJAX_COORDINATOR=f"127.0.0.1:{port}", LCJAX_NUM_PROCESSES="2")
    procs = [subprocess.Popen(
        [sys.executable, "-c", WORKER, json.dumps(spec)], cwd=ROOT,
        env={**env, "LCJAX_PROCESS_ID": str(i)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    try:
        logs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    results = [json.loads(line[len("RESULT "):]) for log in logs
               for line in log.splitlines() if line.startswith("RESULT ")]
    assert sorted((r["process"], tuple(r["rows"])) for r in results) == [(0, (0, 2)),
                                                                        (1, (1, 2))]
    assert results[0]["losses"] == results[1]["losses"]  # one program, one loss

    # one process, one device, the same documents and seed (so the same global batches)
    held_out = _held_out()
    assert len(held_out) == 2
    cfg = TrainConfig(**{**TRAIN, "eval_batches": None, "eval_every": 2})
    ref = train(MODEL, cfg, train_docs=DOCS, eval_dataset=held_out, model_fn=_one_device)
    assert len(set(ref.losses)) == 4
    np.testing.assert_allclose(results[0]["losses"], ref.losses[:2], rtol=1e-5)
    (mp_eval,) = results[0]["evals"]
    assert mp_eval["eval_tokens"] == ref.evals[0]["eval_tokens"] > 8 * 16
    np.testing.assert_allclose(mp_eval["eval_loss"], ref.evals[0]["eval_loss"], rtol=1e-5)

    # the checkpoint both processes wrote, resumed in this process on one device
    resumed = train(MODEL, TrainConfig(**TRAIN, out_dir=str(out), resume=True),
                    train_docs=DOCS, model_fn=_one_device)
    assert [r["step"] for r in resumed.history] == [3, 4]
    np.testing.assert_allclose(resumed.losses, ref.losses[2:], rtol=1e-5)
