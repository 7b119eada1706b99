r"""Real univariate series for forecasting, windowed without leakage, and two numpy baselines.

The forecasting half of PLASH's evaluation (issue 11, item 6b; the paper uses ETT, ECL and
Weather, which we cannot download) on the real series the PyPI ``statsmodels`` package
ships in ``statsmodels.datasets`` (no download: they are files inside the package):

=============  ========  =====  ======  ===================================================
name           step      n      period  what
=============  ========  =====  ======  ===================================================
``co2``        weekly    2284   52      Mauna Loa CO₂ (ppm); its 59 missing weeks are filled
                                        by linear interpolation in time (``pandas``)
``sunspots``   yearly    309    11      yearly sunspot number 1700–2008 (the ~11-year cycle)
``elnino``     monthly   732    12      sea-surface temperature, the 61 × 12 table flattened
                                        row by row (year, then month)
``macrodata``  quarterly 202    4       US real GDP growth, 100·(log GDP_t − log GDP_{t−1})
=============  ========  =====  ======  ===================================================

Protocol (:func:`make_splits`): the series x[0:n] is cut chronologically at
``n_tr = ⌊f_tr·n⌋`` and ``n_va = ⌊(f_tr + f_va)·n⌋``; it is standardised as
z = (x − μ)/σ with μ, σ the mean and standard deviation of the *training segment*
x[0:n_tr] only; window i has input z[i : i+L] and target z[i+L : i+L+H]. A window belongs
to the split that holds all of its targets: train ``i+L+H ≤ n_tr``; val ``i+L ≥ n_tr`` and
``i+L+H ≤ n_va``; test ``i+L ≥ n_va``. Inputs of val/test windows may reach back into the
earlier segment (as in the Informer/PatchTST protocol); targets never overlap across
splits, and every test target comes after every training target.

Baselines (numpy), on windows X [N, L] → forecasts [N, H]:

- seasonal naive with period P ≤ L: repeat the last observed season,
  ŷ_h = x_{L − P + (h mod P)}, h = 0 … H−1;
- linear: ridge least squares Ŷ = X W + b with an unpenalised intercept,
  W = (X̃ᵀX̃ + λI)⁻¹ X̃ᵀỸ (X̃, Ỹ centred by the training means), b = ȳ − x̄ W.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lcjax.optional import require

__all__ = ["SERIES", "ForecastSplits", "SeriesInfo", "fit_linear", "load_series", "mae",
           "make_splits", "mse", "predict_linear", "seasonal_naive", "sliding_windows",
           "split_bounds"]


@dataclasses.dataclass(frozen=True)
class SeriesInfo:
    """A shipped series: its ``statsmodels.datasets`` module, sampling step and season."""

    name: str
    step: str
    period: int
    description: str


SERIES = {
    "co2": SeriesInfo("co2", "weekly", 52, "Mauna Loa CO2, ppm (missing weeks interpolated)"),
    "sunspots": SeriesInfo("sunspots", "yearly", 11, "yearly sunspot number 1700-2008"),
    "elnino": SeriesInfo("elnino", "monthly", 12, "El Nino sea-surface temperature, C"),
    "macrodata": SeriesInfo("macrodata", "quarterly", 4, "US real GDP growth, % per quarter"),
}


def load_series(name: str) -> np.ndarray:
    """The series ``name`` (a key of :data:`SERIES`) as float64 [n], in time order."""
    if name not in SERIES:
        raise ValueError(f"unknown series {name!r}; known: {sorted(SERIES)}")
    with require("data", "lcjax.data.timeseries"):
        from statsmodels import datasets  # imported here: only forecasting needs statsmodels

    data = getattr(datasets, name).load_pandas().data
    if name == "co2":  # weekly index; 59 NaN weeks filled linearly in time
        values = data["co2"].interpolate(method="time").to_numpy()
    elif name == "sunspots":
        values = data["SUNACTIVITY"].to_numpy()
    elif name == "elnino":  # rows are years, columns JAN..DEC: flatten year-major
        values = data.drop(columns="YEAR").to_numpy().reshape(-1)
    else:  # macrodata: quarterly real GDP -> growth in percent
        values = 100.0 * np.diff(np.log(data["realgdp"].to_numpy()))
    values = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError(f"series {name!r} still has non-finite values after loading")
    return values


def _check_series(series) -> np.ndarray:
    x = np.asarray(series, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"a series must be 1-D [n]; got shape {x.shape}")
    return x


def _check_lengths(input_len, horizon):
    for name, value in (("input_len", input_len), ("horizon", horizon)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"`{name}` must be a positive int, got {value!r}")


def sliding_windows(series, input_len: int, horizon: int, starts=None):
    """Windows of ``series`` [n]: inputs [N, L] = x[i : i+L], targets [N, H] = x[i+L : i+L+H]
    for each start i in ``starts`` (default every i = 0 … n − L − H)."""
    x = _check_series(series)
    _check_lengths(input_len, horizon)
    last = x.size - input_len - horizon
    if last < 0:
        raise ValueError(f"a series of {x.size} points has no window of input_len={input_len}"
                         f" + horizon={horizon}")
    starts = np.arange(last + 1) if starts is None else np.asarray(starts, dtype=np.int64)
    if starts.size and (starts.min() < 0 or starts.max() > last):
        raise ValueError(f"window starts must lie in [0, {last}]")
    idx = starts[:, None] + np.arange(input_len + horizon)[None, :]
    w = x[idx]
    return w[:, :input_len], w[:, input_len:]


def split_bounds(n: int, fractions=(0.7, 0.1, 0.2)) -> tuple[int, int]:
    """(n_tr, n_va): the series is train x[:n_tr], val x[n_tr:n_va], test x[n_va:]."""
    f = np.asarray(fractions, dtype=np.float64)
    if f.shape != (3,) or np.any(f <= 0) or not np.isclose(f.sum(), 1.0):
        raise ValueError(f"`fractions` must be three positive numbers summing to 1, got "
                         f"{fractions!r}")
    return int(np.floor(f[0] * n)), int(np.floor((f[0] + f[1]) * n))


@dataclasses.dataclass(frozen=True)
class ForecastSplits:
    """Standardised windows per split: ``x_*`` [N, L], ``y_*`` [N, H], ``start_*`` [N]
    (window i's input begins at series index i); ``mean``, ``std`` of the training segment;
    ``bounds`` = (n_tr, n_va)."""

    x_train: np.ndarray
    y_train: np.ndarray
    start_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    start_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    start_test: np.ndarray
    mean: float
    std: float
    bounds: tuple[int, int]


def make_splits(series, input_len: int, horizon: int, fractions=(0.7, 0.1, 0.2)
                ) -> ForecastSplits:
    """Chronological train/val/test windows of ``series``, standardised with the training
    segment's mean and standard deviation only (module docstring)."""
    x = _check_series(series)
    _check_lengths(input_len, horizon)
    n_tr, n_va = split_bounds(x.size, fractions)
    L, H = input_len, horizon
    ranges = {"train": (0, n_tr - L - H), "val": (n_tr - L, n_va - L - H),
              "test": (n_va - L, x.size - L - H)}
    for split, (lo, hi) in ranges.items():
        if lo < 0 or hi < lo:
            raise ValueError(f"the {split} split of a {x.size}-point series (bounds {n_tr}, "
                             f"{n_va}) has no window of input_len={L} + horizon={H}")
    train = x[:n_tr]
    mean, std = float(train.mean()), float(train.std())
    if not std > 0:
        raise ValueError("the training segment is constant: cannot standardise")
    z = (x - mean) / std
    out = {}
    for split, (lo, hi) in ranges.items():
        starts = np.arange(lo, hi + 1)
        xs, ys = sliding_windows(z, L, H, starts)
        out |= {f"x_{split}": xs, f"y_{split}": ys, f"start_{split}": starts}
    return ForecastSplits(**out, mean=mean, std=std, bounds=(n_tr, n_va))


def seasonal_naive(x, horizon: int, period: int) -> np.ndarray:
    """Seasonal-naive forecasts [N, H] of windows ``x`` [N, L]: ŷ_h = x_{L−P+(h mod P)}."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"seasonal_naive: windows must be [N, L]; got shape {x.shape}")
    _check_lengths(x.shape[1], horizon)
    if isinstance(period, bool) or not isinstance(period, (int, np.integer)) or not (
            1 <= period <= x.shape[1]):
        raise ValueError(f"seasonal_naive: need 1 <= period <= input_len={x.shape[1]}, got "
                         f"{period!r}")
    cols = x.shape[1] - period + np.arange(horizon) % period
    return x[:, cols]


def fit_linear(x, y, ridge: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Ridge least squares Y ≈ X W + b: (W [L, H], b [H]); the intercept is not penalised.

    W = (X̃ᵀX̃ + λI)⁻¹ X̃ᵀỸ with X̃ = X − x̄, Ỹ = Y − ȳ, b = ȳ − x̄W (λ = ``ridge`` ≥ 0;
    solved by least squares on the stacked system [X̃; √λ I] W = [Ỹ; 0])."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"fit_linear: need x [N, L] and y [N, H] with the same N; got "
                         f"{x.shape} and {y.shape}")
    if not ridge >= 0:
        raise ValueError(f"fit_linear: `ridge` must be >= 0, got {ridge!r}")
    xm, ym = x.mean(0), y.mean(0)
    a = np.concatenate([x - xm, np.sqrt(ridge) * np.eye(x.shape[1])])
    rhs = np.concatenate([y - ym, np.zeros((x.shape[1], y.shape[1]))])
    w = np.linalg.lstsq(a, rhs, rcond=None)[0]
    return w, ym - xm @ w


def predict_linear(x, w, b) -> np.ndarray:
    """Forecasts [N, H] = X W + b of windows ``x`` [N, L]."""
    return np.asarray(x, dtype=np.float64) @ w + b


def mse(pred, target) -> float:
    """Mean squared error over all windows and horizon steps."""
    return float(np.mean((np.asarray(pred) - np.asarray(target)) ** 2))


def mae(pred, target) -> float:
    """Mean absolute error over all windows and horizon steps."""
    return float(np.mean(np.abs(np.asarray(pred) - np.asarray(target))))
