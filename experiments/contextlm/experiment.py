"""ContextLM (issue 17, item 3a): byte-level LMs on Shakespeare with and without
next-context prediction at 3 model sizes and equal tokens; held-out bits/byte against
parameters, and the parameter ratio at which ContextLM matches the baseline.

Every model is a ``lcjax.nn.DecoderLM`` (RoPE, GQA, 2 layers) trained by
``lcjax.train.train`` on the Shakespeare split ``shakespeare_split(0.1, 0)`` (works held
out) with the same seeds, data order, steps, batch and sequence length, so every model sees
the same tokens. ContextLM adds ``DecoderConfig(context_lm=ContextLMConfig(chunk=8,
weight=1.0))`` (the branch after block 1, one predictor block) and trains with
``lcjax.train.context_lm_loss`` (CE + λ·L_ctx); the baseline trains with the plain NLL. The
held-out metric is the token-level NLL / ln 2 of both (``lcjax.train.evaluate``, the
default eval hook): the context term is not in it.

Parameter ratio: the baseline's held-out bits/byte is interpolated linearly in
log(parameters) between its sizes; the ratio is the parameters ContextLM needs / the
parameters the baseline needs for the same bits/byte, at each ContextLM size inside the
baseline's range (the paper: ContextLM reaches the baseline's perplexity with 39% fewer
parameters, a ratio of 0.61). Seeds: 1 in quick mode, 5 in full mode; the same seeds (init
and data order) for both arms, so each seed gives a paired difference ContextLM − baseline
at each size, and the first claim follows the 95% t-interval of those differences (one
seed: no interval, not tested).

Quick mode trains 30 steps per model: far from converged, it checks that the pipeline runs
and says nothing about the paper's claim (the claims are expected to fail there). The
quick budget (60 s for 6 trainings on a quiet 2-core machine) is not yet measured quiet.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from experiments.common import (
    Claim,
    Experiment,
    Result,
    machine_info,
    mean_interval,
    not_tested,
)

SEQ = 64
BATCH = 8
STEPS = {True: 30, False: 2000}
SEEDS = {True: (0,), False: (0, 1, 2, 3, 4)}
EVAL_BATCHES = {True: 2, False: 32}
SIZES = {  # name -> DecoderConfig fields
    "s": dict(d_model=32, num_heads=2, num_kv_heads=1, head_dim=16, mlp_hidden=96),
    "m": dict(d_model=48, num_heads=3, num_kv_heads=1, head_dim=16, mlp_hidden=128),
    "l": dict(d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, mlp_hidden=172),
}
CHUNK, WEIGHT = 8, 1.0
PAPER_RATIO = 0.61  # 39% fewer parameters


def param_count(model) -> int:
    from flax import nnx

    return int(sum(np.prod(x.shape) for x in __import__("jax").tree.leaves(
        nnx.state(model, nnx.Param))))


def matching_ratio(base_params, base_bpb, params, bpb) -> float | None:
    """Parameters / the baseline's parameters for the same bits/byte (log-linear
    interpolation of the baseline's curve); None outside the baseline's range."""
    order = np.argsort(base_params)
    lp, b = np.log(np.asarray(base_params, float)[order]), np.asarray(base_bpb, float)[order]
    for i in range(len(lp) - 1):
        lo, hi = sorted((b[i], b[i + 1]))
        if lo <= bpb <= hi and b[i] != b[i + 1]:
            f = (bpb - b[i]) / (b[i + 1] - b[i])
            return float(params / np.exp(lp[i] + f * (lp[i + 1] - lp[i])))
    return None


def paired_differences(runs: list[dict]) -> dict[str, dict]:
    """Per size: the per-seed held-out bits/byte differences ContextLM − baseline (same seed)
    and their mean with a 95% t-interval (``lo``/``hi`` NaN for one seed)."""
    out = {}
    for size in dict.fromkeys(r["size"] for r in runs):
        by_seed = {(r["arm"], r["seed"]): r["heldout_bpb"] for r in runs if r["size"] == size}
        seeds = sorted({seed for arm, seed in by_seed if arm == "baseline"}
                       & {seed for arm, seed in by_seed if arm == "contextlm"})
        diffs = [by_seed["contextlm", sd] - by_seed["baseline", sd] for sd in seeds]
        mean, lo, hi = mean_interval(diffs)
        out[size] = {"seeds": seeds, "diffs": diffs, "mean": mean, "lo": lo, "hi": hi}
    return out


def lower_at_every_size_claim(diffs: dict[str, dict], steps: int) -> Claim:
    """ContextLM's held-out bits/byte is lower at every size: holds iff the 95% interval of
    the paired difference lies below 0 at each size; one seed: not tested."""
    name = (f"ContextLM has lower held-out bits/byte than the baseline at every size (equal "
            f"tokens: {steps} steps x {BATCH} x {SEQ})")
    target = "ContextLM − baseline: 95% interval over paired seeds < 0 at every size"
    ours = "; ".join(f"{s} {d['mean']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] (per seed "
                     + ", ".join(f"{x:+.4f}" for x in d["diffs"]) + ")"
                     for s, d in diffs.items())
    if any(len(d["diffs"]) < 2 for d in diffs.values()):
        return not_tested(name, target, f"one seed, no interval; {ours}",
                          "≥ 2 paired seeds per size")
    return Claim(name, target, ours, all(d["hi"] < 0 for d in diffs.values()),
                 "≥ 2 paired seeds per size")


def run(quick: bool, out_dir: Path) -> Result:
    from lcjax.data import VOCAB_SIZE, shakespeare_split
    from lcjax.nn import ContextLMConfig, DecoderConfig
    from lcjax.train import TrainConfig, context_lm_loss, train

    train_docs, heldout_docs = shakespeare_split(heldout_fraction=0.1, seed=0)
    steps = STEPS[quick]
    runs = []
    for size, fields in SIZES.items():
        for arm in ("baseline", "contextlm"):
            for seed in SEEDS[quick]:
                start = time.perf_counter()
                model_cfg = DecoderConfig(
                    vocab_size=VOCAB_SIZE, num_layers=2, max_len=SEQ, **fields,
                    context_lm=ContextLMConfig(chunk=CHUNK, weight=WEIGHT)
                    if arm == "contextlm" else None)
                cfg = TrainConfig(steps=steps, batch_size=BATCH, seq_len=SEQ, lr=3e-3,
                                  warmup_steps=min(100, steps // 5), seed=seed, data_seed=seed,
                                  eval_batches=EVAL_BATCHES[quick],
                                  log_every=max(1, steps // 10), progress=False)
                res = train(model_cfg, cfg, train_docs=train_docs, eval_docs=heldout_docs,
                            loss_fn=context_lm_loss if arm == "contextlm" else None)
                rec = {"size": size, "arm": arm, "seed": seed, "params": param_count(res.model),
                       "heldout_bpb": res.evals[-1]["eval_bpb"],
                       "final_train_loss": res.losses[-1],
                       "context_loss": res.history[-1].get("context_loss"),
                       "wall_s": time.perf_counter() - start}
                runs.append(rec)
                print(f"   {size} {arm:>9} seed {seed}: {rec['params']:,} params, held-out "
                      f"{rec['heldout_bpb']:.3f} bits/byte ({rec['wall_s']:.1f} s)", flush=True)

    def curve(arm):
        out = {}
        for size in SIZES:
            rs = [r for r in runs if r["arm"] == arm and r["size"] == size]
            v = [r["heldout_bpb"] for r in rs]
            out[size] = {"params": rs[0]["params"], "bpb_mean": float(np.mean(v)),
                         "bpb_min": float(np.min(v)), "bpb_max": float(np.max(v))}
        return out

    base, ctx = curve("baseline"), curve("contextlm")
    ratios = {s: matching_ratio([base[k]["params"] for k in SIZES],
                                [base[k]["bpb_mean"] for k in SIZES],
                                ctx[s]["params"], ctx[s]["bpb_mean"]) for s in SIZES}
    diffs = paired_differences(runs)
    found = [r for r in ratios.values() if r is not None]
    fmt = lambda c: ", ".join(f"{s} {c[s]['bpb_mean']:.3f}" for s in SIZES)
    claims = [
        lower_at_every_size_claim(diffs, steps),
        Claim("ContextLM matches the baseline's held-out loss with 39% fewer parameters",
              f"parameter ratio <= {PAPER_RATIO}",
              "ratios " + ", ".join(f"{s} {'outside the range' if r is None else f'{r:.2f}'}"
                                    for s, r in ratios.items()),
              bool(found) and min(found) <= PAPER_RATIO),
    ]
    numbers = {"seq_len": SEQ, "batch_size": BATCH, "steps": steps, "seeds": SEEDS[quick],
               "chunk": CHUNK, "weight": WEIGHT, "sizes": SIZES, "baseline": base,
               "contextlm": ctx, "parameter_ratio": ratios, "paired_differences": diffs,
               "runs": runs,
               "machine": machine_info()}
    notes = ("Held-out bits/byte (mean over seeds) by size: baseline " + fmt(base)
             + "; ContextLM " + fmt(ctx) + ". ContextLM's parameters include its predictor "
             "block and the two D x D projections.")
    return Result(claims=claims, numbers=numbers, notes=notes)


EXPERIMENT = Experiment(
    name="contextlm",
    paper="ContextLM: next-context prediction (LUMIA-Group)",
    summary="byte LMs on Shakespeare at 3 sizes, with/without next-context prediction",
    run=run,
    quick_budget_s=60,  # 32 s quiet (2026-12-02); 65 s on the 2026-12-01 machine
)
