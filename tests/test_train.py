"""Tests of lcjax.train: schedule, losses, exact checkpoint resume, overfitting, CLI."""

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax import data
from lcjax.nn import DecoderConfig
from lcjax.train import TrainConfig, bits_per_byte, lr_schedule, read_jsonl, token_nll, train
from lcjax.train import checkpoint as ckpt

TINY = DecoderConfig(vocab_size=data.VOCAB_SIZE, d_model=32, num_layers=1, num_heads=2,
                     num_kv_heads=1, head_dim=16, mlp_hidden=64, max_len=64)


def _docs(n, seed):
    rng = np.random.default_rng(seed)
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis"]
    return [" ".join(rng.choice(words, rng.integers(20, 80))) + "\n" for _ in range(n)]


def _cfg(**kw):
    base = dict(steps=8, batch_size=4, seq_len=16, lr=1e-2, warmup_steps=2, log_every=3,
                eval_batches=2, progress=False)
    return TrainConfig(**{**base, **kw})


def test_lr_schedule_closed_form():
    cfg = TrainConfig(steps=100, lr=3e-3, warmup_steps=10, min_lr_ratio=0.1)
    sched = lr_schedule(cfg)
    lo = 3e-3 * 0.1

    def closed(k):
        if k <= 10:
            return 3e-3 * k / 10
        return lo + (3e-3 - lo) * 0.5 * (1 + math.cos(math.pi * (k - 10) / 90))

    for k in (1, 5, 10, 11, 40, 55, 99, 100):
        np.testing.assert_allclose(float(sched(k)), closed(k), rtol=1e-5, err_msg=f"k={k}")
    np.testing.assert_allclose(float(sched(55)), (3e-3 + lo) / 2, rtol=1e-5)
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(steps=10, warmup_steps=10)


def test_token_nll_ignores_pad_and_bits_per_byte():
    V = data.VOCAB_SIZE
    targets = jnp.array([[1, 2, data.PAD], [data.EOS, data.PAD, data.PAD]])
    logits = jnp.zeros((2, 3, V)).at[0, 0, 1].set(5.0)  # token 1 made likely at one position
    nll, mask = token_nll(logits, targets)
    np.testing.assert_array_equal(mask, targets != data.PAD)
    assert float(nll[0, 2]) == float(nll[1, 1]) == 0.0
    np.testing.assert_allclose(nll[0, 1], math.log(V), rtol=1e-6)
    np.testing.assert_allclose(nll[0, 0], -jax.nn.log_softmax(logits[0, 0])[1], rtol=1e-6)
    # uniform prediction: log2(V) bits per byte
    np.testing.assert_allclose(bits_per_byte(3 * math.log(V), 3), math.log2(V), rtol=1e-12)


def test_resume_reproduces_uninterrupted_run_bit_for_bit(tmp_path):
    docs, held = _docs(12, 0), _docs(3, 1)
    kw = dict(train_docs=docs, eval_docs=held)
    full = train(TINY, _cfg(out_dir=str(tmp_path / "a")), **kw)
    first = train(TINY, _cfg(out_dir=str(tmp_path / "b"), ckpt_every=2, keep_checkpoints=2),
                  stop_at=4, **kw)
    assert first.step == 4 and not first.evals
    mgr = ckpt.checkpoint_manager(tmp_path / "b" / "checkpoints", max_to_keep=2)
    assert mgr.all_steps() == [2, 4]  # keeps the last two
    mgr.close()
    rest = train(TINY, _cfg(out_dir=str(tmp_path / "b"), resume=True), **kw)  # fresh objects
    assert [r["step"] for r in rest.history] == [5, 6, 7, 8]
    assert first.losses + rest.losses == full.losses  # bit for bit
    assert rest.evals == full.evals
    for a, b in zip(jax.tree.leaves(full.model), jax.tree.leaves(rest.model)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    logged = read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in logged if "loss" in r] == list(range(1, 9))
    assert [r for r in logged if "eval_bpb" in r] == full.evals


class _DropoutLM(nnx.Module):
    """Stand-in model with RNG state (dropout): resume must restore its RNG counts too."""

    def __init__(self, cfg, rngs):
        self.embed = nnx.Embed(data.VOCAB_SIZE, 16, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, tokens):  # [B, T] -> [B, T, V]
        return self.embed.attend(self.drop(self.embed(tokens)))


def test_resume_restores_rng_state(tmp_path):
    kw = dict(train_docs=_docs(6, 2), eval_docs=_docs(1, 3), model_fn=_DropoutLM)
    full = train(None, _cfg(steps=6, out_dir=str(tmp_path / "a")), **kw)
    first = train(None, _cfg(steps=6, out_dir=str(tmp_path / "b")), stop_at=3, **kw)
    rest = train(None, _cfg(steps=6, out_dir=str(tmp_path / "b"), resume=True), **kw)
    assert first.losses + rest.losses == full.losses
    assert len(set(full.losses)) == 6
    count = lambda m: int(nnx.state(m, nnx.RngCount)["drop"]["rngs"]["count"].get_value())
    assert count(rest.model) == count(full.model) == count(first.model) + 3


def test_loss_decreases_on_tiny_overfit():
    doc = "the quick brown fox jumps over the lazy dog. " * 4
    cfg = _cfg(steps=40, lr=3e-2, warmup_steps=4, weight_decay=0.0, log_every=40)
    cfg = dataclasses.replace(cfg, eval_batches=None)
    res = train(TINY, cfg, train_docs=[doc], eval_docs=[doc])
    assert res.losses[0] > math.log(data.VOCAB_SIZE) - 1.0  # starts near chance
    assert np.mean(res.losses[-5:]) < 0.25 * np.mean(res.losses[:5])
    ev = res.evals[-1]
    np.testing.assert_allclose(ev["eval_bpb"], ev["eval_loss"] / math.log(2), rtol=1e-12)
    assert ev["eval_tokens"] == len(doc) + 1  # every real target once: bytes, EOS; no PAD
    assert ev["eval_bpb"] < 2.0


def test_cli_train_config_file_and_flags(tmp_path, capsys):
    from lcjax.cli import main

    config = tmp_path / "run.json"
    model = dict(d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                 mlp_hidden=64, max_len=64)
    config.write_text(json.dumps({"model": model, "train": {"lr": 1e-3, "warmup_steps": 1}}))
    out = tmp_path / "run"
    argv = ["train", "--config", str(config), "--steps", "3", "--batch-size", "4",
            "--seq-len", "16", "--eval-batches", "1", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert final["step"] == 3 and final["eval_bpb"] > 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["train"]["lr"] == 1e-3 and saved["train"]["steps"] == 3
    assert saved["model"]["d_model"] == 32 and saved["model"]["vocab_size"] == data.VOCAB_SIZE
    assert os.listdir(out / "checkpoints") == ["3"]
