"""What every experiment returns: claims checked (claim, our number, a verdict), numbers for
the JSON report and figure paths for the markdown report.

A verdict is one of three (``VERDICTS``): **holds**, **fails**, or **not tested** — the
claim's precondition (e.g. "both arms learned the task: >= 90% at 1x L") was not met, so our
number says nothing about the claim. A claim whose precondition is unmet is never "fails".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lcjax.bench.timing import json_default, machine_info  # noqa: F401 (re-exported)

VERDICTS = ("holds", "fails", "not tested")


@dataclass(frozen=True)
class Claim:
    """One checkable statement: what is claimed, the target, what we measured, the verdict.

    ``holds``: True (holds), False (fails) or None (not tested: ``precondition`` unmet, and
    ``ours`` says why). ``precondition``: what must be true for the number to test the
    claim (empty when the check needs none beyond the run finishing).
    """

    claim: str
    target: str
    ours: str
    holds: bool | None
    precondition: str = ""

    @property
    def verdict(self) -> str:
        """"holds", "fails" or "not tested"."""
        return verdict_of(self.holds)


def verdict_of(holds: bool | None) -> str:
    """The verdict word of a claim's ``holds`` value (True / False / None)."""
    return "not tested" if holds is None else ("holds" if holds else "fails")


def not_tested(claim: str, target: str, why: str, precondition: str) -> Claim:
    """A claim whose ``precondition`` is unmet: verdict "not tested", ``why`` as our number."""
    return Claim(claim, target, f"not tested: {why}", None, precondition)


def mean_interval(x, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of per-seed values ``x``: the Student-t interval
    mean ± t_{(1+level)/2, n−1} · s / √n (s: the sample standard deviation); lo = hi = NaN
    for one value."""
    from scipy import stats  # scipy: the t quantile (statsmodels brings it)

    x = np.asarray(x, np.float64)
    mean = float(x.mean())
    if x.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf((1 + level) / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return mean, mean - half, mean + half


def interval_verdict(lo: float, hi: float) -> bool | None:
    """A one-sided "mean > 0" claim from its interval: True when lo > 0, False when not,
    None (not tested) when there is no interval (one seed: lo = hi = NaN)."""
    if np.isnan(lo) or np.isnan(hi):
        return None
    return bool(lo > 0)


def claim_line(c: Claim) -> str:
    """One printed line per claim: ``[HOLDS|FAILS|NOT TESTED] claim: ours ... (target ...)``."""
    pre = f"; precondition: {c.precondition}" if c.precondition else ""
    return f"[{c.verdict.upper()}] {c.claim}: ours {c.ours} (target {c.target}{pre})"


def task_rows(suite, task: str, length: int, n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` items of ``suite``'s ``task`` at ``length`` bytes (``TaskSource`` seed ``seed``,
    uniform depths) as teacher-forcing rows ``inputs`` / ``targets`` / ``loss_mask``
    ``[n, length + 1]`` (BOS + prompt + answer + EOS; the mask on the answer bytes and EOS),
    the rows an experiment's training stream is made of."""
    from lcjax.data.sources import TaskSource

    src = TaskSource(suite, task, length=length, num_records=n, seed=seed, eos=True,
                     seq_len=length + 1)
    rows = [src[i] for i in range(n)]
    return {k: np.stack([r[k] for r in rows]) for k in ("inputs", "targets", "loss_mask")}


def _argmax_fn(graphdef):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    @jax.jit
    def predict(state, inputs):
        return jnp.argmax(nnx.merge(graphdef, state)(inputs), axis=-1)

    return predict


_PREDICT: dict = {}  # graphdef -> its compiled argmax (models of one shape share it)


def exact_match(model, rows: dict[str, np.ndarray], batch: int) -> np.ndarray:
    """bool ``[n]``: every masked target of each row (``rows`` as :func:`task_rows`) is the
    nnx ``model``'s argmax under teacher forcing (``ruler.answer_accuracy``'s ``exact``: the
    same as greedy decoding producing the answer exactly), ``batch`` rows per pass (the last
    pass padded with copies of its last row, so one shape compiles)."""
    import jax
    from flax import nnx

    from lcjax.data import ruler

    graphdef, state = nnx.split(model)
    if graphdef not in _PREDICT:
        _PREDICT[graphdef] = _argmax_fn(graphdef)
    predict = _PREDICT[graphdef]
    n, out = len(rows["inputs"]), []
    for a in range(0, n, batch):
        chunk = {k: v[a:a + batch] for k, v in rows.items()}
        k = len(chunk["inputs"])
        inputs = np.concatenate([chunk["inputs"], np.repeat(chunk["inputs"][-1:], batch - k, 0)])
        pred = np.asarray(jax.device_get(predict(state, inputs)))[:k]
        out.append(ruler.answer_accuracy(pred, chunk)["exact"])
    return np.concatenate(out)


@dataclass
class Result:
    claims: list[Claim] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)
    figures: list[Path] = field(default_factory=list)
    notes: str = ""


