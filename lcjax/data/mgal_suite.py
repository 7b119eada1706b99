"""The MGAL evaluator suite: :func:`make_suite` over any
:class:`~lcjax.data.parallel.ParallelCorpus` (items from :func:`lcjax.data.mgal.sample`, metrics
from :mod:`lcjax.data.mgal_metrics`) and the built-in suite ``"mgal"`` (:func:`debian_suite`,
listed in :data:`lcjax.data.suites.BUILTIN_SUITES`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from lcjax.data import mgal, mgal_metrics, parallel
from lcjax.data.parallel import ParallelCorpus
from lcjax.data.suites import Suite, SuiteTask

__all__ = ["debian_suite", "make_suite", "report_records", "score_sample"]


def score_sample(sample, prediction: str) -> dict:
    """The suite's ``score`` hook: :func:`lcjax.data.mgal_metrics.score_item` of the sample's
    :class:`MgalItem` (``sample.info["item"]``) and the reply."""
    return mgal_metrics.score_item(sample.info["item"], prediction)


def report_records(records, out_dir: str) -> dict:
    """The suite's ``report`` hook: :func:`lcjax.data.mgal_metrics.write_report`."""
    return mgal_metrics.write_report(records, out_dir)


def make_suite(corpus: ParallelCorpus, *, langs: Sequence[str] | None = None,
               name: str = "mgal") -> Suite:
    """An evaluator :class:`~lcjax.data.suites.Suite` over ``corpus``: one task
    ``"<lang>/<granularity>"`` per language of ``langs`` (default: all of the corpus) and
    granularity, depth = position; its ``score`` / ``report`` hooks are MGAL's metrics
    (:func:`score_sample`, :func:`report_records`)."""
    langs = tuple(corpus.langs if langs is None else langs)
    bad = [lang for lang in langs if lang not in corpus.langs]
    if bad or not langs:
        raise ValueError(f"mgal suite: langs {list(langs)} must be a non-empty subset of the "
                         f"corpus languages {list(corpus.langs)}")
    cache: dict = {}

    def generate_sample(task, seed, length, *, depth=0.5, tokenizer=None):
        return mgal.sample(corpus, task, seed, length, depth=depth, tokenizer=tokenizer,
                           cache=cache)

    tasks = tuple(SuiteTask(f"{lang}/{g}", f"{lang}/{g}") for lang in langs
                  for g in mgal.GRANULARITIES)
    return Suite(name, generate_sample, tasks, score=score_sample, report=report_records)


@functools.lru_cache(maxsize=1)
def _debian_corpus() -> ParallelCorpus:
    return parallel.load_debian_reference(parallel.DEBIAN_LANGS)


def debian_suite(langs: Sequence[str] | None = None) -> Suite:
    """Suite ``"mgal"``: Debian Reference, all 11 languages aligned together (so an item does
    not depend on which languages a run asks for); ``langs`` keeps those languages' tasks."""
    return make_suite(_debian_corpus(), langs=langs)
