"""Long-context evaluation of a small byte LM trained on RULER-style tasks at L = 256.

Issue 9, item 5. A byte-level ``lcjax.nn.DecoderLM`` (2 layers, d = 64, RoPE, about 116k
parameters) is trained through ``lcjax.train.train`` on a mix of RULER-style tasks at
L = 256 tokens (bytes): the dataset is a grain ``MapDataset`` over
``lcjax.data.sources.TaskSource`` (record i is task ``i % len(tasks)`` from seed
``(seed, i)``, with EOS after the answer), and the loss hook is
``lcjax.train.losses.answer_weighted_loss`` (answer bytes weigh 1, the other bytes 0.1 in the
quick mode, 0.01 in the full mode).
The model is then evaluated with ``lcjax.eval.evaluate`` — the lcjax-model path: prompts
bucketed by length, batched prefill and greedy decoding through the KV cache, up to EOS —
at 1×, 2×, 4× and 8× L over several needle depths, and the evaluator's reports (JSON,
markdown and a depth × length heat map of ``string_match_all`` per task) are written into
``reports/long_eval/eval/``.

Claim checked: the issue's must-show, single-needle retrieval (``niah_single_1``) at 1× L
has ``string_match_all`` ≥ 90%. The report's table shows how every task degrades with
length (the model has seen no sequence longer than L; RoPE positions beyond L are new to
it).

**The tasks at L = 256.** RULER's templates do not fit 256 bytes: its needle, prefix and
question alone take 365–781 bytes (``niah`` 381, ``vt`` 436, ``cwe`` 781, ``fwe`` 555,
``qa_1`` 365), and the generators say so with a ``ValueError`` (checked in
``tests/test_long_eval.py``). :data:`SUITE` ("ruler_256") keeps RULER's generators and
task structure with compact templates — no prefix, the needle
``The magic number for {key} is {value}.`` (``uuid`` for uuids), the question
``The magic number for {key} is `` — and 4-digit values, and shrinks the counts that
would leave no haystack:

* kept as in RULER: ``niah_single_1`` (noise), ``niah_single_2`` (essay),
  ``niah_single_3`` (essay, uuid values), ``niah_multikey_2`` (a haystack of distractor
  needles);
* fewer keys, values or hops: ``niah_multikey_1`` (3 keys, not 4), ``niah_multivalue``
  (2 values, not 4), ``niah_multiquery`` (2 keys asked, not 4: four keys and their needles
  take 272–278 bytes), ``vt`` (2 hops, not 4), ``cwe`` (3 words 4 times among words once,
  not 10 words 30 times among words 3 times), ``fwe`` (the 2 most frequent words, not 3:
  three need up to 258 bytes);
* left out: ``niah_multikey_3`` (uuid keys and values: the target needle, question and
  answer take about 190 bytes, so no distractor needle fits at 1×), ``qa_1`` and ``qa_2``
  (the gold Shakespeare speech, its cast note and the quoted question leave room for at
  most one distractor document, often none).

**Curriculum.** Trained at L = 256 from the start, this model stays on a *format
plateau*: it learns that the answer is a digit 1–9, three digits and EOS — an answer-byte
NLL of (ln 9 + 3 ln 10 + 0) / 5 ≈ 1.82 nats — but not the lookup (pilots, docs/
long_context_eval.md: the old 3-task mix at 250 × 16 and 640 × 16 rows, and
``niah_single_1`` alone at 32 rows, 1.87 nats and 0% after 100 steps). At 128 bytes the
same model leaves the plateau within about 100 steps (the entmax experiment's recipe,
and our warm-up stage), and training continues at 256 from there (measured figures:
docs/long_context_eval.md, "Pilots"). So training runs in stages ``(length, steps,
tasks)`` (:func:`curriculum_dataset`, one grain ``MapDataset`` and one learning-rate
schedule; the train loop compiles once per row width): single-needle retrieval at
:data:`WARMUP_LEN` = 128 bytes, then the tasks at L.

Quick mode (a 160 s budget on 2 CPUs, evaluation included; 142 s quiet on 2026-12-01)
trains ``niah_single_1``
only — 200 steps × 32 rows at 128 bytes, then 60 steps × 32 rows at L — and evaluates
it at 5 depths with 4 items per cell; the full mode warms up 400 steps at 128 bytes,
trains 5,000 steps × 32 rows on all ten tasks at L and evaluates them at 5 depths with
20 items per cell, with ``other_weight`` 0.01 (it leaves the plateau faster than 0.1 in
the pilots). The quick mode does not reach the claim's 90%: the lookup at 256 comes
abruptly after about 200 steps × 32 rows at 256 (pilot Q1, learning rate held at 1e-2,
``other_weight`` 0.01: 17% held-out after 150 steps at 256, 50% after 200, 66% after
225), about 1.5× the quick budget's ceiling on 2 CPUs (docs/long_context_eval.md,
"Pilots"). The full mode reaches 94% on ``niah_single_1`` at 1× (2026-12-04; 87% with the
earlier 3,000-step schedule: docs/long_context_eval.md).
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
    experiment_parser,
    machine_info,
    print_result,
)
from lcjax.data import ruler
from lcjax.data.suites import Suite, SuiteTask

TRAIN_LEN = 256  # L, bytes (= tokens) of prompt + answer per training sample
EVAL_MULTS = (1, 2, 4, 8)
LR = 1e-2
MIN_LR_RATIO = 0.1  # cosine decay to LR * MIN_LR_RATIO at the last step (1.0: constant)
OTHER_WEIGHT = 0.1  # loss weight of the non-answer bytes (answer bytes weigh 1)
WARMUP_STEPS = 50  # learning-rate warm-up (at most a fifth of the steps)
DATA_SEED = 1  # TaskSource seed; the evaluator's items use other seed sequences
EVAL_SEED = 0
MODEL = dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16,
             mlp_hidden=172, max_len=max(EVAL_MULTS) * TRAIN_LEN + 64)

NEEDLE = "The magic number for {key} is {value}."
QUESTION = "\nThe magic number for {query} is "
_NUM = dict(needle=NEEDLE, prefix="", question=QUESTION, value_digits=4)
_MANY = dict(_NUM, question="\nThe magic numbers for {query} are ")
_UUID = dict(needle="The magic uuid for {key} is {value}.", prefix="",
             question="\nThe magic uuid for {query} is ", value_type="uuids")

# RULER's mix at L = 256 (module docstring): compact templates, fewer keys/values/hops.
TASKS: tuple[SuiteTask, ...] = (
    SuiteTask("niah_single_1", "niah", dict(haystack_kind="noise", **_NUM)),
    SuiteTask("niah_single_2", "niah", dict(haystack_kind="essay", **_NUM)),
    SuiteTask("niah_single_3", "niah", dict(haystack_kind="essay", **_UUID)),
    SuiteTask("niah_multikey_1", "niah", dict(haystack_kind="essay", num_keys=3, **_NUM)),
    SuiteTask("niah_multikey_2", "niah", dict(haystack_kind="needle", **_NUM)),
    SuiteTask("niah_multivalue", "niah", dict(haystack_kind="essay", num_values=2, **_MANY)),
    SuiteTask("niah_multiquery", "niah", dict(haystack_kind="essay", num_keys=2,
                                              num_queries=2, **_MANY)),
    SuiteTask("vt", "vt", dict(num_chains=1, num_hops=2, prefix="",
                               question="\nThe variables equal to {value} are: ")),
    SuiteTask("cwe", "cwe", dict(num_words=3, freq_common=4, freq_rare=1, prefix="",
                                 question="\nThe {num} most common words are: "),
              uses_depth=False),
    SuiteTask("fwe", "fwe", dict(num_words=2, alpha=2.0, prefix="",
                                 question="\nIgnoring '....', the {num} most frequent words "
                                          "are: "),
              uses_depth=False),
)
LEFT_OUT = {
    "niah_multikey_3": "uuid keys and values: no distractor needle fits beside the target at "
                       "256 bytes",
    "qa_1": "the gold speech and the quoted question leave room for at most one distractor "
            "document at 256 bytes",
    "qa_2": "the gold speech, its cast note and the question leave room for at most one "
            "distractor document at 256 bytes",
}
SUITE = Suite("ruler_256", ruler.generate, TASKS)
QUICK_TASKS = ("niah_single_1",)
TARGET_TASK = "niah_single_1"
ALL_TASKS = tuple(t.name for t in TASKS)

# Training runs in stages (length, steps, tasks): a warm-up on single-needle retrieval at
# WARMUP_LEN, then the mix at L (module docstring, "Curriculum").
WARMUP_LEN = 128
WARMUP_TASKS = ("niah_single_1",)
SETTINGS = {
    True: dict(stages=((WARMUP_LEN, 200, WARMUP_TASKS), (TRAIN_LEN, 60, QUICK_TASKS)),
               batch=32, other_weight=OTHER_WEIGHT, min_lr_ratio=MIN_LR_RATIO, tasks=QUICK_TASKS,
               depths=(0.0, 0.25, 0.5, 0.75, 1.0), n_per_cell=4),
    False: dict(stages=((WARMUP_LEN, 400, WARMUP_TASKS), (TRAIN_LEN, 5000, ALL_TASKS)),
                batch=32, other_weight=0.01, min_lr_ratio=MIN_LR_RATIO, tasks=ALL_TASKS,
                depths=(0.0, 0.25, 0.5, 0.75, 1.0), n_per_cell=20),
}


def training_dataset(tasks, steps: int, batch: int, *, seed: int = DATA_SEED,
                     length: int = TRAIN_LEN):
    """``steps`` batches of ``batch`` rows: a grain ``MapDataset`` over a
    :class:`lcjax.data.sources.TaskSource` of ``tasks`` at ``length`` bytes (rows of
    ``length + 1`` positions: BOS + prompt + answer + EOS)."""
    from lcjax.data.sources import task_batches

    return task_batches(SUITE, list(tasks), length=length, steps=steps, batch=batch, seed=seed)


def curriculum_dataset(stages, batch: int, *, seed: int = DATA_SEED):
    """The stages' datasets one after the other (``grain.MapDataset.concatenate``): stage
    ``k`` = ``(length, steps, tasks)`` gives ``steps`` batches of :func:`training_dataset`
    at ``length`` from TaskSource seed ``seed + k``; the train loop compiles once per row
    width."""
    from lcjax.data.sources import stage_batches

    return stage_batches(SUITE, stages, batch=batch, seed=seed)


def train_model(stages, *, batch: int = 32, seed: int = 0, other_weight: float = OTHER_WEIGHT,
                min_lr_ratio: float = MIN_LR_RATIO, log=print, progress: bool = False) -> dict:
    """Train the DecoderLM through ``lcjax.train.train`` on ``stages`` (``(length, steps,
    tasks)`` each, :func:`curriculum_dataset`; one learning-rate schedule over all steps);
    returns the model, the loss history (every step), seconds, throughput and the parameter
    count."""
    import jax
    from flax import nnx

    from lcjax.data import VOCAB_SIZE
    from lcjax.nn import DecoderConfig
    from lcjax.train import TrainConfig, answer_weighted_loss, train

    stages = tuple((int(n), int(k), tuple(t)) for n, k, t in stages)
    steps = sum(k for _, k, _ in stages)
    cfg = DecoderConfig(vocab_size=VOCAB_SIZE, **MODEL)
    run_cfg = TrainConfig(steps=steps, batch_size=batch, seq_len=max(n for n, _, _ in stages) + 1,
                          lr=LR, warmup_steps=min(WARMUP_STEPS, steps // 5),
                          min_lr_ratio=min_lr_ratio, seed=seed,
                          log_every=max(1, min(25, steps // 4)), eval_batches=0,
                          progress=progress)
    start, cpu = time.perf_counter(), time.process_time()
    result = train(cfg, run_cfg, dataset=curriculum_dataset(stages, batch),
                   loss_fn=answer_weighted_loss(other_weight))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    ends = np.cumsum([k for _, k, _ in stages])
    history = [{"step": r["step"], "length": stages[int(np.searchsorted(ends, r["step"]))][0],
                "loss": float(r["loss"]), "answer_nll": float(r["answer_nll"])}
               for r in result.history]
    every = max(1, steps // 8)
    for r in history:
        if r["step"] % every == 0 or r["step"] in ends:
            log(f"   step {r['step']} (L = {r['length']}): loss {r['loss']:.3f}, answer nll "
                f"{r['answer_nll']:.3f}")
    params = nnx.state(result.model, nnx.Param)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    return {"model": result.model, "history": history, "seconds": seconds, "cpu_s": cpu,
            "tokens_per_s": result.tokens_per_s, "params": n_params, "steps": steps,
            "stages": stages}


def stages_text(stages) -> str:
    """``"200 steps at 128 bytes (niah_single_1), then 120 steps at 256 bytes (...)"``."""
    return ", then ".join(f"{k} steps at {n} bytes ({', '.join(t)})" for n, k, t in stages)


def evaluate_model(model, tasks, lengths, depths, n_per_cell: int, *, seed: int = EVAL_SEED,
                   progress: bool = False):
    """``lcjax.eval.evaluate`` of ``model`` on ``tasks`` of :data:`SUITE`."""
    from lcjax.eval import evaluate

    return evaluate(model, SUITE, lengths=lengths, depths=depths, n_per_cell=n_per_cell,
                    seed=seed, tasks=list(tasks), batch_size=16, progress=progress)


def degradation(summary: dict, tasks, lengths) -> dict[str, list[float]]:
    """``{task: [string_match_all at each length]}`` (percent, mean over depths)."""
    return {t: [float(summary["tasks"][t]["lengths"][str(n)]["string_match_all"])
                for n in lengths] for t in tasks}


def degradation_markdown(table: dict[str, list[float]], lengths) -> str:
    """The table of :func:`degradation` in markdown (one row per task)."""
    head = "| task | " + " | ".join(f"{n // TRAIN_LEN}× ({n})" for n in lengths) + " |"
    lines = [head, "|---|" + "---|" * len(lengths)]
    lines += [f"| {t} | " + " | ".join(f"{v:.1f}" for v in row) + " |"
              for t, row in table.items()]
    return "\n".join(lines)


def _plot(path: Path, table: dict[str, list[float]], lengths) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, (task, row) in enumerate(table.items()):
        ax.plot(lengths, row, "o-", color=f"C{i % 10}", label=task)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [f"{n // TRAIN_LEN}× L\n({n})" for n in lengths])
    ax.set_ylim(-3, 103)
    ax.set_ylabel("string_match_all (%)")
    ax.set_title(f"RULER-style tasks, byte LM trained at L = {TRAIN_LEN}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(quick: bool, out_dir: Path, *, stages=None, steps: int | None = None, tasks=None,
        mults=None, depths=None, n_per_cell: int | None = None, batch: int | None = None,
        other_weight: float | None = None, min_lr_ratio: float | None = None,
        log=None) -> Result:
    """The experiment; keywords override the quick or full setting: ``stages`` (``(length,
    steps, tasks)`` each), ``tasks`` (evaluated, and trained in the last stage), ``steps``
    (one stage of ``steps`` at L instead of the curriculum: a smoke run,
    ``python -m experiments.long_eval.experiment --steps 20 --n-per-cell 1``)."""
    from lcjax.eval import write_report

    log = log or functools.partial(print, flush=True)
    s = SETTINGS[quick]
    tasks = tuple(s["tasks"] if tasks is None else tasks)
    stages = tuple(s["stages"] if stages is None else stages)
    if steps is not None:
        stages = ((TRAIN_LEN, steps, tasks),)
    elif tuple(stages[-1][2]) != tasks:
        stages = stages[:-1] + ((stages[-1][0], stages[-1][1], tasks),)
    mults = tuple(EVAL_MULTS if mults is None else mults)
    depths = tuple(s["depths"] if depths is None else depths)
    n_per_cell = s["n_per_cell"] if n_per_cell is None else n_per_cell
    batch = s["batch"] if batch is None else batch
    other_weight = s["other_weight"] if other_weight is None else other_weight
    min_lr_ratio = s["min_lr_ratio"] if min_lr_ratio is None else min_lr_ratio
    lengths = tuple(m * TRAIN_LEN for m in mults)
    out_dir = Path(out_dir)

    trained = train_model(stages, batch=batch, other_weight=other_weight,
                          min_lr_ratio=min_lr_ratio, log=log)
    steps = trained["steps"]
    log(f"   trained {trained['params'] / 1e3:.0f}k parameters, {steps} steps x {batch} in "
        f"{trained['seconds']:.0f} s, {trained['cpu_s']:.0f} CPU s "
        f"({trained['tokens_per_s']:,.0f} tok/s)")
    start, cpu = time.perf_counter(), time.process_time()
    results = evaluate_model(trained["model"], tasks, lengths, depths, n_per_cell)
    eval_seconds, eval_cpu = time.perf_counter() - start, time.process_time() - cpu
    paths = write_report(results, str(out_dir / "eval"), machine=machine_info(),
                         command="python experiments/reproduce.py"
                                 + (" --quick" if quick else "") + " --only long_eval")
    summary = results.summary
    table = degradation(summary, tasks, lengths)
    log(f"   evaluated {len(results.records)} items in {eval_seconds:.0f} s, "
        f"{eval_cpu:.0f} CPU s")
    for t, row in table.items():
        log(f"   {t:<16} " + "  ".join(f"{m}×L {v:5.1f}%" for m, v in zip(mults, row)))
    fig = out_dir / "degradation.png"
    _plot(fig, table, lengths)

    claims = []
    if TARGET_TASK in tasks and TRAIN_LEN in lengths:
        ours = table[TARGET_TASK][lengths.index(TRAIN_LEN)]
        n1 = summary["tasks"][TARGET_TASK]["lengths"][str(TRAIN_LEN)]["n"]
        claims.append(Claim(
            f"single-needle retrieval ({TARGET_TASK}) at the training length L = {TRAIN_LEN} "
            "(issue 9 must-show)", "string_match_all ≥ 90% at 1× L",
            f"{ours:.1f}% over {n1} items", ours >= 90.0))
    history = trained["history"]
    k = max(1, len(history) // 10)
    first = float(np.mean([r["loss"] for r in history[:k]]))
    last = float(np.mean([r["loss"] for r in history[-k:]]))
    notes = (f"Byte DecoderLM ({trained['params'] / 1e3:.0f}k parameters: "
             f"{MODEL['num_layers']} layers, d = {MODEL['d_model']}, RoPE) trained through "
             f"lcjax.train.train on the ruler_256 suite in stages: {stages_text(stages)} "
             f"({steps} steps × {batch} rows in all; grain MapDataset over TaskSource, "
             f"answer bytes weigh 1, the others {other_weight}), lr {LR} "
             f"(cosine to {LR * min_lr_ratio:g}): training loss "
             f"{first:.3f} → {last:.3f} (mean of the first and last {k} steps), "
             f"{trained['seconds']:.0f} s. Evaluated with lcjax.eval.evaluate (batched "
             f"prefill, greedy decoding through the KV cache) at {list(lengths)} bytes, depths "
             f"{list(depths)}, {n_per_cell} items per cell ({len(results.records)} items, "
             f"{eval_seconds:.0f} s). string_match_all (%) by length, mean over depths:\n\n"
             + degradation_markdown(table, lengths)
             + "\n\nPer-task depth × length heat maps and tables: eval/results.md. "
             "Compact templates and left-out tasks: experiments/long_eval/experiment.py.")
    answer_nll = float(np.mean([r["answer_nll"] for r in history[-k:]]))
    notes += (f" Answer-byte NLL at the end of training: {answer_nll:.3f} nats "
              f"(ln 10 = 2.303 for a uniform guess of a digit).")
    if claims and not claims[0].holds:
        notes += (f" Caveat: {TARGET_TASK} is below 90% at 1× L — the model is under-trained "
                  f"after {steps} steps × {batch} rows, so "
                  "the length columns measure under-training, not length generalisation.")
    figures = [fig] + [Path(p) for key, p in paths.items() if key.endswith("_heatmap")]
    return Result(claims=claims, notes=notes, figures=figures,
                  numbers={"train_len": TRAIN_LEN, "tasks": list(tasks), "lengths": list(lengths),
                           "depths": list(depths), "n_per_cell": n_per_cell, "steps": steps,
                           "stages": [list(st[:2]) + [list(st[2])] for st in stages],
                           "batch": batch, "lr": LR, "min_lr_ratio": min_lr_ratio,
                           "other_weight": other_weight,
                           "model": MODEL, "params": trained["params"],
                           "train_seconds": trained["seconds"], "eval_seconds": eval_seconds,
                           "train_cpu_seconds": trained["cpu_s"], "eval_cpu_seconds": eval_cpu,
                           "tokens_per_s": trained["tokens_per_s"],
                           "loss_first": first, "loss_last": last, "answer_nll": answer_nll,
                           "history": history[::max(1, steps // 50)] + history[-1:],
                           "string_match_all": table,
                           "overall": summary["overall"], "report_files": paths,
                           "left_out": LEFT_OUT})


EXPERIMENT = Experiment(
    name="long_eval",
    paper="RULER (Hsieh et al., 2024), long-context evaluation",
    summary="byte LM trained on RULER-style tasks at L = 256, evaluated at 1×–8× L over "
            "needle depths (depth × length heat maps)",
    run=run,
    quick_budget_s=130,  # 110 s in the 2026-12-02 afternoon make reproduce (1,207 s in all)
)


if __name__ == "__main__":
    parser = experiment_parser(EXPERIMENT)
    parser.add_argument("--steps", type=int, help="training steps (default: the setting's)")
    parser.add_argument("--n-per-cell", type=int, help="items per (task, length, depth)")
    args = parser.parse_args()
    res = run(not args.full, args.out, steps=args.steps, n_per_cell=args.n_per_cell)
    print_result(res)
