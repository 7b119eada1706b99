"""experiments/trsp: the NoLiMa-style items it trains and evaluates on, the two-way choice
score against an unbatched reference, the seed statistics against closed forms, the claim's
verdict by hand, and the whole run on a tiny setting."""

import math

import jax
import numpy as np
import pytest

from experiments.trsp import experiment as exp
from lcjax.data import ruler
from lcjax.eval.items import build_items


def test_items_fit_every_length_and_name_both_characters():
    """The suite's items are exactly 1×…8× L bytes, the answer is the first of two names,
    both names are in the prompt and the other name is not the answer."""
    lengths = [m * exp.TRAIN_LEN for m in exp.EVAL_MULTS]
    items = build_items(exp.SUITE, lengths, (0.0, 1.0), 2, exp.EVAL_SEED)
    assert len(items) == len(lengths) * 2 * 2
    for it in items:
        assert len(it.prompt) + len(it.answer) == it.length
        names = exp.candidates(it)
        assert len(names) == 2 and names[0] == it.answer and names[1] != it.answer
        assert all(n in it.prompt for n in names)


def test_candidate_logprob_matches_a_hand_sum():
    """Σ log-softmax over the answer positions of answer_rows, against a loop over rows
    and positions with math.log / math.exp on random logits."""
    rng = np.random.default_rng(0)
    batch = ruler.answer_rows([[1, 5, 9], [1, 7]], [[3, 4], [8, 2, 6]], 6)
    logits = rng.normal(size=(2, 6, 11)) * 3
    want = []
    for b in range(2):
        total = 0.0
        for t in np.flatnonzero(batch["loss_mask"][b]):
            z = logits[b, t]
            total += z[batch["targets"][b, t]] - math.log(sum(math.exp(v) for v in z))
        want.append(total)
    assert batch["loss_mask"].sum(1).tolist() == [2, 3]
    np.testing.assert_allclose(exp.candidate_logprob(logits, batch), want, rtol=1e-12)


def test_choice_correct_needs_a_strict_win():
    scores = np.array([[-1.0, -2.0], [-3.0, -2.0], [-2.0, -2.0], [0.0, -5.0, 1.0]][:3])
    assert exp.choice_correct(scores).tolist() == [True, False, False]
    assert exp.choice_correct(np.array([[0.0, -5.0, 1.0]])).tolist() == [False]


def test_mean_interval_is_the_student_t_interval():
    """x = (1, 2, 3): mean 2, s = 1, t_{0.975, 2} = 4.302652729911275, half width
    4.3027 / √3; one value has no interval."""
    mean, lo, hi = exp.mean_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)
    assert mean == 2.0 and lo == pytest.approx(2 - half, rel=1e-9)
    assert hi == pytest.approx(2 + half, rel=1e-9)
    mean, lo, hi = exp.mean_interval([0.25])
    assert mean == 0.25 and math.isnan(lo) and math.isnan(hi)


@pytest.mark.parametrize("trsp, base, holds", [
    ({1: 0.8, 8: 0.72}, {1: 0.8, 8: 0.5}, True),    # 0.72 = 0.9 × 0.8, above the baseline
    ({1: 0.8, 8: 0.71}, {1: 0.8, 8: 0.5}, False),   # below 0.9 × 1×
    ({1: 0.8, 8: 0.75}, {1: 0.8, 8: 0.75}, False),  # not above the baseline
    ({1: 0.4, 8: 0.4}, {1: 0.4, 8: 0.1}, None),     # not learned at 1×: not tested
    ({1: 0.8, 8: 0.8}, {1: 0.3, 8: 0.1}, None),     # baseline not learned: not tested
])
def test_keeps_accuracy_by_hand(trsp, base, holds):
    assert exp.keeps_accuracy(trsp, base, 8) is holds


def test_collapse_claim_needs_learned_models_and_an_open_gate():
    assert exp.counters_collapse(3.0, 2.0, True, 0.5) is True
    assert exp.counters_collapse(2.0, 3.0, True, 0.5) is False
    assert exp.counters_collapse(3.0, 2.0, False, 0.5) is None  # not learned
    assert exp.counters_collapse(3.0, 2.0, True, 1e-4) is None  # side path off (γ ≈ 0)


