"""TableLong items: a database serialised to a target length, a question, and an answer
that Python and SQLite agree on.

Item ``index`` of seed ``seed`` is drawn from ``np.random.default_rng([seed, index])`` only,
so a set of items does not depend on how many processes made it. An item is a JSON object::

    {"id", "seed", "index", "task", "language", "format", "domain",
     "tables": {name: {"columns": [...], "types": [...], "rows": [[...], ...]}},
     "context", "question", "answer", "sql", "ordered", "decimals", "difficulty",
     "length", "target_length", "tokenizer"}

``types`` are from {"text", "integer", "real", "date", "id"}, declared in SQLite as TEXT /
INTEGER / REAL / TEXT (ISO dates) / INTEGER. ``answer`` is a scalar, or a list when the SQL
returns several rows (``ordered`` when the SQL has ORDER BY). A sum or mean of reals
(``decimals`` = 2) is compared between Python and SQLite to 1e-9 relative and written
rounded to 2 decimals. ``length`` counts the tokens of ``context`` (UTF-8 bytes by default).

An item whose Python answer and SQLite answer (:func:`sql_answer` on ``sql``) differ is
never emitted: it is counted in ``stats["bugs"]`` and another question is drawn.
"""

from __future__ import annotations

import collections
import json
import math
import sqlite3
from collections.abc import Sequence
from typing import Any

import numpy as np

from lcjax.data.suites import as_tokenizer
from lcjax.data.tablelong import vocab
from lcjax.data.tablelong.formats import FORMATS, render_cells, serialize
from lcjax.data.tablelong.questions import TASKS, NoQuestion, make_question, quote_ident
from lcjax.data.tablelong.schema import DOMAINS, SQL_TYPES, Database, make_database, resize_leaf

__all__ = ["answer_strings", "answers_agree", "generate_item", "item_prompt", "load_sqlite",
           "make_item", "sql_answer", "verify_item"]

_MAX_ATTEMPTS = 30
_REJECTED = object()


# --- SQLite -------------------------------------------------------------------------------

def load_sqlite(tables: dict[str, dict]) -> sqlite3.Connection:
    """An in-memory SQLite database holding ``tables`` with their declared column types."""
    con = sqlite3.connect(":memory:")
    for name, t in tables.items():
        cols = ", ".join(f"{quote_ident(c)} {SQL_TYPES[ty]}"
                         for c, ty in zip(t["columns"], t["types"], strict=True))
        con.execute(f"CREATE TABLE {quote_ident(name)} ({cols})")
        marks = ", ".join("?" * len(t["columns"]))
        con.executemany(f"INSERT INTO {quote_ident(name)} VALUES ({marks})", t["rows"])
    return con


def _shape(values: list):
    """One value -> the value; several -> the list."""
    return values[0] if len(values) == 1 else list(values)


def sql_answer(tables: dict[str, dict], sql: str, con: sqlite3.Connection | None = None):
    """The answer SQLite gives to ``sql`` over ``tables`` (first column of each result row;
    one row -> a scalar)."""
    own = con is None
    con = load_sqlite(tables) if own else con
    try:
        rows = con.execute(sql).fetchall()
    finally:
        if own:
            con.close()
    return _shape([r[0] for r in rows])


def answers_agree(a, b, *, ordered: bool = False, real: bool = False) -> bool:
    """Whether two answers are the same: reals to 1e-9 relative when ``real``, lists in order
    when ``ordered``, else as multisets."""
    if isinstance(a, list) != isinstance(b, list):
        return False
    if isinstance(a, list):
        if len(a) != len(b):
            return False
        return a == b if ordered else collections.Counter(a) == collections.Counter(b)
    if a is None or b is None:
        return a is b
    if real:
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


# --- length control -----------------------------------------------------------------------

def _sizes(n_tables: int, rows: float) -> list[int]:
    rows = max(rows, 4.0)
    parent = int(np.clip(round(0.05 * rows), 2, 60))
    if n_tables == 2:
        return [parent, max(2, int(rows - parent))]
    middle = int(np.clip(round(0.25 * rows), 3, 2000))
    return [parent, middle, max(2, int(rows - parent - middle))]


