"""The TableLong experiment's pieces (experiments/tablelong): RL items, the answer NLL, the
paired bootstrap, the reward counter, and the evaluator's one-bucket mode it relies on."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from experiments.common import row_batches
from experiments.tablelong import experiment as tl
from lcjax.data import tokenizer as tok
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.train.rewards import answer_reward


def tiny_model(seed: int = 0) -> DecoderLM:
    cfg = DecoderConfig(vocab_size=tok.VOCAB_SIZE, d_model=16, num_layers=1, num_heads=2,
                        num_kv_heads=2, head_dim=8, mlp_hidden=32, max_len=512)
    return DecoderLM(cfg, rngs=nnx.Rngs(seed))


def test_arithmetic_items_match_lengths_and_verify():
    lengths = [300, 420, 777]
    items = tl.arithmetic_items(lengths, seed=3)
    for it, n in zip(items, lengths):
        got = len(it["prompt"].encode())
        assert n - 4 <= got <= n, (got, n)  # a cut multi-byte character may cost 3 bytes
        assert it["answer"] == it["a"] + it["b"] and 10 <= it["a"] <= 99
        assert f"What is {it['a']} plus {it['b']}?" in it["prompt"]
        assert answer_reward(str(it["answer"]), it) == 1.0
        assert answer_reward(str(it["answer"] + 1), it) == 0.0
    assert tl.arithmetic_items(lengths, seed=3) == items  # deterministic per seed
    assert tl.arithmetic_items(lengths, seed=4) != items


def test_table_items_fit_the_prompt_width_and_verify():
    from lcjax.data.tablelong import verify_item

    items = tl.table_items(6, seed=5)
    for it in items:
        ids = tl.rl_prompt(it)
        assert ids[0] == tok.BOS and len(ids) <= tl.PROMPT_WIDTH
        assert tok.decode(ids[1:]).endswith(": ") and it["question"] in tok.decode(ids[1:])
        assert verify_item(it)
        lo, hi = tl.TABLE_LEN
        assert lo <= it["length"] <= hi


class _Item:  # the two fields of lcjax.data.items.EvalItem that answer_nll reads
    def __init__(self, prompt: bytes, answer: bytes):
        self.prompt, self.answer = prompt, answer


def test_answer_nll_equals_a_direct_forward_pass():
    import jax

    model = tiny_model(1)
    rng = np.random.default_rng(0)
    def text(lo, hi, n):
        return bytes(rng.integers(lo, hi, size=int(n)).astype(np.uint8))

    items = [_Item(text(32, 127, n), text(48, 58, k))
             for n, k in zip(rng.integers(5, 40, size=5), rng.integers(1, 6, size=5))]
    items.append(_Item("Wert: ", "Müller 中"))  # text: 9 characters, 12 answer bytes
    got = tl.answer_nll(model, items, batch_size=4, width=64)
    forward = jax.jit(lambda x: model(x))  # one compile per row length
    for it, value in zip(items, got):  # slow reference: one unpadded row at a time
        ids = np.concatenate([tok.encode(it.prompt, bos=True), tok.encode(it.answer)])
        logp = jax.nn.log_softmax(np.asarray(forward(ids[None, :-1]), np.float64)[0], axis=-1)
        k = len(tok.encode(it.answer))  # answer bytes
        want = -np.mean([logp[j, ids[j + 1]] for j in range(len(ids) - 1 - k, len(ids) - 1)])
        assert value == pytest.approx(want, rel=1e-4)
    with pytest.raises(ValueError, match="width"):
        tl.answer_nll(model, items, batch_size=4, width=16)


def test_bootstrap_delta_is_paired_and_its_interval_matches_the_normal_one():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=400) * 10  # large item-to-item spread
    out = tl.bootstrap_delta(ref[None] + 0.3, ref, rng, reps=500)
    # paired: a constant difference has a zero-width interval whatever the items' spread
    assert out["mean"] == pytest.approx(0.3) and out["hi"] - out["lo"] < 1e-9
    diff = rng.normal(0.2, 1.0, size=(1, 2000))
    out = tl.bootstrap_delta(diff, np.zeros(2000), rng, reps=2000)
    half = 1.96 * diff.std() / np.sqrt(diff.size)  # the normal interval's half width
    assert out["lo"] < out["mean"] < out["hi"]
    assert (out["hi"] - out["lo"]) / 2 == pytest.approx(half, rel=0.12)
    # several seeds: per-seed means, and the seeds' spread widens the interval
    arm = np.stack([ref + 1.0, ref - 1.0, ref + 3.0])
    out = tl.bootstrap_delta(arm, ref, rng, reps=2000)
    assert out["per_seed"] == pytest.approx([1.0, -1.0, 3.0])
    assert out["mean"] == pytest.approx(1.0) and out["lo"] <= -0.9 and out["hi"] >= 2.9


def test_deltas_and_means_over_arms():
    rng = np.random.default_rng(1)
    n = 6

    def ev(shift):
        return {s: {"match": list(np.clip(rng.random(n) + shift, 0, 1)),
                    "nll": list(2.0 + rng.random(n) + shift)} for s in tl.SUITES}

    evals = {"none": ev(0.0), "table": {0: ev(0.5), 1: ev(0.5)}, "text": {0: ev(0.0),
                                                                          1: ev(0.0)}}
    d = tl.deltas(evals, (0, 1), rng)
    m = tl.means(evals, (0, 1))
    for s in tl.SUITES:
        for metric in ("match", "nll"):
            want = np.mean([np.mean(evals["table"][k][s][metric]) for k in (0, 1)]
                           ) - np.mean(evals["none"][s][metric])
            assert d[s][metric]["table"]["mean"] == pytest.approx(want)
            assert m["table"][s][metric] - m["none"][s][metric] == pytest.approx(want)
        assert d[s]["nll"]["table_vs_text"]["lo"] > 0  # +0.5 on [0, 1) noise, 12 rows


def test_counting_reward_counts_verified_answers():
    fn = tl.counting_reward(lambda p, it: 0.25, answer_reward)
    assert fn("5", {"answer": 5}) == 0.25 and fn("6", {"answer": 5}) == 0.25
    assert fn("x", {"answer": "x"}) == 0.25
    assert (fn.hits, fn.samples) == (2, 3)


def test_evaluate_one_bucket_gives_the_same_greedy_answers():
    # the experiment evaluates with min_bucket=EVAL_BUCKET (every prompt padded to one
    # length); greedy decoding must not depend on the padding
    from lcjax.eval import evaluate

    model = tiny_model(2)
    kw = dict(lengths=(448,), depths=(0.5,), n_per_cell=3, tasks=("nolima_control",),
              max_new_tokens=6, progress=False, batch_size=4)
    a = evaluate(model, "nolima", **kw)
    b = evaluate(model, "nolima", min_bucket=512, **kw)
    assert [r["prediction"] for r in a.records] == [r["prediction"] for r in b.records]
    assert any(r["prediction"] for r in a.records)


def test_rl_claims_need_a_learning_signal():
    """No verified answer, or too few GRPO steps with reward spread: not tested (the old
    report said "fails" for a policy that never answered)."""
    counts = {"hits": {"table": 3, "text": 0}, "samples": {"table": 288, "text": 288},
              "updated": {"table": tl.MIN_SPREAD_STEPS, "text": 9}}
    held = tl.rl_signal_claim("c", "t", "+2 pts", True, ("table",), counts)
    assert held.holds is True and "signal" in held.precondition
    assert tl.rl_signal_claim("c", "t", "-1 pts", False, ("table",), counts).holds is False
    both = tl.rl_signal_claim("c", "t", "x", True, ("table", "text"), counts)
    assert both.holds is None and "text RL: 0 verified of 288 samples" in both.ours
    few = {**counts, "updated": {"table": tl.MIN_SPREAD_STEPS - 1, "text": 9}}
    assert tl.rl_signal_claim("c", "t", "x", True, ("table",), few).verdict == "not tested"


# --- the warm start -------------------------------------------------------------------------


def test_warm_rows_mask_exactly_the_answer_and_eos():
    from lcjax.data.tablelong import item_prompt
    from lcjax.train.rewards import reference_text

    items = tl.warm_items(2, seed=tl.WARM_SEED)
    rows = tl.warm_rows(items)
    assert [it["task"] == "add" for it in items] == [False, True, False, True]
    for i, it in enumerate(items):
        text = it["prompt"] if it["task"] == "add" else item_prompt(it)
        prompt = tok.encode(text, bos=True)
        ids = rows["inputs"][i]
        assert ids[0] == tok.BOS and np.array_equal(ids[:len(prompt)], prompt)
        # targets are the inputs shifted by one, and the masked targets spell answer + EOS
        real = rows["targets"][i] != tok.PAD
        assert np.array_equal(rows["targets"][i][real][:-1], ids[1:real.sum()])
        answer = rows["targets"][i][rows["loss_mask"][i]]
        assert answer[-1] == tok.EOS
        assert tok.decode(answer[:-1]) == reference_text(it["answer"])
        assert answer_reward(tok.decode(answer[:-1]), it) == 1.0  # the verifier accepts it
    with pytest.raises(ValueError, match="width"):
        tl.warm_rows(items, width=64)
    with pytest.raises(ValueError, match="DATA_SEED"):
        tl.warm_items(2, seed=tl.DATA_SEED)


def test_warm_items_are_disjoint_from_the_rl_items():
    warm = tl.warm_items(8)
    rl = tl.table_items(8) + tl.arithmetic_items([700] * 8)
    assert not {it["prompt"] if "prompt" in it else it["context"] for it in warm} & {
        it["prompt"] if "prompt" in it else it["context"] for it in rl}
    assert {it["seed"] for it in warm if "seed" in it} == {tl.WARM_SEED}


def test_warm_batches_cover_every_row_once_per_pass():
    rows = {"inputs": np.arange(10)[:, None], "targets": np.arange(10)[:, None],
            "loss_mask": np.ones((10, 1), bool)}
    batches = row_batches(rows, steps=7, batch=3, seed=1)  # 21 rows: 2 passes + 1
    seen = np.concatenate([b["inputs"][:, 0] for b in batches])
    assert len(batches) == 7 and all(len(b["inputs"]) == 3 for b in batches)
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
    assert all(np.array_equal(b["inputs"], b["targets"]) for b in batches)  # rows kept whole


def _heldout(n: int) -> list:
    from lcjax.train.rewards import reference_text

    items = tl.table_items(n, seed=97, with_answer=True)
    items += tl.arithmetic_items([len(tl.rl_prompt(it)) - 1 for it in items], seed=97)
    return [_Item(tok.decode(tl.rl_prompt(it)[1:]), reference_text(it["answer"]))
            for it in items]


def test_warm_start_lowers_the_heldout_answer_nll_and_leaves_the_base_alone():
    base = tiny_model(3)
    before = tl.param_digest(base)
    heldout = _heldout(4)
    nll_base = tl.answer_nll(base, heldout, batch_size=4, width=tl.WARM_WIDTH)
    warm, info = tl.warm_start(base, tl.warm_items(16), steps=24, batch=4, lr=1e-2)
    nll_warm = tl.answer_nll(warm, heldout, batch_size=4, width=tl.WARM_WIDTH)
    assert tl.param_digest(base) == before != tl.param_digest(warm)
    assert info["steps"] == 24 and info["rows"] == 32
    assert info["answer_nll_last"] < info["answer_nll_first"]
    # items of another seed: the answer format, not the items, was learned (a random init
    # spreads ~ln 259 = 5.6 nats over the bytes; answers are digits, names, EOS)
    assert nll_warm.mean() < nll_base.mean() - 1.0, (nll_base.mean(), nll_warm.mean())


def test_every_rl_arm_starts_from_the_same_parameters():
    """rl_arms hands each run its own copy of the start: an RL run that changes the model
    it is given in place must not move the next arm's start."""
    import jax
    from flax import nnx

    start = tiny_model(4)
    digest = tl.param_digest(start)

    def clobber(model, items, seed, s):  # an "RL run" that updates its model in place
        state = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda x: x + 1.0, state))
        return model, {"seed": seed, "n": len(items)}

    runs = tl.rl_arms(start, {"table": [1, 2], "text": [3]}, {"seeds": (0, 1)}, rl_fn=clobber)
    digests = {info["start_digest"] for r in runs.values() for _, info in r.values()}
    assert digests == {digest} and tl.param_digest(start) == digest
    assert runs["text"][1][1] == {"seed": 1, "n": 1, "start_digest": digest}
    assert tl.param_digest(runs["table"][0][0]) != digest  # the runs' own models moved


def test_warm_record_reports_before_and_after_and_a_start_mismatch():
    def ev(nll, verified):
        return {"tablelong": {"nll": nll, "verified": verified, "predictions": ["x"]}}

    evals = {"base": ev([9.0, 7.0, 8.0], [0.0, 0.0, 0.0]), "none": ev([3.0, 2.0, 4.0],
                                                                       [1.0, 0.0, 1.0])}
    rec = tl.warm_record(evals, "abc", {"abc"})
    assert rec["heldout_nll_base"] == pytest.approx(8.0)
    assert rec["heldout_nll_warm"] == pytest.approx(3.0)
    assert (rec["heldout_verified_base"], rec["heldout_verified_warm"]) == (0, 2)
    assert rec["heldout_items"] == 3 and rec["arms_start_from_warm"] is True
    assert tl.warm_record(evals, "abc", {"abc", "abd"})["arms_start_from_warm"] is False
    assert tl.warm_record(evals, "abc", {"abd"})["arms_start_from_warm"] is False
