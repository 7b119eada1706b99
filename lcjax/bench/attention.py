"""Attention benchmark: time, temporary memory and error of registered variants.

For every variant (any name in ``lcjax.attention.available()``) and sequence
length T, on random q, k, v of shape [B, T, H, D] (k, v with ``kv_heads``):

* forward          ``out = variant(q, k, v, causal=..., **options)``
* forward+backward the gradient of ``sum(out * c)`` w.r.t. (q, k, v), with ``c`` a
                   fixed random cotangent,

each jitted, compiled once (compile time reported separately), then timed as the
median of ``repeats`` calls after ``warmup`` untimed ones. Memory is XLA's compiled
temporary-buffer size. Accuracy is the max abs error of the output (and of the
gradients) against the dense reference ``dot_product_attention`` in float32; beyond
``ref_max_len`` only the last ``ref_slice`` query rows are checked (exact rows of
the reference, computed with ``q_offset``), and gradients are not.

Arithmetic floor. Forward attention is two matmuls per (batch, head), S = QK^T and
O = PV, each 2·T·S·D FLOPs, so ``4·B·H·T·S·D`` FLOPs, half of it under a causal
mask (``4·B·H·T²·D/2`` for T = S: 68.7 GFLOP at B=1, H=8, D=64, T=8192). The floor
is those FLOPs divided by the machine's XLA matmul throughput, measured in the same
run (f32 ``jnp.dot`` of [n, n] @ [n, n], median; the faster of a measurement before
and one after the attention runs, so a busy machine cannot lower the bar).

Headline: the candidate (``blockwise``) against the anchor (``jax``, i.e.
``jax.nn.dot_product_attention`` with the XLA implementation) at the largest T both
ran; the targets are stated for B=1, H=8, D=64, T=8192, causal, float32.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import shlex
from collections.abc import Callable

import jax
import jax.numpy as jnp

from lcjax import attention as attn
from lcjax.bench.timing import json_default, machine_info, matmul_throughput, measure

__all__ = [
    "AttentionBenchConfig",
    "DEFAULT_SEQ_LENS",
    "HEADLINE_CONFIG",
    "TARGETS",
    "attention_flops",
    "config_to_command",
    "format_headline",
    "format_table",
    "headline",
    "parse_options",
    "run_attention_benchmark",
    "write_reports",
]

DEFAULT_SEQ_LENS = (512, 1024, 2048, 4096, 8192)
QUICK_SEQ_LENS = (256, 512, 1024)
DEFAULT_MAX_LEN = {"softmax": 4096, "jax": 8192}
HEADLINE_CONFIG = {
    "batch": 1, "heads": 8, "kv_heads": 8, "head_dim": 64, "seq_len": 8192,
    "causal": True, "dtype": "float32",
}
# name -> (target, comparison); value must satisfy `value <op> target`
TARGETS = {"speedup": (5.0, ">="), "memory_ratio": (1 / 64, "<="), "floor_ratio": (2.5, "<=")}
MiB = 2**20


@dataclasses.dataclass(frozen=True)
class AttentionBenchConfig:
    """What to benchmark.

    ``variants`` entries are registered names or ``label=name`` (the same variant
    twice with different options); None means every registered variant.
    ``options`` maps a name or a label to keyword options (a label's override its
    name's). ``max_len`` caps T per label or name (dense variants do not fit beyond).
    ``out_dir`` None writes no files.
    """

    variants: tuple[str, ...] | None = None
    seq_lens: tuple[int, ...] = DEFAULT_SEQ_LENS
    batch: int = 1
    heads: int = 8
    kv_heads: int | None = None
    head_dim: int = 64
    causal: bool = True
    dtype: str = "float32"
    repeats: int = 5
    warmup: int = 1
    backward: bool = True
    options: dict[str, dict] = dataclasses.field(default_factory=dict)
    max_len: dict[str, int] = dataclasses.field(default_factory=lambda: dict(DEFAULT_MAX_LEN))
    ref_max_len: int = 4096
    ref_slice: int = 256
    matmul_n: int = 2048
    anchor: str = "jax"
    candidate: str = "blockwise"
    seed: int = 0
    out_dir: str | None = "reports/bench/attention"

    @property
    def num_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads


@dataclasses.dataclass(frozen=True)
class _Variant:
    label: str
    name: str
    fn: Callable
    options: dict


# ----------------------------------------------------------------------------
# FLOPs and option parsing
# ----------------------------------------------------------------------------
def attention_flops(batch, heads, q_len, kv_len, head_dim, *, causal: bool) -> float:
    """Forward FLOPs of softmax attention: 4·B·H·T·S·D (QK^T and PV), halved if causal."""
    flops = 4 * batch * heads * q_len * kv_len * head_dim
    return flops / 2 if causal else float(flops)


def _parse_value(text: str):
    """``"256"`` -> 256, ``"0.5"`` -> 0.5, ``"true"`` -> True, anything else a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return text.strip()


def parse_options(specs) -> dict[str, dict]:
    """``["blockwise:block_q=256,block_kv=128", ...]`` -> {"blockwise": {...}}."""
    options: dict[str, dict] = {}
    for spec in specs or ():
        label, sep, rest = spec.partition(":")
        if not sep or not label or "=" not in rest:
            raise ValueError(f"--option expects LABEL:KEY=VALUE[,KEY=VALUE], got {spec!r}")
        for item in rest.split(","):
            key, _, value = item.partition("=")
            options.setdefault(label.strip(), {})[key.strip()] = _parse_value(value)
    return options


# Variants that compute exact softmax attention: the error column (against the dense
# softmax reference) is meaningful for them. Other variants (entmax, ...) are named
# explicitly and have their own accuracy checks in their own benchmarks.
SOFTMAX_FAMILY = ("softmax", "blockwise", "jax")


def _resolve_variants(config: AttentionBenchConfig) -> list[_Variant]:
    """Registered functions and merged options for ``config.variants``."""
    entries = config.variants or SOFTMAX_FAMILY
    variants = []
    for entry in entries:
        label, _, name = entry.partition("=")
        name = name or label
        options = {**config.options.get(name, {}), **config.options.get(label, {})}
        variants.append(_Variant(label, name, attn.get(name), options))
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"variant labels must be unique, got {labels}; use label=name")
    return variants


