"""GRPO (lcjax.train.rl) and the verifiers (lcjax.train.rewards): hand-computed advantages,
clipping and k3 KL, the loss gradient against float64 finite differences through a tiny
decoder, sampler log-probs against teacher forcing, a toy task with a known optimum,
exact resume and the option errors."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.nn import DecoderConfig, DecoderLM, generate
from lcjax.train import rl
from lcjax.train.rewards import (
    answer_reward,
    exact_match,
    make_verifier,
    numeric_match,
    parse_number,
    prefix_credit,
)

V = 6
LETTERS = "abcdef"
TOY_CFG = DecoderConfig(vocab_size=V, d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                        head_dim=16, mlp_hidden=64, max_len=16)
# two prompts (lengths 1 and 2: ragged); reward 1 only for the answer "ce" (token ids 2, 4),
# 1/36 per random sample; token 5 ("f") stops a completion
TOY_ITEMS = [{"prompt": [0], "answer": "ce"}, {"prompt": [1, 0], "answer": "ce"}]
TOY_STOP = 5


def toy_decode(ids):
    return "".join(LETTERS[int(i)] for i in ids)


def toy_reward(prediction, item):
    return exact_match(prediction, item["answer"])


def toy_config(**kw):
    base = dict(steps=12, prompts_per_step=4, group_size=16, max_new_tokens=2,
                stop_tokens=(TOY_STOP,),
                pad_id=0, lr=0.03, kl_beta=0.04, updates_per_batch=2, progress=False)
    return rl.GRPOConfig(**{**base, **kw})


def toy_model(seed=0):
    """The toy policy, its (tied) embeddings scaled by 0.1 so it starts near uniform: the
    answer then has chance ~1/36 per sample whatever the seed (at the default scale some
    seeds start with far less, and 12 steps of 64 samples may never see a reward)."""
    model = DecoderLM(TOY_CFG, rngs=nnx.Rngs(seed))
    model.embed.value = model.embed.value * 0.1
    return model


def run_toy(cfg, model=None, **kw):
    model = toy_model() if model is None else model
    return rl.train_grpo(model, cfg, TOY_ITEMS, reward_fn=toy_reward, decode=toy_decode, **kw)


# ------------------------------------------------------------------ hand-made numbers


def test_group_advantages_hand_numbers():
    rewards = [[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5], [1.0, 1.0, 0.0, 0.0]]
    a = rl.group_advantages(rewards, eps=1e-4)
    # group 0: mean 1/4, sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    np.testing.assert_allclose(a[0], np.array([0.75, -0.25, -0.25, -0.25]) / 0.5001, rtol=1e-6)
    np.testing.assert_array_equal(a[1], 0.0)  # equal rewards teach nothing
    # group 2: mean 1/2, sample std sqrt(4 * 0.25 / 3)
    s = math.sqrt(1.0 / 3.0)
    np.testing.assert_allclose(a[2], np.array([0.5, 0.5, -0.5, -0.5]) / (s + 1e-4), rtol=1e-6)


def test_clipped_surrogate_and_k3_hand_numbers():
    ratio = np.array([[1.5, 1.5, 0.5, 0.5, 1.1]])
    adv = np.array([1.0])
    old = np.log(np.full((1, 5), 0.3))
    logp = old + np.log(ratio)
    s, r, clipped = rl.clipped_surrogate(jnp.asarray(logp), jnp.asarray(old),
                                         jnp.asarray(adv), 0.2)
    np.testing.assert_allclose(r, ratio, rtol=1e-6)
    np.testing.assert_allclose(s, [[1.2, 1.2, 0.5, 0.5, 1.1]], rtol=1e-6)
    np.testing.assert_array_equal(clipped, [[True, True, False, False, False]])
    s, _, clipped = rl.clipped_surrogate(jnp.asarray(logp), jnp.asarray(old),
                                         jnp.asarray(-adv), 0.2)
    np.testing.assert_allclose(s, [[-1.5, -1.5, -0.8, -0.8, -1.1]], rtol=1e-6)
    np.testing.assert_array_equal(clipped, [[False, False, True, True, False]])
    # k3 at p = 1/2, p_ref = 1/4: d = ln(1/2), exp(d) - d - 1 = 1/2 + ln 2 - 1
    k = rl.k3_kl(jnp.log(jnp.array([0.5, 0.25])), jnp.log(jnp.array([0.25, 0.25])))
    np.testing.assert_allclose(k, [0.5 + math.log(2) - 1, 0.0], atol=1e-7)


def test_grpo_objective_hand_numbers():
    # two rows, three target slots; row 0 has completion tokens 0-1, row 1 tokens 1-2
    mask = np.array([[1, 1, 0], [0, 1, 1]], np.float32)
    old = np.log(np.array([[0.5, 0.4, 0.9], [0.9, 0.2, 0.5]], np.float32))
    ratio = np.array([[1.5, 1.0, 7.0], [3.0, 0.5, 1.1]], np.float32)
    logp = old + np.log(ratio)
    ref = logp + np.log(np.array([[0.5, 1.0, 9.0], [9.0, 2.0, 1.0]], np.float32))  # e^d
    adv = np.array([1.0, -2.0], np.float32)
    # row 0: s = [min(1.5, 1.2), 1.0] = [1.2, 1.0]; k3 = [0.5 - ln 0.5 - 1, 0]
    # row 1: s = [min(-1.0, -1.6), min(-2.2, -2.2)] = [-1.6, -2.2]; k3 = [2 - ln 2 - 1, 0]
    k0, k1 = 0.5 - math.log(0.5) - 1, 2 - math.log(2) - 1
    beta = 0.1
    row0 = ((1.2 - beta * k0) + 1.0) / 2
    row1 = ((-1.6 - beta * k1) + -2.2) / 2
    args = [jnp.asarray(x) for x in (logp, old, ref, adv, mask)]
    loss, mets = rl.grpo_objective(*args, clip_eps=0.2, kl_beta=beta, averaging="sequence")
    np.testing.assert_allclose(loss, -(row0 + row1) / 2, rtol=1e-5)
    np.testing.assert_allclose(mets["kl"][0], (k0 + k1) / 4, rtol=1e-5)
    assert float(mets["kl"][1]) == 4.0
    # clipped branch active: row 0 token 0 (A > 0, ρ = 1.5) and row 1 token 1 (A < 0,
    # ρ = 0.5); row 1 token 2 has ρ = 1.1 inside [0.8, 1.2]
    np.testing.assert_allclose(mets["clip_frac"][0], 2 / 4, rtol=1e-6)
    assert float(mets["loss_weight"]) == 2.0
    loss, mets = rl.grpo_objective(*args, clip_eps=0.2, kl_beta=beta, averaging="token")
    total = (1.2 - beta * k0) + 1.0 + (-1.6 - beta * k1) + -2.2
    np.testing.assert_allclose(loss, -total / 4, rtol=1e-5)
    assert float(mets["loss_weight"]) == 4.0


@pytest.mark.parametrize("averaging", rl.AVERAGING)
def test_objective_combines_over_micro_batches_by_its_loss_weight(averaging):
    # what grad_accum relies on (lcjax.train.make_train_step): the loss and metrics of the
    # whole batch are the loss_weight-weighted means of those of its row halves (and so are
    # the gradients, the weights not depending on the parameters)
    rng = np.random.default_rng(5)
    b, t = 6, 5
    logp, old, ref = (jnp.asarray(rng.normal(-1.5, 0.4, (b, t)), jnp.float32)
                      for _ in range(3))
    adv = jnp.asarray(rng.standard_normal(b), jnp.float32)
    mask = jnp.asarray(rng.random((b, t)) < 0.6)
    kw = dict(clip_eps=0.2, kl_beta=0.1, averaging=averaging)
    whole = rl.grpo_objective(logp, old, ref, adv, mask, **kw)
    halves = [rl.grpo_objective(logp[s], old[s], ref[s], adv[s], mask[s], **kw)
              for s in (slice(0, 3), slice(3, 6))]
    w = [float(m["loss_weight"]) for _, m in halves]
    np.testing.assert_allclose(float(whole[0]), sum(wi * float(l) for wi, (l, _) in
                                                    zip(w, halves)) / sum(w), rtol=1e-6)
    for name in ("kl", "clip_frac"):
        v = [(float(m[name][0]), float(m[name][1])) for _, m in halves]
        np.testing.assert_allclose(float(whole[1][name][0]),
                                   sum(a * c for a, c in v) / sum(c for _, c in v), rtol=1e-6)


def test_completion_batch_mask_and_alignment():
    # row 0: prompt [7, 8], completion [1, 2, 3]; row 1: prompt [7], completion [4], pad
    tokens = np.array([[7, 8, 1, 2, 3], [7, 4, 0, 0, 0]])
    batch = rl.completion_batch(tokens, [2, 1], [5, 2])
    np.testing.assert_array_equal(batch["targets"], tokens[:, 1:])
    np.testing.assert_array_equal(batch["loss_mask"], [[0, 1, 1, 1], [1, 0, 0, 0]])
    lp = np.array([[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0]])
    np.testing.assert_array_equal(rl.align_logprobs(lp, [2, 1], batch["loss_mask"]),
                                  [[0, -1, -2, -3], [-4, 0, 0, 0]])


# ---------------------------------------------------------------- gradient, consistency


def test_loss_gradient_matches_float64_finite_differences():
    # the loss as a function of the logits [B, T, V] (log-softmax, gather, ratio, clip, k3,
    # masking, averaging: everything GRPO adds on top of the model) in float64; the model's
    # own backward pass is JAX's (its logits are float32 by design, see DecoderLM.logits)
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, V, size=(4, 7))
        batch = rl.completion_batch(tokens, [2, 3, 1, 2], [7, 5, 4, 7])
        z0 = rng.normal(0, 1.5, (4, 6, V))
        targets = jnp.asarray(batch["targets"])
        lp = np.asarray(rl.token_logprobs(jnp.asarray(z0), targets))
        assert lp.dtype == np.float64
        # ratios inside the clip range (|δ| < 0.1) and far outside (±0.6): both branches
        delta = rng.uniform(-0.1, 0.1, lp.shape)
        delta[:, ::3] = 0.6 * np.sign(rng.standard_normal(delta[:, ::3].shape))
        old, ref = lp - delta, lp + rng.normal(0, 0.3, lp.shape)
        adv, mask = rng.standard_normal(4), jnp.asarray(batch["loss_mask"])
        h = 1e-6
        for averaging in rl.AVERAGING:
            @jax.jit
            def f(z, averaging=averaging):
                return rl.grpo_objective(rl.token_logprobs(z, targets), old, ref, adv, mask,
                                         clip_eps=0.2, kl_beta=0.3, averaging=averaging)[0]

            grad = np.asarray(jax.grad(f)(jnp.asarray(z0)))
            assert np.linalg.norm(grad) > 1e-2  # a real signal, not 0 == 0
            # along the gradient and along a random direction
            for d in (grad / np.linalg.norm(grad), rng.standard_normal(z0.shape)):
                fd = float(f(z0 + h * d) - f(z0 - h * d)) / (2 * h)
                np.testing.assert_allclose(float(np.vdot(grad, d)), fd, rtol=1e-7, atol=1e-9)
            # masked slots (prompt, padding) get no gradient
            np.testing.assert_array_equal(np.asarray(grad)[~batch["loss_mask"]], 0.0)


def test_sampler_logprobs_equal_teacher_forced_ones():
    # the shapes of the toy runs' sampling (64 rows, prompts of 1-2 tokens, 2 new tokens,
    # one stop token), so the compiled programs are shared
    model = DecoderLM(TOY_CFG, rngs=nnx.Rngs(3))
    rng = np.random.default_rng(4)
    prompts = rng.integers(0, V, size=(64, 2))
    plen = rng.integers(1, 3, size=64)
    out = generate(model, prompts, 2, temperature=1.0, rng=jax.random.key(0),
                   prompt_lengths=plen, stop_tokens=(TOY_STOP,), return_logprobs=True,
                   pad_id=0)
    tokens, lengths, lp = jax.device_get((out.tokens, out.lengths, out.logprobs))
    batch = rl.completion_batch(tokens, plen, lengths)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    forced = np.asarray(rl.compiled_logprobs(graphdef)(params, rest, batch["inputs"],
                                                   batch["targets"]))
    aligned = rl.align_logprobs(lp, plen, batch["loss_mask"])
    assert batch["loss_mask"].sum() == (lengths - plen).sum()
    assert 64 < (lengths - plen).sum() < 128  # some rows stopped after one token
    np.testing.assert_allclose(aligned[batch["loss_mask"]], forced[batch["loss_mask"]],
                               atol=2e-5)


# --------------------------------------------------------------------- training runs


def test_toy_task_reward_goes_from_near_zero_to_above_point_nine():
    model = toy_model()
    before = [np.array(x) for x in jax.tree.leaves(nnx.state(model))]
    result = run_toy(toy_config(steps=15), model)
    for x, y in zip(before, jax.tree.leaves(nnx.state(model))):  # the reference is kept
        np.testing.assert_array_equal(x, np.asarray(y))
    rewards = result.rewards
    assert rewards[0] < 0.15, rewards  # 1/36 per sample at the start
    assert np.mean(rewards[-3:]) > 0.9, rewards
    assert set(result.history[0]) >= {"reward_mean", "kl", "clip_frac", "completion_len",
                                      "loss", "grad_norm", "lr"}
    assert 1.0 < result.history[0]["completion_len"] < 2.0  # some stopped at once
    assert result.history[-1]["kl"] > 0  # moved away from the reference


def test_resume_is_exact(tmp_path):
    cfg = toy_config(steps=4)
    straight = run_toy(dataclasses_replace(cfg, out_dir=str(tmp_path / "a")))
    run_toy(dataclasses_replace(cfg, out_dir=str(tmp_path / "b")), stop_at=2)
    resumed = run_toy(dataclasses_replace(cfg, out_dir=str(tmp_path / "b"), resume=True))
    assert resumed.step == 4 and [r["step"] for r in resumed.history] == [3, 4]
    assert resumed.history == straight.history[2:]
    a, b = (nnx.state(r.model) for r in (straight, resumed))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # old log-probs from a teacher-forced pass instead of the sampler's: the same first
    # sample, and the same first loss and KL up to the 2e-5 agreement of the two passes
    recomputed = run_toy(dataclasses_replace(cfg, steps=1, old_logprobs="recompute"))
    first, again = straight.history[0], recomputed.history[0]
    assert again["reward_mean"] == first["reward_mean"]
    np.testing.assert_allclose([again["loss"], again["kl"]], [first["loss"], first["kl"]],
                               rtol=1e-3, atol=1e-5)
    with pytest.raises(ValueError, match="has checkpoints"):
        run_toy(dataclasses_replace(cfg, out_dir=str(tmp_path / "b")))
    with pytest.raises(ValueError, match="clip_eps"):
        run_toy(dataclasses_replace(cfg, out_dir=str(tmp_path / "b"), resume=True,
                                    clip_eps=0.3))


def test_skip_flat_steps_makes_no_update_on_equal_rewards():
    """Constant rewards give A = 0 everywhere: with skip_flat_steps the policy stays the
    reference bit for bit and every step logs skipped = 1; a reward with a spread inside
    the groups at the start (the completion's length) is not skipped and moves the policy."""
    cfg = toy_config(steps=3, skip_flat_steps=True)
    start = [np.array(x) for x in jax.tree.leaves(nnx.state(toy_model()))]
    flat = rl.train_grpo(toy_model(), cfg, TOY_ITEMS, reward_fn=lambda text, item: 0.5,
                         decode=toy_decode)
    for x, y in zip(start, jax.tree.leaves(nnx.state(flat.model))):
        np.testing.assert_array_equal(x, np.asarray(y))
    assert [r["skipped"] for r in flat.history] == [1.0, 1.0, 1.0]
    assert all(np.isnan(r["loss"]) and np.isnan(r["grad_norm"]) for r in flat.history)
    spread = rl.train_grpo(toy_model(), cfg, TOY_ITEMS, decode=toy_decode,
                           reward_fn=lambda text, item: float(len(text)))
    # (it learns to fill both tokens, so later steps may turn flat and be skipped)
    assert spread.history[0]["skipped"] == 0.0 and spread.history[0]["reward_std"] > 0
    moved = max(float(np.abs(x - np.asarray(y)).max())
                for x, y in zip(start, jax.tree.leaves(nnx.state(spread.model))))
    assert moved > 1e-3


def dataclasses_replace(cfg, **kw):
    return dataclasses.replace(cfg, **kw)


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("kw, match", [
    (dict(group_size=1), "group_size"), (dict(group_size=0), "group_size"),
    (dict(clip_eps=0.0), "clip_eps"), (dict(clip_eps=1.0), "clip_eps"),
    (dict(clip_eps=-0.1), "clip_eps"), (dict(kl_beta=-0.01), "kl_beta"),
    (dict(kl_beta=float("nan")), "kl_beta"), (dict(averaging="batch"), "averaging"),
    (dict(temperature=0.0), "temperature"), (dict(updates_per_batch=0), "updates_per_batch"),
    (dict(warmup_steps=5, steps=2), "warmup_steps"),
    (dict(prompts_per_step=3, group_size=3, grad_accum=2), "grad_accum"),
])
def test_config_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        rl.GRPOConfig(**kw)


def test_function_errors():
    with pytest.raises(ValueError, match="G >= 2"):
        rl.group_advantages([[1.0], [0.0]])
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="clip_eps"):
        rl.grpo_objective(x, x, x, jnp.zeros(2), x, clip_eps=1.5, kl_beta=0.0)
    with pytest.raises(ValueError, match="kl_beta"):
        rl.grpo_loss_fn(0.2, -1.0)
    with pytest.raises(ValueError, match="advantages"):
        rl.grpo_objective(x, x, x, jnp.zeros(3), x, clip_eps=0.2, kl_beta=0.0)
    with pytest.raises(ValueError, match="share one"):
        rl.grpo_objective(x, x, jnp.zeros((2, 4)), jnp.zeros(2), x, clip_eps=0.2, kl_beta=0.0)
    with pytest.raises(ValueError, match="max_prompt_len"):
        rl.train_grpo(DecoderLM(TOY_CFG, rngs=nnx.Rngs(0)), toy_config(max_prompt_len=1),
                      [{"prompt": [0, 1], "answer": "a"}])


