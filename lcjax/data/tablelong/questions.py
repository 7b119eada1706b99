"""TableLong questions of graded difficulty, each with its SQL and a Python answer.

Tasks (:data:`TASKS`, roughly easiest first):

- ``lookup``: the value of a column in the row with a given key.
- ``count``: how many rows satisfy one or two conditions (``=`` on text, ``>``/``<`` on
  numbers and dates).
- ``aggregate``: sum / mean / max / min of a numeric column, optionally filtered.
- ``argmax``: the label of the row(s) with the highest / lowest value (all ties).
- ``topk``: the labels of the k rows with the highest / lowest value, ordered, ties by key.
- ``join``: count / sum / mean / max of a child column over the rows whose foreign key
  points at a parent row satisfying a condition.
- ``multi_hop``: take the child row with the highest / lowest value, follow foreign keys up
  one or two tables, read a column there.

The Python answer is computed on the rows directly (no SQL); :func:`lcjax.data.tablelong.
items.sql_answer` executes the SQL in SQLite, and an item is emitted only when both agree.
"""

from __future__ import annotations

import dataclasses
import operator

import numpy as np

from lcjax.data.tablelong import vocab
from lcjax.data.tablelong.schema import Database, TableSpec

__all__ = ["TASKS", "Question", "make_question", "quote_ident", "sql_literal"]

TASKS = ("lookup", "count", "aggregate", "argmax", "topk", "join", "multi_hop")

_OPS = {"=": operator.eq, ">": operator.gt, "<": operator.lt}
_NUMERIC = ("integer", "real")


class NoQuestion(Exception):
    """The drawn question has no well-defined answer (an empty set): draw another."""


@dataclasses.dataclass(frozen=True)
class Question:
    """A question: its text, its SQL, the Python answer, and how to compare answers.

    ``answer`` is a scalar or a list; ``ordered``: the list's order matters (the SQL has
    ORDER BY); ``real``: the answer is a REAL computed by arithmetic (sum / mean), compared
    to 1e-9 relative and written rounded to ``decimals``. ``difficulty``: 1 (lookup) to 6 (a
    two-hop chain), one more per condition or hop."""

    task: str
    text: str
    sql: str
    answer: object
    ordered: bool = False
    real: bool = False
    decimals: int | None = None
    difficulty: int = 1


def quote_ident(name: str) -> str:
    """An SQL identifier in double quotes."""
    return '"' + name.replace('"', '""') + '"'