def _max_len(config: AttentionBenchConfig, variant: _Variant) -> int | None:
    """Longest T for ``variant`` (None: no cap); a label's cap overrides its name's."""
    for key in (variant.label, variant.name):
        if key in config.max_len:
            return config.max_len[key] or None
    return None


# ----------------------------------------------------------------------------
# Functions under test and the reference
# ----------------------------------------------------------------------------
def make_inputs(config: AttentionBenchConfig, seq_len: int):
    """Random q, k, v and output cotangent for one T (same for every variant)."""
    dtype = jnp.dtype(config.dtype)
    kq, kk, kv, kc = jax.random.split(jax.random.fold_in(jax.random.key(config.seed), seq_len), 4)
    q_shape = (config.batch, seq_len, config.heads, config.head_dim)
    kv_shape = (config.batch, seq_len, config.num_kv_heads, config.head_dim)
    q = jax.random.normal(kq, q_shape, dtype)
    k = jax.random.normal(kk, kv_shape, dtype)
    v = jax.random.normal(kv, kv_shape, dtype)
    cot = jax.random.normal(kc, q_shape, dtype)
    return q, k, v, cot


def _forward(fn: Callable, causal: bool, options: dict) -> Callable:
    """``(q, k, v) -> out`` for one variant with its options bound."""
    return lambda q, k, v: fn(q, k, v, causal=causal, **options)


def _forward_backward(forward: Callable) -> Callable:
    """``(q, k, v, c) -> (dq, dk, dv)``: gradient of sum(forward(q, k, v) * c)."""

    def loss(q, k, v, cot):
        out = forward(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * cot.astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1, 2))


def _reference(config: AttentionBenchConfig, q, k, v, cot) -> dict:
    """Dense float32 reference output (all rows, or the last ``ref_slice`` query rows
    beyond ``ref_max_len``) and, when it fits and is asked for, reference gradients."""
    q, k, v, cot = (x.astype(jnp.float32) for x in (q, k, v, cot))
    seq_len = q.shape[1]
    if seq_len <= config.ref_max_len:
        forward = _forward(attn.dot_product_attention, config.causal, {})
        out = jax.jit(forward)(q, k, v)
        grads = jax.jit(_forward_backward(forward))(q, k, v, cot) if config.backward else None
        return {"start": 0, "out": out, "grads": grads, "method": "full"}
    start = seq_len - min(config.ref_slice, seq_len)
    rows = jax.jit(
        lambda q, k, v: attn.dot_product_attention(
            q[:, start:], k, v, causal=config.causal, q_offset=start
        )
    )(q, k, v)
    return {"start": start, "out": rows, "grads": None, "method": f"last {seq_len - start} rows"}