def _fit_leaf(db: Database, fmt: str, count, target: int) -> tuple[Database, str, int] | None:
    """The database with the most leaf rows whose context has at most ``target`` tokens,
    with that context and its token count; None if one leaf row is already too many.

    The count grows with the leaf prefix, nearly linearly: a bracketed search that steps to
    the linear interpolation of the bracket (bisection when that does not shrink it)."""
    cells = {} if fmt == "json" else {name: render_cells(t, fmt) for name, t in db.tables.items()}

    texts = {}

    def size(n):
        texts[n] = serialize(resize_leaf(db, n).tables, fmt, cells)
        return count(texts[n])

    lo, hi = 1, len(db.rows(len(db.specs) - 1))
    c_lo, c_hi = size(lo), size(hi)
    if c_lo > target:
        return None
    if c_hi <= target:
        return resize_leaf(db, hi), texts[hi], c_hi
    while hi - lo > 1:  # invariant: size(lo) <= target < size(hi)
        guess = lo + int((target - c_lo) / max(c_hi - c_lo, 1) * (hi - lo))
        mid = min(max(guess, lo + 1), hi - 1)
        if mid in (lo + 1, hi - 1) and hi - lo > 4:
            mid = (lo + hi) // 2 if guess <= lo or guess >= hi else mid
        c = size(mid)
        if c <= target:
            lo, c_lo = mid, c
        else:
            hi, c_hi = mid, c
    return resize_leaf(db, lo), texts[lo], c_lo


def _database(rng, language: str, fmt: str, count, min_len: int, max_len: int):
    """A database whose context has between ``min_len`` and ``max_len`` tokens, aiming at a
    target uniform over ``[max(min_len, smallest database), max_len]``; None when the range
    cannot be met."""
    domain = sorted(DOMAINS)[int(rng.integers(len(DOMAINS)))]
    n_tables = int(rng.integers(2, len(DOMAINS[domain]) + 1))
    u = rng.random()
    pilot = make_database(rng, language, [2] * (n_tables - 1) + [8], domain)
    while True:
        full = count(serialize(pilot.tables, fmt))
        one = count(serialize(resize_leaf(pilot, 1).tables, fmt))   # the smallest database
        if one <= max_len:
            break
        if n_tables == 2:
            return None
        n_tables = 2
        pilot = Database(pilot.domain, language, pilot.specs[:2],
                         {s.name: pilot.tables[s.name] for s in pilot.specs[:2]})
    low = max(min_len, one)                  # the target is uniform over what can be met
    target = low + int(u * (max_len - low + 1))
    per_row = max((full - one) / 7, 1.0)
    rows = target / per_row
    for _ in range(6):
        sizes = _sizes(n_tables, rows)
        sizes[-1] = int(1.2 * sizes[-1]) + 4
        db = make_database(rng, language, sizes, domain, specs=pilot.specs)
        fit = _fit_leaf(db, fmt, count, target)
        if fit is None:          # the parents alone are too long: fewer rows, fewer tables
            if sizes[:-1] == _sizes(n_tables, 0)[:-1]:
                if n_tables == 2:
                    return None
                n_tables -= 1
                pilot = Database(pilot.domain, language, pilot.specs[:2],
                                 {s.name: pilot.tables[s.name] for s in pilot.specs[:2]})
            rows *= 0.5
            continue
        db, context, length = fit
        if length >= min_len:
            return db, context, length, target
        if len(db.rows(n_tables - 1)) < sizes[-1]:
            return None          # one more leaf row jumps past the target
        rows *= 1.5 * target / max(length, 1)
    return None


# --- items --------------------------------------------------------------------------------

def _python_answer(q) -> Any:
    return _shape(q.answer) if isinstance(q.answer, list) else q.answer


def check_item_args(*, min_len: int, max_len: int, tasks: Sequence[str] = TASKS,
                    languages: Sequence[str] = vocab.LANGUAGES,
                    formats: Sequence[str] = FORMATS) -> None:
    """Raises ValueError for arguments :func:`make_item` cannot use: not
    ``0 < min_len <= max_len``, or an unknown or empty task / language / format list."""
    if not 0 < min_len <= max_len:
        raise ValueError(f"tablelong: need 0 < min_len <= max_len, got {min_len}, {max_len}")
    for name, got, known in (("task", tasks, TASKS), ("language", languages, vocab.LANGUAGES),
                             ("format", formats, FORMATS)):
        bad = [g for g in got if g not in known]
        if bad or not got:
            raise ValueError(f"tablelong: unknown or no {name}s {bad or got}; known: {known}")


