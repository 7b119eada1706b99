"""Metrics for MGAL-style items (:mod:`lcjax.data.mgal`; the ICML 2026 MGAL paper).

MGAL reports that long-context models often answer *fluently but inconsistently* with the
source: the reply reads well in the right language but drifts from what the document says.
The metrics keep the two apart:

* multiple choice — ``correct``: the parsed choice (a letter ``A``…, a 0-based digit or an
  option's exact text) equals ``item.answer``; accuracy is its mean.
* open answers — ``exact``: ``norm(prediction) == norm(answer)`` with ``norm`` = NFKC,
  casefold, whitespace collapsed, surrounding punctuation stripped; ``consistency``: token F1
  against the source span ``context[answer_span]`` (:func:`source_text`; for
  ``which_section`` the heading line), ``F1 = 2 P R / (P + R)``,
  ``P = |pred ∩ src| / |pred|``, ``R = |pred ∩ src| / |src|``
  (multiset overlap of :func:`tokens`). Tokens are language-aware: every CJK character
  (Han, kana, Hangul) is one token — ja and zh have no spaces — and other text splits into
  ``\\w+`` runs. Answers that are labels (sentence order, discourse role) have no span to
  be consistent with: ``consistency`` is None and only ``exact`` counts.
* ``fluent`` (source-free): the reply is non-empty, at least half of its letters are in the
  item language's script (:func:`script_share`) and its token count is within a factor 2 of
  the gold answer's. ``drifting`` = fluent and ``consistency < 0.5``: the failure MGAL
  describes, reported next to (not inside) the consistency score.

``accuracy`` (:func:`summarize`) is the headline per cell: the mean over a cell's items of
``correct`` (multiple choice) or ``exact`` (open answers). Through the evaluator
(``lcjax eval --suite mgal``) the suite's ``score`` hook stores :func:`score_item` in each
record's ``suite_metrics`` and :func:`write_report` writes the granularity × position ×
language grid (``mgal_metrics.json`` / ``.md``) and its heat maps.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from lcjax.data.mgal import CJK_LANGS, GRANULARITIES, POSITIONS, MgalItem, depth_position
from lcjax.reporting import heatmap

__all__ = ["DRIFT_THRESHOLD", "GRID_BY", "exact_match", "normalize", "parse_choice",
           "score_item", "eval_grids", "grid_markdown", "metric_grids", "plot_grid", "score_items",
           "script_share", "source_text", "write_heatmaps", "write_report", "summarize",
           "token_f1", "tokens"]

DRIFT_THRESHOLD = 0.5
GRID_BY = ("granularity", "position_doc", "language")
_CJK_CHAR = re.compile(r"[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff"
                       r"\uac00-\ud7af\uf900-\ufaff]")
_TOKEN = re.compile(r"[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff"
                    r"\uac00-\ud7af\uf900-\ufaff]|[^\W\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]+")


def normalize(text: str) -> str:
    """NFKC, casefold, whitespace collapsed, leading / trailing punctuation and quotes off."""
    t = unicodedata.normalize("NFKC", text).casefold()
    t = re.sub(r"\s+", " ", t).strip()
    return t.strip(" \"'“”‘’「」『』.,;:!?。、，！？：；()[]")


def tokens(text: str) -> list[str]:
    """Language-aware tokens of ``normalize(text)``: one per CJK character, else ``\\w+``."""
    return _TOKEN.findall(normalize(text))


def token_f1(prediction: str, reference: str) -> float:
    """Multiset token F1 of ``prediction`` against ``reference`` (1.0 when both are empty)."""
    p, r = Counter(tokens(prediction)), Counter(tokens(reference))
    if not p and not r:
        return 1.0
    overlap = sum((p & r).values())
    if overlap == 0:
        return 0.0
    prec, rec = overlap / sum(p.values()), overlap / sum(r.values())
    return 2 * prec * rec / (prec + rec)


def exact_match(prediction: str, answer: str) -> bool:
    """``normalize(prediction) == normalize(answer)``."""
    return normalize(prediction) == normalize(answer)


def script_share(text: str, lang: str) -> float:
    """Fraction of the letters of ``text`` written in ``lang``'s script: CJK characters for
    ja / zh-cn / zh-tw (ASCII technical terms count too: they are part of such text), Latin
    letters otherwise. 0.0 for a text without letters."""
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return 0.0
    if lang in CJK_LANGS:
        good = sum(bool(_CJK_CHAR.match(c)) or c.isascii() for c in letters)
    else:
        good = sum(unicodedata.name(c, "").startswith("LATIN") for c in letters)
    return good / len(letters)


def parse_choice(prediction: str, options: Sequence[str]) -> int | None:
    """The option a reply picks: a leading letter (``"B"``, ``"B."``, ``"(B)"``), a 0-based
    index, or an option's exact (normalised) text; None when it picks none."""
    text = prediction.strip()
    m = re.match(r"^\(?([A-Za-z])(?:[).:\s]|$)", text)
    if m and ord(m.group(1).upper()) - 65 < len(options):
        return ord(m.group(1).upper()) - 65
    if re.fullmatch(r"\d+", text) and int(text) < len(options):
        return int(text)
    norm = normalize(text)
    hits = [i for i, o in enumerate(options) if normalize(o) == norm]
    return hits[0] if len(hits) == 1 else None


