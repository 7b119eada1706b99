"""TableLong: verifiable multilingual table data for long-context reasoning (``docs/
tablelong.md``), after the TableLong recipe (row-major tables carry periodic long-range
mutual information; questions whose answers a program computes give exact-match rewards).

Typed multi-table databases with keys (:mod:`.schema`, values from ``faker`` in six locales),
serialised as markdown / CSV / JSON / HTML and parsed back (:mod:`.formats`), questions from
lookups to multi-hop chains (:mod:`.questions`) whose answers Python and SQLite must agree on
(:mod:`.items`), JSONL shards and grain sources (:mod:`.shards`), and the ``"tablelong"``
evaluation suite (one task per question type, for ``lcjax.eval``)::

    item = generate_item(seed=0, index=7, min_len=4096, max_len=8192)
    item["context"], item["question"], item["answer"], item["sql"]
    write_shards("data/tl", 10_000, min_len=4096, max_len=32768, workers=2)
    build_items("tablelong", lengths=[2048])          # lcjax.data.items
"""

from __future__ import annotations

import collections

import numpy as np

from lcjax.data.ruler import Sample
from lcjax.data.suites import Suite, SuiteTask, as_tokenizer
from lcjax.data.tablelong.formats import FORMATS, parse_context, serialize
from lcjax.data.tablelong.items import (
    answer_strings,
    answers_agree,
    generate_item,
    item_prompt,
    load_sqlite,
    make_item,
    sql_answer,
    verify_item,
)
from lcjax.data.tablelong.questions import TASKS
from lcjax.data.tablelong.schema import DOMAINS, SQL_TYPES, TYPES
from lcjax.data.tablelong.shards import ShardSource, TableLongSource, write_shards
from lcjax.data.tablelong.vocab import LANGUAGES, LOCALES

__all__ = ["DOMAINS", "FORMATS", "LANGUAGES", "LOCALES", "SQL_TYPES", "SUITE", "TASKS", "TYPES",
           "ShardSource", "TableLongSource", "answer_strings", "answers_agree", "generate",
           "generate_item", "item_prompt", "item_sample", "load_sqlite", "make_item",
           "parse_context", "serialize", "sql_answer", "suite", "verify_item", "write_shards"]


def item_sample(item: dict, tokenizer=None) -> Sample:
    """The item as a ``lcjax.data.ruler.Sample`` (prompt, answer, references) for the
    evaluator; ``info`` holds the item without its context."""
    count = as_tokenizer(tokenizer).count
    prompt = item_prompt(item)
    refs = answer_strings(item)
    answer = ", ".join(refs)
    info = {k: v for k, v in item.items() if k != "context"}
    return Sample(prompt.encode(), answer.encode(), tuple(r.encode() for r in refs), "tablelong",
                  count(prompt) + count(answer), len(item["context"].encode()), (), (), (), 0,
                  info, as_tokenizer(tokenizer).name, item["question"].encode())


SUITE: tuple[SuiteTask, ...] = tuple(SuiteTask(f"tablelong_{t}", t, uses_depth=False)
                                     for t in TASKS)


_OVERHEAD = 600  # tokens left for the instruction, the question and the answer


def generate(task: str, seed, length: int, *, tokenizer=None, **overrides) -> Sample:
    """One suite sample of question type ``task`` (or ``"tablelong_<task>"``) with a prompt of
    at most about ``length`` tokens: the context gets ``length`` minus the prompt's other
    parts, at least 3/4 of that budget."""
    task = task.removeprefix("tablelong_")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    budget = length - _OVERHEAD
    if budget < 64:
        raise ValueError(f"tablelong: length {length} leaves no room for a table "
                         f"(need >= {_OVERHEAD + 64})")
    stats = collections.Counter()
    item = make_item(rng, min_len=max(1, 3 * budget // 4), max_len=budget, tokenizer=tokenizer,
                     task=task, stats=stats, **overrides)
    return item_sample(item, tokenizer)


def suite() -> Suite:
    """The TableLong suite (built-in ``"tablelong"``, :data:`lcjax.data.suites.BUILTIN_SUITES`):
    one task per question type."""
    return Suite("tablelong", generate, SUITE)
