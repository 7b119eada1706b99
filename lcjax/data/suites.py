"""Evaluation suites: named lists of task configurations over one generator.

A :class:`Suite` is what ``lcjax.eval.evaluate`` consumes::

    suite = get_suite("ruler")             # or "nolima"
    for t in suite.tasks:                  # SuiteTask(name, task, overrides, uses_depth)
        sample = suite.generate(t.task, seed, length, tokenizer=tok,
                                **({"depth": d} if t.uses_depth else {}), **t.overrides)
        sample.prompt, sample.answer, sample.references   # bytes (UTF-8 text)

``generate(task, seed, length, *, tokenizer=None, **overrides)`` is the generator module's
own (``lcjax.data.ruler.generate``, ``lcjax.data.nolima.generate``): ``length`` counts
tokens of ``tokenizer`` (bytes when None) and the result is a ``lcjax.data.ruler.Sample``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["Suite", "SuiteTask", "get_suite", "register_suite", "suites"]


@dataclasses.dataclass(frozen=True)
class SuiteTask:
    """One entry of a suite: the reported ``name``, the generator's ``task`` key, keyword
    ``overrides`` for it, and whether the task takes a needle ``depth``."""

    name: str
    task: str
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    uses_depth: bool = True

    def __post_init__(self):
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))


@dataclasses.dataclass(frozen=True)
class Suite:
    """A named list of :class:`SuiteTask` over one ``generate`` function."""

    name: str
    generate: Callable[..., Any]
    tasks: tuple[SuiteTask, ...]

    def task(self, name: str) -> SuiteTask:
        for t in self.tasks:
            if t.name == name:
                return t
        raise ValueError(f"suite {self.name!r}: unknown task {name!r}; "
                         f"known: {[t.name for t in self.tasks]}")


_SUITES: dict[str, Callable[[], Suite]] = {}


def register_suite(name: str, factory: Callable[[], Suite]) -> None:
    """Register a suite factory (called lazily by :func:`get_suite`)."""
    _SUITES[name] = factory


def get_suite(name: str) -> Suite:
    """The suite registered as ``name`` ("ruler", "nolima", ...)."""
    if name not in _SUITES:
        import lcjax.data.ruler  # noqa: F401  (modules register their suites at import)
        try:
            import lcjax.data.nolima  # noqa: F401
        except ImportError:
            pass
    try:
        return _SUITES[name]()
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; registered: {sorted(_SUITES)}") from None


def suites() -> list[str]:
    """Names of the registered suites."""
    return sorted(_SUITES)
