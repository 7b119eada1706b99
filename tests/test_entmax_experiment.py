"""experiments/entmax: the fair long-context experiment's pieces and a tiny end-to-end run.

The statistics (bootstrap, longest length at 90%, the verdict) are checked on hand-made
cells whose answer is known; the eval hook against ``ruler.answer_accuracy``; the pipeline
(train through ``lcjax.train.train`` for a fixed budget with held-out checks, score at
1×–16× L, figure, claims, not-run reporting) on a one-layer model with an 8-byte task and
a 4-step budget.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.entmax import experiment as E
from lcjax.data import ruler, synthetic


def _runs(variant: str, p: dict[int, float], seeds=4, n=200, seed=0) -> list[dict]:
    """Run records of ``variant`` (NAPE) with exact-match rate ``p[m]`` at each multiple."""
    rng = np.random.default_rng(seed)
    return [{"variant": variant, "position": "nape", "seed": s, "steps": 10, "params": 1,
             "checks": [{"exact": p[1]}],
             "exact": {m: rng.random(n) < p[m] for m in E.EVAL_MULTS}} for s in range(seeds)]


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_items():
    rng = np.random.default_rng(1)
    small = rng.random((3, 50)) < 0.3
    big = rng.random((3, 2000)) < 0.3
    lo_s, hi_s = E.interval(E.bootstrap_mean(small, rng))
    lo_b, hi_b = E.interval(E.bootstrap_mean(big, rng))
    assert lo_s < small.mean() < hi_s and lo_b < big.mean() < hi_b
    assert hi_b - lo_b < (hi_s - lo_s) / 3  # ~ 1/sqrt(40) narrower
    # the binomial standard error of one seed's mean: interval ≈ ± 1.96 sqrt(p(1-p)/n)
    one = rng.random((1, 4000)) < 0.5
    lo, hi = E.interval(E.bootstrap_mean(one, rng, reps=4000))
    assert abs((hi - lo) / 2 - 1.96 * np.sqrt(0.25 / 4000)) < 0.004


def test_longest_ok():
    assert E.longest_ok({1: 0.95, 2: 0.92, 4: 0.5, 8: 0.95, 16: 0.0}) == 2
    assert E.longest_ok({1: 0.85, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0}) is None
    assert E.longest_ok(dict.fromkeys(E.EVAL_MULTS, 1.0)) == 16


def test_paired_verdict_follows_the_t_interval_of_per_seed_differences():
    from scipy import stats

    task = E.TASKS["mqmtar"]
    rng = np.random.default_rng(2)
    base = {1: 0.98, 2: 0.6, 4: 0.3, 8: 0.1, 16: 0.0}
    better = {1: 0.97, 2: 0.8, 4: 0.6, 8: 0.4, 16: 0.2}
    soft = _runs("softmax", base, seed=1)
    same = [dict(r, variant="asentmax") for r in soft]  # the softmax runs: Δ = 0 on every seed
    cells = E.summarize(soft + _runs("entmax", better, seed=2) + same, rng)
    held = E.verdict(task, "nape", "entmax", cells)
    assert held.holds and "4 seeds" in held.ours and "equal steps" in held.claim
    # the per-seed differences, by hand: seed s's mean over items, entmax minus softmax
    ent = {r["seed"]: r for r in _runs("entmax", better, seed=2)}
    long = [np.mean([ent[s]["exact"][m].mean() - r["exact"][m].mean()
                     for m in E.EVAL_MULTS[1:]]) for s, r in enumerate(soft)]
    d = E.paired_differences(cells["entmax", "nape"], cells["softmax", "nape"])
    np.testing.assert_allclose(d["long"], long)
    half = stats.t.ppf(0.975, 3) * np.std(long, ddof=1) / 2
    assert f"Δ {100 * np.mean(long):+.1f} [{100 * (np.mean(long) - half):+.1f}, " in held.ours
    # no difference at all: the interval is [0, 0], not above 0
    assert E.verdict(task, "nape", "asentmax", cells).holds is False
    # a gain at long context without a match at 1× does not hold
    cells = E.summarize(soft + _runs("entmax", {**better, 1: 0.80}, seed=4), rng)
    assert E.verdict(task, "nape", "entmax", cells).holds is False
    # softmax never learned the task, or one paired seed: not tested (never "fails")
    cells = E.summarize(_runs("softmax", {**base, 1: 0.5}) + _runs("entmax", better), rng)
    c = E.verdict(task, "nape", "entmax", cells)
    assert c.holds is None and c.verdict == "not tested" and "softmax 1×" in c.ours
    assert "learned" in c.precondition
    cells = E.summarize(_runs("softmax", base, seeds=1) + _runs("entmax", better), rng)
    assert E.verdict(task, "nape", "entmax", cells).holds is None
    # a cell that did not run: no claim
    assert E.verdict(task, "rope", "entmax", cells) is None


def test_exact_eval_hook_matches_answer_accuracy():
    samples = [synthetic.mqmtar(i, 80) for i in range(6)]
    batch = synthetic.make_batch(samples)
    logits = jax.random.normal(jax.random.key(0), (*batch["inputs"].shape, 259))
    # make rows 0, 2, 3 right on every answer byte, row 1 right on all but one
    onehot = jax.nn.one_hot(batch["targets"], 259) * 50.0
    keep = np.zeros(len(samples), bool)
    keep[[0, 1, 2, 3]] = True
    logits = jnp.where(keep[:, None, None], logits + onehot, logits)
    a1 = batch["answer_start"][1]
    logits = logits.at[1, a1].add(-100.0 * onehot[1, a1])
    model = lambda inputs: logits  # noqa: E731
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    _, mets = jax.jit(lambda b: E.exact_eval(model, b, None))(b)
    ref = ruler.answer_accuracy(np.argmax(np.asarray(logits), -1), batch)["exact"]
    assert ref.tolist()[:4] == [True, False, True, True]
    assert float(mets["exact"][0]) == pytest.approx(ref.mean()) and float(mets["exact"][1]) == 6
    assert float(mets["loss_weight"]) == batch["loss_mask"].sum()


@pytest.fixture
def tiny_task(monkeypatch):
    """An 8-byte flip-flop task "tiny", a one-layer model, 'learned' forced (threshold 0)
    and scoring at 1× and 2× only (to compile less)."""
    monkeypatch.setitem(E.TASKS, "tiny", E.Task(
        "tiny", 8, functools.partial(E._synthetic, "flip_flop"), "8-byte flip-flop"))
    monkeypatch.setattr(E, "LEARNED", 0.0)
    monkeypatch.setattr(E, "EVAL_MULTS", (1, 2))
    monkeypatch.setattr(E, "MODEL", dict(d_model=16, num_layers=1, num_heads=2,
                                         num_kv_heads=2, head_dim=8, mlp_hidden=32))
    monkeypatch.setattr(E, "VALID_ITEMS", 8)


def test_tiny_run_end_to_end(tmp_path, monkeypatch, tiny_task):
    """4 steps of a 1-layer model on 8-byte flip-flop; 'learned' forced (threshold 0) so the
    scoring (at 1× and 2× here, to compile less), the figure and the claims run; a missing
    variant is 'not run'."""
    monkeypatch.setitem(E.VARIANTS, "ghost", "no-such-attention")
    setting = dataclasses.replace(E.QUICK, tasks=("tiny",), variants=("softmax", "ghost"),
                                  max_steps=4, eval_items=4)
    lines = []
    res = E.run(True, tmp_path, setting=setting, log=lambda *a, **k: lines.append(a[0]))
    assert res.numbers["variants_run"] == ["softmax"]
    assert res.numbers["variants_not_run"] == ["ghost"] and "Not run" in res.notes
    (run,) = res.numbers["runs"]
    assert run["steps"] == 4 and len(run["checks"]) == 1 and run["checks"][0]["step"] == 4
    assert set(run["exact"]) == set(E.EVAL_MULTS)
    assert all(0.0 <= v <= 1.0 for v in run["exact"].values())
    assert res.figures[0].exists() and res.figures[0].stat().st_size > 1000
    assert res.claims == []  # no sparse variant ran: nothing to compare
    cell = res.numbers["per_task"]["tiny"]["softmax/rope"]
    assert cell["exact_1x"] == pytest.approx(run["exact"][1])
    assert any("held-out exact" in line for line in lines)


def test_full_run_keeps_records_and_resumes_from_them(tmp_path, monkeypatch, tiny_task):
    """The full path saves each finished run; a rerun with the same setting reuses it (no
    training: train_fixed would raise) with the same per-item scores, a rerun with
    another step cap does not, and the quick path keeps nothing."""
    setting = dataclasses.replace(E.FULL, seeds=(0,), tasks=("tiny",), variants=("softmax",),
                                  positions=("rope",), max_steps=4, eval_items=16)
    first = E.run(False, tmp_path, setting=setting, log=lambda *a, **k: None)
    path = E.run_record_path(tmp_path, "tiny", "softmax", "rope", 0)
    kept = E.load_run_record(path, setting)
    assert kept is not None and kept["steps"] == 4 and kept["exact"][1].shape == (16,)

    def no_training(*a, **k):
        raise AssertionError("a kept run was trained again")

    real = E.train_fixed
    monkeypatch.setattr(E, "train_fixed", no_training)
    lines = []
    again = E.run(False, tmp_path, setting=setting, log=lambda *a, **k: lines.append(a[0]))
    assert any("kept from" in line for line in lines)
    assert again.numbers["runs"][0]["exact"] == first.numbers["runs"][0]["exact"]
    assert again.numbers["per_task"] == first.numbers["per_task"]
    other = dataclasses.replace(setting, max_steps=3)
    assert E.load_run_record(path, other) is None
    with pytest.raises(AssertionError, match="trained again"):
        E.run(False, tmp_path, setting=other, log=lambda *a, **k: None)
    monkeypatch.setattr(E, "train_fixed", real)
    E.run(True, tmp_path / "quick", setting=setting, log=lambda *a, **k: None)
    assert not (tmp_path / "quick" / "runs").exists()
