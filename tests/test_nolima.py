"""Tests of lcjax.data.nolima: no literal overlap, yet solvable by following the facts."""

import re

import numpy as np
import pytest

from lcjax.data import nolima

STOPWORDS = {"a", "an", "the", "of", "to", "in", "is", "has", "been", "which", "who", "from",
             "at", "on", "and", "actually", "yesterday", "long", "next", "across", "inside"}


def content_words(text: bytes) -> set[str]:
    words = {w.lower() for w in re.findall(r"[A-Za-z]+", text.decode())}
    return words - STOPWORDS


@pytest.mark.parametrize("task", sorted(nolima.TASKS))
def test_needle_and_question_share_no_content_word_except_controls(task):
    for seed in range(40):
        s = nolima.generate(task, seed, 1200)
        shared = content_words(s.needle) & content_words(s.question)
        words = {w.lower() for w in re.findall(r"[A-Za-z]+", s.needle.decode())} & \
            {w.lower() for w in re.findall(r"[A-Za-z]+", s.question.decode())}
        if s.control:
            assert s.info["places"][0].lower() in shared  # the literal match
        else:
            assert shared == set() and words <= STOPWORDS, (s.needle, s.question)
        assert s.prompt.count(s.needle) == 1 and s.needle == s.needles[0]
        assert re.search(rb"\b" + s.answer + rb"\b", s.needle)


def test_two_hops_need_both_facts():
    s = nolima.generate("nolima_2hop", 3, 1500)
    place, landmark = s.info["places"][0], s.info["landmarks"][0]
    district = s.info["districts"][0]
    text = s.prompt.decode()
    assert f"The {landmark} is in the {district} Quarter." in text
    assert f"The {district} Quarter lies within {place}." in text
    assert f"The {landmark} is in {place}." not in text  # no shortcut
    assert place not in text[text.index("Story:"):text.rindex("Question:")]


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 1.0])
def test_depth_and_length(depth):
    for seed in range(5):
        s = nolima.generate("nolima_1hop", seed, 2000, depth=depth)
        assert s.length == 2000 and len(s.prompt) + len(s.answer) == 2000
        assert abs(s.depths[0] - depth) * s.haystack_bytes < 130
        assert s.prompt[s.offsets[0]:s.offsets[0] + len(s.needle)] == s.needle


def test_deterministic_and_errors():
    a = nolima.generate("nolima_2hop", np.random.default_rng([1, 2]), 1500)
    assert a == nolima.generate("nolima_2hop", np.random.default_rng([1, 2]), 1500)
    with pytest.raises(ValueError, match="hops"):
        nolima.nolima(0, 1000, hops=3)
    with pytest.raises(ValueError, match="unknown task"):
        nolima.generate("nope", 0, 1000)
