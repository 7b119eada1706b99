"""RoPE-perturbed self-distillation (lcjax.train.rope_distill): the perturbations' invariants,
KL = 0 under a uniform shift and > 0 under a segment permutation for softmax, blockwise and
entmax attention, the loss and its options against a reference, no gradient to the teacher,
training with resume."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax import data
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.train import (
    TrainConfig,
    distill_loss,
    distill_loss_fn,
    kl_divergence,
    perturb_positions,
    train,
)

T = 16
TINY = DecoderConfig(vocab_size=data.VOCAB_SIZE, d_model=32, num_layers=2, num_heads=2,
                     num_kv_heads=1, head_dim=16, mlp_hidden=64, max_len=64)
POS = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (4, T))


def _tokens(b=2, t=T, seed=1):
    return jax.random.randint(jax.random.key(seed), (b, t), 0, data.VOCAB_SIZE, jnp.int32)


CASES = {  # name -> perturb_positions options
    "shift": dict(kind="shift", max_shift=50), "shift7": dict(kind="shift", shift=7),
    "swap2": dict(kind="segment_swap", num_segments=2, min_len=2),
    "swap3": dict(kind="segment_swap", num_segments=3, min_len=2),
    "swap3k": dict(kind="segment_swap", num_segments=3, min_len=2, keep_first=True),
    "gaps": dict(kind="gaps", rate=0.3, max_gap=3),
    "random": dict(kind="random", max_position=40),
}


@jax.jit
def _all_cases(positions, key):
    """Every case of CASES under one jit (a compile instead of hundreds of eager ops)."""
    out = {n: perturb_positions(positions, key, **o) for n, o in CASES.items()}
    out["one"] = perturb_positions(positions[0], key, **CASES["gaps"])
    out["callable"] = perturb_positions(positions, key, kind=lambda p, k: p[:, ::-1])
    return out


def test_perturbations_keep_their_invariants():
    cases = jax.device_get(_all_cases(POS, jax.random.key(0)))
    pos = np.asarray(POS)
    # shift: each row moves by its own s in [0, max_shift]; differences kept
    out = cases["shift"]
    s = out[:, 0] - pos[:, 0]
    assert np.all((0 <= s) & (s <= 50)) and len(set(s.tolist())) > 1
    np.testing.assert_array_equal(out, pos + s[:, None])
    np.testing.assert_array_equal(cases["shift7"], pos + 7)
    # segment_swap: a permutation of the ids, consecutive inside <= n segments, never the
    # identity; keep_first leaves the first segment in place
    for name, n, keep in (("swap2", 2, False), ("swap3", 3, False), ("swap3k", 3, True)):
        for row in cases[name]:
            np.testing.assert_array_equal(np.sort(row), np.arange(T))
            breaks = np.flatnonzero(np.diff(row) != 1)
            assert 1 <= len(breaks) <= n - 1 and np.all(np.diff(np.r_[-1, breaks, T - 1]) >= 2)
            if keep:
                assert row[0] == 0 and np.all(row[:breaks[0] + 1] == np.arange(breaks[0] + 1))
    # gaps: first id kept, increments in [1, 1 + max_gap], some gap somewhere
    out = cases["gaps"]
    d = np.diff(out, axis=1)
    assert np.all(out[:, 0] == 0) and np.all((1 <= d) & (d <= 4)) and np.any(d > 1)
    # random: sorted distinct ids in [0, max_position)
    out = cases["random"]
    assert np.all(np.diff(out, axis=1) > 0) and out.min() >= 0 and out.max() < 40
    # [T] in, [T] out, = row 0 of [B, T] (fold_in per row); a callable kind
    np.testing.assert_array_equal(cases["one"], cases["gaps"][0])
    np.testing.assert_array_equal(cases["callable"], pos[:, ::-1])


@pytest.mark.parametrize("variant", ["softmax", "blockwise", "entmax"])
def test_uniform_shift_gives_zero_kl_and_a_segment_swap_does_not(variant):
    from lcjax.attention import get

    cfg = dataclasses.replace(TINY, attention=variant,
                              attention_options=dict(get(variant).test_options))
    model = DecoderLM(cfg, rngs=nnx.Rngs(0))
    tok = _tokens(4)

    @nnx.jit
    def kl(m, moved):
        z_t = m(tok, positions=POS)
        return jnp.mean(kl_divergence(z_t, m(tok, positions=moved)), axis=-1)

    key = jax.random.key(3)
    shifted = perturb_positions(POS, key, kind="shift", max_shift=1000)
    swapped = perturb_positions(POS, key, kind="segment_swap", min_len=4)
    kl_shift, kl_swap = np.asarray(kl(model, shifted)), np.asarray(kl(model, swapped))
    assert kl_shift.max() <= 1e-6, kl_shift  # RoPE is relative
    assert kl_swap.min() > 1e-4, kl_swap


def _ref_kl(zt, zs, tau, symmetric):
    lt = jax.nn.log_softmax(np.asarray(zt, np.float64) / tau, axis=-1)
    ls = jax.nn.log_softmax(np.asarray(zs, np.float64) / tau, axis=-1)
    fwd = (np.exp(lt) * (lt - ls)).sum(-1)
    return 0.5 * (fwd + (np.exp(ls) * (ls - lt)).sum(-1)) if symmetric else fwd


def _ref_ce(z, targets, w):
    logp = np.asarray(jax.nn.log_softmax(np.asarray(z, np.float64), axis=-1))
    nll = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
    return (nll * w).sum() / w.sum()


def test_loss_options_match_a_reference_and_no_gradient_reaches_the_teacher():
    model = DecoderLM(dataclasses.replace(TINY, num_layers=1), rngs=nnx.Rngs(0))
    tok = _tokens(2, T + 1, seed=4)
    targets = tok[:, 1:].at[0, :5].set(data.PAD)  # row 0: no target at the first 5
    batch = {"inputs": tok[:, :-1], "targets": targets}
    rng = jax.random.key(5)
    lam = 0.7
    opts = [dict(), dict(symmetric=True, temperature=2.0, train_both=True, kl_on="all")]
    moved = perturb_positions(POS[:2], rng, kind="segment_swap")

    @nnx.jit
    def run(m):
        outs = [distill_loss(m, batch, rng, weight=lam, **o) for o in opts]
        z_t, z_s = m(batch["inputs"], positions=POS[:2]), m(batch["inputs"], positions=moved)
        grad = lambda f: nnx.grad(f)(m)
        g = grad(lambda m: distill_loss(m, batch, rng, weight=lam)[0])

        def by_hand(m, stop):  # CE(teacher) + λ KL(teacher ‖ student), teacher given
            zt = m(batch["inputs"], positions=POS[:2])
            zs = m(batch["inputs"], positions=moved)
            w = (targets != data.PAD).astype(jnp.float32)
            logp = jax.nn.log_softmax(zt, -1)
            ce = -(jnp.take_along_axis(logp, targets[..., None], -1)[..., 0] * w).sum() / w.sum()
            teacher = jax.lax.stop_gradient(zt) if stop else zt
            return ce + lam * (kl_divergence(teacher, zs) * w).sum() / w.sum()

        return outs, z_t, z_s, g, grad(lambda m: by_hand(m, True)), grad(
            lambda m: by_hand(m, False))

    outs, z_t, z_s, g, g_const, g_live = run(model)
    w = np.asarray(targets != data.PAD, np.float64)
    ce_t, ce_s = _ref_ce(z_t, targets, w), _ref_ce(z_s, targets, w)
    for o, (loss, mets) in zip(opts, outs):
        tau, sym = o.get("temperature", 1.0), o.get("symmetric", False)
        wk = np.ones_like(w) if o.get("kl_on") == "all" else w
        kl = (_ref_kl(z_t, z_s, tau, sym) * wk).sum() / wk.sum()
        ce = 0.5 * (ce_t + ce_s) if o.get("train_both") else ce_t
        np.testing.assert_allclose(float(mets["kl"][0]), kl, rtol=1e-4, err_msg=str(o))
        assert float(mets["kl"][1]) == wk.sum() and float(mets["loss_weight"]) == w.sum()
        np.testing.assert_allclose(float(loss), ce + lam * tau ** 2 * kl, rtol=1e-5,
                                   err_msg=str(o))
        assert kl > 1e-4
    # the gradient is that of CE + λ·KL with the teacher's logits as constants ...
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_const)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
    # ... and not that of a teacher that gets the KL's gradient
    diff = max(float(jnp.abs(a - b).max()) for a, b in
               zip(jax.tree.leaves(g), jax.tree.leaves(g_live)))
    assert diff > 1e-4


def test_trains_through_the_loop_with_exact_resume(tmp_path):
    docs = [bytes(np.random.default_rng(i).integers(97, 123, 300).astype(np.uint8)).decode()
            for i in range(4)]
    cfg = TrainConfig(steps=4, batch_size=2, seq_len=T, lr=1e-2, warmup_steps=1,
                      log_every=1, eval_batches=0, progress=False)
    kw = dict(train_docs=docs[:3], eval_docs=docs[3:],
              loss_fn=distill_loss_fn("segment_swap", weight=0.5))
    full = train(TINY, dataclasses.replace(cfg, out_dir=str(tmp_path / "a")), **kw)
    first = train(TINY, dataclasses.replace(cfg, out_dir=str(tmp_path / "b")), stop_at=2, **kw)
    rest = train(TINY, dataclasses.replace(cfg, out_dir=str(tmp_path / "b"), resume=True), **kw)
    strip = lambda h: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in h]
    assert strip(first.history + rest.history) == strip(full.history)
    assert all(r["kl"] > 0 for r in full.history)
    for r in full.history:
        assert r["loss"] == pytest.approx(r["ce"] + 0.5 * r["kl"], rel=1e-5)
    assert full.history[-1]["loss"] < full.history[0]["loss"]


def test_value_errors():
    key = jax.random.key(0)
    for kw, match in [(dict(kind="flip"), "kind"), (dict(kind="shift", rate=0.1), "options"),
                      (dict(kind="gaps", rate=1.5), "rate"),
                      (dict(kind="segment_swap", num_segments=1), "num_segments"),
                      (dict(kind="segment_swap", num_segments=2, keep_first=True), "keep_first"),
                      (dict(kind="segment_swap", num_segments=4, min_len=5), "do not fit"),
                      (dict(kind="random", max_position=3), "max_position")]:
        with pytest.raises(ValueError, match=match):
            perturb_positions(POS, key, **kw)
    with pytest.raises(ValueError, match="positions"):
        perturb_positions(POS.astype(jnp.float32), key)
    for kw, match in [(dict(weight=-1), "weight"), (dict(temperature=0), "temperature"),
                      (dict(kl_on="some"), "kl_on"), (dict(perturbation="flip"), "perturbation"),
                      (dict(perturbation_options={"rate": 0.1}), "options")]:
        with pytest.raises(ValueError, match=match):
            distill_loss_fn(**kw)
