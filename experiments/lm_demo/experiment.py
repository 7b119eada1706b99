"""Foundation demo: a small byte-level transformer on Shakespeare vs count baselines.

Claim checked: within a few CPU minutes, a ~0.8M-parameter byte-level decoder
(lcjax.nn.DecoderLM, softmax attention) reaches a lower held-out bits/byte than a
Witten-Bell byte Markov model of order 2 fitted on the same training plays.
Held-out = plays never trained on (both editions of a play are on the same side).
The baselines are also measured on the last 10% of the corpus, where orders 1-3
were quoted at about 3.7, 3.0 and 2.6 bits/byte.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from experiments.common import Claim, Experiment, Result

# quick: `make reproduce`; full: `python experiments/reproduce.py`
STEPS = {True: 1000, False: 6000}
MODEL = dict(d_model=128, num_layers=4, num_heads=4, num_kv_heads=4, head_dim=32,
             mlp_hidden=344, max_len=128)


def markov_baselines(train_text: bytes, heldout_text: bytes, orders=(1, 2, 3)) -> dict:
    from lcjax.analysis.ngram import bits_per_byte, fit_ngram

    return {n: bits_per_byte(fit_ngram(train_text, n), heldout_text) for n in orders}


def _plot(path: Path, history, evals, baselines_heldout) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.array([r["step"] for r in history])
    bpb = np.array([r["loss"] for r in history]) / np.log(2)
    window = 25
    smooth = np.convolve(bpb, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, bpb, alpha=0.25, color="C0", label="train (per step)")
    ax.plot(steps[window - 1:], smooth, color="C0", label=f"train ({window}-step mean)")
    ax.plot([e["step"] for e in evals], [e["eval_bpb"] for e in evals], "o-", color="C3",
            label="held-out plays")
    for i, (order, value) in enumerate(sorted(baselines_heldout.items())):
        ax.axhline(value, ls="--", color=f"C{4 + i}", label=f"order-{order} Markov (held-out)")
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte")
    ax.set_ylim(1.5, 6)
    ax.legend(fontsize=8)
    ax.set_title("byte-level DecoderLM on Shakespeare")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(quick: bool, out_dir: Path) -> Result:
    import jax
    from flax import nnx

    from lcjax.data import VOCAB_SIZE, load_shakespeare, shakespeare_split
    from lcjax.nn import DecoderConfig
    from lcjax.train import TrainConfig, train

    train_docs, heldout_docs = shakespeare_split(heldout_fraction=0.1, seed=0)
    train_text = b"".join(d.text.encode() for d in train_docs)
    heldout_text = b"".join(d.text.encode() for d in heldout_docs)
    base_heldout = markov_baselines(train_text, heldout_text)
    corpus = b"".join(d.text.encode() for d in load_shakespeare())
    cut = int(0.9 * len(corpus))
    base_tail = markov_baselines(corpus[:cut], corpus[cut:])
    print("   Markov held-out plays:", {k: round(v, 3) for k, v in base_heldout.items()},
          "| last 10%:", {k: round(v, 3) for k, v in base_tail.items()}, flush=True)

    steps = STEPS[quick]
    shutil.rmtree(out_dir / "run", ignore_errors=True)  # a fresh run, not a resume
    model_cfg = DecoderConfig(vocab_size=VOCAB_SIZE, **MODEL)
    cfg = TrainConfig(steps=steps, batch_size=8, seq_len=128, lr=3e-3, warmup_steps=100,
                      eval_every=steps // 4, eval_batches=None, log_every=50,
                      out_dir=str(out_dir / "run"), keep_checkpoints=1)
    result = train(model_cfg, cfg, train_docs=train_docs, eval_docs=heldout_docs)
    final = result.evals[-1]["eval_bpb"]
    n_params = sum(int(np.prod(x.shape))
                   for x in jax.tree.leaves(nnx.state(result.model, nnx.Param)))
    _plot(out_dir / "loss_curve.png", result.history, result.evals, base_heldout)

    quoted = {1: 3.7, 2: 3.0, 3: 2.6}
    claims = [
        Claim(f"{n_params / 1e6:.2f}M-param byte transformer beats the order-2 Markov baseline "
              f"on held-out plays ({steps} steps, B=8, T=128)",
              f"bpb < {base_heldout[2]:.3f}", f"{final:.3f} bpb", final < base_heldout[2]),
    ]
    for n in (1, 2, 3):
        claims.append(Claim(f"order-{n} byte Markov baseline on the last 10% of the corpus",
                            f"about {quoted[n]} bpb (±0.1)", f"{base_tail[n]:.3f} bpb",
                            abs(base_tail[n] - quoted[n]) <= 0.1))
    numbers = {
        "model": MODEL, "params": n_params, "steps": steps,
        "tokens_per_s": result.tokens_per_s,
        "heldout_bpb": final, "evals": result.evals,
        "markov_heldout_plays": base_heldout, "markov_last_10pct": base_tail,
        "heldout_works": sorted({d.work for d in heldout_docs}),
    }
    notes = (f"Held-out plays: {', '.join(sorted({d.title for d in heldout_docs}))}. "
             f"Training throughput {result.tokens_per_s:,.0f} tokens/s on this CPU. "
             "Markov baselines (held-out plays): "
             + ", ".join(f"order {k}: {v:.3f}" for k, v in base_heldout.items()) + ".")
    return Result(claims=claims, numbers=numbers, figures=[out_dir / "loss_curve.png"],
                  notes=notes)


EXPERIMENT = Experiment(
    name="lm_demo",
    paper="foundation (no paper): training demo",
    summary="byte-level DecoderLM on Shakespeare vs byte Markov baselines",
    run=run,
    quick_budget_s=260,  # 233 s in the 2026-12-02 afternoon make reproduce (1,207 s in all)
)
