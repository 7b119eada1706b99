"""UPipe at pod scale, measured by the TPU compiler (libtpu, compile-only, from a CPU host).

Claims checked against the paper's headline (an 8B model trains on 5M tokens on one 8-GPU
node; UPipe reaches +25% longer context than prior context-parallel methods):

- Llama-3-8B shapes (d 4096, 32/8 heads, head_dim 128, MLP 14336, 32 layers, bf16) on
  ``v5p:2x2x2`` (8 chips, 95 GiB HBM each): one decoder layer (attention + MLP) fwd+bwd
  per strategy (Ulysses, Ring, UPipe, USP) — per-chip bytes at 128K and the largest T that
  fits; then the whole training step (scan over 32 layers, remat of layer inputs, AdamW
  state sharded, :func:`lcjax.compile_report.train_step`) — the largest T each strategy
  trains on 8 chips. UPipe's largest T / Ulysses' ≥ 1.25 is the paper's +25%.
- Llama-3-70B shapes (d 8192, 64/8 heads, MLP 28672, 80 layers) on ``v5p:4x4x4``
  (64 chips): the same, as far as the compile budget allows.

The largest T is a search on compiled memory: the total bytes per chip are measured at two
lengths (T0, 2 T0), the straight line through them predicts the largest T on the grid
(multiples of ``step``) under the chip's HBM, that T and the next grid point are compiled,
and then bisection (doubling while nothing above fails) narrows the bracket to one grid
step, at most ``BISECT_ROUNDS`` rounds (a fit = total bytes ≤ HBM and no HBM overflow error
from the compiler). ``exact`` says whether the answer was bracketed to one grid step; the
report says "predicted" or "lower bound" otherwise. Each compile runs in its own
subprocess (libtpu's memory is returned); one compile of an 8B layer takes ~20 s on a quiet
2-core host (and up to half an hour when the host is loaded).

    python -m experiments.upipe.tpu --full --out-dir reports/upipe/tpu     # the report
    python -m experiments.upipe.tpu                                         # --quick
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from experiments.common import Claim, Result, machine_info, not_tested, write_json

ROOT = Path(__file__).resolve().parents[2]
GiB = 1 << 30
PAPER_TOKENS_8B = 5_000_000  # the paper's headline: 8B model, one 8-GPU node
T0 = STEP = 131072
# (model, topology, target, strategies), in priority order
STRATEGIES = ("ulysses", "upipe", "ring", "usp")
# targets: one decoder layer; the whole training step (layer inputs kept in HBM, MLP
# whole); the step with the long-context recipe of ALST, which the UPipe paper's runs build
# on: saved layer inputs offloaded to host memory, MLP tiled over 4,096-token chunks
RECIPES = {"layer": {"target": "layer"}, "step": {"target": "step"},
           "step-offload": {"target": "step", "offload": True, "mlp_chunk": 4096},
           # 64 chips as the paper's 70B layout: an 8-way context axis (C = 8, so UPipe has
           # H / C = 8 head stages) beside an 8-way data axis, 8 sequences of T each
           "layer-c8": {"target": "layer", "mesh_axes": [("data", 8), ("context", 8)],
                        "batch": 8}}
FULL = [
    ("llama3-8b", "v5p:2x2x2", "layer", STRATEGIES),
    ("llama3-8b", "v5p:2x2x2", "step", STRATEGIES),
    ("llama3-8b", "v5p:2x2x2", "step-offload", STRATEGIES),
    ("llama3-70b", "v5p:4x4x4", "layer", STRATEGIES),
    ("llama3-70b", "v5p:4x4x4", "step", STRATEGIES),
    ("llama3-70b", "v5p:4x4x4", "layer-c8", ("ulysses", "upipe")),
]
QUICK = [("llama3-8b", "v5p:2x2x2", "layer", ("ulysses", "upipe"))]
PARALLEL = 2  # compiles at once (one subprocess each, ~1 GiB of host memory; 2-core host)
BISECT_ROUNDS = 3  # at most this many rounds of bisection after the prediction


def measure(model: str, topology: str, target: str, strategy: str, seq_len: int) -> dict:
    """One compile's report (compact), or the pre-compile refusal as a non-fit."""
    from lcjax.compile_report import compile_report

    key = {"model": model, "topology": topology, "target": target, "strategy": strategy,
           "seq_len": seq_len}
    try:
        rep = compile_report(model, topology=topology, seq_len=seq_len, strategy=strategy,
                             **RECIPES[target])
    except ValueError as err:
        return {**key, "fits": False, "refused": str(err), "compile_s": 0.0}
    mem = rep["memory"] or {}
    return {**key, "fits": rep["fits"], "compile_s": round(rep["compile_s"], 1),
            "total_bytes": mem.get("total_bytes"), "temp_bytes": mem.get("temp_bytes"),
            "argument_bytes": mem.get("argument_bytes"), "hbm_bytes": mem.get("hbm_bytes"),
            "host_bytes": mem.get("host_bytes"),
            "collectives": rep["collectives"], "error": rep.get("error"), "mesh": rep["mesh"]}


