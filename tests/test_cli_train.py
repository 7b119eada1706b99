"""`lcjax train` as a user drives it (issue 36 item 6): a resume reads the run's stored
config.json, `--steps N` extends a finished run (equal to an uninterrupted run when the
schedule does not depend on the total), `--data`, `--init`, `--attention-options`, and user
errors as one line with exit status 2 and no traceback."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.cli import main
from lcjax.data.text_files import read_documents
from lcjax.train import TrainConfig, lr_schedule
from lcjax.train.checkpoint import load_model
from lcjax.train.cli import split_documents
from lcjax.train.metrics import read_jsonl

TINY = ["--d-model", "32", "--num-layers", "1", "--num-heads", "2", "--num-kv-heads", "2",
        "--head-dim", "16", "--mlp-hidden", "64", "--max-len", "64", "--batch-size", "2",
        "--seq-len", "32", "--log-every", "1", "--eval-batches", "1", "--no-progress"]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "far", "away"]
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text(" ".join(rng.choice(words, 800)))
    return str(path)


def _losses(out):
    return {r["step"]: r["loss"] for r in read_jsonl(os.path.join(out, "metrics.jsonl"))
            if "loss" in r}


def _params(out):
    return jax.tree.leaves(nnx.state(load_model(out), nnx.Param))


def test_resume_reads_config_and_extension_equals_uninterrupted_run(tmp_path, text_file):
    """20 steps, then `--out D --resume --steps 40` with no other flag, equals 40 steps in
    one go: the same losses at every step and the same final parameters, bit for bit. The
    schedule must not depend on the total for that (warm-up 5, then constant:
    --min-lr-ratio 1), as docs/training.md says."""
    sched = ["--warmup-steps", "5", "--min-lr-ratio", "1", "--data", text_file]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert main(["train", "--steps", "20", "--out", a, *TINY, *sched]) == 0
    assert main(["train", "--out", a, "--resume", "--steps", "40"]) == 0
    assert main(["train", "--steps", "40", "--out", b, *TINY, *sched]) == 0
    la, lb = _losses(a), _losses(b)
    assert sorted(la) == sorted(lb) == list(range(1, 41))
    assert [la[k] for k in la] == [lb[k] for k in la]
    for x, y in zip(_params(a), _params(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    stored = json.loads(open(os.path.join(a, "config.json")).read())
    assert stored["train"]["steps"] == 40 and stored["data"]["path"] == text_file


def test_default_warmup_and_the_extended_schedule(tmp_path, text_file):
    """`--steps 8` with the default warm-up (was 100 > steps: a crash); extended to 12, steps
    9..12 follow the schedule over 12 steps with the stored warm-up."""
    out = str(tmp_path / "run")
    assert main(["train", "--steps", "8", "--out", out, *TINY, "--data", text_file]) == 0
    stored = json.loads(open(os.path.join(out, "config.json")).read())["train"]
    assert stored["warmup_steps"] == 0  # min(100, 8 // 10)
    assert main(["train", "--out", out, "--resume", "--steps", "12"]) == 0
    lrs = {r["step"]: r["lr"] for r in read_jsonl(os.path.join(out, "metrics.jsonl"))
           if "lr" in r}
    want = lr_schedule(TrainConfig(steps=12, warmup_steps=0, lr=stored["lr"],
                                   min_lr_ratio=stored["min_lr_ratio"]))
    np.testing.assert_allclose([lrs[k] for k in range(9, 13)],
                               np.asarray(want(np.arange(9, 13))), rtol=1e-6)
    assert TrainConfig(steps=50).warmup_steps == 5 and TrainConfig().warmup_steps == 100


def test_init_from_a_run_with_attention_options(tmp_path, text_file):
    """`--init RUN` starts from the run's parameters (lr 0: they stay), here with another
    attention and its options."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    assert main(["train", "--steps", "2", "--out", src, *TINY, "--data", text_file]) == 0
    assert main(["train", "--steps", "2", "--out", dst, "--init", src, "--lr", "0",
                 "--attention", "performer", "--attention-options", '{"num_features": 8}',
                 "--data", text_file, "--seq-len", "32", "--batch-size", "2",
                 "--no-progress", "--eval-batches", "1"]) == 0
    model_cfg = json.loads(open(os.path.join(dst, "config.json")).read())["model"]
    assert model_cfg["attention"] == "performer"
    assert model_cfg["attention_options"] == {"num_features": 8}
    for x, y in zip(_params(src), _params(dst), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_read_documents_and_split(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_bytes(b"plain \xff bytes")
    (tmp_path / "d" / "b.jsonl").write_text('{"text": "one"}\n\n{"text": "two"}\n')
    (tmp_path / "d" / ".hidden").write_text("skip me")
    assert read_documents(tmp_path / "d") == [b"plain \xff bytes", "one", "two"]
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"title": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        read_documents(tmp_path / "bad.jsonl")
    train, held = split_documents([str(i) for i in range(10)], 0.2, seed=0)
    assert len(train) == 8 and len(held) == 2 and sorted(train + held) == sorted(map(str,
                                                                                   range(10)))
    assert split_documents(["abcdefghij"], 0.3, seed=0) == (["abcdefg"], ["hij"])


def _cli(*args, cwd):
    env = {**os.environ, "TPU_WORKER_HOSTNAMES": "localhost", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
           "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "lcjax.cli", "train", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def _main(args, capsys):
    """`python -m lcjax.cli train ARGS` in-process (it runs sys.exit(main()))."""
    try:
        rc = main(["train", *args])
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


def test_user_error_in_a_subprocess(tmp_path):
    proc = _cli("--out", str(tmp_path), "--resume", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("lcjax")]
    assert lines == [f"lcjax train: error: --resume: {str(tmp_path)!r} is not an lcjax train "
                     "run (no config.json); train into it without --resume"], proc.stderr


def test_user_errors_exit_2_with_one_line(tmp_path, text_file, capsys):
    (tmp_path / "notarun").mkdir()
    (tmp_path / "bad.json").write_text("{not json")
    cases = [
        (["--attention", "nosuch"], "invalid choice: 'nosuch'"),
        (["--attention-options", "{bad"], "--attention-options: not JSON"),
        (["--attention-options", "[1, 2]"], "need a JSON object"),
        (["--attention", "performer", "--attention-options", '{"nope": 1}'],
         "takes no option(s) ['nope']"),
        (["--data", str(tmp_path / "missing.txt")], "--data: no such file"),
        (["--out", str(tmp_path / "notarun"), "--resume"], "is not an lcjax train run"),
        (["--resume"], "--resume needs --out"),
        (["--init", str(tmp_path / "notarun")], "--init:"),
        (["--config", str(tmp_path / "bad.json")], "not JSON"),
        (["--config", str(tmp_path / "none.json")], "--config:"),
        (["--steps", "0"], "steps must be >= 1"),
        (["--steps", "5", "--warmup-steps", "9"], "warmup_steps"),
        (["--no-such-flag"], "unrecognized arguments"),
    ]
    for args, says in cases:
        rc, err = _main(args, capsys)
        assert rc == 2, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lcjax"), (args, err)
        assert "error:" in lines[0], (args, err)
        assert says in lines[0], (args, err)


def test_init_from_a_hugging_face_export(tmp_path, text_file, capsys):
    """`--init HF_DIR` on a save_hf export of a run (byte tokenizer written by save_hf): the
    new run starts from those weights (lr 0: the same logits); a folder with a foreign
    tokenizer is refused."""
    from lcjax.interop.hf import save_hf

    src, hf_dir, dst = (str(tmp_path / n) for n in ("src", "hf", "dst"))
    assert main(["train", "--steps", "1", "--out", src, *TINY, "--data", text_file]) == 0
    before = load_model(src)
    save_hf(before, hf_dir)
    assert main(["train", "--steps", "1", "--out", dst, "--init", hf_dir, "--lr", "0",
                 "--data", text_file, "--seq-len", "32", "--batch-size", "2",
                 "--no-progress", "--eval-batches", "1"]) == 0
    x = jnp.asarray([[256, 104, 105, 32, 116, 104, 101]])
    np.testing.assert_allclose(np.asarray(load_model(dst)(x)), np.asarray(before(x)),
                               rtol=1e-5, atol=1e-5)
    with open(os.path.join(hf_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)
    rc, err = _main(["--steps", "1", "--out", str(tmp_path / "x"), "--init", hf_dir], capsys)
    assert rc == 2 and "has its own tokenizer" in err
