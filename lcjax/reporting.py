"""Report writing shared by the benchmarks and the evaluator (a base utility: imports no other
lcjax module): number formats, targets and verdicts, the machine line, the rerun command,
the JSON + markdown + PNG files and the log-log axes.

A benchmark's result is a JSON-ready dict with at least ``command`` (the ``lcjax`` command
that reruns it) and ``machine`` (:func:`machine_info`);
:func:`write_report` writes ``<stem>.json``, ``<stem>.md`` and one PNG per plot.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

import jax

from lcjax.optional import require

__all__ = [
    "MiB",
    "check",
    "cli_args",
    "command_line",
    "err",
    "figure_title",
    "format_checks",
    "heatmap",
    "join_values",
    "json_default",
    "log_axes",
    "machine_info",
    "machine_line",
    "mib",
    "ms",
    "pct",
    "ratio",
    "verdict",
    "write_report",
    "write_results_json",
]

MiB = 2**20


# ----------------------------------------------------------------------------
# Number formats ("-" for a value not measured)
# ----------------------------------------------------------------------------
def ms(seconds: float | None) -> str:
    """Seconds as milliseconds, one decimal."""
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def mib(nbytes: int | None) -> str:
    """Bytes as MiB, one decimal."""
    return "-" if nbytes is None else f"{nbytes / MiB:.1f}"


def err(value: float | None) -> str:
    """An error in scientific notation."""
    return "-" if value is None else f"{value:.1e}"


def pct(fraction: float | None) -> str:
    """A fraction as a percentage, one decimal."""
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def ratio(value: float | None) -> str:
    """A ratio, two decimals."""
    return "-" if value is None else f"{value:.2f}"


# ----------------------------------------------------------------------------
# Targets
# ----------------------------------------------------------------------------
def check(targets: Mapping[str, tuple[float, str]], name: str, value: float | None,
          label: str = "") -> dict:
    """``value`` against ``targets[name] = (target, op)`` with op ``">="`` or ``"<="``.

    Returns ``{name, label, value, target, op, pass}``; ``pass`` is None when ``value``
    is None (not measured).
    """
    target, op = targets[name]
    if op not in (">=", "<="):
        raise ValueError(f"check: op of target {name!r} must be '>=' or '<=', got {op!r}")
    passed = None if value is None else bool(value >= target if op == ">=" else value <= target)
    return {"name": name, "label": label or name, "value": value, "target": target, "op": op,
            "pass": passed}


def verdict(passed: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "n/a"}[passed]


def format_checks(items: Sequence[dict]) -> str:
    """``Targets:`` then one line per :func:`check` result."""
    if not items:
        return "Targets: none measured."
    lines = ["Targets:"]
    for c in items:
        value = "n/a" if c["value"] is None else f"{c['value']:.4g}"
        lines.append(f"  {c['label']}: {value}   target {c['op']} {c['target']:g}   "
                     f"{verdict(c['pass'])}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Machine and command
# ----------------------------------------------------------------------------
def _git(*args: str) -> str | None:
    """Output of a read-only git command in this checkout, or None outside one."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", *args], cwd=here, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.rstrip() if out.returncode == 0 else None


def _git_state() -> dict:
    """HEAD commit and the tracked files modified since it (numbers may come from them)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    modified = None if status is None else [line[3:] for line in status.splitlines()]
    return {"git_commit": _git("rev-parse", "HEAD") or None, "git_modified": modified}


def json_default(obj):
    """``json.dump`` fallback for reports: dataclasses, arrays, numpy/jax scalars, paths."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if getattr(obj, "ndim", 0) > 0 and hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):  # numpy / jax scalars
        return obj.item()
    return str(obj)


def machine_info() -> dict:
    """Where and when the numbers were taken: platform, CPUs, JAX, devices, date."""
    device = jax.devices()[0]
    try:
        usable_cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable_cpus = os.cpu_count()
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus,
        "jax": jax.__version__,
        "jaxlib": _jaxlib_version(),
        "backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        **_git_state(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _jaxlib_version() -> str | None:
    try:
        import jaxlib

        return jaxlib.__version__
    except (ImportError, AttributeError):
        return None