def _spawn(job: tuple, points_file: Path) -> dict:
    """One compile in a subprocess (libtpu's memory is returned), appended to
    ``points_file`` (JSON lines) as soon as it is done."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        env = dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_WORKER_HOSTNAMES="localhost",
                   JAX_PLATFORMS="cpu")
        cmd = [sys.executable, "-m", "experiments.upipe.tpu", "--worker", json.dumps(job),
               "--out", str(out)]
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            keys = ("model", "topology", "target", "strategy", "seq_len")
            point = {**dict(zip(keys, job)), "fits": None,
                     "error": " | ".join(proc.stderr.strip().splitlines()[-3:])}
        else:
            point = json.loads(out.read_text())
    with open(points_file, "a") as f:
        f.write(json.dumps(point) + "\n")
    mem = f"{point['total_bytes'] / GiB:.2f} GiB" if point.get("total_bytes") else "-"
    print(f"  {job}: {mem} fits={point['fits']} ({point.get('compile_s')} s)", flush=True)
    return point


def predict(points: list[dict], step: int = STEP) -> int | None:
    """Largest T on the grid under HBM by the straight line through the two shortest
    measured lengths' total bytes (memory is affine in T at fixed shapes)."""
    have = sorted((p for p in points if p.get("total_bytes")), key=lambda p: p["seq_len"])
    if len(have) < 2:
        return None
    a, b = have[0], have[1]
    slope = (b["total_bytes"] - a["total_bytes"]) / (b["seq_len"] - a["seq_len"])
    if slope <= 0:
        return None
    return int(a["seq_len"] + (a["hbm_bytes"] - a["total_bytes"]) / slope) // step * step


def _bounded_line(points: list[dict], cap: float | None) -> float | None:
    """:func:`line_estimate` (HBM), capped by the host-memory bound ``cap`` where known."""
    line = line_estimate(points)
    if line is None or cap is None:
        return line
    return min(line, cap)


def line_estimate(points: list[dict]) -> float | None:
    """The continuous T at which total bytes per chip reach the chip's HBM, on the straight
    line through the two longest lengths whose total the compiler reported (a fit, or a
    program over HBM that it still sized; no grid): what the compiler would allow at a finer
    grid, since memory is nearly affine in T at fixed shapes."""
    have = sorted((p for p in points if p.get("total_bytes")), key=lambda p: p["seq_len"])
    if len(have) < 2:
        return None
    a, b = have[-2], have[-1]
    slope = (b["total_bytes"] - a["total_bytes"]) / (b["seq_len"] - a["seq_len"])
    if slope <= 0:
        return None
    return b["seq_len"] + (b["hbm_bytes"] - b["total_bytes"]) / slope


