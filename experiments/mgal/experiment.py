"""MGAL-style grid (the ICML 2026 MGAL paper; issue 13, item 5) for two small lcjax byte
models and an oracle, through ``lcjax.eval.evaluate`` with the ``mgal`` suite
(:func:`lcjax.data.mgal_suite.make_suite`) and MGAL's metrics (:mod:`lcjax.data.mgal_metrics`).

Targets:

* ``shakespeare``: the Shakespeare-pretrained byte LM of ``experiments.common``
  (:func:`~experiments.common.shakespeare_base`, 4 layers, d = 128; cached);
* ``ruler``: the RULER-task byte LM of the long_eval experiment
  (``experiments.long_eval.experiment.train_model``: 2 layers, d = 64, trained on
  ``lcjax.data.sources.task_batches`` rows of its ``ruler_256`` suite, answer-weighted loss),
  with a short step count (:data:`SETTINGS`);
* ``oracle``: a callable that replies each prompt's gold answer text (read from the same
  items), the ceiling every cell must reach (100%).

Corpus: Debian Reference (``parallel.load_debian_reference``, ``make corpora``) when its
packages are installed, else the synthetic 3-language parallel corpus of the tests
(``tests/mgal_synthetic.py``), and the report says which. Context budget: :data:`LENGTH` =
2,048 bytes, the shortest the generator fills on Debian Reference (1,024 fails: no
``next_heading`` item with its evidence at the beginning; 512 fails ``order``), and far
below the paper's 8K–128K tokens: prompts are 1.8–3.3 KB, beyond anything either model saw
in training (128 / 256 bytes). Depths 0, 0.5, 1 give the three ``position_doc`` values.

Scores per cell: MC accuracy beside ``mc_chance`` (the mean of 1 / #options), open-answer
exact match, consistency F1 and fluent-but-drifting rate, and the evaluator's string match
(the suite's ``report`` hook writes the language × granularity and position × granularity
heat maps). The models decode greedily; a reply that names no option counts as wrong, so
a model that never produces an option scores 0, below chance.

**Option likelihood** (:func:`option_scores`, the standard way to score multiple choice for a
model that does not follow the answer format): for each MC item, the log-likelihood of each
option's text after ``[BOS] + prompt + " "`` (teacher forced, no generation), per byte; the
model's choice is the option with the highest mean log-probability per byte. Claim: the
accuracy beats chance (1 / #options per item), tested by the per-item differences
``correct − 1/#options`` with a 95% t interval over the MC items (one model, seed 0: the
interval covers the item draw). Precondition: at least :data:`MIN_MC_ITEMS` MC items.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import numpy as np

from experiments.common import (
    Claim,
    Experiment,
    Result,
    interval_verdict,
    machine_info,
    main,
    mean_interval,
    not_tested,
    shakespeare_base,
)

SEED = 0
LENGTH = 2048
DEPTHS = (0.0, 0.5, 1.0)
# max_new_tokens: the models' reply budget in bytes (enough for an option letter or a short
# answer; longer gold answers cannot be matched by them). Greedy decoding at 2-3 KB prompts
# costs ~19 CPU s for one batch of 3 items with 32 new tokens (compile included), so the
# grid is small. ``langs``: the corpus (a probe needs a second language); ``eval_langs``:
# the languages evaluated.
SETTINGS = {
    # quick: a smoke run of the pipeline — the oracle and the Shakespeare base only (no
    # RULER model to train), replies of 8 bytes (an option letter fits)
    True: dict(langs=("en", "ja"), eval_langs=("en",), n_per_cell=1, batch=16,
               max_new_tokens=8, models=("shakespeare",), ruler_stages=(),
               likelihood_per_cell=1, likelihood_max_items=1),
    False: dict(langs=("en", "ja"), eval_langs=("en", "ja"), n_per_cell=1, batch=16,
                max_new_tokens=32, models=("shakespeare", "ruler"),
                ruler_stages=((128, 150, ("niah_single_1",)),),
                likelihood_per_cell=3, likelihood_max_items=None),
}
MIN_MC_ITEMS = 30  # precondition of the option-likelihood claim
BUCKET = 256  # rows are right-padded to a multiple of this (few compiled shapes)
TESTS_DIR = Path(__file__).resolve().parents[2] / "tests"


def load_corpus(langs):
    """``(corpus, langs, label)``: Debian Reference for ``langs`` when installed, else the
    tests' synthetic corpus (its languages en, de, ja) labelled as such."""
    from lcjax.data import parallel

    try:
        return parallel.load_debian_reference(langs), tuple(langs), "Debian Reference"
    except parallel.CorpusMissingError:
        sys.path.insert(0, str(TESTS_DIR))
        synthetic = importlib.import_module("mgal_synthetic")
        return (synthetic.Synthetic(seed=SEED).corpus(), synthetic.LANGS,
                "SYNTHETIC corpus (tests/mgal_synthetic.py; Debian Reference not installed)")


