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

**Warm start** (full run; :func:`warm_start`): neither byte LM ever names an option, so
"beats chance on multiple choice" by generation was not tested. A copy of the Shakespeare
base is fine-tuned on the MC answer format (:func:`experiments.common.answer_finetune`, the
loss on ``" " + option text + EOS`` only after ``[BOS] + prompt``): MGAL MC items of the
same suite and budget drawn with the seeds :data:`WARM_SEEDS`, disjoint from the grid's
(:data:`SEED`) and the option-likelihood items' (``SEED + 1``); a (task, seed) cell the corpus
cannot fill is skipped and counted, and the report counts warm questions that also occur
among the evaluated ones. The warm model is then evaluated on the grid at
``warm_eval_per_cell`` items per cell (≥ :data:`MIN_MC_ITEMS` MC items), its replies long
enough to copy the longest option, and scored by option likelihood too. Claim: its MC
accuracy beats chance, by the per-item ``correct − 1/#options`` with a 95% t interval;
precondition: it names an option in ≥ :data:`ANSWERS_MC` of the MC items.
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
    answer_finetune,
    answer_rows,
    interval_verdict,
    machine_info,
    main,
    mean_interval,
    not_tested,
    records_dir,
    shakespeare_base,
)

SEED = 0
LENGTH = 2048
DEPTHS = (0.0, 0.5, 1.0)
# the warm start's item seeds, disjoint from the grid's (SEED) and the likelihood items'
# (SEED + 1); its steps: 150 x 2 rows of up to 4,096 bytes took 2,593 s here (2026-12-07,
# beside other runs; 4-row steps at that width did not fit the time or ~11 GB of memory)
WARM_SEEDS = tuple(range(100, 130))
WARM_STEPS = 150
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
               likelihood_per_cell=1, likelihood_max_items=1, warm_steps=0),
    # warm start: WARM_STEPS AdamW steps of warm_batch rows (lr warm_lr) on the MC items of
    # warm_seeds seeds; evaluated on warm_eval_per_cell items per grid cell
    False: dict(langs=("en", "ja"), eval_langs=("en", "ja"), n_per_cell=1, batch=16,
                max_new_tokens=32, models=("shakespeare", "ruler"),
                ruler_stages=((128, 150, ("niah_single_1",)),),
                likelihood_per_cell=3, likelihood_max_items=None,
                warm_steps=WARM_STEPS, warm_batch=2, warm_lr=1e-3, warm_seeds=WARM_SEEDS,
                warm_eval_per_cell=3),
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
                    length: int = LENGTH, max_new_tokens: int | None = None,
                    folder: Path | None = None) -> dict:
    """``lcjax.eval.evaluate`` of ``target`` on ``suite``; the evaluator's and the suite's
    reports (MGAL metrics, heat maps) go to ``folder`` (default ``out_dir/name``); returns
    the overall scores, the grid, the string-match summary, the MC items' records and the
    heat maps that lie under ``out_dir`` (paths relative to it)."""
    from lcjax.eval import evaluate, write_report

    t0 = time.perf_counter()
    res = evaluate(target, suite, (length,), DEPTHS, n_per_cell, SEED, batch_size=8,
                   progress=False, max_new_tokens=max_new_tokens)
    folder = Path(out_dir / name if folder is None else folder)
    write_report(res, str(folder))
    mg = suite.report(res.records, str(folder))
    return {"overall": mg["overall"], "grid": mg["grid"], "items": len(res.records),
            "errors": sum(r["error"] is not None for r in res.records),
            "string_match_all": res.summary["overall"]["string_match_all"],
            "mc": [{k: m[k] for k in ("task", "language", "n_options", "choice", "correct")}
                   for m in (r["suite_metrics"] for r in res.records) if m["kind"] == "mc"],
            "figures": [str(Path(f).relative_to(out_dir)) for f in mg["files"]
                        if f.endswith(".png") and Path(f).is_relative_to(out_dir)],
            "seconds": time.perf_counter() - t0}


def warm_items(suite, seeds=WARM_SEEDS, length: int = LENGTH) -> tuple[list, int]:
    """``(items, skipped)``: the MC items (``EvalItem``) of ``suite`` at ``length`` bytes,
    :data:`DEPTHS`, one per task, depth and seed of ``seeds``; a (task, seed) the corpus
    cannot fill (the generator's RuntimeError) is skipped and counted.

    Raises:
      ValueError: a seed of the grid (:data:`SEED`) or of the likelihood items (``SEED + 1``).
    """
    from lcjax.data.items import build_items

    clash = sorted({SEED, SEED + 1} & set(seeds))
    if clash:
        raise ValueError(f"warm_items: seeds {clash} are the evaluated items' (grid {SEED}, "
                         f"option likelihood {SEED + 1}); the warm start must not see them")
    items, skipped = [], 0
    for seed in seeds:
        for task in suite.tasks:
            try:
                cell = build_items(suite, (length,), DEPTHS, 1, seed, tasks=(task.name,))
            except RuntimeError:
                skipped += 1
                continue
            items += [it for it in cell if it.sample.info["item"].options is not None]
    return items, skipped


