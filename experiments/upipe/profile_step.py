"""Where one training step of the attention layer spends its time, Ulysses vs UPipe
(untied Ulysses, ICML 2026): a ``jax.profiler`` trace of a few ``value_and_grad`` steps
on 8 host devices, the XLA ops' thread time summed per step by kind of op.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python -m experiments.upipe.profile_step --seq-len 512 --kv-heads 8 \\
        --strategies ulysses,upipe,upipe+out

The times are the ops' durations on their threads, summed over the 8 device threads, so
on a machine with fewer cores than devices they include time a thread waited for a core;
compare columns of one run, not runs. ``sync`` (rendezvous and waits) is listed apart
and left out of the total. Op names are XLA's fusion names, grouped by what they do
(:func:`op_kind`); ``--top`` also lists the largest single ops with the HLO line that
made them (``compiled.as_text()``).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import tempfile

KINDS = ("dot", "copy/transpose", "dynamic slice/update", "all-to-all", "all-reduce",
         "other")
_SKIP = ("ThunkExecutor", "$", "Pjit", "Common", "while", "Slinky", "PjRt", "Execute")


def op_kind(name: str) -> str | None:
    """The kind of a trace event named ``name``: one of :data:`KINDS`, ``"sync"``
    (rendezvous, waits), or None (runtime wrappers and loops, whose ops are listed on
    their own)."""
    if name.startswith(("Rendezvous", "Wait")):
        return "sync"
    if name.startswith(_SKIP) or "block_until" in name:
        return None
    if name.startswith(("ynn", "dot", "custom-call")):
        return "dot"
    for kind, marks in (("all-to-all", ("all-to-all",)), ("all-reduce", ("all-reduce",)),
                        ("copy/transpose", ("copy", "transpose")),
                        ("dynamic slice/update", ("dynamic-slice", "dynamic-update"))):
        if any(m in name for m in marks):
            return kind
    return "other"


def op_times(trace_dir: str, steps: int) -> tuple[collections.Counter, collections.Counter]:
    """(seconds per step by kind, seconds per step by op name) of the perfetto trace
    under ``trace_dir``."""
    path = glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True)[0]
    with gzip.open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kinds, ops = collections.Counter(), collections.Counter()
    for e in events:
        kind = op_kind(e["name"]) if e.get("ph") == "X" else None
        if kind is not None:
            kinds[kind] += e["dur"] / 1e6 / steps
            if kind != "sync":
                ops[e["name"]] += e["dur"] / 1e6 / steps
    return kinds, ops


def profile(strategy: str, *, seq_len: int, kv_heads: int, heads: int = 32,
            head_dim: int = 64, context: int = 8, steps: int = 3):
    """(kinds, ops, hlo text) of ``steps`` traced training steps of ``strategy``."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from lcjax.bench.context_parallel import layer_step
    from lcjax.parallel import make_mesh

    mesh = make_mesh(data=1, context=context, devices=jax.devices()[:context])
    init, step, d_model = layer_step(strategy, mesh, heads=heads, kv_heads=kv_heads,
                                     head_dim=head_dim, causal=True,
                                     block=min(512, seq_len // context), value=True)
    params = jax.device_put(init(jax.random.PRNGKey(0)), NamedSharding(mesh, P()))
    x = jax.device_put(jax.random.normal(jax.random.PRNGKey(1), (1, seq_len, d_model)),
                       NamedSharding(mesh, P("data", "context", None)))
    for _ in range(2):
        jax.block_until_ready(step(params, x, x))
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(steps):
                jax.block_until_ready(step(params, x, x))
        kinds, ops = op_times(tmp, steps)
    return kinds, ops, step.lower(params, x, x).compile().as_text()


def hlo_line(hlo: str, op: str) -> str:
    """The HLO instruction defining ``op`` (its shape and op_name), shortened."""
    m = re.search(rf"^\s*%{re.escape(op)} = ([^\n]*)", hlo, re.M)
    if not m:
        return ""
    line = m.group(1)
    name = re.search(r'op_name="([^"]*)"', line)
    return f"{line.split(' ')[0]}  {name.group(1) if name else ''}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.upipe.profile_step")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--strategies", default="ulysses,upipe")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=0, help="also list the largest ops")
    args = parser.parse_args(argv)
    names = args.strategies.split(",")
    results = {s: profile(s, seq_len=args.seq_len, kv_heads=args.kv_heads, steps=args.steps)
               for s in names}
    print(f"T = {args.seq_len}, Hkv = {args.kv_heads}: op thread-seconds per step")
    print(f"{'kind':<22}" + "".join(f"{s:>12}" for s in names))
    for kind in (*KINDS, "sync"):
        print(f"{kind:<22}" + "".join(f"{results[s][0][kind]:12.2f}" for s in names))
    print(f"{'total (without sync)':<22}" + "".join(
        f"{sum(v for k, v in results[s][0].items() if k != 'sync'):12.2f}" for s in names))
    for s in names if args.top else ():
        print(f"\n{s}: largest ops")
        for op, sec in results[s][1].most_common(args.top):
            print(f"  {sec:7.2f} s  {op:<36} {hlo_line(results[s][2], op)[:110]}")


if __name__ == "__main__":
    main()
