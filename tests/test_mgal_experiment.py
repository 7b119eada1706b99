"""experiments/mgal: the evaluation path of the MGAL experiment on the synthetic parallel
corpus (tests/mgal_synthetic.py) with callables — the oracle scores 100%, a uniformly random
chooser scores near chance on multiple choice, cells add up, the reports are written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mgal_synthetic import LANGS, Synthetic

from experiments.mgal import experiment as ex
from lcjax.data import mgal, mgal_suite
from lcjax.data.items import build_items

N_PER_CELL = 4
LENGTH = 6000  # the synthetic corpus's sections are too short to fill every cell at 2,048


@pytest.fixture(scope="module")
def suite():
    return mgal_suite.make_suite(Synthetic(seed=0).corpus())


@pytest.fixture(scope="module")
def items(suite):
    return build_items(suite, (LENGTH,), ex.DEPTHS, N_PER_CELL, ex.SEED)


def test_oracle_scores_everything(suite, tmp_path):
    r = ex.evaluate_target(ex.oracle_for(suite, N_PER_CELL, LENGTH), suite, N_PER_CELL,
                           tmp_path, "oracle", length=LENGTH)
    o = r["overall"]
    assert r["items"] == len(LANGS) * 4 * 3 * N_PER_CELL and r["errors"] == 0
    assert o["accuracy"] == 1.0 and o["mc_accuracy"] == 1.0 and o["exact_match"] == 1.0
    assert o["consistency_f1"] == 1.0 and r["string_match_all"] == 100.0
    assert all(row["accuracy"] == 1.0 for row in r["grid"])


def test_random_chooser_near_chance_and_cells_add_up(suite, items, tmp_path):
    n_options = {}
    for it in items:
        item = it.sample.info["item"]
        n_options[it.prompt.decode()] = None if item.options is None else len(item.options)
    rng = np.random.default_rng(1)

    def chooser(prompts):  # a uniformly random letter among the item's options
        return ["nothing" if n_options[p] is None else "ABCDEFGH"[rng.integers(n_options[p])]
                for p in prompts]

    r = ex.evaluate_target(chooser, suite, N_PER_CELL, tmp_path, "random", length=LENGTH)
    o = r["overall"]
    n_mc = sum(v is not None for v in n_options.values())
    assert o["n_mc"] == n_mc > 60 and o["n"] == len(items)
    chance = np.mean([1 / v for v in n_options.values() if v is not None])
    assert o["mc_chance"] == pytest.approx(chance)
    assert 0.2 < chance < 0.4
    assert abs(o["mc_accuracy"] - chance) < 0.15      # ~3.5 binomial sd at ~100 items
    assert o["exact_match"] == 0.0 and o["consistency_f1"] < 0.05  # "nothing" is no answer
    # cells add up: granularity x position x language, N_PER_CELL items each
    grid = r["grid"]
    assert len(grid) == 4 * 3 * len(LANGS)
    assert all(row["n"] == N_PER_CELL and row["n_mc"] + row["n_open"] == N_PER_CELL
               for row in grid)
    assert sum(row["n_mc"] for row in grid) == n_mc
    # the reports: the suite's metrics JSON / markdown and both heat maps per metric
    saved = json.loads((tmp_path / "random" / "mgal_metrics.json").read_text())
    assert saved["overall"]["mc_chance"] == pytest.approx(chance)
    assert "mc_chance" in (tmp_path / "random" / "mgal_metrics.md").read_text()
    names = {p.rsplit("/", 1)[-1] for p in r["figures"]}
    assert {"mgal_accuracy_language_x_granularity.png",
            "mgal_accuracy_position_x_granularity.png",
            "mgal_language_x_granularity.png", "mgal_position_x_granularity.png"} <= names
    assert (tmp_path / "random" / "results.json").exists()


def test_overall_table_lists_every_target():
    row = dict(n=3, n_mc=2, n_open=1, accuracy=0.5, mc_accuracy=0.5, mc_chance=0.25,
               exact_match=None, consistency_f1=None, fluent=None, fluent_but_drifting=None)
    table = ex.overall_table({"a": {"overall": row}, "b": {"overall": row}})
    assert table.count("\n") == 3 and "| a | 3 (2/1) | 50.0% | 50.0% | 25.0% | – |" in table


def test_beats_chance_needs_a_model_that_names_options():
    """A model that names no option is not tested on "beats chance" (the old report said it
    fails); one that answers is judged on accuracy vs chance."""
    mute = {"mc_accuracy": 0.0, "mc_chance": 0.25, "mc_answered": 0.0}
    assert ex.beats_chance_claim("shakespeare", mute).verdict == "not tested"
    talks = {"mc_accuracy": 0.4, "mc_chance": 0.25, "mc_answered": 0.9}
    assert ex.beats_chance_claim("ruler", talks).holds is True
    wrong = {"mc_accuracy": 0.2, "mc_chance": 0.25, "mc_answered": 0.9}
    assert ex.beats_chance_claim("ruler", wrong).holds is False


@pytest.fixture(scope="module")
def tiny_lm():
    from flax import nnx

    from lcjax.nn import DecoderConfig, DecoderLM

    cfg = DecoderConfig(vocab_size=259, d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                        head_dim=16, mlp_hidden=64, max_len=512)
    return DecoderLM(cfg, rngs=nnx.Rngs(3))


def test_option_loglik_equals_unpadded_forward(tiny_lm):
    """The padded, bucketed rows give log p(" " + option | [BOS] + prompt) of a plain
    forward pass over the unpadded row."""
    import jax
    import jax.numpy as jnp

    from lcjax.data.tokenizer import BOS

    prompt, options = "Q: wh\u00e9re?\nAnswer:".encode(), ("the cat", "\u65e5\u672c", "x")
    sums, counts = ex.option_loglik(tiny_lm, prompt, options)
    for opt, got, n in zip(options, sums, counts):
        row = [BOS] + list(prompt) + list((" " + opt).encode())
        logp = jax.nn.log_softmax(tiny_lm(jnp.asarray([row[:-1]])), axis=-1)[0]
        start = len(prompt)  # position of the last prompt byte predicts the first answer byte
        want = sum(float(logp[t, row[t + 1]]) for t in range(start, len(row) - 1))
        assert n == len((" " + opt).encode())
        assert got == pytest.approx(want, abs=1e-3)


def test_option_scores_choose_the_best_per_byte_option(tiny_lm):
    from types import SimpleNamespace

    item = mgal.MgalItem(language="en", granularity="word", position_doc="begin",
                         position_para="begin", length_bucket=64, context="abc abc",
                         question="Which?", options=("abc", "zzzz q", "b"), answer=1,
                         answer_span=(0, 3), crowded=False, task="cloze")
    prompt = mgal.format_prompt(item, reply="text").encode()
    it = SimpleNamespace(prompt=prompt, sample=SimpleNamespace(info={"item": item}))
    opened = SimpleNamespace(prompt=b"x", sample=SimpleNamespace(
        info={"item": item.__class__(**{**item.__dict__, "options": None, "answer": "abc"})}))
    r = ex.option_scores(tiny_lm, [it, opened])
    s, c = ex.option_loglik(tiny_lm, prompt, item.options)
    assert r["n_mc"] == 1 and r["items"][0]["choice"] == int(np.argmax(s / c))
    assert r["items"][0]["choice_sum"] == int(np.argmax(s))
    assert r["chance"] == pytest.approx(1 / 3)
    assert r["excess"] == [pytest.approx(float(r["items"][0]["choice"] == 1) - 1 / 3)]


def test_likelihood_claim_follows_the_interval():
    few = {"n_mc": 5, "excess": [0.75] * 5}
    assert ex.likelihood_claim("m", few).verdict == "not tested"
    rng = np.random.default_rng(0)
    good = (rng.random(200) < 0.6).astype(float) - 0.25   # 60% right, chance 25%
    base = dict(n_mc=200, accuracy=0.6, accuracy_sum=0.5, chance=0.25)
    assert ex.likelihood_claim("m", {**base, "excess": good.tolist()}).holds is True
    null = (rng.random(200) < 0.25).astype(float) - 0.25  # at chance
    c = ex.likelihood_claim("m", {**base, "excess": null.tolist()})
    assert c.holds is False and "95% CI" in c.ours


# --- the warm start on the MC answer format --------------------------------------------------


@pytest.fixture(scope="module")
def warm(suite):
    return ex.warm_items(suite, seeds=(100, 101), length=LENGTH)


def test_warm_items_are_multiple_choice_of_their_own_seeds(suite, warm):
    items, skipped = warm
    assert items and all(it.sample.info["item"].options is not None for it in items)
    assert 0 <= skipped < len(suite.tasks)  # the synthetic corpus fills most cells at 6,000
    assert ex.shared_questions(items, items) == len(items)
    assert ex.shared_questions(items, []) == 0
    for clash in (ex.SEED, ex.SEED + 1):
        with pytest.raises(ValueError, match="must not see"):
            ex.warm_items(suite, seeds=(100, clash), length=LENGTH)


def test_warm_rows_teach_the_gold_option_text_then_eos(warm):
    from lcjax.data import tokenizer as tok
    from lcjax.data.mgal_metrics import parse_choice

    items, _ = warm
    rows = ex.warm_rows(items)
    assert rows["inputs"].shape[1] % ex.BUCKET == 0
    for i, it in enumerate(items):
        mi = it.sample.info["item"]
        prompt = tok.encode(it.prompt, bos=True)
        assert np.array_equal(rows["inputs"][i][:len(prompt)], prompt)
        taught = rows["targets"][i][rows["loss_mask"][i]]
        assert taught[-1] == tok.EOS
        assert parse_choice(tok.decode(taught[:-1]), mi.options) == mi.answer


def test_generated_claim_needs_answers_and_follows_the_interval():
    rng = np.random.default_rng(0)

    def records(p_named, p_right, n=120):
        return {"mc": [{"n_options": 4, "choice": (0 if rng.random() < p_named else None),
                        "correct": bool(rng.random() < p_right)} for _ in range(n)]}

    assert ex.generated_claim("m", records(0.2, 0.1)).verdict == "not tested"
    assert ex.generated_claim("m", records(1.0, 0.9, n=10)).verdict == "not tested"
    assert ex.generated_claim("m", records(1.0, 0.6)).holds is True
    at_chance = ex.generated_claim("m", records(1.0, 0.25))
    assert at_chance.holds is False and "95% CI" in at_chance.ours
    assert ex.chosen_positions(records(1.0, 0.5)["mc"]) == [120, 0, 0, 0]
