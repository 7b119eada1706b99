"""Run the registered experiments and write their reports (JSON, PNGs and an ``index.md``).

Each folder ``experiments/<name>/`` with an ``experiment.py`` that defines
``EXPERIMENT`` (an :class:`experiments.common.Experiment`) is one entry; nothing else
lists them. In quick mode each experiment has a wall-clock budget (``quick_budget_s``,
declared beside it); the runner prints every experiment's wall time against it, and the
budgets add up to at most ``TOTAL_QUICK_BUDGET_S`` (25 minutes on the 2-CPU machine).

A quick run (``make reproduce``) writes ``runs/reports/<name>/quick/`` and
``runs/reports/index.md``: ``runs/`` is not committed, so a fresh clone stays clean after it.
A full run writes ``reports/<name>/`` (the committed record) and keeps there only the claims,
aggregates and figures: every JSON list longer than :data:`ITEM_LIMIT` (per-item records,
per-step curves) is moved to the same path under ``runs/records/`` (the file there keeps
everything) and PNGs are stored with a 64-colour palette, so that ``reports/`` stays under
2 MB (tests/test_records.py). The committed ``reports/index.md`` is rebuilt only on purpose,
with ``--write-index`` (which runs nothing and compacts every folder of ``reports/`` first).
An index is rebuilt from every results.json of its folder (the full result first, the quick
one beside it), so ``--only`` refreshes one experiment's section and keeps the others'.

    python experiments/reproduce.py --quick                # `make reproduce`
    python experiments/reproduce.py                        # the full runs, into reports/
    python experiments/reproduce.py --write-index          # rebuild reports/index.md
    python experiments/reproduce.py --quick --only lm_demo,entmax
    python experiments/reproduce.py --list
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments.common import (  # noqa: E402
    QUICK_REPORTS,
    REPORTS,
    TOTAL_QUICK_BUDGET_S,
    VERDICTS,
    Claim,
    Experiment,
    Result,
    claim_line,
    machine_info,
    records_dir,
    verdict_of,
    write_json,
)


def discover(folder: Path = ROOT / "experiments", package: str = "experiments"
             ) -> list[Experiment]:
    """The ``EXPERIMENT`` of every ``<folder>/<name>/experiment.py``, sorted by folder name."""
    found = []
    for sub in sorted(p for p in folder.iterdir() if (p / "experiment.py").exists()):
        module = importlib.import_module(f"{package}.{sub.name}.experiment")
        exp = getattr(module, "EXPERIMENT", None)
        if not isinstance(exp, Experiment):
            raise TypeError(f"{package}.{sub.name}.experiment must define EXPERIMENT, an "
                            f"experiments.common.Experiment; got {type(exp).__name__}")
        found.append(exp)
    names = [e.name for e in found]
    if len(set(names)) != len(names):
        raise ValueError(f"two experiments share a name: {names}")
    return found


def select(experiments: list[Experiment], only: list[str] | None) -> list[Experiment]:
    """The experiments named in ``only`` (all when None); ValueError naming unknown ones."""
    if not only:
        return list(experiments)
    known = [e.name for e in experiments]
    unknown = [n for n in only if n not in known]
    if unknown:
        raise ValueError(f"--only: unknown experiment(s) {unknown}; known: {known}")
    return [e for e in experiments if e.name in only]


def budget_problems(experiments: list[Experiment]) -> list[str]:
    """What is wrong with the quick budgets: missing ones, a total over the limit."""
    problems = [f"{e.name} declares no quick_budget_s" for e in experiments
                if e.quick_budget_s is None]
    total = sum(e.quick_budget_s or 0 for e in experiments)
    if total > TOTAL_QUICK_BUDGET_S:
        problems.append(f"quick budgets add up to {total:.0f} s > {TOTAL_QUICK_BUDGET_S} s")
    return problems


def budget_verdict(seconds: float, budget: float | None, quick: bool) -> str:
    """``within`` / ``OVER`` the quick budget, or why there is none to compare with."""
    if not quick:
        return "full run (no budget)"
    if budget is None:
        return "no quick budget declared"
    return f"{'within' if seconds <= budget else 'OVER'} its {budget:.0f} s quick budget"


def list_lines(experiments: list[Experiment]) -> list[str]:
    """``--list``: name, quick budget, paper and summary of each experiment."""
    lines = [f"{'name':<16} {'quick budget':>12}  paper — summary"]
    for e in experiments:
        budget = "-" if e.quick_budget_s is None else f"{e.quick_budget_s:.0f} s"
        lines.append(f"{e.name:<16} {budget:>12}  {e.paper} — {e.summary}")
    total = sum(e.quick_budget_s or 0 for e in experiments)
    lines.append(f"{len(experiments)} experiments; quick budgets total {total:.0f} s "
                 f"(limit {TOTAL_QUICK_BUDGET_S} s)")
    return lines + [f"warning: {p}" for p in budget_problems(experiments)]


MODES = ("full", "quick")


def report_dir(out: Path, name: str, quick: bool) -> Path:
    """Where a run's files go: ``out/<name>`` (full) or ``out/<name>/quick`` (quick)."""
    return out / name / "quick" if quick else out / name


