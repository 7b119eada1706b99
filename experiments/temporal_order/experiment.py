"""Temporal-order memory (issue 18, item 3; ICML 2026): a small byte LM trained to say
which of two quoted passages came first in a book held in its context.

Data: ``lcjax.data.temporal_order`` (books of ``BOOK["num_passages"]`` passages of
``BOOK["passage_bytes"]`` bytes; each question quotes two whole passages), balanced in answers
and distances; the synthetic random-word control (only position tells the order) and
Shakespeare text. The model is ``MODEL`` (``lcjax.nn.DecoderLM``: 3 layers, d = 64, RoPE),
trained from scratch by ``lcjax.train.train`` with ``answer_weighted_loss(OTHER_WEIGHT)``:
weight 1 on the answer byte and ``OTHER_WEIGHT`` on every other byte (the book and the quotes,
so the copying heads that find a quote in the book get trained). Eleven earlier set-ups (4-byte
quotes, the Shakespeare base fine-tuned, NoPE, NAPE, absolute positions, a curriculum, up to
3,000 steps) stayed at chance; quoting the whole passage is what made the task learnable
(``docs/temporal_order.md``). On held-out items (seed ``EVAL_SEED``: new books) we measure:

* accuracy (the answer is whichever of ``A``/``B`` has the larger logit after ``Answer: ``),
  the untrained model's accuracy, accuracy per distance ``j - i`` and the distance-effect
  slope (least squares of per-item correctness on distance, with its standard error; the
  paper: accuracy grows with distance, slope > 0);
* the temporal code: a ridge probe (``lcjax.analysis.probes.linear_probe``) from the hidden
  state at each passage's last byte to its index ``k / (n - 1)``, per layer, held out by
  book (``groups``): R², also for the same architecture at its random initialisation;
* the distance effect while learning: the held-out accuracy by distance every
  ``eval_every`` steps (the train loop's eval hook, :func:`distance_accuracy_eval`), and the
  slope at the evaluation nearest 0.75 accuracy (:func:`mid_learning`); and on books of
  ``LONG_PASSAGES`` passages;
* per-head attribution: the attention mass to the two quoted passages' original occurrences
  in the book, from the last prompt position (the one that predicts the answer) and from the
  quotes' bytes in the question (``attention_mass``), averaged over items; every head's
  ablation drop (``ablate_heads``); for each attribution, the top head's drop against the
  mean drop of ``RANDOM_HEADS`` random other heads.

Accuracy above chance by a one-sided 99% binomial margin is the first claim and the
precondition of every other (the distance effect at a checkpoint or on long books needs the
accuracy above chance there): on a model that has not learned the task they are **not
tested**, never "fails". Quick mode (a few steps) checks that the pipeline runs; its model
does not learn the task (it learns abruptly after ~1,700 steps), so its claims are not tested.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from experiments.common import Claim, Experiment, Result, machine_info, main, not_tested

BOOK = dict(num_passages=4, passage_bytes=8, snippet_bytes=8)  # quote whole passages
MODEL = dict(d_model=64, num_layers=3, num_heads=4, num_kv_heads=4, head_dim=16, mlp_hidden=256,
             max_len=256, position="rope", attention="jax")
SETTINGS = {
    True: dict(sources=("random",), seeds=(0,), steps=12, batch=8, n_eval=32, n_heads_eval=16,
               eval_every=6),
    False: dict(sources=("random", "shakespeare"), seeds=(0,), steps=3000, batch=32,
                n_eval=400, n_heads_eval=64, eval_every=125),
}
EVAL_SEED = 1000  # held-out books: no training seed reaches it
RANDOM_HEADS = 3
LONG_PASSAGES = 8  # held-out books twice the training length (distances 1-7)
LR = 3e-3
OTHER_WEIGHT = 0.3  # loss weight of every non-answer byte (the answer byte has weight 1)
Z99 = 2.326  # one-sided 99% normal quantile


def model_config():
    """``lcjax.nn.DecoderConfig`` of ``MODEL`` over the byte vocabulary."""
    from lcjax.data import VOCAB_SIZE
    from lcjax.nn import DecoderConfig

    return DecoderConfig(vocab_size=VOCAB_SIZE, **MODEL)


def distance_accuracy_eval(model, batch, rng):
    """Eval hook for ``lcjax.train.train``: (answer-byte NLL, ``{"acc_d<d>": (accuracy of
    the items at distance d, their count)}``); correct by :func:`right_letter_wins` at the
    answer position, as :func:`accuracy`. ``batch``: ``TemporalOrderSource``
    rows (``inputs``, ``targets``, ``loss_mask`` on the answer byte, ``distance``)."""
    import jax
    import jax.numpy as jnp

    del rng
    logits = model(batch["inputs"]).astype(jnp.float32)            # [B, T, V]
    rows = jnp.arange(logits.shape[0])
    pos = jnp.argmax(batch["loss_mask"] > 0, axis=1)                # the answer byte
    at = logits[rows, pos]                                          # [B, V]
    target = batch["targets"][rows, pos]
    correct = right_letter_wins(at, target).astype(jnp.float32)
    nll = -jnp.mean(jax.nn.log_softmax(at)[rows, target])
    mets = {}
    for d in range(1, BOOK["num_passages"]):
        sel = (batch["distance"] == d).astype(jnp.float32)
        n = sel.sum()
        mets[f"acc_d{d}"] = (jnp.sum(correct * sel) / jnp.maximum(n, 1.0), n)
    return nll, mets


def train_model(source: str, s: dict, seed: int):
    """``MODEL`` trained from scratch (init seed ``seed``) on
    ``TemporalOrderSource(seed=seed)`` rows with ``answer_weighted_loss(OTHER_WEIGHT)``;
    every ``s["eval_every"]`` steps the held-out items' accuracy by distance
    (:func:`distance_accuracy_eval`) goes into ``TrainResult.evals``."""
    import grain

    from lcjax.data import TemporalOrderSource
    from lcjax.train import TrainConfig, train
    from lcjax.train.losses import answer_weighted_loss

    keep = ("inputs", "targets", "loss_mask")
    src = TemporalOrderSource(s["steps"] * s["batch"], seed=seed, source=source, **BOOK)
    ds = grain.MapDataset.source(src).map(lambda r: {k: r[k] for k in keep}).batch(s["batch"])
    held_out = TemporalOrderSource(s["n_eval"], seed=EVAL_SEED, source=source, **BOOK)
    eval_batch_rows = min(50, s["n_eval"])
    eval_ds = grain.MapDataset.source(held_out).map(
        lambda r: {k: r[k] for k in (*keep, "distance")}).batch(eval_batch_rows)
    tcfg = TrainConfig(steps=s["steps"], batch_size=s["batch"], seq_len=src.seq_len, lr=LR,
                       warmup_steps=max(1, min(100, s["steps"] // 4)), seed=seed,
                       eval_every=s["eval_every"],
                       eval_batches=-(-s["n_eval"] // eval_batch_rows), progress=False,
                       log_every=max(1, s["steps"] // 60))
    return train(model_config(), tcfg, dataset=ds, eval_dataset=eval_ds,
                 eval_fn=distance_accuracy_eval, loss_fn=answer_weighted_loss(OTHER_WEIGHT))


def learning_curve(evals: list[dict], counts: dict[int, int]) -> list[dict]:
    """Per evaluation: step, accuracy by distance, overall accuracy and the distance slope
    ± SE of :func:`slope` on the per-item 0/1 outcomes that those accuracies and the
    held-out items' ``counts`` per distance imply."""
    out = []
    dists = sorted(counts)
    for e in evals:
        acc = {d: float(e[f"eval_acc_d{d}"]) for d in dists}
        correct = np.concatenate([np.arange(counts[d]) < round(acc[d] * counts[d])
                                  for d in dists])
        distances = np.concatenate([np.full(counts[d], d) for d in dists])
        b, se = slope(correct, distances)
        out.append({"step": int(e["step"]), "accuracy_by_distance": acc,
                    "accuracy": float(correct.mean()), "distance_slope": b,
                    "distance_slope_se": se})
    return out


