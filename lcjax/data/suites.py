"""Evaluation suites: named lists of task configurations over one generator.

A :class:`Suite` is what ``lcjax.eval.evaluate`` consumes::

    suite = get_suite("ruler")             # or "nolima", "mgal"
    for t in suite.tasks:                  # SuiteTask(name, task, overrides, uses_depth)
        sample = suite.generate(t.task, seed, length, tokenizer=tok,
                                **({"depth": d} if t.uses_depth else {}), **t.overrides)
        sample.prompt, sample.answer, sample.references   # bytes (UTF-8 text)

The built-in suites are listed once, in :data:`BUILTIN_SUITES` (name -> module, factory,
options); a suite's module is imported when the suite is first asked for, so neither import
order nor importing ``lcjax.data`` matters. :func:`register_suite` adds a user's suite.

``generate(task, seed, length, *, tokenizer=None, **overrides)`` is the generator module's
own (``lcjax.data.ruler.generate``, ``lcjax.data.nolima.generate``): ``length`` counts
tokens of ``tokenizer`` (bytes when None) and the result is a ``lcjax.data.ruler.Sample``.

**Per-suite hooks.** A suite may carry its own metrics and report, and declare options:

* ``Suite.score(sample, prediction) -> dict``: extra per-item scores; the evaluator stores
  them in each record as ``record["suite_metrics"]`` (an error scores the empty reply);
* ``Suite.report(records, out_dir) -> dict``: writes the suite's own tables / plots from
  the evaluator's records and returns a JSON-able summary (``lcjax eval`` prints it);
* ``register_suite(name, factory, options=(SuiteOption("--langs", ...),))``: keyword
  options of the factory, ``get_suite(name, langs=...)``; ``lcjax eval`` adds them as
  flags (:func:`suite_options`) and passes the given ones to the factory.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from lcjax.optional import require

__all__ = ["BUILTIN_SUITES", "BYTES", "Suite", "SuiteOption", "SuiteTask", "TokenCounter",
           "as_tokenizer",
           "get_suite", "register_suite", "suite_options", "suites"]


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
    """A named list of :class:`SuiteTask` over one ``generate`` function, with optional
    hooks ``score(sample, prediction) -> dict`` (extra per-record metrics) and
    ``report(records, out_dir) -> dict`` (the suite's own report; module docstring)."""

    name: str
    generate: Callable[..., Any]
    tasks: tuple[SuiteTask, ...]
    score: Callable[[Any, str], Mapping[str, Any]] | None = None
    report: Callable[[Any, str], Mapping[str, Any]] | None = None

    def task(self, name: str) -> SuiteTask:
        for t in self.tasks:
            if t.name == name:
                return t
        raise ValueError(f"suite {self.name!r}: unknown task {name!r}; "
                         f"known: {[t.name for t in self.tasks]}")


@dataclasses.dataclass(frozen=True)
class SuiteOption:
    """A keyword option of a suite factory, offered by ``lcjax eval`` as ``flag``
    (``"--langs"`` -> keyword ``langs``); ``type`` parses the flag's text."""

    flag: str
    help: str
    type: Callable[[str], Any] = str

    def __post_init__(self):
        if not self.flag.startswith("--") or len(self.flag) < 3:
            raise ValueError(f"SuiteOption: flag must look like '--name', got {self.flag!r}")

    @property
    def dest(self) -> str:
        """The factory keyword (and argparse ``dest``) of the flag."""
        return self.flag[2:].replace("-", "_")


def _lang_list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


# The built-in suites, the one place they are listed: name -> (module, factory, options).
# A factory's module is imported only when its suite is asked for (by name, so order never
# matters and importing this module loads no generator).
BUILTIN_SUITES: Mapping[str, tuple[str, str, tuple[SuiteOption, ...]]] = MappingProxyType({
    "ruler": ("lcjax.data.ruler", "suite", ()),
    "nolima": ("lcjax.data.nolima", "suite", ()),
    "mgal": ("lcjax.data.mgal_suite", "debian_suite", (
        SuiteOption("--langs", "mgal: comma list of languages (Debian codes; default all 11)",
                    _lang_list),)),
    "tablelong": ("lcjax.data.tablelong", "suite", ()),
    "temporal_order": ("lcjax.data.temporal_order", "suite", ()),
})

_SUITES: dict[str, tuple[Callable[..., Suite], tuple[SuiteOption, ...]]] = {}


def register_suite(name: str, factory: Callable[..., Suite],
                   options: Sequence[SuiteOption] = ()) -> None:
    """Register a suite factory (called lazily by :func:`get_suite`) and the keyword
    ``options`` it accepts (a user's suite; it takes precedence over a built-in of that
    name)."""
    _SUITES[name] = (factory, tuple(options))


def _entry(name: str):
    if name in _SUITES:
        return _SUITES[name]
    if name in BUILTIN_SUITES:
        module, factory, options = BUILTIN_SUITES[name]
        return getattr(importlib.import_module(module), factory), options
    raise ValueError(f"unknown suite {name!r}; registered: {suites()}")


def get_suite(name: str, **options: Any) -> Suite:
    """The suite registered as ``name`` ("ruler", "nolima", ...), its factory called with
    ``options`` (each one of its :func:`suite_options`)."""
    factory, declared = _entry(name)
    known = {o.dest for o in declared}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"suite {name!r} takes no option {unknown}; it takes "
                         f"{sorted(known) or 'none'}")
    return factory(**options)


def suite_options(name: str | None = None) -> tuple[SuiteOption, ...]:
    """The options suite ``name`` declares; with None, every suite's (built-in and
    registered), each flag once."""
    if name is not None:
        return _entry(name)[1]
    seen: dict[str, SuiteOption] = {}
    for _, _, opts in BUILTIN_SUITES.values():
        for o in opts:
            seen.setdefault(o.flag, o)
    for _, opts in _SUITES.values():
        for o in opts:
            seen.setdefault(o.flag, o)
    return tuple(seen.values())


def suites() -> list[str]:
    """Names of the suites: the built-in ones and those registered."""
    return sorted(set(BUILTIN_SUITES) | set(_SUITES))


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


def load_tokenizer_file(path: str | os.PathLike) -> Any:
    """The ``tokenizers.Tokenizer`` of a Hugging Face ``tokenizer.json`` file.

    Raises:
      ValueError: the file is missing or does not load (naming it; the ``tokenizers``
        package itself says only "No such file or directory").
    """
    with require("data", "lcjax.data.suites"):
        import tokenizers

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"tokenizer file {path!r} does not exist (expected a Hugging Face "
                         "tokenizer.json)")
    try:
        return tokenizers.Tokenizer.from_file(path)
    except Exception as exc:  # the package raises a bare Exception
        raise ValueError(f"tokenizer file {path!r} does not load: {exc}") from exc


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
