"""Lagged mutual information: closed forms on Markov chains, the bias corrections, periodic
peaks at multiples of the row length in TableLong tables, decay in Shakespeare."""

import math

import numpy as np
import pytest

from lcjax.analysis.mutual_info import (
    fit_power_law,
    lagged_mi,
    mutual_information,
    periodic_peaks,
    row_period,
)


def _markov(P, n, seed):
    """A stationary chain with transition matrix P (rows sum to 1): int [n]."""
    rng = np.random.default_rng(seed)
    P = np.asarray(P)
    w, v = np.linalg.eig(P.T)
    pi = np.real(v[:, np.argmin(abs(w - 1))])
    pi /= pi.sum()
    cum = np.cumsum(P, axis=1)
    x = np.empty(n, np.int64)
    x[0] = rng.choice(len(pi), p=pi)
    u = rng.random(n)
    for t in range(1, n):
        x[t] = np.searchsorted(cum[x[t - 1]], u[t])
    return x, pi


def _closed_form_mi(P, pi, d):
    """I(X_t; X_{t+d}) in bits: sum_ij pi_i P^d_ij log2(P^d_ij / pi_j)."""
    Pd = np.linalg.matrix_power(np.asarray(P), d)
    return float(sum(pi[i] * Pd[i, j] * math.log2(Pd[i, j] / pi[j])
                     for i in range(len(pi)) for j in range(len(pi)) if Pd[i, j] > 0))


def test_binary_symmetric_chain_matches_closed_form():
    p = 0.1
    x, pi = _markov([[1 - p, p], [p, 1 - p]], 200_000, seed=0)
    lags = [1, 2, 3, 5, 8]
    got = lagged_mi(x, lags)
    for d, g in zip(lags, got, strict=True):
        pd = (1 - (1 - 2 * p) ** d) / 2      # d steps of a binary symmetric channel
        h = -pd * math.log2(pd) - (1 - pd) * math.log2(1 - pd)
        assert g == pytest.approx(1 - h, abs=0.006)
        assert 1 - h == pytest.approx(_closed_form_mi([[1 - p, p], [p, 1 - p]], pi, d))


def test_four_state_chain_matches_closed_form():
    P = [[0.7, 0.1, 0.1, 0.1], [0.2, 0.5, 0.3, 0.0], [0.05, 0.05, 0.6, 0.3],
         [0.4, 0.0, 0.1, 0.5]]
    x, pi = _markov(P, 150_000, seed=1)
    for d, g in zip([1, 2, 4], lagged_mi(x, [1, 2, 4], correction="shuffle"), strict=True):
        assert g == pytest.approx(_closed_form_mi(P, pi, d), abs=0.008)


def test_bias_corrections_remove_the_plugin_bias_on_independent_data():
    rng = np.random.default_rng(2)
    n, v = 2000, 16
    plug, mm, sh = [], [], []
    for _ in range(8):
        x, y = rng.integers(0, v, n), rng.integers(0, v, n)
        plug.append(mutual_information(x, y, correction="none"))
        mm.append(mutual_information(x, y, correction="miller_madow"))
        sh.append(mutual_information(x, y, correction="shuffle", n_shuffles=2))
    expected_bias = (v - 1) ** 2 / (2 * n * math.log(2))   # bits
    assert np.mean(plug) == pytest.approx(expected_bias, rel=0.15)
    assert abs(np.mean(mm)) < 0.1 * expected_bias
    assert abs(np.mean(sh)) < 0.1 * expected_bias


def test_pairs_never_cross_sequences_and_units():
    zeros, ones = np.zeros(100, np.int64), np.ones(100, np.int64)
    assert lagged_mi([zeros, ones], [1, 5], correction="none") == pytest.approx([1.0, 1.0])
    crossing = lagged_mi(np.concatenate([zeros, ones]), [5], correction="none")[0]
    assert crossing < 1.0
    x = np.random.default_rng(3).integers(0, 4, 1000)
    assert mutual_information(x, x, correction="none", base=math.e) == pytest.approx(
        mutual_information(x, x, correction="none") * math.log(2))


@pytest.fixture(scope="module")
def table_text():
    from lcjax.data.tablelong import generate_item

    item = generate_item(0, 1, min_len=60_000, max_len=65_536, languages=("en",),
                         formats=("markdown",))
    return item["context"]


