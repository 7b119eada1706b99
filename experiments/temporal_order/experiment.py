"""Temporal-order memory (issue 18, item 3; ICML 2026): a small byte LM trained to say
which of two quoted passages came first in a book held in its context.

Data: ``lcjax.data.temporal_order`` (books of ``NUM_PASSAGES`` passages; the synthetic
random-word control in quick mode, Shakespeare and the control in full mode), balanced in
answers and distances. The model is a ``lcjax.nn.DecoderLM`` trained by ``lcjax.train.train``
with the loss on the answer byte only (``loss_mask``). On held-out items (another seed: new
books) we measure:

* accuracy (the answer is whichever of ``A``/``B`` has the larger logit after ``Answer: ``)
  per distance ``j - i`` and the distance-effect slope (least squares of accuracy on
  distance; the paper: accuracy grows with distance, slope > 0);
* the temporal code: a ridge probe (``lcjax.analysis.probes.linear_probe``) from the hidden
  state at each passage's last byte to its index ``k / (n - 1)``, per layer, held out by
  book (``groups``): R²;
* per-head attribution: the attention mass from the last prompt position (the one that
  predicts the answer) to the two quoted snippets' original occurrences in the book
  (``attention_mass``), averaged over items; the top head is ablated (``ablate_heads``)
  and the accuracy drop compared with that of ablating each of ``RANDOM_HEADS`` random other
  heads.

Quick mode trains one model for a few steps: far from trained, it checks that the pipeline
runs; its claims are expected to fail. Full mode (not run here yet): both sources, 4000
steps.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from experiments.common import Claim, Experiment, Result, machine_info, main

BOOK = dict(num_passages=6, passage_bytes=16, snippet_bytes=8)
SETTINGS = {
    True: dict(sources=("random",), steps=30, batch=16, n_eval=50),
    False: dict(sources=("random", "shakespeare"), steps=4000, batch=32, n_eval=600),
}
MODEL = dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
             mlp_hidden=128)
TRAIN_SEED, EVAL_SEED, MODEL_SEED = 0, 1, 0
RANDOM_HEADS = 3
LR = 3e-3


def train_model(source: str, s: dict):
    """A DecoderLM trained on ``TemporalOrderSource`` rows: (model, TrainResult)."""
    import grain

    from lcjax.data import VOCAB_SIZE, TemporalOrderSource
    from lcjax.nn import DecoderConfig
    from lcjax.train import TrainConfig, train

    src = TemporalOrderSource(s["steps"] * s["batch"], seed=TRAIN_SEED, source=source, **BOOK)
    keep = ("inputs", "targets", "loss_mask")
    ds = grain.MapDataset.source(src).map(lambda r: {k: r[k] for k in keep}).batch(s["batch"])
    cfg = DecoderConfig(vocab_size=VOCAB_SIZE, max_len=src.seq_len, **MODEL)
    tcfg = TrainConfig(steps=s["steps"], batch_size=s["batch"], seq_len=src.seq_len, lr=LR,
                       warmup_steps=max(1, s["steps"] // 10), seed=MODEL_SEED,
                       eval_batches=0, progress=False, log_every=max(1, s["steps"] // 10))
    res = train(cfg, tcfg, dataset=ds)
    return res.model, res


def initial_model(cfg):
    """The same architecture at its initialisation (the probe's untrained baseline)."""
    from flax import nnx

    from lcjax.nn import DecoderLM

    return DecoderLM(cfg, rngs=nnx.Rngs(MODEL_SEED))


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


def slope(acc: dict[int, float]) -> float:
    x, y = np.array(list(acc)), np.array(list(acc.values()))
    return float(np.polyfit(x, y, 1)[0])


def probe_r2(model, rows, items) -> list[float]:
    """Held-out-book R² of passage index from each layer's state at passage ends."""
    from lcjax.analysis.probes import hidden_features, linear_probe

    n = BOOK["num_passages"]
    ends = np.array([[o + BOOK["passage_bytes"] for o in it.passage_offsets] for it in items])
    target = np.tile(np.arange(n) / (n - 1), len(items))
    groups = np.repeat(np.arange(len(items)), n)
    out = []
    for layer in range(MODEL["num_layers"] + 1):
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


def study(source: str, s: dict) -> dict:
    from lcjax.analysis.probes import ablate_heads

    start = time.perf_counter()
    model, res = train_model(source, s)
    items, rows = eval_batch(source, s["n_eval"])
    init_r2 = probe_r2(initial_model(res.model.config), rows, items)
    correct = accuracy(model, rows, items)
    acc_d = by_distance(correct, items)
    scores = head_scores(model, rows, items)
    top = tuple(int(v) for v in np.unravel_index(np.argmax(scores), scores.shape))
    acc = float(correct.mean())
    top_acc = float(accuracy(ablate_heads(model, [top]), rows, items).mean())
    rng = np.random.default_rng(0)
    others = [(la, h) for la in range(scores.shape[0]) for h in range(scores.shape[1])
              if (la, h) != top]
    picks = [others[k] for k in rng.choice(len(others), RANDOM_HEADS, replace=False)]
    rand_acc = [float(accuracy(ablate_heads(model, [p]), rows, items).mean()) for p in picks]
    return {"source": source, "accuracy": acc, "accuracy_by_distance": acc_d,
            "distance_slope": slope(acc_d), "probe_r2_by_layer": probe_r2(model, rows, items),
            "probe_r2_by_layer_at_init": init_r2,
            "head_mass": scores.tolist(), "top_head": top, "top_head_ablated_accuracy": top_acc,
            "random_heads": picks, "random_heads_ablated_accuracy": rand_acc,
            "ablation_drop_top": acc - top_acc,
            "ablation_drop_random_mean": acc - float(np.mean(rand_acc)),
            "final_train_loss": res.losses[-1], "steps": s["steps"],
            "wall_s": time.perf_counter() - start}


def run(quick: bool, out_dir: Path) -> Result:
    s = SETTINGS[quick]
    runs = [study(src, s) for src in s["sources"]]
    claims = []
    for r in runs:
        tag = f"[{r['source']}, {r['steps']} steps, {s['n_eval']} held-out items]"
        best = max(r["probe_r2_by_layer"])
        claims += [
            Claim(f"{tag} accuracy above chance", "> 0.5", f"{r['accuracy']:.3f}",
                  r["accuracy"] > 0.5),
            Claim(f"{tag} distance effect: accuracy grows with passage distance",
                  "slope > 0", f"{r['distance_slope']:+.4f} per passage",
                  r["distance_slope"] > 0),
            Claim(f"{tag} 1-D temporal code: passage index is linear in hidden states "
                  f"(held-out books), beyond the untrained model's",
                  "best-layer R² > 0.5 and > at init",
                  "by layer " + ", ".join(f"{v:.3f}" for v in r["probe_r2_by_layer"])
                  + "; at init " + ", ".join(f"{v:.3f}" for v in r["probe_r2_by_layer_at_init"]),
                  best > 0.5 and best > max(r["probe_r2_by_layer_at_init"])),
            Claim(f"{tag} ablating the top attribution head {r['top_head']} hurts more than "
                  f"random heads", "drop(top) > max(0, mean drop(random))",
                  f"{r['ablation_drop_top']:+.3f} vs {r['ablation_drop_random_mean']:+.3f}",
                  r["ablation_drop_top"] > max(0.0, r["ablation_drop_random_mean"])),
        ]
    numbers = {"book": BOOK, "model": MODEL, "settings": s, "seeds": {
        "train_data": TRAIN_SEED, "eval_data": EVAL_SEED, "model": MODEL_SEED},
        "runs": runs, "machine": machine_info()}
    notes = "; ".join(f"{r['source']}: accuracy {r['accuracy']:.3f}, slope "
                      f"{r['distance_slope']:+.4f}, probe R² by layer "
                      f"{[round(v, 3) for v in r['probe_r2_by_layer']]}, top head "
                      f"{r['top_head']} drop {r['ablation_drop_top']:+.3f}"
                      for r in runs)
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
                label=f"{r['source']} (slope {r['distance_slope']:+.3f})")
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
