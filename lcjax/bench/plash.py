"""``lcjax bench plash``: PLASH against blockwise softmax, Performer and Nyström.

Time (median of ``repeats`` compiled forward calls) and XLA's compiled temporary memory vs
N (self-attention, T = S = N) for blockwise softmax, PLASH at several M, Performer FAVOR+
and Nyström; the log–log slope of each method's time from 4K to the longest N; the
PLASH / blockwise time ratio at 32K; and, on random q/k at a short length, PLASH's error
against exact softmax and its certificate vs M (docs/plash.md). Non-causal by default
(Nyström has no causal form); ``--causal`` times the causal variants only.

    lcjax bench plash [--seq-lens 1024,...,65536] [--prototypes 16,64] [--head-dim 64]
        [--repeats 3] [--causal] [--out reports/bench/plash]
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from lcjax.attention.core import blockwise_attention, dot_product_attention
from lcjax.attention.nystrom import nystrom_attention
from lcjax.attention.performer import performer_attention
from lcjax.attention.plash import default_prototypes, plash_attention
from lcjax.bench.timing import compile_fn, machine_info, temp_bytes, time_compiled

DEFAULT_SEQ_LENS = (1024, 4096, 16384, 32768, 65536)


def _ints(text):
    return tuple(int(x) for x in text.split(",") if x.strip())


def add_arguments(sub) -> None:
    p = sub.add_parser("plash", help="PLASH vs blockwise softmax, Performer, Nystrom",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seq-lens", type=_ints, default=DEFAULT_SEQ_LENS)
    p.add_argument("--prototypes", type=_ints, default=(16, 64))
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--sketch-dim", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--blockwise-max-len", type=int, default=32768,
                   help="longest N timed for blockwise softmax (quadratic)")
    p.add_argument("--error-len", type=int, default=2048)
    p.add_argument("--out", default="reports/bench/plash", help="'none' writes no files")


def _methods(args):
    out = {"blockwise": lambda q, k, v: blockwise_attention(q, k, v, causal=args.causal)}
    for m in args.prototypes:
        def plash(q, k, v, m=m):
            protos = default_prototypes(k, m, causal=args.causal, chunk=256)
            return plash_attention(q, k, v, protos, causal=args.causal, chunk=256,
                                   sketch_dim=args.sketch_dim)
        out[f"plash M={m}"] = plash
    out["performer"] = lambda q, k, v: performer_attention(q, k, v, causal=args.causal,
                                                           num_features=64, chunk=256)
    if not args.causal:
        out["nystrom"] = lambda q, k, v: nystrom_attention(q, k, v, num_landmarks=64)
    return out


def _inputs(n, heads, d, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    return tuple(jax.random.normal(kk, (1, n, heads, d)) for kk in keys)


def run_cli(args) -> int:
    rows = []
    methods = _methods(args)
    for n in args.seq_lens:
        q, k, v = _inputs(n, args.heads, args.head_dim)
        for name, fn in methods.items():
            if name == "blockwise" and n > args.blockwise_max_len:
                continue
            compiled, compile_s = compile_fn(fn, (q, k, v))
            times, _ = time_compiled(compiled, (q, k, v), repeats=args.repeats, warmup=1)
            row = {"method": name, "n": n, "median_s": float(np.median(times)),
                   "temp_mib": (temp_bytes(compiled) or 0) / 2**20, "compile_s": compile_s}
            rows.append(row)
            print(f"{name:>14} N={n:>6}: {row['median_s'] * 1e3:9.1f} ms  "
                  f"temp {row['temp_mib']:8.1f} MiB", flush=True)
    slopes = {}
    for name in methods:
        pts = [(r["n"], r["median_s"]) for r in rows if r["method"] == name and r["n"] >= 4096]
        if len(pts) >= 2:
            x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
            slopes[name] = float(np.polyfit(x, y, 1)[0])
    print("log-log slope of time, N >= 4096:", {k: round(v, 3) for k, v in slopes.items()})
    ratio = {}
    at = {(r["method"], r["n"]): r["median_s"] for r in rows}
    for m in args.prototypes:
        if ("blockwise", 32768) in at and (f"plash M={m}", 32768) in at:
            ratio[m] = at[("blockwise", 32768)] / at[(f"plash M={m}", 32768)]
    print("blockwise / PLASH time at N=32768:", {m: round(r, 2) for m, r in ratio.items()})
    # error and certificate vs M on random q/k
    q, k, v = _inputs(args.error_len, args.heads, args.head_dim, seed=1)
    exact = dot_product_attention(q, k, v, causal=args.causal)
    quality = []
    for m in sorted(set(args.prototypes) | {4, 256}):
        out, aux = plash_attention(q, k, v, default_prototypes(k, m, causal=args.causal,
                                                                chunk=256),
                                   causal=args.causal, chunk=256, sketch_dim=args.sketch_dim,
                                   return_aux=True)
        dev = jnp.linalg.norm(out - exact, axis=-1)
        quality.append({"M": m, "mean_error": float(dev.mean()),
                        "mean_certificate": float(aux["certificate"].mean()),
                        "certificate_holds": bool(jnp.all(aux["certificate"] >= dev - 1e-4))})
        print(f"M={m:>4}: mean ||PLASH - softmax|| {quality[-1]['mean_error']:.4f}, "
              f"mean certificate {quality[-1]['mean_certificate']:.4f}, "
              f"holds on every row: {quality[-1]['certificate_holds']}")
    result = {"rows": rows, "slopes": slopes, "blockwise_over_plash_32k": ratio,
              "quality_random": quality, "machine": machine_info(), "args": {
                  k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, tuple,
                                                                         bool))}}
    if args.out.lower() not in ("", "none"):
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "results.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"wrote {path}")
    return 0
