"""``python -m experiments.token_sparse.bench``: prefill attention time of Token Sparse
Attention, scoring
included, against dense blockwise softmax, at several sequence lengths and coverages.

For each T (random q, k, v [B, T, H, D], causal, shared by every row of that T):

* the budget K of each coverage on these inputs (``token_scores`` + ``select_tokens``,
  eager), then ``token_sparse_attention(..., coverage=c, capacity=K, inner="blockwise")``
  jitted — scoring, selection, gather, inner blockwise attention on the kept tokens and
  scatter, all inside the timed call;
* the scoring pass alone (scores + selection), to show its share;
* dense ``blockwise`` attention (the same block sizes), the baseline.

All functions of one T are timed in interleaved rounds (``lcjax.bench.timing.
time_interleaved``), so the ratios come from one run under the same load. Rows report the
kept fraction (selected (token, head) pairs / (T·H)), the budget, the medians and the
speed-up dense / token-sparse. JSON + markdown + PNG under ``reports/bench/token_sparse``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time

import jax
import jax.numpy as jnp

from experiments.common import parse_bench_args, print_bench_result
from lcjax.attention import blockwise_attention
from lcjax.attention.token_sparse import select_tokens, token_scores, token_sparse_attention
from lcjax.bench.report import command_line, figure_title, log_axes, machine_line, write_report
from lcjax.bench.timing import machine_info, time_interleaved

__all__ = ["TokenSparseBenchConfig", "add_arguments", "format_summary", "run_cli",
           "run_token_sparse_benchmark"]


@dataclasses.dataclass(frozen=True)
class TokenSparseBenchConfig:
    """Shapes, coverages and repeats of one run."""

    seq_lens: tuple[int, ...] = (4096, 8192, 16384, 32768)
    coverages: tuple[float, ...] = (0.01, 0.1, 0.3, 0.5)
    batch: int = 1
    heads: int = 8
    kv_heads: int | None = None
    head_dim: int = 64
    dtype: str = "float32"
    window: int = 128
    min_tokens: int = 1024
    pool: int = 7
    block: int = 512  # block_q = block_kv of blockwise attention, inner and dense alike
    repeats: int = 3
    warmup: int = 1
    seed: int = 0
    out_dir: str | None = "reports/bench/token_sparse"

    @classmethod
    def quick(cls, **overrides) -> TokenSparseBenchConfig:
        base = dict(seq_lens=(2048, 4096), coverages=(0.1, 0.5), repeats=2, min_tokens=512)
        return cls(**{**base, **overrides})

    def __post_init__(self):
        for t in self.seq_lens:
            if t <= self.min_tokens + self.window:
                raise ValueError(f"TokenSparseBenchConfig: T={t} <= min_tokens + window = "
                                 f"{self.min_tokens + self.window} is always dense")
        for c in self.coverages:
            if not 0 < c < 1:
                raise ValueError(f"TokenSparseBenchConfig: coverages must be in (0, 1), got {c}")


def _inputs(cfg: TokenSparseBenchConfig, t: int):
    kv = cfg.kv_heads or cfg.heads
    kq, kk, kv_ = jax.random.split(jax.random.key(cfg.seed + t), 3)
    dt = jnp.dtype(cfg.dtype)
    return (jax.random.normal(kq, (cfg.batch, t, cfg.heads, cfg.head_dim), dt),
            jax.random.normal(kk, (cfg.batch, t, kv, cfg.head_dim), dt),
            jax.random.normal(kv_, (cfg.batch, t, kv, cfg.head_dim), dt))


def _one_length(cfg: TokenSparseBenchConfig, t: int) -> list[dict]:
    q, k, v = _inputs(cfg, t)
    blocks = dict(block_q=cfg.block, block_kv=cfg.block)
    scores = jax.jit(functools.partial(token_scores, window=cfg.window, pool=cfg.pool,
                                       block_kv=cfg.block))(q, k)
    fns = {"dense": (jax.jit(functools.partial(blockwise_attention, causal=True, **blocks)),
                     (q, k, v), True)}
    info = {}
    for c in cfg.coverages:
        sel = select_tokens(scores, coverage=c, min_tokens=cfg.min_tokens, window=cfg.window)
        cap = max(int(jnp.max(sel.budget)), 1)
        kept = float(jnp.mean(sel.valid.sum(-1))) / t
        info[c] = {"budget": int(jnp.max(sel.budget)), "dense": bool(jnp.all(sel.dense)),
                   "kept_fraction": 1.0 if bool(jnp.all(sel.dense)) else kept}
        opts = dict(coverage=c, min_tokens=cfg.min_tokens, window=cfg.window, pool=cfg.pool,
                    capacity=cap, inner="blockwise", inner_options=blocks,
                    block_kv=cfg.block, implementation="xla")
        fns[f"token_sparse@{c:g}"] = (jax.jit(functools.partial(
            token_sparse_attention, causal=True, **opts)), (q, k, v), True)

        def scoring(q, k, c=c, cap=cap):
            s = token_scores(q, k, window=cfg.window, pool=cfg.pool, block_kv=cfg.block)
            return select_tokens(s, coverage=c, min_tokens=cfg.min_tokens, window=cfg.window,
                                 capacity=cap).indices

        fns[f"scoring@{c:g}"] = (jax.jit(scoring), (q, k), True)
    start = time.perf_counter()
    stats, _ = time_interleaved(fns, repeats=cfg.repeats, warmup=cfg.warmup)
    wall = time.perf_counter() - start
    dense = stats["dense"]["median_s"]
    rows = [{"T": t, "variant": "blockwise (dense)", "coverage": 0.0, "kept_fraction": 1.0,
             "budget": t - cfg.window, **stats["dense"], "speedup": 1.0, "wall_s": wall}]
    for c in cfg.coverages:
        ts, sc = stats[f"token_sparse@{c:g}"], stats[f"scoring@{c:g}"]
        rows.append({"T": t, "variant": "token_sparse", "coverage": c, **info[c], **ts,
                     "scoring_median_s": sc["median_s"],
                     "scoring_share": sc["median_s"] / ts["median_s"],
                     "speedup": dense / ts["median_s"], "wall_s": wall})
    return rows


def _command(cfg: TokenSparseBenchConfig) -> str:
    return command_line(["python", "-m", "experiments.token_sparse.bench"], [
        ("--seq-lens", cfg.seq_lens), ("--coverages", cfg.coverages), ("--batch", cfg.batch),
        ("--heads", cfg.heads), ("--kv-heads", cfg.kv_heads), ("--head-dim", cfg.head_dim),
        ("--dtype", cfg.dtype), ("--window", cfg.window), ("--min-tokens", cfg.min_tokens),
        ("--block", cfg.block), ("--repeats", cfg.repeats), ("--seed", cfg.seed)])


def format_summary(result: dict) -> str:
    """Markdown: the command, the machine, one table row per (T, variant)."""
    lines = ["# Token Sparse Attention: prefill time vs dense blockwise softmax", "",
             f"`{result['command']}`", "", machine_line(result["machine"]), "",
             "| T | variant | coverage | kept fraction | budget K | median ms | scoring ms "
             "| speed-up vs dense |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        sc = f"{1e3 * r['scoring_median_s']:.1f}" if "scoring_median_s" in r else ""
        lines.append(f"| {r['T']} | {r['variant']} | {r['coverage']:g} | "
                     f"{r['kept_fraction']:.3f} | {r['budget']} | {1e3 * r['median_s']:.1f} | "
                     f"{sc} | {r['speedup']:.2f}x |")
    lines += ["", "Speed-up = dense median / token-sparse median, timed in interleaved rounds "
              "in one run (scoring, selection, gather, inner blockwise and scatter inside the "
              "token-sparse call). Random inputs: attention is diffuse, so a coverage drops "
              "about that fraction of the prefix; trained models concentrate attention and "
              "drop more at the same coverage."]
    best = result.get("best_at_longest")
    if best:
        lines += ["", f"Longest T = {best['T']}: best speed-up {best['speedup']:.2f}x at "
                  f"coverage {best['coverage']:g} (kept fraction {best['kept_fraction']:.3f})."]
    return "\n".join(lines) + "\n"


def _plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    rows = [r for r in result["rows"] if r["variant"] == "token_sparse"]
    for c in sorted({r["coverage"] for r in rows}):
        sub = [r for r in rows if r["coverage"] == c]
        ax1.plot([r["T"] for r in sub], [r["speedup"] for r in sub], "o-",
                 label=f"coverage {c:g}")
        ax2.plot([r["T"] for r in sub], [r["kept_fraction"] for r in sub], "o-",
                 label=f"coverage {c:g}")
    ax1.axhline(1.0, color="gray", lw=0.8)
    ax1.axhline(2.0, color="gray", lw=0.8, ls="--")
    log_axes(ax1, "speed-up vs dense blockwise", log_y=False)
    log_axes(ax2, "kept fraction of (token, head) pairs", log_y=False)
    fig.suptitle(figure_title("Token Sparse Attention prefill", result["config"],
                              result["machine"]), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_token_sparse_benchmark(cfg: TokenSparseBenchConfig, *, verbose: bool = True) -> dict:
    """Run every T; returns the result dict (and writes the files when ``cfg.out_dir``)."""
    rows = []
    for t in cfg.seq_lens:
        for r in _one_length(cfg, t):
            rows.append(r)
            if verbose:
                print(f"T={t} {r['variant']} coverage={r['coverage']:g}: "
                      f"{1e3 * r['median_s']:.1f} ms, kept {r['kept_fraction']:.3f}, "
                      f"{r['speedup']:.2f}x", flush=True)
    result = {"config": {**dataclasses.asdict(cfg), "causal": True}, "machine": machine_info(),
              "command": _command(cfg), "rows": rows}
    longest = [r for r in rows if r["T"] == max(cfg.seq_lens) and r["variant"] == "token_sparse"]
    if longest:
        result["best_at_longest"] = max(longest, key=lambda r: r["speedup"])
    if cfg.out_dir:
        result["files"] = write_report(result, cfg.out_dir, "token_sparse",
                                       format_summary(result), {"token_sparse": _plot})
    return result


def _tuple_of(kind):
    return lambda text: tuple(kind(x) for x in text.split(",") if x.strip())


def add_arguments(sub) -> None:
    """Register ``token_sparse`` on the ``lcjax bench`` subparsers ``sub``."""
    d = TokenSparseBenchConfig()
    p = sub.add_parser("token_sparse", help="Token Sparse Attention prefill time vs dense")
    p.add_argument("--seq-lens", type=_tuple_of(int), default=None,
                   help=f"comma list of T (default {d.seq_lens})")
    p.add_argument("--coverages", type=_tuple_of(float), default=None,
                   help=f"comma list (default {d.coverages})")
    for flag, kind in (("--batch", int), ("--heads", int), ("--kv-heads", int),
                       ("--head-dim", int), ("--dtype", str), ("--window", int),
                       ("--min-tokens", int), ("--block", int), ("--repeats", int),
                       ("--seed", int)):
        name = flag[2:].replace("-", "_")
        p.add_argument(flag, type=kind, default=None, help=f"default {getattr(d, name)!r}")
    p.add_argument("--quick", action="store_true", help="T in (2048, 4096), 2 repeats")
    p.add_argument("--out", default=d.out_dir, help="report folder, 'none' writes no files")


def run_cli(args) -> int:
    """``python -m experiments.token_sparse.bench``: run, print the table; 0 on completion."""
    fields = [f.name for f in dataclasses.fields(TokenSparseBenchConfig)
              if f.name not in ("out_dir",)]
    given = {f: getattr(args, f) for f in fields if getattr(args, f, None) is not None}
    given["out_dir"] = None if args.out.lower() in ("", "none") else args.out
    cfg = (TokenSparseBenchConfig.quick(**given) if args.quick
           else TokenSparseBenchConfig(**given))
    result = run_token_sparse_benchmark(cfg)
    print_bench_result(result, format_summary)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags of :func:`add_arguments`, parsed from ``argv`` (without the program name)."""
    return parse_bench_args("token_sparse", add_arguments, argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.token_sparse.bench [flags]``: parse, run, print; 0 on completion."""
    return run_cli(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