def test_table_mi_peaks_at_multiples_of_the_row_length(table_text):
    m = row_period(table_text)
    lines = [len(x) for x in table_text.encode().split(b"\n") if x]
    assert sum(n + 1 == m for n in lines) > 0.8 * len(lines)     # aligned rows
    checks = periodic_peaks(table_text, m, ks=(1, 2, 3, 4, 5))
    assert [c.lag for c in checks] == [m, 2 * m, 3 * m, 4 * m, 5 * m]
    assert all(c.is_peak for c in checks)
    # and the peak does not decay over the five periods, unlike text
    assert min(c.mi for c in checks) > 0.8 * max(c.mi for c in checks)


def test_text_mi_decays_with_distance_and_the_plot(tmp_path, table_text):
    from lcjax.analysis.mutual_info import TEXT_LAGS, text_vs_table_mi

    out = text_vs_table_mi(tmp_path / "mi.png", table_text=table_text, ks=(1, 2))
    mi = out["text"]["mi"]
    assert len(mi) == len(TEXT_LAGS) and all(a > b for a, b in zip(mi, mi[1:]))
    fit = out["text"]["fit"]
    assert fit.exponent > 0.1 and fit.r2 > 0.8
    # the one-pass peak check agrees with periodic_peaks on the same text
    m = out["table"]["period"]
    ref = periodic_peaks(table_text, m, ks=(1, 2))
    got = [x for p in out["table"]["peaks"] for x in (p.lag, p.mi, p.off_mi)]
    assert got == pytest.approx([x for p in ref for x in (p.lag, p.mi, p.off_mi)], rel=1e-12)
    blob = (tmp_path / "mi.png").read_bytes()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n" and len(blob) > 10_000


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="lags"):
        lagged_mi(b"abcdef", [0])
    with pytest.raises(ValueError, match="1-D"):
        lagged_mi(np.zeros((2, 3), np.int64), [1])
    with pytest.raises(ValueError, match="correction"):
        mutual_information([0, 1, 1], [1, 0, 1], correction="jackknife")
    with pytest.raises(ValueError, match="longer"):
        lagged_mi(b"abc", [5])
    with pytest.raises(ValueError, match="3 lags"):
        fit_power_law([1, 2], [0.5, 0.2])
    with pytest.raises(ValueError, match="period"):
        periodic_peaks(b"abcdefgh", 2)


def test_miller_madow_equals_corrected_entropies_by_hand():
    # I_MM = H_MM(X) + H_MM(Y) - H_MM(X, Y), H_MM = H_plugin + (K - 1) / (2N) per entropy
    # (K: observed symbols); plug-in entropies from scipy. Small N, so the correction term
    # (~0.1 nats here) is far above the tolerance: a wrong sign or a dropped -1 fails.
    from scipy.stats import entropy

    rng = np.random.default_rng(7)
    n = 60
    x, y = rng.integers(0, 5, n), rng.integers(0, 7, n)
    pairs = [a * 7 + b for a, b in zip(x, y, strict=True)]

    def h_mm(codes):
        counts = np.unique(codes, return_counts=True)[1]
        return entropy(counts) + (len(counts) - 1) / (2 * n)

    want = (h_mm(x) + h_mm(y) - h_mm(pairs)) / math.log(2)
    assert mutual_information(x, y) == pytest.approx(want, abs=1e-12)
    plug = (entropy(np.unique(x, return_counts=True)[1]) + entropy(np.unique(
        y, return_counts=True)[1]) - entropy(np.unique(pairs, return_counts=True)[1]))
    assert mutual_information(x, y, correction="none", base=math.e) == pytest.approx(plug)


def test_bad_options_raise():
    x = np.arange(10) % 3
    with pytest.raises(ValueError, match="correction"):
        mutual_information(x, x, correction="jackknife")
    with pytest.raises(ValueError, match="n_shuffles"):
        mutual_information(x, x, correction="shuffle", n_shuffles=0)
    with pytest.raises(ValueError, match="base"):
        mutual_information(x, x, base=1.0)
    with pytest.raises(ValueError, match="negative"):
        mutual_information(x - 1, x)
