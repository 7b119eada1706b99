"""Device check of every Pallas kernel: compile, compare with the XLA path, time.

Every registered attention spec (``lcjax.attention.specs()``) with an implementation
named ``"pallas"`` is a kernel; adding a kernel to the registry adds it here. For each:

1. correctness: ``spec(q, k, v, implementation="pallas", **spec.test_options)`` against
   ``implementation="xla"`` on random inputs, in float32 and bfloat16, causal and not
   (where the kernel supports it), forward and the gradients of
   ``L = Σ out ⊙ c`` (c a random cotangent) with respect to q, k and v, both from one
   compiled program per path (``jax.value_and_grad``, the output as aux). Errors are
   ``max |a - b|`` and that divided by ``max |b|`` (b = the XLA path); a row is ``ok``
   when the relative error is within ``spec.tolerance[dtype]`` (forward) and 10× that
   (gradients: one more matmul and a different summation order).
2. timing (bfloat16, causal, B=1, H=8, D=128, T = 4K ... 64K on a device): medians of
   compiled calls after a warm-up (``lcjax.bench.timing``), forward and forward+backward,
   for the kernel, its XLA path and ``jax.nn.dot_product_attention``
   (``implementation="cudnn"`` on GPU, ``"xla"`` elsewhere).

The run is one command that fits a time budget (``--time-budget`` seconds from start):
a measurement is skipped (and the reason recorded) when the previous length's time,
scaled by (T/T_prev)² (and never less than the slowest compile so far), would not fit
what is left, when a shorter length already failed
(out of memory, say), or when XLA's compiled temporaries exceed the device memory. The
report ``reports/gpu/<date>-<device>.{json,md}`` is rewritten after every row, and a
watchdog thread writes it and exits at budget + ``--grace`` seconds, so a run that is cut
short still leaves a report (status says why).

    python experiments/gpu_check.py --time-budget 420   # on the device: about 8 minutes
    python experiments/gpu_check.py --cpu-smoke         # CPU, interpret mode, tiny shapes
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import itertools
import json
import os
import re
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from lcjax import attention  # noqa: E402
from lcjax.bench.timing import (  # noqa: E402
    compile_fn,
    json_default,
    machine_info,
    temp_bytes,
    time_compiled,
)

KERNEL = "pallas"
BASELINE = "jax.nn.dot_product_attention"
GRAD_TOLERANCE_FACTOR = 10.0


@dataclasses.dataclass(frozen=True)
class Plan:
    """Shapes and repeats of one run.

    check: (batch, q_len, heads, head_dim) of the correctness inputs (kv heads = heads // 2
    where the kernel supports grouped-query attention). lengths: the timed T, with
    ``batch`` x T x ``heads`` x ``head_dim`` inputs of ``time_dtype``, causal.
    """

    check: tuple[int, int, int, int]
    lengths: tuple[int, ...]
    batch: int
    heads: int
    head_dim: int
    repeats: int
    warmup: int = 1
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    causal: tuple[bool, ...] = (True, False)
    time_dtype: str = "bfloat16"
    check_share: float = 0.4  # of the budget the correctness phase may use


DEVICE_PLAN = Plan(check=(2, 256, 4, 64), lengths=(4096, 8192, 16384, 32768, 65536),
                   batch=1, heads=8, head_dim=128, repeats=5)
SMOKE_PLAN = Plan(check=(1, 32, 2, 16), lengths=(32, 64), batch=1, heads=2, head_dim=16,
                  repeats=2)


class Clock:
    """Seconds since the run started, against a budget."""

    def __init__(self, budget_s: float):
        self.start, self.budget_s = time.perf_counter(), float(budget_s)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> float:
        return self.budget_s - self.elapsed()


class Report:
    """The JSON + markdown report, rewritten (atomically) after every row."""

    def __init__(self, stem: Path, header: dict):
        self.stem, self.lock = stem, threading.Lock()
        self.data = {"header": header, "status": "running", "current": None,
                     "correctness": [], "timing": []}
        self.save()

    def add(self, section: str, row: dict) -> None:
        with self.lock:
            self.data[section].append(row)
        self.save()

    def set(self, **fields) -> None:
        with self.lock:
            self.data.update(fields)
        self.save()

    def save(self) -> None:
        with self.lock:
            text = json.dumps(self.data, indent=2, default=json_default)
            markdown = render_markdown(self.data)
            self.stem.parent.mkdir(parents=True, exist_ok=True)
            for suffix, body in ((".json", text), (".md", markdown)):
                tmp = self.stem.with_suffix(suffix + ".tmp")
                tmp.write_text(body)
                os.replace(tmp, self.stem.with_suffix(suffix))


# ----------------------------------------------------------------------------
# What to check
# ----------------------------------------------------------------------------
def kernel_specs(names: list[str] | None = None) -> list:
    """Registered specs with a ``"pallas"`` implementation (only ``names`` if given)."""
    found = [s for s in attention.specs() if KERNEL in s.implementation_names]
    if names:
        unknown = sorted(set(names) - {s.name for s in found})
        if unknown:
            raise ValueError(f"--specs: {unknown} have no {KERNEL!r} implementation; kernels: "
                             f"{[s.name for s in found]}")
        found = [s for s in found if s.name in names]
    return found


def baseline_implementation() -> str:
    """``jax.nn.dot_product_attention``'s implementation we time: cuDNN on GPU."""
    return "cudnn" if jax.default_backend() == "gpu" else "xla"