def mid_learning(curve: list[dict]) -> dict:
    """The evaluation whose accuracy is closest to 0.75, half-way from chance to perfect
    (the earliest on ties)."""
    return min(curve, key=lambda c: (abs(c["accuracy"] - 0.75), c["step"]))


def initial_model(seed: int = 0):
    """``MODEL`` at a random initialisation (the untrained baseline)."""
    from flax import nnx

    from lcjax.nn import DecoderLM

    return DecoderLM(model_config(), rngs=nnx.Rngs(seed))


def eval_batch(source: str, n: int, num_passages: int | None = None):
    """Held-out items (books of ``num_passages``, default ``BOOK``'s) and their token rows
    (BOS + prompt; [n, T], all the same length)."""
    from lcjax.data import BOS, order_item

    book = {**BOOK, "num_passages": num_passages or BOOK["num_passages"]}
    items = [order_item(i, seed=EVAL_SEED, source=source, **book) for i in range(n)]
    rows = np.stack([np.frombuffer(b"\x00" + it.prompt, np.uint8) for it in items])
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
    return np.asarray(right_letter_wins(logits, np.array([ord(it.answer) for it in items])))


def right_letter_wins(logits, target):
    """[B] bool: at answer-position logits [B, V], the model's pick between ``A`` and ``B``
    (``A`` unless ``B``'s logit is larger) is ``target`` [B] (byte values)."""
    import jax.numpy as jnp

    pick = jnp.where(logits[:, ord("A")] >= logits[:, ord("B")], ord("A"), ord("B"))
    return pick == target


