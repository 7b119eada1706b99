"""The items of an evaluation: one task sample per (task, length, depth, index).

:func:`build_items` draws them from a :class:`lcjax.data.suites.Suite`. Item i of a cell
uses the seed sequence ``[seed, crc32(task name), length, round(1000 * depth), i]``, so an
item does not depend on which other tasks, lengths, depths or counts are evaluated: a run
with more lengths or a larger ``n_per_cell`` contains the items of the smaller one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from lcjax.data.suites import Suite, SuiteTask, get_suite

__all__ = [
    "DEFAULT_DEPTHS",
    "EvalItem",
    "build_items",
    "item_key",
    "parse_depths",
    "parse_lengths",
    "resolve_suite",
]

DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclasses.dataclass(frozen=True)
class EvalItem:
    """One prompt to answer.

    Attributes:
      task: the suite task's reported name.
      length: the requested length (tokens of the tokenizer; bytes when it is None).
      depth: the requested needle depth, or None for a task without depth.
      index: the item's number within its (task, length, depth) cell.
      prompt: the prompt bytes (UTF-8 text).
      answer: the reference answer bytes.
      references: what :func:`lcjax.data.ruler.string_match_all` / ``_part`` look for.
      sample: the generator's full sample (``lcjax.data.ruler.Sample``).
    """

    task: str
    length: int
    depth: float | None
    index: int
    prompt: bytes
    answer: bytes
    references: tuple[bytes, ...]
    sample: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def key(self) -> tuple:
        """``(task, length, depth, index)``, the item's identity in a results file."""
        return item_key(self.task, self.length, self.depth, self.index)

    @property
    def prompt_sha(self) -> str:
        """SHA-256 (first 16 hex digits) of the prompt: a resumed run checks it."""
        return hashlib.sha256(self.prompt).hexdigest()[:16]


def item_key(task: str, length: int, depth: float | None, index: int) -> tuple:
    """The key of an item (depth rounded to 6 decimals so JSON round trips compare equal)."""
    return (str(task), int(length), None if depth is None else round(float(depth), 6),
            int(index))


def resolve_suite(suite: str | Suite) -> Suite:
    """A :class:`Suite` from a registered name or the suite itself."""
    if isinstance(suite, Suite):
        return suite
    if isinstance(suite, str):
        return get_suite(suite)
    raise ValueError(f"`suite` must be a registered suite name or a Suite, got {suite!r}")


def _item_seed(seed: int, task: str, length: int, depth: float | None, index: int):
    d = -1 if depth is None else int(round(1000 * depth))
    return np.random.default_rng([int(seed), zlib.crc32(task.encode()), int(length), d + 1,
                                  int(index)])


def _sample(suite: Suite, t: SuiteTask, seed, length: int, depth, tokenizer):
    kwargs = dict(t.overrides)
    if t.uses_depth:
        kwargs["depth"] = depth
    if tokenizer is not None:
        kwargs["tokenizer"] = tokenizer
    return suite.generate(t.task, seed, length, **kwargs)


def _check_cells(lengths, depths, n_per_cell):
    if not lengths or any(not isinstance(n, int | np.integer) or n <= 0 for n in lengths):
        raise ValueError(f"`lengths` must be a non-empty sequence of positive ints, got "
                         f"{lengths!r}")
    if not depths or any(not 0.0 <= float(d) <= 1.0 for d in depths):
        raise ValueError(f"`depths` must be a non-empty sequence of numbers in [0, 1], got "
                         f"{depths!r}")
    if not isinstance(n_per_cell, int | np.integer) or n_per_cell < 1:
        raise ValueError(f"`n_per_cell` must be an int >= 1, got {n_per_cell!r}")


def build_items(suite: str | Suite, lengths: Sequence[int],
                depths: Sequence[float] = DEFAULT_DEPTHS, n_per_cell: int = 4, seed: int = 0,
                *, tasks: Sequence[str] | None = None, tokenizer: Any = None,
                skipped: list[str] | None = None) -> list[EvalItem]:
    """Every item of ``suite`` for ``tasks`` (default: all) x ``lengths`` x ``depths``
    (one depth, None, for a task without depth) x ``n_per_cell``, in that order.

    ``tokenizer`` is passed to the suite's generator (``length`` then counts its tokens);
    with None it is not passed, and lengths count bytes. ``skipped``: a list; a (task,
    length) the task cannot reach (its generator's "too short" ``ValueError``) is then
    left out and noted there, instead of raising.
    """
    suite = resolve_suite(suite)
    _check_cells(lengths, depths, n_per_cell)
    chosen = suite.tasks if tasks is None else tuple(suite.task(name) for name in tasks)
    items = []
    for t in chosen:
        for length in lengths:
            try:
                items.extend(_cell_items(suite, t, length, depths, n_per_cell, seed, tokenizer))
            except ValueError as e:
                if skipped is None or "too short" not in str(e):
                    raise
                skipped.append(f"task {t.name!r} at length {length}: {e}")
    return items


def _cell_items(suite, t, length, depths, n_per_cell, seed, tokenizer) -> list[EvalItem]:
    out = []
    for depth in (depths if t.uses_depth else (None,)):
        depth = None if depth is None else float(depth)
        for i in range(n_per_cell):
            s = _sample(suite, t, _item_seed(seed, t.name, length, depth, i), length, depth,
                        tokenizer)
            out.append(EvalItem(t.name, int(length), depth, i, bytes(s.prompt),
                                bytes(s.answer), tuple(bytes(r) for r in s.references), s))
    return out


_LENGTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_lengths(text: str) -> tuple[int, ...]:
    """``"1k,2k,4k"`` -> ``(1024, 2048, 4096)`` (k = 1024, m = 1024**2; plain ints too)."""
    out = []
    for part in str(text).split(","):
        if not part.strip():
            continue
        m = _LENGTH.match(part)
        if not m:
            raise ValueError(f"`lengths`: cannot read {part!r} (use e.g. 512,1k,2k)")
        value = float(m.group(1)) * {"": 1, "k": 1024, "m": 1024**2}[m.group(2).lower()]
        if value != int(value) or value <= 0:
            raise ValueError(f"`lengths`: {part!r} is not a positive whole number of tokens")
        out.append(int(value))
    if not out:
        raise ValueError(f"`lengths`: no length in {text!r}")
    return tuple(out)


def parse_depths(text: str) -> tuple[float, ...]:
    """``"0,0.5,1"`` -> ``(0.0, 0.5, 1.0)``; each must lie in [0, 1]."""
    try:
        out = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise ValueError(f"`depths`: cannot read {text!r} (use e.g. 0,0.5,1)") from None
    if not out or any(not 0.0 <= d <= 1.0 for d in out):
        raise ValueError(f"`depths`: need numbers in [0, 1], got {text!r}")
    return out
