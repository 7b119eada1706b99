"""experiments/trsp: the needle items it trains and scores on, exact match against a
per-row reference, γ = 0 against the baseline built from the same init, the paired
verdicts by hand, and the whole run on a tiny setting."""

import dataclasses
import math

import numpy as np
import pytest

from experiments.trsp import experiment as exp


def _tiny_model(trsp=True, seed=3):
    from flax import nnx

    from lcjax.nn import DecoderLM

    setting = exp.Setting(model=dict(d_model=16, num_layers=2, num_heads=2, num_kv_heads=2,
                                     head_dim=8, mlp_hidden=32),
                          steps=2, batch=2, seeds=(0,), items=3, spectral_rows=1, mults=(1, 2))
    return DecoderLM(exp.model_config(setting, trsp), rngs=nnx.Rngs(seed)), setting


def test_scoring_rows_are_needle_items_at_each_length():
    """Rows are BOS + prompt + answer + EOS, length + 1 wide; the mask covers the 4-digit
    value and EOS, and the value's digits stand in the prompt's needle."""
    from lcjax.data.tokenizer import BOS, EOS

    for n in (exp.TRAIN_LEN, 2 * exp.TRAIN_LEN):
        rows = exp.scoring_rows(n, 3)
        assert rows["inputs"].shape == (3, n + 1) and (rows["inputs"][:, 0] == BOS).all()
        for b in range(3):
            ans = rows["targets"][b][rows["loss_mask"][b]]
            assert len(ans) == 5 and ans[-1] == EOS
            digits = bytes(ans[:-1].tolist())
            assert digits.isdigit() and digits in bytes(rows["inputs"][b].tolist()[1:])
    other = exp.scoring_rows(exp.TRAIN_LEN, 2)["inputs"]
    train = exp.training_dataset(1, 2, exp.DATA_SEED)[0]["inputs"]
    assert not np.array_equal(other, train)


def test_exact_match_equals_a_per_row_argmax_check():
    """Batched, padded exact match = every masked target is the argmax, row by row."""
    model, _ = _tiny_model()
    rows = exp.scoring_rows(exp.TRAIN_LEN, 3)
    # make row 1 right by construction: its targets become the model's own argmax
    logits = np.asarray(model(rows["inputs"]))
    rows["targets"][1] = np.where(rows["loss_mask"][1], logits[1].argmax(-1),
                                  rows["targets"][1])
    got = exp.exact_match(model, rows, batch=2)  # 3 rows: a padded last pass
    want = [bool(np.all(logits[b].argmax(-1)[rows["loss_mask"][b]]
                        == rows["targets"][b][rows["loss_mask"][b]])) for b in range(3)]
    assert got.tolist() == want and want[1]


def test_without_side_path_is_the_baseline_of_the_same_init():
    """The gate is drawn last, so a TRSP model with γ = 0 is exactly the baseline built from
    the same seed; the TRSP model itself differs (γ > 0 at init)."""
    import jax.numpy as jnp

    trsp, _ = _tiny_model(True)
    base, _ = _tiny_model(False)
    x = jnp.asarray(np.random.default_rng(0).integers(3, 200, (2, 20)))
    np.testing.assert_array_equal(np.asarray(exp.without_side_path(trsp)(x)),
                                  np.asarray(base(x)))
    assert float(jnp.abs(trsp(x) - base(x)).max()) > 1e-4
    with pytest.raises(ValueError, match="no TRSP side path"):
        exp.without_side_path(base)


