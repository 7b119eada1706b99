"""experiments/lps: the retrieval prompts' answer positions, the claims and a tiny end-to-end
run.

References: the generator's own needle offsets (``Sample.offsets``: where the needle text
starts in the prompt) for the answer positions; hand-made per-seed runs for the claims;
``lcjax.analysis.lps`` / ``retrieval_heads`` recomputed on the run's own model for the
end-to-end numbers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments.lps import experiment as E
from lcjax.data import BOS, decode_bytes


def test_retrieval_prompts_point_at_the_needle_value():
    prompts, positions = E.retrieval_prompts(6, seed=3)
    for i, (tokens, pos) in enumerate(zip(prompts, positions)):
        sample = E.SUITE.generate("niah", np.random.default_rng([3, i]), E.TRAIN_LEN,
                                  **E.SUITE.task(E.TASK).overrides)
        value = sample.references[0]
        needle_at = sample.offsets[0]
        want = 1 + needle_at + sample.needles[0].index(value)  # 1: the BOS token
        assert pos == want
        assert tokens[0] == BOS and len(tokens) == len(sample.prompt) + 1
        assert decode_bytes(tokens[pos:pos + len(value)]) == value
    assert len(set(positions)) > 1  # depths vary


class _Scores:
    def __init__(self, lps):
        self.lps = np.asarray(lps, float)


def _run(lps, success, top, mean, base, enh, ablated_top=10.0, ablated_random=(90.0, 92.0),
         k=2):
    return {"scores": _Scores(lps), "success": np.asarray(success, float),
            "top_success": top, "mean_success": mean, "top_heads": [(0, 0)] * k,
            "accuracy": base, "accuracy_enhanced": enh, "ablated_top": ablated_top,
            "ablated_random": list(ablated_random)}


def test_spearman_permutation_against_scipy_and_the_exact_null():
    """The observed value is scipy's Spearman (mean over seeds); with 3 heads and one seed
    the null is uniform over the 6 orderings, Spearman values (1, .5, .5, −.5, −.5, −1), so
    P(null ≥ 1) = 1/6 and the 95% interval is [−1, 1]."""
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(3, 8)) for _ in range(2)]
    ys = [x + rng.normal(size=x.shape) for x in xs]
    out = E.spearman_permutation(xs, ys, 500)
    want = np.mean([spearmanr(x.ravel(), y.ravel()).statistic for x, y in zip(xs, ys)])
    assert out["observed"] == pytest.approx(want, rel=1e-12)
    assert out["observed"] > out["hi"] and out["p"] < 0.01
    tiny = E.spearman_permutation([[1.0, 2.0, 3.0]], [[1.0, 2.0, 3.0]], 20_000)
    assert tiny["observed"] == pytest.approx(1.0)
    assert tiny["p"] == pytest.approx(1 / 6, abs=0.01)
    assert tiny["lo"] == pytest.approx(-1.0) and tiny["hi"] == pytest.approx(1.0)
    flat = E.spearman_permutation([[1.0, 2.0, 3.0]], [[0.5, 0.5, 0.5]], 10)
    assert np.isnan(flat["observed"])


def test_claims_from_per_seed_runs():
    """Verdicts follow the permutation / t intervals; unmet preconditions are not tested."""
    rng = np.random.default_rng(1)
    lps = [rng.normal(size=(3, 8)) for _ in range(3)]
    good = [_run(x, x + 0.3 * rng.normal(size=x.shape), 0.9 - 0.1 * i, 0.2, [99, 60, 30, 2],
                 [99, 70, 40, 2], ablated_top=20.0 + i) for i, x in enumerate(lps)]
    claims = E.claims_from(good, [96, 120, 144, 192])
    assert [c.holds for c in claims] == [True, True, True, True]
    assert "permutation interval" in claims[0].ours
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t(0.975, 2) · sd 0.1 / √3
    assert f"+0.600 [{0.6 - half:+.3f}, {0.6 + half:+.3f}] over 3 seeds" in claims[1].ours
    # ablation: drops 79/78/77 points vs 8 for random: +71, +70, +69
    assert "+70.000" in claims[2].ours and "20.0 vs 91.0" in claims[2].ours
    # enhancement over 1.25x and 1.5x only (2x: 2% is "at zero"): +10 every seed
    assert "1.25× (60.0%), 1.5× (30.0%)" in claims[3].ours
    assert "per seed 55.0 vs 45.0" in claims[3].ours
    # success falling with LPS: the observed mean below the interval -> fails
    anti = [_run(x, -x, 0.9, 0.2, [99, 60, 30, 2], [99, 70, 40, 2]) for x in lps]
    assert E.claims_from(anti, [96, 120, 144, 192])[0].holds is False
    # a model that does not retrieve at 1x: the head claims are not tested, never "fails"
    weak = E.claims_from([_run(x, x, 0.9, 0.2, [30, 20, 10, 0], [30, 25, 12, 0])
                          for x in lps[:2]], [96, 120, 144, 192])
    assert [c.holds for c in weak[:3]] == [None, None, None]
    assert "1× accuracy 30.0%" in weak[1].ours and "retrieves" in weak[0].precondition
    # every length > L saturated or at zero: the enhancement claim is not tested
    sat = E.claims_from([_run(x, x, 0.9, 0.2, [99, 98, 97, 1], [99, 99, 99, 1])
                         for x in lps], [96, 120, 144, 192])
    assert sat[3].holds is None and "lengths used: none" in sat[3].ours
    # one seed: no t-interval, not tested
    one = E.claims_from(good[:1], [96, 120, 144, 192])
    assert all(c.holds is None and "one seed" in c.ours for c in one[1:])


def test_enhancement_lengths_skip_one_and_the_saturated():
    assert E.enhancement_lengths(np.array([50.0, 96.0, 95.0, 5.0, 4.9, 0.0])) == [2, 3]


def test_random_heads_are_distinct_and_avoid_the_excluded():
    rng = np.random.default_rng(0)
    got = E.random_heads((3, 8), 5, [(0, 1), (2, 7)], rng)
    assert len(set(got)) == 5 and not {(0, 1), (2, 7)} & set(got)
    assert all(0 <= a < 3 and 0 <= b < 8 for a, b in got)
    with pytest.raises(ValueError, match="3 heads asked, 2 outside"):
        E.random_heads((1, 3), 3, [(0, 0)], rng)


def test_ablating_every_head_removes_all_mixing_between_positions():
    """With every head's output projection zeroed, position t's logits depend on token t
    alone (RoPE only enters attention): changing earlier tokens changes nothing; with one
    head left they change. The input model keeps its weights."""
    import jax.numpy as jnp
    from flax import nnx

    from lcjax.data import VOCAB_SIZE
    from lcjax.nn import DecoderConfig, DecoderLM

    cfg = DecoderConfig(vocab_size=VOCAB_SIZE, **{**E.model_config(2), "max_len": 32})
    model = DecoderLM(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    x = rng.integers(3, 200, (1, 12))
    y = x.copy()
    y[0, :6] = rng.integers(3, 200, 6)
    every = [(a, b) for a in range(2) for b in range(cfg.num_heads)]
    dead = E.ablate_heads(model, every)
    np.testing.assert_allclose(np.asarray(dead(jnp.asarray(x))[0, -1]),
                               np.asarray(dead(jnp.asarray(y))[0, -1]), rtol=1e-6, atol=1e-6)
    one_left = E.ablate_heads(model, every[1:])
    assert not np.allclose(np.asarray(one_left(jnp.asarray(x))[0, -1]),
                           np.asarray(one_left(jnp.asarray(y))[0, -1]), atol=1e-6)
    assert float(jnp.abs(model.blocks[0].attn.o_proj[...]).min()) >= 0
    assert float(jnp.abs(model.blocks[0].attn.o_proj[...]).max()) > 0


def test_unknown_setting_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="unknown settings"):
        E.run(True, tmp_path, stepz=3)


def test_tiny_run_end_to_end(tmp_path, monkeypatch):
    """A 1-layer model, 4 steps: the report's numbers are those of lcjax.analysis on the
    trained model (captured from analyse_seed), the figures exist."""
    from lcjax.analysis.lps import LLAMA_MULTIPLIER, model_lps, resample_multiplier
    from lcjax.analysis.retrieval_heads import retrieval_success

    models = []
    real_train = E.train_model

    def spy(*args, **kw):
        out = real_train(*args, **kw)
        models.append(out["model"])
        return out

    monkeypatch.setattr(E, "train_model", spy)
    res = E.run(True, tmp_path, layers=1, steps=4, batch=4, retrieval_prompts=3, enhance=2,
                items=2, random_draws=2, log=lambda *a: None)
    (model,) = models
    run = res.numbers["runs"][0]
    want = model_lps(model)
    np.testing.assert_allclose(run["score"], want.score, rtol=1e-6)
    assert run["top_heads"] == [list(h) for h in want.top_heads(2)]
    prompts, positions = E.retrieval_prompts(3)
    success = retrieval_success(model, prompts, positions, top_k=E.TOP_K)
    np.testing.assert_allclose(run["success"], success)
    assert run["top_success"] == pytest.approx(
        np.mean([success[layer, head] for layer, head in want.top_heads(2)]))
    np.testing.assert_allclose(run["multiplier"], resample_multiplier(LLAMA_MULTIPLIER, 8))
    assert run["items_per_length"] == [2] * len(E.EVAL_MULTS)
    assert all(0 <= a <= 100 for a in run["accuracy"] + run["accuracy_enhanced"]
               + run["ablated_random"] + [run["ablated_top"]])
    assert len(run["random_heads"]) == 2 and all(len(h) == 2 for h in run["random_heads"])
    assert len(res.claims) == 4 and all(c.precondition for c in res.claims)
    for fig in res.figures:
        assert fig.read_bytes()[:4] == b"\x89PNG"
    assert "under-trained" in res.notes
