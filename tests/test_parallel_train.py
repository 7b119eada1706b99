"""Training on a (data, context) mesh of 8 CPU devices: the loss curve of the single-device
run (same seed) to float tolerance, with gradient accumulation and with a context-parallel
attention strategy; sharded orbax checkpoints restored bit for bit onto the same mesh,
another mesh and one device; resume across meshes continues to the same losses; bad
meshes and shapes fail before compilation."""

import dataclasses
import shutil

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lcjax import data
from lcjax.nn import DecoderConfig
from lcjax.parallel import distributed, make_mesh, token_sharding
from lcjax.train import TrainConfig, train
from lcjax.train import checkpoint as ckpt
from lcjax.train.cli import add_arguments, configs_from_args

TINY = DecoderConfig(vocab_size=data.VOCAB_SIZE, d_model=32, num_layers=1, num_heads=2,
                     num_kv_heads=1, head_dim=16, mlp_hidden=64, max_len=64)
_rng = np.random.default_rng(0)
DOCS = [_rng.integers(97, 123, n).astype(np.uint8).tobytes() for n in (300, 170, 410)]


def _cfg(**kw):
    base = dict(steps=4, batch_size=8, seq_len=16, lr=1e-2, warmup_steps=1, log_every=2,
                eval_batches=0, ckpt_every=2, progress=False)
    return TrainConfig(**{**base, **kw})


def _params(model):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def _records(res):
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in res.history]


def test_mesh_training_matches_single_device_and_resumes_across_meshes(tmp_path):
    run = lambda name, stop_at=None, **kw: train(
        TINY, _cfg(out_dir=str(tmp_path / name), **kw), train_docs=DOCS, stop_at=stop_at)
    ref = run("ref")  # one device, the whole batch at once
    assert len(set(ref.losses)) == 4 and ref.losses[-1] < ref.losses[0]
    # batch on data=2, sequence on context=4, two micro-batches per update; stop at step 2
    first = run("mesh", mesh="data=2,context=4", grad_accum=2, stop_at=2)
    np.testing.assert_allclose(first.losses, ref.losses[:2], rtol=1e-5)
    np.testing.assert_allclose([r["grad_norm"] for r in first.history],
                               [r["grad_norm"] for r in ref.history[:2]], rtol=1e-5)
    weights = jax.tree.leaves(nnx.state(first.model, nnx.Param))
    mesh = make_mesh(data=2, context=4)
    assert all(w.sharding.is_equivalent_to(NamedSharding(mesh, P()), w.ndim) for w in weights)

    # the same checkpoint resumed on three meshes: each continues the reference's curve
    out = str(tmp_path / "mesh")
    resumed = {}
    for mesh_spec, accum in (("data=2,context=4", 2), ("data=4,context=2", 2), (None, 1)):
        copy = tmp_path / f"resume_{mesh_spec}"
        shutil.copytree(out, copy)  # each resume starts from the step-2 checkpoint
        res = train(TINY, _cfg(out_dir=str(copy), mesh=mesh_spec, grad_accum=accum,
                               resume=True), train_docs=DOCS)
        assert [r["step"] for r in res.history] == [3, 4]
        np.testing.assert_allclose(res.losses, ref.losses[2:], rtol=1e-5)
        # Adam's g / sqrt(v) magnifies float noise where g ~ 0: bound every weight by a
        # tenth of one update's size (lr), and nearly all of them far tighter
        diff = np.concatenate([np.abs(a - b).ravel()
                               for a, b in zip(_params(res.model), _params(ref.model))])
        assert diff.max() < 0.1 * _cfg().lr and np.mean(diff < 1e-5) > 0.999, diff.max()
        resumed[mesh_spec] = res
    # on the mesh that wrote it, a resume equals the uninterrupted mesh run bit for bit
    full = run("mesh_full", mesh="data=2,context=4", grad_accum=2)
    assert _records(first) + _records(resumed["data=2,context=4"]) == _records(full)
    for a, b in zip(_params(resumed["data=2,context=4"].model), _params(full.model)):
        np.testing.assert_array_equal(a, b)


def test_context_parallel_decoder_trains_like_one_device():
    """``DecoderConfig(context_parallel="upipe")`` (head-chunk stages in a scan, a
    custom_vjp that recomputes each stage, all-to-alls in ``shard_map``; the mesh found through the
    ``jax.set_mesh`` that a mesh run sets) on data=2,context=4: the losses and gradient
    norms of the same LM on one device. (tests/test_parallel_*.py check every strategy's
    outputs and gradients; one strategy here keeps the compile cost down.)"""
    cp = dataclasses.replace(TINY, num_heads=4, num_kv_heads=2, head_dim=8,
                             context_parallel="upipe")
    cfg = _cfg(steps=3, ckpt_every=0, log_every=3)
    ref = train(dataclasses.replace(cp, context_parallel=None), cfg, train_docs=DOCS)
    assert len(set(ref.losses)) == 3
    res = train(cp, dataclasses.replace(cfg, mesh="data=2,context=4"), train_docs=DOCS)
    np.testing.assert_allclose(res.losses, ref.losses, rtol=1e-5)
    np.testing.assert_allclose([r["grad_norm"] for r in res.history],
                               [r["grad_norm"] for r in ref.history], rtol=1e-5)