def device_slug() -> str:
    """``jax.devices()[0].device_kind`` as a file-name part, e.g. ``nvidia-h200``."""
    kind = jax.devices()[0].device_kind
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-") or "device"


def qkv(shape, kv_heads: int, dtype: str, seed: int):
    """Random q [B, T, H, D], k, v [B, T, Hkv, D] and a float32 cotangent [B, T, H, D]."""
    b, t, h, d = shape
    kq, kk, kv, kc = jax.random.split(jax.random.key(seed), 4)
    dt_ = jnp.dtype(dtype)
    return (jax.random.normal(kq, (b, t, h, d), dt_),
            jax.random.normal(kk, (b, t, kv_heads, d), dt_),
            jax.random.normal(kv, (b, t, kv_heads, d), dt_),
            jax.random.normal(kc, (b, t, h, d), jnp.float32))


def attention_fn(spec, implementation: str, options: dict, causal: bool):
    """``(q, k, v) -> out`` of one implementation of ``spec``."""
    return lambda q, k, v: spec(q, k, v, causal=causal, implementation=implementation,
                                **options)


def baseline_fn(implementation: str, causal: bool):
    """``jax.nn.dot_product_attention`` with ``implementation`` (BTHD, as ours)."""
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                        implementation=implementation)


def grad_fn(fn):
    """``(q, k, v, c) -> (dq, dk, dv)``, the gradients of ``Σ fn(q, k, v) ⊙ c``."""
    loss = lambda q, k, v, c: jnp.sum(fn(q, k, v).astype(jnp.float32) * c)
    return jax.grad(loss, argnums=(0, 1, 2))


def value_and_grad_fn(fn):
    """``(q, k, v, c) -> (out, (dq, dk, dv))``: the output of ``fn`` and the gradients of
    ``Σ fn(q, k, v) ⊙ c`` from one program (the correctness check compiles once per path;
    the timing rows keep ``fn`` and :func:`grad_fn` apart)."""
    def loss(q, k, v, c):
        out = fn(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * c), out

    value_and_grad = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)

    def out_and_grads(q, k, v, c):
        (_, out), grads = value_and_grad(q, k, v, c)
        return out, grads

    return out_and_grads


def errors(ours, ref) -> dict:
    """``max |ours - ref|``, ``max |ref|`` and their ratio, in float32."""
    ours, ref = jnp.asarray(ours, jnp.float32), jnp.asarray(ref, jnp.float32)
    max_abs = float(jnp.max(jnp.abs(ours - ref)))
    ref_max = float(jnp.max(jnp.abs(ref)))
    return {"max_abs": max_abs, "ref_max": ref_max, "rel": max_abs / max(ref_max, 1e-30)}