def _max_abs_err(x, ref) -> float:
    return float(jnp.max(jnp.abs(x.astype(jnp.float32) - ref)))


# ----------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------
def _bench_variant(config: AttentionBenchConfig, variant: _Variant, inputs, ref) -> dict:
    """Time, memory and error of one variant at one T."""
    q, k, v, cot = inputs
    forward = _forward(variant.fn, config.causal, variant.options)
    timing = {"repeats": config.repeats, "warmup": config.warmup}
    fwd_stats, out = measure(forward, (q, k, v), **timing)
    record = {
        "status": "ok",
        "forward": fwd_stats,
        "max_abs_err": _max_abs_err(out[:, ref["start"]:], ref["out"]),
        "err_method": ref["method"],
    }
    del out
    if config.backward:
        bwd_stats, grads = measure(_forward_backward(forward), (q, k, v, cot), **timing)
        record["fwd_bwd"] = bwd_stats
        if ref["grads"] is not None:
            errs = [_max_abs_err(g, r) for g, r in zip(grads, ref["grads"])]
            record["grad_max_abs_err"] = max(errs)
    return record


def _bench_length(config, variants, seq_len: int, log: Callable) -> list[dict]:
    """All variants at one T; a variant that raises is recorded as an error."""
    inputs = make_inputs(config, seq_len)
    ref = _reference(config, *inputs)
    records = []
    for variant in variants:
        head = {"variant": variant.label, "name": variant.name, "options": variant.options,
                "seq_len": seq_len}
        cap = _max_len(config, variant)
        if cap is not None and seq_len > cap:
            record = {**head, "status": "skipped", "reason": f"T > max_len {cap}"}
        else:
            try:
                record = {**head, **_bench_variant(config, variant, inputs, ref)}
            except Exception as err:  # noqa: BLE001 - one failing variant must not stop the run
                record = {**head, "status": "error", "error": f"{type(err).__name__}: {err}"[:800]}
        log(_progress_line(record))
        records.append(record)
    return records


def _progress_line(record: dict) -> str:
    head = f"T={record['seq_len']:>6} {record['variant']:<14}"
    if record["status"] != "ok":
        return f"{head} {record['status']}: {record.get('reason') or record.get('error')}"
    fwd = record["forward"]
    line = (f"{head} fwd {ms(fwd['median_s'])} ms (compile {fwd['compile_s']:.1f} s, "
            f"temp {mib(fwd['temp_bytes'])} MiB)")
    if "fwd_bwd" in record:
        bwd = record["fwd_bwd"]
        line += f" | fwd+bwd {ms(bwd['median_s'])} ms (temp {mib(bwd['temp_bytes'])} MiB)"
    return line + f" | err {record['max_abs_err']:.1e}"


def run_attention_benchmark(config: AttentionBenchConfig, *, log: Callable = print) -> dict:
    """Run the benchmark described by ``config``; write reports if ``config.out_dir``.

    Returns a JSON-ready dict: ``config``, ``command`` (the equivalent ``lcjax``
    command), ``machine``, ``matmul`` (GFLOP/s), ``floors`` (FLOPs and floor per T),
    ``records`` (one per variant and T) and ``headline``; plus ``files`` when written.
    """
    variants = _resolve_variants(config)
    machine = machine_info()  # at the start: the commit and local changes the code came from
    log(f"matmul throughput ({config.matmul_n}^2 f32) ...")
    before = matmul_throughput(config.matmul_n, repeats=config.repeats, seed=config.seed)
    records = []
    for seq_len in config.seq_lens:
        records += _bench_length(config, variants, seq_len, log)
    after = matmul_throughput(config.matmul_n, repeats=config.repeats, seed=config.seed)
    gflops = max(before["gflops"], after["gflops"])
    result = {
        "config": dataclasses.asdict(config),
        "command": config_to_command(config),
        "machine": {**machine, "finished": machine_info()["date"]},
        "matmul": {"n": config.matmul_n, "gflops": gflops, "before": before, "after": after},
        "floors": [_floor(config, t, gflops) for t in config.seq_lens],
        "records": records,
    }
    _add_floor_ratios(result)
    result["headline"] = headline(result)
    if config.out_dir:
        result["files"] = write_reports(result, config.out_dir)
    return result