_HOST_LIMIT_RE = re.compile(r"would exceed memory \(size=(\d+)\).*inlined_call_operand\.host")


def host_cap(points: list[dict]) -> float | None:
    """The largest T the host's memory allows when layer inputs are offloaded: the
    compiler's host limit per chip (from its RESOURCE_EXHAUSTED message on a host buffer)
    over the host bytes per token of a compile that fits (they are exactly linear in T:
    L x T/chips x d x 2). None where no compile hit the host limit."""
    limits = [int(m.group(1)) for p in points
              if (m := _HOST_LIMIT_RE.search(p.get("error") or ""))]
    per_token = [p["host_bytes"] / p["seq_len"] for p in points
                 if p.get("fits") and p.get("host_bytes")]
    if not limits or not per_token:
        return None
    return min(limits) / max(per_token)


def summarise(points: list[dict], step: int = STEP) -> list[dict]:
    """Per (model, topology, target, strategy): the largest measured T that fits, the
    smallest that does not, the prediction, and whether they bracket one grid step."""
    groups, same_target = {}, {}
    for p in points:
        groups.setdefault((p["model"], p["topology"], p["target"], p["strategy"]), []).append(p)
        same_target.setdefault((p["model"], p["topology"], p["target"]), []).append(p)
    # the host bound is the same for every strategy of a target (host bytes per token are
    # L x d x 2 / chips whatever the attention), so one compile that hits it bounds all
    caps = {key: host_cap(pts) for key, pts in same_target.items()}
    rows = []
    for (model, topo, target, strategy), pts in groups.items():
        pts = sorted(pts, key=lambda p: p["seq_len"])
        fit = [p["seq_len"] for p in pts if p.get("fits")]
        bad = [p["seq_len"] for p in pts if p.get("fits") is False]
        lo = max(fit) if fit else None
        hi = min((t for t in bad if lo is None or t > lo), default=None)
        rows.append({"model": model, "topology": topo, "target": target,
                     "strategy": strategy, "max_len": lo, "upper": hi,
                     "exact": lo is not None and hi is not None and hi - lo <= step,
                     "predicted": predict(pts, step), "hbm_line": line_estimate(pts),
                     "line": _bounded_line(pts, caps[(model, topo, target)]),
                     "host_cap": caps[(model, topo, target)],
                     "step": step, "points": pts})
    order = {s: i for i, s in enumerate(("ulysses", "upipe", "ring", "usp"))}
    return sorted(rows, key=lambda r: (r["model"], r["target"], order[r["strategy"]]))


def largest(row: dict) -> tuple[int | None, str]:
    """(largest T, how it is known): bracketed to one grid step by compiles ("exact"), or
    the line's prediction where no compile above the largest measured fit was made
    ("predicted"), else the largest measured fit ("lower bound")."""
    if row.get("exact"):
        return row["max_len"], "exact"
    pred = row.get("predicted")
    if pred is not None and pred > (row.get("max_len") or 0) and (
            row.get("upper") is None or pred < row["upper"]):
        return pred, "predicted"
    return row.get("max_len"), "lower bound"


def _stages(row: dict) -> int:
    """UPipe's head stages P = H / C of a row (query heads over the context axis)."""
    from lcjax.compile_report import MODELS

    mesh = next((p.get("mesh") for p in row["points"] if p.get("mesh")), None) or {}
    return MODELS[row["model"]].num_heads // max(1, mesh.get("context", 1))


