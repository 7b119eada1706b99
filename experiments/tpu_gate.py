"""The TPU compile gate: every registered spec with a "pallas" implementation, and jax's own
TPU flash attention as the anchor, compiled with libtpu for TPU topologies from any host.

Cells: forward and forward+backward for ``v5e:2x2`` and ``v5p:2x2x1`` at T = 8K, 32K and
128K, plus the forward at T = 1M on ``v5p:2x2x1``; B=1, H=8, Hkv=2, D=128, bfloat16,
causal, each spec's ``benchmark_options`` (plash: 64 prototypes). Arguments live on one
chip, so the compiled program and its memory are per chip.

A cell passes when it compiles and its HBM temporaries are bounded (:func:`bounds`):

- ``temp <= TEMP_PER_IO * io_bytes(T)`` (O(T)), where ``io_bytes`` is the bytes of the
  program's own arrays that grow with T (q, k, v and the output; for forward+backward
  also dO, dq, dk, dv): a program holding a few copies of them passes, one with a
  [T, T] buffer cannot (one head's bf16 scores are 2 GiB at 32K, the bound 1.25 GiB);
- arguments + outputs + temporaries <= the chip's HBM.

The growth temp(T) / temp(T/4) is reported, not bounded: XLA's temporaries are not
exactly linear (jax's flash attention on v5e: 128 MiB at 32K, 768 MiB at 128K).

    PYTHONPATH=. python experiments/tpu_gate.py            # writes reports/tpu/compile_gate.md
    PYTHONPATH=. python experiments/tpu_gate.py --only plash --lengths 8192

``tests/tpu/test_compile_gate.py`` runs the same cells under ``make test``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from lcjax import aot, attention  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
B, H, HKV, D = 1, 8, 2, 128
DTYPE = "bfloat16"
TOPOLOGIES = ("v5e:2x2", "v5p:2x2x1")
LENGTHS = (8192, 32768, 131072)
LONG = ("v5p:2x2x1", 1 << 20)  # forward only
MODES = ("fwd", "fwd+bwd")
ANCHOR = "jax_flash_attention"
MiB = 1 << 20
# the cells compile under JAX's default matmul precision (the test suite sets "highest"
# for its CPU numerics; tests/tpu/test_dispatch.py checks the kernels under it separately)
PRECISION = "default"
TEMP_PER_IO = 8  # temp <= 8 x the bytes of the O(T) arrays of the program


def pallas_methods() -> list[str]:
    """Registered specs with a "pallas" implementation, from the registry."""
    return sorted(spec.name for spec in attention.specs()
                  if "pallas" in spec.implementation_names)


def methods() -> list[str]:
    """The gate's rows: every Pallas spec, then the anchor."""
    return [*pallas_methods(), ANCHOR]


@dataclasses.dataclass(frozen=True)
class Cell:
    method: str
    topology: str
    length: int
    mode: str  # "fwd" or "fwd+bwd"


def cells(only: list[str] | None = None, lengths=LENGTHS) -> list[Cell]:
    """Every cell of the gate (``only``: those methods)."""
    out = [Cell(m, topo, t, mode) for m in methods() for topo in TOPOLOGIES
           for mode in MODES for t in lengths]
    out += [Cell(m, LONG[0], LONG[1], "fwd") for m in methods()]
    return [c for c in out if only is None or c.method in only]