def run_one(exp: Experiment, quick: bool, out: Path, command: str) -> tuple[dict, bool]:
    """Run one experiment, write ``results.json`` in its report dir; returns (record, crashed)."""
    print(f"== {exp.name}: {exp.summary}", flush=True)
    start, crashed = time.perf_counter(), False
    dest = report_dir(out, exp.name, quick)
    try:
        res = exp.run(quick, dest)
    except Exception:  # report and go on; the exit code says it failed
        traceback.print_exc()
        crashed = True
        res = Result(claims=[Claim("experiment ran", "no exception", "crashed", False)])
    seconds = time.perf_counter() - start
    for c in res.claims:
        print("   " + claim_line(c), flush=True)
    verdict = budget_verdict(seconds, exp.quick_budget_s, quick)
    print(f"   wall time {seconds:.0f} s ({verdict})", flush=True)
    record = {
        "name": exp.name, "paper": exp.paper, "summary": exp.summary,
        "claims": res.claims, "numbers": res.numbers, "notes": res.notes,
        "figures": [_relative(f, out) for f in res.figures], "seconds": seconds,
        "quick": quick, "quick_budget_s": exp.quick_budget_s,
        "within_budget": None if not quick or exp.quick_budget_s is None
        else seconds <= exp.quick_budget_s,
        "crashed": crashed, "command": command, "machine": machine_info(),
    }
    write_json(dest / "results.json", record)
    compact(dest)
    return record, crashed


# --- what a committed report folder keeps ---------------------------------------------------

ITEM_LIMIT = 50  # a JSON list longer than this holds per-item/per-run records or a curve
MOVED_NOTE = "items: in the untracked copy under runs/records/]"  # what replaces such a list
FLOAT_DIGITS = 6  # significant digits a committed float keeps (the twin keeps them all)
PNG_COLOURS = 64


def split_items(value, limit: int = ITEM_LIMIT, *, top: bool = True):
    """``(kept, moved)``: ``value`` (parsed JSON) with every list longer than ``limit``
    replaced by a one-line note, and whether anything was replaced. A file that is one
    list (``top``) is a table of rows: its rows are looked into, never replaced."""
    if isinstance(value, list):
        if len(value) > limit and not top:
            return f"[{len(value)} {MOVED_NOTE}", True
        pairs = [split_items(v, limit, top=False) for v in value]
        return [k for k, _ in pairs], any(m for _, m in pairs)
    if isinstance(value, dict):
        pairs = {k: split_items(v, limit, top=False) for k, v in value.items()}
        return {k: kv for k, (kv, _) in pairs.items()}, any(m for _, m in pairs.values())
    return value, False