def claims(rows: list[dict]) -> list[Claim]:
    """UPipe ≥ 1.25x Ulysses' largest T (per model and target), decided by the continuous
    line estimates (:func:`line_estimate`; the 128K grid quantises the ratio by ~4%), the
    grid figures beside them; 8B step ≥ 5M tokens."""
    found = {(r["model"], r["target"], r["strategy"]): r for r in rows}
    out = []
    pre = "both largest T known from compiles: a fit within one grid step of the line, or a line"
    for model, target in sorted({(r["model"], r["target"]) for r in rows}):
        u, p = found.get((model, target, "ulysses")), found.get((model, target, "upipe"))
        if not u or not p:
            continue
        (tu, ku), (tp, kp) = largest(u), largest(p)
        claim = f"{model} {target} fwd+bwd: UPipe largest T / Ulysses' on {u['topology']}"
        stages = _stages(p)
        if stages < 2:
            out.append(not_tested(claim, ">= 1.25x (paper: +25%)",
                                  f"UPipe has {stages} stage (H / C = 1): it is Ulysses",
                                  "UPipe has >= 2 head stages (H / C >= 2)"))
            continue
        if not (u.get("line") and p.get("line")):
            out.append(not_tested(claim, ">= 1.25x (paper: +25%)",
                                  "fewer than two fitting compiles per strategy", pre))
            continue
        cap = p.get("host_cap")
        if cap and p["line"] >= cap and u["line"] >= cap:
            out.append(not_tested(
                claim, ">= 1.25x (paper: +25%)",
                f"host memory caps both at {cap / 1e6:.2f}M tokens (the offloaded layer "
                f"inputs); by HBM alone {p['hbm_line'] / 1e6:.2f}M / {u['hbm_line'] / 1e6:.2f}M "
                f"= {p['hbm_line'] / u['hbm_line']:.2f}x", "HBM, not host memory, bounds T"))
            continue
        ratio = p["line"] / u["line"]
        if cap and max(p["line"], u["line"]) >= cap:  # one of them stops at the host bound
            grid_hbm = p["hbm_line"] / u["hbm_line"]
            claim += (f" (host memory caps at {cap / 1e6:.2f}M; by HBM alone "
                      f"{p['hbm_line'] / 1e6:.2f}M / {u['hbm_line'] / 1e6:.2f}M = {grid_hbm:.2f}x)")
        grid = (f"; on the 128K grid by compiles {tp / tu:.2f}x ({tp} / {tu})"
                if ku == kp == "exact" else "")
        out.append(Claim(claim, ">= 1.25x (paper: +25%)",
                         f"{ratio:.2f}x by the lines ({p['line'] / 1e6:.2f}M / "
                         f"{u['line'] / 1e6:.2f}M tokens){grid}", ratio >= 1.25, pre))
    steps = [r for r in rows if r["model"] == "llama3-8b" and r["target"].startswith("step")]
    if steps:
        fit = max(steps, key=lambda r: r["max_len"] or 0)
        line = max(steps, key=lambda r: r.get("line") or 0)
        claim = ("llama3-8b training step on 8 chips (v5p:2x2x2): largest T of any strategy, "
                 "by a compile that fits")
        ours = (f"{fit['max_len']} compiled ({fit['strategy']}, {fit['target']}); line "
                f"estimate {(line.get('line') or 0) / 1e6:.2f}M ({line['strategy']}, "
                f"{line['target']})")
        target = f">= {PAPER_TOKENS_8B} tokens (paper, 8x H100)"
        if (fit["max_len"] or 0) >= PAPER_TOKENS_8B:
            out.append(Claim(claim, target, ours, True))
        elif (line.get("line") or 0) >= PAPER_TOKENS_8B:
            out.append(not_tested(claim, target, f"only the line reaches it: {ours}",
                                  "a compile that fits at >= 5M tokens"))
        else:
            out.append(Claim(claim, target, ours, False))
    return out


