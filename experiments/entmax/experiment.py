"""ASEntmax / AdaSplash-2: do α-entmax attention models match softmax at the training length
and gain beyond it? A fair long-context test.

Claim checked ("α-entmax models match softmax at short context and gain at long context";
Vasylenko et al., "Long-Context Generalization with Sparse Attention", ICLR 2026, the basis
of AdaSplash-2's long-context claim), at toy scale, on byte-level ``DecoderLM``s that differ
only in their attention and position encoding:

* variants: ``softmax`` (the registry's ``"blockwise"``: exact softmax, computed blockwise
  like entmax), ``ssmax`` (softmax with learned s·log n query scaling), ``entmax``
  (α = 1.5) and ``asentmax`` (α = 1.5 entmax with learned δ + β·log(n)^γ query scaling);
  a variant the registry does not list is reported "not run";
* positions: RoPE and NAPE (half the heads ALiBi, half none; ``DecoderConfig(position=)``),
  NAPE "not run" while the model config has no ``position`` field;
* tasks: RULER-style single-needle retrieval (``lcjax.data.ruler.niah``) and two of
  ASEntmax's extrapolation tasks (``lcjax.data.synthetic``): multi-query multi-token
  associative recall (``mqmtar``) and flip-flop (``flip_flop``).

What makes it fair: every (task, variant, position, seed) trains through
``lcjax.train.train`` with the same model size, data stream, optimizer and **step cap**,
and is checked every ``CHECK_EVERY`` steps on a held-out set at the training length by the
train loop's eval hook (:func:`exact_eval`); training stops once exact match reaches 90%
there (the run is interrupted with ``stop_at`` and resumed from its checkpoint, which the
loop reproduces bit for bit), or at the cap, when the model is reported as **not learned**
and left out of the verdict. Learned models are scored at 1×, 2×, 4×, 8×, 16× L on fresh
items by exact match of the greedy answer (one teacher-forced pass:
``ruler.answer_accuracy``), with 95% bootstrap intervals over seeds and items.

Verdict, per task, position and sparse variant (entmax, asentmax) against softmax: it
*matches at short context* when both learned the task and its 1× exact match is at most 5
points below softmax's, and *gains at long context* when its mean exact match over 2×–16× L
minus softmax's has a 95% bootstrap interval above 0.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from experiments.common import (
    Claim,
    Experiment,
    Result,
    experiment_parser,
    not_tested,
    print_result,
    records_dir,
)

EVAL_MULTS = (1, 2, 4, 8, 16)
LEARNED = 0.9  # exact match at 1× L that counts as "learned"
MATCH_TOL = 0.05  # "matches softmax at short context": at most this far below it at 1×
BATCH = 32
OTHER_WEIGHT = 0.1  # loss weight of the non-answer bytes (answer bytes weigh 1)
CHECK_EVERY = 100  # steps between the held-out checks (early stop)
VALID_ITEMS = 128  # held-out items at 1× L for the check
BOOTSTRAP = 2000
MODEL = dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16,
             mlp_hidden=172)
# The variants and the registry entry each one runs ("softmax" runs the blockwise exact
# softmax: same numbers as the dense reference, memory O(T) like the entmax path).
VARIANTS = {"softmax": "blockwise", "ssmax": "ssmax", "entmax": "entmax",
            "asentmax": "asentmax"}
SPARSE = ("entmax", "asentmax")
POSITIONS = ("rope", "nape")
# RULER niah_single_1 made small enough for L = 128 bytes: one needle "The magic number for
# {key} is {value}." (adjective-noun key, 4-digit value) in the noise haystack at a uniform
# depth; the prompt ends with "The magic number for {key} is ".
NIAH = dict(haystack_kind="noise", key_type="words", value_type="numbers", value_digits=4,
            num_keys=1, needle="The magic number for {key} is {value}.", prefix="",
            question="\nThe magic number for {query} is ")


@dataclasses.dataclass(frozen=True)
class Task:
    """A task: ``make(rng, length) -> Sample`` at training length ``train_len`` bytes,
    trained at peak learning rate ``lr`` (the same for every variant)."""

    name: str
    train_len: int
    make: Callable
    describe: str
    lr: float = 3e-3


def _niah(rng, length):
    from lcjax.data import ruler

    return ruler.niah(rng, length, **NIAH)


def _synthetic(task, rng, length, **kw):
    from lcjax.data import synthetic

    return synthetic.generate(task, rng, length, **kw)


TASKS = {
    "niah": Task("niah", 128, _niah,
                 "RULER single needle 'The magic number for {key} is {value}.' (4-digit "
                 "value) in the noise haystack; answer: the value", lr=1e-2),
    "mqmtar": Task("mqmtar", 64, functools.partial(_synthetic, "mqmtar", num_queries=4),
                   "multi-query multi-token associative recall: 'kk:vv' pairs in spaces, "
                   "then 4 queries '?kk:' each answered by its 2-letter value"),
    "flip_flop": Task("flip_flop", 64, functools.partial(_synthetic, "flip_flop"),
                      "flip-flop: w/i instruction-bit pairs (write prob 0.1), final 'r'; "
                      "answer: the last written bit"),
}


@dataclasses.dataclass(frozen=True)
class Setting:
    seeds: tuple[int, ...]
    tasks: tuple[str, ...]
    variants: tuple[str, ...] | None  # None: softmax and one sparse (quick_variants)
    positions: tuple[str, ...]
    max_steps: int  # the one budget cap (training steps of BATCH rows) for every run
    eval_items: int  # fresh items per length


FULL = Setting(seeds=(0, 1, 2), tasks=("niah", "mqmtar", "flip_flop"),
               variants=tuple(VARIANTS), positions=POSITIONS, max_steps=2000, eval_items=256)
# quick: the one task a softmax model learns within a few hundred steps at this size
# (pilots: MQMTAR 0% and flip-flop 69% held-out exact match after 400 / 600 steps)
QUICK = Setting(seeds=(0,), tasks=("niah",), variants=None,
                positions=("rope",), max_steps=500, eval_items=64)


# --- what exists ---------------------------------------------------------------------------


def registered() -> set[str]:
    """Attention names the registry lists (entmax-family modules imported first)."""
    from lcjax import attention

    try:
        import lcjax.attention.entmax  # noqa: F401  (the entmax folder; lcjax.attention registers it)
    except ImportError:
        pass
    return set(attention.available())


def positions_supported() -> set[str]:
    """The position encodings ``DecoderConfig`` takes (RoPE only without its ``position``)."""
    from lcjax.nn import DecoderConfig

    return set(POSITIONS) if "position" in {f.name for f in dataclasses.fields(DecoderConfig)} \
        else {"rope"}


def quick_variants(names: set[str]) -> tuple[str, ...]:
    """Quick mode's two variants: softmax and asentmax, else entmax (if registered)."""
    for sparse in ("asentmax", "entmax"):
        if VARIANTS[sparse] in names:
            return ("softmax", sparse)
    return ("softmax",)