def _is_label(item: MgalItem) -> bool:
    """Label answers (order, role) are not text of the context."""
    return item.task in ("order", "role")


def source_text(item: MgalItem) -> str:
    """The context text an open answer must be consistent with: ``context[answer_span]``
    (the answer's own occurrence) — except for ``which_section``, whose span is the term's
    occurrence and whose answer is a heading: there, that heading line of the context."""
    if item.task == "which_section":
        heading = str(item.answer)
        if f"## {heading}" not in item.context:
            raise ValueError(f"source_text: heading {heading!r} not in the context")
        return heading
    return item.context[item.answer_span[0]:item.answer_span[1]]


def score_item(item: MgalItem, prediction: str) -> dict:
    """One record: the item's tags plus ``kind`` ("mc" / "open") and its scores."""
    rec = {"language": item.language, "granularity": item.granularity, "task": item.task,
           "position_doc": item.position_doc, "position_para": item.position_para,
           "length_bucket": item.length_bucket, "crowded": item.crowded}
    if item.options is not None:
        choice = parse_choice(prediction, item.options)
        rec.update(kind="mc", choice=choice, correct=choice == item.answer,
                   n_options=len(item.options))
        return rec
    answer = str(item.answer)
    exact = exact_match(prediction, answer)
    if _is_label(item):
        rec.update(kind="open", exact=exact, consistency=None, fluent=None, drifting=None)
        return rec
    source = source_text(item)
    consistency = token_f1(prediction, source)
    n_pred, n_gold = len(tokens(prediction)), max(len(tokens(answer)), 1)
    fluent = (n_pred > 0 and script_share(prediction, item.language) >= 0.5
              and 0.5 <= n_pred / n_gold <= 2.0)
    rec.update(kind="open", exact=exact, consistency=consistency, fluent=fluent,
               drifting=fluent and consistency < DRIFT_THRESHOLD)
    return rec


def score_items(items: Sequence[MgalItem], predictions: Sequence[str]) -> list[dict]:
    """:func:`score_item` for each pair; ValueError when the lengths differ."""
    if len(items) != len(predictions):
        raise ValueError(f"score_items: {len(items)} items but {len(predictions)} predictions")
    return [score_item(it, p) for it, p in zip(items, predictions)]