def _tiny_model(trsp=True):
    from flax import nnx

    from lcjax.nn import DecoderLM

    setting = exp.Setting(model=dict(d_model=16, num_layers=2, num_heads=2, num_kv_heads=2,
                                     head_dim=8, mlp_hidden=32),
                          steps=2, batch=2, seeds=(0,), depths=(0.5,), n_per_cell=1,
                          spectral_rows=1, mults=(1, 2))
    return DecoderLM(exp.model_config(setting, trsp), rngs=nnx.Rngs(3)), setting


def test_choice_scores_match_unpadded_single_rows():
    """The batched, right-padded choice equals scoring each [BOS] + prompt + name + EOS
    alone (no padding) with log-softmax in jax, on a random TRSP model whose two names'
    log-likelihoods differ."""
    from lcjax.data.tokenizer import BOS, EOS

    model, _ = _tiny_model()
    items = build_items(exp.SUITE, [exp.TRAIN_LEN], (0.0, 1.0), 1, 5)
    got = exp.choice_scores(model, items, rows=3)  # 4 rows: a short last chunk
    want, gaps = [], []
    for it in items:
        lps = []
        for name in exp.candidates(it):
            seq = np.array([BOS, *it.prompt, *name, EOS], np.int32)
            logp = jax.nn.log_softmax(model(seq[None, :-1])[0], -1)
            n = len(name) + 1
            lps.append(float(np.take_along_axis(np.asarray(logp[-n:]), seq[-n:, None], 1).sum()))
        want.append(lps[0] > lps[1])
        gaps.append(abs(lps[0] - lps[1]))
    assert min(gaps) > 1e-3
    assert got.tolist() == want


def test_spectral_batch_rows_are_heldout_items():
    """BOS + prompt + answer + EOS at the requested length, different from the training
    stream's first rows."""
    from lcjax.data.tokenizer import BOS

    rows = exp.spectral_batch(exp.TRAIN_LEN, 2)
    train = exp.training_dataset(1, 2, exp.DATA_SEED)[0]["inputs"]
    assert rows.shape == (2, exp.TRAIN_LEN + 1) and (rows[:, 0] == BOS).all()
    assert not np.array_equal(rows, train)


def test_run_end_to_end_on_a_tiny_setting(tmp_path):
    """Two steps of a d = 16 model, evaluated at 1× and 2× L: claims, the per-seed numbers
    (accuracy, choice ∈ [0, 1] at each length, the summary's one-seed mean equal to them),
    per-layer spectra of both models and the three figures."""
    _, setting = _tiny_model()
    res = exp.run(True, tmp_path, setting=setting, log=lambda *a, **k: None)
    assert [c.claim.split(" ")[0] for c in res.claims] == ["TRSP", "TRSP"]
    assert all(c.holds is None or isinstance(c.holds, bool) for c in res.claims)
    assert all("learned" in c.precondition for c in res.claims)
    runs = res.numbers["runs"]
    assert set(runs) == {"baseline", "trsp"}
    assert runs["trsp"][0]["params"] == runs["baseline"][0]["params"] + 50
    for name, rs in runs.items():
        (r,) = rs
        assert len(r["accuracy"]) == len(r["choice"]) == 2
        assert all(0 <= v <= 1 for v in r["accuracy"] + r["choice"])
        for key in ("1x", "2x"):
            sr = r["spectral"][key]["stable_rank"]
            assert len(sr) == setting.model["num_layers"] + 1 and all(v >= 1 for v in sr)
        assert "spectral_gap" in r["spectral"]["1x"] and "spectral_gap" not in r["spectral"]["2x"]
        mu = res.numbers["summary"][name]["choice"][0][0]
        assert mu == r["choice"][0]
    assert [p.name for p in res.figures] == ["accuracy_vs_length.png", "spectral_1x.png",
                                             "spectral_2x.png"]
    assert all(p.stat().st_size > 1000 for p in res.figures)


def test_run_rejects_lengths_that_do_not_start_at_one(tmp_path):
    import dataclasses

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
