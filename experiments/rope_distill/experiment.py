"""RoPE-perturbed self-distillation (issue 17, item 3b): fine-tune a short-context byte LM
to twice its length on RULER-style retrieval with and without self-distillation; accuracy
by needle depth at 2L, its spread across depths (positional robustness) and accuracy at 4L
(beyond the fine-tuning length).

Paper: RoPE-perturbed self-distillation for long-context robustness (+12.04 points on
RULER-64K with Llama-3-8B and a lower variance of accuracy across positions; no public
code). The method is ``lcjax.train.rope_distill`` (docs/rope_distill.md): each row is run
with its own position ids (teacher, stop-gradient) and with perturbed ids (student), and

    loss = CE(z^T) + λ · Σ_t w_t KL_t(softmax z^T ‖ softmax z^S) / Σ_t w_t.

**Protocol.** One byte ``lcjax.nn.DecoderLM`` (long_eval's shape: 2 layers, d = 64, RoPE,
about 116k parameters) is pre-trained through ``lcjax.train.train`` on single-needle
retrieval (RULER's ``niah`` generator, noise haystack) at L = :data:`TRAIN_LEN` = 64
bytes. RULER's and long_eval's templates do not fit 64 bytes, so the needle is
``{key}: {value}.`` and the question ``\\n{key}: `` (adjective-noun keys, 4-digit
values; :data:`SUITE`). Every row weighs the answer bytes 1 and the other bytes
:data:`OTHER_WEIGHT` (``lcjax.train.losses.answer_weights``, given to the loss as the
batch's ``weights``), so both arms' CE is long_eval's answer-weighted NLL. The pre-trained
model is then fine-tuned at 2L = 128 bytes twice, from the same weights, with the same
steps, data, learning-rate schedule and seed:

* **plain**: the weighted next-token NLL (``lcjax.train.metrics.nll_loss``);
* **distill**: ``distill_loss_fn("segment_swap", weight=λ)`` as ``train()``'s ``loss_fn``
  (:data:`PERTURBATION`: the row's ids cut into 3 segments of ≥ 8 tokens, permuted; the
  KL counts the targets with the CE's weights).

Both are evaluated with ``lcjax.eval.evaluate`` (batched prefill, greedy decoding through
the KV cache) at 2L and 4L over :data:`DEPTHS`, the same items for both arms
(``string_match_all``, percent); the pre-trained model is evaluated at L, 2L and 4L.
Positional robustness is the standard deviation of the accuracy across the depths at 2L.
Full mode: pre-training once (seed 0), then fine-tuning and evaluation for 5 seeds (the
fine-tuning seed draws the perturbations, the data seed and the evaluation items change
with it). Quick mode is a smoke run (one seed, few steps): its models do not retrieve and
its claims are not expected to hold.

*(inferred)*: λ = 1, the segment-swap perturbation and its options, the L = 64 → 128
lengths, the compact template and all step counts are our choices.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from experiments.common import (
    Claim,
    Experiment,
    Result,
    copy_model,
    interval_verdict,
    machine_info,
    mean_interval,
    not_tested,
)
from lcjax.data import ruler
from lcjax.data.suites import Suite, SuiteTask

TRAIN_LEN = 64  # L: the pre-training length (bytes = tokens of prompt + answer)
FT_MULT, EXTRA_MULT = 2, 4  # fine-tuning at 2L, extrapolation checked at 4L
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
OTHER_WEIGHT = 0.1  # weight of the non-answer bytes (answer bytes weigh 1)
WEIGHT = 1.0  # λ
PERTURBATION = ("segment_swap", {"num_segments": 3, "min_len": 8})
DATA_SEED = 11  # TaskSource seeds: pre-training DATA_SEED, fine-tuning DATA_SEED + 1 + seed
MODEL = dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16,
             mlp_hidden=172, max_len=EXTRA_MULT * TRAIN_LEN + 16)
TASK = "niah_single_1"
SUITE = Suite("ruler_compact", ruler.generate, (
    SuiteTask(TASK, "niah", dict(haystack_kind="noise", needle="{key}: {value}.", prefix="",
                                 question="\n{query}: ", value_digits=4)),))

SETTINGS = {
    True: dict(pretrain_steps=40, finetune_steps=10, batch=16, seeds=(0,), n_per_cell=1),
    False: dict(pretrain_steps=500, finetune_steps=100, batch=32, seeds=(0, 1, 2, 3, 4),
                n_per_cell=20),
}
PRETRAIN_LR, FINETUNE_LR = 1e-2, 3e-3
RETRIEVES = 80.0  # % at L: the pre-trained model counts as retrieving (precondition claim)


def weighted_rows(batch: dict, other_weight: float = OTHER_WEIGHT) -> dict:
    """A TaskSource batch -> ``inputs``, ``targets`` and float ``weights`` (1 on answer
    bytes, ``other_weight`` on the others, 0 on PAD: ``lcjax.train.losses.answer_weights``),
    so that any loss built on ``target_weights`` (``nll_loss``, ``distill_loss``) is the
    answer-weighted NLL."""
    from lcjax.train.losses import answer_weights

    w = np.asarray(answer_weights(batch, other_weight), np.float32)
    return {"inputs": batch["inputs"], "targets": batch["targets"], "weights": w}


def retrieval_dataset(length: int, steps: int, batch: int, seed: int):
    """``steps`` batches of ``batch`` rows of :data:`SUITE` at ``length`` bytes (rows of
    ``length + 1`` positions: BOS + prompt + answer + EOS; needle depth uniform), as a
    grain ``MapDataset`` of :func:`weighted_rows`."""
    import grain

    from lcjax.data.sources import TaskSource

    src = TaskSource(SUITE, [TASK], length=length, num_records=steps * batch, seed=seed,
                     eos=True, seq_len=length + 1)
    return (grain.MapDataset.source(src).batch(batch, drop_remainder=True)
            .map(weighted_rows))


def train_stage(length: int, steps: int, batch: int, *, lr: float, seed: int,
                data_seed: int, loss_fn=None, init=None) -> dict:
    """``lcjax.train.train`` of :data:`MODEL` (or a copy of ``init``) on
    :func:`retrieval_dataset`; the model, the loss history and CPU/wall seconds."""
    from lcjax.data import VOCAB_SIZE
    from lcjax.nn import DecoderConfig
    from lcjax.train import TrainConfig, train

    cfg = TrainConfig(steps=steps, batch_size=batch, seq_len=length + 1, lr=lr,
                      warmup_steps=min(20, steps // 5), seed=seed, eval_batches=0,
                      log_every=max(1, min(10, steps // 4)), progress=False)
    model_fn = None if init is None else (lambda *_: copy_model(init))
    start, cpu = time.perf_counter(), time.process_time()
    res = train(DecoderConfig(vocab_size=VOCAB_SIZE, **MODEL), cfg,
                dataset=retrieval_dataset(length, steps, batch, data_seed), loss_fn=loss_fn,
                model_fn=model_fn)
    keys = ("loss", "ce", "kl")
    history = [{"step": r["step"], **{k: float(r[k]) for k in keys if k in r}}
               for r in res.history]
    return {"model": res.model, "history": history, "seconds": time.perf_counter() - start,
            "cpu_s": time.process_time() - cpu}


def accuracy_by_depth(model, lengths, n_per_cell: int, seed: int) -> dict[int, list[float]]:
    """``{length: [string_match_all at each of DEPTHS]}`` (percent) from
    ``lcjax.eval.evaluate`` of ``model`` on :data:`SUITE`."""
    from lcjax.eval import evaluate

    res = evaluate(model, SUITE, lengths=lengths, depths=DEPTHS, n_per_cell=n_per_cell,
                   seed=seed, batch_size=16, progress=False)
    cells = res.summary["tasks"][TASK]["cells"]
    return {n: [float(next(c["string_match_all"] for c in cells
                           if c["length"] == n and c["depth"] == d)) for d in DEPTHS]
            for n in lengths}


def depth_stats(acc: list[float]) -> dict:
    """Mean and population standard deviation (points) of accuracies across depths."""
    a = np.asarray(acc, float)
    return {"mean": float(a.mean()), "std": float(a.std())}


def compare(runs: list[dict], length: int, stat: str) -> dict:
    """Per seed, ``stat`` ("mean" or "std" across depths) at ``length`` of both arms and
    distill − plain; with the means over seeds."""
    plain = [depth_stats(r["plain"][length])[stat] for r in runs]
    dist = [depth_stats(r["distill"][length])[stat] for r in runs]
    diff = [d - p for p, d in zip(plain, dist)]
    return {"plain": plain, "distill": dist, "diff": diff, "plain_mean": float(np.mean(plain)),
            "distill_mean": float(np.mean(dist)), "diff_mean": float(np.mean(diff))}


def claims_from(pre_at_l: float, acc2: dict, std2: dict, acc4: dict, *, lengths,
                n_items: int) -> list[Claim]:
    """The experiment's claims from the :func:`compare` results (``lengths`` = L, 2L, 4L;
    ``n_items`` per arm and length and seed). Each is paired over seeds: the verdict follows
    the 95% t-interval of the per-seed differences distill − plain (not "every seed"); all
    are not tested unless the pre-trained model retrieves at L (the precondition), and with
    one seed (no interval)."""
    l1, l2, l4 = lengths
    precondition = (f"the pre-trained model retrieves at its length L = {l1}: "
                    f"string_match_all ≥ {RETRIEVES:.0f}% (ours {pre_at_l:.1f}%)")

    def paired(name, target, c, sign, shown, extra_ok=True):
        mean, lo, hi = mean_interval(sign * np.asarray(c["diff"], np.float64))
        ours = (f"{shown}; distill − plain per seed: "
                + ", ".join(f"{d:+.1f}" for d in c["diff"])
                + f" (95% interval of {'−' if sign < 0 else ''}the mean difference "
                f"[{lo:+.1f}, {hi:+.1f}], {len(c['diff'])} seeds, {n_items} items per arm, "
                "length and seed)")
        if pre_at_l < RETRIEVES:
            return not_tested(name, target, f"pre-trained model {pre_at_l:.1f}% at L; {ours}",
                              precondition)
        holds = interval_verdict(lo, hi)
        if holds is None:
            return not_tested(name, target, f"one seed, no interval; {ours}", precondition)
        return Claim(name, target, ours, bool(holds and extra_ok), precondition)

    return [
        paired(f"self-distillation raises retrieval accuracy at the fine-tuning length "
               f"2L = {l2} (paper: +12.04 points on RULER-64K, Llama-3-8B)",
               "distill − plain: 95% interval over seeds > 0", acc2, 1,
               f"{acc2['distill_mean']:.1f}% vs {acc2['plain_mean']:.1f}% (mean over seeds "
               "and depths)"),
        paired(f"self-distillation lowers the spread of accuracy across needle depths at "
               f"2L = {l2} (positional robustness)",
               "plain − distill std over depths: 95% interval over seeds > 0, distill's "
               "accuracy not lower (mean difference ≥ 0) and above 0 (a flat 0% is no "
               "robustness)", std2, -1,
               f"std {std2['distill_mean']:.1f} vs {std2['plain_mean']:.1f} points (mean over "
               "seeds)", float(np.mean(acc2["diff"])) >= 0 and acc2["distill_mean"] > 0),
        paired(f"self-distillation raises accuracy beyond the fine-tuning length, at "
               f"4L = {l4}", "distill − plain: 95% interval over seeds > 0", acc4, 1,
               f"{acc4['distill_mean']:.1f}% vs {acc4['plain_mean']:.1f}%"),
    ]


def _plot(path: Path, runs: list[dict], pre: dict, lengths) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    x = np.asarray(DEPTHS)
    for ax, n in zip(axes, lengths[1:]):
        for i, arm in enumerate(("plain", "distill")):
            a = np.asarray([r[arm][n] for r in runs])
            mean = a.mean(0)
            ax.errorbar(x + (i - 0.5) * 0.012, mean, yerr=[mean - a.min(0), a.max(0) - mean],
                        fmt="o-", capsize=3, color=f"C{i}",
                        label=f"fine-tuned at {lengths[1]}, {arm}")
        ax.plot(x, pre[n], "s--", color="gray", label=f"pre-trained at {lengths[0]}")
        ax.set_title(f"evaluated at {n} bytes ({n // lengths[0]}L)")
        ax.set_xlabel("needle depth")
        ax.set_xticks(x)
        ax.set_ylim(-3, 103)
    axes[0].set_ylabel("string_match_all (%)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"RoPE-perturbed self-distillation: mean over {len(runs)} seed(s), "
                 "bars min-max", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _tail(history: list[dict], key: str) -> float | None:
    vals = [r[key] for r in history if key in r]
    if not vals:
        return None
    k = max(1, len(vals) // 10)
    return float(np.mean(vals[-k:]))


def run(quick: bool, out_dir: Path, *, log=None, **overrides) -> Result:
    """The experiment; ``overrides`` replace entries of the quick or full setting
    (``pretrain_steps``, ``finetune_steps``, ``batch``, ``seeds``, ``n_per_cell``)."""
    from lcjax.train import distill_loss_fn

    log = log or (lambda *a: print(*a, flush=True))
    s = {**SETTINGS[quick], **overrides}
    unknown = sorted(set(overrides) - set(SETTINGS[quick]))
    if unknown:
        raise ValueError(f"rope_distill.run: unknown setting(s) {unknown}; known: "
                         f"{sorted(SETTINGS[quick])}")
    lengths = (TRAIN_LEN, FT_MULT * TRAIN_LEN, EXTRA_MULT * TRAIN_LEN)
    batch, n_cell = s["batch"], s["n_per_cell"]
    kind, options = PERTURBATION
    loss_fns = {"plain": None,
                "distill": distill_loss_fn(kind, weight=WEIGHT, perturbation_options=options)}

    pre = train_stage(lengths[0], s["pretrain_steps"], batch, lr=PRETRAIN_LR, seed=0,
                      data_seed=DATA_SEED)
    pre_acc = accuracy_by_depth(pre["model"], lengths, n_cell, seed=0)
    log(f"   pre-trained {s['pretrain_steps']} steps x {batch} at {lengths[0]} bytes "
        f"({pre['cpu_s']:.0f} CPU s): loss {_tail(pre['history'], 'loss'):.3f}; accuracy "
        + ", ".join(f"{n}: {np.mean(a):.1f}%" for n, a in pre_acc.items()))
    runs, timing = [], {"pretrain_cpu_s": pre["cpu_s"], "pretrain_s": pre["seconds"]}
    for seed in s["seeds"]:
        rec = {"seed": seed}
        for arm, loss_fn in loss_fns.items():
            ft = train_stage(lengths[1], s["finetune_steps"], batch, lr=FINETUNE_LR, seed=seed,
                             data_seed=DATA_SEED + 1 + seed, loss_fn=loss_fn, init=pre["model"])
            acc = accuracy_by_depth(ft["model"], lengths[1:], n_cell, seed=1 + seed)
            rec[arm] = acc
            rec[f"{arm}_train"] = {k: _tail(ft["history"], k) for k in ("loss", "ce", "kl")}
            rec[f"{arm}_cpu_s"] = ft["cpu_s"]
            log(f"   seed {seed} {arm:>7}: {ft['cpu_s']:.0f} CPU s, loss "
                f"{rec[f'{arm}_train']['loss']:.3f}; accuracy by depth "
                + "; ".join(f"{n}: " + " ".join(f"{v:.0f}" for v in a)
                            for n, a in acc.items()))
        runs.append(rec)

    acc2, std2 = compare(runs, lengths[1], "mean"), compare(runs, lengths[1], "std")
    acc4 = compare(runs, lengths[2], "mean")
    n_items = n_cell * len(DEPTHS)
    pre_l = float(np.mean(pre_acc[lengths[0]]))
    claims = claims_from(pre_l, acc2, std2, acc4, lengths=lengths, n_items=n_items)
    fig = Path(out_dir) / "accuracy_by_depth.png"
    _plot(fig, runs, pre_acc, lengths)
    ft_cpu = sum(r[f"{a}_cpu_s"] for r in runs for a in loss_fns)
    notes = (f"Byte DecoderLM ({MODEL['num_layers']} layers, d = {MODEL['d_model']}, RoPE) "
             f"pre-trained {s['pretrain_steps']} steps x {batch} rows at L = {lengths[0]} "
             f"bytes, then fine-tuned {s['finetune_steps']} steps x {batch} rows at "
             f"{lengths[1]} bytes with the weighted NLL (plain) or with RoPE-perturbed "
             f"self-distillation ({kind}, {options}, lambda = {WEIGHT}), same data and seed, "
             f"for {len(runs)} seed(s); evaluated by lcjax.eval.evaluate at {lengths[1]} and "
             f"{lengths[2]} bytes over depths {list(DEPTHS)}, {n_cell} items per cell. "
             f"Pre-trained model: {pre_l:.1f}% at L, "
             f"{np.mean(pre_acc[lengths[1]]):.1f}% at 2L, {np.mean(pre_acc[lengths[2]]):.1f}% "
             f"at 4L. Accuracy at 2L: plain {acc2['plain_mean']:.1f}%, distill "
             f"{acc2['distill_mean']:.1f}%; std over depths: plain {std2['plain_mean']:.1f}, "
             f"distill {std2['distill_mean']:.1f} points; at 4L: plain "
             f"{acc4['plain_mean']:.1f}%, distill {acc4['distill_mean']:.1f}%. "
             f"CPU seconds: pre-training {pre['cpu_s']:.0f}, fine-tuning and evaluation "
             f"{ft_cpu:.0f}.")
    if quick:
        notes += (" Quick mode is a smoke run: its models are far from retrieving, so the "
                  "claims are not expected to hold.")
    numbers = {"lengths": list(lengths), "depths": list(DEPTHS), "setting": s,
               "model": MODEL, "lambda": WEIGHT, "perturbation": {"kind": kind, **options},
               "other_weight": OTHER_WEIGHT, "pretrain_lr": PRETRAIN_LR,
               "finetune_lr": FINETUNE_LR, "pretrained": {str(n): a for n, a in pre_acc.items()},
               "pretrain_loss": _tail(pre["history"], "loss"),
               "accuracy_2L": acc2, "std_over_depths_2L": std2, "accuracy_4L": acc4,
               "runs": [{k: ({str(n): a for n, a in v.items()} if k in loss_fns else v)
                         for k, v in r.items()} for r in runs],
               "timing": timing, "machine": machine_info()}
    return Result(claims=claims, numbers=numbers, figures=[fig], notes=notes)


EXPERIMENT = Experiment(
    name="rope_distill",
    paper="RoPE-perturbed self-distillation for long-context robustness",
    summary="byte LM pre-trained on retrieval at L = 64, fine-tuned to 2L with and without "
            "RoPE-perturbed self-distillation: accuracy by needle depth at 2L and at 4L",
    run=run,
    quick_budget_s=35,
)


if __name__ == "__main__":
    from experiments.common import main

    main(EXPERIMENT)
