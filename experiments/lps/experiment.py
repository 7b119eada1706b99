"""LPS head analysis on a trained model: do the heads the weights score as long-context heads
retrieve the needle, and does enhancing them help beyond the training length?

Issue 16, item 6. The method is the LPS paper's (the Long-context Potential Score, ICML 2026
set; public code OpenDFM/long-context-heads, read for the method): every attention head of
a RoPE model is scored from W_Q and W_K alone (``lcjax.analysis.lps``), the per-frequency
kernel energies at a distance n

    e_m = ‖A_mᵀ R_m(n) B_m‖_F²,   p = e / Σ e,
    s_dist = Σ_m p_m · linspace(0, 1, d/2)[m],   s_eRank = 1 − exp(−Σ p log p) / (d/2),
    LPS = s_dist^0.4 · s_eRank^0.6,   score = LPS − 0.5 · sym,

and the top heads are *enhanced* by scaling the two W_Q rows of each RoPE pair m by
mult[m] (W_K untouched, so e_m → mult[m]² e_m). The paper's head-level check: a head
succeeds on a needle prompt when the needle's first answer token is among its top-10
attended positions at the last prompt token (``lcjax.analysis.retrieval_heads``);
headline (Llama-3.2-3B) the top-5 heads by score succeed 0.99 of the time against 0.117
on average.

Protocol, at toy scale:

1. **Train** a byte-level ``lcjax.nn.DecoderLM`` (RoPE, grouped-query attention, 8 query
   and 4 key heads per layer) through ``lcjax.train.train`` on RULER-style single-needle
   retrieval (``lcjax.data.ruler.niah``, noise haystack, the compact needle
   ``The magic number for {key} is {value}.`` with a 4-digit value, no prefix, as
   ``experiments/long_eval`` uses at short lengths), a grain ``MapDataset`` over
   ``lcjax.data.sources.TaskSource`` at L = :data:`TRAIN_LEN` bytes, answer bytes weighing
   1 and the others 0.1 (``answer_weighted_loss``), lr 1e-2 with cosine decay.
2. **Score** every head statically: ``model_lps`` at the paper's distance n = −32768 (the
   ranking used below) and, for comparison, at n = −L.
3. **Retrieval heads**: ``retrieval_success`` on fresh needle prompts at L (top-10), and
   Pearson / Spearman correlations of the per-head success rate with LPS, s_dist,
   s_eRank and the ranking score over all heads; scatter plot.
4. **Enhance** the top :data:`SETTINGS` ``enhance`` heads by score with the paper's
   Llama-style multiplier resampled to the model's d/2 pairs
   (``resample_multiplier(LLAMA_MULTIPLIER, d/2)``: high frequencies × 0.8–1, a bump to
   × 1.2 on the lower-middle ones, the lowest × 1), and evaluate the original and the
   enhanced model with ``lcjax.eval.evaluate`` (batched prefill, greedy decoding through
   the KV cache) at 1×, 2× and 4× L over needle depths: ``string_match_all``.

Claims (targets stated before the run; the numbers are reported whatever they are):
Spearman(LPS, success) > 0; the top heads by score succeed more often than the mean head;
enhancement raises accuracy at 2× L and at 4× L.

Quick mode (a 35 s budget on 2 CPUs, most of it compilation): 2 layers, 60 steps × 16
rows at L = 96 — far too few for the lookup (the answer NLL is still on the format plateau,
about 1.8 nats), so the quick report checks the pipeline, not the claims — 16 retrieval
prompts, 2 heads enhanced, 5 depths × 2 items per length. Full mode: 3 layers (24 heads),
500 steps × 32 rows, 200 retrieval prompts, the top 4 heads enhanced, 5 depths × 20 items
per length, two training seeds.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np

from experiments.common import (
    Claim,
    Experiment,
    Result,
    interval_verdict,
    machine_info,
    mean_interval,
    not_tested,
)
from lcjax.data import ruler
from lcjax.data.suites import Suite, SuiteTask

TRAIN_LEN = 96  # L, bytes of prompt + answer per training sample
EVAL_MULTS = (1, 2, 4)
LR = 1e-2
OTHER_WEIGHT = 0.1
TOP_K = 10  # the paper's retrieval-head criterion: answer position in the head's top-10
RETRIEVAL_SEED = 7  # seeds of the retrieval prompts (training uses DATA_SEED, eval EVAL_SEED)
DATA_SEED = 1
EVAL_SEED = 0
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
TASK = "niah_single_1"
SUITE = Suite("lps_niah", ruler.generate, (
    SuiteTask(TASK, "niah", dict(haystack_kind="noise", needle="The magic number for {key} is "
                                 "{value}.", prefix="",
                                 question="\nThe magic number for {query} is ",
                                 value_digits=4)),))


def model_config(num_layers: int) -> dict:
    """The DecoderLM shape: d = 64, 8 query / 4 key heads of head_dim 16 (8 RoPE pairs)."""
    return dict(d_model=64, num_layers=num_layers, num_heads=8, num_kv_heads=4, head_dim=16,
                mlp_hidden=172, max_len=max(EVAL_MULTS) * TRAIN_LEN + 16)


SETTINGS = {
    True: dict(layers=2, steps=60, batch=16, seeds=(0,), retrieval_prompts=16, enhance=2,
               n_per_cell=2),
    False: dict(layers=3, steps=500, batch=32, seeds=(0, 1), retrieval_prompts=200,
                enhance=4, n_per_cell=20),
}
LEARNED = 50.0  # 1× accuracy (%) below which the model does not retrieve: claims not tested
UNSATURATED = (5.0, 95.0)  # accuracy (%) range where an enhancement gain can show


def training_dataset(steps: int, batch: int, *, seed: int = DATA_SEED):
    """``steps`` batches of ``batch`` rows of :data:`SUITE` at :data:`TRAIN_LEN` bytes (a grain
    ``MapDataset`` over ``TaskSource``; rows BOS + prompt + answer + EOS)."""
    from lcjax.data.sources import task_batches

    return task_batches(SUITE, TASK, length=TRAIN_LEN, steps=steps, batch=batch, seed=seed)


def train_model(num_layers: int, steps: int, batch: int, *, seed: int = 0) -> dict:
    """The DecoderLM trained through ``lcjax.train.train``: model, loss history, seconds."""
    from lcjax.data import VOCAB_SIZE
    from lcjax.nn import DecoderConfig
    from lcjax.train import TrainConfig, answer_weighted_loss, train

    cfg = DecoderConfig(vocab_size=VOCAB_SIZE, **model_config(num_layers))
    run_cfg = TrainConfig(steps=steps, batch_size=batch, seq_len=TRAIN_LEN + 1, lr=LR,
                          warmup_steps=min(50, steps // 5), min_lr_ratio=0.1, seed=seed,
                          log_every=max(1, min(25, steps // 4)), eval_batches=0,
                          progress=False)
    start = time.perf_counter()
    result = train(cfg, run_cfg, dataset=training_dataset(steps, batch, seed=DATA_SEED + seed),
                   loss_fn=answer_weighted_loss(OTHER_WEIGHT))
    history = [{"step": r["step"], "loss": float(r["loss"]),
                "answer_nll": float(r["answer_nll"])} for r in result.history]
    return {"model": result.model, "history": history,
            "seconds": time.perf_counter() - start}


def retrieval_prompts(n: int, *, seed: int = RETRIEVAL_SEED):
    """``n`` needle prompts at L as byte tokens ``[BOS] + prompt`` and the position of the
    needle value's first byte in each (uniform depths)."""
    from lcjax.analysis.retrieval_heads import answer_position
    from lcjax.data import encode

    prompts, positions = [], []
    for i in range(n):
        sample = SUITE.generate("niah", np.random.default_rng([seed, i]), TRAIN_LEN,
                                **SUITE.task(TASK).overrides)
        tokens = encode(sample.prompt, bos=True)
        prompts.append(tokens)
        positions.append(answer_position(tokens, encode(sample.references[0])))
    return prompts, positions


