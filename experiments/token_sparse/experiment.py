"""Token Sparse Attention on a trained model: the accuracy of the same weights with sparse
prefill at several coverages, against the attention speed-up at the experiment's lengths.

Issue 10, item 4 (Token Sparse Attention, ICML 2026; the method: ``docs/token_sparse.md``). The
paper's headline: "up to 3.23× attention speed-up at 128K with < 1% accuracy loss". Here,
at toy scale:

1. **Train** one byte-level ``lcjax.nn.DecoderLM`` (3 layers, d = 64, RoPE, about 165k
   parameters) with **dense** attention (``"softmax"``) through ``lcjax.train.train`` on
   RULER-style single-needle retrieval — the recipe of ``experiments/entmax`` (noise
   haystack, the needle ``The magic number for {key} is {value}.`` with a 4-digit value,
   lr 1e-2, answer bytes weighing 1 and the others 0.1) on a grain ``MapDataset`` over
   ``lcjax.data.sources.TaskSource`` (record i from seed ``(seed, i)``, EOS after the
   answer), at L = :data:`SETTINGS` ``length`` bytes.
2. **Choose the layers** by representation drift: ``drift_per_layer`` on evaluation
   prompts, ``sparse_layers(drift, rule="median")`` (the layers at or below the median
   drift: with three layers, two of them).
3. **Evaluate the same weights** with ``lcjax.eval.evaluate`` on the suite's tasks at L,
   over needle depths: dense, then token-sparse attention in the chosen layers at each
   coverage of :data:`SETTINGS` (``min_tokens`` = L/8, ``window`` = L/16: the paper's 1024
   and 128 scaled down with L; ``pool`` 7 as in the paper; inner variant ``"softmax"``, the
   model's own attention). The model is run as the paper runs it
   (:class:`lcjax.eval.sparse_prefill.SparsePrefillGenerator`): the prompt is **prefilled**
   with token-sparse attention by the library's prefill (``lcjax.nn.sampling.prefill``, the one
   ``lcjax.nn.generate`` runs: the prompt alone through the model, sparse per row),
   every layer's full K/V is cached, and the answer is
   **decoded** greedily and densely through that cache — so the first answer byte comes
   from the sparse prefill and the later ones see the K/V the sparse prefill produced.
   The kept fraction (selected (token, head) pairs / (L·H)) is recorded per layer and item.
4. **Time** the attention step at the evaluation shapes (batch, prompt length, heads,
   head_dim of the model) on ``lcjax.bench.harness.make_inputs``' random inputs: dense
   ``"softmax"`` against ``"token_sparse"`` at each coverage with ``capacity`` = the
   largest budget K the model produced at that coverage (scoring, selection, gather, inner
   attention and scatter all inside the timed call; the time depends on the shapes, which
   ``capacity`` fixes, not on the values), forward only, side by side in interleaved
   rounds (``lcjax.bench.timing.time_interleaved``), so the ratios come from one run
   under the same load.

Claims, computed from the numbers (a failure is reported with our numbers):

* the paper's: some coverage has an attention speed-up ≥ 3.23× **and** accuracy
  (``string_match_all``) at most 1 point below dense;
* the issue's: at a kept fraction ≤ :data:`BENCH_KEPT_AT_2X` (where ``lcjax bench
  token_sparse`` measured ≥ 2× at T = 16K) accuracy is at most 1 point below dense;

neither when dense accuracy is below :data:`MIN_DENSE` (an under-trained model).

At L = 128 the attention step is tiny, so the method's fixed costs (the scoring pass, a
sort, gathers and a scatter) are not amortised: the speed-up column says what they cost
at the experiment's lengths; ``python -m experiments.token_sparse.bench`` measures T = 4K–32K.

Quick mode (a 140 s budget on 2 CPUs, everything included): 320 steps × 32 rows at
L = 128 on ``niah_single_1``, evaluation at 5 depths × 8 items, coverages 0.05, 0.2, 0.5.
Full mode: 1,500 steps × 32 rows on three single-needle haystacks (noise, Shakespeare,
distractor needles) — the first 300 at 128 bytes (the warm-up of ``experiments/long_eval``,
whose 2-layer model trained at 256 from the start sat on a format plateau), the other 1,200
at L = 256 — 5 depths × 40 items per task, coverages 0.01–0.5, and also every layer sparse
at each coverage; then the diagnosis of ``experiments/token_sparse/diagnose.py`` (4 items
per task and depth: the method against keys-only, zeroed-queries-only and needle-oracle
masks, and whether the needle is selected per layer and head).

Why accuracy is lost (``docs/token_sparse.md``, "Why the accuracy drops"): on the quick
model the method as implemented agrees with the public code and with an independent
mask-based path; adding the needle sentence to the selection restores 100% at every
coverage, and all the loss comes from layer 1, the model's retrieval layer, whose
window-scored selection drops the needle's key bytes.

Measured (``docs/token_sparse.md``; both runs on a loaded 2-CPU machine): quick
(``python experiments/reproduce.py --quick --only token_sparse``) dense 100%, token-sparse
80.0 / 27.5 / 10.0% at coverage 0.05 / 0.2 / 0.5 — the 1-point claim fails; full
(``python experiments/reproduce.py --only token_sparse``, 2026-12-04, 1,726 CPU s) dense
67.8% (``niah_single_1`` 99.0, ``niah_single_2`` 97.0, ``niah_multikey_2`` 7.5: the
distractor task not learned), the drift-chosen layers 66.8–67.7% at every coverage down to
kept 0.19 (7.76x at T = 253) — both claims hold as computed, exactly at the 1-point edge;
every layer sparse collapses (64.0% at coverage 0.01, 0% at 0.5).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
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
from lcjax.eval.sparse_prefill import (  # noqa: F401 (re-exported: the experiment's generator)
    SparsePrefillGenerator,
    kept_fraction,
    with_layer_attention,
)

__all__ = [
    "EXPERIMENT",
    "SETTINGS",
    "SUITE",
    "SparsePrefillGenerator",
    "claims_from",
    "run",
    "sparse_options",
    "time_attention",
    "train_dense",
    "with_layer_attention",
]

PAPER_SPEEDUP = 3.23  # the paper: "up to 3.23x attention speedup at 128K"
TOLERANCE = 1.0  # points of string_match_all below dense ("< 1% accuracy loss")
# `python -m experiments.token_sparse.bench` at T = 16K (random inputs, 8 heads, D = 64):
# the ≥ 2x rows are the coverage-0.5 ones, which keep about half of the (token, head) pairs.
BENCH_KEPT_AT_2X = 0.5
# below this dense accuracy the model has not learned the task: "no accuracy lost" would
# compare failures with failures, so the claims are reported as not holding
MIN_DENSE = 50.0
DENSE = "softmax"
LR = 1e-2
OTHER_WEIGHT = 0.1
DATA_SEED = 1
EVAL_SEED = 0
EVAL_BATCH = 20
POOL = 7
# three layers, so that the drift rule has layers to choose from (with two it picks the
# last, whose sparsity changes only the first answer byte); pilots at L = 128, 32 rows,
# lr 1e-2, on a loaded machine: 2 layers x 240 steps 30% / 50% string_match_all (two
# thread counts), 3 layers x 320 steps 100%, x 420 steps 95%, x 280 steps at lr 1.5e-2 30%
MODEL = dict(d_model=64, num_layers=3, num_heads=4, num_kv_heads=4, head_dim=16,
             mlp_hidden=172)

_NUM = dict(needle="The magic number for {key} is {value}.", prefix="",
            question="\nThe magic number for {query} is ", value_digits=4)
TASKS: tuple[SuiteTask, ...] = (
    SuiteTask("niah_single_1", "niah", dict(haystack_kind="noise", **_NUM)),
    SuiteTask("niah_single_2", "niah", dict(haystack_kind="essay", **_NUM)),
    SuiteTask("niah_multikey_2", "niah", dict(haystack_kind="needle", **_NUM)),
)
SUITE = Suite("token_sparse_niah", ruler.generate, TASKS)

SETTINGS = {
    True: dict(length=128, steps=320, batch=32, tasks=("niah_single_1",),
               depths=(0.0, 0.25, 0.5, 0.75, 1.0), n_per_cell=8,
               coverages=(0.05, 0.2, 0.5), all_layers=False, repeats=20, warmup=None,
               diagnose_per_cell=0),
    False: dict(length=256, steps=1500, batch=32,
                tasks=("niah_single_1", "niah_single_2", "niah_multikey_2"),
                depths=(0.0, 0.25, 0.5, 0.75, 1.0), n_per_cell=40,
                coverages=(0.01, 0.05, 0.1, 0.2, 0.3, 0.5), all_layers=True, repeats=50,
                warmup=(128, 300), diagnose_per_cell=4),
}


def sparse_options(length: int, coverage: float) -> dict:
    """Token-sparse options at L = ``length``: ``min_tokens`` L/8, ``window`` L/16 (the
    paper's 1024 and 128, scaled), ``pool`` 7, inner ``"softmax"``."""
    return dict(coverage=float(coverage), min_tokens=max(8, length // 8),
                window=max(4, length // 16), pool=POOL, inner=DENSE)


# ----------------------------------------------------------------------------
# Training (dense)
# ----------------------------------------------------------------------------
def training_stages(tasks, length: int, steps: int, warmup=None) -> tuple:
    """``(length, steps, tasks)`` stages: ``steps`` at ``length``, or with ``warmup`` =
    ``(warmup_length, warmup_steps)`` the first ``warmup_steps`` of them at
    ``warmup_length`` (the curriculum of ``experiments/long_eval``)."""
    if not warmup:
        return ((length, steps, tuple(tasks)),)
    w_len, w_steps = warmup
    if not 0 < w_steps < steps:
        raise ValueError(f"training_stages: warm-up steps {w_steps} must be in (0, {steps})")
    return ((w_len, w_steps, tuple(tasks)), (length, steps - w_steps, tuple(tasks)))


def training_dataset(tasks, length: int, steps: int, batch: int, *, seed: int = DATA_SEED,
                     warmup=None):
    """``steps`` batches of ``batch`` rows (:func:`training_stages`): grain
    ``MapDataset``s over :class:`lcjax.data.sources.TaskSource` of ``tasks`` (rows of
    ``length + 1`` positions: BOS + prompt + answer + EOS), one after the other."""
    from lcjax.data.sources import stage_batches

    return stage_batches(SUITE, training_stages(tasks, length, steps, warmup), batch=batch,
                         seed=seed)


def train_dense(tasks, length: int, steps: int, *, batch: int = 32, seed: int = 0,
                model: Mapping | None = None, warmup=None, log=print) -> dict:
    """Train the dense DecoderLM through ``lcjax.train.train`` (``warmup``: see
    :func:`training_stages`); returns the model, the loss history, wall and CPU seconds and
    the parameter count."""
    import jax
    from flax import nnx

    from lcjax.data import VOCAB_SIZE
    from lcjax.nn import DecoderConfig
    from lcjax.train import TrainConfig, answer_weighted_loss, train

    cfg = DecoderConfig(vocab_size=VOCAB_SIZE, attention=DENSE, max_len=2 * length + 64,
                        **dict(model or MODEL))
    run_cfg = TrainConfig(steps=steps, batch_size=batch, seq_len=length + 1, lr=LR,
                          warmup_steps=min(100, steps // 5), seed=seed,
                          log_every=max(1, min(25, steps // 4)), eval_batches=0,
                          progress=False)
    dataset = training_dataset(tasks, length, steps, batch, warmup=warmup)
    start, cpu = time.perf_counter(), time.process_time()
    result = train(cfg, run_cfg, dataset=dataset,
                   loss_fn=answer_weighted_loss(OTHER_WEIGHT))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    history = [{"step": r["step"], "loss": float(r["loss"]),
                "answer_nll": float(r["answer_nll"])} for r in result.history]
    every = max(1, steps // 6)
    for r in history:
        if r["step"] % every == 0 or r["step"] == steps:
            log(f"   step {r['step']}: loss {r['loss']:.3f}, answer nll {r['answer_nll']:.3f}")
    n_params = sum(int(np.prod(x.shape))
                   for x in jax.tree.leaves(nnx.state(result.model, nnx.Param)))
    return {"model": result.model, "history": history, "seconds": seconds, "cpu_s": cpu,
            "params": n_params}


# ----------------------------------------------------------------------------
# Timing (lcjax.bench.harness)
# ----------------------------------------------------------------------------
def time_attention(seq_len: int, batch: int, model_cfg, variants: Mapping[str, dict], *,
                   repeats: int, log=print) -> list[dict]:
    """Forward attention time at the model's shapes, side by side: dense ``"softmax"``
    (label ``"dense"``) and ``"token_sparse"`` with each of ``variants`` (label ->
    options), on the random inputs of ``lcjax.bench.harness.make_inputs``, each jitted and
    timed in interleaved rounds (``lcjax.bench.timing.time_interleaved``: one call of each
    per round, so a change of load hits all alike). Records: ``variant``, ``status``,
    ``forward`` (``median_s``, ``min_s``, ``compile_s``, ``temp_bytes``, ``times_s``) and
    ``fwd_speedup_vs_anchor`` = dense median / the variant's."""
    from lcjax import attention as attn
    from lcjax.bench.harness import Case, make_inputs
    from lcjax.bench.timing import time_interleaved

    shape = dict(seq_len=seq_len, batch=batch, heads=model_cfg.num_heads,
                 kv_heads=model_cfg.num_kv_heads, head_dim=model_cfg.head_dim)
    q, k, v, _ = make_inputs(Case(DENSE, causal=True, backward=False, **shape))
    fns = {"dense": (functools.partial(attn.get(DENSE), causal=True), (q, k, v), True)}
    for label, opts in variants.items():
        fns[label] = (functools.partial(attn.get("token_sparse"), causal=True, **opts),
                      (q, k, v), True)
    stats, _ = time_interleaved(fns, repeats=repeats, warmup=2)
    dense = stats["dense"]["median_s"]
    records = []
    for name, st in stats.items():
        records.append({"variant": name, "status": "ok", **shape,
                        "options": dict(variants.get(name, {})), "forward": st,
                        "fwd_speedup_vs_anchor": dense / st["median_s"]})
        log(f"   T={seq_len} {name}: fwd {1e3 * st['median_s']:.3f} ms (compile "
            f"{st['compile_s']:.1f} s), {dense / st['median_s']:.2f}x vs dense")
    return records


# ----------------------------------------------------------------------------
# Claims
# ----------------------------------------------------------------------------
def claims_from(dense_acc: float, points: Sequence[Mapping], *,
                paper_speedup: float = PAPER_SPEEDUP, tolerance: float = TOLERANCE,
                kept_at_2x: float = BENCH_KEPT_AT_2X, min_dense: float = MIN_DENSE,
                seq_len: int | None = None) -> list[Claim]:
    """The two claims from the numbers: ``points`` are the token-sparse rows
    (``coverage``, ``accuracy``, ``speedup``, ``kept`` = mean kept fraction of the sparse
    layers, ``label``), ``dense_acc`` dense accuracy (percent). Neither holds when dense
    accuracy is below ``min_dense`` (an under-trained model: nothing to lose). When no
    coverage reaches ``paper_speedup`` and ``seq_len`` (the timed length) is given, the
    paper's claim says that the step is too short at that length and that the speed claim
    is the benchmark's."""
    learned = dense_acc >= min_dense
    caveat = "" if learned else (f"not checkable: dense {dense_acc:.1f}% < {min_dense:g}% "
                                 "(under-trained); ")
    pts = [p for p in points if p.get("speedup") is not None]
    ok = lambda p: p["accuracy"] >= dense_acc - tolerance
    fast = [p for p in pts if p["speedup"] >= paper_speedup]
    fast_ok = [p for p in fast if ok(p)]
    if fast_ok:
        best = max(fast_ok, key=lambda p: p["speedup"])
        ours = (f"{best['speedup']:.2f}x at {best['label']} (kept {best['kept']:.2f}): "
                f"{best['accuracy']:.1f}% vs dense {dense_acc:.1f}%")
    elif fast:
        best = max(fast, key=lambda p: p["accuracy"])
        ours = (f"{best['speedup']:.2f}x at {best['label']} but {best['accuracy']:.1f}% vs "
                f"dense {dense_acc:.1f}% ({dense_acc - best['accuracy']:.1f} points lost)")
    elif pts:
        best = max(pts, key=lambda p: p["speedup"])
        ours = (f"best speed-up {best['speedup']:.2f}x (at {best['label']}, kept "
                f"{best['kept']:.2f}, {best['accuracy']:.1f}% vs dense {dense_acc:.1f}%): "
                f"no coverage reaches {paper_speedup:g}x")
        if seq_len is not None:
            ours += (f" — at T = {seq_len} the attention step is too short for the method's "
                     "fixed costs (scoring pass, sort, gathers, scatter) to pay off; the "
                     "speed claim is `python -m experiments.token_sparse.bench`'s at T = 16K, "
                     "and this "
                     "experiment checks the accuracy at the kept fraction (next claim)")
    else:
        ours = "no timed token-sparse row"
    claims = [Claim(
        f"accuracy within {tolerance:g} point of dense at the paper's {paper_speedup:g}x "
        "attention speed-up",
        f"a coverage with speed-up >= {paper_speedup:g}x and string_match_all >= dense - "
        f"{tolerance:g} (dense >= {min_dense:g}%)", caveat + ours, bool(fast_ok) and learned)]
    sparse = [p for p in points if p["kept"] <= kept_at_2x]
    good = [p for p in sparse if ok(p)]
    if good:
        best = min(good, key=lambda p: p["kept"])
        ours = (f"kept {best['kept']:.2f} at {best['label']}: {best['accuracy']:.1f}% vs dense "
                f"{dense_acc:.1f}%")
    elif sparse:
        best = max(sparse, key=lambda p: p["accuracy"])
        ours = (f"best at kept <= {kept_at_2x:g}: {best['accuracy']:.1f}% ({best['label']}, "
                f"kept {best['kept']:.2f}) vs dense {dense_acc:.1f}%")
    else:
        least = min((p["kept"] for p in points), default=float("nan"))
        ours = f"no coverage kept <= {kept_at_2x:g} (least kept {least:.2f})"
    claims.append(Claim(
        f"accuracy within {tolerance:g} point of dense at the kept fraction where `lcjax "
        "bench token_sparse` measured >= 2x at T = 16K (issue 10 must-show)",
        f"kept fraction <= {kept_at_2x:g} with string_match_all >= dense - {tolerance:g} "
        f"(dense >= {min_dense:g}%)", caveat + ours, bool(good) and learned))
    return claims


# ----------------------------------------------------------------------------
# The experiment
# ----------------------------------------------------------------------------
def _accuracy(results, tasks) -> dict[str, float]:
    s = results.summary
    return {"overall": float(s["overall"]["string_match_all"]),
            **{t: float(s["tasks"][t]["overall"]["string_match_all"]) for t in tasks}}


def _plot(path: Path, dense: float, points: Sequence[Mapping], length: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, xlabel in ((ax1, "speedup", "attention speed-up vs dense (fwd, interleaved)"),
                            (ax2, "kept", "kept fraction of (token, head) pairs, sparse layers")):
        for j, group in enumerate(dict.fromkeys(p["layers_label"] for p in points)):
            sub = sorted((p for p in points if p["layers_label"] == group
                          and p.get(key) is not None), key=lambda p: p[key])
            ax.plot([p[key] for p in sub], [p["accuracy"] for p in sub], "o-",
                    color=f"C{j}", label=f"token-sparse, {group}")
            for p in sub:
                ax.annotate(f"c={p['coverage']:g}", (p[key], p["accuracy"]), fontsize=7,
                            textcoords="offset points", xytext=(3, 3))
        ax.plot([1.0], [dense], "k*", ms=12, label="dense")
        ax.axhspan(dense - TOLERANCE, dense, color="gray", alpha=0.2,
                   label=f"within {TOLERANCE:g} point of dense")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("string_match_all (%)")
        ax.set_ylim(-3, 103)
    ax1.axvline(PAPER_SPEEDUP, color="gray", ls="--", lw=0.8)
    ax1.text(PAPER_SPEEDUP, 5, f" paper {PAPER_SPEEDUP:g}x", fontsize=7)
    ax1.legend(fontsize=7)
    fig.suptitle(f"Token Sparse Attention on a dense-trained byte LM, RULER-style niah at "
                 f"L = {length}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(dense: dict, points: Sequence[Mapping], tasks) -> str:
    head = ("| attention | coverage | layers | kept fraction per layer | budget K (max) | "
            + " | ".join(tasks) + " | overall | speed-up (fwd) |")
    lines = [head, "|---" * (7 + len(tasks)) + "|"]
    lines.append("| dense | 0 | - | 1 | - | " + " | ".join(f"{dense[t]:.1f}" for t in tasks)
                 + f" | {dense['overall']:.1f} | 1.00x |")
    for p in points:
        kept = ", ".join(f"L{i}: {v:.3f}" for i, v in p["kept_per_layer"].items())
        sp = "-" if p.get("speedup") is None else f"{p['speedup']:.2f}x"
        lines.append(f"| token_sparse | {p['coverage']:g} | {p['layers_label']} | {kept} | "
                     f"{p['budget_max']} | "
                     + " | ".join(f"{p['by_task'][t]:.1f}" for t in tasks)
                     + f" | {p['accuracy']:.1f} | {sp} |")
    return "\n".join(lines)


def _diagnosis_table(diag: Mapping) -> str:
    """Markdown of :func:`experiments.token_sparse.diagnose.diagnose`: accuracy per
    ablation, and per sparse layer the share of items whose needle value bytes were all
    kept and the needle value's share of the score mass (means over heads)."""
    layers = diag["layers"]
    head = ("| coverage | method | keys only | zeroed queries only | method + needle kept | "
            + " | ".join(f"L{i}: value kept / value mass" for i in layers) + " |")
    lines = [head, "|---" * (5 + len(layers)) + "|",
             "| dense | " + " | ".join([f"{diag['dense']:.1f}"] * 4) + " |"
             + " - |" * len(layers)]
    for p in diag["points"]:
        acc = p["accuracy"]
        sel = [p["selection"][str(i)] for i in layers]
        lines.append(f"| {p['coverage']:g} | " + " | ".join(
            f"{acc[m]:.1f}" for m in ("paper", "keys", "queries", "oracle")) + " | " + " | ".join(
            f"{np.mean(x['all_kept']['needle_value']):.2f} / "
            f"{np.mean(x['mass']['needle_value']):.3f}" for x in sel) + " |")
    return "\n".join(lines)


def run(quick: bool, out_dir: Path, *, steps: int | None = None, length: int | None = None,
        tasks=None, depths=None, n_per_cell: int | None = None, coverages=None,
        batch: int | None = None, all_layers: bool | None = None, repeats: int | None = None,
        model: Mapping | None = None, warmup=None, log=None) -> Result:
    """The experiment; keywords override the quick or full setting (a smoke run:
    ``python -m experiments.token_sparse.experiment --steps 20 --n-per-cell 1``)."""
    from lcjax.attention.token_sparse import drift_per_layer, layer_attention, sparse_layers
    from lcjax.data import tokenizer as tok
    from lcjax.eval import build_items, evaluate, max_answer_tokens, write_report

    log = log or functools.partial(print, flush=True)
    s = SETTINGS[quick]
    pick = lambda value, key: s[key] if value is None else value
    steps, length, batch = pick(steps, "steps"), pick(length, "length"), pick(batch, "batch")
    tasks, depths = tuple(pick(tasks, "tasks")), tuple(pick(depths, "depths"))
    n_per_cell, repeats = pick(n_per_cell, "n_per_cell"), pick(repeats, "repeats")
    coverages = tuple(pick(coverages, "coverages"))
    all_layers = pick(all_layers, "all_layers")
    out_dir = Path(out_dir)
    cpu0 = time.process_time()

    warmup = pick(warmup, "warmup")
    trained = train_dense(tasks, length, steps, batch=batch, model=model, warmup=warmup,
                          log=log)
    dense_model = trained["model"]
    cfg = dense_model.config
    log(f"   trained {trained['params'] / 1e3:.0f}k parameters, {steps} steps x {batch} at "
        f"L = {length} in {trained['seconds']:.0f} s, {trained['cpu_s']:.0f} CPU s")

    items = build_items(SUITE, (length,), depths, n_per_cell, EVAL_SEED, tasks=list(tasks))
    new_tokens = max_answer_tokens(items, margin=1)  # the answer and its EOS
    prompts = [tok.encode(it.prompt, bos=True) for it in items]
    n_prompt = max(len(p) for p in prompts)
    probe = np.stack([p for p in prompts if len(p) == n_prompt][:EVAL_BATCH])
    drift = drift_per_layer(dense_model, probe)
    chosen = sparse_layers(drift, rule="median")
    log(f"   drift per layer {np.round(drift, 4).tolist()}: token-sparse layers {chosen}")

    def evaluate_with(model, label):
        gen = SparsePrefillGenerator(model, dense_model, max_new_tokens=new_tokens,
                                     batch_size=EVAL_BATCH)
        start, cpu = time.perf_counter(), time.process_time()
        res = evaluate(gen, SUITE, lengths=(length,), depths=depths, n_per_cell=n_per_cell,
                       seed=EVAL_SEED, tasks=list(tasks), batch_size=EVAL_BATCH,
                       progress=False)
        acc = _accuracy(res, tasks)
        log(f"   {label}: string_match_all {acc['overall']:.1f}% "
            f"({time.perf_counter() - start:.0f} s, {time.process_time() - cpu:.0f} CPU s)")
        return res, acc, gen

    dense_res, dense_acc, _ = evaluate_with(dense_model, "dense")
    report_paths = write_report(dense_res, str(out_dir / "eval_dense"), machine=machine_info(),
                                command="python experiments/reproduce.py"
                                        + (" --quick" if quick else "") + " --only token_sparse")

    layer_sets = [("drift-chosen", tuple(chosen))]
    if all_layers and len(chosen) < cfg.num_layers:
        layer_sets.append(("all layers", tuple(range(cfg.num_layers))))
    points = []
    for layers_label, layers in layer_sets:
        for c in coverages:
            opts = sparse_options(length, c)
            names, options = layer_attention(cfg.num_layers, layers, sparse_options=opts,
                                             dense_variant=DENSE)
            sparse_model = with_layer_attention(dense_model, names, options)
            label = f"coverage {c:g}, {layers_label} layers {list(layers)}"
            _, acc, gen = evaluate_with(sparse_model, label)
            kept_layer = {i: float(np.mean([k[i] for k in gen.kept])) for i in layers}
            budget_max = max(max(b.values()) for b in gen.budgets)
            points.append({"coverage": c, "layers": list(layers), "layers_label": layers_label,
                           "label": f"coverage {c:g} ({layers_label})",
                           "options": opts, "accuracy": acc["overall"], "by_task": acc,
                           "kept_per_layer": kept_layer,
                           "kept": float(np.mean(list(kept_layer.values()))),
                           "kept_per_item": [list(k.values()) for k in gen.kept],
                           "budget_max": int(budget_max)})
            log(f"      kept fraction per layer {kept_layer}, budget K max {budget_max}")

    diagnosis = None
    if s["diagnose_per_cell"]:  # why accuracy is lost: experiments/token_sparse/diagnose.py
        from experiments.token_sparse.diagnose import diagnose

        diagnosis = diagnose(dense_model, length=length, tasks=tasks, depths=depths,
                             n_per_cell=s["diagnose_per_cell"], coverages=coverages,
                             layers=chosen, modes=("paper", "keys", "queries", "oracle"),
                             log=log)

    # attention time at the evaluation shapes, capacity = the model's largest budget
    variants = {}
    for p in points:
        key = f"token_sparse@{p['coverage']:g}/K={p['budget_max']}"
        variants[key] = {**p["options"], "capacity": max(p["budget_max"], 1)}
        p["timing_label"] = key
    timing = time_attention(n_prompt, EVAL_BATCH, cfg, variants, repeats=repeats, log=log)
    by_label = {r["variant"]: r for r in timing}
    for p in points:
        p["speedup"] = by_label[p["timing_label"]].get("fwd_speedup_vs_anchor")

    claims = claims_from(dense_acc["overall"], points, seq_len=n_prompt)
    fig = out_dir / "accuracy_vs_speedup.png"
    _plot(fig, dense_acc["overall"], points, length)
    history = trained["history"]
    k = max(1, len(history) // 10)
    first = float(np.mean([r["loss"] for r in history[:k]]))
    last = float(np.mean([r["loss"] for r in history[-k:]]))
    answer_nll = float(np.mean([r["answer_nll"] for r in history[-k:]]))
    dense_ms = by_label["dense"]["forward"]["median_s"] * 1e3
    cpu_total = time.process_time() - cpu0
    notes = (
        f"Byte DecoderLM ({trained['params'] / 1e3:.0f}k parameters: {cfg.num_layers} layers, "
        f"d = {cfg.d_model}, {cfg.num_heads} heads of {cfg.head_dim}, RoPE) trained with dense "
        f"attention through lcjax.train.train on {', '.join(tasks)} at L = {length} bytes for "
        f"{steps} steps x {batch} rows, lr {LR} (training loss {first:.3f} -> {last:.3f}, "
        f"answer NLL at the end {answer_nll:.3f} nats; {trained['seconds']:.0f} s). Drift per "
        f"layer {np.round(drift, 4).tolist()} -> token-sparse layers {list(chosen)} "
        f"(median rule). Evaluated with lcjax.eval.evaluate on {len(items)} items "
        f"({', '.join(tasks)} at L = {length}, depths {list(depths)}, {n_per_cell} per cell) "
        f"through SparsePrefillGenerator: sparse prefill of the {n_prompt}-token prompt, "
        f"dense greedy decoding through the full K/V cache. Token-sparse options: min_tokens "
        f"{sparse_options(length, 0.1)['min_tokens']}, window "
        f"{sparse_options(length, 0.1)['window']}, pool {POOL}, inner {DENSE!r}. Speed-up: "
        f"forward attention time at [B={EVAL_BATCH}, T={n_prompt}, H={cfg.num_heads}, "
        f"D={cfg.head_dim}] on lcjax.bench.harness.make_inputs (dense {dense_ms:.3f} ms), "
        f"token_sparse with capacity = the largest budget K the model produced, medians of "
        f"{repeats} interleaved rounds (lcjax.bench.timing.time_interleaved).\n\n"
        + _table(dense_acc, points, tasks)
        + f"\n\nCPU time of the whole run: {cpu_total:.0f} s. Dense evaluation report: "
        "eval_dense/results.md.")
    if warmup:
        notes += (f" Training ran {warmup[1]} of the {steps} steps at {warmup[0]} bytes first "
                  "(the warm-up of experiments/long_eval).")
    if tuple(chosen) == (cfg.num_layers - 1,):
        notes += (" Caveat: the drift rule chose only the last layer, whose sparsity changes "
                  "the prefill's last-position output (the first answer byte) but not the K/V "
                  "it caches (they come from its input): decoding after the first byte is "
                  "exactly dense. The full mode also makes every layer sparse.")
    if dense_acc["overall"] < 90.0:
        notes += (f" Caveat: dense accuracy {dense_acc['overall']:.1f}% — the model is "
                  f"under-trained after {steps} steps, so 'within 1 point of dense' is a weak "
                  "check here.")
    if not claims[0].holds:
        notes += (f" At L = {length} the attention step is too small for the method's fixed "
                  "costs (scoring pass, sort, gathers, scatter) to pay off; `lcjax bench "
                  "token_sparse` measures the speed-up at T = 4K-32K.")
    if diagnosis:
        notes += (
            f"\n\nDiagnosis (experiments/token_sparse/diagnose.py, {s['diagnose_per_cell']} "
            "items per (task, depth), string_match_all in %): the method (query and key both "
            "selected), only the keys restricted (every query computed), only the dropped "
            "queries zeroed (every key visible), and the method with the needle sentence "
            "added to every head's selection; per sparse layer, the share of items whose "
            "needle value bytes were all kept and their share of the pooled score mass "
            "(means over heads).\n\n" + _diagnosis_table(diagnosis))
    timing_rows = timing
    return Result(claims=claims, notes=notes, figures=[fig], numbers={
        "length": length, "prompt_tokens": n_prompt, "tasks": list(tasks),
        "depths": list(depths), "n_per_cell": n_per_cell, "items": len(items),
        "steps": steps, "batch": batch, "lr": LR, "model": dict(model or MODEL),
        "params": trained["params"], "train_seconds": trained["seconds"],
        "train_cpu_seconds": trained["cpu_s"], "cpu_seconds": cpu_total,
        "loss_first": first, "loss_last": last, "answer_nll": answer_nll,
        "history": history[::max(1, steps // 50)] + history[-1:],
        "drift": drift.tolist(), "sparse_layers": list(chosen),
        "dense_accuracy": dense_acc, "points": points, "timing": timing_rows,
        "paper_speedup": PAPER_SPEEDUP, "tolerance_points": TOLERANCE,
        "bench_kept_at_2x": BENCH_KEPT_AT_2X, "dense_report_files": report_paths,
        "warmup": warmup, "diagnosis": diagnosis})


EXPERIMENT = Experiment(
    name="token_sparse",
    paper="Token Sparse Attention (ICML 2026), on a trained model",
    summary="a dense-trained byte LM evaluated with token-sparse prefill in the drift-chosen "
            "layers at several coverages: RULER-style accuracy vs attention speed-up",
    run=run,
    quick_budget_s=140,  # 121 s in the 2026-12-02 afternoon make reproduce (1,207 s in all)
)


if __name__ == "__main__":
    parser = experiment_parser(EXPERIMENT)
    parser.add_argument("--steps", type=int, help="training steps (default: the setting's)")
    parser.add_argument("--length", type=int, help="L in bytes (default: the setting's)")
    parser.add_argument("--n-per-cell", type=int, help="items per (task, depth)")
    args = parser.parse_args()
    res = run(not args.full, args.out, steps=args.steps, length=args.length,
              n_per_cell=args.n_per_cell)
    print_result(res)