def by_distance(correct, items) -> dict[int, float]:
    d = np.array([it.distance for it in items])
    return {int(k): float(correct[d == k].mean()) for k in np.unique(d)}


def slope(correct, distances) -> tuple[float, float]:
    """Least-squares slope of per-item correctness (0/1) on distance (per item), and its
    standard error (``scipy.stats.linregress``; balanced distances: the same slope as the
    per-distance accuracies')."""
    from scipy import stats

    fit = stats.linregress(np.asarray(distances, float), np.asarray(correct, float))
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


def head_scores(model, rows, items, query: str = "answer") -> np.ndarray:
    """[L, H] mean attention mass to the two quoted passages' occurrences in the book, from
    the last prompt byte (``query="answer"``, the position that predicts the answer) or from
    the quotes' bytes in the question (``query="quotes"``)."""
    from lcjax.analysis.probes import attention_mass

    if query not in ("answer", "quotes"):
        raise ValueError(f"head_scores: query must be 'answer' or 'quotes', got {query!r}")
    qm = np.zeros(rows.shape, bool)
    km = np.zeros(rows.shape, bool)
    for r, it in enumerate(items):  # token index = byte offset + 1 (BOS)
        for book_off, quote_off, snip in zip(it.snippet_offsets, it.quote_offsets,
                                             it.snippets):
            km[r, book_off + 1:book_off + 1 + len(snip)] = True
            if query == "quotes":
                qm[r, quote_off + 1:quote_off + 1 + len(snip)] = True
    if query == "answer":
        qm[:, -1] = True
    return attention_mass(model, rows, qm, km).mean(0)


def ablation_drops(model, rows, items, acc: float, shape) -> np.ndarray:
    """[L, H] accuracy drop when each head alone is ablated (``ablate_heads``)."""
    from lcjax.analysis.probes import ablate_heads

    drops = np.zeros(shape)
    for la, h in np.ndindex(*shape):
        drops[la, h] = acc - float(accuracy(ablate_heads(model, [(la, h)]), rows, items).mean())
    return drops


def top_vs_random(scores: np.ndarray, drops: np.ndarray) -> dict:
    """The top-``scores`` head's drop against the mean drop of ``RANDOM_HEADS`` random other
    heads (a fixed draw: ``default_rng(0)``)."""
    top = tuple(int(v) for v in np.unravel_index(np.argmax(scores), scores.shape))
    others = [hd for hd in np.ndindex(*scores.shape) if hd != top]
    rng = np.random.default_rng(0)
    picks = [tuple(int(v) for v in others[k])
             for k in rng.choice(len(others), RANDOM_HEADS, replace=False)]
    return {"top_head": top, "drop_top": float(drops[top]), "random_heads": picks,
            "drop_random_mean": float(np.mean([drops[p] for p in picks]))}


