"""Temporal-order memory (issue 18, item 3; ICML 2026): a small byte LM trained to say
which of two quoted passages came first in a book held in its context.

Data: ``lcjax.data.temporal_order`` (books of ``BOOK["num_passages"]`` passages; the synthetic
random-word control, where only position tells the order), balanced in answers and distances.
The model is the Shakespeare-pretrained base of ``experiments.common.shakespeare_base``
(4 layers, d = 128: it already copies text, i.e. has induction-style heads) fine-tuned by
``lcjax.train.train`` with ``answer_weighted_loss(OTHER_WEIGHT)``: weight 1 on the answer
byte and ``OTHER_WEIGHT`` on every other byte, so the quotes (copies of book text) keep the
matching heads trained. Earlier runs of a 2-layer model trained from scratch on the answer
byte alone stayed at chance (``docs/temporal_order.md``). On held-out items (seed
``EVAL_SEED``: new books) we measure:

* accuracy (the answer is whichever of ``A``/``B`` has the larger logit after ``Answer: ``),
  the base's accuracy before fine-tuning, accuracy per distance ``j - i`` and the
  distance-effect slope (least squares of per-item correctness on distance, with its
  standard error; the paper: accuracy grows with distance, slope > 0);
* the temporal code: a ridge probe (``lcjax.analysis.probes.linear_probe``) from the hidden
  state at each passage's last byte to its index ``k / (n - 1)``, per layer, held out by
  book (``groups``): R², also for the base before fine-tuning and a random initialisation;
* per-head attribution: the attention mass from the last prompt position (the one that
  predicts the answer) to the two quoted snippets' original occurrences in the book
  (``attention_mass``), averaged over items; the top head is ablated (``ablate_heads``)
  and the accuracy drop compared with that of ablating each of ``RANDOM_HEADS`` random other
  heads.

Every claim but the probe's needs the accuracy above chance by a one-sided 99% binomial
margin, so none holds on a model that has not learned the task. Quick mode (the 200-step
base, a few steps) checks that the pipeline runs; its claims are expected to fail.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from experiments.common import Claim, Experiment, Result, machine_info, main, shakespeare_base

BOOK = dict(num_passages=4, passage_bytes=8, snippet_bytes=4)
SETTINGS = {
    True: dict(sources=("random",), seeds=(0,), steps=6, batch=8, n_eval=32, n_heads_eval=16),
    False: dict(sources=("random",), seeds=(0,), steps=600, batch=16, n_eval=400,
                n_heads_eval=64),
}
EVAL_SEED = 1000  # held-out books: no training seed reaches it
RANDOM_HEADS = 3
LR = 1e-3
OTHER_WEIGHT = 0.1  # loss weight of every non-answer byte (the answer byte has weight 1)
Z99 = 2.326  # one-sided 99% normal quantile


def train_model(source: str, s: dict, base, seed: int):
    """The Shakespeare base fine-tuned on ``TemporalOrderSource(seed=seed)`` rows with
    ``answer_weighted_loss(OTHER_WEIGHT)``: (model, TrainResult)."""
    import grain

    from experiments.common import copy_model
    from lcjax.data import TemporalOrderSource
    from lcjax.train import TrainConfig, train
    from lcjax.train.losses import answer_weighted_loss

    src = TemporalOrderSource(s["steps"] * s["batch"], seed=seed, source=source, **BOOK)
    keep = ("inputs", "targets", "loss_mask")
    ds = grain.MapDataset.source(src).map(lambda r: {k: r[k] for k in keep}).batch(s["batch"])
    model = copy_model(base)
    tcfg = TrainConfig(steps=s["steps"], batch_size=s["batch"], seq_len=src.seq_len, lr=LR,
                       warmup_steps=max(1, s["steps"] // 10), seed=seed,
                       eval_batches=0, progress=False, log_every=max(1, s["steps"] // 20))
    res = train(model.config, tcfg, dataset=ds, model_fn=lambda *_: model,
                loss_fn=answer_weighted_loss(OTHER_WEIGHT))
    return res.model, res


def initial_model(cfg):
    """The same architecture at a random initialisation (the probe's untrained baseline)."""
    from flax import nnx

    from lcjax.nn import DecoderLM

    return DecoderLM(cfg, rngs=nnx.Rngs(0))


def eval_batch(source: str, n: int):
    """Held-out items and their token rows (BOS + prompt; [n, T], all the same length)."""
    from lcjax.data import order_item

    items = [order_item(i, seed=EVAL_SEED, source=source, **BOOK) for i in range(n)]
    rows = np.stack([np.frombuffer(b"\x00" + it.prompt, np.uint8) for it in items])
    from lcjax.data import BOS

    rows = rows.astype(np.int32)
    rows[:, 0] = BOS
    return items, rows


_last_logits = None  # the compiled last-position logits (one compile for every ablation)


def accuracy(model, rows, items) -> np.ndarray:
    """[n] bool: the logit of the right letter beats the other at the last prompt byte."""
    import jax.numpy as jnp
    from flax import nnx

    global _last_logits
    if _last_logits is None:
        _last_logits = nnx.jit(lambda m, x: m(x)[:, -1])
    logits = np.asarray(_last_logits(model, jnp.asarray(rows)))
    a, b = ord("A"), ord("B")
    pred = np.where(logits[:, a] >= logits[:, b], b"A", b"B")
    return pred == np.array([it.answer for it in items])


def by_distance(correct, items) -> dict[int, float]:
    d = np.array([it.distance for it in items])
    return {int(k): float(correct[d == k].mean()) for k in np.unique(d)}


def slope(correct, items) -> tuple[float, float]:
    """Least-squares slope of per-item correctness (0/1) on distance, and its standard
    error (``scipy.stats.linregress``; balanced distances: the same slope as the
    per-distance accuracies')."""
    from scipy import stats

    fit = stats.linregress([it.distance for it in items], np.asarray(correct, float))
    return float(fit.slope), float(fit.stderr)


def above_chance(acc: float, n: int) -> bool:
    """Accuracy above 1/2 by more than the one-sided 99% binomial margin at n items."""
    return bool(acc > 0.5 + Z99 * np.sqrt(0.25 / n))


def probe_r2(model, rows, items) -> list[float]:
    """Held-out-book R² of passage index from each layer's state at passage ends."""
    from lcjax.analysis.probes import hidden_features, linear_probe

    n = BOOK["num_passages"]
    ends = np.array([[o + BOOK["passage_bytes"] for o in it.passage_offsets] for it in items])
    target = np.tile(np.arange(n) / (n - 1), len(items))
    groups = np.repeat(np.arange(len(items)), n)
    out = []
    for layer in range(model.config.num_layers + 1):
        f = hidden_features(model, rows, ends, layer)  # BOS shifts by 1: the passage's last byte
        out.append(linear_probe(f.reshape(-1, f.shape[-1]), target, groups=groups,
                                ridge=1e-2).r2)
    return out


def head_scores(model, rows, items) -> np.ndarray:
    """[L, H] mean attention mass from the last prompt byte to the two snippets' bytes."""
    from lcjax.analysis.probes import attention_mass

    qm = np.zeros(rows.shape, bool)
    qm[:, -1] = True
    km = np.zeros(rows.shape, bool)
    for r, it in enumerate(items):
        for off, snip in zip(it.snippet_offsets, it.snippets):
            km[r, off + 1:off + 1 + len(snip)] = True
    return attention_mass(model, rows, qm, km).mean(0)


def ablation(model, rows, items, scores, acc: float) -> dict:
    """Accuracy after ablating the top-mass head and each of ``RANDOM_HEADS`` others."""
    from lcjax.analysis.probes import ablate_heads

    top = tuple(int(v) for v in np.unravel_index(np.argmax(scores), scores.shape))
    top_acc = float(accuracy(ablate_heads(model, [top]), rows, items).mean())
    others = [(la, h) for la in range(scores.shape[0]) for h in range(scores.shape[1])
              if (la, h) != top]
    rng = np.random.default_rng(0)
    picks = [others[k] for k in rng.choice(len(others), RANDOM_HEADS, replace=False)]
    rand_acc = [float(accuracy(ablate_heads(model, [p]), rows, items).mean()) for p in picks]
    return {"top_head": top, "top_head_ablated_accuracy": top_acc, "random_heads": picks,
            "random_heads_ablated_accuracy": rand_acc, "ablation_drop_top": acc - top_acc,
            "ablation_drop_random_mean": acc - float(np.mean(rand_acc))}


def study(source: str, s: dict, base, seed: int) -> dict:
    start, cpu = time.perf_counter(), time.process_time()
    model, res = train_model(source, s, base, seed)
    items, rows = eval_batch(source, s["n_eval"])
    correct = accuracy(model, rows, items)
    acc = float(correct.mean())
    b, se = slope(correct, items)
    k = s["n_heads_eval"]
    scores = head_scores(model, rows[:k], items[:k])
    answer_nll = [h["answer_nll"] for h in res.history if "answer_nll" in h]
    return {"source": source, "seed": seed, "accuracy": acc,
            "base_accuracy": float(accuracy(base, rows, items).mean()),
            "accuracy_by_distance": by_distance(correct, items),
            "distance_slope": b, "distance_slope_se": se,
            "probe_r2_by_layer": probe_r2(model, rows, items),
            "probe_r2_by_layer_base": probe_r2(base, rows, items),
            "probe_r2_by_layer_at_init": probe_r2(initial_model(base.config), rows, items),
            "head_mass": scores.tolist(), **ablation(model, rows, items, scores, acc),
            "final_train_loss": res.losses[-1], "answer_nll_history": answer_nll,
            "steps": s["steps"], "wall_s": time.perf_counter() - start,
            "cpu_s": time.process_time() - cpu}


def claims_of(r: dict, n: int) -> list:
    tag = f"[{r['source']}, seed {r['seed']}, {r['steps']} steps, {n} held-out items]"
    learned = above_chance(r["accuracy"], n)
    best = max(r["probe_r2_by_layer"])
    before = max(max(r["probe_r2_by_layer_at_init"]), max(r["probe_r2_by_layer_base"]))
    return [
        Claim(f"{tag} accuracy above chance", f"> 0.5 + {Z99}·sqrt(0.25/n) (one-sided 99%)",
              f"{r['accuracy']:.3f} (base before fine-tuning {r['base_accuracy']:.3f})",
              learned),
        Claim(f"{tag} distance effect: accuracy grows with passage distance",
              "accuracy above chance and slope > 2 SE",
              f"{r['distance_slope']:+.4f} ± {r['distance_slope_se']:.4f} per passage",
              learned and r["distance_slope"] > 2 * r["distance_slope_se"]),
        Claim(f"{tag} 1-D temporal code: passage index is linear in hidden states "
              f"(held-out books), beyond the untrained model's and the base's",
              "best-layer R² > 0.5 and > at init and > base",
              "by layer " + ", ".join(f"{v:.3f}" for v in r["probe_r2_by_layer"])
              + "; base " + ", ".join(f"{v:.3f}" for v in r["probe_r2_by_layer_base"])
              + "; at init " + ", ".join(f"{v:.3f}" for v in r["probe_r2_by_layer_at_init"]),
              best > 0.5 and best > before),
        Claim(f"{tag} ablating the top attribution head {r['top_head']} hurts more than "
              f"random heads", "accuracy above chance and drop(top) > max(0, mean "
              "drop(random))",
              f"{r['ablation_drop_top']:+.3f} vs {r['ablation_drop_random_mean']:+.3f}",
              learned and r["ablation_drop_top"] > max(0.0, r["ablation_drop_random_mean"])),
    ]


def run(quick: bool, out_dir: Path) -> Result:
    s = SETTINGS[quick]
    base, base_info = shakespeare_base(quick)
    runs = [study(src, s, base, seed) for src in s["sources"] for seed in s["seeds"]]
    claims = [c for r in runs for c in claims_of(r, s["n_eval"])]
    numbers = {"book": BOOK, "base": base_info, "settings": s, "lr": LR,
               "other_weight": OTHER_WEIGHT, "seeds": {
                   "train_data_and_model": list(s["seeds"]), "eval_data": EVAL_SEED},
               "runs": runs, "machine": machine_info()}
    notes = "; ".join(f"{r['source']} seed {r['seed']}: accuracy {r['accuracy']:.3f}, slope "
                      f"{r['distance_slope']:+.4f} ± {r['distance_slope_se']:.4f}, probe R² "
                      f"by layer {[round(v, 3) for v in r['probe_r2_by_layer']]}, top head "
                      f"{r['top_head']} drop {r['ablation_drop_top']:+.3f} (random "
                      f"{r['ablation_drop_random_mean']:+.3f})" for r in runs)
    return Result(claims=claims, numbers=numbers, notes=notes,
                  figures=[distance_figure(runs, out_dir / "temporal_order_distance.png")])


def distance_figure(runs: list[dict], path: Path) -> Path:
    """Accuracy against passage distance, one line per source (chance dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for r in runs:
        acc = r["accuracy_by_distance"]
        ax.plot(list(acc), list(acc.values()), marker="o",
                label=f"{r['source']} seed {r['seed']} (slope {r['distance_slope']:+.3f})")
    ax.axhline(0.5, color="gray", ls="--", lw=1)
    ax.set_xlabel("distance j - i (passages)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


EXPERIMENT = Experiment(
    name="temporal_order",
    paper="Temporal order memory (episodic) in long-context models (ICML 2026)",
    summary="which-passage-came-first: distance effect, passage-index probe, head ablation",
    run=run,
    quick_budget_s=22,  # 15 s in the 2026-12-02 afternoon make reproduce (1,207 s in all)
)


if __name__ == "__main__":
    main(EXPERIMENT)
