"""Mutual information between tokens at a distance: power-law decay in text, periodic peaks
in row-major tables (the TableLong argument, ``docs/tablelong.md``; Lin & Tegmark, "Critical
behavior in physics and probabilistic formal languages", 2017, for the power law).

For a token sequence x and a lag d, the pairs (x_t, x_{t+d}) over all t (within each
sequence) give the plug-in estimate

    I(d) = H(X) + H(Y) - H(X, Y),   H = -sum_i (c_i / N) log(c_i / N),

with X = x_t, Y = x_{t+d}, N the number of pairs and c the counts. Its bias is positive,
about (K_XY - K_X - K_Y + 1) / (2N) nats for K observed symbols (pairs); the corrections:

- ``"miller_madow"``: every entropy gets + (K - 1) / (2N) (Miller 1955), i.e.
  I_MM = I + (K_X + K_Y - K_XY - 1) / (2N);
- ``"shuffle"``: subtract the mean MI of X against a random permutation of Y (what
  independent variables with the same marginals score).

:func:`fit_power_law` fits I(d) = A d^(-alpha) by least squares in log-log;
:func:`periodic_peaks` checks I(k m) against the off-period MI around it for a row length
m; :func:`plot_mi` writes the curves as a PNG.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from lcjax.data.corpus import load_shakespeare
from lcjax.data.tablelong import generate_item
from lcjax.optional import require

__all__ = ["PeakCheck", "PowerLawFit", "as_token_arrays", "fit_power_law", "lagged_mi",
           "mutual_information", "periodic_peaks", "plot_mi", "row_period", "text_vs_table_mi"]

CORRECTIONS = ("none", "miller_madow", "shuffle")


def as_token_arrays(data) -> list[np.ndarray]:
    """A list of 1-D int64 token arrays from bytes / str (UTF-8 bytes) / an int array, or a
    sequence of them."""
    if isinstance(data, str | bytes | bytearray | np.ndarray):
        data = [data]
    out = []
    for seq in data:
        if isinstance(seq, str):
            seq = seq.encode("utf-8")
        if isinstance(seq, bytes | bytearray):
            seq = np.frombuffer(bytes(seq), np.uint8)
        arr = np.asarray(seq)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"mutual_info: sequences must be 1-D integer arrays, got "
                             f"{arr.dtype} of shape {arr.shape}")
        if arr.size and arr.min() < 0:
            raise ValueError("mutual_info: tokens must be >= 0")
        out.append(arr.astype(np.int64))
    if not out:
        raise ValueError("mutual_info: no sequence given")
    return out


def _entropy(counts: np.ndarray, n: int) -> float:
    """Plug-in entropy (nats) of nonzero ``counts`` summing to ``n``."""
    c = counts[counts > 0].astype(np.float64)
    return math.log(n) - float(np.dot(c, np.log(c))) / n


def _counts(codes: np.ndarray) -> np.ndarray:
    return np.unique(codes, return_counts=True)[1]


def _plugin(x: np.ndarray, y: np.ndarray) -> tuple[float, int, int, int]:
    """(plug-in MI in nats, K_X, K_Y, K_XY)."""
    n = len(x)
    vy = int(y.max()) + 1
    cx, cy, cxy = _counts(x), _counts(y), _counts(x * vy + y)
    mi = _entropy(cx, n) + _entropy(cy, n) - _entropy(cxy, n)
    return mi, len(cx), len(cy), len(cxy)


def mutual_information(x, y, *, correction: str = "miller_madow", base: float = 2.0,
                       n_shuffles: int = 1, seed: int = 0) -> float:
    """MI between paired discrete samples ``x``, ``y`` (int ``[N]``), in units of
    ``log(base)`` (bits by default), with ``correction`` from :data:`CORRECTIONS`."""
    x, y = np.asarray(x, np.int64), np.asarray(y, np.int64)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(f"mutual_information: need two 1-D arrays of the same length >= 2, "
                         f"got {x.shape} and {y.shape}")
    if correction not in CORRECTIONS:
        raise ValueError(f"mutual_information: unknown correction {correction!r}; "
                         f"known: {CORRECTIONS}")
    if (x < 0).any() or (y < 0).any():
        raise ValueError("mutual_information: symbols must be non-negative ints")
    if not (base > 0 and base != 1):
        raise ValueError(f"mutual_information: base must be > 0 and != 1, got {base!r}")
    if correction == "shuffle" and not (isinstance(n_shuffles, int) and n_shuffles >= 1):
        raise ValueError(f"mutual_information: n_shuffles must be an int >= 1, "
                         f"got {n_shuffles!r}")
    mi, kx, ky, kxy = _plugin(x, y)
    if correction == "miller_madow":
        mi += (kx + ky - kxy - 1) / (2 * len(x))
    elif correction == "shuffle":
        rng = np.random.default_rng(seed)
        mi -= float(np.mean([_plugin(x, rng.permutation(y))[0] for _ in range(n_shuffles)]))
    return mi / math.log(base)


def lagged_mi(data, lags: Sequence[int], *, correction: str = "miller_madow",
              base: float = 2.0, n_shuffles: int = 1, seed: int = 0) -> np.ndarray:
    """I(d) for each lag in ``lags`` over the token sequences ``data`` (pairs never cross
    from one sequence to the next): float ``[len(lags)]``."""
    seqs = as_token_arrays(data)
    lags = [int(d) for d in lags]
    if not lags or min(lags) < 1:
        raise ValueError(f"lagged_mi: lags must be ints >= 1, got {lags}")
    out = np.empty(len(lags))
    for i, d in enumerate(lags):
        pairs = [(s[:-d], s[d:]) for s in seqs if len(s) > d]
        if not pairs or sum(len(a) for a, _ in pairs) < 2:
            raise ValueError(f"lagged_mi: no sequence is longer than lag {d} + 1")
        x = np.concatenate([a for a, _ in pairs])
        y = np.concatenate([b for _, b in pairs])
        out[i] = mutual_information(x, y, correction=correction, base=base,
                                    n_shuffles=n_shuffles, seed=seed + i)
    return out


@dataclasses.dataclass(frozen=True)
class PowerLawFit:
    """I(d) ~= amplitude * d ** (-exponent); ``r2`` of the log-log least-squares line."""

    amplitude: float
    exponent: float
    r2: float

    def __call__(self, lags) -> np.ndarray:
        return self.amplitude * np.asarray(lags, np.float64) ** (-self.exponent)


def fit_power_law(lags, mi, *, min_lag: int = 1) -> PowerLawFit:
    """Least squares of log I = log A - alpha log d over the lags >= ``min_lag`` with I > 0
    (at least 3). In byte-level text the power law holds past the word scale (d >~ 10):
    shorter lags decay faster."""
    lags, mi = np.asarray(lags, np.float64), np.asarray(mi, np.float64)
    keep = (mi > 0) & (lags >= max(min_lag, 1))
    if keep.sum() < 3:
        raise ValueError("fit_power_law: need at least 3 lags with positive MI")
    lx, ly = np.log(lags[keep]), np.log(mi[keep])
    slope, intercept = np.polyfit(lx, ly, 1)
    resid = ly - (slope * lx + intercept)
    r2 = 1.0 - float(resid @ resid) / max(float(((ly - ly.mean()) ** 2).sum()), 1e-300)
    return PowerLawFit(float(math.exp(intercept)), float(-slope), r2)


def row_period(text: str | bytes) -> int:
    """The most common line length in bytes plus one (the newline): the row period m of an
    aligned (fixed-width) table such as TableLong's markdown."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    lengths = collections.Counter(len(line) for line in text.split(b"\n") if line)
    if not lengths:
        raise ValueError("row_period: empty text")
    return lengths.most_common(1)[0][0] + 1