def test_sharded_checkpoint_restores_onto_other_meshes(tmp_path):
    """Arrays saved sharded over data=2,context=4 restore bit for bit onto the same mesh,
    onto data=4,context=2 with other partitionings, and onto one device."""
    rng = np.random.default_rng(1)
    host = {"w": rng.standard_normal((8, 16), np.float32),
            "b": rng.standard_normal((4,), np.float32)}
    moments = {"m": rng.standard_normal((8, 16), np.float32)}
    key = jax.random.key(5)

    def place(mesh, specs):
        put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))
        return ({k: put(v, specs[k]) for k, v in host.items()},
                {"m": put(moments["m"], specs["m"])},
                {"key": jax.device_put(key, NamedSharding(mesh, P()))})

    a = make_mesh(data=2, context=4)
    params, opt_state, rest = place(a, {"w": P("data", "context"), "b": P("context"),
                                        "m": P(None, "data")})
    assert len({str(s.index) for s in params["w"].addressable_shards}) == 8  # truly sharded
    manager = ckpt.checkpoint_manager(tmp_path / "c")
    ckpt.save_checkpoint(manager, 3, params=params, rest=rest, opt_state=opt_state,
                         data_state={"next_index": 24}, meta={"note": "sharded"})
    b = make_mesh(data=4, context=2)
    targets = {
        "same": (place(a, {"w": P("data", "context"), "b": P("context"), "m": P(None, "data")}),
                 False),
        "other": (place(b, {"w": P("context", "data"), "b": P(), "m": P("data", None)}),
                  False),
        "one device": ((host, moments, {"key": key}), True),
    }
    for name, ((p, o, r), uncommit) in targets.items():
        out = ckpt.restore_checkpoint(manager, params=p, rest=r, opt_state=o, uncommit=uncommit)
        assert out["step"] == 3 and out["data_state"] == {"next_index": 24}, name
        for k in host:
            np.testing.assert_array_equal(np.asarray(out["params"][k]), host[k])
            if not uncommit:  # restored onto the asked sharding, not the saved one
                assert out["params"][k].sharding == p[k].sharding, (name, k)
        np.testing.assert_array_equal(np.asarray(out["opt_state"]["m"]), moments["m"])
        np.testing.assert_array_equal(jax.random.key_data(out["rest"]["key"]),
                                      jax.random.key_data(key))
    manager.close()


def test_batches_are_placed_on_the_mesh():
    mesh = make_mesh(data=2, context=4)
    assert distributed.process_rows(mesh) == (0, 1)  # one process holds every row
    tokens = np.arange(8 * 16, dtype=np.int32).reshape(8, 16)
    extra = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    out = distributed.global_batch({"inputs": tokens, "targets": tokens, "extra": extra}, mesh)
    assert out["inputs"].sharding == token_sharding(mesh)
    assert out["extra"].sharding == NamedSharding(mesh, P("data"))
    for shard in out["inputs"].addressable_shards:  # device (i, j) holds rows i, columns j
        i, j = np.argwhere(mesh.devices == shard.device)[0]
        np.testing.assert_array_equal(np.asarray(shard.data), tokens[4 * i:4 * i + 4,
                                                                     4 * j:4 * j + 4])
    np.testing.assert_array_equal(np.asarray(out["extra"]), extra)


def test_bad_meshes_and_shapes_raise_before_compiling():
    with pytest.raises(ValueError, match="expected 'data=N,context=M'"):
        _cfg(mesh="data=2,model=4")
    with pytest.raises(ValueError, match=r"data \* context = 3 \* 2 = 6 but 8 devices"):
        train(TINY, _cfg(mesh="data=3,context=2"), train_docs=DOCS)
    with pytest.raises(ValueError, match=r"batch_size=8 must be divisible by the mesh's data=4 "
                                         r"times grad_accum=4"):
        train(TINY, _cfg(mesh="data=4,context=2", grad_accum=4), train_docs=DOCS)
    with pytest.raises(ValueError, match=r"seq_len=12 must be divisible by the mesh's "
                                         r"context=8"):
        train(TINY, _cfg(mesh="data=1,context=8", seq_len=12), train_docs=DOCS)
    bad = {"inputs": np.zeros((6, 16), np.int32), "targets": np.zeros((6, 16), np.int32)}
    with pytest.raises(ValueError, match="6 rows does not split over the mesh's data=4"):
        train(TINY, _cfg(mesh="data=4,context=2", eval_batches=0), dataset=[bad])
    bad = {k: np.zeros((8, 10), np.int32) for k in ("inputs", "targets")}
    with pytest.raises(ValueError, match="T=10 is not divisible by the mesh's context=4"):
        train(TINY, _cfg(mesh="data=2,context=4", eval_batches=0), dataset=[bad])


def test_cli_mesh_and_process_flags(monkeypatch):
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--mesh", "data=2,context=4", "--steps", "500", "--coordinator",
                              "127.0.0.1:1234", "--num-processes", "2", "--process-id", "1"])
    _, cfg = configs_from_args(args)
    assert cfg == dataclasses.replace(TrainConfig(steps=500), mesh="data=2,context=4")
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    from lcjax.train import cli

    assert cli.initialize_distributed(args)
    assert calls == [("127.0.0.1:1234", 2, 1)]
    # the environment fills what the flags leave out; half a configuration is an error
    calls.clear()
    monkeypatch.setenv(distributed.ENV_COORDINATOR, "10.0.0.1:8476")
    monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "4")
    monkeypatch.setenv(distributed.ENV_PROCESS_ID, "3")
    assert distributed.initialize() and calls == [("10.0.0.1:8476", 4, 3)]
    monkeypatch.delenv(distributed.ENV_PROCESS_ID)
    with pytest.raises(ValueError, match=r"missing \['process_id'\]"):
        distributed.initialize()
    with pytest.raises(ValueError, match=r"process_id must be in 0 \.\. 3 \(num_processes=4\); "
                                         "got 4"):
        distributed.initialize(process_id=4)
    with pytest.raises(ValueError, match="'host:port'; got 'nohost'"):
        distributed.initialize("nohost", 2, 0)
    for name in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES):
        monkeypatch.delenv(name)
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    calls.clear()
    assert not distributed.initialize() and calls == []  # single process: nothing started