# --- data, hooks, training -------------------------------------------------------------------


class TaskRows:
    """grain ``RandomAccessDataSource``: record ``i`` is ``task.make(rng([seed, i]), length)``
    as a ``synthetic.make_batch`` row (loss mask on the answer bytes)."""

    def __init__(self, task: Task, length: int, num_records: int, seed: int):
        self.task, self.length, self.num_records, self.seed = task, length, num_records, seed

    def __len__(self):
        return self.num_records

    def sample(self, i: int):
        return self.task.make(np.random.default_rng([self.seed, i]), self.length)

    def __getitem__(self, i):
        from lcjax.data import synthetic

        return {k: v[0] for k, v in synthetic.make_batch([self.sample(int(i))]).items()}


def batches(task: Task, length: int, n: int, seed: int, rows: int) -> list[dict]:
    """``n`` items of ``length`` bytes as batches of ``rows`` rows (the last one short)."""
    from lcjax.data import synthetic

    src = TaskRows(task, length, n, seed)
    return [synthetic.make_batch([src.sample(i) for i in range(a, min(a + rows, n))])
            for a in range(0, n, rows)]


def exact_eval(model, batch, rng):
    """The eval hook: answer-byte NLL and exact match of the greedy answer per row.

    Returns ``(answer NLL, {"loss_weight": answer bytes, "exact": (fraction of rows whose
    answer bytes are all the argmax, rows with an answer)})``.
    """
    import jax.numpy as jnp

    from lcjax.train import metrics

    del rng
    logits = metrics.model_logits(model, batch)
    mask = batch["loss_mask"] if "loss_mask" in batch else jnp.zeros_like(batch["targets"], bool)
    loss, total = metrics.weighted_nll(logits, batch["targets"], mask.astype(jnp.float32))
    right = (jnp.argmax(logits, -1) == batch["targets"]) | ~mask
    rows = mask.any(1)
    n = rows.sum()
    exact = (right.all(1) & rows).sum() / jnp.maximum(n, 1)
    return loss, {"loss_weight": total, "exact": (exact, n.astype(jnp.float32))}