def _mean(values: Iterable) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def summarize(records: Sequence[Mapping], by: Sequence[str] = ("language", "granularity")
              ) -> dict[tuple, dict]:
    """Per group (``by`` tags): ``n``, ``accuracy`` (mean of ``correct`` / ``exact`` over
    all items), ``mc_accuracy`` with ``mc_chance`` (its expectation for a uniformly random
    choice: the mean of ``1 / n_options``) and ``mc_answered`` (the share of multiple-choice
    replies that name an option at all), ``exact_match``, ``consistency_f1``, ``fluent`` and
    ``fluent_but_drifting`` rates (None where a group has no such record)."""
    groups: dict[tuple, list[Mapping]] = {}
    for r in records:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = {}
    for key in sorted(groups, key=str):
        rs = groups[key]
        mc = [r for r in rs if r["kind"] == "mc"]
        op = [r for r in rs if r["kind"] == "open"]
        out[key] = {"n": len(rs), "n_mc": len(mc), "n_open": len(op),
                    "accuracy": _mean(r["correct"] if r["kind"] == "mc" else r["exact"]
                                      for r in rs),
                    "mc_accuracy": _mean(r["correct"] for r in mc),
                    "mc_chance": _mean(1.0 / r["n_options"] for r in mc),
                    "mc_answered": _mean(r["choice"] is not None for r in mc),
                    "exact_match": _mean(r["exact"] for r in op),
                    "consistency_f1": _mean(r["consistency"] for r in op),
                    "fluent": _mean(r["fluent"] for r in op),
                    "fluent_but_drifting": _mean(r["drifting"] for r in op)}
    return out


# --- heat-maps of an evaluator run (``lcjax eval --suite mgal``) ---------------------------


def eval_grids(records: Sequence[Mapping], metric: str = "string_match_all"
               ) -> dict[str, tuple[list[str], list[str], list[list[float | None]]]]:
    """Mean ``metric`` of evaluator records (tasks ``"<lang>/<granularity>"``, depth =
    position) on two grids: ``"language_x_granularity"`` and ``"position_x_granularity"``,
    each ``(row labels, column labels, values)`` with None for an empty cell."""
    rows = []
    for r in records:
        lang, _, gran = str(r["task"]).partition("/")
        if gran not in GRANULARITIES:
            raise ValueError(f"eval_grids: task {r['task']!r} is not '<lang>/<granularity>'")
        rows.append((lang, gran, depth_position(r["depth"]), float(r[metric])))
    grans = [g for g in GRANULARITIES if any(x[1] == g for x in rows)]
    langs = list(dict.fromkeys(x[0] for x in rows))
    poss = [p for p in POSITIONS if any(x[2] == p for x in rows)]

    def grid(labels, col):
        return [[_mean(x[3] for x in rows if x[col] == lab and x[1] == g) for g in grans]
                for lab in labels]

    return {"language_x_granularity": (langs, grans, grid(langs, 0)),
            "position_x_granularity": (poss, grans, grid(poss, 2))}


def plot_grid(rows: Sequence[str], cols: Sequence[str], values, path: str, *,
              title: str = "", label: str = "string_match_all (%)") -> None:
    """A rows x cols heat map (0-100; ``values[i][j]`` None is a blank cell) with the values
    printed in the cells, drawn by :func:`lcjax.reporting.heatmap`."""
    grid = [[float("nan") if v is None else v for v in row] for row in values]
    heatmap(grid, rows, cols, path, title=title, label=label)


def write_heatmaps(records: Sequence[Mapping], out_dir: str, *, title: str = "mgal",
                   metric: str = "string_match_all") -> dict[str, str]:
    """``mgal_language_x_granularity.png`` and ``mgal_position_x_granularity.png`` in
    ``out_dir`` (:func:`eval_grids`); returns their paths."""
    import os

    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for name, (rows, cols, values) in eval_grids(records, metric).items():
        path = os.path.join(out_dir, f"mgal_{name}.png")
        plot_grid(rows, cols, values, path, title=f"{title}: {name.replace('_x_', ' x ')}",
                  label=f"{metric} (%)")
        paths[name] = path
    return paths


# --- MGAL's own metrics through the evaluator (the suite's ``report`` hook) -----------------


def _suite_metrics(records: Sequence[Mapping]) -> list[Mapping]:
    missing = sum("suite_metrics" not in r for r in records)
    if missing:
        raise ValueError(f"mgal report: {missing} of {len(records)} records have no "
                         "suite_metrics (evaluate with an mgal suite, whose score hook adds them)")
    return [r["suite_metrics"] for r in records]


