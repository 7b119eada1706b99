"""``python -m experiments.flashblock.bench``: attention time per denoising step and sampling
tokens/s of
block diffusion, with and without FlashBlock's reuse of the block-external attention.

Attention (one layer's shapes: q [1, b, H, D] of the current block, a history of S keys):

* exact      dense softmax over the S + b keys (``dot_product_attention``), every step;
* split      ``flashblock_attention`` computing the external part (step 0 of a block);
* reuse      ``flashblock_attention`` with a cached external part (the block-internal
             part and the merge only).

Each is jitted and compiled once, then timed as the median of ``repeats`` calls
(``lcjax.bench.timing``). Per block of s steps, attention time without reuse is
``s · exact``, with reuse (``reuse_ratio=None``: reuse at every step after the first)
``split + (s - 1) · reuse``, where "without reuse" takes the cheaper exact path per step,
``min(exact, split)`` (the dense call also copies the history into one key array; its own
ratio is reported as ``block_ratio_vs_dense``); the ratio is printed per S, the headline at
the longest S.

Sampling: a small block-diffusion ``DecoderLM`` (untrained unless ``--train-steps``) after
a prompt of S tokens, ``generate_blocks`` with and without ``flashblock=`` (same seeds):
tokens/s of ``num_blocks`` blocks (second runs, the first compiles; the time of a
1-block run is subtracted from that of a (1 + num_blocks)-block run, which leaves out the
prompt's prefill), the fraction of generated tokens on which the two agree, and each
sampler's mean log-probability of its tokens under the model.

    python -m experiments.flashblock.bench [--histories 1024,...,16384] [--block-size 4] [--steps 4]
        [--heads 8] [--head-dim 64] [--repeats 5] [--sample-histories 1024,4096]
        [--train-steps 0] [--out reports/bench/flashblock]

writes ``flashblock.json`` and ``flashblock.md`` (the command, the machine and its load
average, both tables) into ``--out``.

The timing primitives are those of every lcjax benchmark (``lcjax.bench.timing``); the
attention harness (``lcjax.bench.harness``) times registered variants under the q/k/v
contract, which FlashBlock is not.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import parse_bench_args
from lcjax.attention.core import dot_product_attention
from lcjax.attention.flashblock import (
    FlashBlockConfig,
    flashblock_attention,
    sparse_flashblock_attention,
)
from lcjax.bench.report import cli_args, command_line, machine_line, write_report
from lcjax.bench.timing import compile_fn, machine_info, time_compiled

DEFAULT_HISTORIES = (1024, 2048, 4096, 8192, 16384)


def _ints(text):
    return tuple(int(x) for x in text.split(",") if x.strip())


def add_arguments(sub) -> None:
    p = sub.add_parser("flashblock", help="FlashBlock reuse: attention time per denoising "
                       "step and sampling tokens/s, with and without reuse",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--histories", type=_ints, default=DEFAULT_HISTORIES)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=4, help="denoising steps per block")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sparse-keep", type=float, default=None,
                   help="also time the sparse external part keeping this many history keys "
                        "per head (>= 1) or this fraction of them (< 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-histories", type=_ints, default=(1024, 4096),
                   help="prompt lengths of the sampling measurement (empty: none)")
    p.add_argument("--sample-blocks", type=int, default=2)
    p.add_argument("--train-steps", type=int, default=0,
                   help="train the sampling model this many steps first (0: untrained)")
    p.add_argument("--out", default="reports/bench/flashblock", help="'none' writes no files")


def _sparse_fns(keep):
    """Jitted sparse pieces: the refresh step (scoring, selection, kept part and the
    dropped part, or without it for sparse alone) and a later step (kept part over the
    cached selection, merged with the cached dropped part or not)."""
    def refresh(residual):
        return jax.jit(lambda q, ke, ve, ki, vi: sparse_flashblock_attention(
            q, ke, ve, ki, vi, keep=keep, residual=residual, return_cache=True))

    def later(residual):
        return jax.jit(lambda q, ke, ve, ki, vi, cache: sparse_flashblock_attention(
            q, ke, ve, ki, vi, keep=keep, residual=residual, cache=cache))

    return {"sparse_refresh": refresh(False), "sparse_step": later(False),
            "residual_refresh": refresh(True), "residual_step": later(True)}


def attention_rows(histories, *, block_size, steps, heads, kv_heads, head_dim, repeats,
                   seed=0, sparse_keep=None, log=print) -> list[dict]:
    """Per history length S: median seconds of exact / split / reuse attention and the
    per-block ratio ``s · exact / (split + (s - 1) · reuse)``; with ``sparse_keep`` (keys
    per head, an int, or a float fraction of S) also the sparse external part alone and
    with the residual reuse (``*_refresh`` at step 0, ``*_step`` later) and their per-block
    ratios against the same no-reuse baseline."""
    kv_heads = heads if kv_heads is None else kv_heads
    exact_fn = jax.jit(lambda q, ke, ve, ki, vi: dot_product_attention(
        q, jnp.concatenate([ke, ki], 1), jnp.concatenate([ve, vi], 1)))
    split_fn = jax.jit(lambda q, ke, ve, ki, vi: flashblock_attention(
        q, ke, ve, ki, vi, return_external=True))
    reuse_fn = jax.jit(lambda q, ki, vi, a, lse: flashblock_attention(
        q, ki[:, :0], vi[:, :0], ki, vi, external=(a, lse)))
    rows = []

    def timed(row, name, fn, args):
        """Compile once, time, and return the compiled call's output."""
        compiled, compile_s = compile_fn(fn, args)
        times, out = time_compiled(compiled, args, repeats=repeats, warmup=1)
        row[f"{name}_s"] = float(np.median(times))
        row[f"{name}_compile_s"] = compile_s
        return out

    for s in histories:
        ks = jax.random.split(jax.random.fold_in(jax.random.key(seed), s), 5)
        q = jax.random.normal(ks[0], (1, block_size, heads, head_dim))
        ke, ve = (jax.random.normal(k, (1, s, kv_heads, head_dim)) for k in ks[1:3])
        ki, vi = (jax.random.normal(k, (1, block_size, kv_heads, head_dim)) for k in ks[3:5])
        row = {"history": int(s)}
        exact = timed(row, "exact", exact_fn, (q, ke, ve, ki, vi))
        split, (a, lse) = timed(row, "split", split_fn, (q, ke, ve, ki, vi))
        timed(row, "reuse", reuse_fn, (q, ki, vi, a, lse))
        # without reuse every step pays the cheaper of the two exact paths (the dense call
        # also copies the history into one key array)
        no_reuse = steps * min(row["exact_s"], row["split_s"])
        with_reuse = row["split_s"] + (steps - 1) * row["reuse_s"]
        row["block_ratio"] = no_reuse / with_reuse
        row["block_ratio_vs_dense"] = steps * row["exact_s"] / with_reuse
        err = float(jnp.abs(split - exact).max())
        row["split_max_abs_error"] = err
        if sparse_keep is not None:
            keep = sparse_keep if isinstance(sparse_keep, int) else max(
                1, int(round(sparse_keep * s)))
            fns = _sparse_fns(keep)
            row["sparse_keep"] = keep
            for kind in ("sparse", "residual"):
                args = (q, ke, ve, ki, vi)
                _, cache = timed(row, f"{kind}_refresh", fns[f"{kind}_refresh"], args)
                timed(row, f"{kind}_step", fns[f"{kind}_step"], (*args, cache))
                per_block = row[f"{kind}_refresh_s"] + (steps - 1) * row[f"{kind}_step_s"]
                row[f"{kind}_block_ratio"] = no_reuse / per_block
        rows.append(row)
        log(f"S={s:>6}: exact {row['exact_s'] * 1e3:8.3f} ms  split {row['split_s'] * 1e3:8.3f}"
            f" ms  reuse {row['reuse_s'] * 1e3:8.3f} ms  per-block ratio (s={steps}) "
            f"{row['block_ratio']:.2f}x (vs dense {row['block_ratio_vs_dense']:.2f}x)  "
            f"|split - exact| {err:.1e}", flush=True)
        if sparse_keep is not None:
            log(f"          sparse (keep {row['sparse_keep']}) per-block ratio alone "
                f"{row['sparse_block_ratio']:.2f}x, with residual reuse "
                f"{row['residual_block_ratio']:.2f}x", flush=True)
    return rows


