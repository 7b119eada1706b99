"""lcjax.data.timeseries: windows, leakage-free splits, standardisation, the two baselines
(against hand computations, statsmodels' OLS and an AR(2) process), the shipped series."""

import numpy as np
import pytest

from lcjax.data import timeseries as ts


def test_windows_targets_follow_inputs_by_hand():
    s = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])
    x, y = ts.sliding_windows(s, 3, 2)
    assert x.shape == (4, 3) and y.shape == (4, 2)
    np.testing.assert_array_equal(x[0], [3, 1, 4])
    np.testing.assert_array_equal(y[0], [1, 5])
    np.testing.assert_array_equal(x[3], [1, 5, 9])
    np.testing.assert_array_equal(y[3], [2, 6])
    for i in range(4):  # targets of window i = s[i+L : i+L+H]
        np.testing.assert_array_equal(y[i], s[i + 3:i + 5])
    x2, y2 = ts.sliding_windows(s, 3, 2, starts=[2])
    np.testing.assert_array_equal(x2[0], [4, 1, 5])
    np.testing.assert_array_equal(y2[0], [9, 2])


def test_splits_chronological_disjoint_targets_and_windows_match_series():
    rng = np.random.default_rng(0)
    s = rng.normal(size=200).cumsum()
    L, H = 12, 5
    sp = ts.make_splits(s, L, H)
    n_tr, n_va = sp.bounds
    assert (n_tr, n_va) == (140, 160)
    z = (s - sp.mean) / sp.std
    targets = {}
    for split in ("train", "val", "test"):
        starts = getattr(sp, f"start_{split}")
        x, y = getattr(sp, f"x_{split}"), getattr(sp, f"y_{split}")
        assert len(starts) == len(x) == len(y) > 0
        for i, x_i, y_i in zip(starts, x, y):
            np.testing.assert_allclose(x_i, z[i:i + L])
            np.testing.assert_allclose(y_i, z[i + L:i + L + H])
        targets[split] = (starts.min() + L, starts.max() + L + H - 1)  # first, last index
    assert targets["train"] == (L, n_tr - 1)
    assert targets["val"] == (n_tr, n_va - 1)
    assert targets["test"] == (n_va, s.size - 1)
    assert targets["train"][1] < targets["val"][0] <= targets["val"][1] < targets["test"][0]


def test_standardisation_uses_training_segment_only():
    rng = np.random.default_rng(1)
    s = rng.normal(size=100)
    s[80:] += 1000.0  # the test segment: a leak into the mean or std would show at once
    sp = ts.make_splits(s, 8, 4)
    n_tr = sp.bounds[0]
    assert sp.mean == pytest.approx(s[:n_tr].mean(), abs=1e-12)
    assert sp.std == pytest.approx(s[:n_tr].std(), abs=1e-12)
    assert abs(sp.mean - s.mean()) > 100  # the full-series mean would differ
    z_train = (s[:n_tr] - s[:n_tr].mean()) / s[:n_tr].std()
    np.testing.assert_allclose(sp.x_train[0], z_train[:8])
    # train statistics only: the shifted test targets stay ~1000/σ away from 0
    assert np.abs(sp.x_train).max() < 5 and np.abs(sp.y_test).min() > 100


def test_seasonal_naive_by_hand():
    x = np.array([[1.0, 2.0, 3.0, 4.0, 5.0], [10.0, 20.0, 30.0, 40.0, 50.0]])
    np.testing.assert_array_equal(ts.seasonal_naive(x, 3, 2), [[4, 5, 4], [40, 50, 40]])
    np.testing.assert_array_equal(ts.seasonal_naive(x, 4, 3), [[3, 4, 5, 3], [30, 40, 50, 30]])
    np.testing.assert_array_equal(ts.seasonal_naive(x, 2, 1), [[5, 5], [50, 50]])


def test_linear_exact_fit_matches_statsmodels_ols_and_ridge_by_hand():
    from statsmodels.regression.linear_model import OLS
    from statsmodels.tools import add_constant

    rng = np.random.default_rng(2)
    x = rng.normal(size=(40, 3))
    y = np.stack([x @ [2.0, -1.0, 0.5] + 3.0, x @ [0.0, 1.0, 1.0] - 1.0], 1)
    y = y + 0.1 * rng.normal(size=y.shape)
    w, b = ts.fit_linear(x, y)
    for h in range(2):
        ols = OLS(y[:, h], add_constant(x)).fit().params
        np.testing.assert_allclose(b[h], ols[0], atol=1e-10)
        np.testing.assert_allclose(w[:, h], ols[1:], atol=1e-10)
    np.testing.assert_allclose(ts.predict_linear(x, w, b), x @ w + b)
    # one input, ridge λ: w = Σ x̃ỹ / (Σ x̃² + λ), b = ȳ − x̄ w (hand formula)
    x1 = np.array([[1.0], [2.0], [4.0]])
    y1 = np.array([[1.0], [3.0], [4.0]])
    xc, yc = x1[:, 0] - 7 / 3, y1[:, 0] - 8 / 3
    w_hand = (xc @ yc) / (xc @ xc + 2.0)
    w1, b1 = ts.fit_linear(x1, y1, ridge=2.0)
    np.testing.assert_allclose(w1[0, 0], w_hand, rtol=1e-12)
    np.testing.assert_allclose(b1[0], 8 / 3 - 7 / 3 * w_hand, rtol=1e-12)