def _floor(config: AttentionBenchConfig, seq_len: int, gflops: float) -> dict:
    flops = attention_flops(config.batch, config.heads, seq_len, seq_len, config.head_dim,
                            causal=config.causal)
    return {"seq_len": seq_len, "flops": flops, "floor_s": flops / (gflops * 1e9)}


def _add_floor_ratios(result: dict) -> None:
    floors = {f["seq_len"]: f["floor_s"] for f in result["floors"]}
    for record in result["records"]:
        if record["status"] == "ok":
            record["fwd_over_floor"] = record["forward"]["median_s"] / floors[record["seq_len"]]


# ----------------------------------------------------------------------------
# Headline: candidate vs anchor
# ----------------------------------------------------------------------------
def _ok_records(result: dict, label: str) -> dict[int, dict]:
    return {r["seq_len"]: r for r in result["records"]
            if r["variant"] == label and r["status"] == "ok"}


def _check(name: str, value: float | None) -> dict:
    target, op = TARGETS[name]
    passed = None if value is None else (value >= target if op == ">=" else value <= target)
    return {"name": name, "value": value, "target": target, "op": op, "pass": passed}


def headline(result: dict) -> dict | None:
    """Candidate vs anchor (forward) at the largest T both ran: speedup, temp-memory
    ratio and candidate time / floor, each against its target. None if no common T."""
    config = result["config"]
    anchor = _ok_records(result, config["anchor"])
    cand = _ok_records(result, config["candidate"])
    common = sorted(set(anchor) & set(cand))
    if not common:
        return None
    seq_len = common[-1]
    a, c = anchor[seq_len]["forward"], cand[seq_len]["forward"]
    floor = next(f for f in result["floors"] if f["seq_len"] == seq_len)
    mem_ratio = None
    if a["temp_bytes"] and c["temp_bytes"] is not None:
        mem_ratio = c["temp_bytes"] / a["temp_bytes"]
    shape = {k: config[k] for k in ("batch", "heads", "head_dim", "causal", "dtype")}
    shape.update(kv_heads=config["kv_heads"] or config["heads"], seq_len=seq_len)
    out = {
        "anchor": config["anchor"], "candidate": config["candidate"], **shape,
        "is_headline_config": shape == HEADLINE_CONFIG,
        "flops": floor["flops"], "floor_s": floor["floor_s"],
        "gflops": result["matmul"]["gflops"],
        "anchor_s": a["median_s"], "candidate_s": c["median_s"],
        "anchor_temp_bytes": a["temp_bytes"], "candidate_temp_bytes": c["temp_bytes"],
        "checks": [
            _check("speedup", a["median_s"] / c["median_s"]),
            _check("memory_ratio", mem_ratio),
            _check("floor_ratio", c["median_s"] / floor["floor_s"]),
        ],
    }
    if "fwd_bwd" in anchor[seq_len] and "fwd_bwd" in cand[seq_len]:
        out["fwd_bwd_speedup"] = (anchor[seq_len]["fwd_bwd"]["median_s"]
                                  / cand[seq_len]["fwd_bwd"]["median_s"])
    return out


def verdict(passed: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "n/a"}[passed]


