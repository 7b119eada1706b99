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


@dataclass(frozen=True)
class Experiment:
    """A registered experiment: ``run(quick, out_dir) -> Result``."""

    name: str
    paper: str
    summary: str
    run: Callable[[bool, Path], Result]


def write_json(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=json_default))