def study(source: str, s: dict, seed: int) -> dict:
    start, cpu = time.perf_counter(), time.process_time()
    res = train_model(source, s, seed)
    model, untrained = res.model, initial_model(seed)
    items, rows = eval_batch(source, s["n_eval"])
    correct = accuracy(model, rows, items)
    acc = float(correct.mean())
    b, se = slope(correct, [it.distance for it in items])
    long_items, long_rows = eval_batch(source, s["n_eval"], LONG_PASSAGES)
    long_correct = accuracy(model, long_rows, long_items)
    long_b, long_se = slope(long_correct, [it.distance for it in long_items])
    k, n = s["n_heads_eval"], BOOK["num_passages"]
    mass = {q: head_scores(model, rows[:k], items[:k], q) for q in ("answer", "quotes")}
    drops = ablation_drops(model, rows, items, acc, mass["answer"].shape)
    answer_nll = [h["answer_nll"] for h in res.history if "answer_nll" in h]
    return {"source": source, "seed": seed, "accuracy": acc,
            "untrained_accuracy": float(accuracy(untrained, rows, items).mean()),
            "accuracy_by_distance": by_distance(correct, items),
            "distance_slope": b, "distance_slope_se": se,
            "long_passages": LONG_PASSAGES, "long_accuracy": float(long_correct.mean()),
            "long_accuracy_by_distance": by_distance(long_correct, long_items),
            "long_distance_slope": long_b, "long_distance_slope_se": long_se,
            "probe_r2_by_layer": probe_r2(model, rows, items),
            "probe_r2_by_layer_at_init": probe_r2(untrained, rows, items),
            "head_mass_from_answer": mass["answer"].tolist(),
            "head_mass_from_quotes": mass["quotes"].tolist(),
            "ablation_drop_by_head": drops.tolist(),
            "ablation": {q: top_vs_random(m, drops) for q, m in mass.items()},
            "final_train_loss": res.losses[-1], "answer_nll_history": answer_nll,
            "history_steps": [h["step"] for h in res.history if "answer_nll" in h],
            "learning_curve": learning_curve(
                res.evals, {d: sum(it.distance == d for it in items) for d in range(1, n)}),
            "steps": s["steps"], "wall_s": time.perf_counter() - start,
            "cpu_s": time.process_time() - cpu}


