"""Verifiable rewards: a model's answer text scored against an item's reference ``answer``.

Used by GRPO (:mod:`lcjax.train.rl`) as ``reward_fn(prediction, item) -> float`` in [0, 1].
An item is any mapping with an ``answer`` (a string, a number, or a list of them, e.g. a
TableLong item); the prediction is the decoded completion (the stop token removed).

- :func:`exact_match`: 1 when the normalised strings are equal, else 0. Normalisation
  (:func:`normalize_answer`): Unicode NFKC, surrounding whitespace and one pair of
  surrounding quotes removed, runs of whitespace collapsed to one space, case-folded
  (``casefold=False`` keeps case). A list answer is compared with the prediction split at
  commas, element by element (order kept).
- :func:`numeric_match`: 1 when both parse as real numbers (:func:`parse_number`: an
  optional sign, digits with optional ``,`` thousands separators, a decimal point, an
  exponent, a trailing ``%`` kept as written) with
  ``|p - a| <= max(rel_tol * max(|p|, |a|), abs_tol)`` (``math.isclose``), else 0.
- :func:`answer_reward` (:func:`make_verifier` with the default tolerances): per answer
  value :func:`numeric_match` when it parses as a number, otherwise :func:`exact_match`;
  list answers part by part (in any order when the item says ``ordered: false``), and an
  item's ``decimals`` widening the absolute tolerance to half a unit of the last place —
  one verifier for mixed items, TableLong's included.
- :func:`prefix_credit`: a shaped reward for policies that are still far from the answer:
  1 when the verifier accepts, otherwise ``weight`` times the fraction of the normalised
  reference that the normalised prediction starts with (``"Cl"`` for ``"Clerk"``: 2/5).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["answer_reward", "exact_match", "make_verifier", "normalize_answer",
           "numeric_match", "parse_number", "prefix_credit", "reference_text"]

_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][+-]?\d+)?%?")
_QUOTES = ("\"\"", "''", "``", "\u201c\u201d", "\u2018\u2019")


def normalize_answer(text: Any, *, casefold: bool = True) -> str:
    """``text`` (any scalar, as ``str``) NFKC-normalised, stripped of surrounding whitespace
    and of one pair of surrounding quotes, whitespace runs collapsed, case-folded."""
    s = unicodedata.normalize("NFKC", str(text)).strip()
    for q in _QUOTES:
        if len(s) >= 2 and s[0] == q[0] and s[-1] == q[1]:
            s = s[1:-1].strip()
            break
    s = " ".join(s.split())
    return s.casefold() if casefold else s


def parse_number(text: Any) -> float | None:
    """The real number ``text`` spells (the whole stripped string), or None.

    Accepts ``int``/``float`` values (not ``bool``), and strings like ``"-1,234.5"``,
    ``"3e-2"``, ``".5"``; a trailing ``%`` is dropped (``"12%"`` -> 12.0). NaN/inf are
    refused.
    """
    if isinstance(text, bool):
        return None
    if isinstance(text, int | float):
        return float(text) if math.isfinite(text) else None
    s = unicodedata.normalize("NFKC", str(text)).strip()
    if not s or not _NUMBER.fullmatch(s) or not any(c.isdigit() for c in s):
        return None
    value = float(s.rstrip("%").replace(",", ""))
    return value if math.isfinite(value) else None


def exact_match(prediction: str, answer: Any, *, casefold: bool = True) -> float:
    """1.0 when ``prediction`` equals ``answer`` after :func:`normalize_answer`, else 0.0.

    A list/tuple ``answer`` matches a prediction whose comma-separated parts equal its
    elements, in order (``"a, b"`` matches ``["a", "b"]``).
    """
    if isinstance(answer, list | tuple):
        parts = [normalize_answer(p, casefold=casefold) for p in str(prediction).split(",")]
        want = [normalize_answer(a, casefold=casefold) for a in answer]
        return float(parts == want)
    return float(normalize_answer(prediction, casefold=casefold)
                 == normalize_answer(answer, casefold=casefold))


def numeric_match(rel_tol: float = 1e-6, abs_tol: float = 0.0) -> Callable[[str, Any], float]:
    """A verifier ``(prediction, answer) -> 1.0 | 0.0``: both numbers and
    ``math.isclose(p, a, rel_tol=rel_tol, abs_tol=abs_tol)``.

    Raises:
      ValueError: a negative or non-finite tolerance.
    """
    for name, tol in (("rel_tol", rel_tol), ("abs_tol", abs_tol)):
        if not (math.isfinite(tol) and tol >= 0):
            raise ValueError(f"numeric_match: `{name}` must be finite and >= 0, got {tol}")

    def verify(prediction: str, answer: Any) -> float:
        p, a = parse_number(prediction), parse_number(answer)
        if p is None or a is None:
            return 0.0
        return float(math.isclose(p, a, rel_tol=rel_tol, abs_tol=abs_tol))

    return verify


def make_verifier(rel_tol: float = 1e-6, abs_tol: float = 0.0, *, casefold: bool = True
                  ) -> Callable[[str, Mapping], float]:
    """``reward_fn(prediction, item)`` in {0, 1} for an item with an ``answer``.

    A scalar answer: numeric match (``rel_tol``, ``abs_tol``) when it parses as a number,
    exact match otherwise. A list answer: the prediction split at commas must have as many
    parts, each matching its element the same way, in order — or in any order (a
    one-to-one assignment) when ``item["ordered"]`` is false. An item's ``decimals`` (the
    answer was rounded to that many places, as TableLong items say) widens the absolute
    tolerance to ``0.5 * 10**-decimals``.

    Raises:
      ValueError: bad tolerances (see :func:`numeric_match`); an item without ``answer``.
    """
    numeric_match(rel_tol, abs_tol)  # ValueError for bad tolerances

    def one(prediction: str, answer: Any, tol: float) -> bool:
        if parse_number(answer) is not None:
            return numeric_match(rel_tol, tol)(prediction, answer) == 1.0
        return exact_match(prediction, answer, casefold=casefold) == 1.0

    def reward_fn(prediction: str, item: Mapping) -> float:
        if "answer" not in item:
            raise ValueError(f"reward: the item has no 'answer' (keys {sorted(item)})")
        answer, decimals = item["answer"], item.get("decimals")
        tol = abs_tol if decimals is None else max(abs_tol, 0.5 * 10.0 ** -decimals + 1e-12)
        if not isinstance(answer, list | tuple):
            return float(one(prediction, answer, tol))
        parts = str(prediction).split(",")
        if len(parts) != len(answer):
            return 0.0
        if item.get("ordered", True):
            return float(all(one(p, a, tol) for p, a in zip(parts, answer)))
        free = list(parts)  # unordered: a greedy one-to-one assignment
        for a in answer:
            hit = next((i for i, p in enumerate(free) if one(p, a, tol)), None)
            if hit is None:
                return 0.0
            free.pop(hit)
        return 1.0

    return reward_fn


answer_reward = make_verifier()
answer_reward.__doc__ = ("The default verifier: numeric match (rel_tol 1e-6) for numeric "
                         "answers, exact match otherwise; ``(prediction, item) -> float``.")


def reference_text(answer: Any) -> str:
    """The reference an answer is written as: a list joined with ``", "``, reals with
    ``repr`` (as TableLong's ``answer_strings``), anything else ``str``."""
    values = answer if isinstance(answer, list | tuple) else [answer]
    return ", ".join(repr(v) if isinstance(v, float) else str(v) for v in values)


def prefix_credit(verifier: Callable[[str, Mapping], float] = answer_reward, *,
                  weight: float = 0.5) -> Callable[[str, Mapping], float]:
    """A shaped ``reward_fn(prediction, item)`` in [0, 1].

    ``verifier(prediction, item)`` when it is 1 (a verified answer); otherwise
    ``weight * c / n``, where ``n`` is the length of the :func:`normalize_answer`-ed
    :func:`reference_text` of ``item["answer"]`` and ``c`` the length of the longest common
    prefix of it and the normalised prediction. A policy that never samples a verified
    answer still sees a spread of rewards within a group (GRPO learns nothing from a group
    of equal rewards), while only a verified answer earns more than ``weight``.

    Raises:
      ValueError: ``weight`` outside [0, 1).
    """
    if not (isinstance(weight, int | float) and 0 <= weight < 1):
        raise ValueError(f"prefix_credit: `weight` must lie in [0, 1); got {weight!r}")

    def reward_fn(prediction: str, item: Mapping) -> float:
        if verifier(prediction, item) == 1.0:
            return 1.0
        ref = normalize_answer(reference_text(item["answer"]))
        pred = normalize_answer(prediction)
        if not ref:
            return 0.0
        c = 0
        for a, b in zip(ref, pred):
            if a != b:
                break
            c += 1
        return weight * c / len(ref)

    return reward_fn
