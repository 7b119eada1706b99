"""Tests of the one training loop on custom data: dataset + loss hooks, metrics, exact resume,
document masking, gradient accumulation, resume config checks."""

import dataclasses

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax import data
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.train import TrainConfig, read_jsonl, train
from lcjax.train import metrics as M

TINY = DecoderConfig(vocab_size=data.VOCAB_SIZE, d_model=32, num_layers=1, num_heads=2,
                     num_kv_heads=1, head_dim=16, mlp_hidden=64, max_len=64)
T, B = 24, 4
OTHER = 0.1  # loss weight of non-answer bytes


def _task_batch(i: int) -> dict:
    """Batch i of a copy task: ``BOS key(6-12 letters) = key[:4] PAD...``; answer = key[:4].

    Rows weigh 0.25 ... 2 (``weights``), so the two halves of a batch weigh differently.
    """
    rng = np.random.default_rng([7, i])
    inputs = np.full((B, T), data.PAD, np.int32)
    targets = np.full((B, T), data.PAD, np.int32)
    mask = np.zeros((B, T), bool)
    for r in range(B):
        n = int(rng.integers(6, 13))
        key = rng.integers(97, 123, n)
        seq = np.concatenate([[data.BOS], key, [61], key[:4]]).astype(np.int32)
        inputs[r, :len(seq) - 1], targets[r, :len(seq) - 1] = seq[:-1], seq[1:]
        mask[r, n + 1:n + 5] = True
    weights = np.repeat(np.linspace(0.25, 2.0, B, dtype=np.float32)[:, None], T, axis=1)
    return {"inputs": inputs, "targets": targets, "loss_mask": mask, "weights": weights}


def _dataset(n: int = 64) -> grain.MapDataset:
    return grain.MapDataset.range(n).map(_task_batch)


def answer_loss(model, batch, rng):
    """Weighted next-byte NLL: answer bytes weigh 1, the other real targets OTHER (times the
    row weight); reports the answer bytes' NLL as a (mean, count) metric."""
    del rng
    real = (batch["targets"] != data.PAD).astype(jnp.float32)
    w = real * batch["weights"] * jnp.where(batch["loss_mask"], 1.0, OTHER)
    logits = M.model_logits(model, batch)
    loss, total = M.weighted_nll(logits, batch["targets"], w)
    # (mean, weight): combined over micro-batches and eval batches by the answer count
    answer = M.weighted_nll(logits, batch["targets"], batch["loss_mask"].astype(jnp.float32))
    return loss, {"loss_weight": total, "answer_nll": answer}


def _cfg(**kw):
    base = dict(steps=6, batch_size=B, seq_len=T, lr=1e-2, warmup_steps=1, log_every=2,
                eval_batches=2, progress=False)
    return TrainConfig(**{**base, **kw})


def _same_params(a, b):
    leaves = lambda m: jax.tree.leaves(nnx.state(m, nnx.Param))
    for x, y in zip(leaves(a), leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_custom_dataset_and_loss_resume_bit_for_bit(tmp_path):
    kw = dict(dataset=_dataset(), eval_dataset=_dataset(4), loss_fn=answer_loss,
              eval_fn=answer_loss)
    full = train(TINY, _cfg(out_dir=str(tmp_path / "a"), eval_every=3), **kw)
    first = train(TINY, _cfg(out_dir=str(tmp_path / "b"), eval_every=3), stop_at=4, **kw)
    rest = train(TINY, _cfg(out_dir=str(tmp_path / "b"), eval_every=3, resume=True), **kw)
    assert [r["step"] for r in rest.history] == [5, 6]
    strip = lambda h: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in h]
    assert strip(first.history + rest.history) == strip(full.history)  # bit for bit
    assert first.evals + rest.evals == full.evals
    _same_params(rest.model, full.model)
    # the hook's metrics under their own names: history, JSONL, eval records
    assert set(full.history[0]) == {"step", "loss", "answer_nll", "lr", "grad_norm",
                                    "tokens_per_s"}
    assert set(full.evals[0]) == {"step", "eval_loss", "eval_tokens", "eval_answer_nll"}
    logged = read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert [r["answer_nll"] for r in logged if "loss" in r] == [r["answer_nll"]
                                                                for r in full.history]
    # step 1 logs the loss of the initial model (before the update) on the first batch
    loss, mets = answer_loss(DecoderLM(TINY, rngs=nnx.Rngs(0)), _task_batch(0), None)
    np.testing.assert_allclose(full.history[0]["loss"], float(loss), rtol=1e-6)
    np.testing.assert_allclose(full.history[0]["answer_nll"], float(mets["answer_nll"][0]),
                               rtol=1e-6)
    # the custom loss was what got optimised: the answer NLL falls
    assert full.history[-1]["answer_nll"] < full.history[0]["answer_nll"]