# ------------------------------------------------------------------------- verifiers


def test_verifiers():
    assert exact_match("  Paris \n", "paris") == 1.0
    assert exact_match('"New   York"', "new york") == 1.0
    assert exact_match("Paris", "paris", casefold=False) == 0.0
    assert exact_match("Pari", "Paris") == 0.0
    assert exact_match("a, b", ["a", "b"]) == 1.0 and exact_match("b, a", ["a", "b"]) == 0.0
    assert parse_number("-1,234.5") == -1234.5 and parse_number("3e-2") == 0.03
    assert parse_number("12%") == 12.0 and parse_number("1,23") is None
    assert parse_number("abc") is None and parse_number(True) is None
    close = numeric_match(rel_tol=1e-3)
    assert close("100.05", "100") == 1.0 and close("100.2", "100") == 0.0
    assert close("x", "100") == 0.0
    assert numeric_match(abs_tol=0.5)("0.4", "0") == 1.0
    assert answer_reward("1,000", {"answer": "1000"}) == 1.0
    assert answer_reward("Oslo", {"answer": "oslo"}) == 1.0
    assert answer_reward("1000.1", {"answer": 1000}) == 0.0
    assert make_verifier(rel_tol=1e-3)("1000.1", {"answer": 1000}) == 1.0
    # lists: in order, or in any order when the item says so; decimals widen abs_tol
    assert answer_reward("3, Oslo", {"answer": [3, "Oslo"]}) == 1.0
    assert answer_reward("Oslo, 3", {"answer": [3, "Oslo"]}) == 0.0
    assert answer_reward("Oslo, 3", {"answer": [3, "Oslo"], "ordered": False}) == 1.0
    assert answer_reward("Oslo, 3, 3", {"answer": [3, "Oslo"], "ordered": False}) == 0.0
    assert answer_reward("3.0, 3", {"answer": [3, "Oslo"], "ordered": False}) == 0.0
    assert answer_reward("12.354", {"answer": 12.35, "decimals": 2}) == 1.0
    assert answer_reward("12.356", {"answer": 12.35, "decimals": 2}) == 0.0
    assert answer_reward("12.354", {"answer": 12.35}) == 0.0
    with pytest.raises(ValueError, match="rel_tol"):
        numeric_match(rel_tol=-1.0)
    with pytest.raises(ValueError, match="answer"):
        answer_reward("x", {"question": "?"})


