"""Attention benchmark (``lcjax bench attention``): every registered variant as data.

The variants are the registry's (``lcjax.attention.available()``), so a newly registered
spec is benchmarked with no other edit; ``variants`` narrows or renames them. Each variant
and sequence length T becomes one :class:`lcjax.bench.harness.Case` (:func:`cases`), run by
:func:`lcjax.bench.harness.run_cases`: forward and forward+backward time, compiled temp
memory, and the error against the variant's own spec reference (see ``harness``).

Arithmetic floor. Forward attention is two matmuls per (batch, head), S = QK^T and
O = PV, each 2·T·S·D FLOPs, so ``4·B·H·T·S·D`` FLOPs, half of it under a causal
mask (``4·B·H·T²·D/2`` for T = S: 68.7 GFLOP at B=1, H=8, D=64, T=8192). The floor
is those FLOPs divided by the machine's XLA matmul throughput, measured in the same
run (f32 ``jnp.dot`` of [n, n] @ [n, n], median; the faster of a measurement before
and one after the attention runs, so a busy machine cannot lower the bar).

Every row is also timed against the anchor (``jax``: ``jax.nn.dot_product_attention``,
XLA) at the same shapes (``fwd_speedup_vs_anchor``). Headline: the candidate
(``blockwise``) against the anchor at the largest T both ran; the targets are stated for
B=1, H=8, D=64, T=8192, causal, float32. Each row carries the exact ``lcjax bench
attention`` command that reruns it alone (``command``).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable

from lcjax import attention as attn
from lcjax.bench.harness import Case, add_speedups, format_records, plot_records, run_cases
from lcjax.bench.report import (
    check,
    command_line,
    figure_title,
    log_axes,
    machine_line,
    mib,
    verdict,
    write_report,
)
from lcjax.bench.timing import machine_info, matmul_throughput

__all__ = [
    "AttentionBenchConfig",
    "DEFAULT_SEQ_LENS",
    "HEADLINE_CONFIG",
    "TARGETS",
    "attention_flops",
    "cases",
    "config_to_command",
    "format_headline",
    "format_table",
    "headline",
    "parse_options",
    "row_command",
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


@dataclasses.dataclass(frozen=True)
class AttentionBenchConfig:
    """What to benchmark.

    ``variants`` entries are ``[label=]name[@implementation]`` (a registered name; the
    same variant twice with different options under two labels; one implementation of
    it); None means every registered variant. ``each_implementation``: an entry without
    ``@`` whose spec has several implementations becomes one row per implementation
    (``name@impl``). ``options`` maps a name or a label to keyword options (a label's
    override its name's). ``max_len`` caps T per label or name (dense variants do not
    fit beyond; 0 = no cap). ``out_dir`` None writes no files.
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
    each_implementation: bool = False
    options: dict[str, dict] = dataclasses.field(default_factory=dict)
    max_len: dict[str, int] = dataclasses.field(default_factory=lambda: dict(DEFAULT_MAX_LEN))
    ref_max_len: int = 4096
    ref_slice: int = 256
    matmul_n: int = 2048
    anchor: str = "jax"
    candidate: str = "blockwise"
    seed: int = 0
    out_dir: str | None = "reports/bench/attention"


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


# ----------------------------------------------------------------------------
# The cases: variants x sequence lengths
# ----------------------------------------------------------------------------
def _entries(config: AttentionBenchConfig) -> list[tuple[str, str, str | None]]:
    """(label, name, implementation) of each row kind, checked against the registry."""
    out = []
    for entry in config.variants or attn.available():
        label, sep, target = entry.partition("=")
        target = target if sep else label
        name, _, impl = target.partition("@")
        spec = attn.spec(name)  # ValueError naming the registered ones
        if impl:
            spec.implementation(impl)  # ValueError naming its implementations
            out.append((label if sep else f"{name}@{impl}", name, impl))
        elif config.each_implementation and len(spec.implementations) > 1:
            out += [(f"{label}@{i}", name, i) for i in spec.implementation_names]
        else:
            out.append((label, name, None))
    labels = [label for label, _, _ in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"AttentionBenchConfig: `variants` labels must be unique, got "
                         f"{labels}; use label=name")
    return out


