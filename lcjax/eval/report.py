"""Reports of an evaluation: ``results.json``, ``results.md`` and one depth x length heat
map of ``string_match_all`` per task (``<task>_heatmap.png``), written with
:func:`lcjax.reporting.write_report`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from lcjax import reporting
from lcjax.eval.results import METRICS
from lcjax.reporting import heatmap

__all__ = ["format_markdown", "heatmap", "plot_heatmap", "write_report"]


def _depth_label(d) -> str:
    return "-" if d is None else f"{d:g}"


def _pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}"


def _grid(cells: list[dict], metric: str) -> tuple[list, list, dict]:
    lengths = sorted({c["length"] for c in cells})
    depths = sorted({c["depth"] for c in cells}, key=lambda d: -1.0 if d is None else d)
    return lengths, depths, {(c["depth"], c["length"]): c for c in cells}


def _task_table(task: Mapping) -> list[str]:
    lengths, depths, by = _grid(task["cells"], METRICS[0])
    lines = ["| depth \\ length | " + " | ".join(str(n) for n in lengths) + " |",
             "|---|" + "---|" * len(lengths)]
    for d in depths:
        row = []
        for n in lengths:
            c = by.get((d, n))
            if c is None:
                row.append("")
                continue
            err = f", {c['errors']} err" if c["errors"] else ""
            row.append(f"{_pct(c['string_match_all'])} / {_pct(c['string_match_part'])} "
                       f"(n={c['n']}{err})")
        lines.append(f"| {_depth_label(d)} | " + " | ".join(row) + " |")
    per_len = task["lengths"]
    lines.append("| **all depths** | " + " | ".join(
        f"**{_pct(per_len[str(n)]['string_match_all'])} / "
        f"{_pct(per_len[str(n)]['string_match_part'])}**" for n in lengths) + " |")
    return lines


def format_markdown(result: Mapping) -> str:
    """The markdown report of ``EvalResults.to_dict()``."""
    cfg, summary = result["config"], result["summary"]
    o = summary["overall"]
    lines = [f"# {cfg.get('suite')} evaluation: {cfg.get('backend')}", "",
             f"Seed {cfg.get('seed')}, lengths {cfg.get('lengths')}, depths "
             f"{cfg.get('depths')}, {cfg.get('n_per_cell')} items per cell, "
             f"max_new_tokens {cfg.get('max_new_tokens')}.", ""]
    if result.get("command"):
        lines += [f"Command: `{result['command']}`", ""]
    if result.get("machine"):
        lines += [reporting.machine_line(result["machine"]), ""]
    lines += [f"Overall: string_match_all {_pct(o['string_match_all'])}, string_match_part "
              f"{_pct(o['string_match_part'])} over {o['n']} items, {o['errors']} errors "
              "(an error scores 0).", "",
              "| task | string_match_all | string_match_part | n | errors |",
              "|---|---|---|---|---|"]
    for name, t in summary["tasks"].items():
        s = t["overall"]
        lines.append(f"| {name} | {_pct(s['string_match_all'])} | "
                     f"{_pct(s['string_match_part'])} | {s['n']} | {s['errors']} |")
    for name, t in summary["tasks"].items():
        lines += ["", f"## {name}", "",
                  "Cells: string_match_all / string_match_part (percent), items, errors.", ""]
        lines += _task_table(t)
    return "\n".join(lines) + "\n"



def plot_heatmap(task: Mapping, path: str, *, title: str = "") -> None:
    """Depth (rows) x length (columns) heat map of a task's ``string_match_all``."""
    lengths, depths, by = _grid(task["cells"], METRICS[0])
    grid = [[by[(d, n)]["string_match_all"] if (d, n) in by else float("nan")
             for n in lengths] for d in depths]
    heatmap(grid, [_depth_label(d) for d in depths], lengths, path, title=title,
            xlabel="length (tokens)", ylabel="needle depth")


def _file_stem(task: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", task)


def write_report(results, out_dir: str, *, command: str | None = None,
                 machine: Mapping | None = None) -> dict[str, str]:
    """Write ``results.json``, ``results.md`` and ``<task>_heatmap.png`` per task into
    ``out_dir``; ``results`` is an :class:`~lcjax.eval.evaluate.EvalResults` or its
    ``to_dict()``. Returns the paths written (``json``, ``md``, ``<task>_heatmap``)."""
    result = dict(results.to_dict() if hasattr(results, "to_dict") else results)
    if command is not None:
        result["command"] = command
    if machine is not None:
        result["machine"] = dict(machine)
    plots = {}
    for name, task in result["summary"]["tasks"].items():
        title = f"{result['config'].get('suite')}/{name}: {result['config'].get('backend')}"
        plots[f"{_file_stem(name)}_heatmap"] = (
            lambda res, path, task=task, title=title: plot_heatmap(task, path, title=title))
    return reporting.write_report(result, out_dir, "results", format_markdown(result), plots)
