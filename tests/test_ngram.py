"""Byte n-gram baselines: vectorised Witten-Bell vs a slow dictionary implementation."""

import math
from collections import Counter

import numpy as np
import pytest

from lcjax.analysis.ngram import _probabilities, bits_per_byte, fit_ngram


def _slow_prob(train: bytes, order: int, history: bytes, x: int) -> float:
    prob = 1.0 / 256
    for n in range(order + 1):
        h = history[len(history) - n:] if n else b""
        pairs = Counter(train[i - n:i + 1] for i in range(n, len(train)) if train[i - n:i] == h)
        c_ctx = sum(pairs.values())
        if c_ctx == 0:
            continue
        prob = (pairs.get(h + bytes([x]), 0) + len(pairs) * prob) / (c_ctx + len(pairs))
    return prob


@pytest.mark.parametrize("order", [0, 1, 2])
def test_matches_slow_implementation(order):
    rng = np.random.default_rng(order)
    train = bytes(rng.choice(list(b"abcde "), size=400).tolist())
    test = bytes(rng.choice(list(b"abcdef "), size=60).tolist())
    counts = fit_ngram(train, order)
    want = [-math.log2(_slow_prob(train, order, test[t - order:t], test[t]))
            for t in range(order, len(test))]
    assert bits_per_byte(counts, test) == pytest.approx(np.mean(want), rel=1e-10)


@pytest.mark.parametrize("order", [1, 3])
def test_distribution_sums_to_one(order):
    rng = np.random.default_rng(7)
    train = bytes(rng.integers(97, 103, size=500).tolist())
    counts = fit_ngram(train, order)
    history = train[100:100 + order]
    # every next byte after one fixed history
    probs = [_probabilities(counts, np.frombuffer(history + bytes([x]), np.uint8))[0]
             for x in range(256)]
    assert sum(probs) == pytest.approx(1.0, abs=1e-12)


def test_higher_order_helps_on_structured_text():
    text = ("the quick brown fox jumps over the lazy dog. " * 40).encode()
    b0 = bits_per_byte(fit_ngram(text[:1500], 0), text[1500:])
    b2 = bits_per_byte(fit_ngram(text[:1500], 2), text[1500:])
    assert b2 < b0 / 3