def _anchor(q, k, v):
    """jax's TPU flash attention (BHTD, equal heads): k/v repeated to H heads."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    groups = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(x, groups, axis=2) for x in (k, v))
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    out = fa.flash_attention(q, k, v, causal=True, sm_scale=q.shape[-1] ** -0.5)
    return jnp.swapaxes(out, 1, 2)


def attention_fn(method: str):
    """``f(q, k, v) -> out`` for one method: the spec's compiled Pallas implementation with
    its benchmark options (chosen for a TPU target by the dispatcher), or the anchor."""
    if method == ANCHOR:
        return _anchor
    spec = attention.get(method)
    options = spec.options_for("pallas", spec.benchmark_options)

    def fn(q, k, v):
        return spec(q, k, v, causal=True, implementation="pallas", **options)

    return fn


def program(method: str, mode: str):
    """The compiled function of a cell: ``fwd(q, k, v)`` or ``fwd+bwd(q, k, v, dO) ->
    (out, dq, dk, dv)``."""
    fn = attention_fn(method)
    if mode == "fwd":
        return fn

    def fwd_bwd(q, k, v, do):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(do))

    return fwd_bwd


def io_bytes(length: int, mode: str) -> int:
    """Bytes of the cell's arrays that grow with T: q, k, v, out (+ dO, dq, dk, dv)."""
    itemsize = jnp.dtype(DTYPE).itemsize
    per_token = B * (2 * H * D + 2 * HKV * D) * itemsize
    return per_token * length * (2 if mode == "fwd+bwd" else 1)


def compile_cell(cell: Cell) -> dict:
    """Compile one cell; its row: compile seconds, per-chip bytes, or the error."""
    devices = aot.topology_devices(cell.topology)
    q = aot.struct((B, cell.length, H, D), DTYPE, devices)
    kv = aot.struct((B, cell.length, HKV, D), DTYPE, devices)
    args = (q, kv, kv) + ((q,) if cell.mode == "fwd+bwd" else ())
    row = dataclasses.asdict(cell)
    start, cpu = time.perf_counter(), time.process_time()
    try:
        with jax.default_matmul_precision(PRECISION):
            compiled = aot.compile_for(program(cell.method, cell.mode), *args)
    except Exception as err:  # the gate reports every failing cell, with its reason
        row.update(ok=False, seconds=time.perf_counter() - start,
                   cpu_seconds=time.process_time() - cpu,
                   error=f"{type(err).__name__}: {_first_line(err)}")
        return row
    row.update(ok=True, seconds=time.perf_counter() - start,
               cpu_seconds=time.process_time() - cpu,
               mosaic_calls=compiled.as_text().count("tpu_custom_call"),
               **aot.memory_report(compiled, cell.topology))
    return row


def _first_line(err: Exception) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    # Mosaic's own reason (a VMEM overflow, an unsupported op) is the informative line
    key = next((ln for ln in lines if "vmem" in ln.lower() or "scoped" in ln.lower()),
               lines[0] if lines else "")
    return key[:300]


def bounds(rows: list[dict]) -> list[str]:
    """The bound violations among compiled ``rows``: temp vs ``TEMP_PER_IO * io_bytes``,
    total vs the chip's HBM."""
    bad = []
    by_len = {r["length"]: r for r in rows if r.get("ok")}
    for r in by_len.values():
        limit = TEMP_PER_IO * io_bytes(r["length"], r["mode"])
        if r["temp_bytes"] > limit:
            bad.append(f"{_name(r)}: temp {_mib(r['temp_bytes'])} > {TEMP_PER_IO} x io "
                       f"{_mib(limit)}")
        if r["total_bytes"] > r["hbm_bytes"]:
            bad.append(f"{_name(r)}: {_mib(r['total_bytes'])} > HBM {_mib(r['hbm_bytes'])}")
    return bad


def _growth(rows: list[dict]) -> float | None:
    by_len = {r["length"]: r["temp_bytes"] for r in rows if r.get("ok")}
    if by_len.get(32768) and 131072 in by_len:
        return by_len[131072] / by_len[32768]
    return None


def _name(r: dict) -> str:
    return f"{r['method']} {r['mode']} {r['topology']} T={r['length']}"


def _mib(n: int) -> str:
    return f"{n / MiB:,.1f} MiB"


