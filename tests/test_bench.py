"""Smoke tests of the attention benchmark harness (`lcjax bench attention`) at tiny sizes."""

import json
import os
import shlex

import pytest

from lcjax.bench import AttentionBenchConfig, attention_flops, headline, run_attention_benchmark
from lcjax.bench.attention import config_to_command, parse_options
from lcjax.bench.cli import config_from_args
from lcjax.cli import build_parser, main

B, H, D = 1, 2, 16


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bench")
    config = AttentionBenchConfig(
        variants=("softmax", "blockwise", "jax"),
        seq_lens=(64, 128),
        batch=B, heads=H, head_dim=D,
        repeats=1, warmup=0,
        options={"blockwise": {"block_q": 32, "block_kv": 32}},  # several blocks per T
        max_len={"softmax": 64},
        ref_max_len=64, ref_slice=32,  # T=128 checks a slice of rows against the reference
        matmul_n=256,
        out_dir=str(out_dir),
    )
    return run_attention_benchmark(config, log=lambda _: None)


def _record(result, variant, seq_len):
    (rec,) = [r for r in result["records"] if r["variant"] == variant and r["seq_len"] == seq_len]
    return rec


def test_files_written(result):
    files = result["files"]
    assert sorted(files) == ["attention", "json", "md"]  # attention: the PNG
    for path in files.values():
        assert os.path.getsize(path) > 0
    with open(files["json"]) as f:
        saved = json.load(f)
    for key in ("config", "command", "machine", "matmul", "floors", "records", "headline"):
        assert key in saved
    for key in ("platform", "cpu_count", "jax", "date", "backend"):
        assert saved["machine"][key]
    assert saved["matmul"]["gflops"] > 0
    with open(files["md"]) as f:
        markdown = f.read()
    assert "| blockwise | 128 |" in markdown and "Headline" in markdown


def test_records_measured(result):
    for seq_len in (64, 128):
        for variant in ("blockwise", "jax"):
            rec = _record(result, variant, seq_len)
            assert rec["status"] == "ok", rec
            for key in ("forward", "fwd_bwd"):
                stats = rec[key]
                assert stats["median_s"] > 0 and stats["compile_s"] > 0
                assert stats["temp_bytes"] is not None and len(stats["times_s"]) == 1
    assert _record(result, "blockwise", 64)["options"] == {"block_q": 32, "block_kv": 32}
    assert _record(result, "softmax", 64)["max_abs_err"] == 0.0
    assert _record(result, "softmax", 128)["status"] == "skipped"  # over its max_len


def test_blockwise_matches_reference(result):
    full, sliced = _record(result, "blockwise", 64), _record(result, "blockwise", 128)
    assert full["err_method"] == "full" and sliced["err_method"] == "last 32 rows"
    assert full["max_abs_err"] < 1e-4
    assert full["grad_max_abs_err"] < 1e-4
    assert sliced["max_abs_err"] < 1e-4
    assert "grad_max_abs_err" not in sliced  # no dense gradients beyond ref_max_len
    assert _record(result, "jax", 128)["max_abs_err"] < 1e-4


def test_floor_arithmetic(result):
    # causal: 4·B·H·T²·D / 2 — two matmuls over half the score matrix
    assert attention_flops(1, 8, 8192, 8192, 64, causal=True) == 68_719_476_736  # 68.7 GFLOP
    assert attention_flops(1, 8, 8192, 8192, 64, causal=False) == 2 * 68_719_476_736
    gflops = result["matmul"]["gflops"]
    for floor in result["floors"]:
        t = floor["seq_len"]
        assert floor["flops"] == 2 * B * H * t * t * D
        assert floor["floor_s"] == pytest.approx(floor["flops"] / (gflops * 1e9))
        rec = _record(result, "blockwise", t)
        assert rec["fwd_over_floor"] == pytest.approx(rec["forward"]["median_s"] / floor["floor_s"])
    mm = result["matmul"]
    assert gflops == max(mm["before"]["gflops"], mm["after"]["gflops"])
    assert mm["before"]["flops"] == 2 * 256**3


def test_headline_at_largest_common_length(result):
    head = result["headline"]
    assert head["seq_len"] == 128 and not head["is_headline_config"]
    assert [c["name"] for c in head["checks"]] == ["speedup", "memory_ratio", "floor_ratio"]


def _fake_result(anchor_s, cand_s, anchor_mem, cand_mem, gflops=100.0):
    """A result dict at the target configuration with chosen times and memory."""
    flops = attention_flops(1, 8, 8192, 8192, 64, causal=True)
    config = AttentionBenchConfig(seq_lens=(8192,))

    def rec(label, seconds, mem):
        return {"variant": label, "seq_len": 8192, "status": "ok",
                "forward": {"median_s": seconds, "temp_bytes": mem}}

    return {
        "config": {**config.__dict__},
        "matmul": {"gflops": gflops},
        "floors": [{"seq_len": 8192, "flops": flops, "floor_s": flops / (gflops * 1e9)}],
        "records": [rec("jax", anchor_s, anchor_mem), rec("blockwise", cand_s, cand_mem)],
    }


def test_headline_verdicts():
    # floor = 68.7 GFLOP / 100 GFLOP/s = 0.687 s
    good = headline(_fake_result(5.0, 1.0, 4 << 30, 32 << 20))
    assert good["is_headline_config"]
    assert [c["pass"] for c in good["checks"]] == [True, True, True]
    assert good["checks"][0]["value"] == pytest.approx(5.0)
    bad = headline(_fake_result(5.0, 2.0, 4 << 30, 128 << 20))
    assert [c["pass"] for c in bad["checks"]] == [False, False, False]  # 2.5x, 1/32, 2.9x


def test_options_and_command_round_trip():
    assert parse_options(["blockwise:block_q=256,block_kv=128", "x:flag=true,name=abc"]) == {
        "blockwise": {"block_q": 256, "block_kv": 128}, "x": {"flag": True, "name": "abc"}}
    config = AttentionBenchConfig(
        variants=("jax", "bw=blockwise"), seq_lens=(256, 512), causal=False, repeats=3,
        options={"bw": {"block_q": 128}}, max_len={"jax": 4096}, out_dir=None)
    argv = shlex.split(config_to_command(config))[1:]
    assert config_from_args(build_parser(argv).parse_args(argv)) == AttentionBenchConfig(
        **{**config.__dict__, "max_len": {"softmax": 4096, "jax": 4096}})


def test_cli_quick_run(tmp_path, capsys):
    rc = main(["bench", "attention", "--variants", "blockwise", "--seq-lens", "64",
               "--heads", "2", "--head-dim", "16", "--repeats", "1", "--warmup", "0",
               "--no-backward", "--matmul-n", "128", "--out", str(tmp_path)])
    assert rc == 0
    assert (tmp_path / "attention.json").exists()
    printed = capsys.readouterr().out
    assert "| blockwise | 64 |" in printed and "not measured" in printed
