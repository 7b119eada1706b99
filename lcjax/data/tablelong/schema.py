"""TableLong databases: typed, multilingual, multi-table schemas with keys, and their values.

A domain is a chain of tables linked by foreign keys (``departments <- employees <-
assignments``, ...). A database draws a prefix chain of two or three of them, a random subset
of each table's optional columns in a random order (the primary key stays first) and the
headers of one language. Values: IDs increasing with random gaps; person names, cities and
companies from ``faker`` pools of the language's locale (built once per process from a fixed
seed, so every process sees the same pools); categorical values from :mod:`.vocab`; integers,
2-decimal reals and ISO dates uniform in a per-column range. Values are drawn with a
``random.Random`` seeded from the caller's numpy generator (cheaper per call for short
columns), so a database is a function of that generator's state.

A table is the item's JSON form ``{"columns": [...], "types": [...], "rows": [[...], ...]}``
with ``types`` from :data:`TYPES`; :class:`TableSpec` keeps the concepts behind the headers
for the question generator.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import itertools
import random

import numpy as np

from lcjax.data.tablelong import vocab
from lcjax.optional import require

__all__ = ["DOMAINS", "SQL_TYPES", "TYPES", "ColumnSpec", "Database", "TableSpec",
           "faker_pool", "make_database", "resize_leaf"]

TYPES = ("text", "integer", "real", "date", "id")
SQL_TYPES = {"text": "TEXT", "integer": "INTEGER", "real": "REAL", "date": "TEXT",
             "id": "INTEGER"}

_DAY0 = datetime.date(1990, 1, 1).toordinal()


@dataclasses.dataclass(frozen=True)
class ColumnSpec:
    """A column template: concept key, type, value kind, and whether every table has it.

    ``kind`` is ``"pk"``, ``"fk:<table>"``, ``"cat:<category>"``, ``"person"``, ``"city"``,
    ``"company"``, ``"int:lo:hi"``, ``"real:lo:hi"`` or ``"date:lo:hi"`` (years)."""

    concept: str
    type: str
    kind: str
    required: bool = False


def _c(concept, type_, kind, required=False):
    return ColumnSpec(concept, type_, kind, required)


# domain -> chain of (table concept, columns); each table's first column is its key and
# table i > 0 has a foreign key to table i - 1.
DOMAINS: dict[str, tuple[tuple[str, tuple[ColumnSpec, ...]], ...]] = {
    "company": (
        ("departments", (_c("dept_id", "id", "pk"), _c("dept_name", "text", "cat:department", 1),
                         _c("city", "text", "city"), _c("budget", "real", "real:10000:900000"),
                         _c("founded", "date", "date:1950:2015"))),
        ("employees", (_c("emp_id", "id", "pk"), _c("name", "text", "person", 1),
                       _c("dept_id", "id", "fk:departments", 1), _c("role", "text", "cat:role"),
                       _c("salary", "real", "real:20000:150000", 1), _c("age", "integer",
                                                                         "int:20:65"),
                       _c("hire_date", "date", "date:1995:2024"), _c("city", "text", "city"))),
        ("assignments", (_c("assign_id", "id", "pk"), _c("emp_id", "id", "fk:employees", 1),
                         _c("hours", "integer", "int:1:400", 1),
                         _c("start_date", "date", "date:2015:2025"),
                         _c("status", "text", "cat:status"))),
    ),
    "shop": (
        ("customers", (_c("customer_id", "id", "pk"), _c("name", "text", "person", 1),
                       _c("city", "text", "city", 1), _c("company", "text", "company"),
                       _c("signup_date", "date", "date:2005:2024"),
                       _c("segment", "text", "cat:segment"))),
        ("orders", (_c("order_id", "id", "pk"), _c("customer_id", "id", "fk:customers", 1),
                    _c("quantity", "integer", "int:1:50", 1), _c("price", "real", "real:1:2000"),
                    _c("order_date", "date", "date:2018:2025"),
                    _c("category", "text", "cat:product_category"))),
    ),
    "school": (
        ("courses", (_c("course_id", "id", "pk"), _c("subject", "text", "cat:subject", 1),
                     _c("credits", "integer", "int:1:10"), _c("teacher", "text", "person"))),
        ("students", (_c("student_id", "id", "pk"), _c("name", "text", "person", 1),
                      _c("course_id", "id", "fk:courses", 1), _c("city", "text", "city"),
                      _c("birth_date", "date", "date:1995:2008"), _c("year", "integer", "int:1:5"),
                      _c("score", "real", "real:0:100", 1))),
        ("enrollments", (_c("enrollment_id", "id", "pk"), _c("student_id", "id", "fk:students", 1),
                         _c("score", "real", "real:0:100", 1), _c("term", "text", "cat:term"),
                         _c("credits", "integer", "int:1:10"))),
    ),
}


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """One table of a database: its concept, translated name and columns (key first)."""

    concept: str
    name: str
    columns: tuple[ColumnSpec, ...]
    headers: tuple[str, ...]

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(c.type for c in self.columns)

    def index(self, concept: str) -> int:
        """Position of the column with ``concept``."""
        for i, c in enumerate(self.columns):
            if c.concept == concept:
                return i
        raise KeyError(concept)

    def fk(self) -> tuple[int, str] | None:
        """``(column index, parent table concept)`` of the foreign key, or None."""
        for i, c in enumerate(self.columns):
            if c.kind.startswith("fk:"):
                return i, c.kind[3:]
        return None


@dataclasses.dataclass
class Database:
    """Tables of one item, parent first: ``specs[i]`` describes ``tables[specs[i].name]``."""

    domain: str
    language: str
    specs: list[TableSpec]
    tables: dict[str, dict]

    def rows(self, i: int) -> list[list]:
        return self.tables[self.specs[i].name]["rows"]


@functools.cache
def faker_pool(kind: str, language: str, size: int = 400) -> tuple[str, ...]:
    """``size`` distinct faker values (``"person"``, ``"city"``, ``"company"``) of the
    language's locale, from a fixed seed: the same tuple in every process."""
    with require("data", "lcjax.data.tablelong"):
        import faker  # imported here: ``import lcjax.data`` stays light

    fake = faker.Faker(vocab.LOCALES[language])
    fake.seed_instance(20261201)
    make = {"person": fake.name, "city": fake.city, "company": fake.company}[kind]
    seen: dict[str, None] = {}
    for _ in range(20 * size):
        value = make().replace("\n", " ").strip()
        seen.setdefault(value, None)
        if len(seen) == size:
            break
    return tuple(seen)


