"""``python -m experiments.flashblock.bench`` (experiments.flashblock.bench) at tiny shapes:
the per-block ratio
is the formula of its timings, the split output equals the dense one, and the CLI writes
flashblock.json and flashblock.md with the rerun command and every history's row."""

import argparse
import json

import pytest

from experiments.flashblock import bench as fb


def test_attention_rows_ratio_and_error():
    rows = fb.attention_rows((8, 16), block_size=4, steps=4, heads=2, kv_heads=1, head_dim=8,
                             repeats=1, sparse_keep=0.5, log=lambda *a, **k: None)
    assert [r["history"] for r in rows] == [8, 16]
    for r in rows:
        no_reuse = 4 * min(r["exact_s"], r["split_s"])
        assert r["block_ratio"] == pytest.approx(no_reuse / (r["split_s"] + 3 * r["reuse_s"]))
        assert r["residual_block_ratio"] == pytest.approx(
            no_reuse / (r["residual_refresh_s"] + 3 * r["residual_step_s"]))
        assert r["split_max_abs_error"] < 1e-5
        assert r["sparse_keep"] == r["history"] // 2


def test_cli_writes_json_and_markdown(tmp_path):
    out = tmp_path / "fb"
    parser = argparse.ArgumentParser()
    fb.add_arguments(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(["flashblock", "--histories", "8,16", "--heads", "2",
                              "--head-dim", "8", "--repeats", "1", "--sample-histories", "",
                              "--out", str(out)])
    assert fb.run_cli(args) == 0
    result = json.loads((out / "flashblock.json").read_text())
    md = (out / "flashblock.md").read_text()
    assert result["command"].startswith("python -m experiments.flashblock.bench --histories 8,16")
    assert "--sample-histories" not in result["command"]
    assert len(result["load_average"]["before"]) == 3
    table = [line for line in md.splitlines() if line.startswith("| 8 ") or
             line.startswith("| 16 ")]
    assert len(table) == 2 and all(line.count("|") == 7 for line in table)
    assert f"{result['attention'][1]['block_ratio']:.2f}x" in table[1]
    assert result["command"] in md and "## Sampling" not in md

