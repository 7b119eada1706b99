"""Nothing is overwritten or mixed: `lcjax train --out` refuses a non-empty folder that is not
an lcjax run (and `--overwrite` replaces it), `lcjax data tablelong` refuses a folder with
data and replaces it whole with `--overwrite`, bad arguments create nothing, a failed write
leaves the old folder and no temporary; an HF index cannot point outside its folder; a
missing tokenizer file is named."""

import json
import os
import re
from pathlib import Path

import pytest
from flax import nnx

from lcjax.cli import main
from lcjax.data.tablelong import ShardSource, generate_item, write_shards
from lcjax.data.tablelong import shards as shards_mod
from lcjax.data.writes import check_removable
from lcjax.interop import load_hf, save_hf
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.train import TrainConfig, train
from lcjax.train import checkpoint as ckpt

MODEL = dict(d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, mlp_hidden=64,
             max_len=64)
TRAIN_ARGS = ["train", "--no-progress", *[
    a for k, v in {**MODEL, "steps": 2, "batch_size": 2, "seq_len": 16, "warmup_steps": 1,
                   "log_every": 1, "eval_batches": 0}.items()
    for a in ("--" + k.replace("_", "-"), str(v))]]


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def _hf_like(folder: Path) -> Path:
    """A folder that is not an lcjax run: an HF config, weights and a log of its own."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (folder / "model.safetensors").write_bytes(os.urandom(64))
    (folder / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    return folder


# ---- lcjax train --out ---------------------------------------------------------------------

def test_train_refuses_a_foreign_folder_and_leaves_it_byte_identical(tmp_path, capsys):
    """`lcjax train --out` on a folder that is not a run: a one-line error, exit 2, the
    folder byte-identical (through the CLI and through `train` itself)."""
    foreign = _hf_like(tmp_path / "hf")
    before = _snapshot(foreign)
    for extra in ([], ["--resume"]):
        assert main([*TRAIN_ARGS, "--out", str(foreign), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not an lcjax run" in err and "Traceback" not in err
        assert _snapshot(foreign) == before
    assert main([*TRAIN_ARGS, "--out", str(foreign), "--overwrite", "--resume"]) == 2
    assert "exclude each other" in capsys.readouterr().err
    assert _snapshot(foreign) == before
    with pytest.raises(ValueError, match="not an lcjax run folder.*--overwrite"):
        train(DecoderConfig(vocab_size=259, **MODEL),
              TrainConfig(steps=2, batch_size=2, seq_len=16, out_dir=str(foreign),
                          progress=False))
    assert _snapshot(foreign) == before
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        ckpt.prepare_out_dir(tmp_path / "file", resume=False, overwrite=False)


def test_train_overwrite_replaces_the_folder_and_a_run_folder_passes(tmp_path, monkeypatch):
    import lcjax.train.cli as train_cli
    from lcjax.train.loop import TrainResult

    calls = []

    def fake_train(model_cfg, cfg, *, overwrite=False, **kwargs):  # the CLI wiring, no compile
        calls.append(overwrite)
        ckpt.prepare_out_dir(cfg.out_dir, resume=cfg.resume, overwrite=overwrite)
        return TrainResult([], [], 0, None)

    monkeypatch.setattr(train_cli, "train", fake_train)
    foreign = _hf_like(tmp_path / "hf")
    assert main([*TRAIN_ARGS, "--out", str(foreign), "--overwrite"]) == 0
    assert calls == [True] and not foreign.exists()  # removed whole, the run starts fresh
    # an lcjax run folder passes the guard (whether it may be resumed is open_run's check)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    ckpt.prepare_out_dir(run, resume=False, overwrite=False)
    hf_config_only = _hf_like(tmp_path / "cfg")
    (hf_config_only / "config.json").write_text(json.dumps({"model": {}, "train": {}}))
    assert ckpt.is_run_folder(hf_config_only) and ckpt.is_run_folder(run)
    assert not ckpt.is_run_folder(_hf_like(tmp_path / "hf2"))
    # empty and missing folders are fine and stay as they are
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "missing"):
        ckpt.prepare_out_dir(path, resume=False, overwrite=False)
    assert not (tmp_path / "missing").exists() and not os.listdir(tmp_path / "empty")


def test_overwrite_never_removes_the_working_folder_or_above(tmp_path, monkeypatch):
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    (inner / "keep.txt").write_text("x")
    monkeypatch.chdir(inner)
    for path in (inner, tmp_path / "a", Path("/"), Path.home()):
        with pytest.raises(ValueError, match="refusing to replace"):
            check_removable(path)
        with pytest.raises(ValueError, match="refusing to replace"):
            ckpt.prepare_out_dir(path, resume=False, overwrite=True)
    assert (inner / "keep.txt").read_text() == "x"


def test_library_train_refuses_too(tmp_path):
    foreign = _hf_like(tmp_path / "hf")
    before = _snapshot(foreign)
    with pytest.raises(ValueError, match="not an lcjax run folder"):
        train(DecoderConfig(vocab_size=259, **MODEL),
              TrainConfig(steps=2, batch_size=2, seq_len=16, warmup_steps=1, eval_batches=0,
                          progress=False, out_dir=str(foreign)))
    assert _snapshot(foreign) == before


# ---- lcjax data tablelong ------------------------------------------------------------------

DATA = ["data", "tablelong", "--n", "4", "--min-len", "1k", "--max-len", "2k", "--shard-size",
        "2", "--no-progress"]


def _siblings(parent: Path) -> list[str]:
    return sorted(os.listdir(parent))


def test_data_refuses_a_folder_with_data_then_replaces_it_whole(tmp_path, capsys):
    out = tmp_path / "tl"
    assert main([*DATA, "--seed", "1", "--out", str(out)]) == 0
    (out / "shard-000009.jsonl").write_text('{"stale": true}\n')  # a shard of an older run
    (out / "notes.txt").write_text("mine")
    before = _snapshot(out)
    assert main([*DATA, "--seed", "2", "--out", str(out)]) == 2  # one line, no traceback
    err = capsys.readouterr().err
    assert "already holds data" in err and "--overwrite" in err and "Traceback" not in err
    assert _snapshot(out) == before
    capsys.readouterr()
    assert main([*DATA, "--seed", "2", "--out", str(out), "--overwrite"]) == 0
    # replaced whole: only the new run's files, all of seed 2, the summary agrees
    assert sorted(os.listdir(out)) == ["shard-000000.jsonl", "shard-000001.jsonl",
                                       "summary.json"]
    items = list(ShardSource(out)[i] for i in range(4))
    assert [it["seed"] for it in items] == [2, 2, 2, 2]
    assert items[3] == generate_item(2, 3, min_len=1024, max_len=2048)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seed"] == 2 and summary["items"] == 4
    assert _siblings(tmp_path) == ["tl"]  # no temporary or old folder left


@pytest.mark.parametrize("bad, match", [
    (["--tasks", "nosuchtask"], "unknown or no tasks"),
    (["--min-len", "2k", "--max-len", "1k"], "min_len <= max_len"),
    (["--languages", ","], "unknown or no languages"),
    (["--tokenizer", "/nonexistent/tokenizer.json"], "/nonexistent/tokenizer.json"),
    (["--workers", "0"], "workers"),
])
def test_data_bad_arguments_create_nothing(tmp_path, capsys, bad, match):
    out = tmp_path / "new" / "tl"
    assert main([*DATA, "--out", str(out), *bad]) == 2  # a one-line user error, exit 2
    err = capsys.readouterr().err
    assert re.search(match, err) and err.count("\n") == 1
    assert not (tmp_path / "new").exists()


def test_failed_write_leaves_the_old_folder_and_no_temporary(tmp_path, monkeypatch):
    out = tmp_path / "tl"
    write_shards(out, 4, min_len=1024, max_len=2048, shard_size=2, seed=1, progress=False)
    before = _snapshot(out)

    def failing(seed, index, **kwargs):
        if index == 3:
            raise RuntimeError("generator failed at item 3")
        return generate_item(seed, index, **kwargs)

    monkeypatch.setattr(shards_mod, "generate_item", failing)
    with pytest.raises(RuntimeError, match="item 3"):
        write_shards(out, 4, min_len=1024, max_len=2048, shard_size=2, seed=2, progress=False,
                     overwrite=True)
    assert _snapshot(out) == before
    assert _siblings(tmp_path) == ["tl"]
    with pytest.raises(ValueError, match="unknown arguments"):
        write_shards(tmp_path / "x", 4, min_len=1024, max_len=2048, colour="red")
    assert _siblings(tmp_path) == ["tl"]


# ---- Hugging Face checkpoints --------------------------------------------------------------

def test_hf_index_cannot_point_outside_the_folder(tmp_path):
    model = DecoderLM(DecoderConfig(vocab_size=64, **MODEL), rngs=nnx.Rngs(0))
    folder = tmp_path / "hf"
    files = save_hf(model, folder, max_shard_bytes=8_000)
    assert len(files) > 1
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    moved = Path(files[0]).name
    (tmp_path / "outside").mkdir()
    os.replace(folder / moved, tmp_path / "outside" / "x.safetensors")
    for target in ("../outside/x.safetensors", str(tmp_path / "outside" / "x.safetensors")):
        index["weight_map"] = {k: (target if v == moved else v)
                               for k, v in index["weight_map"].items()}
        index_path.write_text(json.dumps(index))
        with pytest.raises(ValueError, match="outside/x.safetensors"):
            load_hf(folder)
        moved = target
    os.symlink(tmp_path / "outside" / "x.safetensors", folder / "link.safetensors")
    index["weight_map"] = {k: ("link.safetensors" if v == moved else v)
                           for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match="outside the checkpoint folder"):
        load_hf(folder)
    index["weight_map"] = {k: ("gone.safetensors" if v == "link.safetensors" else v)
                           for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match="gone.safetensors.*does not exist"):
        load_hf(folder)


def test_tokenizer_file_errors_name_the_file(tmp_path):
    from lcjax.data.suites import load_tokenizer_file
    from lcjax.serve.model import HFTokenizer

    with pytest.raises(ValueError, match="tokenizer file .*missing.json.* does not exist"):
        load_tokenizer_file(tmp_path / "missing.json")
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": ')  # cut short
    with pytest.raises(ValueError, match="tokenizer.json.* does not load"):
        load_tokenizer_file(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="tokenizer.json.* does not load"):
        HFTokenizer(tmp_path)