def accuracy_by_length(model, lengths, n_per_cell: int) -> tuple[list[float], list[int]]:
    """``string_match_all`` (%) of ``model`` at each length (``lcjax.eval.evaluate``, mean
    over :data:`DEPTHS`) and the item counts."""
    from lcjax.eval import evaluate

    res = evaluate(model, SUITE, lengths=lengths, depths=DEPTHS, n_per_cell=n_per_cell,
                   seed=EVAL_SEED, tasks=[TASK], batch_size=16, progress=False)
    cells = res.summary["tasks"][TASK]["lengths"]
    return ([float(cells[str(n)]["string_match_all"]) for n in lengths],
            [int(cells[str(n)]["n"]) for n in lengths])


def analyse_seed(setting: dict, seed: int, lengths, log) -> dict:
    """One trained model: scores, retrieval success, correlations, enhanced accuracy."""
    from lcjax.analysis.lps import (
        LLAMA_MULTIPLIER,
        enhance_model,
        model_lps,
        resample_multiplier,
    )
    from lcjax.analysis.retrieval_heads import correlate, retrieval_success

    trained = train_model(setting["layers"], setting["steps"], setting["batch"], seed=seed)
    model, hist = trained["model"], trained["history"]
    log(f"   seed {seed}: trained {setting['steps']} steps x {setting['batch']} in "
        f"{trained['seconds']:.0f} s, loss {hist[0]['loss']:.3f} -> {hist[-1]['loss']:.3f}, "
        f"answer nll {hist[-1]['answer_nll']:.3f}")
    start = time.perf_counter()
    scores = model_lps(model)
    near = model_lps(model, distance=-TRAIN_LEN)
    prompts, positions = retrieval_prompts(setting["retrieval_prompts"])
    success = retrieval_success(model, prompts, positions, top_k=TOP_K)
    stats = correlate(success, scores)
    stats_near = correlate(success, near)
    heads = scores.top_heads(setting["enhance"])
    top_success = float(np.mean([success[layer, head] for layer, head in heads]))
    pairs = model.config.head_dim // 2
    mult = resample_multiplier(LLAMA_MULTIPLIER, pairs)
    enhanced = enhance_model(model, heads, mult)
    analysis_s = time.perf_counter() - start
    start = time.perf_counter()
    base_acc, counts = accuracy_by_length(model, lengths, setting["n_per_cell"])
    enh_acc, _ = accuracy_by_length(enhanced, lengths, setting["n_per_cell"])
    eval_s = time.perf_counter() - start
    log(f"   seed {seed}: Spearman(LPS, success) {stats['lps']['spearman']:.2f}, top-"
        f"{len(heads)} success {top_success:.2f} vs mean {success.mean():.2f}; accuracy "
        f"base {base_acc} enhanced {enh_acc} ({analysis_s:.0f} s analysis, {eval_s:.0f} s "
        f"eval)")
    return {"seed": seed, "scores": scores, "success": success, "correlations": stats,
            "correlations_near": stats_near, "top_heads": heads, "top_success": top_success,
            "mean_success": float(success.mean()), "multiplier": mult,
            "accuracy": base_acc, "accuracy_enhanced": enh_acc, "items": counts,
            "train_seconds": trained["seconds"], "analysis_seconds": analysis_s,
            "eval_seconds": eval_s, "history": hist}