@dataclasses.dataclass(frozen=True)
class PeakCheck:
    """MI at lag ``k * period`` against the off-period MI: the largest I(d) over the other
    lags of the period around it, ``1 <= |d - k period| <= period / 2``."""

    k: int
    lag: int
    mi: float
    off_mi: float

    @property
    def is_peak(self) -> bool:
        return self.mi > self.off_mi


def periodic_peaks(data, period: int, ks: Sequence[int] = (1, 2, 3, 4, 5), *,
                   correction: str = "miller_madow", base: float = 2.0) -> list[PeakCheck]:
    """For each k: I(k m) and the off-period MI around it (:class:`PeakCheck`)."""
    if period < 4:
        raise ValueError(f"periodic_peaks: period must be >= 4, got {period}")
    out = []
    for k in ks:
        centre = k * period
        off = [centre + s * o for o in range(1, period // 2 + 1) for s in (-1, 1)]
        mis = lagged_mi(data, [centre] + off, correction=correction, base=base)
        out.append(PeakCheck(int(k), centre, float(mis[0]), float(mis[1:].max())))
    return out


def plot_mi(curves: dict[str, tuple[Sequence[int], Sequence[float]]], path, *,
            fits: dict[str, PowerLawFit] | None = None,
            periods: dict[str, int] | None = None, title: str = "Mutual information vs lag"):
    """Writes a PNG with one panel per curve ({label: (lags, mi)}): log-log axes with the
    power-law fit for labels in ``fits``, linear axes with dashed lines at multiples of the
    period for labels in ``periods``. Returns ``path``."""
    with require("eval", "lcjax.analysis.mutual_info (plots)"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fits, periods = fits or {}, periods or {}
    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 4), squeeze=False)
    for ax, (label, (lags, mi)) in zip(axes[0], curves.items(), strict=True):
        lags, mi = np.asarray(lags), np.asarray(mi)
        ax.plot(lags, mi, ".-", lw=1, ms=3, label=label)
        if label in fits:
            ax.set_xscale("log")
            ax.set_yscale("log")
            f = fits[label]
            ax.plot(lags, f(lags), "--", label=f"{f.amplitude:.3g} d^-{f.exponent:.2f}")
        if label in periods:
            m = periods[label]
            for k in range(1, int(lags.max()) // m + 1):
                ax.axvline(k * m, color="grey", ls=":", lw=0.8)
        ax.set_xlabel("lag d (tokens)")
        ax.set_ylabel("I(d) (bits)")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


TEXT_LAGS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def text_vs_table_mi(path=None, *, text_bytes: int = 1_000_000, table_bytes: int = 65_536,
                     seed: int = 0, ks: Sequence[int] = (1, 2, 3, 4, 5),
                     table_text: str | None = None) -> dict:
    """The comparison of the TableLong argument, on bytes with Miller-Madow correction:
    - text: I(d) at :data:`TEXT_LAGS` over the first ``text_bytes`` of the Shakespeare corpus
      and its power-law fit for d >= 16;
    - table: an English aligned-markdown TableLong context of about ``table_bytes`` (item 1
      of ``seed``, or ``table_text``), its row period m, I(d) for d = 1 .. (max(ks) + 1) m and
      the :func:`periodic_peaks` checks.

    Writes the two-panel plot to ``path`` when given. Returns ``{"text": {"lags", "mi",
    "fit"}, "table": {"period", "lags", "mi", "peaks"}}``."""
    text = "".join(d.text for d in load_shakespeare())[:text_bytes]
    t_mi = lagged_mi(text, TEXT_LAGS)
    fit = fit_power_law(TEXT_LAGS, t_mi, min_lag=16)
    if table_text is None:
        table_text = generate_item(seed, 1, min_len=int(0.9 * table_bytes), max_len=table_bytes,
                                   languages=("en",), formats=("markdown",))["context"]
    m = row_period(table_text)
    lags = list(range(1, (max(ks) + 1) * m + 1))
    mi = lagged_mi(table_text, lags)
    peaks = [PeakCheck(k, k * m, float(mi[k * m - 1]),
                       float(max(mi[k * m - 1 + o] for o in range(-(m // 2), m // 2 + 1) if o)))
             for k in ks]
    if path is not None:
        plot_mi({"text (Shakespeare)": (TEXT_LAGS, t_mi), "table (markdown)": (lags, mi)}, path,
                fits={"text (Shakespeare)": fit}, periods={"table (markdown)": m})
    return {"text": {"lags": list(TEXT_LAGS), "mi": t_mi.tolist(), "fit": fit},
            "table": {"period": m, "lags": lags, "mi": mi.tolist(), "peaks": peaks}}