def _lookup(table: dict, label: str, name: str, default=None):
    """``table[label]``, else ``table[name]``, else ``default``."""
    return table.get(label, table.get(name, default))


def cases(config: AttentionBenchConfig) -> list[Case]:
    """One case per sequence length and variant entry, ordered by T (shared inputs)."""
    entries = _entries(config)
    out = []
    for seq_len in config.seq_lens:
        for label, name, impl in entries:
            options = {**config.options.get(name, {}), **config.options.get(label, {})}
            out.append(Case(
                variant=name, label=label, implementation=impl, options=options,
                seq_len=seq_len, batch=config.batch, heads=config.heads,
                kv_heads=config.kv_heads, head_dim=config.head_dim, dtype=config.dtype,
                causal=config.causal, backward=config.backward,
                max_len=_lookup(config.max_len, label, name) or None))
    return out


# ----------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------
def run_attention_benchmark(config: AttentionBenchConfig, *, log: Callable = print) -> dict:
    """Run the benchmark described by ``config``; write reports if ``config.out_dir``.

    Returns a JSON-ready dict: ``config``, ``command`` (the equivalent ``lcjax``
    command), ``machine``, ``matmul`` (GFLOP/s), ``floors`` (FLOPs and floor per T),
    ``records`` (one per case: :func:`lcjax.bench.harness.run_case`, plus ``command``,
    ``fwd_over_floor`` and the speedups vs the anchor) and ``headline``; plus ``files``.
    """
    todo = cases(config)
    machine = machine_info()  # at the start: the commit and local changes the code came from
    log(f"matmul throughput ({config.matmul_n}^2 f32) ...")
    before = matmul_throughput(config.matmul_n, repeats=config.repeats, seed=config.seed)
    records = run_cases(todo, repeats=config.repeats, warmup=config.warmup, seed=config.seed,
                        ref_max_len=config.ref_max_len, ref_slice=config.ref_slice,
                        command=lambda case: row_command(config, case), log=log)
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
    add_speedups(records, config.anchor)
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
            check(TARGETS, "speedup", a["median_s"] / c["median_s"]),
            check(TARGETS, "memory_ratio", mem_ratio),
            check(TARGETS, "floor_ratio", c["median_s"] / floor["floor_s"]),
        ],
    }
    if "fwd_bwd" in anchor[seq_len] and "fwd_bwd" in cand[seq_len]:
        out["fwd_bwd_speedup"] = (anchor[seq_len]["fwd_bwd"]["median_s"]
                                  / cand[seq_len]["fwd_bwd"]["median_s"])
    return out


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
def format_table(result: dict) -> str:
    """Markdown table, one row per variant and T (:func:`lcjax.bench.harness.format_records`)."""
    return format_records(result["records"], anchor=result["config"]["anchor"])


def _variants_line(result: dict) -> str:
    """Each variant label's name, implementation, options and reference, as run."""
    seen = {}
    for r in result["records"]:
        if r["variant"] not in seen or "reference" in r:
            seen[r["variant"]] = r
    parts = []
    for label, r in seen.items():
        target = r["name"] + (f"@{r['implementation']}" if r.get("implementation") else "")
        text = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "defaults"
        ref = f", error vs {r['reference']}" if "reference" in r else ""
        parts.append(label + (f" (= {target})" if target != label else "") + f": {text}{ref}")
    return "Variants: " + "; ".join(parts) + "."


def _rerun_section(result: dict) -> list[str]:
    lines = ["<details><summary>Rerun one row</summary>", "", "| variant | T | command |",
             "|---|---|---|"]
    lines += [f"| {r['variant']} | {r['seq_len']} | `{r['command']}` |"
              for r in result["records"] if "command" in r]
    return lines + ["", "</details>"]