def test_linear_recovers_ar2_coefficients():
    rng = np.random.default_rng(3)
    phi1, phi2 = 0.6, -0.3
    s = np.zeros(6000)
    e = rng.normal(size=s.size)
    for t in range(2, s.size):
        s[t] = phi1 * s[t - 1] + phi2 * s[t - 2] + e[t]
    x, y = ts.sliding_windows(s[100:], 2, 1)  # x = (s_{t-2}, s_{t-1}), y = s_t
    w, b = ts.fit_linear(x, y)
    np.testing.assert_allclose(w[:, 0], [phi2, phi1], atol=0.04)
    assert abs(b[0]) < 0.05


def test_metrics():
    p, t = np.array([[1.0, 2.0]]), np.array([[0.0, 4.0]])
    assert ts.mse(p, t) == pytest.approx(2.5) and ts.mae(p, t) == pytest.approx(1.5)


@pytest.mark.parametrize("name,n,period", [("co2", 2284, 52), ("sunspots", 309, 11),
                                           ("elnino", 732, 12), ("macrodata", 202, 4)])
def test_shipped_series(name, n, period):
    s = ts.load_series(name)
    assert s.shape == (n,) and np.all(np.isfinite(s)) and ts.SERIES[name].period == period
    if name == "elnino":  # flattened year-major: Jan, Feb 1950, ..., Jan 1951
        np.testing.assert_allclose(s[[0, 1, 12]], [23.11, 24.20, 24.19])
    if name == "macrodata":
        np.testing.assert_allclose(s[0], 100 * np.log(2778.801 / 2710.349))
    if name == "co2":  # interpolated weeks lie between their neighbours' range
        from statsmodels.datasets import co2

        raw = co2.load_pandas().data["co2"].to_numpy()
        np.testing.assert_array_equal(s[~np.isnan(raw)], raw[~np.isnan(raw)])
        i = int(np.flatnonzero(np.isnan(raw))[0])
        lo, hi = raw[i - 1], raw[i + 1:][~np.isnan(raw[i + 1:])][0]
        assert i > 0 and min(lo, hi) <= s[i] <= max(lo, hi)


def test_errors():
    s = np.arange(20.0)
    with pytest.raises(ValueError, match="no window"):
        ts.sliding_windows(s, 15, 6)
    with pytest.raises(ValueError, match="horizon"):
        ts.sliding_windows(s, 3, 0)
    with pytest.raises(ValueError, match="1-D"):
        ts.sliding_windows(s.reshape(4, 5), 2, 1)
    with pytest.raises(ValueError, match="period"):
        ts.seasonal_naive(np.ones((2, 3)), 2, 4)
    with pytest.raises(ValueError, match="unknown series"):
        ts.load_series("ett")
    with pytest.raises(ValueError, match="fractions"):
        ts.split_bounds(10, (0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="split"):
        ts.make_splits(s, 4, 2)  # the val segment (2 points) holds no window
    with pytest.raises(ValueError, match="ridge"):
        ts.fit_linear(np.ones((3, 2)), np.ones((3, 1)), ridge=-1.0)


def test_forecast_batches_and_loss_ignore_padding_rows():
    """The experiment's batch layout: targets in the first H columns, padded rows masked;
    its loss equals the numpy MSE/MAE over the real windows only."""
    from experiments.plash_forecast.experiment import as_batches, forecast_loss

    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(5, 6)), rng.normal(size=(5, 2))
    batches = as_batches(x, y, 4)
    assert len(batches) == 2 and all(b["inputs"].shape == (4, 6) for b in batches)
    last = batches[1]
    np.testing.assert_array_equal(last["loss_mask"].sum(1), [2, 0, 0, 0])
    np.testing.assert_allclose(last["targets"][0, :2], y[4], rtol=1e-6)
    pred = lambda inp: np.asarray(inp)[:, :2] * 0.5  # a stand-in model: [B, L] -> [B, H]
    total, count = 0.0, 0.0
    for b in batches:
        loss, mets = forecast_loss(pred, b, None)
        total += float(loss) * float(mets["loss_weight"])
        count += float(mets["loss_weight"])
    assert count == 10
    np.testing.assert_allclose(total / count, ts.mse(x[:, :2] * 0.5, y), rtol=1e-5)
    loss, mets = forecast_loss(pred, batches[0], None)
    np.testing.assert_allclose(float(mets["mae"]), ts.mae(x[:4, :2] * 0.5, y[:4]), rtol=1e-5)