def format_headline(head: dict | None) -> str:
    """Plain-text headline block (also used inside the markdown report)."""
    if head is None:
        return "Headline: not measured (anchor and candidate share no sequence length)."
    cand, anchor = head["candidate"], head["anchor"]
    title = (f"Headline: {cand} vs {anchor}, B={head['batch']} H={head['heads']} "
             f"D={head['head_dim']} T={head['seq_len']} "
             f"{'causal' if head['causal'] else 'non-causal'} {head['dtype']}")
    if not head["is_headline_config"]:
        title += "  (NOT the target configuration B=1 H=8 D=64 T=8192 causal float32)"
    checks = {c["name"]: c for c in head["checks"]}
    sp, mem, fl = checks["speedup"], checks["memory_ratio"], checks["floor_ratio"]
    mem_text = "n/a" if mem["value"] is None else f"1/{1 / mem['value']:.1f}"
    lines = [
        title,
        f"  floor = {head['flops'] / 1e9:.1f} GFLOP / {head['gflops']:.1f} GFLOP/s = "
        f"{head['floor_s'] * 1e3:.1f} ms",
        f"  speedup ({anchor} / {cand} fwd time): {head['anchor_s'] * 1e3:.1f} / "
        f"{head['candidate_s'] * 1e3:.1f} ms = {sp['value']:.2f}x   target >= "
        f"{sp['target']:g}x   {verdict(sp['pass'])}",
        f"  temp memory ({cand} / {anchor}): {mib(head['candidate_temp_bytes'])} / "
        f"{mib(head['anchor_temp_bytes'])} MiB = {mem_text}   target <= 1/"
        f"{1 / mem['target']:g}   {verdict(mem['pass'])}",
        f"  {cand} time / floor: {fl['value']:.2f}x   target <= {fl['target']:g}x   "
        f"{verdict(fl['pass'])}",
    ]
    if "fwd_bwd_speedup" in head:
        lines.append(f"  (fwd+bwd speedup, no target: {head['fwd_bwd_speedup']:.2f}x)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Reports: JSON, markdown, PNG
# ----------------------------------------------------------------------------
def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / MiB:.1f}"


