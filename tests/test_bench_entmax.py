"""The α-entmax benchmark harness (`python -m experiments.entmax.bench`) at tiny sizes: the
step counting on
constructed rows (checked against an independent float64 bisection), the whole harness into
a temporary folder (files and fields), the skips (no `entmax` variant, no PyTorch peer) and
the command line."""

import json
import os
import shlex

import numpy as np
import pytest

from experiments.entmax import bench
from experiments.entmax.bench import (
    EntmaxBenchConfig,
    iteration_summary,
    row_iterations,
    run_entmax_benchmark,
)

TOL = 1e-5


def _bisect_steps(x, tol=TOL):
    """Halvings of [max z - 1, max z - n^{-1/2}] (z = x/2, α = 1.5) until |Σ[z - τ]₊² - 1| <
    tol, in float64; also the smallest distance of |f| to tol met on the way."""
    z = 0.5 * (x.astype(np.float64) - x.max())
    lo, hi = -1.0, -(len(x) ** -0.5)
    tau, steps, margin = 0.5 * (lo + hi), 0, np.inf
    while True:
        f = np.sum(np.maximum(z - tau, 0.0) ** 2) - 1.0
        margin = min(margin, abs(abs(f) - tol))
        if abs(f) < tol:
            return steps, margin
        lo, hi = (tau, hi) if f > 0 else (lo, tau)
        tau, steps = 0.5 * (lo + hi), steps + 1


def test_iteration_summary_counts():
    s = iteration_summary(np.array([[0, 0, 1], [2, 3, 7]]), within=2)
    assert s["counts"] == {"0": 2, "1": 1, "2": 1, "3": 1, "7": 1}
    assert s["rows"] == 6 and s["max"] == 7 and s["mean"] == pytest.approx(13 / 6)
    assert s["within"] == pytest.approx(4 / 6) and s["within_steps"] == 2
    assert iteration_summary(np.array([5, 5]), within=4)["within"] == 0.0


def test_row_iterations_on_constructed_rows():
    rng = np.random.default_rng(0)
    noisy = (2.0 * rng.normal(size=(16, 50))).astype(np.float32)
    # two tied maxima, the rest far below: support of 2, τ = max z - 1/√2; the power-mean
    # origin of the histogram solver is already exact, so it needs no step
    tied = np.full((1, 50), -30.0, np.float32)
    tied[0, :2] = 3.0
    rows = np.concatenate([noisy, tied])
    res = row_iterations(rows, tol=TOL)
    methods, raw = res["methods"], res["raw"]
    # bisection: the same count as an independent float64 bisection, on every row whose
    # |f| never comes within 1e-6 of tol (where float32 rounding could flip a stop)
    expected = [_bisect_steps(r) for r in rows]
    robust = [i for i, (_, margin) in enumerate(expected) if margin > 1e-6]
    assert len(robust) >= 10
    assert [int(raw["bisect"][i]) for i in robust] == [expected[i][0] for i in robust]
    assert raw["histogram"][-1] == 0
    assert np.all(raw["sort"] == 0) and methods["sort"]["counts"] == {"0": 17}
    assert methods["histogram"]["max"] <= 2 and methods["bisect"]["mean"] > 10
    for m in bench.METHODS:  # the float64 residual from the returned τ confirms every stop
        assert methods[m]["converged"] == 1.0 and methods[m]["residual_max"] < TOL
    assert methods["bisect"]["counts"] == {
        str(k): int(v) for k, v in zip(*np.unique(raw["bisect"], return_counts=True))}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_entmax")
    config = EntmaxBenchConfig(
        rows=128, row_len=64, scales=(1.0, 4.0),  # the shape of the model rows: one compile
        train_steps=2, train_batch=2, train_seq_len=32, model_dim=32, model_layers=2,
        model_heads=2, model_head_dim=16, model_windows=2, model_row_len=64,
        model_sparsity_lens=(64,),
        seq_lens=(64,), heads=2, head_dim=16, dense_max_len=64, block_q=32, block_kv=32,
        sparsity_tiles=(32,),
        peer_n=64, repeats=1, warmup=0, out_dir=str(out))
    return run_entmax_benchmark(config, log=lambda _: None)


