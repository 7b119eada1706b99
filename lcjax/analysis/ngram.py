"""Count-based byte n-gram (Markov) language models: the baselines a byte-level
transformer must beat.

An order-n model predicts byte x_t from the n previous bytes h = x_{t-n..t-1}
with Witten-Bell interpolation (Witten & Bell, 1991) down to a uniform 1/256:

    P_n(x | h) = (c(h, x) + u(h) P_{n-1}(x | h')) / (c(h) + u(h)),

where c(h, x) counts the pair in the training bytes, c(h) = Σ_x c(h, x),
u(h) = #{x : c(h, x) > 0} and h' drops the oldest byte of h; an unseen context
(c(h) = 0) backs off entirely to P_{n-1}. Held-out cost is reported in bits per
byte, -mean log2 P(x_t | h_t).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["NgramCounts", "fit_ngram", "bits_per_byte", "as_bytes"]


def as_bytes(data: bytes | str | np.ndarray) -> np.ndarray:
    """A uint8 array of the data (str is UTF-8 encoded)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if isinstance(data, bytes | bytearray):
        return np.frombuffer(bytes(data), dtype=np.uint8)
    return np.asarray(data, dtype=np.uint8)


def _context_codes(x: np.ndarray, order: int) -> np.ndarray:
    """Integer code of the `order` bytes before each position t >= order: [len - order]."""
    codes = np.zeros(len(x) - order, dtype=np.int64)
    for lag in range(order, 0, -1):
        codes = codes * 256 + x[order - lag: len(x) - lag]
    return codes


@dataclass(frozen=True)
class _Table:
    """Sorted unique keys with counts, for vectorised lookup."""

    keys: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray) -> _Table:
        keys, counts = np.unique(values, return_counts=True)
        return cls(keys, counts)

    def lookup(self, values: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.keys, values)
        idx = np.minimum(idx, len(self.keys) - 1)
        return np.where(self.keys[idx] == values, self.counts[idx], 0) if len(self.keys) else \
            np.zeros(len(values), np.int64)


@dataclass(frozen=True)
class NgramCounts:
    """Counts for orders 0..order: pair counts c(h, x), context counts c(h), types u(h)."""

    order: int
    pairs: tuple[_Table, ...]
    contexts: tuple[_Table, ...]
    types: tuple[_Table, ...]


def fit_ngram(train: bytes | str | np.ndarray, order: int) -> NgramCounts:
    """Count all contexts of length 0..order in the training bytes."""
    if order < 0:
        raise ValueError(f"order must be >= 0, got {order}")
    x = as_bytes(train)
    pairs, contexts, types = [], [], []
    for n in range(order + 1):
        ctx = _context_codes(x, n)
        pair = ctx * 256 + x[n:]
        pair_table = _Table.of(pair)
        pairs.append(pair_table)
        contexts.append(_Table.of(ctx))
        types.append(_Table.of(pair_table.keys // 256))  # one entry per distinct (h, x)
    return NgramCounts(order, tuple(pairs), tuple(contexts), tuple(types))


def _probabilities(counts: NgramCounts, x: np.ndarray) -> np.ndarray:
    """P(x_t | history) for t >= order (Witten-Bell interpolation)."""
    order = counts.order
    target = x[order:].astype(np.int64)
    prob = np.full(len(target), 1.0 / 256.0)
    for n in range(order + 1):
        ctx = _context_codes(x, n)[order - n:]
        c_pair = counts.pairs[n].lookup(ctx * 256 + target)
        c_ctx = counts.contexts[n].lookup(ctx)
        u = counts.types[n].lookup(ctx)
        seen = c_ctx > 0
        mixed = (c_pair + u * prob) / np.where(seen, c_ctx + u, 1)
        prob = np.where(seen, mixed, prob)
    return prob


def bits_per_byte(counts: NgramCounts, heldout: bytes | str | np.ndarray) -> float:
    """Mean -log2 P(x_t | x_{t-n..t-1}) over held-out bytes t >= order."""
    x = as_bytes(heldout)
    if len(x) <= counts.order:
        raise ValueError(f"held-out data ({len(x)} bytes) shorter than order + 1")
    return float(-np.mean(np.log2(_probabilities(counts, x))))