def _plot_accuracy(path: Path, runs, lengths) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for i, r in enumerate(runs):
        ax.plot(lengths, r["accuracy"], "o-", color="C0", alpha=0.5 + 0.5 / (i + 1),
                label="original" if i == 0 else None)
        ax.plot(lengths, r["accuracy_enhanced"], "s--", color="C3", alpha=0.5 + 0.5 / (i + 1),
                label=f"top-{len(r['top_heads'])} heads enhanced" if i == 0 else None)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [f"{n // TRAIN_LEN}× L\n({n})" for n in lengths])
    ax.set_ylim(-3, 103)
    ax.set_ylabel("string_match_all (%)")
    ax.set_title(f"single-needle retrieval, trained at L = {TRAIN_LEN}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def claims_from(runs) -> list[Claim]:
    """The experiment's claims from its per-seed runs: means over seeds with a 95% t-interval
    over seeds (the verdict follows the interval; one seed gives none: not tested), the
    per-seed values beside them. Preconditions: the model retrieves at 1× L (≥ LEARNED%) for
    the head claims; for an enhancement claim at m× L the original model is neither saturated
    nor at zero there (UNSATURATED), so a gain can show."""
    base = np.mean([r["accuracy"] for r in runs], axis=0)
    retrieves = f"the model retrieves at 1× L: accuracy ≥ {LEARNED:.0f}%"
    k = len(runs[0]["top_heads"])
    rhos = [r["correlations"]["lps"]["spearman"] for r in runs]
    gaps = [r["top_success"] - r["mean_success"] for r in runs]
    head_claims = [
        ("heads with a higher LPS retrieve the needle more often (paper: LPS correlates "
         "with retrieval-head success)", "Spearman(LPS, success) > 0: 95% interval over seeds",
         rhos, [f"{x:.3f}" for x in rhos]),
        (f"the top-{k} heads by ranking score are retrieval heads (paper: top-5 0.99 vs "
         "0.117 mean)", "top-k success − mean head success > 0: 95% interval over seeds",
         gaps, [f"{r['top_success']:.3f} vs {r['mean_success']:.3f}" for r in runs]),
    ]
    claims = [_interval_claim(name, target, values, shown, retrieves, base[0] >= LEARNED,
                              f"1× accuracy {base[0]:.1f}%")
              for name, target, values, shown in head_claims]
    lo_ok, hi_ok = UNSATURATED
    for i, mult in enumerate(EVAL_MULTS):
        if mult == 1:
            continue
        gains = [r["accuracy_enhanced"][i] - r["accuracy"][i] for r in runs]
        shown = [f"{r['accuracy_enhanced'][i]:.1f} vs {r['accuracy'][i]:.1f}" for r in runs]
        claims.append(_interval_claim(
            f"enhancing the top-{k} heads raises retrieval accuracy at {mult}× the training "
            "length", "enhanced − original string_match_all > 0: 95% interval over seeds",
            gains, shown, f"the original model is neither saturated nor at zero at {mult}× L: "
            f"{lo_ok:.0f}% ≤ accuracy ≤ {hi_ok:.0f}%", lo_ok <= base[i] <= hi_ok,
            f"original accuracy {base[i]:.1f}% at {mult}× L"))
    return claims


def _interval_claim(name: str, target: str, values, shown: list[str], precondition: str,
                    met: bool, why_not: str) -> Claim:
    """A "mean over seeds > 0" claim: not tested when ``precondition`` is unmet or there is a
    single seed; else holds iff the 95% t-interval's lower end is above 0."""
    mean, lo, hi = mean_interval(values)
    ours = (f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}] over {len(values)} seeds (per seed "
            + ", ".join(shown) + ")")
    if not met:
        return not_tested(name, target, f"{why_not}; {ours}", precondition)
    holds = interval_verdict(lo, hi)
    if holds is None:
        return not_tested(name, target, f"one seed, no interval; {ours}", precondition)
    return Claim(name, target, ours, holds, precondition)


