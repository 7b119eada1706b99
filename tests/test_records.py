"""The committed records stay small and the main job leaves the checkout clean: ``reports/``
keeps claims, aggregates and figures (<= 2 MB, no per-item lists, no quick runs, no run
caches); `make reproduce` writes under the untracked ``runs/``; the committed index is rebuilt
only with ``--write-index``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from experiments import reproduce
from experiments.common import QUICK_REPORTS, RECORDS, REPORTS, ROOT, records_dir

LIMIT_BYTES = 2_000_000


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def test_reports_fit_in_two_megabytes():
    sizes = {p: p.stat().st_size for p in _files(REPORTS)}
    total = sum(sizes.values())
    biggest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert total <= LIMIT_BYTES, (
        f"reports/ holds {total:,} bytes > {LIMIT_BYTES:,}; biggest: "
        + ", ".join(f"{p.relative_to(ROOT)} {sizes[p]:,}" for p in biggest)
        + " (python experiments/reproduce.py --write-index compacts it)")


def test_reports_hold_no_quick_runs_caches_or_per_item_lists():
    assert not [p for p in REPORTS.rglob("quick") if p.is_dir()]
    assert not (REPORTS / "entmax" / "runs").exists()
    for path in REPORTS.rglob("*.json"):
        kept, moved = reproduce.split_items(json.loads(path.read_text(encoding="utf-8")))
        assert not moved, f"{path.relative_to(ROOT)} holds a list of > {reproduce.ITEM_LIMIT}"


def test_runs_is_not_committed():
    res = subprocess.run(["git", "check-ignore", "runs/reports/x", "runs/records/x"],
                         cwd=ROOT, capture_output=True, text=True)
    if res.returncode == 128:
        pytest.skip(f"not a git checkout: {res.stderr.strip()}")
    assert res.stdout.split() == ["runs/reports/x", "runs/records/x"]


def test_quick_runs_write_outside_reports_and_full_runs_into_it():
    _, quick = reproduce.parse_args(["--quick"])
    _, full = reproduce.parse_args([])
    assert quick.out == QUICK_REPORTS and full.out == REPORTS
    assert records_dir(REPORTS / "entmax") == RECORDS / "entmax"
    assert records_dir(QUICK_REPORTS / "entmax") == (QUICK_REPORTS / "entmax").resolve()


def test_split_items_moves_long_lists_only():
    n = reproduce.ITEM_LIMIT
    value = {"a": list(range(n + 1)), "b": [{"c": list(range(n))}], "d": 3}
    kept, moved = reproduce.split_items(value)
    assert moved and kept["d"] == 3 and kept["b"] == [{"c": list(range(n))}]
    assert kept["a"] == f"[{n + 1} {reproduce.MOVED_NOTE}"
    assert reproduce.split_items(kept) == (kept, False)
    rows = [{"cell": i, "curve": list(range(n + 1))} for i in range(n + 2)]  # a table file
    kept, moved = reproduce.split_items(rows)
    assert moved and len(kept) == n + 2 and kept[0]["cell"] == 0
    assert isinstance(kept[0]["curve"], str)


def test_compact_json_keeps_the_whole_file_in_its_twin(tmp_path):
    path, twin = tmp_path / "r" / "results.json", tmp_path / "t" / "results.json"
    path.parent.mkdir()
    body = {"claims": [1, 2], "items": [{"i": i} for i in range(reproduce.ITEM_LIMIT + 5)]}
    path.write_text(json.dumps(body, indent=2))
    assert reproduce.compact_json(path, twin)
    assert json.loads(twin.read_text()) == body
    small = json.loads(path.read_text())
    assert small["claims"] == [1, 2] and isinstance(small["items"], str)
    assert not reproduce.compact_json(path, twin)  # idempotent
    path.write_text(json.dumps(dict(small, x=0.123456789)))  # compacted before, then edited
    assert reproduce.compact_json(path, twin)
    assert json.loads(twin.read_text()) == body  # the twin keeps the lists


def test_compact_json_rounds_floats_and_keeps_them_whole_in_its_twin(tmp_path):
    path, twin = tmp_path / "r" / "results.json", tmp_path / "t" / "results.json"
    path.parent.mkdir()
    body = {"x": 0.123456789012, "n": [3, 1e-300 * 7.123456789, float("nan")], "b": True,
            "i": 12345678901}
    path.write_text(json.dumps(body))
    assert reproduce.compact_json(path, twin)
    small = json.loads(path.read_text())
    assert small["x"] == 0.123457 and small["n"][0] == 3 and small["n"][1] == 7.12346e-300
    assert np.isnan(small["n"][2]) and small["b"] is True and small["i"] == 12345678901
    assert json.loads(twin.read_text())["x"] == body["x"]
    twin.write_text("kept")
    assert not reproduce.compact_json(path, twin)  # idempotent, the twin left alone
    assert twin.read_text() == "kept"


def test_compact_png_keeps_the_pixels_of_a_few_colour_plot(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    palette = rng.integers(0, 256, (12, 3), dtype=np.uint8)
    pixels = palette[rng.integers(0, 12, (120, 160))]
    pixels[:60] = palette[0]  # large flat areas, as in a plot
    path = tmp_path / "fig.png"
    Image.fromarray(pixels, "RGB").save(path, compress_level=0)
    before = path.stat().st_size
    assert reproduce.compact_png(path)
    assert path.stat().st_size < before
    with Image.open(path) as im:
        assert im.mode == "P"
        np.testing.assert_array_equal(np.asarray(im.convert("RGB")), pixels)
    assert not reproduce.compact_png(path)


def test_write_index_runs_nothing(tmp_path, capsys):
    calls = []

    def run(quick, out_dir):
        calls.append(quick)
        raise AssertionError("ran")

    exp = reproduce.Experiment(name="alpha", paper="P", summary="s", run=run,
                               quick_budget_s=1)
    (tmp_path / "alpha").mkdir()
    reproduce.write_json(tmp_path / "alpha" / "results.json", {
        "claims": [{"claim": "c", "target": "t", "ours": "o", "holds": True}],
        "seconds": 1.0, "quick": False, "figures": []})
    assert reproduce.main(["--write-index", "--out", str(tmp_path)], experiments=[exp]) == 0
    assert calls == []
    assert "| alpha | full | c | - | t | o | holds |" in (tmp_path / "index.md").read_text()
