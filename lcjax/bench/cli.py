"""``lcjax bench ...``: benchmark subcommands for users' shapes (``attention``,
``context_parallel``, ``serve``). The paper-claim benchmarks moved to the lab:
``python -m experiments.entmax.bench`` (was ``lcjax bench entmax``), and likewise
``experiments.token_sparse.bench``, ``experiments.plash.bench`` and
``experiments.flashblock.bench``.

    lcjax bench attention [--variants softmax,bw=blockwise,entmax@xla] [--each-implementation]
        [--seq-lens 512,1024,...] [--batch 1 --heads 8 --head-dim 64] [--causal/--no-causal]
        [--dtype float32] [--repeats 5] [--warmup 1] [--backward/--no-backward]
        [--option blockwise:block_q=256] [--max-len jax=8192] [--out DIR] [--quick]
        (default variants: every registered one, ``lcjax.attention.available()``)
    lcjax bench context_parallel [--seq-lens 8192,32768] [--budget-mib M] [--kv-heads 8]
        (Ulysses / Ring / UPipe memory and step time; ``lcjax.bench.context_parallel``)
    lcjax bench serve [--clients 8 --requests 400 --max-seconds 60] [--out FILE]
        (bounded load on lcjax serve at 127.0.0.1: latency p50/p95, throughput, RSS;
        ``lcjax.bench.serve``)
"""

from __future__ import annotations

import argparse

from lcjax.bench import context_parallel as context_parallel_bench
from lcjax.bench import serve as serve_bench
from lcjax.bench.attention import (
    DEFAULT_MAX_LEN,
    DEFAULT_SEQ_LENS,
    QUICK_SEQ_LENS,
    AttentionBenchConfig,
    format_headline,
    format_table,
    parse_options,
    run_attention_benchmark,
)

QUICK_REPEATS = 2


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _str_list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``bench`` subcommands on ``parser``."""
    sub = parser.add_subparsers(dest="bench", required=True)
    p = sub.add_parser("attention", help="time, memory and error of attention variants",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--variants", type=_str_list, default=None,
                   help="comma list of [label=]name[@implementation] (default: every "
                   "registered variant)")
    p.add_argument("--each-implementation", action="store_true",
                   help="one row per implementation of variants that have several")
    p.add_argument("--seq-lens", type=_int_list, default=None,
                   help=f"comma list of T (default {','.join(map(str, DEFAULT_SEQ_LENS))})")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=None, help="timed calls (default 5)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--backward", action=argparse.BooleanOptionalAction, default=True,
                   help="also time forward+backward")
    p.add_argument("--option", action="append", default=[], metavar="LABEL:KEY=VALUE[,...]",
                   help="per-variant keyword option, e.g. blockwise:block_q=256 (repeatable)")
    p.add_argument("--max-len", action="append", default=[], metavar="LABEL=T",
                   help=f"longest T for a variant, 0 = no cap (defaults {DEFAULT_MAX_LEN})")
    p.add_argument("--ref-max-len", type=int, default=4096,
                   help="dense reference over all rows up to this T; beyond, a slice")
    p.add_argument("--ref-slice", type=int, default=256, help="query rows checked beyond it")
    p.add_argument("--matmul-n", type=int, default=2048, help="size of the matmul measured")
    p.add_argument("--anchor", default="jax", help="headline baseline label")
    p.add_argument("--candidate", default="blockwise", help="headline candidate label")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="reports/bench/attention", help="'none' writes no files")
    p.add_argument("--quick", action="store_true",
                   help=f"T in {QUICK_SEQ_LENS}, {QUICK_REPEATS} repeats (unless given)")
    context_parallel_bench.add_arguments(sub)
    serve_bench.add_arguments(sub)


def _parse_max_len(specs) -> dict[str, int]:
    caps = dict(DEFAULT_MAX_LEN)
    for spec in specs:
        label, sep, value = spec.partition("=")
        if not sep:
            raise ValueError(f"--max-len expects LABEL=T, got {spec!r}")
        caps[label.strip()] = int(value)
    return caps


def config_from_args(args: argparse.Namespace) -> AttentionBenchConfig:
    """The benchmark configuration described by parsed ``bench attention`` arguments."""
    seq_lens = args.seq_lens or (QUICK_SEQ_LENS if args.quick else DEFAULT_SEQ_LENS)
    repeats = args.repeats if args.repeats is not None else (QUICK_REPEATS if args.quick else 5)
    out = None if args.out.lower() in ("", "none") else args.out
    return AttentionBenchConfig(
        variants=args.variants, seq_lens=seq_lens, batch=args.batch, heads=args.heads,
        kv_heads=args.kv_heads, head_dim=args.head_dim, causal=args.causal, dtype=args.dtype,
        repeats=repeats, warmup=args.warmup, backward=args.backward,
        each_implementation=args.each_implementation, options=parse_options(args.option),
        max_len=_parse_max_len(args.max_len),
        ref_max_len=args.ref_max_len, ref_slice=args.ref_slice, matmul_n=args.matmul_n,
        anchor=args.anchor, candidate=args.candidate, seed=args.seed, out_dir=out,
    )


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark, print its table and headline; 0 on completion."""
    if args.bench == "context_parallel":
        return context_parallel_bench.run_cli(args)
    if args.bench == "serve":
        return serve_bench.run_cli(args)
    if args.bench != "attention":
        raise ValueError(f"unknown benchmark {args.bench!r}")
    result = run_attention_benchmark(config_from_args(args))
    print()
    print(format_table(result))
    print()
    mm = result["matmul"]
    print(f"XLA matmul throughput: {mm['gflops']:.1f} GFLOP/s "
          f"({mm['n']}^2 f32; before {mm['before']['gflops']:.1f}, "
          f"after {mm['after']['gflops']:.1f})")
    print(format_headline(result["headline"]))
    for path in result.get("files", {}).values():
        print(f"wrote {path}")
    return 0