def table(rows: list[dict]) -> str:
    """Markdown: per-chip bytes at each measured T, the largest T and how it is known."""
    lines = ["| model | topology | target | strategy | measured: T -> total GiB/chip (temp), "
             "compile s | largest T | how | line estimate |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pts = []
        for p in r.get("points") or []:
            if p.get("total_bytes"):
                pts.append(f"{p['seq_len'] // 1024}K -> {p['total_bytes'] / GiB:.2f} "
                           f"({p['temp_bytes'] / GiB:.2f}), {p['compile_s']:.0f} s")
            else:
                pts.append(f"{p['seq_len'] // 1024}K -> "
                           + ("no fit" if p.get("fits") is False else "error"))
        t, kind = largest(r)
        lines.append(f"| {r['model']} | {r['topology']} | {r['target']} | {r['strategy']} | "
                     f"{'; '.join(pts)} | {t} | {kind} | "
                     + (f"{r['line'] / 1e6:.2f}M |" if r.get("line") else "- |"))
    return "\n".join(lines)


def bisect_jobs(rows: list[dict], step: int = STEP) -> list[tuple]:
    """The next compile of each row not yet bracketed to one grid step: the grid midpoint
    of (largest fit, smallest non-fit), or twice the largest fit while nothing above it
    has failed. Rows with no fit at all, or whose last compile errored, are left."""
    jobs = []
    for row in rows:
        lo, hi = row["max_len"], row["upper"]
        if row["exact"] or lo is None:
            continue
        if any(p.get("fits") is None for p in row["points"]):
            continue  # a compile that errored (not an HBM overflow): no search on it
        nxt = 2 * lo if hi is None else (lo + hi) // 2 // step * step
        if nxt > lo:
            jobs.append((row["model"], row["topology"], row["target"], row["strategy"], nxt))
    return jobs


def search(entry: tuple, points_file: Path, known: list[dict], quick: bool,
           line_only: bool = False) -> list[dict]:
    """One (model, topology, target, strategy)'s compiles, in series: T0 and 2 T0 (quick:
    T0 only), the line's predicted largest T and one grid step above it, then bisection
    (:func:`bisect_jobs`). Points already in ``known`` are reused, not compiled again.
    ``line_only``: stop after T0 and 2 T0 (the largest T is then the line's prediction).
    A fitting compile at millions of tokens takes ~25 min on a loaded 2-core host."""
    have = {p["seq_len"]: p for p in known if _entry(p) == entry}

    def measure_at(seq_len: int) -> dict:
        if seq_len not in have:
            have[seq_len] = _spawn((*entry, seq_len), points_file)
        return have[seq_len]

    for seq_len in (T0,) if quick else (T0, 2 * T0):
        measure_at(seq_len)
    if quick or line_only:
        return list(have.values())
    (row,) = summarise(list(have.values()))
    pred = row["predicted"]
    if pred is not None and pred > (row["max_len"] or 0):
        measure_at(pred)
        measure_at(pred + STEP)
    for _ in range(BISECT_ROUNDS):
        jobs = bisect_jobs(summarise(list(have.values())))
        if not jobs:
            break
        measure_at(jobs[0][-1])
    return list(have.values())


def _entry(point: dict) -> tuple:
    return (point["model"], point["topology"], point["target"], point["strategy"])


def run(quick: bool, out_dir: Path, plan=None, resume: bool = False,
        line_only: bool = False, parallel: int = PARALLEL) -> Result:
    """Every entry of ``plan`` searched by :func:`search`, ``PARALLEL`` entries at a time in
    the plan's order (so the first rows finish first); every point appended to
    ``out_dir/points.jsonl`` when done. ``resume``: reuse the points already in that file."""
    plan = plan or (QUICK if quick else FULL)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    points_file = out_dir / "points.jsonl"
    known = []
    if resume and points_file.exists():
        known = [json.loads(line) for line in points_file.read_text().splitlines()
                 if line.strip()]
    else:
        points_file.write_text("")
    start = time.perf_counter()
    entries = [(m, topo, tgt, s) for m, topo, tgt, strategies in plan for s in strategies]
    with ThreadPoolExecutor(parallel) as pool:
        found = pool.map(lambda e: search(e, points_file, known, quick, line_only), entries)
        points = [p for pts in found for p in pts]
    return report(points, quick, out_dir, time.perf_counter() - start)


def report(points: list[dict], quick: bool, out_dir: Path, seconds: float,
           note: str = "") -> Result:
    """Claims, ``tpu.json`` and ``tpu.md`` from the measured points (``note``: how the
    run went, printed under the command)."""
    rows = summarise(points)
    result = Result(claims=claims(rows))
    by = {(r["model"], r["target"], r["strategy"]): r for r in rows}
    u, p = by.get(("llama3-8b", "layer", "ulysses")), by.get(("llama3-8b", "layer", "upipe"))
    u0 = next((q for q in (u or {}).get("points", []) if q["seq_len"] == T0), {})
    p0 = next((q for q in (p or {}).get("points", []) if q["seq_len"] == T0), {})
    if u0.get("temp_bytes") and p0.get("temp_bytes"):
        ratio = p0["temp_bytes"] / u0["temp_bytes"]
        result.claims.append(Claim(
            "llama3-8b decoder layer fwd+bwd at T=128K on v5p:2x2x2: UPipe temp / Ulysses'",
            "< 1 (UPipe holds one head per chip per stage)",
            f"{ratio:.2f} ({p0['temp_bytes'] / GiB:.2f} / {u0['temp_bytes'] / GiB:.2f} GiB)",
            ratio < 1))
    result.numbers = {"rows": rows, "seconds": seconds, "machine": machine_info(),
                      "quick": quick, "t0": T0, "step": STEP, "note": note}
    result.notes = ("Compile-only (libtpu's TPU compiler) from a 2-core CPU host; fits = "
                    "total bytes per chip <= HBM and no compiler HBM overflow.")
    write_json(out_dir / "tpu.json", result.numbers)
    (out_dir / "tpu.md").write_text(
        "# UPipe at pod scale — TPU compiler (compile-only)\n\n"
        f"Command: `python -m experiments.upipe.tpu{'' if quick else ' --full'} --out-dir "
        f"{out_dir}` ({seconds:.0f} s)\n\n" + (f"{note}\n\n" if note else "")
        + table(rows) + "\n\n" + "\n".join(
            f"- **{c.verdict}** {c.claim}: {c.ours} (target {c.target})"
            for c in result.claims) + "\n")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--only", default=None, help="models, comma-separated")
    parser.add_argument("--targets", default=None, help="layer,step (default both)")
    parser.add_argument("--report-only", action="store_true",
                        help="rebuild tpu.md/tpu.json from --out-dir/points.jsonl")
    parser.add_argument("--note", default="", help="with --report-only: how the run went")
    parser.add_argument("--out-dir", default=None, help="default: a temporary directory")
    parser.add_argument("--line-only", action="store_true",
                        help="compile T0 and 2 T0 only; the largest T is the line's prediction")
    parser.add_argument("--parallel", type=int, default=PARALLEL, help="compiles at once")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the points already in --out-dir/points.jsonl")
    args = parser.parse_args()
    if args.worker:
        Path(args.out).write_text(json.dumps(measure(*json.loads(args.worker))))
    elif args.report_only:
        d = Path(args.out_dir)
        pts = [json.loads(line) for line in (d / "points.jsonl").read_text().splitlines()
               if line.strip()]
        r = report(pts, not args.full, d, float("nan"), args.note)
        for c in r.claims:
            print(f"{c.verdict}: {c.claim}: {c.ours} (target {c.target})")
    else:
        plan = QUICK if not args.full else FULL
        if args.only:
            plan = [p for p in plan if p[0] in args.only.split(",")]
        if args.targets:
            plan = [p for p in plan if p[2] in args.targets.split(",")]
        r = run(not args.full, Path(args.out_dir or tempfile.mkdtemp(prefix="upipe-tpu-")),
                plan, resume=args.resume, line_only=args.line_only, parallel=args.parallel)
        for c in r.claims:
            print(f"{c.verdict}: {c.claim}: {c.ours} (target {c.target})")