def _err(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def format_table(result: dict) -> str:
    """Markdown table, one row per variant and T."""
    header = ("| variant | T | fwd ms | fwd / floor | fwd+bwd ms | compile s (fwd, fwd+bwd) "
              "| temp MiB fwd | temp MiB fwd+bwd | max err vs softmax | grad err vs softmax |")
    rows = [header, "|---" * (header.count("|") - 1) + "|"]
    for r in result["records"]:
        if r["status"] != "ok":
            note = r.get("reason") or r.get("error", "")
            rows.append(f"| {r['variant']} | {r['seq_len']} | {r['status']}: {note} "
                        "| | | | | | | |")
            continue
        fwd, bwd = r["forward"], r.get("fwd_bwd", {})
        compile_s = f"{fwd['compile_s']:.1f}"
        if bwd:
            compile_s += f", {bwd['compile_s']:.1f}"
        rows.append(
            f"| {r['variant']} | {r['seq_len']} | {ms(fwd['median_s'])} "
            f"| {r['fwd_over_floor']:.2f} | {ms(bwd.get('median_s'))} | {compile_s} "
            f"| {mib(fwd['temp_bytes'])} | {mib(bwd.get('temp_bytes'))} "
            f"| {_err(r['max_abs_err'])} | {_err(r.get('grad_max_abs_err'))} |"
        )
    return "\n".join(rows)


def _markdown(result: dict) -> str:
    cfg, m, mm = result["config"], result["machine"], result["matmul"]
    floors = ", ".join(f"T={f['seq_len']}: {f['floor_s'] * 1e3:.1f} ms" for f in result["floors"])
    return "\n".join([
        "# Attention benchmark",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {m['platform']}, {m['usable_cpus']} usable CPUs ({m['cpu_count']} total), "
        f"backend {m['backend']} ({m['device_kind']}), jax {m['jax']}, "
        f"commit {m['git_commit']}{modified_files(m)}, {m['date']}.",
        "",
        f"Shapes: B={cfg['batch']} H={cfg['heads']} Hkv={cfg['kv_heads'] or cfg['heads']} "
        f"D={cfg['head_dim']}, {'causal' if cfg['causal'] else 'non-causal'}, {cfg['dtype']}; "
        f"median of {cfg['repeats']} after {cfg['warmup']} warm-up (compile excluded). "
        "Errors: max abs vs dense float32 reference (beyond "
        f"T={cfg['ref_max_len']}: last {cfg['ref_slice']} query rows, no gradients).",
        "",
        _options_line(result),
        "",
        f"XLA matmul ({mm['n']}x{mm['n']} @ {mm['n']}x{mm['n']} f32, median): "
        f"{mm['gflops']:.1f} GFLOP/s (before {mm['before']['gflops']:.1f}, "
        f"after {mm['after']['gflops']:.1f}). Forward floor = FLOPs / throughput: {floors}.",
        "",
        format_table(result),
        "",
        "```",
        format_headline(result["headline"]),
        "```",
        "",
        "![time and memory vs T](attention.png)",
        "",
    ])


def modified_files(machine: dict) -> str:
    files = machine.get("git_modified")
    return f" with local changes to {', '.join(files)}" if files else ""


def _options_line(result: dict) -> str:
    """Each variant label's name and options, as run."""
    seen = {}
    for r in result["records"]:
        seen.setdefault(r["variant"], (r["name"], r["options"]))
    parts = []
    for label, (name, opts) in seen.items():
        text = ", ".join(f"{k}={v}" for k, v in opts.items()) or "defaults"
        parts.append(f"{label}" + (f" (= {name})" if name != label else "") + f": {text}")
    return "Variants: " + "; ".join(parts) + "."


def _plot(result: dict, path: str) -> None:
    """Two log-log panels: time vs T (forward solid, fwd+bwd dashed, floor dotted) and
    compiled temp memory vs T."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax_t, ax_m = fig.subplots(1, 2)
    labels = list(dict.fromkeys(r["variant"] for r in result["records"]))
    for i, label in enumerate(labels):
        recs = sorted(_ok_records(result, label).items())
        if not recs:
            continue
        color, ts = f"C{i}", [t for t, _ in recs]
        for key, style in (("forward", "-"), ("fwd_bwd", "--")):
            if all(key in r for _, r in recs):
                suffix = "" if key == "forward" else " fwd+bwd"
                ax_t.plot(ts, [r[key]["median_s"] for _, r in recs], style, marker="o",
                          color=color, label=label + suffix)
                ax_m.plot(ts, [max(r[key]["temp_bytes"] or 0, 1) / MiB for _, r in recs],
                          style, marker="o", color=color, label=label + suffix)
    floors = result["floors"]
    ax_t.plot([f["seq_len"] for f in floors], [f["floor_s"] for f in floors], ":k",
              label="fwd floor (FLOPs / matmul rate)")
    for ax, ylabel in ((ax_t, "median time (s)"), (ax_m, "compiled temp memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    cfg = result["config"]
    fig.suptitle(f"attention, B={cfg['batch']} H={cfg['heads']} D={cfg['head_dim']} "
                 f"{'causal' if cfg['causal'] else 'non-causal'} {cfg['dtype']} "
                 f"({result['machine']['backend']}, {result['machine']['usable_cpus']} CPUs)")
    fig.savefig(path, dpi=120)


def write_reports(result: dict, out_dir: str) -> dict[str, str]:
    """Write ``attention.json``, ``attention.md`` and ``attention.png`` into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    files = {ext: os.path.join(out_dir, f"attention.{ext}") for ext in ("json", "md", "png")}
    with open(files["json"], "w") as f:
        json.dump({**result, "files": files}, f, indent=2, default=json_default)
    with open(files["md"], "w") as f:
        f.write(_markdown(result))
    _plot(result, files["png"])
    return files


# ----------------------------------------------------------------------------
# Rerunnable command
# ----------------------------------------------------------------------------
def config_to_command(config: AttentionBenchConfig) -> str:
    """The ``lcjax bench attention`` command line that reruns ``config``."""
    args = ["lcjax", "bench", "attention"]
    if config.variants:
        args += ["--variants", ",".join(config.variants)]
    args += ["--seq-lens", ",".join(map(str, config.seq_lens)),
             "--batch", str(config.batch), "--heads", str(config.heads)]
    if config.kv_heads is not None:
        args += ["--kv-heads", str(config.kv_heads)]
    args += ["--head-dim", str(config.head_dim),
             "--causal" if config.causal else "--no-causal",
             "--dtype", config.dtype, "--repeats", str(config.repeats),
             "--warmup", str(config.warmup),
             "--backward" if config.backward else "--no-backward"]
    for label, opts in config.options.items():
        args += ["--option", f"{label}:" + ",".join(f"{k}={v}" for k, v in opts.items())]
    for label, cap in config.max_len.items():
        args += ["--max-len", f"{label}={cap or 0}"]
    args += ["--ref-max-len", str(config.ref_max_len), "--ref-slice", str(config.ref_slice),
             "--matmul-n", str(config.matmul_n), "--anchor", config.anchor,
             "--candidate", config.candidate, "--seed", str(config.seed),
             "--out", config.out_dir or "none"]
    return shlex.join(args)
