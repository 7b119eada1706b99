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
    b, se = E.slope(correct, _items(d))
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
            "ablation": {"answer": ablation, "quotes": {**ablation, "top_head": (0, 1)}}}


def test_claims_need_a_model_above_chance():
    learned = [c.holds for c in E.claims_of(_run(0.8), 400)]
    chance = [c.holds for c in E.claims_of(_run(0.5, long_accuracy=0.5), 400)]
    assert learned == [True] * 6
    assert chance == [False, False, False, True, False, False]  # the probe claim stands alone
    assert not E.claims_of(_run(0.8, slope=0.015, se=0.01), 400)[1].holds   # < 2 SE
    assert not E.claims_of(_run(0.8, long_accuracy=0.55), 400)[2].holds      # long at chance
    assert not any(c.holds for c in E.claims_of(_run(0.8, drop_top=0.1, drop_random=0.15),
                                                400)[4:])
    assert not E.claims_of({**_run(0.8), "probe_r2_by_layer_at_init": [0.95, 0.1]}, 400)[3].holds
    assert not E.claims_of({**_run(0.8), "probe_r2_by_layer": [0.1, 0.45]}, 400)[3].holds


def test_top_vs_random_reads_the_drop_table():
    scores = np.zeros((3, 4))
    scores[2, 1] = 1.0
    drops = np.arange(12.0).reshape(3, 4)
    out = E.top_vs_random(scores, drops)
    assert out["top_head"] == (2, 1) and out["drop_top"] == 9.0
    assert len(set(out["random_heads"])) == E.RANDOM_HEADS
    assert (2, 1) not in out["random_heads"]
    assert out["drop_random_mean"] == np.mean([drops[h] for h in out["random_heads"]])
