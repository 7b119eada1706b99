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


def _run(rho, top, mean, base, enh, k=2):
    return {"correlations": {"lps": {"spearman": rho, "pearson": rho}},
            "top_success": top, "mean_success": mean, "top_heads": [(0, 0)] * k,
            "accuracy": base, "accuracy_enhanced": enh}


def test_claims_from_per_seed_runs():
    """Verdicts follow the 95% t-interval over seeds; unmet preconditions are not tested."""
    runs = [_run(0.3, 0.9, 0.2, [90, 40, 0], [90, 50, 0]),
            _run(0.5, 0.8, 0.3, [80, 30, 0], [80, 45, 0]),
            _run(0.4, 0.7, 0.1, [85, 35, 0], [85, 50, 0])]
    claims = E.claims_from(runs)
    assert [c.holds for c in claims] == [True, True, True, None]
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t(0.975, 2) · sd 0.1 / √3
    assert f"+0.400 [{0.4 - half:+.3f}, {0.4 + half:+.3f}] over 3 seeds" in claims[0].ours
    assert "per seed 0.300, 0.500, 0.400" in claims[0].ours
    assert "per seed 0.900 vs 0.200, 0.800 vs 0.300, 0.700 vs 0.100" in claims[1].ours
    assert "per seed 50.0 vs 40.0, 45.0 vs 30.0, 50.0 vs 35.0" in claims[2].ours
    assert "2×" in claims[2].claim and "4×" in claims[3].claim
    assert claims[3].ours.startswith("not tested: original accuracy 0.0% at 4× L")
    # the sign flips between seeds (0.39 / -0.10): the interval holds 0, so it fails
    unstable = E.claims_from([_run(0.39, 0.9, 0.2, [90, 40, 0], [90, 50, 0]),
                              _run(-0.10, 0.9, 0.2, [90, 40, 0], [90, 50, 0])])
    assert unstable[0].holds is False and unstable[0].verdict == "fails"
    # a model that does not retrieve at 1x: the head claims are not tested, never "fails"
    weak = E.claims_from([_run(0.5, 0.9, 0.2, [30, 20, 10], [30, 25, 12]),
                          _run(0.6, 0.8, 0.2, [20, 20, 10], [20, 30, 14])])
    assert [c.holds for c in weak[:2]] == [None, None]
    assert "1× accuracy 25.0%" in weak[0].ours and "retrieves" in weak[0].precondition
    # one seed: no interval, not tested
    one = E.claims_from([_run(0.5, 0.9, 0.2, [90, 40, 5], [90, 50, 9])])
    assert all(c.holds is None and "one seed" in c.ours for c in one)


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
                n_per_cell=1, log=lambda *a: None)
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
    assert run["items_per_length"] == [len(E.DEPTHS)] * 3
    assert all(0 <= a <= 100 for a in run["accuracy"] + run["accuracy_enhanced"])
    assert len(res.claims) == 4
    for fig in res.figures:
        assert fig.read_bytes()[:4] == b"\x89PNG"
    assert "under-trained" in res.notes