def test_prefix_credit_hand_numbers():
    r = prefix_credit(weight=0.5)
    assert r("Cl", {"answer": "Clerk"}) == pytest.approx(0.5 * 2 / 5)
    assert r(" clERK ", {"answer": "Clerk"}) == 1.0  # verified: full reward
    assert r("Clerks", {"answer": "Clerk"}) == pytest.approx(0.5)  # whole prefix, not verified
    assert r("29", {"answer": 29.0}) == 1.0  # numeric match
    assert r("2", {"answer": 29.0}) == pytest.approx(0.5 * 1 / 4)  # reference "29.0"
    assert r("a, c", {"answer": ["a", "b"]}) == pytest.approx(0.5 * 3 / 4)  # "a, b"
    assert r("x", {"answer": 5}) == 0.0 and r("", {"answer": 5}) == 0.0
    assert prefix_credit(weight=0.2)("Cl", {"answer": "Clerk"}) == pytest.approx(0.08)
    with pytest.raises(ValueError, match="weight"):
        prefix_credit(weight=1.0)


# ------------------------------------------------------------------------------- CLI


def test_cli_config_file_flags_and_item_shards(tmp_path):
    import argparse
    import json

    from lcjax.train import rl_cli

    parser = argparse.ArgumentParser()
    rl_cli.add_arguments(parser)
    spec = tmp_path / "grpo.json"
    spec.write_text(json.dumps({"grpo": {"top_k": 5, "steps": 7, "clip_eps": 0.3}}))
    args = parser.parse_args(["--init", "i", "--items", "x", "--config", str(spec), "--steps",
                              "9", "--no-progress"])
    cfg = rl_cli.config_from_args(args)  # the file, then the flags over it
    assert (cfg.top_k, cfg.steps, cfg.clip_eps, cfg.progress) == (5, 9, 0.3, False)
    spec.write_text(json.dumps({"grpo": {}, "model": {}}))
    with pytest.raises(ValueError, match="unknown sections"):
        rl_cli.config_from_args(args)
    spec.write_text(json.dumps({"grpo": {"nope": 1}}))
    with pytest.raises(ValueError, match="unknown grpo fields"):
        rl_cli.config_from_args(args)
    shards = tmp_path / "shards"
    shards.mkdir()
    for k in (1, 0):  # read in sorted order, whatever the creation order
        (shards / f"shard-{k}.jsonl").write_text(
            "".join(json.dumps({"prompt": f"{k}{j}", "answer": j}) + "\n" for j in range(2)))
    assert [it["prompt"] for it in rl_cli.read_items(str(shards))] == ["00", "01", "10", "11"]
    assert [it["prompt"] for it in rl_cli.read_items(str(shards), limit=3)] == ["00", "01", "10"]
    with pytest.raises(ValueError, match="no such file"):
        rl_cli.read_items(str(tmp_path / "missing"))