def test_default_loss_is_weighted_mean_nll():
    res = train(TINY, _cfg(steps=1, warmup_steps=0, seed=3, eval_batches=0),
                dataset=_dataset())
    b = _task_batch(0)
    nll, _ = M.token_nll(DecoderLM(TINY, rngs=nnx.Rngs(3))(jnp.asarray(b["inputs"])),
                         jnp.asarray(b["targets"]))
    w = b["weights"] * b["loss_mask"]  # loss_mask selects, weights weigh
    np.testing.assert_allclose(res.history[0]["loss"], float((nll * w).sum() / w.sum()),
                               rtol=1e-5)


@pytest.mark.parametrize("kind", ["list", "iter_dataset"])
def test_resume_with_iterables(tmp_path, kind):
    def make():
        if kind == "list":  # no iterator state: a resume replays and skips the consumed batches
            return [_task_batch(i) for i in range(8)]
        return _dataset(8).to_iter_dataset()  # grain iterator state

    cfg = _cfg(steps=5, eval_batches=0)
    full = train(TINY, dataclasses.replace(cfg, out_dir=str(tmp_path / "a")), dataset=make())
    first = train(TINY, dataclasses.replace(cfg, out_dir=str(tmp_path / "b")), dataset=make(),
                  stop_at=2)
    rest = train(TINY, dataclasses.replace(cfg, out_dir=str(tmp_path / "b"), resume=True),
                 dataset=make())
    assert first.losses + rest.losses == full.losses
    assert len(set(full.losses)) == 5


def test_document_mask_isolates_documents():
    rng = np.random.default_rng(0)
    doc_b = rng.integers(97, 123, 40).astype(np.uint8).tobytes()
    prev = [rng.integers(97, 123, n).astype(np.uint8).tobytes() for n in (10, 17)]
    model = DecoderLM(TINY, rngs=nnx.Rngs(0))
    kw = dict(seq_len=32, batch_size=1, shuffle=False, num_epochs=1, shard_index=0,
              shard_count=1)

    def logits_of_b(segments):
        """Logits at doc_b's tokens in window 0, for each previous document."""
        out = []
        for p in prev:
            batch = data.make_dataset([p, doc_b], segments=segments, **kw)[0]
            start = len(p) + 2  # BOS p EOS, then doc_b's BOS
            if segments:
                assert batch["positions"][0, start] == 0
                assert (batch["segment_ids"][0, :start] == 0).all()
                assert (batch["segment_ids"][0, start:] == 1).all()
                nxt = data.make_dataset([p, doc_b], segments=True, **kw)[1]  # doc_b goes on
                np.testing.assert_array_equal(nxt["positions"][0, :4], 32 - start + np.arange(4))
                assert nxt["segment_ids"][0, 0] == 1 and nxt["segment_ids"][0, -1] == -1  # PAD
            logits = M.model_logits(model, {k: jnp.asarray(v) for k, v in batch.items()})
            out.append(np.asarray(logits[0, start:]))
        n = min(len(x) for x in out)
        return out[0][:n], out[1][:n]

    a, b = logits_of_b(True)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)  # first token and all after it
    a, b = logits_of_b(False)
    assert np.abs(a - b).max() > 1e-3  # without the mask the previous document leaks in

    # TrainConfig(document_mask=True) hands segment ids and positions to the model
    seen = []

    def spy(model, batch, rng):
        seen.append(sorted(batch))  # at trace time
        return M.nll_loss(model, batch, rng)

    masked = train(TINY, _cfg(steps=2, seq_len=16, eval_batches=0, document_mask=True),
                   train_docs=[prev[0], doc_b, prev[1]] * 3, loss_fn=spy)
    assert seen and all(k == ["inputs", "positions", "segment_ids", "targets"] for k in seen)
    assert len(masked.losses) == 2