# `make reproduce` (every experiment's quick run) must stay within this many seconds on the
# development machine (2 CPUs); the experiments' quick budgets add up to at most this.
TOTAL_QUICK_BUDGET_S = 25 * 60


@dataclass(frozen=True)
class Experiment:
    """A registered experiment: ``run(quick, out_dir) -> Result``.

    ``quick_budget_s``: the wall-clock seconds its quick run (``make reproduce``) may take on
    the development machine; ``reproduce.py`` prints the measured time against it, and the
    budgets of all experiments add up to at most :data:`TOTAL_QUICK_BUDGET_S`.
    """

    name: str
    paper: str
    summary: str
    run: Callable[[bool, Path], Result]
    quick_budget_s: float | None = None

    def __post_init__(self):
        if self.quick_budget_s is not None and not self.quick_budget_s > 0:
            raise ValueError(f"Experiment {self.name!r}: `quick_budget_s` must be > 0 seconds, "
                             f"got {self.quick_budget_s!r}")


# What is committed and what is not: reports/ keeps each experiment's claims, aggregates and
# figures (<= 2 MB in all, tests/test_records.py); per-item records and run caches live in
# the same relative path under runs/records/ (untracked, .gitignore), and `make reproduce`
# (quick) writes everything under runs/reports/.
ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
RECORDS = ROOT / "runs" / "records"
QUICK_REPORTS = ROOT / "runs" / "reports"


def records_dir(report_dir: Path) -> Path:
    """The untracked folder for the per-item records and run caches of ``report_dir``:
    ``reports/<x>`` -> ``runs/records/<x>``; any folder outside ``reports/`` (a quick run's,
    a test's) keeps its own."""
    report_dir = Path(report_dir).resolve()
    try:
        return RECORDS / report_dir.relative_to(REPORTS)
    except ValueError:
        return report_dir


def write_json(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=json_default))


def keep_record(path: Path | None, record: dict, fingerprint: dict) -> None:
    """Write ``record`` with its ``fingerprint`` (what it was made with) to ``path``
    atomically (a temporary file, then a rename), so a full run can resume from it; None:
    nothing. :func:`kept_record` reads it back."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**record, "fingerprint": fingerprint}, indent=1,
                              default=json_default))
    tmp.replace(path)


def kept_record(path: Path | None, fingerprint: dict) -> dict | None:
    """The record :func:`keep_record` wrote at ``path``, without its fingerprint; None when
    there is none or it was made with another ``fingerprint`` (compared as JSON)."""
    if path is None or not path.exists():
        return None
    body = json.loads(path.read_text())
    kept = body.pop("fingerprint", None)
    return body if kept == json.loads(json.dumps(fingerprint, default=json_default)) else None


def experiment_parser(experiment: Experiment) -> argparse.ArgumentParser:
    """The flags every experiment's command line has (``python -m
    experiments.<name>.experiment``): ``--full`` (else quick) and ``--out DIR`` (default
    ``runs/reports/<name>``, untracked); an experiment adds its own before parsing."""
    parser = argparse.ArgumentParser(description=experiment.summary)
    parser.add_argument("--full", action="store_true", help="the full setting (else quick)")
    parser.add_argument("--out", type=Path, default=QUICK_REPORTS / experiment.name)
    return parser


def print_result(res: Result) -> None:
    """Prints an experiment's notes, then every claim with its verdict."""
    print(res.notes)
    for c in res.claims:
        print(claim_line(c))


