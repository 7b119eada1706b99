"""AdaSplash-2: do α=1.5 entmax attention models keep retrieving past their training length?

Claim checked (AdaSplash-2's "long-context gains over softmax", at toy scale): two
identical byte-level DecoderLMs (RoPE), one with softmax attention and one with α=1.5
entmax attention ("entmax" in the registry), are trained on a RULER-style retrieval task
(``lcjax.data.ruler.niah``: find the value of a key in a noise haystack) at sequence length
L, then scored at 1×, 2× and 4× L by exact match of the greedy answer. The claim holds here
when entmax's exact match at 2× and 4× L is above softmax's. When "entmax" is not
registered, only softmax runs and the claim is reported as not checked.

Exact match of the greedy answer is computed in one teacher-forced forward pass: greedy
decoding produces the answer iff every answer byte is the argmax given the true prefix
(``ruler.answer_accuracy``).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np

from experiments.common import Claim, Experiment, Result
from lcjax.data.tokenizer import PAD

TRAIN_LEN = 128  # L, bytes (= tokens) per training sequence
EVAL_MULTS = (1, 2, 4)
STEPS = {True: 600, False: 1500}
SEEDS = {True: (0,), False: (0, 1, 2)}
EVAL_SAMPLES = {True: 128, False: 512}
BATCH = 32
LR = 1e-2
OTHER_WEIGHT = 0.1  # loss weight of non-answer bytes (answer bytes weigh 1)
MODEL = dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16,
             mlp_hidden=172, max_len=4 * TRAIN_LEN)
# Single needle (RULER niah_single_1 made easier for a 116k-parameter byte model): one
# needle "The magic number for {key} is {value}." (adjective-noun key, 4-digit value) in
# RULER's noise haystack at a uniform depth; the prompt ends with "The magic number for
# {key} is " and the answer is the value. RULER's own wording ("One of the special magic
# numbers for ... is: ...", a 150-byte question) would leave no haystack at L = 128.
TASK = dict(haystack_kind="noise", key_type="words", value_type="numbers", value_digits=4,
            num_keys=1, needle="The magic number for {key} is {value}.", prefix="",
            question="\nThe magic number for {query} is ")
VARIANTS = ("softmax", "entmax")


def entmax_available() -> bool:
    """Whether the "entmax" attention variant is registered (importing it if it exists)."""
    from lcjax import attention

    try:
        import lcjax.attention.entmax  # noqa: F401  (registers "entmax")
    except ImportError:
        pass
    return "entmax" in attention.available()


def task_samples(seed: int, length: int, n: int, **overrides):
    """``n`` task samples of ``length`` bytes (sample i from seed ``(seed, i)``)."""
    from lcjax.data import ruler

    kw = {**TASK, **overrides}
    return [ruler.niah(np.random.default_rng([seed, i]), length, **kw) for i in range(n)]


def _train_batch(seed: int, step: int) -> dict:
    """The training batch of ``step`` (0-based) for ``seed``: BATCH fresh task samples."""
    from lcjax.data import ruler

    b = ruler.make_batch(task_samples(10_000 * (seed + 1) + step, TRAIN_LEN, BATCH))
    return {k: b[k] for k in ("inputs", "targets", "loss_mask")}


def answer_weighted_loss(model, batch, rng):
    """The loss hook: next-byte NLL weighted 1 on answer bytes (``loss_mask``) and
    OTHER_WEIGHT on the other real targets; reports the answer bytes' NLL."""
    import jax.numpy as jnp

    from lcjax.train import metrics

    del rng
    w = jnp.where(batch["loss_mask"], 1.0, jnp.where(batch["targets"] != PAD, OTHER_WEIGHT, 0.0))
    logits = metrics.model_logits(model, batch)
    loss, total = metrics.weighted_nll(logits, batch["targets"], w)
    answer = metrics.weighted_nll(logits, batch["targets"],
                                  batch["loss_mask"].astype(jnp.float32))
    return loss, {"loss_weight": total, "answer_nll": answer}


