"""Serialising TableLong databases as markdown, CSV, JSON or HTML, and parsing them back.

Every format writes a cell exactly as stored: integers and IDs with ``str``, reals with
``repr`` (the shortest string that reads back to the same double), text and ISO dates as
they are. The untyped formats (markdown, CSV, HTML) are read back with the declared
``types``; JSON keeps its own.

- ``markdown``: per table ``### name`` and a pipe table whose columns are padded to a common
  width (an aligned layout: every row of a table has the same number of characters); ``|``
  inside a cell is written ``\\|``.
- ``csv``: per table ``### name`` then RFC 4180 CSV (``csv`` module), tables separated by a
  blank line.
- ``json``: one object ``{name: [{column: value, ...}, ...]}`` (``json`` module).
- ``html``: per table ``<table>`` with a ``<caption>``, a ``<thead>`` row of ``<th>`` and
  ``<tbody>`` rows of ``<td>``, escaped with ``html.escape`` and read with ``html.parser``.
"""

from __future__ import annotations

import csv
import html
import html.parser
import io
import json
import re

__all__ = ["FORMATS", "parse_context", "parse_value", "render_cells", "serialize",
           "write_value"]

FORMATS = ("markdown", "csv", "json", "html")


def write_value(value, type_: str) -> str:
    """A cell as written in the context."""
    if type_ == "real":
        return repr(float(value))
    return str(value)


def parse_value(text: str, type_: str):
    """A cell read back from its text with the declared type."""
    if type_ in ("integer", "id"):
        return int(text)
    if type_ == "real":
        return float(text)
    if type_ in ("text", "date"):
        return text
    raise ValueError(f"tablelong: unknown column type {type_!r}")


def render_cells(table: dict, fmt: str = "csv") -> list[list[str]]:
    """The cells of ``table`` as written (:func:`write_value`), row by row, escaped for
    ``fmt`` (``|`` -> ``\\|`` in markdown, ``html.escape`` in HTML; CSV quotes when writing)."""
    bad = [t for t in table["types"] if t not in ("text", "integer", "real", "date", "id")]
    if bad:
        raise ValueError(f"tablelong: unknown column types {bad}")
    writers = [repr if t == "real" else str for t in table["types"]]
    cells = [[w(v) for w, v in zip(writers, row, strict=True)] for row in table["rows"]]
    escape = _ESCAPE.get(fmt)
    if escape is not None:
        text = [j for j, t in enumerate(table["types"]) if t == "text"]  # others need none
        for r in cells:
            for j in text:
                r[j] = escape(r[j])
    return cells


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


_ESCAPE = {"markdown": _md_escape, "html": html.escape}


def _markdown(name: str, table: dict, rows: list[list[str]]) -> str:
    head = [_md_escape(h) for h in table["columns"]]
    widths = [max([len(head[j]), 3] + [len(r[j]) for r in rows]) for j in range(len(head))]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([f"### {name}", line(head), rule] + [line(r) for r in rows])


def _csv(name: str, table: dict, cells: list[list[str]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(table["columns"])
    w.writerows(cells)
    return f"### {name}\n" + buf.getvalue().rstrip("\n")


def _html(name: str, table: dict, cells: list[list[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in table["columns"])
    body = "\n".join("<tr><td>" + "</td><td>".join(r) + "</td></tr>" for r in cells)
    return (f"<table>\n<caption>{e(name)}</caption>\n<thead><tr>{head}</tr></thead>\n"
            f"<tbody>\n{body}\n</tbody>\n</table>")


def serialize(tables: dict[str, dict], fmt: str,
              cells: dict[str, list[list[str]]] | None = None) -> str:
    """The context text of ``tables`` ({name: {"columns", "types", "rows"}}) in ``fmt``.

    ``cells`` ({name: ``render_cells(table, fmt)``}, possibly longer than the rows: only the
    first ``len(rows)`` are used) saves re-rendering when serialising prefixes of the same
    tables."""
    if fmt == "json":
        doc = {name: [dict(zip(t["columns"], row, strict=True)) for row in t["rows"]]
               for name, t in tables.items()}
        return json.dumps(doc, ensure_ascii=False)
    writer = {"markdown": _markdown, "csv": _csv, "html": _html}.get(fmt)
    if writer is None:
        raise ValueError(f"tablelong: unknown format {fmt!r}; known: {FORMATS}")
    cells = cells or {}
    return "\n\n".join(
        writer(name, t, cells[name][:len(t["rows"])] if name in cells else render_cells(t, fmt))
        for name, t in tables.items())


# --- parsing ------------------------------------------------------------------------------

def _blocks(context: str) -> list[tuple[str, list[str]]]:
    """``### name`` sections: [(name, lines)]."""
    out = []
    for line in context.split("\n"):
        if line.startswith("### "):
            out.append((line[4:], []))
        elif out and line:
            out[-1][1].append(line)
    return out


_PIPE = re.compile(r"(?<!\\)\|")


def _md_row(line: str) -> list[str]:
    inner = line.strip()[1:-1]
    return [c.strip().replace("\\|", "|") for c in _PIPE.split(inner)]


class _HTMLTables(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables: list[dict] = []
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self._in_caption = False

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append({"name": "", "rows": []})
        elif tag == "caption":
            self._in_caption = True
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "caption":
            self._in_caption = False
        elif tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[-1]["rows"].append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._in_caption:
            self.tables[-1]["name"] += data
        elif self._cell is not None:
            self._cell.append(data)


def _typed(columns, rows, types) -> dict:
    if len(columns) != len(types):
        raise ValueError(f"tablelong: {len(columns)} columns but {len(types)} types")
    return {"columns": list(columns), "types": list(types),
            "rows": [[parse_value(c, t) for c, t in zip(r, types, strict=True)] for r in rows]}


def parse_context(context: str, fmt: str, types: dict[str, list[str]]) -> dict[str, dict]:
    """The tables of a serialised context, cells typed by ``types`` ({name: [type, ...]});
    the inverse of :func:`serialize`."""
    if fmt == "json":
        doc = json.loads(context)
        out = {}
        for name, records in doc.items():
            columns = list(records[0]) if records else []
            out[name] = {"columns": columns, "types": list(types[name]),
                         "rows": [list(r.values()) for r in records]}
        return out
    if fmt == "markdown":
        return {name: _typed(_md_row(lines[0]), [_md_row(x) for x in lines[2:]], types[name])
                for name, lines in _blocks(context)}
    if fmt == "csv":
        out = {}
        for name, lines in _blocks(context):
            rows = list(csv.reader(io.StringIO("\n".join(lines))))
            out[name] = _typed(rows[0], rows[1:], types[name])
        return out
    if fmt == "html":
        p = _HTMLTables()
        p.feed(context)
        p.close()
        return {t["name"]: _typed(t["rows"][0], t["rows"][1:], types[t["name"]])
                for t in p.tables}
    raise ValueError(f"tablelong: unknown format {fmt!r}; known: {FORMATS}")