def answer_text(item) -> str:
    """What the model is taught to reply to an MC ``item``: ``" "`` + the gold option's text
    (the prompt ends ``Answer:``; :func:`lcjax.data.mgal_metrics.parse_choice` strips)."""
    mi = item.sample.info["item"]
    return " " + mi.options[int(mi.answer)]


def warm_rows(items) -> dict[str, np.ndarray]:
    """Rows ``[BOS] + prompt + answer_text + [EOS]`` of ``items``, the loss on the answer
    and EOS (:func:`experiments.common.answer_rows`), padded to a multiple of
    :data:`BUCKET`."""
    from lcjax.data import tokenizer as tok

    pairs = [(tok.encode(it.prompt, bos=True), tok.encode(answer_text(it), eos=True))
             for it in items]
    width = -(-max(len(p) + len(a) - 1 for p, a in pairs) // BUCKET) * BUCKET
    return answer_rows(pairs, width, name="warm_rows")


def shared_questions(warm, evaluated) -> int:
    """How many of ``warm``'s items ask a question (text and options) that an item of
    ``evaluated`` also asks."""
    def key(it):
        mi = it.sample.info["item"]
        return mi.question, mi.options

    seen = {key(it) for it in evaluated}
    return sum(key(it) in seen for it in warm)


def warm_start(base, suite, s: dict) -> tuple[object, dict, list]:
    """A copy of ``base`` fine-tuned on the MC answer format (module docstring):
    :func:`warm_rows` of :func:`warm_items`, ``s["warm_steps"]`` steps of
    ``s["warm_batch"]`` rows at ``s["warm_lr"]``; (model, info, the warm items)."""
    items, skipped = warm_items(suite, s["warm_seeds"])
    rows = warm_rows(items)
    model, info = answer_finetune(base, rows, steps=s["warm_steps"], batch=s["warm_batch"],
                                  lr=s["warm_lr"], seed=min(s["warm_seeds"]))
    info |= {"items": len(items), "skipped_cells": skipped,
             "seeds": [min(s["warm_seeds"]), max(s["warm_seeds"])],
             "width": rows["inputs"].shape[1],
             "passes": s["warm_steps"] * s["warm_batch"] / len(items)}
    return model, info, items


def generated_claim(model: str, evaluated: dict) -> Claim:
    """"Beats chance on MC by its generated replies": the per-item ``correct − 1/#options``
    with a 95% t interval over the MC items (a reply naming no option is wrong); not tested
    when the model names an option in fewer than :data:`ANSWERS_MC` of them or there are
    fewer than :data:`MIN_MC_ITEMS`."""
    name = f"the {model} byte LM beats chance on multiple choice (generated replies)"
    pre = (f"the model names an option in ≥ {ANSWERS_MC:.0%} of ≥ {MIN_MC_ITEMS} MC items")
    target = "accuracy − chance > 0 (95% interval above 0)"
    mc = evaluated["mc"]
    answered = float(np.mean([r["choice"] is not None for r in mc])) if mc else 0.0
    if len(mc) < MIN_MC_ITEMS or answered < ANSWERS_MC:
        return not_tested(name, target, f"names an option in {answered:.0%} of {len(mc)} MC "
                          "items", pre)
    excess = [float(r["correct"]) - 1.0 / r["n_options"] for r in mc]
    mean, lo, hi = mean_interval(excess)
    acc = float(np.mean([r["correct"] for r in mc]))
    chance = float(np.mean([1.0 / r["n_options"] for r in mc]))
    ours = (f"{_pct(acc)} vs chance {_pct(chance)}: {100 * mean:+.1f} points [95% CI "
            f"{100 * lo:+.1f}, {100 * hi:+.1f}] over {len(mc)} items (names an option in "
            f"{answered:.0%})")
    return Claim(name, target, ours, interval_verdict(lo, hi), pre)


def chosen_positions(mc) -> list[int]:
    """How often each option position (A = 0, B = 1, ...) was the one a reply named (a
    model that copies one position whatever the question shows here)."""
    return np.bincount([r["choice"] for r in mc if r["choice"] is not None],
                       minlength=4).tolist()


def without(record: dict, *keys: str) -> dict:
    """``record`` less ``keys``: the report keeps aggregates; the per-item MC records and
    the warm model's grid stay in its evaluator reports."""
    return {k: v for k, v in record.items() if k not in keys}


WARM_NAME = "warm-started Shakespeare"


def warm_part(base, suite, lik_items, s: dict, out_dir: Path) -> dict:
    """The warm start and its evaluation (module docstring): the grid at
    ``s["warm_eval_per_cell"]`` items per cell through ``lcjax.eval.evaluate`` (replies up to
    the longest option's bytes + 8; its reports in ``records_dir(out_dir) / "warm"``) and
    option likelihood on ``lik_items``."""
    from lcjax.data.items import build_items

    t0 = time.perf_counter()
    model, info, items = warm_start(base, suite, s)
    grid = build_items(suite, (LENGTH,), DEPTHS, s["warm_eval_per_cell"], SEED)
    info["shared_questions"] = shared_questions(items, grid + list(lik_items))
    new_tokens = 8 + max(len(o.encode()) for it in grid
                         for o in (it.sample.info["item"].options or ("",)))
    # its per-item reports go with the records (untracked): reports/ keeps the aggregates
    evaluated = evaluate_target(model, suite, s["warm_eval_per_cell"], out_dir, "warm",
                                max_new_tokens=new_tokens,
                                folder=records_dir(out_dir) / "warm")
    return {"info": info, "eval": evaluated, "max_new_tokens": new_tokens,
            "chosen_positions": chosen_positions(evaluated["mc"]),
            "likelihood": option_scores(model, lik_items),
            "seconds": time.perf_counter() - t0}


def warm_notes(warm: dict) -> str:
    """The report's paragraph on the warm start."""
    i, o = warm["info"], warm["eval"]["overall"]
    lik = warm["likelihood"]
    return (f"Warm start ({WARM_NAME}): {i['steps']} steps x {i['batch']} rows (lr {i['lr']}) "
            f"on {i['items']} MC items of seeds {i['seeds'][0]}-{i['seeds'][1]} "
            f"({i['skipped_cells']} cells the corpus could not fill skipped; "
            f"{i['passes']:.1f} passes; {i['shared_questions']} warm questions also evaluated), "
            f"rows of {i['width']} bytes; answer NLL {i['answer_nll_first']:.3f} -> "
            f"{i['answer_nll_last']:.3f} nats/byte ({i['wall_s']:.0f} s). Evaluated on "
            f"{o['n']} items ({o['n_mc']} MC), replies up to {warm['max_new_tokens']} bytes: MC "
            f"{_pct(o['mc_accuracy'])} vs chance {_pct(o['mc_chance'])}, names an option in "
            f"{_pct(o['mc_answered'])}; positions chosen (A, B, C, D) "
            f"{warm['chosen_positions']}; open exact match {_pct(o['exact_match'])}. Option "
            f"likelihood: {_pct(lik['accuracy'])} per-byte / {_pct(lik['accuracy_sum'])} "
            f"summed vs chance {_pct(lik['chance'])} over {lik['n_mc']} MC items "
            f"({warm['seconds']:.0f} s in all).")


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
    warm = warm_part(base, suite, lik_items, s, out_dir) if s["warm_steps"] else None
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    o = {name: r["overall"] for name, r in results.items()}
    claims = [
        Claim("the oracle answers every item (MC and open) through the evaluator",
              "100%", _pct(o["oracle"]["accuracy"]), o["oracle"]["accuracy"] == 1.0),
    ] + [beats_chance_claim(m, o[m]) for m in s["models"]] + [
        likelihood_claim(m, likelihood[m]) for m in s["models"]]
    if warm is not None:
        claims += [generated_claim(WARM_NAME, warm["eval"]),
                   likelihood_claim(WARM_NAME, warm["likelihood"])]
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
             + ("" if warm is None else "\n\n" + warm_notes(warm))
             + f"\n\n{wall:.1f} s wall, {cpu:.1f} CPU s.")
    figures = [out_dir / f for r in [*results.values(), *([] if warm is None else
                                                          [warm["eval"]])]
               for f in r["figures"]]
    return Result(claims=claims, notes=notes, figures=figures, numbers={
        "seed": SEED, "quick": quick, "corpus": label, "langs": list(langs),
        "length": LENGTH, "depths": list(DEPTHS), "settings": s,
        "shakespeare_base": base_info,
        "ruler_model": None if ruler is None else (
            {k: ruler[k] for k in ("params", "steps", "stages", "cpu_s")}
            | {"last_answer_nll": ruler["history"][-1]["answer_nll"]}),
        "results": {name: without(r, "mc") for name, r in results.items()},
        "option_likelihood": likelihood, "likelihood_s": lik_s,
        "warm_start": None if warm is None else warm | {
            "eval": without(warm["eval"], "mc", "grid")},
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