def machine_line(machine: Mapping) -> str:
    """``Machine: platform, CPUs, backend, jax, commit (and local changes), date.``"""
    files = machine.get("git_modified")
    changes = f" with local changes to {', '.join(files)}" if files else ""
    until = f" to {machine['finished']}" if machine.get("finished") else ""
    return (f"Machine: {machine['platform']}, {machine['usable_cpus']} usable CPUs "
            f"({machine['cpu_count']} total), backend {machine['backend']} "
            f"({machine['device_kind']}), jax {machine['jax']}, commit "
            f"{machine['git_commit']}{changes}, {machine['date']}{until}.")


def join_values(values: Iterable) -> str:
    """``(0.5, 2.0, 64)`` -> ``"0.5,2,64"`` (floats without trailing zeros)."""
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def command_line(words: Sequence[str], flags: Iterable[tuple[str, object]]) -> str:
    """``words`` then each ``(flag, value)``: a bool value writes ``--flag`` or
    ``--no-flag``, a list or tuple is comma-joined, None leaves the flag out. Shell-quoted."""
    args = list(words)
    for flag, value in flags:
        if value is None:
            continue
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list | tuple):
            args += [flag, join_values(value)]
        else:
            args += [flag, str(value)]
    return shlex.join(args)


# ----------------------------------------------------------------------------
# Files and plots
# ----------------------------------------------------------------------------
def write_report(result: dict, out_dir: str, stem: str, markdown: str,
                 plots: Mapping[str, Callable[[dict, str], None]] = ()) -> dict[str, str]:
    """Write ``<stem>.json`` (``result`` plus ``files``), ``<stem>.md`` (``markdown``) and
    ``<name>.png`` for each ``plots[name](result, path)`` into ``out_dir``.

    Returns the files written: ``{"json": path, "md": path, <plot name>: path, ...}``.
    """
    os.makedirs(out_dir, exist_ok=True)
    files = {"json": os.path.join(out_dir, f"{stem}.json"),
             "md": os.path.join(out_dir, f"{stem}.md")}
    for name, plot in dict(plots).items():
        files[name] = os.path.join(out_dir, f"{name}.png")
        plot(result, files[name])
    with open(files["md"], "w") as f:
        f.write(markdown)
    with open(files["json"], "w") as f:
        json.dump({**result, "files": files}, f, indent=2, default=json_default)
    return files


def cli_args(args) -> dict:
    """The plain (int, float, str, tuple, bool) values of an argparse namespace, for a report."""
    return {k: v for k, v in vars(args).items()
            if isinstance(v, (int, float, str, tuple, bool))}


def write_results_json(result: dict, out_dir: str) -> str | None:
    """Write ``result`` to ``<out_dir>/results.json`` and print the path; ``out_dir`` "" or
    "none" writes nothing (returns None)."""
    if out_dir.lower() in ("", "none"):
        return None
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "results.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=json_default)
    print(f"wrote {path}")
    return path


def figure_title(what: str, config: Mapping, machine: Mapping) -> str:
    """``what, B=.. H=.. D=.. causal dtype (backend, N CPUs)`` for a plot."""
    return (f"{what}, B={config['batch']} H={config['heads']} D={config['head_dim']} "
            f"{'causal' if config['causal'] else 'non-causal'} {config['dtype']} "
            f"({machine['backend']}, {machine['usable_cpus']} CPUs)")


def log_axes(ax, ylabel: str, *, xlabel: str = "sequence length T", log_y: bool = True) -> None:
    """Log2 x axis (T), log (or linear) y axis, labels, grid, and a legend if labelled."""
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def heatmap(grid, rows: Sequence[str], cols: Sequence[str], path: str, *, title: str = "",
            label: str = "string_match_all (%)", xlabel: str | None = None,
            ylabel: str | None = None) -> None:
    """Writes a PNG heat map of ``grid`` [len(rows), len(cols)] (percent, 0-100; NaN cells
    left blank) with each value printed in its cell."""
    with require("eval", "lcjax.reporting.heatmap"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = np.asarray(grid, float)
    if grid.shape != (len(rows), len(cols)):
        raise ValueError(f"heatmap: grid shape {grid.shape} != ({len(rows)}, {len(cols)}) "
                         "rows x cols")
    fig, ax = plt.subplots(figsize=(1.6 + 1.0 * len(cols), 1.2 + 0.5 * len(rows)))
    im = ax.imshow(grid, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(cols)), [str(c) for c in cols])
    ax.set_yticks(range(len(rows)), [str(r) for r in rows])
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label=label)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
