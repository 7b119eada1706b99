"""The temporal-order experiment's statistics and claims, without training (issue 18)."""

from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from experiments.temporal_order import experiment as E


def _items(distances):
    return [SimpleNamespace(distance=int(d)) for d in distances]


def test_slope_and_se_equal_linregress_and_the_per_distance_fit():
    rng = np.random.default_rng(3)
    d = np.tile(np.arange(1, 6), 40)                       # balanced, as order_item makes them
    correct = rng.random(d.size) < 0.4 + 0.08 * d
    b, se = E.slope(correct, d)
    ref = stats.linregress(d, correct.astype(float))
    np.testing.assert_allclose([b, se], [ref.slope, ref.stderr], rtol=1e-10)
    acc = E.by_distance(correct, _items(d))
    np.testing.assert_allclose(b, np.polyfit(list(acc), list(acc.values()), 1)[0], rtol=1e-10)


@pytest.mark.parametrize("n, acc, expected", [(400, 0.5, False), (400, 0.55, False),
                                              (400, 0.56, True), (32, 0.69, False),
                                              (32, 0.71, True)])
def test_above_chance_uses_the_one_sided_99_percent_margin(n, acc, expected):
    # margin 2.326 * sqrt(0.25 / n): 0.0582 at n = 400, 0.2056 at n = 32
    assert E.above_chance(acc, n) is expected


def _run(accuracy, slope=0.05, se=0.01, drop_top=0.2, drop_random=0.0, long_accuracy=0.8):
    ablation = {"top_head": (1, 2), "drop_top": drop_top, "drop_random_mean": drop_random}
    return {"source": "random", "seed": 0, "steps": 10, "accuracy": accuracy,
            "untrained_accuracy": 0.5, "distance_slope": slope, "distance_slope_se": se,
            "long_passages": 8, "long_accuracy": long_accuracy, "long_distance_slope": slope,
            "long_distance_slope_se": se,
            "probe_r2_by_layer": [0.1, 0.9],
            "probe_r2_by_layer_at_init": [0.0, 0.5],
            "learning_curve": [{"step": 5, "accuracy": 0.5, "distance_slope": 0.0,
                                "distance_slope_se": 0.01, "accuracy_by_distance": {1: 0.5}},
                               {"step": 10, "accuracy": accuracy, "distance_slope": slope,
                                "distance_slope_se": se, "accuracy_by_distance": {1: 0.8}}],
            "ablation": {"answer": ablation, "quotes": {**ablation, "top_head": (0, 1)}}}


def test_claims_need_a_model_above_chance():
    """Every claim but the accuracy's is not tested (None) on a model at chance, and
    follows its own target on a model above chance."""
    learned = [c.holds for c in E.claims_of(_run(0.8), 400)]
    chance = E.claims_of(_run(0.5, long_accuracy=0.5), 400)
    assert learned == [True] * 7
    assert [c.holds for c in chance] == [False] + [None] * 6
    assert all(c.verdict == "not tested" and c.precondition for c in chance[1:])
    assert "ours 0.500" in chance[1].precondition
    assert E.claims_of(_run(0.8, slope=0.015, se=0.01), 400)[1].holds is False   # < 2 SE
    assert E.claims_of(_run(0.8, slope=0.015, se=0.01), 400)[2].holds is False   # mid too
    assert E.claims_of(_run(0.8, long_accuracy=0.55), 400)[3].holds is None      # long at chance
    assert E.claims_of(_run(0.8, long_accuracy=0.6, slope=0.0), 400)[3].holds is False
    assert not any(c.holds for c in E.claims_of(_run(0.8, drop_top=0.1, drop_random=0.15),
                                                400)[5:])
    assert not E.claims_of({**_run(0.8), "probe_r2_by_layer_at_init": [0.95, 0.1]}, 400)[4].holds
    assert not E.claims_of({**_run(0.8), "probe_r2_by_layer": [0.1, 0.45]}, 400)[4].holds


def test_learning_curve_rebuilds_the_per_item_fit_and_picks_the_midpoint():
    rng = np.random.default_rng(4)
    d = np.tile([1, 2, 3], 40)
    correct = rng.random(d.size) < 0.3 + 0.2 * d
    acc = {k: correct[d == k].mean() for k in (1, 2, 3)}
    evals = [{"step": 7, **{f"eval_acc_d{k}": v for k, v in acc.items()}},
             {"step": 9, **{f"eval_acc_d{k}": 1.0 for k in (1, 2, 3)}}]
    curve = E.learning_curve(evals, {1: 40, 2: 40, 3: 40})
    ref = stats.linregress(d, correct.astype(float))
    np.testing.assert_allclose([curve[0]["distance_slope"], curve[0]["distance_slope_se"]],
                               [ref.slope, ref.stderr], rtol=1e-10)
    assert curve[0]["accuracy"] == correct.mean() and curve[1]["accuracy"] == 1.0
    assert E.mid_learning(curve)["step"] == (7 if abs(correct.mean() - 0.75) < 0.25 else 9)


def test_top_vs_random_reads_the_drop_table():
    scores = np.zeros((3, 4))
    scores[2, 1] = 1.0
    drops = np.arange(12.0).reshape(3, 4)
    out = E.top_vs_random(scores, drops)
    assert out["top_head"] == (2, 1) and out["drop_top"] == 9.0
    assert len(set(out["random_heads"])) == E.RANDOM_HEADS
    assert (2, 1) not in out["random_heads"]
    assert out["drop_random_mean"] == np.mean([drops[h] for h in out["random_heads"]])
    for top in range(4):                   # 3 of the 3 other heads: never the top one
        scores = np.eye(4)[top][None]
        picks = E.top_vs_random(scores, np.ones((1, 4)))["random_heads"]
        assert sorted(picks) == [(0, h) for h in range(4) if h != top]


def test_right_letter_wins_picks_a_on_ties_and_ignores_other_bytes():
    logits = np.zeros((4, 256), np.float32)
    logits[0, ord("B")] = 1.0              # B larger
    logits[2, ord("A")] = 1.0              # A larger
    logits[:, ord("C")] = 5.0              # a third letter never counts
    target = np.array([ord("B"), ord("A"), ord("B"), ord("A")])  # row 1: tie -> A
    got = np.asarray(E.right_letter_wins(logits, target))
    assert got.tolist() == [True, True, False, True]


def test_eval_hook_equals_the_held_out_accuracy_by_distance():
    # the train loop's per-distance hook on padded grain rows = accuracy() on prompt rows
    import jax.numpy as jnp

    from lcjax.data import TemporalOrderSource

    model = E.initial_model(3)
    src = TemporalOrderSource(12, seed=E.EVAL_SEED, source="random", **E.BOOK)
    batch = {k: jnp.asarray(np.stack([src[i][k] for i in range(12)]))
             for k in ("inputs", "targets", "loss_mask", "distance")}
    _, mets = E.distance_accuracy_eval(model, batch, None)
    items, rows = E.eval_batch("random", 12)
    want = E.by_distance(E.accuracy(model, rows, items), items)
    for d, acc in want.items():
        value, count = mets[f"acc_d{d}"]
        assert int(count) == sum(it.distance == d for it in items)
        np.testing.assert_allclose(float(value), acc)