def row_line(r: dict) -> str:
    """One markdown table row."""
    head = f"| {r['method']} | {r['topology']} | {r['mode']} | {r['length']:,} |"
    if not r["ok"]:
        cpu = r.get("cpu_seconds", float("nan"))
        return (f"{head} FAIL | | | {r['seconds']:.1f} | {cpu:.1f} | "
                f"{r['error'].replace('|', '/')} |")
    bound = TEMP_PER_IO * io_bytes(r["length"], r["mode"])
    return (f"{head} ok | {r['temp_bytes'] / MiB:,.1f} | {bound / MiB:,.0f} | "
            f"{r['seconds']:.1f} | {r.get('cpu_seconds', float('nan')):.1f} | "
            f"total {r['hbm_fraction']:.1%} of HBM, "
            f"{r['mosaic_calls']} Mosaic call(s) |")


TABLE_HEAD = ("| method | topology | mode | T | compiles | temp MiB/chip | bound MiB "
              f"({TEMP_PER_IO}·io) | compile s | cpu s | notes |\n"
              "|---|---|---|---:|---|---:|---:|---:|---:|---|")


def report(rows: list[dict], wall: float) -> str:
    """The markdown report of a gate run."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["topology"], r["mode"]), []).append(r)
    violations = [v for g in groups.values() for v in bounds(g)]
    failed = [r for r in rows if not r["ok"]]
    lines = [
        "# TPU compile gate",
        "",
        f"Generated by `PYTHONPATH=. python experiments/tpu_gate.py` on "
        f"{datetime.date.today().isoformat()}, {platform.node() or 'host'} "
        f"({os.cpu_count()}-core CPU host, no TPU), jax {jax.__version__}, "
        f"libtpu {_libtpu_version()}; wall time {wall:.0f} s.",
        "",
        f"B={B}, H={H}, Hkv={HKV}, D={D}, {DTYPE}, causal, matmul precision "
        f"{PRECISION!r}; arguments on one chip, bytes per chip. Bound: temp <= "
        f"{TEMP_PER_IO} x io, io = bytes of q, k, v, out "
        f"(+ dO, dq, dk, dv for fwd+bwd) = {io_bytes(1, 'fwd'):,} B/token (fwd); "
        f"arguments + outputs + temp <= HBM. Compile s is wall time (cpu s: this "
        f"process's CPU time; the host was shared, so wall >> cpu).",
        "",
        f"{len(rows) - len(failed)} of {len(rows)} cells compile; "
        f"{len(violations)} bound violation(s).",
        "",
        TABLE_HEAD,
        *(row_line(r) for r in rows),
    ]
    growth = [f"- {m} {mode} {topo}: {g:.2f}" for (m, topo, mode), g in
              ((key, _growth(rows)) for key, rows in groups.items()) if g is not None]
    if growth:
        lines += ["", "Growth temp(128K) / temp(32K) (linear: 4; reported, not bounded):",
                  "", *growth]
    if violations:
        lines += ["", "Bound violations:", "", *(f"- {v}" for v in violations)]
    return "\n".join(lines) + "\n"


def _libtpu_version() -> str:
    try:
        from importlib.metadata import version
        return version("libtpu")
    except Exception:  # not installed: the gate fails earlier, in topology_devices
        return "?"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="methods (default: all)")
    parser.add_argument("--lengths", nargs="*", type=int, default=list(LENGTHS))
    parser.add_argument("--out", default=str(ROOT / "reports" / "tpu" / "compile_gate"))
    parser.add_argument("--from-json", nargs="*", default=[],
                        help="only render the report from the rows of earlier runs' .json "
                             "(e.g. runs split by --only, in parallel)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if args.from_json:
        rows = [r for path in args.from_json for r in json.loads(Path(path).read_text())]
        wall = sum(r["seconds"] for r in rows)
    else:
        rows, wall = [], 0.0
        for cell in cells(args.only, tuple(args.lengths)):
            rows.append(compile_cell(cell))
            print(row_line(rows[-1]), flush=True)
            out.with_suffix(".json").write_text(json.dumps(rows, indent=1))  # as it goes
        wall = time.perf_counter() - start
    text = report(rows, wall)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(text)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
