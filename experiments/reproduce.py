"""Run every registered experiment and write ``reports/index.md`` (+ JSON and PNGs).

Each folder ``experiments/<name>/`` with an ``experiment.py`` that defines
``EXPERIMENT`` (an :class:`experiments.common.Experiment`) is one entry.

    python experiments/reproduce.py --quick            # `make reproduce`
    python experiments/reproduce.py --only lm_demo     # one experiment
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments.common import Claim, Experiment, Result, machine_info, write_json  # noqa: E402


def discover() -> list[Experiment]:
    found = []
    for folder in sorted((ROOT / "experiments").iterdir()):
        if (folder / "experiment.py").exists():
            module = importlib.import_module(f"experiments.{folder.name}.experiment")
            found.append(module.EXPERIMENT)
    return found


def _claims_table(rows: list[tuple[str, Claim]]) -> list[str]:
    lines = ["| experiment | claim | target | ours | holds |", "|---|---|---|---|---|"]
    for name, c in rows:
        lines.append(f"| {name} | {c.claim} | {c.target} | {c.ours} | "
                     f"{'yes' if c.holds else '**no**'} |")
    return lines


def write_index(out: Path, results: dict[str, tuple[Experiment, Result, float]], quick: bool):
    info = machine_info()
    lines = [
        "# lcjax — reproduced claims",
        "",
        f"Generated {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC} by "
        f"`python experiments/reproduce.py{' --quick' if quick else ''}` on "
        f"{info['platform']} ({info['cpu_count']} CPUs, jax {info['jax']}, "
        f"backend {info['backend']}).",
        "",
    ]
    rows = [(name, c) for name, (_, r, _) in results.items() for c in r.claims]
    lines += _claims_table(rows) + [""]
    for name, (exp, res, seconds) in results.items():
        lines += [f"## {name} — {exp.paper}", "", exp.summary, "",
                  f"Wall time: {seconds:.0f} s.", ""]
        if res.notes:
            lines += [res.notes, ""]
        for fig in res.figures:
            lines += [f"![{fig.stem}]({fig.relative_to(out).as_posix()})", ""]
    (out / "index.md").write_text("\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick set (make reproduce)")
    parser.add_argument("--only", nargs="*", help="names of experiments to run")
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results, failed = {}, []
    for exp in discover():
        if args.only and exp.name not in args.only:
            continue
        print(f"== {exp.name}: {exp.summary}", flush=True)
        start = time.perf_counter()
        try:
            res = exp.run(args.quick, args.out / exp.name)
        except Exception:  # report and go on; the exit code says it failed
            traceback.print_exc()
            failed.append(exp.name)
            res = Result(claims=[Claim("experiment ran", "no exception", "crashed", False)])
        seconds = time.perf_counter() - start
        results[exp.name] = (exp, res, seconds)
        for c in res.claims:
            print(f"   [{'HOLDS' if c.holds else 'FAILS'}] {c.claim}: ours {c.ours} "
                  f"(target {c.target})", flush=True)
        write_json(args.out / exp.name / "results.json",
                   {"claims": res.claims, "numbers": res.numbers, "seconds": seconds,
                    "quick": args.quick, "machine": machine_info()})
    write_index(args.out, results, args.quick)
    print(f"wrote {args.out / 'index.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