def run(quick: bool, out_dir: Path, *, log=None, **overrides) -> Result:
    """The experiment (module docstring); ``overrides`` replace :data:`SETTINGS` entries
    (``steps``, ``layers``, ``seeds``, ...)."""
    from lcjax.analysis.retrieval_heads import scatter_plot

    log = log or functools.partial(print, flush=True)
    setting = {**SETTINGS[quick], **overrides}
    unknown = set(overrides) - set(SETTINGS[quick])
    if unknown:
        raise ValueError(f"lps experiment: unknown settings {sorted(unknown)}; known: "
                         f"{sorted(SETTINGS[quick])}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lengths = [m * TRAIN_LEN for m in EVAL_MULTS]
    runs = [analyse_seed(setting, int(s), lengths, log) for s in setting["seeds"]]
    first = runs[0]
    figures = [out_dir / "lps_heatmap.png", out_dir / "scatter.png", out_dir / "accuracy.png"]
    first["scores"].heatmap(figures[0], top=setting["enhance"],
                            title=f"ranking score, seed {first['seed']} (top heads boxed)")
    scatter_plot(first["success"], first["scores"], figures[1],
                 title=f"retrieval-head success (top-{TOP_K}) vs static scores, seed "
                       f"{first['seed']}")
    _plot_accuracy(figures[2], runs, lengths)
    claims = claims_from(runs)

    def corr_table(key):
        rows = ["| seed | score | Pearson | Spearman |", "|---|---|---|---|"]
        for r in runs:
            rows += [f"| {r['seed']} | {name} | {c['pearson']:.3f} | {c['spearman']:.3f} |"
                     for name, c in r[key].items()]
        return "\n".join(rows)

    acc = ["| seed | model | " + " | ".join(f"{m}× ({n})" for m, n in zip(EVAL_MULTS, lengths))
           + " |", "|---|---|" + "---|" * len(lengths)]
    for r in runs:
        acc.append(f"| {r['seed']} | original | " + " | ".join(f"{v:.1f}" for v in r["accuracy"])
                   + " |")
        acc.append(f"| {r['seed']} | enhanced | "
                   + " | ".join(f"{v:.1f}" for v in r["accuracy_enhanced"]) + " |")
    cfg = model_config(setting["layers"])
    notes = (f"Byte DecoderLM ({cfg['num_layers']} layers, d = {cfg['d_model']}, "
             f"{cfg['num_heads']} query / {cfg['num_kv_heads']} key heads of head_dim "
             f"{cfg['head_dim']}, RoPE) trained {setting['steps']} steps × {setting['batch']} "
             f"rows on {TASK} at L = {TRAIN_LEN} bytes, seeds {list(setting['seeds'])}. "
             f"Heads scored by model_lps at n = −32768 (the paper's distance); retrieval-head "
             f"success = answer position in the head's top-{TOP_K} at the last prompt token, "
             f"over {setting['retrieval_prompts']} fresh prompts at L. Correlations of the "
             f"per-head success rate with the static scores:\n\n" + corr_table("correlations")
             + f"\n\nThe same at n = −L = −{TRAIN_LEN}:\n\n" + corr_table("correlations_near")
             + f"\n\nEnhanced: the top-{setting['enhance']} heads by ranking score "
             f"({', '.join(str(h) for h in first['top_heads'])} for seed {first['seed']}), "
             f"W_Q pairs scaled by the Llama-style multiplier resampled to "
             f"{len(first['multiplier'])} pairs "
             f"({', '.join(f'{x:.3f}' for x in first['multiplier'])}). string_match_all (%) by "
             f"length (lcjax.eval.evaluate, {len(DEPTHS)} depths × {setting['n_per_cell']} "
             f"items per length):\n\n" + "\n".join(acc))
    base1 = float(np.mean([r["accuracy"][0] for r in runs]))
    if base1 < LEARNED:
        notes += (f"\n\nCaveat: the original model retrieves only {base1:.1f}% at 1× L (below "
                  f"{LEARNED:.0f}%): it is under-trained after {setting['steps']} steps, so "
                  "its heads' success rates and the enhancement figures say little about "
                  "the method.")
    numbers = {"train_len": TRAIN_LEN, "lengths": lengths, "depths": list(DEPTHS),
               "setting": setting, "model": cfg, "top_k": TOP_K, "lr": LR,
               "other_weight": OTHER_WEIGHT, "machine": machine_info(), "runs": [
                   {"seed": r["seed"], "correlations": r["correlations"],
                    "correlations_n_minus_L": r["correlations_near"],
                    "top_heads": [list(h) for h in r["top_heads"]],
                    "top_success": r["top_success"], "mean_success": r["mean_success"],
                    "success": r["success"].tolist(), "lps": r["scores"].lps.tolist(),
                    "s_dist": r["scores"].s_dist.tolist(),
                    "s_erank": r["scores"].s_erank.tolist(),
                    "score": r["scores"].score.tolist(), "multiplier": r["multiplier"].tolist(),
                    "accuracy": r["accuracy"], "accuracy_enhanced": r["accuracy_enhanced"],
                    "items_per_length": r["items"], "train_seconds": r["train_seconds"],
                    "analysis_seconds": r["analysis_seconds"], "eval_seconds": r["eval_seconds"],
                    "loss_first": r["history"][0]["loss"], "loss_last": r["history"][-1]["loss"],
                    "answer_nll_last": r["history"][-1]["answer_nll"]} for r in runs]}
    return Result(claims=claims, notes=notes, figures=figures, numbers=numbers)


EXPERIMENT = Experiment(
    name="lps",
    paper="LPS — Long-context Potential Score of attention heads (ICML 2026)",
    summary="static LPS head scores of a byte LM trained on needle retrieval against "
            "retrieval-head success; top heads enhanced, accuracy at 1×/2×/4× L",
    run=run,
    # 16 s in the 2026-12-02 afternoon make reproduce (1,207 s in all); 5 s went to mgal
    quick_budget_s=20,
)


if __name__ == "__main__":
    from experiments.common import main

    main(EXPERIMENT)