def test_cli_runs_grpo_from_a_run_folder(tmp_path, capsys):
    import json

    from lcjax.cli import main
    from lcjax.data import tokenizer
    from lcjax.train import checkpoint, config_dict, make_optimizer
    from lcjax.train.loop import TrainConfig, optimizer_hparams

    cfg = DecoderConfig(vocab_size=tokenizer.VOCAB_SIZE, d_model=16, num_layers=1,
                        num_heads=2, num_kv_heads=2, head_dim=8, mlp_hidden=32, max_len=64)
    model = DecoderLM(cfg, rngs=nnx.Rngs(0))
    _, params, rest = nnx.split(model, nnx.Param, ...)
    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text(json.dumps({"model": config_dict(cfg)}))
    manager = checkpoint.checkpoint_manager(init / "checkpoints")
    opt_state = make_optimizer(**optimizer_hparams(TrainConfig(steps=2, warmup_steps=0))).init(
        params)
    checkpoint.save_checkpoint(manager, 1, params=params, rest=rest, opt_state=opt_state,
                               data_state={})
    manager.close()
    items = tmp_path / "items.jsonl"  # TableLong-style items: context + question
    items.write_text("".join(json.dumps({"context": "| a |\n| 1 |", "question": q,
                                         "answer": a}) + "\n"
                             for q, a in (("a?", "1"), ("b?", "x"), ("c?", "2.5"))))
    out = tmp_path / "grpo"
    argv = ["rl", "--init", str(init), "--items", str(items), "--out", str(out), "--steps",
            "2", "--group-size", "2", "--prompts-per-step", "2", "--max-new-tokens", "3",
            "--grad-accum", "2", "--no-progress"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["step"] == 2 and 1.0 <= record["completion_len"] <= 3.0
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2] and logged[-1] == record
    trained = checkpoint.load_model(out)  # a GRPO folder loads like a training run
    assert trained.config == cfg
    with pytest.raises(ValueError, match="has checkpoints"):
        main(argv)


def test_tablelong_items_prompt_and_reward():
    # generated TableLong items (lcjax.data.tablelong): the evaluator's prompt, and the
    # evaluator's reference answers rewarded 1 by the default verifier, wrong ones 0
    from lcjax.data.tablelong import answer_strings, generate_item, item_prompt

    items = [generate_item(0, i, min_len=300, max_len=1000) for i in range(24)]
    assert len({it["task"] for it in items}) >= 5
    assert any(isinstance(it["answer"], list) for it in items)
    assert any(it["decimals"] is not None for it in items)
    for it in items:
        assert rl.default_prompt(it) == item_prompt(it)
        refs = answer_strings(it)
        assert answer_reward(", ".join(refs), it) == 1.0, it["answer"]
        assert answer_reward("9" + ", ".join(refs), it) == 0.0, it["answer"]