def test_reports_written(result):
    files = result["files"]
    assert set(files) == {"json", "md", "entmax_iterations", "entmax_attention"}
    for path in files.values():
        assert os.path.getsize(path) > 0
    with open(files["json"]) as f:
        saved = json.load(f)
    for key in ("config", "command", "machine", "model", "iterations", "attention", "sparsity",
                "peer", "checks"):
        assert key in saved
    assert saved["machine"]["date"] and saved["machine"]["finished"]
    with open(files["md"]) as f:
        md = f.read()
    for text in ("## (a)", "## (b)", "## (c)", "## (d)", "## Targets", "entmax_iterations.png",
                 "| gaussian sigma=4 (128x64) | histogram |"):
        assert text in md


def test_iterations_part(result):
    part = result["iterations"]
    names = [s["source"] for s in part["sources"]]
    assert names == ["gaussian sigma=1", "gaussian sigma=4", "model layer 0", "model layer 1"]
    # model rows: the second half of the queries of each window, per head: 2 windows x 2
    # heads x 32 queries, each a causal row of 64 keys
    assert result["model"]["rows"] == {"0": [128, 64], "1": [128, 64]}
    for s in part["sources"]:
        assert s["methods"]["sort"]["max"] == 0
        assert sum(s["methods"]["histogram"]["counts"].values()) == s["rows"]
    assert part["pooled"]["all"]["histogram"]["rows"] == 2 * 128 + 2 * 128
    timing = part["timing"]["random"]["stats"]
    assert set(timing) == {"entmax a=1.5 histogram", "entmax a=1.5 bisect",
                           "entmax a=1.5 sort", "jax.nn.softmax"}
    assert timing["jax.nn.softmax"]["over_softmax"] == 1.0
    (c_random, c_model) = [c for c in result["checks"] if c["name"] == "histogram_within"]
    assert c_random["value"] == part["pooled"]["random"]["histogram"]["within"]
    assert c_random["pass"] == (c_random["value"] >= 0.99)


@pytest.mark.skipif("entmax" not in bench.attn.available(),
                    reason="the 'entmax' attention variant is not registered")
def test_attention_and_sparsity_parts(result):
    (row,) = result["attention"]["rows"]
    assert row["seq_len"] == 64
    for key in ("forward", "fwd_bwd"):
        for base in ("blockwise", "softmax"):
            assert row[f"{key}_entmax_over_{base}"] == pytest.approx(
                row["entmax"][key]["median_s"] / row[base][key]["median_s"])
        assert row["entmax"][key]["temp_bytes"] is not None
    sp = result["sparsity"]
    assert [(r["seq_len"], r["tile"]) for r in sp["random"]] == [(64, 32)]
    assert [(r["seq_len"], r["layer"], r["tile"]) for r in sp["model"]] == [
        (64, 0, 32), (64, 1, 32)]
    for r in sp["random"] + sp["model"]:
        assert 0.0 <= r["block_sparsity"] <= 1.0


def test_peer_part(result):
    peer = result["peer"]
    if bench.peer_missing():
        assert "make bench-entmax" in peer["skipped"]
        return
    rows = {r["function"]: r for r in peer["rows"]}
    assert set(rows) == {"entmax15", "sparsemax", "entmax_bisect α=1.5", "softmax"}
    for r in rows.values():
        assert r["max_abs_diff"] < 1e-4 and r["ours_s"] > 0 and r["peer_s"] > 0
    names = {c["name"] for c in result["checks"]}
    assert {"peer_entmax15_speedup", "entmax15_over_softmax"} <= names