def test_paired_differences_and_their_t_interval():
    """d = (1, 2, 3): mean 2, t_{0.975, 2} = 4.302652729911275, half width 4.3027/√3."""
    d, (mu, lo, hi) = exp.paired([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)
    assert d == [1.0, 2.0, 3.0] and mu == 2.0
    assert lo == pytest.approx(2 - half, rel=1e-9) and hi == pytest.approx(2 + half, rel=1e-9)


def _acc(trsp, base):
    return {"trsp": np.array(trsp, float), "baseline": np.array(base, float)}


@pytest.mark.parametrize("trsp, base, holds", [
    ([[1, .6], [1, .7], [.95, .65]], [[1, .2], [1, .3], [.95, .25]], True),  # +0.4 each seed
    ([[1, .6], [1, .1], [.95, .65]], [[1, .2], [1, .5], [.95, .25]], False),  # sign flips
    ([[.5, .6], [.6, .7], [.5, .6]], [[1, .2], [1, .3], [1, .2]], None),  # TRSP not learned
    ([[1, .95], [1, .95], [1, .95]], [[1, .92], [1, .91], [1, .93]], None),  # no room at 8x
])
def test_keeps_accuracy_by_hand(trsp, base, holds):
    got, ours, pre = exp.keeps_accuracy(_acc(trsp, base), (1, 8), 8)
    assert got is holds and "learned" in pre and "per seed" in ours


def test_collapse_claim_needs_learned_models_and_an_open_gate():
    assert exp.counters_collapse([3, 3.2, 3.1], [2, 2.1, 2], True, 0.5)[0] is True
    assert exp.counters_collapse([3, 1, 3.1], [2, 2.1, 2], True, 0.5)[0] is False
    assert exp.counters_collapse([3, 3.2, 3.1], [2, 2.1, 2], False, 0.5)[0] is None
    assert exp.counters_collapse([3, 3.2, 3.1], [2, 2.1, 2], True, 1e-4)[0] is None


def test_side_path_effect_needs_a_practical_margin():
    """Relative gains of 0.1% with a tight interval do not clear the 1% margin: fails;
    10% does: holds; one seed or an unlearned model: not tested."""
    assert exp.side_path_effect([1.001, 1.0011, 1.0009], [1, 1, 1], True)[0] is False
    assert exp.side_path_effect([1.1, 1.11, 1.09], [1, 1, 1], True)[0] is True
    assert exp.side_path_effect([1.1], [1], True)[0] is None
    assert exp.side_path_effect([1.1, 1.11, 1.09], [1, 1, 1], False)[0] is None


def test_run_end_to_end_on_a_tiny_setting(tmp_path):
    """Two steps of a d = 16 model, scored at 1× and 2× L: three claims with
    preconditions, per-seed numbers of both arms and of TRSP at γ = 0, per-layer spectra and
    the three figures."""
    _, setting = _tiny_model()
    res = exp.run(True, tmp_path, setting=setting, log=lambda *a, **k: None)
    assert len(res.claims) == 3 and all(c.precondition for c in res.claims)
    assert all(c.holds is None or isinstance(c.holds, bool) for c in res.claims)
    runs = res.numbers["runs"]
    assert set(runs) == {"baseline", "trsp", exp.GAMMA0}
    assert runs["trsp"][0]["params"] == runs["baseline"][0]["params"] + 50
    for rs in runs.values():
        (r,) = rs
        assert len(r["accuracy"]) == 2 and all(0 <= v <= 1 for v in r["accuracy"])
        for key in ("1x", "2x"):
            sr = r["spectral"][key]["stable_rank"]
            assert len(sr) == setting.model["num_layers"] + 1 and all(v >= 1 for v in sr)
        assert "spectral_gap" in r["spectral"]["1x"] and "spectral_gap" not in r["spectral"]["2x"]
    assert len(runs["trsp"][0]["gate"]["2x"]) == 2 and runs[exp.GAMMA0][0]["gate"] is None
    assert [p.name for p in res.figures] == ["accuracy_vs_length.png", "spectral_1x.png",
                                             "spectral_2x.png"]
    assert all(p.stat().st_size > 1000 for p in res.figures)


def test_run_rejects_lengths_that_do_not_start_at_one(tmp_path):
    _, setting = _tiny_model()
    with pytest.raises(ValueError, match="`mults` must start at 1"):
        exp.run(True, tmp_path, setting=dataclasses.replace(setting, mults=(2, 4)))


def test_gate_values_follow_the_gate_formula():
    """At L_ctx = 2 a 2-layer model has b = (1, 2): r = (1/2, 1), so γ_1 = sigmoid(MLP(0))
    (r^φ = 1) and γ_0 = sigmoid(MLP(-1)) · 2^{-softplus(κ)}, in numpy."""
    model, _ = _tiny_model()
    g = model.trsp_gate
    w1, b1, w2, b2 = (np.asarray(p[...], np.float64) for p in (g.w1, g.b1, g.w2, g.b2))
    mlp = lambda u: np.tanh(u * w1[0] + b1) @ w2[:, 0] + b2[0]
    sig = lambda z: 1 / (1 + np.exp(-z))
    phi = np.log1p(np.exp(float(g.kappa[...])))
    got = exp.gate_values(model, 2)
    np.testing.assert_allclose(got, [sig(mlp(-1.0)) * 0.5 ** phi, sig(mlp(0.0))], rtol=1e-5)


def test_full_run_keeps_each_arm_and_resumes_from_the_records(tmp_path, monkeypatch):
    """The full path keeps every (seed, arm) as JSON: ``only_seeds`` trains and keeps them
    and returns None; the run without it rebuilds the whole result from the records alone
    (no training), the same accuracies and stable ranks; another setting is not reused."""
    _, setting = _tiny_model()
    assert exp.run(False, tmp_path, setting=setting, only_seeds={0},
                   log=lambda *a, **k: None) is None
    kept = sorted(p.name for p in (tmp_path / "arms").iterdir())
    assert kept == ["seed0-baseline.json", "seed0-trsp.json"]
    first = {k: exp.kept_record(tmp_path / "arms" / f"seed0-{k}.json",
                                exp.arm_fingerprint(setting)) for k in exp.ARMS}

    def no_training(*a, **k):
        raise AssertionError("trained although a record was kept")

    monkeypatch.setattr(exp, "train_and_evaluate", no_training)
    res = exp.run(False, tmp_path, setting=setting, log=lambda *a, **k: None)
    runs = res.numbers["runs"]
    assert runs["baseline"][0]["accuracy"] == first["baseline"]["baseline"]["accuracy"]
    kept_rank = np.nanmean(first["trsp"][exp.GAMMA0]["spectral"]["2x"]["stable_rank"][-1])
    assert res.numbers["last_layer_stable_rank_top"][exp.GAMMA0] == [pytest.approx(kept_rank)]
    assert len(res.claims) == 3
    with pytest.raises(AssertionError, match="trained although"):
        exp.run(False, tmp_path, setting=dataclasses.replace(setting, items=2),
                log=lambda *a, **k: None)