def oracle_for(suite, n_per_cell: int, length: int = LENGTH):
    """A callable replying each prompt's gold answer text (the suite's items at
    ``length``, :data:`DEPTHS`, :data:`SEED`)."""
    from lcjax.data.items import build_items

    items = build_items(suite, (length,), DEPTHS, n_per_cell, SEED)
    gold = {it.prompt.decode(): it.answer.decode() for it in items}
    return lambda prompts: [gold[p] for p in prompts]


def evaluate_target(target, suite, n_per_cell: int, out_dir: Path, name: str, *,
                    length: int = LENGTH, max_new_tokens: int | None = None) -> dict:
    """``lcjax.eval.evaluate`` of ``target`` on ``suite``; the evaluator's and the suite's
    reports (MGAL metrics, heat maps) go to ``out_dir/name``; returns the overall scores,
    the grid and the string-match summary."""
    from lcjax.eval import evaluate, write_report

    t0 = time.perf_counter()
    res = evaluate(target, suite, (length,), DEPTHS, n_per_cell, SEED, batch_size=8,
                   progress=False, max_new_tokens=max_new_tokens)
    folder = out_dir / name
    write_report(res, str(folder))
    mg = suite.report(res.records, str(folder))
    return {"overall": mg["overall"], "grid": mg["grid"], "items": len(res.records),
            "errors": sum(r["error"] is not None for r in res.records),
            "string_match_all": res.summary["overall"]["string_match_all"],
            "figures": [str(Path(f).relative_to(out_dir)) for f in mg["files"]
                        if f.endswith(".png")],
            "seconds": time.perf_counter() - t0}


def train_ruler_model(s) -> dict:
    """The RULER-task byte LM (``experiments.long_eval.experiment.train_model``)."""
    from experiments.long_eval.experiment import train_model

    return train_model(s["ruler_stages"], batch=s["batch"], log=lambda *_: None)


def _row_loglik(model, tokens, targets, mask):
    """Sum and count of ``log softmax(model(tokens))[t, targets_t]`` over ``mask``: [B]."""
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(model(tokens).astype(jnp.float32), axis=-1)
    ll = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(mask, ll, 0.0), axis=-1)


_ROW_LOGLIK = None