def error_message(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= 400 else text[:400] + " ..."


# ----------------------------------------------------------------------------
# Correctness
# ----------------------------------------------------------------------------
def check_cases(spec, plan: Plan) -> list[tuple[str, bool]]:
    """(dtype, causal) pairs to check, most important first, within the kernel's features."""
    feats = spec.features_of(KERNEL)
    causals = [c for c in plan.causal if (feats.causal if c else feats.non_causal)]
    return [(d, c) for c in causals for d in plan.dtypes if d in feats.dtypes]


def check_order(specs, plan: Plan) -> list[tuple[object, str, bool]]:
    """(spec, dtype, causal) rows, every kernel's first case before any kernel's second, so a
    phase cut short by the budget still covers each kernel's most important case."""
    per_spec = [[(s, d, c) for d, c in check_cases(s, plan)] for s in specs]
    return [row for rank in itertools.zip_longest(*per_spec) for row in rank if row]


def check_one(spec, dtype: str, causal: bool, plan: Plan, seed: int = 0) -> dict:
    """Forward and gradient errors of the kernel against the XLA path (one row)."""
    b, t, h, d = plan.check
    kv_heads = h // 2 if spec.features_of(KERNEL).gqa and h % 2 == 0 else h
    q, k, v, c = qkv(plan.check, kv_heads, dtype, seed)
    opts = dict(spec.test_options)
    row = {"spec": spec.name, "dtype": dtype, "causal": causal,
           "shape": {"q": list(q.shape), "kv": list(k.shape)}, "options": opts}
    start = time.perf_counter()
    outs, grads = {}, {}
    for impl in (KERNEL, "xla"):  # one compiled program per path gives output and gradients
        fn = attention_fn(spec, impl, opts, causal)
        outs[impl], grads[impl] = jax.block_until_ready(
            jax.jit(value_and_grad_fn(fn))(q, k, v, c))
    row["seconds"] = time.perf_counter() - start
    row["fwd"] = errors(outs[KERNEL], outs["xla"])
    for name, gp, gx in zip(("dq", "dk", "dv"), grads[KERNEL], grads["xla"]):
        row[name] = errors(gp, gx)
    tol = float(spec.tolerance.get(dtype, spec.tolerance.get("float32", 2e-5)))
    row["tolerance"] = {"fwd_rel": tol, "grad_rel": GRAD_TOLERANCE_FACTOR * tol}
    row["ok"] = bool(row["fwd"]["rel"] <= tol and all(
        row[n]["rel"] <= GRAD_TOLERANCE_FACTOR * tol for n in ("dq", "dk", "dv")))
    return row


def run_checks(specs, plan: Plan, clock: Clock, report: Report) -> None:
    """Every (kernel, dtype, causal) row, until ``plan.check_share`` of the budget is used."""
    limit = plan.check_share * clock.budget_s
    for spec, dtype, causal in check_order(specs, plan):
        base = {"spec": spec.name, "dtype": dtype, "causal": causal}
        if clock.elapsed() > limit:
            report.add("correctness", {**base, "skipped": f"correctness phase past its "
                                       f"{limit:.0f} s share of the budget"})
            continue
        report.set(current=f"check {spec.name} {dtype} causal={causal}")
        try:
            row = check_one(spec, dtype, causal, plan)
        except Exception as e:  # a kernel that does not compile is a result, not a crash
            row = {**base, "error": error_message(e)}
            traceback.print_exc()
        print(f"   check {format_check(row)}", flush=True)
        report.add("correctness", row)


def format_check(row: dict) -> str:
    head = f"{row['spec']} {row['dtype']} causal={row['causal']}"
    if "error" in row or "skipped" in row:
        return f"{head}: {row.get('error') or 'skipped: ' + row['skipped']}"
    errs = " ".join(f"{n} {row[n]['rel']:.1e}" for n in ("fwd", "dq", "dk", "dv"))
    return f"{head}: rel err {errs} -> {'ok' if row['ok'] else 'FAIL'}"


# ----------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------
def timing_variants(specs) -> list[tuple[str, str, object]]:
    """(label, implementation, make(causal) -> fn) for every timed variant.

    Timing uses each spec's ``benchmark_options`` (empty: the kernel's defaults), not
    ``test_options``, whose small blocks are for tiny shapes."""
    out = []
    for spec in specs:
        opts = dict(spec.benchmark_options)
        for impl in (KERNEL, "xla"):
            out.append((spec.name, impl,
                        lambda causal, s=spec, i=impl, o=opts: attention_fn(s, i, o, causal)))
    impl = baseline_implementation()
    out.append((BASELINE, impl, lambda causal, i=impl: baseline_fn(i, causal)))
    return out


def device_bytes() -> int | None:
    """The device's memory limit in bytes (None where the backend does not say)."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # CPU backends may not implement memory_stats
        return None
    return stats.get("bytes_limit")


def estimate_s(prev: dict | None, length: int, calls: int) -> float:
    """Seconds a measurement at ``length`` should take, from the one at the previous length:
    compile time plus ``calls`` calls of the previous median scaled by (T / T_prev)²."""
    if prev is None or "median_s" not in prev:
        return 0.0
    ratio = (length / prev["T"]) ** 2
    return prev["compile_s"] + calls * prev["median_s"] * ratio


def measure_row(fn, args, plan: Plan, clock: Clock) -> dict:
    """Compile, check memory, then time: a warm-up, one call, and more calls while they fit."""
    compiled, compile_s = compile_fn(fn, args)
    row = {"compile_s": compile_s, "temp_bytes": temp_bytes(compiled)}
    limit = device_bytes()
    if limit and row["temp_bytes"] and row["temp_bytes"] > limit:
        row["skipped"] = (f"needs {row['temp_bytes'] / 2**30:.1f} GiB of temporaries > "
                          f"{limit / 2**30:.1f} GiB on the device")
        return row
    times, _ = time_compiled(compiled, args, repeats=1, warmup=plan.warmup)
    more = plan.repeats - 1
    if more and times[0] * more > 0.5 * max(clock.remaining(), 0.0):
        more = max(0, int(0.5 * max(clock.remaining(), 0.0) / max(times[0], 1e-9)))
    if more:
        times += time_compiled(compiled, args, repeats=more, warmup=0)[0]
    row.update(median_s=statistics.median(times), min_s=min(times), times_s=times)
    return row


def skip_reason(prev: dict | None, measured: dict | None, length: int, plan: Plan,
                clock: Clock, floor_s: float = 0.0) -> str | None:
    """Why a measurement at ``length`` is not taken, or None.

    prev: the last row of this variant and mode (at a shorter T); measured: the last one of
    them that was timed, which the time estimate scales; floor_s: the least a measurement
    is expected to take (the slowest compile so far: a variant timed for the first time
    has nothing to scale)."""
    if prev is not None and "error" in prev:
        return f"not run: T={prev['T']} already failed"
    if prev is not None and "GiB" in prev.get("skipped", ""):
        return f"not run: T={prev['T']} already exceeded the device memory"
    if clock.remaining() <= 0:
        return f"time budget of {clock.budget_s:.0f} s spent"
    need = max(estimate_s(measured, length, plan.warmup + 1), floor_s)
    if need > clock.remaining():
        return (f"time budget: estimated {need:.0f} s > {clock.remaining():.0f} s left of "
                f"{clock.budget_s:.0f} s")
    return None


def run_timing(specs, plan: Plan, clock: Clock, report: Report, causal: bool = True) -> None:
    """Every (T, variant, mode) row, shortest T first, so a cut run keeps the short ones."""
    last: dict[tuple[str, str, str], dict] = {}
    measured: dict[tuple[str, str, str], dict] = {}
    variants = timing_variants(specs)
    for length in plan.lengths:
        shape = (plan.batch, length, plan.heads, plan.head_dim)
        q, k, v, c = qkv(shape, plan.heads, plan.time_dtype, seed=length)
        for label, impl, make in variants:
            for mode in ("fwd", "fwd+bwd"):
                key = (label, impl, mode)
                row = {"spec": label, "implementation": impl, "mode": mode, "T": length,
                       "shape": list(shape), "dtype": plan.time_dtype, "causal": causal}
                floor_s = max((r["compile_s"] for r in measured.values()), default=0.0)
                reason = skip_reason(last.get(key), measured.get(key), length, plan, clock,
                                     floor_s)
                if reason is None:
                    report.set(current=f"time {label}[{impl}] {mode} T={length}")
                    row.update(time_one(make(causal), mode, (q, k, v, c), plan, clock))
                else:
                    row["skipped"] = reason
                print(f"   time {format_timing(row)}", flush=True)
                report.add("timing", row)
                last[key] = row
                if "median_s" in row:
                    measured[key] = row
        del q, k, v, c


def time_one(fn, mode: str, args, plan: Plan, clock: Clock) -> dict:
    """One timing row's numbers, or its error."""
    q, k, v, c = args
    try:
        if mode == "fwd":
            return measure_row(fn, (q, k, v), plan, clock)
        return measure_row(grad_fn(fn), (q, k, v, c), plan, clock)
    except Exception as e:  # out of memory, unsupported shape, lowering error
        return {"error": error_message(e)}


def format_timing(row: dict) -> str:
    head = f"{row['spec']}[{row['implementation']}] {row['mode']} T={row['T']}"
    if "median_s" in row:
        return f"{head}: {1e3 * row['median_s']:.3f} ms (compile {row['compile_s']:.1f} s)"
    return f"{head}: {row.get('error') or 'skipped: ' + row['skipped']}"


# ----------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------
def _fmt(x) -> str:
    return f"{x:.2e}" if isinstance(x, float) else str(x)


def _check_lines(rows: list[dict]) -> list[str]:
    lines = ["| kernel | dtype | causal | fwd rel | dq rel | dk rel | dv rel | fwd max abs "
             "| ok |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['spec']} | {r['dtype']} | {r['causal']} "
        if "fwd" not in r:
            note = r.get("error") or "skipped: " + r.get("skipped", "")
            lines.append(head + f"| {note.replace('|', '/')} | | | | | **no** |")
            continue
        errs = " | ".join(_fmt(r[n]["rel"]) for n in ("fwd", "dq", "dk", "dv"))
        lines.append(head + f"| {errs} | {_fmt(r['fwd']['max_abs'])} | "
                     f"{'yes' if r['ok'] else '**no**'} |")
    return lines


def _timing_lines(rows: list[dict]) -> list[str]:
    lines = ["| T | variant | mode | median ms | min ms | compile s | temp GiB | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = f"{r['spec']} [{r['implementation']}]"
        if "median_s" in r:
            tb = r.get("temp_bytes")
            lines.append(f"| {r['T']} | {name} | {r['mode']} | {1e3 * r['median_s']:.3f} | "
                         f"{1e3 * r['min_s']:.3f} | {r['compile_s']:.1f} | "
                         f"{'' if tb is None else f'{tb / 2**30:.2f}'} | |")
        else:
            note = (r.get("error") or r.get("skipped", "")).replace("|", "/")
            lines.append(f"| {r['T']} | {name} | {r['mode']} | | | | | {note} |")
    return lines


def render_markdown(data: dict) -> str:
    """The report as markdown: header, correctness table, timing table."""
    h = data["header"]
    m = h["machine"]
    lines = [f"# Pallas kernels on {m['device_kind']} ({h['date']})", "",
             f"`{h['command']}` — jax {m['jax']}, backend {m['backend']}, "
             f"{m['device_count']} device(s), commit {m.get('git_commit') or '?'}; "
             f"budget {h['time_budget_s']:.0f} s.", "",
             f"Status: **{data['status']}**"
             + (f" (at: {data['current']})" if data["status"] != "complete"
                and data.get("current") else "")
             + (f", {data['elapsed_s']:.0f} s" if "elapsed_s" in data else "") + ".", "",
             f"Kernels: {', '.join(h['kernels']) or 'none registered'}.", ""]
    lines += ["## Correctness (kernel vs XLA path)", "",
              "Relative error = max |pallas - xla| / max |xla|; forward within "
              "`spec.tolerance[dtype]`, gradients within "
              f"{GRAD_TOLERANCE_FACTOR:g}× that. Inputs: {h['plan']['check']} (B, T, H, D).",
              ""]
    lines += _check_lines(data["correctness"]) + [""]
    lines += [f"## Timing ({h['plan']['time_dtype']}, causal)", ""]
    lines += _timing_lines(data["timing"]) + [""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------
def start_watchdog(report: Report, clock: Clock, grace_s: float) -> threading.Timer:
    """At budget + grace, mark the report as cut short, write it and exit the process."""

    def fire():
        report.set(status=f"cut short by the watchdog at {clock.elapsed():.0f} s",
                   elapsed_s=clock.elapsed())
        print(f"gpu_check: watchdog at {clock.elapsed():.0f} s; report written", flush=True)
        os._exit(3)

    timer = threading.Timer(max(clock.remaining(), 0) + grace_s, fire)
    timer.daemon = True
    timer.start()
    return timer


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--time-budget", type=float, default=420.0,
                   help="seconds from start for the whole run (default 420)")
    p.add_argument("--grace", type=float, default=60.0,
                   help="the watchdog exits this many seconds after the budget")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny shapes (interpret mode on CPU): keeps the script from rotting")
    p.add_argument("--specs", type=lambda s: [x for x in s.split(",") if x],
                   help="comma-separated kernels to check (default: every registered one)")
    p.add_argument("--lengths", type=lambda s: tuple(int(x) for x in s.split(",") if x),
                   help="comma-separated T to time (default 4096..65536; smoke: 32,64); "
                        "'' times nothing")
    p.add_argument("--dtypes", type=lambda s: tuple(x for x in s.split(",") if x),
                   help="comma-separated dtypes of the correctness checks "
                        "(default float32,bfloat16)")
    p.add_argument("--causal", choices=("both", "true", "false"), default="both",
                   help="causal settings of the correctness checks (default both)")
    p.add_argument("--repeats", type=int, help="timed calls per row (default 5; smoke: 2)")
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "gpu",
                   help="folder of the report")
    return p.parse_args(argv)


def make_plan(args) -> Plan:
    plan = SMOKE_PLAN if args.cpu_smoke else DEVICE_PLAN
    if args.lengths is not None:
        plan = dataclasses.replace(plan, lengths=args.lengths)
    if args.dtypes:
        plan = dataclasses.replace(plan, dtypes=args.dtypes)
    causal = {"both": (True, False), "true": (True,), "false": (False,)}[args.causal]
    plan = dataclasses.replace(plan, causal=causal)
    if args.repeats:
        plan = dataclasses.replace(plan, repeats=args.repeats)
    return plan


def main(argv=None) -> Path:
    """Runs the check; returns the report's path stem (``.json`` / ``.md``)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    clock, plan = Clock(args.time_budget), make_plan(args)
    specs = kernel_specs(args.specs)
    info = machine_info()
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    stem = args.out / f"{date}-{device_slug()}"
    command = "python experiments/gpu_check.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    header = {"date": date, "command": command.strip(), "machine": info,
              "time_budget_s": args.time_budget, "plan": dataclasses.asdict(plan),
              "kernels": [s.name for s in specs], "baseline": f"{BASELINE} "
              f"(implementation={baseline_implementation()!r})"}
    report = Report(stem, header)
    print(f"gpu_check on {info['device_kind']}: kernels {header['kernels']}; "
          f"report {stem}.{{json,md}}", flush=True)
    watchdog = start_watchdog(report, clock, args.grace)
    status = "crashed"
    try:
        run_checks(specs, plan, clock, report)
        run_timing(specs, plan, clock, report)
        status = "complete"
    except BaseException as e:  # even a crash of the harness leaves a report
        status = f"crashed: {error_message(e)}"
        raise
    finally:
        watchdog.cancel()
        report.set(status=status, current=None, elapsed_s=clock.elapsed())
        print(f"wrote {stem}.json and .md ({clock.elapsed():.0f} s)", flush=True)
    return stem


if __name__ == "__main__":
    main()
