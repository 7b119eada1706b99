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
