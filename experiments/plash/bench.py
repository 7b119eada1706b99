"""``python -m experiments.plash.bench``: PLASH against blockwise softmax, Performer and Nyström.

Time (median of ``repeats`` compiled forward calls) and XLA's compiled temporary memory vs
N (self-attention, T = S = N) for blockwise softmax, PLASH at several M, Performer FAVOR+
and Nyström; the log–log slope of each method's time from 4K to the longest N; the
PLASH / blockwise time ratio at 32K; and PLASH's error against exact softmax, its
certificate and the certificate's tightness (certificate ÷ true deviation) vs M, on random
q/k at a short length and on the real q/k of every layer of a small ``DecoderLM`` trained
in-process on Shakespeare (``--train-steps``; ``experiments.entmax.trained``: the model's own
post-RoPE attention inputs on a held-out window). Non-causal by default (Nyström has no
causal form); ``--causal`` times the causal variants only.

    python -m experiments.plash.bench [--seq-lens 1024,...,65536] [--prototypes 16,64]
    [--head-dim 64]
        [--repeats 3] [--causal] [--train-steps 300] [--model-len 512]
        [--out reports/bench/plash]
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import parse_bench_args
from lcjax.attention.core import blockwise_attention, dot_product_attention
from lcjax.attention.nystrom import nystrom_attention
from lcjax.attention.performer import performer_attention
from lcjax.attention.plash import default_prototypes, plash_attention
from lcjax.bench.report import cli_args, write_results_json
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
    p.add_argument("--train-steps", type=int, default=300,
                   help="steps of the trained model whose q/k are measured (0: none)")
    p.add_argument("--model-len", type=int, default=512,
                   help="training length and held-out window length of the trained model")
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


def quality_rows(q, k, v, ms, *, causal: bool, sketch_dim: int, chunk: int = 256,
                 scale: float | None = None, log=print, **extra) -> list[dict]:
    """PLASH (default prototypes, M in ``ms``) against exact softmax on q [B, T, H, D],
    k, v [B, S, Hkv, D]: per M the mean deviation ‖PLASH − softmax‖₂ over rows, the mean
    and relative (÷ mean ‖softmax‖) deviation, the mean certificate, whether it holds on
    every row (1e-4 rounding slack), and the median tightness (certificate ÷ deviation over
    rows whose deviation exceeds 1e-6). ``extra`` is merged into every row."""
    exact = dot_product_attention(q, k, v, causal=causal, scale=scale).astype(jnp.float32)
    scale_out = float(jnp.mean(jnp.linalg.norm(exact, axis=-1)))
    out_rows = []
    for m in ms:
        protos = default_prototypes(k, m, causal=causal, chunk=chunk)
        out, aux = plash_attention(q, k, v, protos, causal=causal, chunk=chunk, scale=scale,
                                   sketch_dim=sketch_dim, return_aux=True)
        dev = np.asarray(jnp.linalg.norm(out.astype(jnp.float32) - exact, axis=-1))
        cert = np.asarray(aux["certificate"])
        tight = cert[dev > 1e-6] / dev[dev > 1e-6]
        row = {**extra, "M": int(m), "mean_error": float(dev.mean()),
               "relative_error": float(dev.mean()) / max(scale_out, 1e-30),
               "mean_certificate": float(cert.mean()),
               "certificate_holds": bool(np.all(cert >= dev - 1e-4)),
               "median_tightness": float(np.median(tight)) if tight.size else None}
        out_rows.append(row)
        where = "".join(f"{key}={val} " for key, val in extra.items())
        tight_s = "n/a" if row["median_tightness"] is None else f"{row['median_tightness']:.1f}"
        log(f"  {where}M={m:>4}: mean ||PLASH - softmax|| {row['mean_error']:.4f} "
            f"({row['relative_error']:.3f} of ||softmax||), mean certificate "
            f"{row['mean_certificate']:.4f}, median tightness {tight_s}, holds on every row: "
            f"{row['certificate_holds']}")
    return out_rows


def _trained_quality(args, ms):
    """Error and certificate vs M on the q/k/v of each layer of a small softmax DecoderLM
    trained for ``args.train_steps`` steps (``experiments.entmax.trained``), on one held-out
    window of ``args.model_len`` tokens."""
    from experiments.entmax import trained
    from lcjax.data import VOCAB_SIZE
    from lcjax.nn import DecoderConfig
    from lcjax.train import TrainConfig

    model_cfg = DecoderConfig(vocab_size=VOCAB_SIZE, d_model=128, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=32, mlp_hidden=512,
                              max_len=args.model_len, attention="softmax")
    train_cfg = TrainConfig(steps=args.train_steps, batch_size=8, seq_len=args.model_len,
                            warmup_steps=min(100, args.train_steps // 10), eval_batches=4,
                            progress=False)
    print(f"trained q/k: DecoderLM (2 layers, d=128, 4 heads / 2 kv heads x 32) trained "
          f"{args.train_steps} steps on Shakespeare at length {args.model_len} ...")
    model, info = trained.train_model(model_cfg, train_cfg)
    window = trained.heldout_windows(args.model_len, 1, train_cfg)
    rows = []
    for layer, (q, k, v, scale) in enumerate(trained.capture_qkv(model, window)):
        rows += quality_rows(q, k, v, [m for m in ms if m < args.model_len],
                             causal=args.causal, sketch_dim=args.sketch_dim, scale=scale,
                             layer=layer)
    return rows, info


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
    # error and certificate vs M on random q/k, then on a trained model's q/k
    ms = sorted(set(args.prototypes) | {4, 256})
    q, k, v = _inputs(args.error_len, args.heads, args.head_dim, seed=1)
    print(f"random q/k (N={args.error_len}, d={args.head_dim}):")
    quality = quality_rows(q, k, v, [m for m in ms if m < args.error_len], causal=args.causal,
                           sketch_dim=args.sketch_dim)
    trained_quality, model_info = [], None
    if args.train_steps > 0:
        trained_quality, model_info = _trained_quality(args, ms)
    result = {"rows": rows, "slopes": slopes, "blockwise_over_plash_32k": ratio,
              "quality_random": quality, "quality_trained": trained_quality,
              "trained_model": model_info, "machine": machine_info(),
              "args": cli_args(args)}
    write_results_json(result, args.out)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags of :func:`add_arguments`, parsed from ``argv`` (without the program name)."""
    return parse_bench_args("plash", add_arguments, argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.plash.bench [flags]``: parse, run, print; 0 on completion."""
    return run_cli(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