def make_item(rng: np.random.Generator, *, min_len: int, max_len: int, tokenizer: Any = None,
              tasks: Sequence[str] = TASKS, languages: Sequence[str] = vocab.LANGUAGES,
              formats: Sequence[str] = FORMATS, task: str | None = None,
              stats: collections.Counter | None = None) -> dict:
    """One item drawn from ``rng`` (see the module docstring); ``stats`` counts ``bugs``
    (Python and SQLite disagreed), ``redraws`` (no answer) and ``length_misses``."""
    check_item_args(min_len=min_len, max_len=max_len, tasks=tasks, languages=languages,
                    formats=formats)
    stats = collections.Counter() if stats is None else stats
    counter = as_tokenizer(tokenizer)
    task = task or tasks[int(rng.integers(len(tasks)))]
    language = languages[int(rng.integers(len(languages)))]
    fmt = formats[int(rng.integers(len(formats)))]
    for _ in range(_MAX_ATTEMPTS):
        made = _database(rng, language, fmt, counter.count, min_len, max_len)
        if made is None:
            stats["length_misses"] += 1
            continue
        db, context, length, target = made
        con = load_sqlite(db.tables)
        try:
            for _ in range(_MAX_ATTEMPTS):
                try:
                    q = make_question(rng, db, task)
                except NoQuestion:
                    stats["redraws"] += 1
                    continue
                py = _python_answer(q)
                try:
                    got = sql_answer(db.tables, q.sql, con)
                except sqlite3.Error:   # SQL the engine rejects is a bug like a wrong answer
                    got = _REJECTED
                if got is _REJECTED or not answers_agree(py, got, ordered=q.ordered,
                                                         real=q.real):
                    stats["bugs"] += 1
                    continue
                answer = round(py, q.decimals) if q.decimals is not None else py
                return {"task": task, "language": language, "format": fmt,
                        "domain": db.domain, "tables": db.tables,
                        "context": context, "question": q.text,
                        "answer": answer, "sql": q.sql,
                        "ordered": q.ordered and isinstance(answer, list),
                        "decimals": q.decimals, "difficulty": q.difficulty,
                        "length": length, "target_length": target,
                        "tokenizer": counter.name}
        finally:
            con.close()
    raise RuntimeError(f"tablelong: no {task!r} item in [{min_len}, {max_len}] tokens after "
                       f"{_MAX_ATTEMPTS} databases")


def generate_item(seed: int, index: int, *, min_len: int, max_len: int, tokenizer: Any = None,
                  stats: collections.Counter | None = None, **kwargs) -> dict:
    """Item ``index`` of ``seed``: :func:`make_item` on ``default_rng([seed, index])``, with
    ``id``, ``seed`` and ``index`` added."""
    rng = np.random.default_rng([int(seed), int(index)])
    item = make_item(rng, min_len=min_len, max_len=max_len, tokenizer=tokenizer, stats=stats,
                     **kwargs)
    return {"id": f"{seed}-{index}", "seed": int(seed), "index": int(index), **item}


def verify_item(item: dict) -> bool:
    """Re-checks an item from its JSON alone: SQLite on ``tables`` and ``sql`` gives
    ``answer`` (after the item's rounding)."""
    got = sql_answer(item["tables"], item["sql"])
    if item.get("decimals") is not None:
        if got is None or isinstance(got, list):
            return False
        return abs(got - item["answer"]) <= 0.5 * 10 ** -item["decimals"] + 1e-9
    return answers_agree(item["answer"], got, ordered=item["ordered"])


# --- prompts ------------------------------------------------------------------------------

def answer_strings(item: dict) -> list[str]:
    """The answer's values as written (reals with ``repr``): the evaluator's references."""
    values = item["answer"] if isinstance(item["answer"], list) else [item["answer"]]
    return [repr(v) if isinstance(v, float) else str(v) for v in values]


def item_prompt(item: dict) -> str:
    """The model prompt: instruction, context, question, and the answer cue."""
    lang = item["language"]
    return (f"{vocab.template('instruction', lang)}\n\n{item['context']}\n\n"
            f"{vocab.template('question', lang)}: {item['question']}\n"
            f"{vocab.template('answer', lang)}: ")


def dumps(item: dict) -> str:
    """One JSONL line of an item."""
    return json.dumps(item, ensure_ascii=False)