def test_skips_without_variant_or_peer(monkeypatch):
    monkeypatch.setattr(bench, "_entmax_available", lambda: "not registered (test)")
    monkeypatch.setattr(bench, "peer_missing", lambda: ["torch", "entmax"])
    logged = []
    res = run_entmax_benchmark(
        EntmaxBenchConfig(parts=("attention", "sparsity", "peer"), train_steps=0,
                          out_dir=None), log=logged.append)
    assert res["attention"] == {"skipped": "not registered (test)"} == res["sparsity"]
    assert "pip install -e '.[peer]'" in res["peer"]["skipped"] and res["checks"] == []
    assert "model" not in res and any("make bench-entmax" in line for line in logged)


def test_command_round_trip():
    config = EntmaxBenchConfig.quick(parts=("iterations", "peer"), scales=(0.5, 2.0),
                                     out_dir=None)
    argv = shlex.split(bench.config_to_command(config))[3:]  # python -m experiments...
    assert bench.config_from_args(bench.parse_args(argv)) == config
    argv = ["--quick", "--seq-lens", "64,128", "--out", "none"]
    assert bench.config_from_args(bench.parse_args(argv)) == (
        EntmaxBenchConfig.quick(seq_lens=(64, 128), out_dir=None))
    with pytest.raises(ValueError, match="unknown parts"):
        EntmaxBenchConfig(parts=("iterations", "nope"))


def test_cli_iterations_only(tmp_path, capsys):
    argv = ["--parts", "iterations", "--rows", "128", "--row-len", "64",
            "--scales", "1", "--train-steps", "0", "--repeats", "1", "--warmup", "0",
            "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| gaussian sigma=1 (128x64) | histogram |" in printed and "PASS" in printed
    assert sorted(os.listdir(tmp_path)) == ["entmax.json", "entmax.md", "entmax_iterations.png"]


# ----------------------------------------------------------------------------
# (e) the block-sparsity sweep
# ----------------------------------------------------------------------------
def test_crossing_point_interpolates_past_the_last_ratio_above_one():
    # sorted by sparsity; 1.2 at 0.5 and 0.8 at 0.7: 1.0 is crossed at 0.5 + 0.2/0.4 * 0.2
    pts = [(0.9, 0.5), (0.1, 2.0), (0.7, 0.8), (0.5, 1.2)]
    assert bench.crossing_point(pts) == pytest.approx(0.6)
    # non-monotone: the crossing is past the last point above 1 (0.4), not the first dip
    assert bench.crossing_point([(0.2, 0.9), (0.4, 1.1), (0.8, 0.9)]) == pytest.approx(0.6)
    assert bench.crossing_point([(0.1, 2.0), (0.9, 1.5)]) is None  # never crosses
    assert bench.crossing_point([(0.3, 0.9), (0.6, 0.7)]) == 0.3  # below 1 throughout
    rows = [{"seq_len": 64, "block_sparsity": s, "forward_ratio": 3.0, "fwd_bwd_ratio": r}
            for s, r in pts]
    fwd, fb = bench.sweep_crossings(rows)
    assert (fwd["time"], fwd["crossing"], fwd["below"]) == ("forward", None, False)
    assert fb["crossing"] == pytest.approx(0.6) and fb["worst_ratio_at_60"] == 0.8
    assert fb["between"] == [0.5, 0.7] and fwd["between"] is None
    assert fwd["worst_ratio_at_60"] == 3.0 and fb["points"] == 4


def test_locality_inputs_are_local():
    """RoPE'd q, k with a locality scale: the mean score on the diagonal is λ²|c|² (+ noise)
    and 200 positions away λ² Σ_m |c_m|² cos(200 θ_m), lower by the high frequencies'
    share (the low ones barely turn over 200 positions); λ = 0: no structure."""
    def diag_and_far(lam):
        q, k, v, cot = bench.locality_inputs(256, 2, 16, lam, seed=1)
        s = np.einsum("bthd,bshd->bhts", np.asarray(q), np.asarray(k))
        idx = np.arange(256)
        return s[..., idx, idx].mean(), s[..., idx[200:], idx[200:] - 200].mean()

    d0, f0 = diag_and_far(0.0)
    d3, f3 = diag_and_far(3.0)
    assert abs(d0) < 3 and abs(f0) < 3  # N(0, 1) q, k: scores ~ N(0, 16)
    assert d3 > 9 * 16 * 0.5 and d3 - f3 > 20


@pytest.fixture(scope="module")
def sweep_result(tmp_path_factory):
    """A sweep at T = 256 (tiles 32) on two locality scales and the one layer of a
    (randomly initialised, to keep the test short) entmax DecoderLM."""
    from flax import nnx

    from lcjax.data import VOCAB_SIZE
    from lcjax.nn import DecoderConfig, DecoderLM
    from lcjax.train import TrainConfig

    def untrained_model(config, log):
        cfg = DecoderConfig(vocab_size=VOCAB_SIZE, d_model=16, num_layers=1, num_heads=1,
                            num_kv_heads=1, head_dim=16, mlp_hidden=32, max_len=256,
                            attention="entmax")
        info = {"model": "untrained (test)", "train": {}, "train_s": 0.0, "first_loss": 0.0,
                "final_loss": 0.0}
        return DecoderLM(cfg, rngs=nnx.Rngs(0)), info, TrainConfig()

    out = tmp_path_factory.mktemp("bench_entmax_sweep")
    config = EntmaxBenchConfig(
        parts=("sweep",), sweep_seq_lens=(256,), sweep_heads=1, sweep_head_dim=16,
        sweep_locality=(0.0, 4.0), sweep_train_steps=1, block_q=32, block_kv=32,
        sweep_repeats=1, out_dir=str(out))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench, "_sweep_model", untrained_model)
        return run_entmax_benchmark(config, log=lambda _: None)