def sampling_rows(histories, *, block_size, steps, num_blocks, train_steps, repeats=3,
                  seed=0, log=print) -> tuple[list[dict], dict]:
    """Tokens/s of ``generate_blocks`` with and without FlashBlock reuse after prompts of
    each length (medians of ``repeats`` runs; NaN when the (1 + num_blocks)-block run is
    not slower than the 1-block one, i.e. the denoising time is lost in the noise),
    agreement of the two samplers and their mean log-probabilities."""
    from flax import nnx

    from lcjax.nn import DecoderLM
    from lcjax.nn import diffusion as D

    longest = max(histories) + num_blocks * block_size
    cfg = D.diffusion_config(d_model=64, num_layers=2, num_heads=4, num_kv_heads=4,
                             head_dim=16, mlp_hidden=256, max_len=longest)
    info = {"config": "d=64, 2 layers, 4 heads x 16", "train_steps": train_steps}
    if train_steps:
        from lcjax.train import TrainConfig, train
        from lcjax.train import diffusion as TD

        run = train(cfg, TrainConfig(steps=train_steps, warmup_steps=min(50, train_steps // 10),
                                     lr=3e-3, eval_batches=0, progress=False),
                    dataset=TD.diffusion_dataset(128, 16, seed=seed),
                    loss_fn=TD.MaskedDiffusionLoss(block_size))
        model = run.model
        info["final_masked_nll"] = run.history[-1].get("masked_nll")
    else:
        model = DecoderLM(cfg, rngs=nnx.Rngs(seed))
    from lcjax.data import tokenizer
    from lcjax.data.corpus import shakespeare_split

    text = tokenizer.encode("\n".join(d.text for d in shakespeare_split()[1]))  # held out
    if len(text) < max(histories):
        raise ValueError(f"sampling: held-out text has {len(text)} bytes < {max(histories)}")
    rows = []
    for s in histories:
        prompt = jnp.asarray(text[:s][None])
        kw = dict(block_size=block_size, rng=jax.random.key(seed))
        results = {}
        for name, fb in (("exact", None), ("reuse", FlashBlockConfig())):
            times = {}
            for nb in (1, 1 + num_blocks):  # the difference leaves out the prompt's prefill
                D.generate_blocks(model, prompt, nb, steps, flashblock=fb, **kw)  # compile
                runs = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    out = D.generate_blocks(model, prompt, nb, steps, flashblock=fb, **kw)
                    jax.block_until_ready(out.tokens)
                    runs.append(time.perf_counter() - t0)
                times[nb] = float(np.median(runs))
            diff = times[1 + num_blocks] - times[1]
            results[name] = (diff if diff > 0 else float("nan"), out)  # nan: lost in noise
        (te, oe), (tr, orr) = results["exact"], results["reuse"]
        per_s = num_blocks * block_size
        row = {"history": int(s), "exact_tokens_per_s": per_s / te,
               "reuse_tokens_per_s": per_s / tr, "speedup": te / tr,
               "agreement": float(jnp.mean(oe.tokens[:, s:] == orr.tokens[:, s:])),
               "exact_mean_logprob": float(jnp.mean(oe.logprob)),
               "reuse_mean_logprob": float(jnp.mean(orr.logprob))}
        rows.append(row)
        log(f"sampling S={s:>6}: exact {row['exact_tokens_per_s']:.1f} tok/s, reuse "
            f"{row['reuse_tokens_per_s']:.1f} tok/s ({row['speedup']:.2f}x); agreement "
            f"{row['agreement']:.2f}; mean log p exact {row['exact_mean_logprob']:.3f}, "
            f"reuse {row['reuse_mean_logprob']:.3f}", flush=True)
    return rows, info


def _keep(value):
    if value is None:
        return None
    if value <= 0:
        raise ValueError(f"--sparse-keep must be > 0, got {value}")
    return int(value) if value >= 1 else float(value)


def command(args) -> str:
    """The shell command that reruns this measurement."""
    return command_line(["python", "-m", "experiments.flashblock.bench"], [
        ("--histories", args.histories), ("--block-size", args.block_size),
        ("--steps", args.steps), ("--heads", args.heads), ("--kv-heads", args.kv_heads),
        ("--head-dim", args.head_dim), ("--repeats", args.repeats),
        ("--sparse-keep", args.sparse_keep), ("--seed", args.seed),
        ("--sample-histories", args.sample_histories or None),
        ("--sample-blocks", args.sample_blocks), ("--train-steps", args.train_steps)])


def markdown(result: dict) -> str:
    """``flashblock.md``: the command, the machine (with its load average before and after
    the run), the attention table and the sampling table of ``result``."""
    a, s = result["args"], result["args"]["steps"]
    load = result.get("load_average")
    lines = ["# FlashBlock benchmark", "", f"Command: `{result['command']}`", "",
             machine_line(result["machine"]), ""]
    if load:
        lines += [f"Load average (1 / 5 / 15 min) before the run "
                  f"{' / '.join(f'{x:.1f}' for x in load['before'])}, after "
                  f"{' / '.join(f'{x:.1f}' for x in load['after'])}.", ""]
    lines += [f"## Attention per denoising step (one layer: block b = {a['block_size']}, "
              f"{a['heads']} heads x {a['head_dim']}, s = {s} steps per block)", "",
              "Median of the repeats, compile excluded. Per block: without reuse "
              f"{s} x min(exact, split), with reuse split + {s - 1} x reuse; split error: "
              "max abs difference of the split (merged) output from the dense one.", ""]
    sparse = any("sparse_keep" in r for r in result["attention"])
    head = ("| history S | exact (ms) | split, step 0 (ms) | reuse, later steps (ms) | "
            "block ratio | split error |")
    rule = "|---|---|---|---|---|---|"
    if sparse:
        head += " sparse keep | sparse alone ratio | sparse + residual ratio |"
        rule += "---|---|---|"
    lines += [head, rule]
    for r in result["attention"]:
        row = (f"| {r['history']:,} | {r['exact_s'] * 1e3:.3f} | {r['split_s'] * 1e3:.3f} | "
               f"{r['reuse_s'] * 1e3:.3f} | {r['block_ratio']:.2f}x | "
               f"{r['split_max_abs_error']:.1e} |")
        if sparse:
            row += (f" {r['sparse_keep']} | {r['sparse_block_ratio']:.2f}x | "
                    f"{r['residual_block_ratio']:.2f}x |")
        lines.append(row)
    if result["sampling"]:
        info = result["sampling_model"]
        lines += ["", f"## Sampling ({info['config']}, {info['train_steps']} training steps; "
                  f"{a['sample_blocks']} blocks after a prompt of S held-out bytes, the "
                  "prompt's prefill left out)", "",
                  "| prompt S | exact tokens/s | reuse tokens/s | speed-up | agreement | "
                  "mean log p exact | mean log p reuse |", "|---|---|---|---|---|---|---|"]
        for r in result["sampling"]:
            lines.append(f"| {r['history']:,} | {r['exact_tokens_per_s']:.1f} | "
                         f"{r['reuse_tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
                         f"{r['agreement']:.2f} | {r['exact_mean_logprob']:.3f} | "
                         f"{r['reuse_mean_logprob']:.3f} |")
    return "\n".join(lines) + "\n"


def run_cli(args) -> int:
    load_before = os.getloadavg()
    print(f"attention per denoising step: block {args.block_size}, {args.steps} steps, "
          f"{args.heads} heads x {args.head_dim}")
    rows = attention_rows(args.histories, block_size=args.block_size, steps=args.steps,
                          heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                          repeats=args.repeats, seed=args.seed,
                          sparse_keep=_keep(args.sparse_keep))
    longest = rows[-1]
    print(f"headline: attention time per block without / with reuse at S={longest['history']}"
          f": {longest['block_ratio']:.2f}x")
    sample, info = [], None
    if args.sample_histories:
        sample, info = sampling_rows(args.sample_histories, block_size=args.block_size,
                                     steps=args.steps, num_blocks=args.sample_blocks,
                                     train_steps=args.train_steps, repeats=args.repeats,
                                     seed=args.seed)
    result = {"command": command(args), "attention": rows, "sampling": sample,
              "sampling_model": info, "machine": machine_info(), "args": cli_args(args),
              "load_average": {"before": list(load_before), "after": list(os.getloadavg())}}
    if args.out.lower() not in ("", "none"):
        files = write_report(result, args.out, "flashblock", markdown(result))
        print(f"wrote {files['json']} and {files['md']}")
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags of :func:`add_arguments`, parsed from ``argv`` (without the program name)."""
    return parse_bench_args("flashblock", add_arguments, argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.flashblock.bench [flags]``: parse, run, print; 0 on completion."""
    return run_cli(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