def main(experiment: Experiment, argv=None) -> Result:
    """The command line of one experiment with only the shared flags
    (:func:`experiment_parser`); runs it, prints its result and returns the :class:`Result`."""
    args = experiment_parser(experiment).parse_args(argv)
    res = experiment.run(not args.full, args.out)
    print_result(res)
    return res


# The Shakespeare-pretrained byte LM several experiments start from (TableLong, ParaTool):
# lm_demo's model shape with max_len 2048 (RoPE, so any length runs).
BASE_MODEL = dict(d_model=128, num_layers=4, num_heads=4, num_kv_heads=4, head_dim=32,
                  mlp_hidden=344, max_len=2048)
BASE_STEPS = {True: 200, False: 3000}  # quick: ~20 s on the 2-CPU machine; full: ~5 min
CACHE_DIR = Path(__file__).resolve().parents[1] / ".cache" / "experiments"


def shakespeare_base(quick: bool, *, cache_dir: Path = CACHE_DIR):
    """``(model, info)``: ``lcjax.nn.DecoderLM(BASE_MODEL)`` trained by ``lcjax.train.train``
    on the default Shakespeare split for ``BASE_STEPS[quick]`` steps (B = 8, T = 128).

    The run lives in ``cache_dir/shakespeare_base_<steps>_<hash of the settings>`` and is
    resumed from there, so the first experiment of a ``make reproduce`` trains it and the
    others load the final checkpoint (the result is the same either way: the loop's resume
    is exact). ``info`` holds the steps, the held-out bits/byte of the last evaluation
    (None on a cache hit whose run logged none) and whether the cache was hit.
    """
    import hashlib

    from lcjax.data import VOCAB_SIZE
    from lcjax.nn import DecoderConfig
    from lcjax.train import TrainConfig, train

    steps = BASE_STEPS[quick]
    fields = dict(steps=steps, batch_size=8, seq_len=128, lr=3e-3,
                  warmup_steps=min(100, steps // 10), eval_batches=16)
    # the folder is keyed by the settings, so changing them trains a new base, not a resume
    key = hashlib.sha1(json.dumps([BASE_MODEL, fields], sort_keys=True).encode()).hexdigest()
    out = cache_dir / f"shakespeare_base_{steps}_{key[:8]}"
    hit = (out / "checkpoints").exists()
    cfg = TrainConfig(**fields, log_every=50, out_dir=str(out), resume=True,
                      keep_checkpoints=1, progress=False)
    result = train(DecoderConfig(vocab_size=VOCAB_SIZE, **BASE_MODEL), cfg)
    evals = result.evals
    if not evals and (out / "metrics.jsonl").exists():
        from lcjax.train.metrics import read_jsonl

        evals = [r for r in read_jsonl(out / "metrics.jsonl") if "eval_bpb" in r]
    info = {"steps": steps, "model": BASE_MODEL, "cache_hit": hit,
            "heldout_bpb": evals[-1]["eval_bpb"] if evals else None}
    return result.model, info


def copy_model(model):
    """A copy of an nnx model with its own buffers (``lcjax.train.train`` donates the
    parameters of the model it is given, e.g. through ``model_fn``)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(jnp.copy, state))


# --- answer-format fine-tuning (the warm starts of TableLong and MGAL) -----------------------


def answer_rows(pairs, width: int, *, name: str = "answer_rows") -> dict[str, np.ndarray]:
    """Teacher-forcing rows of ``(prompt_ids, answer_ids)`` pairs (the prompt with its BOS,
    the answer with its EOS): ``row = prompt + answer``, ``inputs = row[:-1]``, ``targets =
    row[1:]``, PAD to ``width``; ``loss_mask`` True exactly on the targets that are answer
    tokens — the rows of ``lcjax.train.losses.answer_weighted_nll``. All ``[len(pairs),
    width]``.

    Raises:
      ValueError: a row longer than ``width + 1`` tokens, or an empty prompt.
    """
    from lcjax.data import tokenizer as tok

    n = len(pairs)
    out = {"inputs": np.full((n, width), tok.PAD, np.int32),
           "targets": np.full((n, width), tok.PAD, np.int32),
           "loss_mask": np.zeros((n, width), bool)}
    for i, (prompt, answer) in enumerate(pairs):
        row = np.concatenate([prompt, answer])
        if len(prompt) == 0:
            raise ValueError(f"{name}: pair {i} has an empty prompt (start it with BOS)")
        if len(row) > width + 1:
            raise ValueError(f"{name}: item {i}'s row has {len(row)} tokens > width + 1 = "
                             f"{width + 1}")
        out["inputs"][i, :len(row) - 1] = row[:-1]
        out["targets"][i, :len(row) - 1] = row[1:]
        out["loss_mask"][i, len(prompt) - 1:len(row) - 1] = True
    return out


def row_batches(rows: dict[str, np.ndarray], steps: int, batch: int, seed: int
                ) -> list[dict[str, np.ndarray]]:
    """``steps`` batches of ``batch`` rows: passes over ``rows`` in a fresh permutation of
    ``seed`` each (every row once per pass; the last pass cut short)."""
    n = len(rows["inputs"])
    rng = np.random.default_rng([seed, 2])
    order = np.concatenate([rng.permutation(n) for _ in range(-(-steps * batch // n))])
    return [{k: v[order[i * batch:(i + 1) * batch]] for k, v in rows.items()}
            for i in range(steps)]


def answer_finetune(base, rows: dict[str, np.ndarray], *, steps: int, batch: int, lr: float,
                    seed: int) -> tuple[object, dict]:
    """A copy of ``base`` fine-tuned by ``lcjax.train.train`` on ``rows``
    (:func:`answer_rows`) for ``steps`` AdamW steps of ``batch`` rows (:func:`row_batches`;
    cosine schedule, 10% warm-up), the loss on the answer tokens only
    (``answer_weighted_loss(0)``); ``base`` is left as it was. Returns the model and
    ``{"steps", "batch", "lr", "rows", "seed", "answer_nll_first", "answer_nll_last",
    "wall_s", "cpu_s"}`` (the training answer NLL, nats per answer token, of the first and
    the last step's batch)."""
    import time

    from lcjax.train import TrainConfig, answer_weighted_loss, train

    cfg = TrainConfig(steps=steps, batch_size=batch, seq_len=rows["inputs"].shape[1], lr=lr,
                      warmup_steps=steps // 10, seed=seed, log_every=max(1, steps // 10),
                      eval_batches=0, progress=False)
    model = copy_model(base)
    t0, c0 = time.perf_counter(), time.process_time()
    result = train(base.config, cfg, dataset=row_batches(rows, steps, batch, seed),
                   model_fn=lambda *_: model, loss_fn=answer_weighted_loss(0.0))
    hist = result.history
    return result.model, {
        "steps": steps, "batch": batch, "lr": lr, "rows": len(rows["inputs"]), "seed": seed,
        "answer_nll_first": float(hist[0]["answer_nll"]),
        "answer_nll_last": float(hist[-1]["answer_nll"]),
        "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def parse_bench_args(name: str, add_arguments: Callable, argv: list[str]) -> argparse.Namespace:
    """The flags of a paper benchmark, ``python -m experiments.<name>.bench [flags]``, parsed
    from ``argv`` (without the program name): ``add_arguments`` adds them to a subcommand
    ``name`` (the form `lcjax bench <name>` had, which the benchmarks' code still reads)."""
    parser = argparse.ArgumentParser(prog=f"python -m experiments.{name}.bench")
    add_arguments(parser.add_subparsers(dest="bench", required=True))
    return parser.parse_args([name, *argv])


def print_bench_result(result: dict, format_summary: Callable[[dict], str]) -> None:
    """Prints a benchmark's summary and the files it wrote (``result["files"]``)."""
    print()
    print(format_summary(result))
    for path in result.get("files", {}).values():
        print(f"wrote {path}")