def option_loglik(model, prompt: bytes, options) -> tuple[np.ndarray, np.ndarray]:
    """``(sum, bytes)`` per option: ``log p(" " + option | [BOS] + prompt)`` teacher forced,
    one row per option right-padded to a multiple of :data:`BUCKET` (the LM is causal, so
    the padding does not change the scored positions)."""
    import jax.numpy as jnp
    from flax import nnx

    from lcjax.data.tokenizer import BOS, PAD

    global _ROW_LOGLIK
    if _ROW_LOGLIK is None:
        _ROW_LOGLIK = nnx.jit(_row_loglik)
    head = [BOS] + list(prompt)
    sums, counts = [], []
    for opt in options:  # one row at a time: a 3.5 KB row's scores are ~200 MB per layer
        ans = list((" " + opt).encode())
        row = head + ans
        n = -(-(len(row) - 1) // BUCKET) * BUCKET
        tokens = np.full((1, n), PAD, np.int32)
        targets = np.zeros((1, n), np.int32)
        mask = np.zeros((1, n), bool)
        tokens[0, :len(row) - 1] = row[:-1]
        targets[0, :len(row) - 1] = row[1:]
        mask[0, len(head) - 1:len(row) - 1] = True
        sums.append(float(_ROW_LOGLIK(model, jnp.asarray(tokens), jnp.asarray(targets),
                                      jnp.asarray(mask))[0]))
        counts.append(len(ans))
    return np.asarray(sums), np.asarray(counts)


def option_scores(model, items) -> dict:
    """Option-likelihood scoring of the MC items of ``items`` (``EvalItem`` of the mgal
    suite): per item the chosen option (highest mean log-prob per byte), whether it is the
    gold one, and the chance level 1 / #options; also the choice by summed log-prob."""
    rows = []
    for it in items:
        mi = it.sample.info["item"]
        if mi.options is None:
            continue
        s, c = option_loglik(model, it.prompt, mi.options)
        rows.append({"task": mi.task, "language": mi.language, "granularity": mi.granularity,
                     "position": mi.position_doc, "n_options": len(mi.options),
                     "gold": int(mi.answer), "choice": int(np.argmax(s / c)),
                     "choice_sum": int(np.argmax(s))})
    correct = np.asarray([r["choice"] == r["gold"] for r in rows], np.float64)
    correct_sum = np.asarray([r["choice_sum"] == r["gold"] for r in rows], np.float64)
    chance = np.asarray([1.0 / r["n_options"] for r in rows])
    return {"n_mc": len(rows), "accuracy": float(correct.mean()) if rows else None,
            "accuracy_sum": float(correct_sum.mean()) if rows else None,
            "chance": float(chance.mean()) if rows else None,
            "excess": (correct - chance).tolist(), "items": rows}


def likelihood_claim(model: str, scores: dict) -> Claim:
    """"Beats chance on MC by option likelihood": the mean of ``correct − 1/#options`` over
    the MC items with its 95% t interval; holds when the interval is above 0, fails when
    not; not tested below :data:`MIN_MC_ITEMS` items."""
    name = (f"the {model} byte LM beats chance on multiple choice scored by option likelihood "
            "(per-byte)")
    pre = f"≥ {MIN_MC_ITEMS} MC items"
    target = "accuracy − chance > 0 (95% interval above 0)"
    if scores["n_mc"] < MIN_MC_ITEMS:
        return not_tested(name, target, f"{scores['n_mc']} MC items", pre)
    mean, lo, hi = mean_interval(scores["excess"])
    ours = (f"{_pct(scores['accuracy'])} vs chance {_pct(scores['chance'])}: {100 * mean:+.1f} "
            f"points [95% CI {100 * lo:+.1f}, {100 * hi:+.1f}] over {scores['n_mc']} items "
            f"(summed log-prob: {_pct(scores['accuracy_sum'])})")
    return Claim(name, target, ours, interval_verdict(lo, hi), pre)


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def overall_table(results: dict) -> str:
    cols = ("accuracy", "mc_accuracy", "mc_chance", "exact_match", "consistency_f1", "fluent",
            "fluent_but_drifting")
    lines = ["| target | items (mc/open) | " + " | ".join(cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for name, r in results.items():
        o = r["overall"]
        lines.append(f"| {name} | {o['n']} ({o['n_mc']}/{o['n_open']}) | "
                     + " | ".join(_pct(o[c]) for c in cols) + " |")
    return "\n".join(lines)


ANSWERS_MC = 0.5  # precondition: the model names an option in at least this share of MC items


def beats_chance_claim(model: str, overall: dict) -> Claim:
    """"beats chance on multiple choice", not tested unless the model names an option in at
    least ANSWERS_MC of the MC items (a model that never names one scores 0 whatever it
    read)."""
    name = f"the {model} byte LM beats chance on multiple choice"
    pre = f"the model names an option in ≥ {ANSWERS_MC:.0%} of MC items"
    answered = overall.get("mc_answered") or 0.0
    ours = (f"{_pct(overall['mc_accuracy'])} vs {_pct(overall['mc_chance'])} (names an option "
            f"in {answered:.0%})")
    if answered < ANSWERS_MC:
        return not_tested(name, "mc_accuracy > mc_chance", ours, pre)
    return Claim(name, "mc_accuracy > mc_chance", ours,
                 bool(overall["mc_accuracy"] > overall["mc_chance"]), pre)


def run(quick: bool, out_dir: Path) -> Result:
    from lcjax.data import mgal_suite

    s = SETTINGS[quick]
    out_dir = Path(out_dir)
    t0, c0 = time.perf_counter(), time.process_time()
    corpus, langs, label = load_corpus(s["langs"])
    if label == "Debian Reference":
        langs = s["eval_langs"]
    suite = mgal_suite.make_suite(corpus, langs=langs)
    base, base_info = shakespeare_base(quick)
    targets = {"oracle": oracle_for(suite, s["n_per_cell"]), "shakespeare": base}
    ruler = train_ruler_model(s) if "ruler" in s["models"] else None
    if ruler is not None:
        targets["ruler"] = ruler["model"]
    results = {name: evaluate_target(t, suite, s["n_per_cell"], out_dir, name,
                                     max_new_tokens=None if name == "oracle"
                                     else s["max_new_tokens"])
               for name, t in targets.items()}
    from lcjax.data.items import build_items

    lik_items = [it for it in build_items(suite, (LENGTH,), DEPTHS, s["likelihood_per_cell"],
                                          SEED + 1)
                 if it.sample.info["item"].options is not None][:s["likelihood_max_items"]]
    t1 = time.perf_counter()
    likelihood = {m: option_scores(targets[m], lik_items) for m in s["models"]}
    lik_s = time.perf_counter() - t1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    o = {name: r["overall"] for name, r in results.items()}
    claims = [
        Claim("the oracle answers every item (MC and open) through the evaluator",
              "100%", _pct(o["oracle"]["accuracy"]), o["oracle"]["accuracy"] == 1.0),
    ] + [beats_chance_claim(m, o[m]) for m in s["models"]] + [
        likelihood_claim(m, likelihood[m]) for m in s["models"]]
    notes = (f"Corpus: {label}; languages {', '.join(langs)}; context budget {LENGTH} bytes "
             f"(prompts up to ~3.3 KB; MGAL uses 8K-128K tokens); depths {DEPTHS} = "
             f"begin/middle/end; {s['n_per_cell']} item(s) per language x granularity x "
             f"position.\nShakespeare base: {base_info['steps']} steps, held-out "
             f"{base_info['heldout_bpb']} bits/byte. "
             + ("RULER model: not in quick mode." if ruler is None else
                f"RULER model: {sum(k for _, k, _ in s['ruler_stages'])} steps x "
                f"{s['batch']} rows ({ruler['params']} params; last answer NLL "
                f"{ruler['history'][-1]['answer_nll']:.3f}).")
             + "\n\n" + overall_table(results)
             + f"\n\nOption likelihood ({len(lik_items)} MC items, seed {SEED + 1}, "
             f"{s['likelihood_per_cell']} per cell; {lik_s:.0f} s): " + "; ".join(
                 f"{m} {_pct(v['accuracy'])} per-byte / {_pct(v['accuracy_sum'])} summed vs "
                 f"chance {_pct(v['chance'])} over {v['n_mc']} MC items"
                 for m, v in likelihood.items())
             + f"\n\n{wall:.1f} s wall, {cpu:.1f} CPU s.")
    figures = [out_dir / f for r in results.values() for f in r["figures"]]
    return Result(claims=claims, notes=notes, figures=figures, numbers={
        "seed": SEED, "quick": quick, "corpus": label, "langs": list(langs),
        "length": LENGTH, "depths": list(DEPTHS), "settings": s,
        "shakespeare_base": base_info,
        "ruler_model": None if ruler is None else (
            {k: ruler[k] for k in ("params", "steps", "stages", "cpu_s")}
            | {"last_answer_nll": ruler["history"][-1]["answer_nll"]}),
        "results": results, "option_likelihood": likelihood, "likelihood_s": lik_s,
        "wall_s": wall, "cpu_s": cpu, "machine": machine_info()})


EXPERIMENT = Experiment(
    name="mgal",
    paper="MGAL: multilingual granularity- and position-aware long-document evaluation "
          "(ICML 2026)",
    summary="the MGAL-style grid (language x granularity x position) on Debian Reference for "
            "a Shakespeare byte LM, a RULER-task byte LM and an oracle, via lcjax.eval.evaluate",
    run=run,
    # quick (oracle + the Shakespeare base, 12 items, 8-byte replies): 61 s wall, 44 CPU s
    # beside a running test suite (2026-12-04); 5 s taken from lps, 30 s were unallocated
    quick_budget_s=60,
)


if __name__ == "__main__":
    main(EXPERIMENT)
