"""experiments/autoselect: the decoy episodes mislead nearest-neighbour selection (its top
candidates are wrong-digit decoys), keep a consistent candidate for the query's key, and the
paired claim follows its interval."""

from __future__ import annotations

import numpy as np

from experiments.autoselect import experiment as ex
from lcjax.selection import nearest_neighbour_selection


def test_decoys_are_the_nearest_neighbours_and_wrong():
    rng = np.random.default_rng(0)
    for _ in range(20):
        ep = ex.decoy_episode(rng, 12, 3)
        truth = ep.answer[0]
        key = ep.query[:3]
        decoys = [i for i, d in enumerate(ep.demonstrations)
                  if d.startswith(key) and not ep.consistent[i] and ep.features[i, ex.CUE:].any()]
        assert len(decoys) == 3
        assert all(ep.demonstrations[i][-2] != truth for i in decoys)
        assert any(d == f"{key} y:{truth}\n" and ok
                   for d, ok in zip(ep.demonstrations, ep.consistent))
        # features agree with the text: key one-hot, digit one-hot
        for d, f in zip(ep.demonstrations, ep.features):
            assert f[ord(d[2]) - ord("a")] == 1 and f[10 + int(d[-2])] == 1
        nearest = np.asarray(nearest_neighbour_selection(ep.query_features, ep.features, 3))
        assert sorted(nearest.tolist()) == sorted(decoys)


def test_paired_claim_follows_the_interval():
    rng = np.random.default_rng(1)
    better = {"policy": rng.random(100) * 0.5 + 0.5, "nearest": rng.random(100) * 0.5}
    assert ex.paired_claim(better, "policy", "nearest", 0.9).holds is True
    same = {"policy": rng.random(100), "nearest": rng.random(100)}
    assert ex.paired_claim(same, "policy", "nearest", 0.9).holds is False
    assert ex.paired_claim(better, "policy", "nearest", 0.1).verdict == "not tested"


def test_more_demos_claim_pairs_episodes():
    """The k_max-vs-k=1 claim follows the paired t interval of per-episode hit differences:
    k=6 answers every episode k=1 answers plus 30 of the other 60 (d = +0.3, interval
    [0.209, 0.391] by hand: s = 0.4606, t_{0.975, 99} = 1.9842); the same hits shuffled
    between episodes tie in mean but are not better; a weak LM is not tested."""
    k1 = np.zeros(100, bool)
    k1[:40] = True
    k6 = k1.copy()
    k6[40:70] = True
    c = ex.more_demos_claim({1: k1, 2: k1, 6: k6}, 0.9)
    assert c.holds is True and "k=6 vs k=1" in c.claim
    assert "+0.300 [95% CI +0.209, +0.391]" in c.ours
    small = k1.copy()
    small[40:48] = True  # +8 episodes, nested: paired [0.026, 0.134] holds, unpaired would not
    c = ex.more_demos_claim({1: k1, 6: small}, 0.9)
    assert c.holds is True and "+0.080 [95% CI +0.026, +0.134]" in c.ours
    tie = ex.more_demos_claim({1: k1, 6: np.roll(k1, 50)}, 0.9)
    assert tie.holds is False
    assert ex.more_demos_claim({1: k1, 6: k6}, 0.1).verdict == "not tested"
