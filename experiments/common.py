"""What every experiment returns: claims checked (claim, our number, holds or not),
numbers for the JSON report and figure paths for the markdown report."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lcjax.bench.timing import json_default, machine_info  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class Claim:
    """One checkable statement: what is claimed, the target, what we measured, verdict."""

    claim: str
    target: str
    ours: str
    holds: bool


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


def write_json(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=json_default))


def main(experiment: Experiment, argv=None) -> Result:
    """The command line of one experiment (``python -m experiments.<name>.experiment``):
    ``--full`` (else quick) and ``--out DIR``; runs it, prints its notes and every claim
    with its verdict, and returns the :class:`Result`."""
    import argparse

    parser = argparse.ArgumentParser(description=experiment.summary)
    parser.add_argument("--full", action="store_true", help="the full setting (else quick)")
    parser.add_argument("--out", type=Path, default=Path(f"/tmp/{experiment.name}_experiment"))
    args = parser.parse_args(argv)
    res = experiment.run(not args.full, args.out)
    print(res.notes)
    for c in res.claims:
        print(f"[{'HOLDS' if c.holds else 'FAILS'}] {c.claim}: ours {c.ours} "
              f"(target {c.target})")
    return res