def sql_literal(value) -> str:
    """An SQL literal: a quoted string or a number."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value) if isinstance(value, float) else str(int(value))


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _label(spec: TableSpec) -> int:
    """The column naming a row: its first required text column, else the key."""
    for i, c in enumerate(spec.columns):
        if c.type == "text" and c.required:
            return i
    return 0


def _cols(spec: TableSpec, types) -> list[int]:
    return [i for i, c in enumerate(spec.columns) if c.type in types and i > 0
            and not c.kind.startswith("fk:")]


# --- conditions ---------------------------------------------------------------------------

def _condition(rng, spec: TableSpec, rows, n: int) -> list[tuple[int, str, object]]:
    """1 or ``n`` conditions ``(column, op, value)`` with values taken from random rows."""
    cands = _cols(spec, ("text", "integer", "real", "date"))
    k = min(len(cands), int(rng.integers(1, n + 1)))
    chosen = rng.choice(len(cands), size=k, replace=False)
    out = []
    for j in sorted(chosen.tolist()):
        col = cands[j]
        value = rows[int(rng.integers(len(rows)))][col]
        op = "=" if spec.columns[col].type == "text" else _pick(rng, (">", "<"))
        out.append((col, op, value))
    return out


def _holds(row, conds) -> bool:
    return all(_OPS[op](row[c], v) for c, op, v in conds)


def _cond_text(spec: TableSpec, conds, lang: str) -> str:
    parts = [f"{spec.headers[c]} {op} {_shown(v)}" for c, op, v in conds]
    return f" {vocab.word('and', lang)} ".join(parts)


def _shown(value) -> str:
    return f'"{value}"' if isinstance(value, str) else (repr(value) if isinstance(value, float)
                                                          else str(value))


def _cond_sql(conds, spec: TableSpec, alias: str = "") -> str:
    pre = f"{alias}." if alias else ""
    return " AND ".join(f"{pre}{quote_ident(spec.headers[c])} {op} {sql_literal(v)}"
                        for c, op, v in conds)


def _where(conds, spec, alias="") -> str:
    return f" WHERE {_cond_sql(conds, spec, alias)}" if conds else ""


# --- aggregates ---------------------------------------------------------------------------

def _aggregate(values: list, agg: str):
    if not values:
        raise NoQuestion("empty set")
    if agg == "COUNT":
        return len(values)
    if agg == "SUM":
        return sum(values)
    if agg == "AVG":
        return sum(values) / len(values)
    return max(values) if agg == "MAX" else min(values)


_AGG_WORD = {"SUM": "agg_sum", "AVG": "agg_mean", "MAX": "agg_max", "MIN": "agg_min",
             "COUNT": "agg_count"}


def _agg_answer(task, text, sql, values, agg, col_type, difficulty):
    answer = _aggregate(values, agg)
    real = col_type == "real" and agg in ("SUM", "AVG") or agg == "AVG"
    decimals = 2 if real else None
    return Question(task, text, sql, answer, real=real, decimals=decimals,
                    difficulty=difficulty)


def _rounded_note(agg, lang):
    return vocab.template("rounded", lang) if agg in ("SUM", "AVG") else ""


# --- tasks --------------------------------------------------------------------------------

def _table(rng, db: Database, types=None) -> int:
    """One of the last two tables (the large ones) that has a column of ``types``."""
    last = len(db.specs) - 1
    cands = [t for t in (last, last - 1) if t >= 0 and (types is None or _cols(db.specs[t], types))]
    if not cands:
        raise NoQuestion(f"no table with a column of {types}")
    return cands[int(rng.integers(len(cands)))]


def _lookup(rng, db: Database, lang):
    t = int(rng.integers(len(db.specs)))
    spec, rows = db.specs[t], db.rows(t)
    row = _pick(rng, rows)
    col = int(rng.integers(1, len(spec.columns)))
    text = vocab.template("lookup", lang).format(table=spec.name, col=spec.headers[col],
                                                 key=spec.headers[0], val=row[0])
    sql = (f"SELECT {quote_ident(spec.headers[col])} FROM {quote_ident(spec.name)} "
           f"WHERE {quote_ident(spec.headers[0])} = {row[0]}")
    answer = [r[col] for r in rows if r[0] == row[0]]
    return Question("lookup", text, sql, answer[0] if len(answer) == 1 else answer)


def _count(rng, db: Database, lang):
    t = _table(rng, db)
    spec, rows = db.specs[t], db.rows(t)
    conds = _condition(rng, spec, rows, 2)
    text = vocab.template("count", lang).format(table=spec.name,
                                                cond=_cond_text(spec, conds, lang))
    sql = f"SELECT COUNT(*) FROM {quote_ident(spec.name)}{_where(conds, spec)}"
    return Question("count", text, sql, sum(_holds(r, conds) for r in rows),
                    difficulty=1 + len(conds))


def _aggregate_q(rng, db: Database, lang):
    t = _table(rng, db, _NUMERIC)
    spec, rows = db.specs[t], db.rows(t)
    col = _pick(rng, _cols(spec, _NUMERIC))
    agg = _pick(rng, ("SUM", "AVG", "MAX", "MIN"))
    conds = _condition(rng, spec, rows, 1) if rng.random() < 0.6 else []
    where = (vocab.template("where", lang).format(cond=_cond_text(spec, conds, lang))
             if conds else "")
    text = vocab.template("aggregate", lang).format(
        agg=vocab.word(_AGG_WORD[agg], lang), col=spec.headers[col], table=spec.name,
        where=where) + _rounded_note(agg, lang)
    sql = (f"SELECT {agg}({quote_ident(spec.headers[col])}) FROM {quote_ident(spec.name)}"
           f"{_where(conds, spec)}")
    values = [r[col] for r in rows if _holds(r, conds)]
    return _agg_answer("aggregate", text, sql, values, agg, spec.columns[col].type,
                       2 + len(conds))


def _extreme(rng):
    desc = bool(rng.random() < 0.5)
    return desc, ("ext_desc" if desc else "ext_asc")


def _ranking(rng, db: Database):
    """The draws an argmax / top-k question starts from, in this order: a table with a
    numeric or date column, that column, the label column and the direction:
    ``(spec, rows, col, target, desc, ext)``."""
    t = _table(rng, db, _NUMERIC + ("date",))
    spec, rows = db.specs[t], db.rows(t)
    col = _pick(rng, _cols(spec, _NUMERIC + ("date",)))
    desc, ext = _extreme(rng)
    return spec, rows, col, _label(spec), desc, ext


def _argmax(rng, db: Database, lang):
    spec, rows, col, target, desc, ext = _ranking(rng, db)
    text = vocab.template("argmax", lang).format(table=spec.name, target=spec.headers[target],
                                                 ext=vocab.word(ext, lang), col=spec.headers[col])
    agg = "MAX" if desc else "MIN"
    name, c = quote_ident(spec.name), quote_ident(spec.headers[col])
    sql = (f"SELECT {quote_ident(spec.headers[target])} FROM {name} "
           f"WHERE {c} = (SELECT {agg}({c}) FROM {name})")
    best = (max if desc else min)(r[col] for r in rows)
    answer = [r[target] for r in rows if r[col] == best]
    return Question("argmax", text, sql, answer[0] if len(answer) == 1 else answer,
                    difficulty=3)


def _sorted_rows(rows, col: int, desc: bool):
    """Rows ordered by ``col`` (descending when ``desc``), ties by ascending key (column 0);
    both sorts are stable."""
    by_key = sorted(rows, key=lambda r: r[0])
    return sorted(by_key, key=lambda r: r[col], reverse=desc)


def _order_sql(spec, col, desc, alias=""):
    pre = f"{alias}." if alias else ""
    return (f"ORDER BY {pre}{quote_ident(spec.headers[col])} {'DESC' if desc else 'ASC'}, "
            f"{pre}{quote_ident(spec.headers[0])} ASC")


def _topk(rng, db: Database, lang):
    spec, rows, col, target, desc, ext = _ranking(rng, db)
    k = int(rng.integers(2, 6))
    text = vocab.template("topk", lang).format(table=spec.name, target=spec.headers[target],
                                               k=k, ext=vocab.word(ext, lang),
                                               col=spec.headers[col], key=spec.headers[0])
    sql = (f"SELECT {quote_ident(spec.headers[target])} FROM {quote_ident(spec.name)} "
           f"{_order_sql(spec, col, desc)} LIMIT {k}")
    answer = [r[target] for r in _sorted_rows(rows, col, desc)[:k]]
    return Question("topk", text, sql, answer, ordered=True, difficulty=3)


def _join(rng, db: Database, lang):
    t = int(rng.integers(1, len(db.specs)))
    child, parent = db.specs[t], db.specs[t - 1]
    crows, prows = db.rows(t), db.rows(t - 1)
    fk, _ = child.fk()
    conds = _condition(rng, parent, prows, 1)
    agg = _pick(rng, ("COUNT", "SUM", "AVG", "MAX"))
    col = None if agg == "COUNT" else _pick(rng, _cols(child, _NUMERIC))
    fields = dict(child=child.name, fk=child.headers[fk], parent=parent.name,
                  cond=_cond_text(parent, conds, lang))
    if col is None:
        text = vocab.template("join_count", lang).format(**fields)
    else:
        text = vocab.template("join", lang).format(
            agg=vocab.word(_AGG_WORD[agg], lang), col=child.headers[col], **fields
        ) + _rounded_note(agg, lang)
    what = "COUNT(*)" if col is None else f"{agg}(c.{quote_ident(child.headers[col])})"
    sql = (f"SELECT {what} FROM {quote_ident(child.name)} AS c JOIN {quote_ident(parent.name)} "
           f"AS p ON c.{quote_ident(child.headers[fk])} = p.{quote_ident(parent.headers[0])} "
           f"WHERE {_cond_sql(conds, parent, 'p')}")
    keep = {r[0] for r in prows if _holds(r, conds)}
    values = [1 if col is None else r[col] for r in crows if r[fk] in keep]
    if agg == "COUNT":
        return Question("join", text, sql, len(values), difficulty=4)
    return _agg_answer("join", text, sql, values, agg, child.columns[col].type, 4)


def _multi_hop(rng, db: Database, lang):
    leaf = len(db.specs) - 1
    hops = int(rng.integers(1, leaf + 1))
    spec, rows = db.specs[leaf], db.rows(leaf)
    col = _pick(rng, _cols(spec, _NUMERIC + ("date",)))
    desc, ext = _extreme(rng)
    parts = [vocab.template("hop_start", lang).format(table=spec.name, ext=vocab.word(ext, lang),
                                                      col=spec.headers[col], key=spec.headers[0])]
    row = _sorted_rows(rows, col, desc)[0]
    fk, _ = spec.fk()
    inner = (f"SELECT {quote_ident(spec.headers[fk])} FROM {quote_ident(spec.name)} "
             f"{_order_sql(spec, col, desc)} LIMIT 1")
    for h in range(hops):
        up = db.specs[leaf - 1 - h]
        parts.append(vocab.template("hop_follow", lang).format(fk=spec.headers[fk],
                                                               table=up.name))
        by_id = {r[0]: r for r in db.rows(leaf - 1 - h)}
        row = by_id[row[fk]]
        if h < hops - 1:
            fk2, _ = up.fk()
            inner = (f"SELECT {quote_ident(up.headers[fk2])} FROM {quote_ident(up.name)} "
                     f"WHERE {quote_ident(up.headers[0])} = ({inner})")
            spec, fk = up, fk2
        else:
            attr = int(rng.integers(1, len(up.columns)))
            parts.append(vocab.template("hop_end", lang).format(attr=up.headers[attr]))
            sql = (f"SELECT {quote_ident(up.headers[attr])} FROM {quote_ident(up.name)} "
                   f"WHERE {quote_ident(up.headers[0])} = ({inner})")
    sep = "、" if lang in ("ja", "zh") else "; "
    return Question("multi_hop", sep.join(parts), sql, row[attr], difficulty=4 + hops)


_MAKERS = {"lookup": _lookup, "count": _count, "aggregate": _aggregate_q, "argmax": _argmax,
           "topk": _topk, "join": _join, "multi_hop": _multi_hop}


def make_question(rng: np.random.Generator, db: Database, task: str) -> Question:
    """A question of ``task`` about ``db`` (raises :class:`NoQuestion` when the draw has no
    answer, e.g. an aggregate over an empty set)."""
    if task not in _MAKERS:
        raise ValueError(f"tablelong: unknown task {task!r}; known: {TASKS}")
    return _MAKERS[task](rng, db, db.language)
