"""lcjax.train.losses: the answer-weighted NLL hook against a numpy float64 computation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcjax.data.tokenizer import PAD
from lcjax.train import losses


class _FixedLogits:
    """A "model" that returns fixed logits whatever its inputs."""

    def __init__(self, logits):
        self.logits = jnp.asarray(logits)

    def __call__(self, inputs):
        assert inputs.shape == self.logits.shape[:2]
        return self.logits


def _batch(rng, b=3, t=11, v=260):
    targets = rng.integers(0, 256, (b, t)).astype(np.int32)
    targets[0, 8:] = PAD  # a right-padded row
    targets[2, 5:] = PAD
    mask = np.zeros((b, t), bool)
    mask[0, 5:8] = True
    mask[1, 6:10] = True
    mask[2, 2:6] = True  # position 5 is PAD: it must not count
    logits = rng.normal(size=(b, t, v)).astype(np.float32) * 3
    batch = {"inputs": np.zeros((b, t), np.int32), "targets": targets, "loss_mask": mask}
    return logits, batch


def _numpy_reference(logits, targets, mask, eps):
    x = logits.astype(np.float64)
    logp = x - x.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = np.zeros(targets.shape)
    w = np.zeros(targets.shape)
    ans = np.zeros(targets.shape)
    for b in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            y = targets[b, t]
            if y == PAD:
                continue
            nll[b, t] = -logp[b, t, y]
            w[b, t] = 1.0 if mask[b, t] else eps
            ans[b, t] = float(mask[b, t])
    return (w * nll).sum() / w.sum(), w.sum(), (ans * nll).sum() / ans.sum(), ans.sum()


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.37, 1.0])
def test_answer_weighted_nll_matches_numpy(eps):
    logits, batch = _batch(np.random.default_rng(int(eps * 100)))
    loss, m = losses.answer_weighted_nll(_FixedLogits(logits), batch, None, other_weight=eps)
    ref_loss, ref_total, ref_ans, ref_n = _numpy_reference(
        logits, batch["targets"], batch["loss_mask"], eps)
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
    np.testing.assert_allclose(float(m["loss_weight"]), ref_total, rtol=1e-6)
    ans, n = m["answer_nll"]
    np.testing.assert_allclose(float(ans), ref_ans, rtol=1e-5)
    assert float(n) == ref_n == 10  # 3 + 4 + 3 answer bytes (the PAD one excluded)


def test_factory_jit_and_gradient_weights():
    """The factory's hook equals the direct call under jit, and its gradient w.r.t. the
    logits is the weighted softmax-minus-one-hot of the hand formula."""
    logits, batch = _batch(np.random.default_rng(7), b=3, t=9, v=265)
    hook = losses.answer_weighted_loss(0.25)
    direct, _ = losses.answer_weighted_nll(_FixedLogits(logits), batch, other_weight=0.25)
    jitted, _ = jax.jit(lambda x: hook(_FixedLogits(x), batch, None))(logits)
    np.testing.assert_allclose(float(jitted), float(direct), rtol=1e-6)

    grad = jax.grad(lambda x: hook(_FixedLogits(x), batch, None)[0])(logits)
    t, mask = batch["targets"], batch["loss_mask"]
    w = np.where(t == PAD, 0.0, np.where(mask, 1.0, 0.25))
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    onehot = np.eye(logits.shape[-1])[np.where(t == PAD, 0, t)]
    ref = w[..., None] * (p - onehot) / w.sum()
    np.testing.assert_allclose(np.asarray(grad), ref, atol=1e-6)


def test_bad_arguments():
    logits, batch = _batch(np.random.default_rng(0))
    with pytest.raises(ValueError, match="other_weight"):
        losses.answer_weighted_loss(1.5)
    with pytest.raises(ValueError, match="other_weight"):
        losses.answer_weighted_loss("a lot")
    with pytest.raises(ValueError, match="loss_mask"):
        losses.answer_weighted_nll(_FixedLogits(logits),
                                   {k: batch[k] for k in ("inputs", "targets")})
    with pytest.raises(ValueError, match=r"loss_mask.*\(3, 10\)"):
        losses.answer_weighted_nll(_FixedLogits(logits),
                                   {**batch, "loss_mask": batch["loss_mask"][:, :10]})