@functools.lru_cache(maxsize=8)
def _predict(graphdef):
    """Jitted ``(params, rest, inputs) -> argmax tokens`` for one model structure."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    @jax.jit
    def predict(params, rest, inputs):
        return jnp.argmax(nnx.merge(graphdef, params, rest)(inputs), axis=-1)

    return predict


def train_one(attention: str, seed: int, steps: int, *, log=print) -> dict:
    """Train one model on TASK at TRAIN_LEN through ``lcjax.train.train`` (one fresh batch
    per step, :func:`answer_weighted_loss`); returns params, graphdef and the history."""
    import grain
    import jax
    from flax import nnx

    from lcjax.data import VOCAB_SIZE
    from lcjax.nn import DecoderConfig
    from lcjax.train import TrainConfig, train

    cfg = DecoderConfig(vocab_size=VOCAB_SIZE, attention=attention, **MODEL)
    run_cfg = TrainConfig(steps=steps, batch_size=BATCH, seq_len=TRAIN_LEN, lr=LR,
                          warmup_steps=min(100, steps // 5), seed=seed, log_every=25,
                          eval_batches=0)
    dataset = grain.MapDataset.range(steps).map(functools.partial(_train_batch, seed))
    start = time.perf_counter()
    result = train(cfg, run_cfg, dataset=dataset, loss_fn=answer_weighted_loss)
    seconds = time.perf_counter() - start
    history = [{k: r[k] for k in ("step", "loss", "answer_nll")} for r in result.history
               if r["step"] % 25 == 0 or r["step"] == steps]
    for r in history:
        if r["step"] % 100 == 0 or r["step"] == steps:
            log(f"   {attention} seed {seed} step {r['step']}: loss {r['loss']:.3f}, "
                f"answer nll {r['answer_nll']:.3f}")
    graphdef, params, rest = nnx.split(result.model, nnx.Param, ...)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    return {"graphdef": graphdef, "params": params, "rest": rest, "history": history,
            "seconds": seconds, "tokens_per_s": result.tokens_per_s,
            "params_count": n_params, "steps": steps}


def evaluate(trained: dict, length: int, n: int, *, seed: int = 999, chunk: int = 32) -> dict:
    """Exact match and per-byte answer accuracy at ``length`` on ``n`` fresh samples,
    also split by needle depth (5 bins of the target needle's depth)."""
    import jax

    from lcjax.data import ruler

    predict = _predict(trained["graphdef"])
    samples = task_samples(seed * 1000 + length, length, n)
    exact, token_acc, by_pos = [], [], []
    for i in range(0, n, chunk):
        batch = ruler.make_batch(samples[i:i + chunk])
        pred = jax.device_get(predict(trained["params"], trained["rest"], batch["inputs"]))
        acc = ruler.answer_accuracy(pred, batch)
        exact.append(acc["exact"])
        token_acc.append(acc["token_acc"])
        rows = np.arange(len(pred))[:, None]
        cols = batch["answer_start"][:, None] + np.arange(batch["answer_len"].min())
        by_pos.append(pred[rows, cols] == batch["targets"][rows, cols])
    exact, token_acc = np.concatenate(exact), np.concatenate(token_acc)
    by_pos = np.concatenate(by_pos).mean(0)
    depth = np.array([s.depths[0] for s in samples])
    bins = np.minimum((depth * 5).astype(int), 4)
    by_depth = [float(exact[bins == b].mean()) if (bins == b).any() else None for b in range(5)]
    return {"length": length, "n": n, "exact": float(exact.mean()),
            "token_acc": float(token_acc.mean()), "exact_by_depth": by_depth,
            "acc_by_answer_byte": [float(a) for a in by_pos]}


def _plot(path: Path, curves: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (name, runs) in enumerate(curves.items()):
        mults = np.array(EVAL_MULTS)
        ys = np.array([[r[m]["exact"] for m in EVAL_MULTS] for r in runs])
        for y in ys:
            ax.plot(mults, 100 * y, "-", color=f"C{i}", alpha=0.3)
        ax.plot(mults, 100 * ys.mean(0), "o-", color=f"C{i}",
                label=f"{name} (mean of {len(ys)} seed{'s' * (len(ys) > 1)})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(EVAL_MULTS, [f"{m}× L\n({m * TRAIN_LEN} B)" for m in EVAL_MULTS])
    ax.set_ylim(-3, 103)
    ax.set_ylabel("exact match of greedy answer (%)")
    ax.set_title(f"needle retrieval, trained at L = {TRAIN_LEN} bytes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(quick: bool, out_dir: Path, *, steps: int | None = None,
        eval_samples: int | None = None) -> Result:
    """The experiment; ``steps`` / ``eval_samples`` override the quick or full setting
    (a smoke run: ``python -m experiments.entmax.experiment --steps 10 --eval-samples 8``)."""
    variants = [v for v in VARIANTS if v != "entmax" or entmax_available()]
    steps = STEPS[quick] if steps is None else steps
    n_eval = EVAL_SAMPLES[quick] if eval_samples is None else eval_samples
    curves: dict[str, list[dict]] = {v: [] for v in variants}
    runs = []
    for seed in SEEDS[quick]:
        for variant in variants:
            trained = train_one(variant, seed, steps)
            evals = {m: evaluate(trained, m * TRAIN_LEN, n_eval) for m in EVAL_MULTS}
            print(f"   {variant} seed {seed}: exact match "
                  + ", ".join(f"{m}×L {100 * e['exact']:.1f}%" for m, e in evals.items())
                  + f" ({trained['seconds']:.0f} s, {trained['tokens_per_s']:,.0f} tok/s)",
                  flush=True)
            curves[variant].append(evals)
            runs.append({"attention": variant, "seed": seed, "evals": evals,
                         "history": trained["history"], "train_seconds": trained["seconds"],
                         "tokens_per_s": trained["tokens_per_s"],
                         "params": trained["params_count"]})
    fig = out_dir / "retrieval_vs_length.png"
    _plot(fig, curves)

    mean = {v: {m: float(np.mean([r[m]["exact"] for r in curves[v]])) for m in EVAL_MULTS}
            for v in variants}
    token = {v: {m: float(np.mean([r[m]["token_acc"] for r in curves[v]])) for m in EVAL_MULTS}
             for v in variants}
    fmt = lambda v: ", ".join(f"{m}×: {100 * mean[v][m]:.1f}%" for m in EVAL_MULTS)
    claims = [Claim(f"softmax model learns the task at the training length L={TRAIN_LEN} "
                    f"({steps} steps)", "exact match ≥ 90% at 1× L",
                    f"{100 * mean['softmax'][1]:.1f}%", mean["softmax"][1] >= 0.9)]
    if "entmax" in variants:
        longer = [m for m in EVAL_MULTS if m > 1]
        gains = {m: mean["entmax"][m] - mean["softmax"][m] for m in longer}
        claims.append(Claim(
            "α=1.5 entmax attention retrieves better than softmax beyond the training length "
            "(AdaSplash-2: long-context gains over softmax)",
            "entmax exact match > softmax at 2× and 4× L",
            f"entmax {fmt('entmax')}; softmax {fmt('softmax')}"
            + ("" if mean["entmax"][1] >= 0.9 else " (entmax under-trained at 1×)"),
            all(g > 0 for g in gains.values())))
    else:
        claims.append(Claim(
            "α=1.5 entmax attention retrieves better than softmax beyond the training length",
            "entmax exact match > softmax at 2× and 4× L",
            f"not checked: 'entmax' is not registered; softmax {fmt('softmax')}", False))
    n_params = runs[0]["params"]
    notes = (f"Task: ruler.niah, one needle '{TASK['needle']}' with a "
             f"{TASK['value_digits']}-digit value in the noise haystack at a uniform depth, "
             f"question '{TASK['question'].strip()}' (shortened RULER wording); "
             f"trained at L={TRAIN_LEN} bytes for {steps} steps × {BATCH} sequences "
             f"(loss weight 1 on answer bytes, {OTHER_WEIGHT} on the others), "
             f"{n_params / 1e3:.0f}k-parameter DecoderLM (RoPE), seeds {list(SEEDS[quick])}; "
             f"scored on {n_eval} fresh samples per length. Mean exact match: "
             + "; ".join(f"{v}: {fmt(v)}" for v in variants)
             + ". Mean per-byte answer accuracy: "
             + "; ".join(f"{v}: " + ", ".join(f"{m}×: {100 * token[v][m]:.1f}%"
                                              for m in EVAL_MULTS) for v in variants) + ".")
    if "entmax" not in variants:
        notes += " The 'entmax' attention variant was not registered: only softmax ran."
    for v in variants:
        if mean[v][1] < 0.9:
            notes += (f" Caveat: the {v} model had not learned the task at 1× L "
                      f"({100 * mean[v][1]:.1f}% exact match after {steps} steps), so the "
                      "comparison beyond L mixes length generalisation with under-training.")
    return Result(claims=claims,
                  numbers={"train_len": TRAIN_LEN, "task": TASK, "model": MODEL,
                           "steps": steps, "batch": BATCH, "variants": variants,
                           "mean_exact": mean, "mean_token_acc": token, "runs": runs},
                  figures=[fig], notes=notes)


EXPERIMENT = Experiment(
    name="entmax",
    paper="AdaSplash-2 (α-entmax attention)",
    summary="α=1.5 entmax vs softmax attention on RULER-style retrieval at 1×, 2×, 4× the "
            "training length",
    run=run,
    quick_budget_s=420,  # the fair-experiment rewrite (issue 8) must fit this
)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=EXPERIMENT.summary)
    parser.add_argument("--full", action="store_true", help="the full setting (else quick)")
    parser.add_argument("--steps", type=int, help="training steps (default: the setting's)")
    parser.add_argument("--eval-samples", type=int, help="samples per length")
    parser.add_argument("--out", type=Path, default=Path("reports/entmax"))
    args = parser.parse_args()
    result = run(not args.full, args.out, steps=args.steps, eval_samples=args.eval_samples)
    for c in result.claims:
        print(f"[{'HOLDS' if c.holds else 'FAILS'}] {c.claim}: ours {c.ours} "
              f"(target {c.target})")