@functools.cache
def _loss_fn():
    """One loss hook object for every run (the train loop compiles once per hook)."""
    from lcjax.train.losses import answer_weighted_loss

    return answer_weighted_loss(OTHER_WEIGHT)


def model_config(variant: str, position: str, max_len: int):
    from lcjax.data import VOCAB_SIZE
    from lcjax.nn import DecoderConfig

    kw = {"position": position} if "position" in {
        f.name for f in dataclasses.fields(DecoderConfig)} else {}
    return DecoderConfig(vocab_size=VOCAB_SIZE, attention=VARIANTS[variant], max_len=max_len,
                         **MODEL, **kw)


def train_until_learned(task: Task, variant: str, position: str, seed: int, max_steps: int,
                        *, check_every: int | None = None, valid_items: int | None = None,
                        log=print) -> dict:
    """Train one model on ``task`` at its training length until the held-out exact match
    reaches :data:`LEARNED` (checked every ``check_every`` steps by :func:`exact_eval`) or
    ``max_steps``. Returns the model's pieces, the checks, steps run and seconds."""
    import grain
    import jax
    from flax import nnx

    from lcjax.train import TrainConfig, train

    L = task.train_len
    cfg = model_config(variant, position, 16 * L)
    data_seed = 1_000 * seed + 17
    src = TaskRows(task, L, max_steps * BATCH, data_seed)
    dataset = grain.MapDataset.source(src).batch(BATCH, drop_remainder=True)
    valid = batches(task, L, valid_items or VALID_ITEMS, 7_000_000 + seed, 64)
    check_every = min(check_every or CHECK_EVERY, max_steps)
    checks, start = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="entmax_exp_") as out:
        run_cfg = TrainConfig(steps=max_steps, batch_size=BATCH, seq_len=L, lr=task.lr,
                              warmup_steps=min(100, max_steps // 5), seed=seed,
                              log_every=min(25, check_every), eval_every=check_every,
                              eval_batches=None, out_dir=out, progress=False)
        step, result = 0, None
        while step < max_steps:
            stop = min(step + check_every, max_steps)
            result = train(cfg, dataclasses.replace(run_cfg, resume=step > 0), dataset=dataset,
                           eval_dataset=valid, loss_fn=_loss_fn(), eval_fn=exact_eval,
                           stop_at=stop)
            step = result.step
            rec = result.evals[-1]
            train_loss = result.history[-1]["loss"] if result.history else math.nan
            checks.append({"step": step, "exact": rec["eval_exact"],
                           "answer_nll": rec["eval_loss"], "train_loss": train_loss})
            log(f"   {task.name} {variant}/{position} seed {seed} step {step}: held-out exact "
                f"{100 * rec['eval_exact']:.1f}%, answer nll {rec['eval_loss']:.3f}", flush=True)
            if rec["eval_exact"] >= LEARNED:
                break
    seconds = time.perf_counter() - start
    graphdef, params, rest = nnx.split(result.model, nnx.Param, ...)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    learned_at = step if checks[-1]["exact"] >= LEARNED else None
    return {"graphdef": graphdef, "params": params, "rest": rest, "checks": checks,
            "steps": step, "learned_at": learned_at, "seconds": seconds,
            "params_count": n_params}


@functools.lru_cache(maxsize=32)
def _predict(graphdef):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    @jax.jit
    def predict(params, rest, inputs):
        return jnp.argmax(nnx.merge(graphdef, params, rest)(inputs), axis=-1)

    return predict


def score(trained: dict, task: Task, length: int, n: int, seed: int) -> np.ndarray:
    """bool ``[n]``: exact match of the greedy answer on ``n`` fresh items of ``length``."""
    import jax

    from lcjax.data import ruler

    rows = max(1, min(32, (1 << 15) // length))
    predict = _predict(trained["graphdef"])
    out = []
    for batch in batches(task, length, n, seed, rows):
        k = len(batch["inputs"])
        if k < rows:  # pad the last batch to the compiled shape
            batch = {key: np.concatenate([v, np.repeat(v[-1:], rows - k, 0)]) for key, v in
                     batch.items()}
        pred = jax.device_get(predict(trained["params"], trained["rest"], batch["inputs"]))
        out.append(ruler.answer_accuracy(pred, batch)["exact"][:k])
    return np.concatenate(out)


# --- statistics, figure, verdict -------------------------------------------------------------


def bootstrap_mean(runs: np.ndarray, rng: np.random.Generator, reps: int = BOOTSTRAP
                   ) -> np.ndarray:
    """``[reps]`` bootstrap means of ``runs`` (``[seeds, items]``): seeds resampled (when
    more than one), then items within each seed."""
    s, n = runs.shape
    si = rng.integers(0, s, (reps, s)) if s > 1 else np.zeros((reps, 1), int)
    ii = rng.integers(0, n, (reps, s, n))
    return runs[si[:, :, None], ii].mean(axis=(1, 2))


def interval(x: np.ndarray) -> tuple[float, float]:
    lo, hi = np.quantile(x, [0.025, 0.975])
    return float(lo), float(hi)


def longest_ok(curve: dict[int, float]) -> int | None:
    """The longest multiple of L up to which exact match stays >= 90% (None if not at 1×)."""
    best = None
    for m in EVAL_MULTS:
        if curve[m] < LEARNED:
            break
        best = m
    return best


def _plot(path: Path, task: Task, cells: dict, positions) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(positions), figsize=(5.5 * len(positions), 4),
                             squeeze=False)
    mults = np.array(EVAL_MULTS)
    for ax, pos in zip(axes[0], positions):
        unlearned = [v for v in VARIANTS
                     if (v, pos) in cells and not cells[v, pos]["learned_seeds"]]
        if unlearned:
            ax.text(0.98, 0.6, "not learned at 1×:\n" + ", ".join(unlearned), ha="right",
                    transform=ax.transAxes, fontsize=8)
        for i, variant in enumerate(VARIANTS):
            c = cells.get((variant, pos))
            if c is None or not c["learned_seeds"]:
                continue
            mean = np.array([c["mean"][m] for m in EVAL_MULTS])
            lo = np.array([c["ci"][m][0] for m in EVAL_MULTS])
            hi = np.array([c["ci"][m][1] for m in EVAL_MULTS])
            ax.plot(mults, 100 * mean, "o-", color=f"C{i}",
                    label=f"{variant} ({len(c['learned_seeds'])} seed"
                          f"{'s' * (len(c['learned_seeds']) > 1)})")
            ax.fill_between(mults, 100 * lo, 100 * hi, color=f"C{i}", alpha=0.2)
        ax.set_xscale("log", base=2)
        ax.set_xticks(mults, [f"{m}×\n{m * task.train_len}" for m in EVAL_MULTS])
        ax.set_ylim(-3, 103)
        ax.set_xlabel("length (× L, bytes)")
        ax.set_ylabel("exact match of greedy answer (%)")
        ax.set_title(f"{task.name}, {pos}, trained at L = {task.train_len}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("learned models only; bands: 95% bootstrap over seeds and items", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarize(runs: list[dict], rng: np.random.Generator) -> dict:
    """Per (variant, position): learned seeds, mean and interval of exact match per length
    over the learned seeds' items."""
    cells = {}
    for key in {(r["variant"], r["position"]) for r in runs}:
        rs = [r for r in runs if (r["variant"], r["position"]) == key]
        ok = [r for r in rs if r["learned_at"] is not None]
        cell = {"seeds": [r["seed"] for r in rs], "learned_seeds": [r["seed"] for r in ok],
                "steps": [r["steps"] for r in rs], "params": rs[0]["params"],
                "valid_exact": [r["checks"][-1]["exact"] for r in rs]}
        if ok:
            arr = {m: np.array([r["exact"][m] for r in ok], float) for m in EVAL_MULTS}
            cell["mean"] = {m: float(arr[m].mean()) for m in EVAL_MULTS}
            cell["ci"] = {m: interval(bootstrap_mean(arr[m], rng)) for m in EVAL_MULTS}
            cell["longest_ok"] = longest_ok(cell["mean"])
            cell["long"] = np.concatenate([arr[m] for m in EVAL_MULTS[1:]], axis=1)
        cells[key] = cell
    return cells


def verdict(task: Task, pos: str, sparse: str, cells: dict, rng) -> Claim | None:
    """The claim for one sparse variant against softmax on one task and position."""
    s, b = cells.get((sparse, pos)), cells.get(("softmax", pos))
    if s is None or b is None:
        return None
    name = (f"{task.name}/{pos}: {sparse} matches softmax at L={task.train_len} and gains at "
            f"2×–16× L")
    target = (f"{sparse} 1× ≥ softmax 1× − {100 * MATCH_TOL:.0f} pts; mean exact over "
              "2×–16× minus softmax's: 95% interval > 0")
    precondition = f"both learned (≥ {100 * LEARNED:.0f}% at 1× on ≥ 1 seed)"
    not_learned = [v for v, c in ((sparse, s), ("softmax", b)) if not c["learned_seeds"]]
    if not_learned:
        return not_tested(name, target, "not learned at 1× within the step cap by "
                          + ", ".join(not_learned), precondition)
    diff = (bootstrap_mean(s["long"], rng) - bootstrap_mean(b["long"], rng))
    lo, hi = interval(diff)
    gain = float(s["long"].mean() - b["long"].mean())
    match = s["mean"][1] >= b["mean"][1] - MATCH_TOL
    seeds = (f"learned seeds {len(s['learned_seeds'])}/{len(s['seeds'])} vs "
             f"{len(b['learned_seeds'])}/{len(b['seeds'])}; ")
    ours = (seeds + f"1×: {100 * s['mean'][1]:.1f}% vs {100 * b['mean'][1]:.1f}%; 2×–16× mean "
            f"{100 * s['long'].mean():.1f}% vs {100 * b['long'].mean():.1f}% (gain "
            f"{100 * gain:+.1f} pts, 95% [{100 * lo:+.1f}, {100 * hi:+.1f}])")
    return Claim(name, target, ours, bool(match and lo > 0), precondition)


def train_and_score(task: Task, variant: str, pos: str, seed: int, setting: Setting, *,
                    log=print) -> dict:
    """One run: :func:`train_until_learned`, then, when learned, :func:`score` at every
    length of :data:`EVAL_MULTS` (``exact``: multiplier -> bool [eval_items])."""
    trained = train_until_learned(task, variant, pos, seed, setting.max_steps, log=log)
    rec = {"task": task.name, "variant": variant, "position": pos, "seed": seed,
           "steps": trained["steps"], "learned_at": trained["learned_at"],
           "checks": trained["checks"], "train_seconds": trained["seconds"],
           "params": trained["params_count"], "exact": {}}
    head = f"   {task.name} {variant}/{pos} seed {seed}"
    if trained["learned_at"] is None:
        log(f"{head}: NOT learned in {trained['steps']} steps", flush=True)
        return rec
    for m in EVAL_MULTS:
        rec["exact"][m] = score(trained, task, m * task.train_len, setting.eval_items,
                                9_000 + 100 * seed + m)
    log(f"{head}: exact " + ", ".join(f"{m}× {100 * rec['exact'][m].mean():.1f}%"
                                      for m in EVAL_MULTS)
        + f" ({trained['seconds']:.0f} s training)", flush=True)
    return rec


# --- run records (the full run resumes from them) -----------------------------------------


def run_record_path(out_dir: Path, task: str, variant: str, pos: str, seed: int) -> Path:
    """Where the full run keeps one finished (task, variant, position, seed) run: under
    ``runs/`` of the untracked twin of ``out_dir`` (``runs/records/entmax/runs/`` for the
    committed report dir, :func:`experiments.common.records_dir`)."""
    return records_dir(out_dir) / "runs" / f"{task}-{variant}-{pos}-seed{seed}.json"


def record_fingerprint(setting: Setting, task: str) -> dict:
    """What a kept run must have been trained and scored with to be reused."""
    t = TASKS[task]
    return {"max_steps": setting.max_steps, "eval_items": setting.eval_items, "model": MODEL,
            "batch": BATCH, "other_weight": OTHER_WEIGHT, "check_every": CHECK_EVERY,
            "valid_items": VALID_ITEMS, "learned": LEARNED, "eval_mults": list(EVAL_MULTS),
            "train_len": t.train_len, "lr": t.lr}


def save_run_record(path: Path | None, rec: dict, setting: Setting) -> None:
    """Write ``rec`` (its exact arrays as 0/1 lists) with its fingerprint; None: nothing."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    body = dict(rec, exact={str(m): np.asarray(a, dtype=int).tolist()
                            for m, a in rec["exact"].items()},
                fingerprint=record_fingerprint(setting, rec["task"]))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1))
    tmp.replace(path)


def load_run_record(path: Path | None, setting: Setting) -> dict | None:
    """The run kept at ``path`` (exact arrays back as bool), or None when there is none
    or it was made with another setting (:func:`record_fingerprint`)."""
    if path is None or not path.exists():
        return None
    body = json.loads(path.read_text())
    if body.pop("fingerprint", None) != record_fingerprint(setting, body["task"]):
        return None
    body["exact"] = {int(m): np.asarray(a, dtype=bool) for m, a in body["exact"].items()}
    return body


def run(quick: bool, out_dir: Path, *, setting: Setting | None = None, log=print) -> Result:
    """The experiment (``setting`` overrides the quick or full one: smoke tests).

    The full run (``quick=False``) keeps every finished run under :func:`run_record_path`
    (:func:`save_run_record`) and reuses the ones made with the same setting, so an
    interrupted full run resumes where it stopped; delete that folder to start over. The
    quick run keeps nothing."""
    setting = setting or (QUICK if quick else FULL)
    names = registered()
    variants = setting.variants or quick_variants(names)
    supported = positions_supported()
    ran = [v for v in variants if VARIANTS[v] in names]
    not_run = [v for v in (setting.variants or ("softmax", "asentmax"))
               if VARIANTS[v] not in names]
    positions = [p for p in setting.positions if p in supported]
    pos_not_run = [p for p in setting.positions if p not in supported]
    rng = np.random.default_rng(12345)
    runs, claims, figures, per_task = [], [], [], {}
    t_start = time.perf_counter()
    for tname in setting.tasks:
        task = TASKS[tname]
        task_runs = []
        for seed in setting.seeds:
            for pos in positions:
                for variant in ran:
                    path = None if quick else run_record_path(out_dir, tname, variant, pos,
                                                              seed)
                    rec = load_run_record(path, setting)
                    if rec is None:
                        rec = train_and_score(task, variant, pos, seed, setting, log=log)
                        save_run_record(path, rec, setting)
                    else:
                        log(f"   {tname} {variant}/{pos} seed {seed}: kept from {path}",
                            flush=True)
                    task_runs.append(rec)
        cells = summarize(task_runs, rng)
        fig = out_dir / f"{tname}_vs_length.png"
        _plot(fig, task, cells, positions)
        figures.append(fig)
        for pos in positions:
            for sparse in SPARSE:
                c = verdict(task, pos, sparse, cells, rng)
                if c is not None:
                    claims.append(c)
        per_task[tname] = {f"{v}/{p}": {
            "learned_seeds": c["learned_seeds"], "seeds": c["seeds"], "steps": c["steps"],
            "params": c["params"], "valid_exact_at_stop": c["valid_exact"],
            "exact_1x": c.get("mean", {}).get(1),
            "longest_len_90": (None if c.get("longest_ok") is None
                               else c["longest_ok"] * task.train_len),
            "mean_exact": c.get("mean"), "ci95": c.get("ci")} for (v, p), c in cells.items()}
        for r in task_runs:
            r["exact"] = {m: float(a.mean()) for m, a in r["exact"].items()}
        runs += task_runs
    seconds = time.perf_counter() - t_start
    notes = _notes(setting, ran, not_run, positions, pos_not_run, per_task, seconds)
    return Result(claims=claims, figures=figures, notes=notes, numbers={
        "setting": dataclasses.asdict(setting), "variants_run": ran, "variants_not_run": not_run,
        "positions_run": positions, "positions_not_run": pos_not_run, "model": MODEL,
        "batch": BATCH, "other_weight": OTHER_WEIGHT, "check_every": CHECK_EVERY,
        "learned_threshold": LEARNED, "eval_mults": EVAL_MULTS,
        "tasks": {t: {"train_len": TASKS[t].train_len, "describe": TASKS[t].describe,
                      "lr": TASKS[t].lr}
                  for t in setting.tasks},
        "per_task": per_task, "runs": runs, "seconds": seconds})


def _notes(setting, ran, not_run, positions, pos_not_run, per_task, seconds) -> str:
    lines = [f"Byte-level DecoderLM ({MODEL['num_layers']} layers, d={MODEL['d_model']}, "
             f"{MODEL['num_heads']} heads) per variant; every run capped at "
             f"{setting.max_steps} steps × {BATCH} rows (AdamW, peak lr per task, answer bytes "
             f"weight 1, others {OTHER_WEIGHT}), stopped early once held-out exact match at 1× L ≥ "
             f"{100 * LEARNED:.0f}% (checked every {CHECK_EVERY} steps on {VALID_ITEMS} items); "
             f"seeds {list(setting.seeds)}; {setting.eval_items} fresh items per length; "
             f"{seconds:.0f} s in all."]
    if not_run:
        lines.append("Not run (not registered): " + ", ".join(not_run) + ".")
    if pos_not_run:
        lines.append("Positions not run (DecoderConfig has no `position`): "
                     + ", ".join(pos_not_run) + ".")
    for t, cells in per_task.items():
        task = TASKS[t]
        parts = []
        for key in sorted(cells):
            c = cells[key]
            if not c["learned_seeds"]:
                parts.append(f"{key}: not learned in {max(c['steps'])} steps (held-out "
                             f"{', '.join(f'{100 * x:.0f}%' for x in c['valid_exact_at_stop'])})")
                continue
            longest = c["longest_len_90"]
            parts.append(f"{key}: 1× {100 * c['exact_1x']:.1f}%, ≥90% up to "
                         f"{'—' if longest is None else f'{longest} B'}, "
                         + "/".join(f"{100 * c['mean_exact'][m]:.0f}" for m in EVAL_MULTS)
                         + f"% at 1/2/4/8/16×, learned seeds {c['learned_seeds']} in "
                         f"{c['steps']} steps")
        lines.append(f"{t} (L = {task.train_len} B, lr {task.lr:g}; {task.describe}): "
                     + "; ".join(parts) + ".")
    return " ".join(lines)


EXPERIMENT = Experiment(
    name="entmax",
    paper="ASEntmax / AdaSplash-2 (α-entmax attention)",
    summary="softmax, SSMax, α=1.5 entmax and ASEntmax (RoPE, NAPE) trained to 90% at L on "
            "RULER niah, MQMTAR and flip-flop, scored at 1×–16× L",
    run=run,
    quick_budget_s=210,  # 186 s in the 2026-12-02 afternoon make reproduce (1,207 s in all)
)


if __name__ == "__main__":
    parser = experiment_parser(EXPERIMENT)
    parser.add_argument("--steps", type=int, help="the step cap (default: the setting's)")
    parser.add_argument("--eval-items", type=int, help="items per length")
    parser.add_argument("--tasks", help="comma-separated tasks (default: the setting's)")
    parser.add_argument("--variants", help="comma-separated variants (default: the setting's)")
    parser.add_argument("--seeds", help="comma-separated seeds (default: the setting's); runs "
                        "of other seeds in --out are left alone, so seeds can train in "
                        "parallel processes")
    args = parser.parse_args()
    base = FULL if args.full else QUICK
    over = {k: v for k, v in {
        "max_steps": args.steps, "eval_items": args.eval_items,
        "tasks": tuple(args.tasks.split(",")) if args.tasks else None,
        "variants": tuple(args.variants.split(",")) if args.variants else None,
        "seeds": tuple(int(x) for x in args.seeds.split(",")) if args.seeds else None}.items()
        if v is not None}
    result = run(not args.full, args.out, setting=dataclasses.replace(base, **over))
    print_result(result)