def _markdown(result: dict) -> str:
    cfg, mm = result["config"], result["matmul"]
    floors = ", ".join(f"T={f['seq_len']}: {f['floor_s'] * 1e3:.1f} ms" for f in result["floors"])
    return "\n".join([
        "# Attention benchmark",
        "",
        f"Command: `{result['command']}`",
        "",
        machine_line(result["machine"]),
        "",
        f"Shapes: B={cfg['batch']} H={cfg['heads']} Hkv={cfg['kv_heads'] or cfg['heads']} "
        f"D={cfg['head_dim']}, {'causal' if cfg['causal'] else 'non-causal'}, {cfg['dtype']}; "
        f"median of {cfg['repeats']} after {cfg['warmup']} warm-up (compile excluded). "
        "Errors: max abs vs each variant's spec reference in float32 (beyond "
        f"T={cfg['ref_max_len']}: last {cfg['ref_slice']} query rows where the reference "
        "takes q_offset, no gradients).",
        "",
        _variants_line(result),
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
        *_rerun_section(result),
        "",
        "![time and memory vs T](attention.png)",
        "",
    ])


def _plot(result: dict, path: str) -> None:
    """Two log-log panels: time vs T (forward solid, fwd+bwd dashed, floor dotted) and
    compiled temp memory vs T."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax_t, ax_m = fig.subplots(1, 2)
    plot_records(ax_t, ax_m, result["records"])
    floors = result["floors"]
    ax_t.plot([f["seq_len"] for f in floors], [f["floor_s"] for f in floors], ":k",
              label="fwd floor (FLOPs / matmul rate)")
    log_axes(ax_t, "median time (s)")
    log_axes(ax_m, "compiled temp memory (MiB)")
    fig.suptitle(figure_title("attention", result["config"], result["machine"]))
    fig.savefig(path, dpi=120)


def write_reports(result: dict, out_dir: str) -> dict[str, str]:
    """Write ``attention.json``, ``attention.md`` and ``attention.png`` into ``out_dir``."""
    return write_report(result, out_dir, "attention", _markdown(result), {"attention": _plot})


# ----------------------------------------------------------------------------
# Rerunnable commands
# ----------------------------------------------------------------------------
def config_to_command(config: AttentionBenchConfig) -> str:
    """The ``lcjax bench attention`` command line that reruns ``config``."""
    flags = [("--variants", config.variants), ("--seq-lens", config.seq_lens),
             ("--batch", config.batch), ("--heads", config.heads),
             ("--kv-heads", config.kv_heads), ("--head-dim", config.head_dim),
             ("--causal", config.causal), ("--dtype", config.dtype),
             ("--repeats", config.repeats), ("--warmup", config.warmup),
             ("--backward", config.backward)]
    if config.each_implementation:
        flags.append(("--each-implementation", True))
    for label, opts in config.options.items():
        flags.append(("--option", f"{label}:" + ",".join(f"{k}={v}" for k, v in opts.items())))
    for label, cap in config.max_len.items():
        flags.append(("--max-len", f"{label}={cap or 0}"))
    flags += [("--ref-max-len", config.ref_max_len), ("--ref-slice", config.ref_slice),
              ("--matmul-n", config.matmul_n), ("--anchor", config.anchor),
              ("--candidate", config.candidate), ("--seed", config.seed),
              ("--out", config.out_dir or "none")]
    return command_line(["lcjax", "bench", "attention"], flags)


def row_command(config: AttentionBenchConfig, case: Case) -> str:
    """The ``lcjax bench attention`` command that reruns ``case`` alone under ``config``'s
    timing and reference settings (same inputs: they depend on the seed, T and shapes)."""
    target = case.variant + (f"@{case.implementation}" if case.implementation else "")
    entry = target if case.name == target else f"{case.name}={target}"
    one = dataclasses.replace(
        config, variants=(entry,), seq_lens=(case.seq_len,), each_implementation=False,
        options={case.name: dict(case.options)} if case.options else {},
        max_len={case.name: case.max_len or 0}, out_dir=None)
    return config_to_command(one)