def test_sweep_part(sweep_result):
    files = sweep_result["files"]
    assert set(files) == {"json", "md", "entmax_sweep"}
    assert os.path.basename(files["json"]) == "entmax_sweep.json"  # not entmax.json
    for path in files.values():
        assert os.path.getsize(path) > 0
    sweep = sweep_result["sweep"]
    rows = {r["label"]: r for r in sweep["rows"]}
    assert set(rows) == {"locality 0", "locality 4", "model layer 0"}
    for r in rows.values():
        assert r["shape"] == [1, 256, 1, 16] and 0.0 <= r["block_sparsity"] <= 1.0
        m = r["median_s"]
        assert r["forward_ratio"] == pytest.approx(m["entmax fwd"] / m["blockwise fwd"])
        assert r["fwd_bwd_ratio"] == pytest.approx(m["entmax fwd+bwd"]
                                                   / m["blockwise fwd+bwd"])
    # the locality scale controls the sparsity: N(0, 1) inputs keep every tile live,
    # λ = 4 leaves tiles far from the diagonal without weight
    assert rows["locality 0"]["block_sparsity"] == 0.0
    assert rows["locality 4"]["block_sparsity"] > 0.1
    assert [(c["seq_len"], c["time"]) for c in sweep["crossings"]] == [
        (256, "forward"), (256, "fwd_bwd")]
    (check_,) = [c for c in sweep_result["checks"] if c["name"] == "sweep_fwd_bwd_over_blockwise"]
    assert check_["value"] == sweep["crossings"][1]["worst_ratio_at_60"]
    with open(files["md"]) as f:
        md = f.read()
    assert "## (e)" in md and "Crossing points" in md and "| locality 4 | 256 |" in md


def test_sweep_flag():
    argv = ["--sweep", "--sweep-seq-lens", "1024", "--out", "none"]
    config = bench.config_from_args(bench.parse_args(argv))
    assert config.parts == ("sweep",) and config.sweep_seq_lens == (1024,)
    assert EntmaxBenchConfig().parts == bench.DEFAULT_PARTS and "sweep" in bench.PARTS
    assert bench.report_stem(("sweep",)) == "entmax_sweep"
    assert bench.report_stem(bench.DEFAULT_PARTS) == "entmax"
