"""experiments/reproduce.py: discovery, --list, --only, quick budgets, the rebuilt index.

Fake experiments that take milliseconds stand in for the real ones (which take minutes).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments import reproduce
from experiments.common import TOTAL_QUICK_BUDGET_S, Claim, Experiment, Result

ROOT = Path(__file__).resolve().parents[1]


def _fake(name: str, budget: float | None = 60.0, *, sleep: float = 0.0, crash: bool = False,
          calls: list | None = None) -> Experiment:
    def run(quick: bool, out_dir: Path) -> Result:
        if calls is not None:
            calls.append((name, quick))
        time.sleep(sleep)
        if crash:
            raise RuntimeError(f"{name} broke")
        out_dir.mkdir(parents=True, exist_ok=True)
        fig = out_dir / "curve.png"
        fig.write_bytes(b"\x89PNG fake")
        return Result(claims=[Claim(f"{name} claim", "x > 1", f"x = {len(name)}",
                                    len(name) > 1)],
                      numbers={"x": len(name)}, figures=[fig], notes=f"notes of {name}")

    return Experiment(name=name, paper=f"paper {name}", summary=f"summary of {name}", run=run,
                      quick_budget_s=budget)


def test_list_runs_nothing(capsys, tmp_path):
    calls = []
    exps = [_fake("alpha", 30, calls=calls), _fake("beta", 45, calls=calls)]
    assert reproduce.main(["--list", "--out", str(tmp_path)], experiments=exps) == 0
    out = capsys.readouterr().out
    assert calls == [] and not (tmp_path / "index.md").exists()
    assert "alpha" in out and "30 s" in out and "beta" in out and "45 s" in out
    assert "paper beta — summary of beta" in out
    assert "quick budgets total 75 s" in out and "warning" not in out


def test_only_runs_the_named_ones_and_the_index_keeps_the_others(capsys, tmp_path):
    calls = []
    exps = [_fake("alpha", calls=calls), _fake("beta", calls=calls), _fake("gamma", calls=calls)]
    assert reproduce.main(["--quick", "--only", "gamma,alpha", "--out", str(tmp_path)],
                          experiments=exps) == 0
    assert calls == [("alpha", True), ("gamma", True)]  # discovery order, quick mode
    out = capsys.readouterr().out
    assert "wall time" in out and "within its 60 s quick budget" in out
    rec = json.loads((tmp_path / "alpha" / "quick" / "results.json").read_text())
    assert rec["quick"] and rec["within_budget"] is True and rec["quick_budget_s"] == 60
    assert rec["claims"][0]["claim"] == "alpha claim"
    assert rec["figures"] == ["alpha/quick/curve.png"]
    assert not (tmp_path / "beta").exists()
    index = (tmp_path / "index.md").read_text()
    assert "| alpha | quick | alpha claim | - | x > 1 | x = 5 | holds |" in index
    assert "Not run yet: `python experiments/reproduce.py --quick --only beta`" in index
    assert "![curve](alpha/quick/curve.png)" in index
    # a second --only run refreshes beta and keeps alpha's and gamma's sections
    assert reproduce.main(["--quick", "--only", "beta", "--out", str(tmp_path)],
                          experiments=exps) == 0
    index = (tmp_path / "index.md").read_text()
    for name in ("alpha", "beta", "gamma"):
        assert f"| {name} | quick | {name} claim |" in index and f"notes of {name}" in index
    assert "Not run yet" not in index


def test_over_budget_is_reported(capsys, tmp_path):
    exps = [_fake("slow", budget=0.01, sleep=0.05)]
    assert reproduce.main(["--quick", "--out", str(tmp_path)], experiments=exps) == 0
    out = capsys.readouterr().out
    assert "OVER its 0 s quick budget" in out
    rec = json.loads((tmp_path / "slow" / "quick" / "results.json").read_text())
    assert rec["within_budget"] is False


def test_full_run_has_no_budget(capsys, tmp_path):
    assert reproduce.main(["--out", str(tmp_path)], experiments=[_fake("alpha")]) == 0
    assert "full run (no budget)" in capsys.readouterr().out
    rec = json.loads((tmp_path / "alpha" / "results.json").read_text())
    assert rec["quick"] is False and rec["within_budget"] is None


def test_a_quick_run_never_overwrites_the_full_report(tmp_path):
    exps = [_fake("alpha")]
    assert reproduce.main(["--out", str(tmp_path)], experiments=exps) == 0
    full = (tmp_path / "alpha" / "results.json").read_text()
    assert reproduce.main(["--quick", "--out", str(tmp_path)], experiments=exps) == 0
    assert (tmp_path / "alpha" / "results.json").read_text() == full
    assert json.loads((tmp_path / "alpha" / "quick" / "results.json").read_text())["quick"]
    index = (tmp_path / "index.md").read_text()
    assert "| alpha | full | alpha claim |" in index and "| alpha | quick | alpha claim |" in index
    assert index.index("### full run") < index.index("### quick run")


def test_a_crash_is_reported_and_the_others_still_run(tmp_path):
    calls = []
    exps = [_fake("bad", crash=True, calls=calls), _fake("good", calls=calls)]
    assert reproduce.main(["--quick", "--out", str(tmp_path)], experiments=exps) == 1
    assert [c[0] for c in calls] == ["bad", "good"]
    rec = json.loads((tmp_path / "bad" / "quick" / "results.json").read_text())
    assert rec["crashed"] and rec["claims"][0]["holds"] is False
    assert "| bad | quick | experiment ran | - | no exception | crashed | **fails** |" in (
        (tmp_path / "index.md").read_text())


def test_unknown_only_name_is_a_usage_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        reproduce.main(["--only", "alpha,nope", "--out", str(tmp_path)],
                       experiments=[_fake("alpha")])
    assert exc.value.code == 2
    assert "unknown experiment(s) ['nope']; known: ['alpha']" in capsys.readouterr().err


def test_budget_rules():
    assert reproduce.budget_problems([_fake("a", 600), _fake("b", 600)]) == []
    problems = reproduce.budget_problems([_fake("a", None), _fake("b", TOTAL_QUICK_BUDGET_S)])
    assert problems == ["a declares no quick_budget_s"]
    over = reproduce.budget_problems([_fake("a", TOTAL_QUICK_BUDGET_S), _fake("b", 1)])
    assert over == [f"quick budgets add up to {TOTAL_QUICK_BUDGET_S + 1} s > "
                    f"{TOTAL_QUICK_BUDGET_S} s"]
    with pytest.raises(ValueError, match="`quick_budget_s` must be > 0"):
        _fake("zero", 0)


def test_discover_finds_folders(tmp_path, monkeypatch):
    pkg = tmp_path / "fakeexps"
    for name in ("two", "one"):
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text("")
        (pkg / name / "experiment.py").write_text(
            "from experiments.common import Experiment, Result\n"
            f"EXPERIMENT = Experiment({name!r}, 'p', 's', lambda q, o: Result(), "
            "quick_budget_s=5)\n")
    (pkg / "notes").mkdir()  # a folder without experiment.py is not an experiment
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = reproduce.discover(pkg, "fakeexps")
    assert [e.name for e in found] == ["one", "two"]


def test_the_real_experiments_fit_make_reproduce():
    """Every experiment in experiments/ declares a quick budget; together <= 25 min."""
    exps = reproduce.discover()
    assert {"lm_demo", "entmax"} <= {e.name for e in exps}
    assert reproduce.budget_problems(exps) == []
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "reproduce.py"), "--list"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert all(e.name in out.stdout for e in exps) and "warning" not in out.stdout


def test_three_verdicts_not_tested_is_never_fails(capsys, tmp_path):
    """A claim whose precondition is unmet is "not tested" in the printout, the JSON and the
    index, and the per-paper counts split holds / fails / not tested."""
    from experiments.common import not_tested

    def run(quick, out_dir):
        return Result(claims=[
            Claim("gain", "> 0", "+3", True, "both arms learned"),
            Claim("speed", ">= 2x", "1.5x", False),
            not_tested("extrapolation", "> 0", "softmax 12% at 1x", "both arms >= 90% at 1x"),
        ])

    exp = Experiment(name="tri", paper="Paper T", summary="three verdicts", run=run,
                     quick_budget_s=60)
    assert reproduce.main(["--quick", "--out", str(tmp_path)], experiments=[exp]) == 0
    out = capsys.readouterr().out
    assert "[NOT TESTED] extrapolation: ours not tested: softmax 12% at 1x" in out
    assert "[HOLDS] gain" in out and "[FAILS] speed" in out
    rec = json.loads((tmp_path / "tri" / "quick" / "results.json").read_text())
    assert [c["holds"] for c in rec["claims"]] == [True, False, None]
    assert rec["claims"][2]["precondition"] == "both arms >= 90% at 1x"
    index = (tmp_path / "index.md").read_text()
    assert ("| tri | quick | extrapolation | both arms >= 90% at 1x | > 0 | "
            "not tested: softmax 12% at 1x | *not tested* |") in index
    assert "| Paper T | tri | quick | 1 | 1 | 1 |" in index
    assert "**fails** |" in index and index.count("*not tested* |") == 1