def round_floats(value, digits: int = FLOAT_DIGITS):
    """``value`` (parsed JSON) with every float rounded to ``digits`` significant digits
    (``float(f"{x:.{digits}g}")``: idempotent; ints, bools, nan and inf unchanged)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, list):
        return [round_floats(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: round_floats(v, digits) for k, v in value.items()}
    return value


def compact_json(path: Path, twin: Path) -> bool:
    """Move ``path``'s per-item lists out (:func:`split_items`) and round its floats
    (:func:`round_floats`): when either changes something the whole file is copied to
    ``twin`` first — unless ``path`` was compacted before (it holds a :data:`MOVED_NOTE`;
    its twin then has the lists). ``path`` keeps the rest, indented by one space. Returns
    whether ``path`` changed."""
    text = path.read_text(encoding="utf-8")
    body = json.loads(text)
    kept = round_floats(split_items(body)[0])
    changed = json.dumps(kept) != json.dumps(body)  # (strings: NaN != NaN as floats)
    if changed and MOVED_NOTE not in text:
        twin.parent.mkdir(parents=True, exist_ok=True)
        twin.write_text(text, encoding="utf-8")
    small = json.dumps(kept, indent=1, ensure_ascii=False)
    if small == text:
        return False
    path.write_text(small, encoding="utf-8")
    return True


def compact_png(path: Path, colours: int = PNG_COLOURS) -> bool:
    """Re-store a PNG with a ``colours``-colour palette (no dithering) when that is smaller;
    plots of a few flat colours look the same at a quarter of the size."""
    from PIL import Image

    with Image.open(path) as im:
        if im.mode == "P":
            return False
        dpi = im.info.get("dpi")
        small = im.convert("RGB").quantize(colors=colours, method=Image.Quantize.MEDIANCUT,
                                           dither=Image.Dither.NONE)
    tmp = path.with_suffix(".tmp.png")
    small.save(tmp, format="PNG", optimize=True, **({"dpi": dpi} if dpi else {}))
    if tmp.stat().st_size < path.stat().st_size:
        tmp.replace(path)
        return True
    tmp.unlink()
    return False


def compact(report_dir: Path) -> list[Path]:
    """Make a folder of ``reports/`` fit for committing (its JSON files via
    :func:`compact_json`, its PNGs via :func:`compact_png`); a folder outside ``reports/``
    is left as it is. Returns the files changed."""
    twin = records_dir(report_dir)
    if twin == Path(report_dir).resolve():
        return []
    changed = []
    for path in sorted(Path(report_dir).rglob("*")):
        if path.suffix == ".json" and compact_json(path, twin / path.relative_to(report_dir)):
            changed.append(path)
        elif path.suffix == ".png" and compact_png(path):
            changed.append(path)
    return changed


def _relative(path: Path, out: Path) -> str:
    path = Path(path)
    try:
        return path.resolve().relative_to(out.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def load_records(out: Path, experiments: list[Experiment]) -> dict[str, dict[str, dict]]:
    """Each experiment's last ``results.json`` per mode: ``{name: {"full": rec, "quick": rec}}``
    (a mode without a run is absent)."""
    records = {}
    for exp in experiments:
        records[exp.name] = {}
        for mode in MODES:
            path = report_dir(out, exp.name, mode == "quick") / "results.json"
            if path.exists():
                records[exp.name][mode] = json.loads(path.read_text())
    return records


def _claims_table(records: dict[str, dict[str, dict]]) -> list[str]:
    lines = ["| experiment | run | claim | precondition | target | ours | verdict |",
             "|---|---|---|---|---|---|---|"]
    for name, by_mode in records.items():
        for mode, rec in by_mode.items():
            for c in rec.get("claims", []):
                verdict = verdict_of(c["holds"])
                shown = {"holds": "holds", "fails": "**fails**",
                         "not tested": "*not tested*"}[verdict]
                lines.append(f"| {name} | {mode} | {c['claim']} | {c.get('precondition') or '-'}"
                             f" | {c['target']} | {c['ours']} | {shown} |")
    return lines


def verdict_counts(records: dict[str, dict[str, dict]], paper_of: dict[str, str]
                   ) -> list[str]:
    """Per paper and run mode, how many claims hold, fail and were not tested."""
    lines = ["| paper | experiment | run | " + " | ".join(VERDICTS) + " |",
             "|---|---|---|" + "---|" * len(VERDICTS)]
    for name, by_mode in records.items():
        for mode, rec in by_mode.items():
            counts = dict.fromkeys(VERDICTS, 0)
            for c in rec.get("claims", []):
                counts[verdict_of(c["holds"])] += 1
            lines.append(f"| {paper_of.get(name, '?')} | {name} | {mode} | "
                         + " | ".join(str(counts[v]) for v in VERDICTS) + " |")
    return lines


def _section(exp: Experiment, by_mode: dict[str, dict], out: Path) -> list[str]:
    lines = [f"## {exp.name} — {exp.paper}", "", exp.summary, ""]
    if not by_mode:
        return lines + ["Not run yet: `python experiments/reproduce.py --quick --only "
                        f"{exp.name}`.", ""]
    for mode, rec in by_mode.items():
        lines += [f"### {mode} run", ""] + _run_lines(exp, rec, out)
    return lines


def _run_lines(exp: Experiment, rec: dict, out: Path) -> list[str]:
    lines = []
    m = rec.get("machine", {})
    verdict = budget_verdict(rec["seconds"], rec.get("quick_budget_s"), rec["quick"])
    command = rec.get("command") or ("python experiments/reproduce.py"
                                     + (" --quick" if rec["quick"] else ""))
    when = f" on {m['date']}" if m.get("date") else ""
    lines += [f"Wall time: {rec['seconds']:.0f} s ({verdict}); `{command}`{when}, "
              f"{m.get('platform', '?')} ({m.get('cpu_count', '?')} CPUs, "
              f"jax {m.get('jax', '?')}, backend {m.get('backend', '?')}).", ""]
    if rec.get("notes"):
        lines += [rec["notes"], ""]
    figures = rec.get("figures")
    if figures is None:  # a results.json from before figures were recorded
        run_dir = report_dir(out, exp.name, rec["quick"])
        figures = [p.relative_to(out).as_posix() for p in sorted(run_dir.glob("*.png"))]
    for fig in figures:
        lines += [f"![{Path(fig).stem}]({fig})", ""]
    return lines


def _shown(path: Path) -> str:
    """``path`` relative to the repository when inside it."""
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return Path(path).as_posix()


def write_index(out: Path, experiments: list[Experiment]) -> Path:
    """``out/index.md`` from every experiment's last results (each says how it was run)."""
    records = load_records(out, experiments)
    lines = ["# lcjax — reproduced claims", "",
             f"Index rebuilt {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC} from "
             f"`{_shown(out)}/<experiment>/results.json` (full runs) and "
             f"`{_shown(out)}/<experiment>/quick/results.json` (quick runs; `make reproduce` "
             f"writes them under `{_shown(QUICK_REPORTS)}/`); each section names the command, "
             "machine and date of its numbers. Per-item records and run caches are not "
             f"committed: they are under `{_shown(records_dir(REPORTS))}/`.", "",
             "A verdict is **holds**, **fails** or **not tested**: a claim whose precondition "
             "(e.g. both arms learned the task) was not met is not tested, with the reason, "
             "never \"fails\".", "", "## Verdicts per paper", ""]
    lines += verdict_counts(records, {e.name: e.paper for e in experiments}) + [""]
    lines += ["## Claims", ""] + _claims_table(records) + [""]
    for exp in experiments:
        lines += _section(exp, records[exp.name], out)
    path = out / "index.md"
    path.write_text("\n".join(lines))
    return path


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick set (make reproduce)")
    parser.add_argument("--only", type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                        help="comma-separated names of the experiments to run (see --list)")
    parser.add_argument("--list", action="store_true",
                        help="list the experiments and their quick budgets, run nothing")
    parser.add_argument("--out", type=Path, default=None,
                        help="the report folder (default: reports/ for full runs, "
                             "runs/reports/ for quick ones)")
    parser.add_argument("--write-index", action="store_true",
                        help="run nothing: compact every folder of the report folder and "
                             "rebuild its index.md (the committed reports/index.md is "
                             "rebuilt only this way)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = QUICK_REPORTS if args.quick else REPORTS
    return parser, args


def main(argv=None, experiments: list[Experiment] | None = None) -> int:
    """The command line; ``experiments`` replaces discovery (tests pass fake ones)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, args = parse_args(argv)
    every = discover() if experiments is None else list(experiments)
    if args.list:
        print("\n".join(list_lines(every)))
        return 0
    if args.write_index:
        for sub in sorted(p for p in args.out.iterdir() if p.is_dir()):
            compact(sub)
        print(f"wrote {write_index(args.out, every)}")
        return 0
    try:
        chosen = select(every, args.only)
    except ValueError as e:
        parser.error(str(e))
    if args.quick:
        for problem in budget_problems(every):
            print(f"warning: {problem}", flush=True)
    command = "python experiments/reproduce.py " + " ".join(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    summary, failed = [], []
    for exp in chosen:
        record, crashed = run_one(exp, args.quick, args.out, command.strip())
        summary.append((exp, record["seconds"]))
        if crashed:
            failed.append(exp.name)
    print("== wall times")
    for exp, seconds in summary:
        print(f"   {exp.name:<16} {seconds:7.0f} s  "
              f"{budget_verdict(seconds, exp.quick_budget_s, args.quick)}")
    total = sum(s for _, s in summary)
    print(f"   {'total':<16} {total:7.0f} s" + (f"  (limit {TOTAL_QUICK_BUDGET_S} s)"
                                              if args.quick else ""))
    if args.out.resolve() == REPORTS:
        print(f"{REPORTS / 'index.md'} not rebuilt (committed; rebuild it on purpose with "
              "`python experiments/reproduce.py --write-index`)")
    else:
        print(f"wrote {write_index(args.out, every)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