def metric_grids(scores: Sequence[Mapping], metric: str = "accuracy"
                 ) -> dict[str, tuple[list[str], list[str], list[list[float | None]]]]:
    """``metric`` of :func:`summarize` in percent on the grids ``"language_x_granularity"``
    and ``"position_x_granularity"`` of :func:`score_item` records, each ``(row labels,
    column labels, values)``; None for an empty cell or a cell without such items."""
    grans = [g for g in GRANULARITIES if any(r["granularity"] == g for r in scores)]
    langs = list(dict.fromkeys(r["language"] for r in scores))
    poss = [p for p in POSITIONS if any(r["position_doc"] == p for r in scores)]
    out = {}
    for name, tag, labels in (("language_x_granularity", "language", langs),
                              ("position_x_granularity", "position_doc", poss)):
        table = summarize(scores, by=(tag, "granularity"))
        values = [[None if (lab, g) not in table or table[(lab, g)][metric] is None
                   else 100.0 * table[(lab, g)][metric] for g in grans] for lab in labels]
        out[name] = (labels, grans, values)
    return out


def _fmt(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}"


def grid_markdown(rows: Sequence[Mapping]) -> str:
    """The grid rows of :func:`write_report` as a Markdown table (rates in percent)."""
    cols = ("accuracy", "mc_accuracy", "mc_chance", "exact_match", "consistency_f1", "fluent",
            "fluent_but_drifting")
    lines = ["| granularity | position | language | n (mc/open) | " + " | ".join(cols) + " |",
             "|---|---|---|---|" + "---|" * len(cols)]
    for r in rows:
        lines.append(f"| {r['granularity']} | {r['position_doc']} | {r['language']} | "
                     f"{r['n']} ({r['n_mc']}/{r['n_open']}) | "
                     + " | ".join(_fmt(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def write_report(records: Sequence[Mapping], out_dir: str, *, title: str = "mgal",
                 metrics: Sequence[str] = ("accuracy",)) -> dict:
    """MGAL's metrics of evaluator records (each with ``suite_metrics``, :func:`score_item`):
    writes ``mgal_metrics.json`` (``overall``, the ``grid`` granularity × position_doc ×
    language, and both marginal grids), ``mgal_metrics.md``, heat maps of ``metrics``
    (``mgal_<metric>_<grid>.png``, grids of :func:`metric_grids`) and the string-match ones
    (:func:`write_heatmaps`); returns ``{"overall", "grid", "files"}``."""
    import json
    import os

    scores = _suite_metrics(records)
    os.makedirs(out_dir, exist_ok=True)

    def rows(by):
        return [{**dict(zip(by, key)), **stats} for key, stats in summarize(scores, by).items()]

    order = {**{g: i for i, g in enumerate(GRANULARITIES)},
             **{p: i for i, p in enumerate(POSITIONS)}}
    langs = {lang: i for i, lang in enumerate(dict.fromkeys(r["language"] for r in scores))}
    grid = sorted(rows(GRID_BY), key=lambda r: (order[r["granularity"]],
                                                 order[r["position_doc"]], langs[r["language"]]))
    overall = summarize(scores, by=())[()] if scores else {}
    payload = {"overall": overall, "grid": grid,
               "language_x_granularity": rows(("language", "granularity")),
               "position_x_granularity": rows(("position_doc", "granularity"))}
    files = [os.path.join(out_dir, "mgal_metrics.json"), os.path.join(out_dir, "mgal_metrics.md")]
    with open(files[0], "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2)
    with open(files[1], "w", encoding="utf-8") as f:
        f.write(f"# {title}: MGAL metrics (granularity x position x language)\n\n"
                + grid_markdown(grid) + "\n")
    for metric in metrics:
        for name, (rlabels, clabels, values) in metric_grids(scores, metric).items():
            path = os.path.join(out_dir, f"mgal_{metric}_{name}.png")
            plot_grid(rlabels, clabels, values, path,
                      title=f"{title}: {metric}, {name.replace('_x_', ' x ')}",
                      label=f"{metric} (%)")
            files.append(path)
    files += list(write_heatmaps(records, out_dir, title=title).values())
    return {"overall": overall, "grid": grid, "files": files}