def test_grad_accum_equals_full_batch():
    ds = _dataset()
    w = np.asarray(M.target_weights({k: jnp.asarray(v) for k, v in _task_batch(0).items()}))
    halves = w.reshape(2, B // 2, T).sum((1, 2))
    assert halves[1] > 2 * halves[0]  # a mean of the halves' means is not the batch mean

    # eps=1e-4, not AdamW's 1e-8: an element whose gradient is ~0 (a byte absent from these
    # rows) otherwise takes a step g / (|g| + 1e-8) ≈ ±1 that turns the last-bit difference of
    # two summation orders into a 5e-5 parameter difference (seen on 1 of 8,288 elements)
    cfg = _cfg(steps=4, eval_batches=0, eps=1e-4)
    one = train(TINY, cfg, dataset=ds, loss_fn=answer_loss)
    two = train(TINY, dataclasses.replace(cfg, grad_accum=2), dataset=ds, loss_fn=answer_loss)
    np.testing.assert_allclose(two.losses, one.losses, rtol=2e-5)
    for k in ("grad_norm", "answer_nll"):  # (value, weight) metrics combine exactly too
        np.testing.assert_allclose([r[k] for r in two.history], [r[k] for r in one.history],
                                   rtol=2e-5)
    for x, y in zip(jax.tree.leaves(nnx.state(one.model, nnx.Param)),
                    jax.tree.leaves(nnx.state(two.model, nnx.Param))):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-5)
    with pytest.raises(ValueError, match="grad_accum=3"):
        train(TINY, dataclasses.replace(cfg, grad_accum=3), dataset=ds)


def test_resume_with_different_config_raises(tmp_path):
    out = str(tmp_path / "run")
    kw = dict(dataset=_dataset(), loss_fn=answer_loss)
    train(TINY, _cfg(steps=4, out_dir=out, eval_batches=0), stop_at=3, **kw)
    with pytest.raises(ValueError, match=r"train_config\.lr: checkpoint 0\.01, this run 0\.02"):
        train(TINY, _cfg(steps=4, out_dir=out, resume=True, lr=2e-2), **kw)
    with pytest.raises(ValueError, match=r"train_config\.b2: checkpoint 0\.95, this run 0\.9"):
        train(TINY, _cfg(steps=5, out_dir=out, resume=True, b2=0.9), **kw)  # steps may grow
    with pytest.raises(ValueError, match="checkpoint is at step 3, past steps=2"):
        train(TINY, _cfg(steps=2, out_dir=out, resume=True), **kw)
    bigger = dataclasses.replace(TINY, d_model=48)
    with pytest.raises(ValueError, match=r"model_config\.d_model: checkpoint 32, this run 48"):
        train(bigger, _cfg(steps=4, out_dir=out, resume=True), **kw)
    with pytest.raises(ValueError, match="has checkpoints"):  # a fresh run into a used folder
        train(TINY, _cfg(steps=4, out_dir=out), **kw)
    # what may change on resume: logging, evaluation, checkpoint cadence, grad_accum
    res = train(TINY, _cfg(steps=4, out_dir=out, resume=True, log_every=1, grad_accum=2), **kw)
    assert res.step == 4


def test_dataset_errors():
    with pytest.raises(ValueError, match="ran out after 3 batches"):
        train(TINY, _cfg(steps=5, eval_batches=0), dataset=[_task_batch(i) for i in range(3)])
    bad = _task_batch(0)
    bad["weights"] = np.ones((B, T + 1), np.float32)
    with pytest.raises(ValueError, match=r"batch\['weights'\] has shape"):
        train(TINY, _cfg(steps=1, warmup_steps=0, eval_batches=0), dataset=[bad])
    with pytest.raises(ValueError, match="lacks"):
        train(TINY, _cfg(steps=1, warmup_steps=0, eval_batches=0),
              dataset=[{"inputs": bad["inputs"]}])
    with pytest.raises(ValueError, match="not both"):
        train(TINY, _cfg(), dataset=[bad], train_docs=["x"])
    with pytest.raises(ValueError, match="reserved"):
        train(TINY, _cfg(steps=1, warmup_steps=0, eval_batches=0), dataset=_dataset(),
              loss_fn=lambda m, b, r: (M.nll_loss(m, b, r)[0], {"lr": 0.0}))