def _values(rnd: random.Random, col: ColumnSpec, language: str, n: int,
            parent_ids: list[int] | None) -> list:
    kind, _, rest = col.kind.partition(":")
    if kind == "pk":
        return list(itertools.accumulate(rnd.choices((1, 2, 3), k=n),
                                         initial=rnd.randint(1, 5000)))[1:]
    if kind == "fk":
        return rnd.choices(parent_ids, k=n)
    if kind == "cat":
        return rnd.choices(vocab.category_values(rest, language), k=n)
    if kind in ("person", "city", "company"):
        return rnd.choices(faker_pool(kind, language), k=n)
    lo, hi = (int(x) for x in rest.split(":"))
    if kind == "int":
        return rnd.choices(range(lo, hi + 1), k=n)
    if kind == "real":
        return [c / 100 for c in rnd.choices(range(100 * lo, 100 * hi + 1), k=n)]
    a = datetime.date(lo, 1, 1).toordinal()
    b = datetime.date(hi, 12, 31).toordinal()
    return [datetime.date.fromordinal(d).isoformat() for d in rnd.choices(range(a, b + 1), k=n)]


def _choose_columns(rng: np.random.Generator, columns: tuple[ColumnSpec, ...]):
    keep = [c for c in columns[1:] if c.required or rng.random() < 0.7]
    order = rng.permutation(len(keep))
    return (columns[0],) + tuple(keep[i] for i in order)


def _fill(rnd: random.Random, spec: TableSpec, language: str, n: int, parent_ids):
    cols = [_values(rnd, c, language, n, parent_ids) for c in spec.columns]
    return [list(r) for r in zip(*cols, strict=True)]


def make_database(rng: np.random.Generator, language: str, sizes: list[int],
                  domain: str | None = None, specs: list[TableSpec] | None = None) -> Database:
    """A database of ``len(sizes)`` chained tables with ``sizes[i]`` rows each.

    Draws the domain and each table's columns from ``rng`` unless ``specs`` (a previous
    database's) fixes them."""
    if domain is None:
        domain = sorted(DOMAINS)[int(rng.integers(len(DOMAINS)))]
    chain = DOMAINS[domain]
    if not 1 <= len(sizes) <= len(chain):
        raise ValueError(f"tablelong: domain {domain!r} has {len(chain)} tables, "
                         f"asked for {len(sizes)}")
    if specs is None:
        specs = []
        for concept, columns in chain[:len(sizes)]:
            cols = _choose_columns(rng, columns)
            specs.append(TableSpec(concept, vocab.word(concept, language), cols,
                                   tuple(vocab.word(c.concept, language) for c in cols)))
    if len(specs) != len(sizes) or min(sizes) < 1:
        raise ValueError(f"tablelong: need one size >= 1 per table, got {sizes}")
    rnd = random.Random(int(rng.integers(2**62)))  # Python's generator: fast for short lists
    tables, parent_ids = {}, None
    for spec, n in zip(specs, sizes, strict=True):
        rows = _fill(rnd, spec, language, n, parent_ids)
        tables[spec.name] = {"columns": list(spec.headers), "types": list(spec.types),
                             "rows": rows}
        parent_ids = [r[0] for r in rows]
    return Database(domain, language, specs, tables)


def resize_leaf(db: Database, n: int) -> Database:
    """The database with only the first ``n`` rows of its last table (nothing refers to
    the last table, so the keys stay consistent)."""
    last = db.specs[-1].name
    tables = dict(db.tables)
    tables[last] = {**tables[last], "rows": tables[last]["rows"][:n]}
    return Database(db.domain, db.language, db.specs, tables)
