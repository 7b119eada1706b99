"""experiments/long_eval: the compact RULER suite at L = 256, its training rows, the clear
errors of generators asked for a length they cannot fill, and the pipeline end to end
(train through lcjax.train, evaluate through lcjax.eval, reports) on a tiny budget."""

import json
import re

import numpy as np
import pytest

from experiments.long_eval import experiment as exp
from lcjax.data import ruler
from lcjax.data.suites import get_suite
from lcjax.data.tokenizer import EOS


def test_ruler_templates_do_not_fit_256_and_say_so():
    """RULER's own templates need more than 256 bytes: every task of the "ruler" suite
    raises a ValueError naming the length and what the template takes (the reason the
    experiment uses compact templates); so does every compact task at 48 bytes."""
    for t in get_suite("ruler").tasks:
        kw = dict(t.overrides, **({"depth": 0.5} if t.uses_depth else {}))
        with pytest.raises(ValueError, match=r"length 256 is too short: .* take (\d+) tokens"
                           ) as info:
            ruler.generate(t.task, 0, 256, **kw)
        assert int(re.search(r"take (\d+) tokens", str(info.value)).group(1)) > 256, t.name
    for t in exp.SUITE.tasks:
        with pytest.raises(ValueError, match="length 48 is too short"):
            exp.SUITE.generate(t.task, 0, 48, **t.overrides)


def test_nolima_raises_a_clear_error_when_too_short():
    suite = get_suite("nolima")
    for t in suite.tasks:
        with pytest.raises(ValueError, match="too short|length"):
            suite.generate(t.task, 0, 64, **t.overrides)


@pytest.mark.parametrize("length", [exp.TRAIN_LEN, 8 * exp.TRAIN_LEN])
def test_compact_suite_fills_the_lengths(length):
    """Every compact task fills 256 and 2048 bytes exactly, keeps at least a quarter of the
    context as haystack, and states every reference in its prompt; the task list is the
    13 RULER tasks minus the documented left-out ones."""
    names = {t.name for t in exp.SUITE.tasks}
    assert names | set(exp.LEFT_OUT) == {t.name for t in ruler.SUITE}
    assert not names & set(exp.LEFT_OUT)
    for t in exp.SUITE.tasks:
        for i in range(3):
            kw = dict(t.overrides, **({"depth": i / 2} if t.uses_depth else {}))
            s = exp.SUITE.generate(t.task, np.random.default_rng([i, 7]), length, **kw)
            assert s.length == len(s.prompt) + len(s.answer) == length, t.name
            assert s.haystack_bytes >= length / 4, (t.name, s.haystack_bytes)
            assert s.references and all(r in s.prompt for r in s.references), t.name


def test_training_rows_carry_the_answer_and_eos():
    """A row of the experiment's dataset is BOS + prompt + answer + EOS of a TaskSource
    sample, 257 positions wide, with loss_mask exactly on the answer bytes and the EOS;
    tasks alternate by record."""
    ds = exp.training_dataset(("niah_single_1", "vt"), steps=2, batch=4)
    batch = ds[1]
    assert set(batch) == {"inputs", "targets", "loss_mask"}
    assert batch["inputs"].shape == (4, exp.TRAIN_LEN + 1)
    from lcjax.data.sources import TaskSource

    src = TaskSource(exp.SUITE, ["niah_single_1", "vt"], length=exp.TRAIN_LEN,
                     num_records=8, seed=exp.DATA_SEED)
    for r in range(4):
        s = src.sample(4 + r)
        assert s.task == ("niah" if r % 2 == 0 else "vt")
        tgt = batch["targets"][r][batch["loss_mask"][r]]
        assert bytes(tgt[:-1].astype(np.uint8)) == s.answer and tgt[-1] == EOS
        assert bytes(batch["inputs"][r][1:len(s.prompt) + 1].astype(np.uint8)) == s.prompt


def test_curriculum_dataset_runs_the_stages_in_order():
    """The staged dataset is each stage's TaskSource rows at its own length, one stage after
    the other: batch widths follow the stages, and every row is the TaskSource sample of
    that stage's seed (DATA_SEED + stage) and record, answer and EOS under the loss mask."""
    from lcjax.data.sources import TaskSource

    stages = ((128, 2, ("niah_single_1",)), (exp.TRAIN_LEN, 1, ("niah_single_1", "vt")))
    ds = exp.curriculum_dataset(stages, batch=3)
    assert len(ds) == 3
    assert [ds[j]["inputs"].shape for j in range(3)] == [(3, 129), (3, 129), (3, 257)]
    for j, (k, first) in enumerate([(0, 0), (0, 3), (1, 0)]):
        length, _, tasks = stages[k]
        src = TaskSource(exp.SUITE, list(tasks), length=length, num_records=8,
                         seed=exp.DATA_SEED + k)
        batch = ds[j]
        for r in range(3):
            s = src.sample(first + r)
            assert s.length == length
            row = batch["inputs"][r]
            assert bytes(row[1:len(s.prompt) + 1].astype(np.uint8)) == s.prompt
            tgt = batch["targets"][r][batch["loss_mask"][r]]
            assert bytes(tgt[:-1].astype(np.uint8)) == s.answer and tgt[-1] == EOS


def test_pipeline_end_to_end(tmp_path):
    """A few training steps through lcjax.train in two stages (a warm-up at 128 bytes,
    then the mix at L), the lcjax-model evaluator at 1x and 2x L over two depths, and the
    reports: files, keys, item counts, the claim, the stages in the history, a falling
    loss."""
    stages = ((128, 8, ("niah_single_1",)), (exp.TRAIN_LEN, 8, ("niah_single_1", "vt")))
    res = exp.run(True, tmp_path, stages=stages, tasks=("niah_single_1", "vt"), mults=(1, 2),
                  depths=(0.0, 1.0), n_per_cell=1, batch=8, log=lambda *a: None)
    assert res.numbers["steps"] == 16
    assert res.numbers["stages"] == [[128, 8, ["niah_single_1"]],
                                     [exp.TRAIN_LEN, 8, ["niah_single_1", "vt"]]]
    length_at = {r["step"]: r["length"] for r in res.numbers["history"]}
    assert [length_at[k] for k in (1, 8, 9, 16)] == [128, 128, exp.TRAIN_LEN, exp.TRAIN_LEN]
    ev = tmp_path / "eval"
    for name in ("results.json", "results.md", "niah_single_1_heatmap.png", "vt_heatmap.png"):
        assert (ev / name).stat().st_size > 0, name
    assert (tmp_path / "degradation.png").stat().st_size > 0
    report = json.loads((ev / "results.json").read_text())
    assert report["config"]["lengths"] == [256, 512]
    assert report["config"]["suite"] == "ruler_256"
    assert len(report["records"]) == 2 * 2 * 2
    for task in ("niah_single_1", "vt"):
        cells = report["summary"]["tasks"][task]["cells"]
        assert {(c["length"], c["depth"]) for c in cells} == {
            (n, d) for n in (256, 512) for d in (0.0, 1.0)}
        assert all(c["errors"] == 0 for c in cells)
    assert set(res.numbers["string_match_all"]) == {"niah_single_1", "vt"}
    assert len(res.numbers["string_match_all"]["vt"]) == 2
    assert [c.target for c in res.claims] == ["string_match_all ≥ 90% at 1× L"]
    assert "| niah_single_1 |" in res.notes
    assert {p.name for p in res.figures} >= {"degradation.png", "vt_heatmap.png"}
    losses = [r["loss"] for r in res.numbers["history"]]
    assert res.numbers["loss_last"] < res.numbers["loss_first"] - 0.5, losses
