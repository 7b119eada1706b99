"""ContextLM experiment: paired per-seed differences and the interval verdict."""

from __future__ import annotations

import math

import pytest

from experiments.contextlm import experiment as ex


def _runs(base, ctx, size="s"):
    return ([{"size": size, "arm": "baseline", "seed": i, "heldout_bpb": b}
             for i, b in enumerate(base)]
            + [{"size": size, "arm": "contextlm", "seed": i, "heldout_bpb": c}
               for i, c in enumerate(ctx)])


def test_paired_differences_by_hand():
    d = ex.paired_differences(_runs([2.0, 2.1, 2.2], [1.9, 2.0, 2.15]))["s"]
    assert d["diffs"] == pytest.approx([-0.1, -0.1, -0.05])
    mean = -0.25 / 3
    sd = math.sqrt(((0.1 - 0.25 / 3) ** 2 * 2 + (0.05 - 0.25 / 3) ** 2) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)
    assert d["mean"] == pytest.approx(mean)
    assert (d["lo"], d["hi"]) == pytest.approx((mean - half, mean + half))


def test_claim_follows_the_interval_at_every_size():
    lower = ex.paired_differences(_runs([2.0, 2.1, 2.2], [1.9, 2.0, 2.1])
                                  + _runs([1.8, 1.9, 2.0], [1.7, 1.81, 1.9], size="m"))
    assert ex.lower_at_every_size_claim(lower, 10).holds is True
    # every seed lower at "m" but one of them barely: the interval reaches above 0
    mixed = ex.paired_differences(_runs([2.0, 2.1, 2.2], [1.9, 2.0, 2.1])
                                  + _runs([1.8, 1.9, 2.0], [1.5, 1.899, 1.9], size="m"))
    assert mixed["m"]["hi"] > 0 and ex.lower_at_every_size_claim(mixed, 10).holds is False
    one = ex.paired_differences(_runs([2.0], [1.0]))
    assert ex.lower_at_every_size_claim(one, 10).verdict == "not tested"
