"""Evaluation suites: named lists of task configurations over one generator.

A :class:`Suite` is what ``lcjax.eval.evaluate`` consumes::

    suite = get_suite("ruler")             # or "nolima", "mgal"
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

__all__ = ["BYTES", "Suite", "SuiteTask", "TokenCounter", "as_tokenizer", "get_suite",
           "register_suite", "suites"]


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
        import lcjax.data.mgal  # noqa: F401  (suite "mgal": Debian Reference, loaded lazily)
    try:
        return _SUITES[name]()
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; registered: {sorted(_SUITES)}") from None


def suites() -> list[str]:
    """Names of the registered suites."""
    return sorted(_SUITES)


# --- tokenizers: what ``length`` counts ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TokenCounter:
    """How a suite counts tokens: ``encode(str) -> ids`` and a ``name`` for reports.

    Build one with :func:`as_tokenizer`; ``count(text)`` is ``len(encode(text))``.
    """

    name: str
    encode: Callable[[str], Any]

    def count(self, text: str) -> int:
        """Number of tokens of ``text``."""
        return len(self.encode(text))


def _utf8(text: str) -> bytes:
    return text.encode("utf-8")


BYTES = TokenCounter("bytes", _utf8)


def as_tokenizer(spec: Any = None) -> TokenCounter:
    """The :class:`TokenCounter` of a tokenizer spec.

    ``spec`` is None (UTF-8 bytes, lcjax's byte tokenizer without specials), a
    :class:`TokenCounter`, a Hugging Face ``tokenizers.Tokenizer`` (counted as
    ``len(tok.encode(s, add_special_tokens=False).ids)``) or any callable
    ``encode(str) -> sequence of ids`` (named after its ``name`` or ``__name__``).
    """
    if spec is None:
        return BYTES
    if isinstance(spec, TokenCounter):
        return spec
    if hasattr(spec, "encode") and hasattr(spec, "get_vocab_size"):  # tokenizers.Tokenizer
        model = type(getattr(spec, "model", spec)).__name__.lower()

        def encode(text: str, _tok=spec):
            return _tok.encode(text, add_special_tokens=False).ids

        return TokenCounter(f"hf-{model}-{spec.get_vocab_size()}", encode)
    if callable(spec):
        name = getattr(spec, "name", None) or getattr(spec, "__name__", type(spec).__name__)
        return TokenCounter(str(name), spec)
    raise ValueError(f"tokenizer: expected None, a callable encode(str) -> ids or a "
                     f"tokenizers.Tokenizer; got {type(spec).__name__}")