def claims_of(r: dict, n: int) -> list:
    """The claims of one run ``r`` (:func:`study`) over ``n`` held-out items. Accuracy above
    chance is the first claim and the precondition of every other: a claim about how the
    model orders passages (distance effect, temporal code, the heads it uses) is **not
    tested** on a model whose accuracy there is not above chance (:func:`above_chance`)."""
    tag = f"[{r['source']}, seed {r['seed']}, {r['steps']} steps, {n} held-out items]"
    margin = f"0.5 + {Z99}·sqrt(0.25/n)"
    learned = above_chance(r["accuracy"], n)
    pre = f"the model learned the task: held-out accuracy > {margin} (ours {r['accuracy']:.3f})"
    mid = mid_learning(r["learning_curve"])

    def checked(claim, precondition_met, precondition, target, ours, holds):
        if not precondition_met:
            return not_tested(claim, target, ours, precondition)
        return Claim(claim, target, ours, bool(holds), precondition)

    best = max(r["probe_r2_by_layer"])
    before = max(r["probe_r2_by_layer_at_init"])
    claims = [
        Claim(f"{tag} accuracy above chance", f"> {margin} (one-sided 99%)",
              f"{r['accuracy']:.3f} (untrained {r['untrained_accuracy']:.3f})", learned),
        checked(f"{tag} distance effect: accuracy grows with passage distance", learned, pre,
                "slope > 2 SE",
                f"{r['distance_slope']:+.4f} ± {r['distance_slope_se']:.4f} per passage",
                r["distance_slope"] > 2 * r["distance_slope_se"]),
        checked(f"{tag} distance effect while learning: at the evaluation nearest 0.75 "
                f"accuracy (step {mid['step']})", above_chance(mid["accuracy"], n),
                f"accuracy at that evaluation > {margin} (ours {mid['accuracy']:.3f})",
                "slope > 2 SE",
                f"{mid['distance_slope']:+.4f} ± {mid['distance_slope_se']:.4f} per passage "
                f"(accuracy {mid['accuracy']:.3f}, by distance "
                + " / ".join(f"{v:.2f}" for v in mid["accuracy_by_distance"].values()) + ")",
                mid["distance_slope"] > 2 * mid["distance_slope_se"]),
        checked(f"{tag} distance effect on books of {r['long_passages']} passages (twice the "
                "training book)", above_chance(r["long_accuracy"], n),
                f"accuracy on those books > {margin} (ours {r['long_accuracy']:.3f})",
                "slope > 2 SE",
                f"{r['long_distance_slope']:+.4f} ± {r['long_distance_slope_se']:.4f} per "
                f"passage (accuracy {r['long_accuracy']:.3f})",
                r["long_distance_slope"] > 2 * r["long_distance_slope_se"]),
        checked(f"{tag} 1-D temporal code: passage index is linear in hidden states "
                f"(held-out books), beyond the untrained model's", learned, pre,
                "best-layer R² > 0.5 and > at init",
                "by layer " + ", ".join(f"{v:.3f}" for v in r["probe_r2_by_layer"])
                + "; at init " + ", ".join(f"{v:.3f}" for v in r["probe_r2_by_layer_at_init"]),
                best > 0.5 and best > before),
    ]
    for query, where in (("answer", "the answer position"), ("quotes", "the quotes")):
        a = r["ablation"][query]
        claims.append(checked(
            f"{tag} ablating the top head by attention mass from {where} to the quoted "
            f"passages in the book, {tuple(a['top_head'])}, hurts more than random heads",
            learned, pre, "drop(top) > max(0, mean drop(random))",
            f"{a['drop_top']:+.3f} vs {a['drop_random_mean']:+.3f}",
            a["drop_top"] > max(0.0, a["drop_random_mean"])))
    return claims


def run(quick: bool, out_dir: Path) -> Result:
    s = SETTINGS[quick]
    runs = [study(src, s, seed) for src in s["sources"] for seed in s["seeds"]]
    claims = [c for r in runs for c in claims_of(r, s["n_eval"])]
    numbers = {"book": BOOK, "model": MODEL, "settings": s, "lr": LR,
               "other_weight": OTHER_WEIGHT, "seeds": {
                   "train_data_and_model": list(s["seeds"]), "eval_data": EVAL_SEED},
               "runs": runs, "machine": machine_info()}
    notes = "; ".join(
        f"{r['source']} seed {r['seed']}: accuracy {r['accuracy']:.3f} "
        f"({r['long_accuracy']:.3f} at {r['long_passages']} passages), slope "
        f"{r['distance_slope']:+.4f} ± {r['distance_slope_se']:.4f}, probe R² by layer "
        f"{[round(v, 3) for v in r['probe_r2_by_layer']]}, largest single-head drop "
        f"{max(max(d) for d in r['ablation_drop_by_head']):+.3f}" for r in runs)
    return Result(claims=claims, numbers=numbers, notes=notes,
                  figures=[distance_figure(runs, out_dir / "temporal_order_distance.png")])


def distance_figure(runs: list[dict], path: Path) -> Path:
    """Accuracy against passage distance, one line per source on the training-size books
    and a dotted one on books of ``LONG_PASSAGES`` (chance dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for r in runs:
        acc, long = r["accuracy_by_distance"], r["long_accuracy_by_distance"]
        line, = ax.plot(list(acc), list(acc.values()), marker="o",
                        label=f"{r['source']} seed {r['seed']} (slope "
                              f"{r['distance_slope']:+.3f})")
        ax.plot(list(long), list(long.values()), marker="x", ls=":", color=line.get_color(),
                label=f"  {r['long_passages']}-passage books (slope "
                      f"{r['long_distance_slope']:+.3f})")
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
