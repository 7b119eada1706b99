"""The benchmark harness (`lcjax.bench.harness`) and benchmarks as data: a variant registered
as a spec is picked up by `lcjax bench attention` with no other edit, its error is measured
against its own spec reference, an implementation that cannot serve is a skipped row, and
every row's rerun command rebuilds exactly that row."""

import json
import math
import shlex

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcjax import attention as attn
from lcjax.bench import report, timing
from lcjax.bench.attention import AttentionBenchConfig, cases, row_command
from lcjax.bench.cli import config_from_args
from lcjax.bench.harness import Case, add_speedups, make_inputs, reference_outputs, run_cases
from lcjax.cli import build_parser, main

TOY = "toy_double_scale"


def _toy_impl(q, k, v, *, causal=False, scale=None, return_aux=False, **_):
    """Softmax attention at twice the default scale: deliberately NOT its reference."""
    out = attn.dot_product_attention(q, k, v, causal=causal, scale=2.0 / math.sqrt(q.shape[-1]))
    return (out, {}) if return_aux else out


def _toy_reference(q, k, v, *, causal=False, scale=None, **_):
    """The toy's declared reference: softmax attention at three times the default scale."""
    return attn.dot_product_attention(q, k, v, causal=causal, scale=3.0 / math.sqrt(q.shape[-1]))


def _cannot_serve(q, k, v, **_):
    raise NotImplementedError("needs a GPU (test)")


@pytest.fixture
def toy():
    """A toy spec registered for one test; its reference is not softmax attention, so an
    error against the spec's reference differs from one against softmax."""
    spec = attn.register(attn.AttentionSpec(
        TOY, reference=_toy_reference,
        implementations=(attn.Implementation("gpu", _cannot_serve),
                         attn.Implementation("xla", _toy_impl)),
        description="test: softmax at twice the scale"))
    yield spec
    attn.unregister(TOY)


def _dense(q, k, v, scale):
    """Independent causal softmax attention with jax.nn (GQA-free shapes)."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                        implementation="xla")


def test_registered_spec_is_benchmarked_with_no_other_edit(toy, tmp_path):
    rc = main(["bench", "attention", "--seq-lens", "16", "--heads", "2", "--head-dim", "8",
               "--repeats", "1", "--warmup", "0", "--no-backward", "--matmul-n", "32",
               "--out", str(tmp_path)])
    assert rc == 0
    saved = json.loads((tmp_path / "attention.json").read_text())
    assert saved["config"]["variants"] is None  # the registry's list, not a hand-kept one
    (row,) = [r for r in saved["records"] if r["variant"] == TOY]
    assert row["status"] == "ok", row
    assert row["reference"].endswith("_toy_reference")
    # the error is against the spec's own reference: recompute it independently
    q, k, v, _ = make_inputs(Case(TOY, 16, heads=2, head_dim=8), seed=0)
    toy_out = _dense(q, k, v, 2 / math.sqrt(8))
    expected = float(jnp.max(jnp.abs(toy_out - _dense(q, k, v, 3 / math.sqrt(8)))))
    vs_softmax = float(jnp.max(jnp.abs(toy_out - _dense(q, k, v, 1 / math.sqrt(8)))))
    assert np.isfinite(row["max_abs_err"]) and expected > 1e-2
    assert abs(expected - vs_softmax) > 1e-3
    assert row["max_abs_err"] == pytest.approx(expected, abs=1e-5)
    assert row["forward"]["median_s"] > 0 and row["forward"]["temp_bytes"] is not None
    jax_row = next(r for r in saved["records"] if r["variant"] == "jax")
    assert row["fwd_speedup_vs_anchor"] == pytest.approx(
        jax_row["forward"]["median_s"] / row["forward"]["median_s"])
    assert f"| {TOY} | 16 |" in (tmp_path / "attention.md").read_text()


def test_each_implementation_and_skips(toy):
    config = AttentionBenchConfig(variants=(TOY, "jax"), seq_lens=(8,), heads=2, head_dim=8,
                                  backward=False, each_implementation=True, out_dir=None)
    todo = cases(config)
    assert [c.name for c in todo] == [f"{TOY}@gpu", f"{TOY}@xla", "jax"]
    records = run_cases(todo, repeats=1, warmup=0, log=lambda _: None)
    gpu, xla, _ = records
    assert gpu["status"] == "skipped" and "needs a GPU (test)" in gpu["reason"]
    assert xla["status"] == "ok" and xla["max_abs_err"] > 1e-2
    with pytest.raises(ValueError, match="implementation"):
        cases(AttentionBenchConfig(variants=(f"{TOY}@tpu",), out_dir=None))
    with pytest.raises(ValueError, match="unknown attention variant"):
        cases(AttentionBenchConfig(variants=("no_such_variant",), out_dir=None))


def test_row_command_rebuilds_the_row(toy):
    config = AttentionBenchConfig(
        variants=("softmax", "bw=blockwise", f"{TOY}@xla"), seq_lens=(64, 128), heads=4,
        kv_heads=2, head_dim=16, causal=False, repeats=2, backward=False,
        options={"bw": {"block_q": 32}}, max_len={"softmax": 64}, ref_slice=16, out_dir=None)
    for case in cases(config):
        argv = shlex.split(row_command(config, case))[1:]
        again = config_from_args(build_parser(argv).parse_args(argv))
        assert cases(again) == [case]
        assert (again.repeats, again.ref_slice, again.seed) == (2, 16, 0)


def test_reference_slice_beyond_ref_max_len():
    case = Case("softmax", 32, heads=2, head_dim=8, backward=True)
    q, k, v, cot = make_inputs(case, seed=3)
    ref = reference_outputs(case, q, k, v, cot, ref_max_len=16, ref_slice=8)
    assert ref["method"] == "last 8 rows" and ref["start"] == 24 and ref["grads"] is None
    full = _dense(q, k, v, 1 / math.sqrt(8))
    np.testing.assert_allclose(ref["out"], full[:, 24:], atol=1e-5)
    full_ref = reference_outputs(case, q, k, v, cot, ref_max_len=32)
    assert full_ref["method"] == "full" and len(full_ref["grads"]) == 3
    np.testing.assert_allclose(full_ref["out"], full, atol=1e-5)


def test_case_checks_and_speedups():
    with pytest.raises(ValueError, match="kv_heads"):
        Case("softmax", 8, heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="seq_len"):
        Case("softmax", 0)
    shape = {"seq_len": 8, "batch": 1, "heads": 2, "kv_heads": 2, "head_dim": 8,
             "dtype": "float32", "causal": True}
    recs = [{"variant": "jax", "status": "ok", **shape, "forward": {"median_s": 3.0}},
            {"variant": "x", "status": "ok", **shape, "forward": {"median_s": 1.5},
             "fwd_bwd": {"median_s": 1.0}},
            {"variant": "y", "status": "ok", **{**shape, "seq_len": 16},
             "forward": {"median_s": 1.0}}]
    add_speedups(recs, "jax")
    assert recs[0]["fwd_speedup_vs_anchor"] == 1.0 and recs[1]["fwd_speedup_vs_anchor"] == 2.0
    assert "fwd_bwd_speedup_vs_anchor" not in recs[1]  # the anchor has no fwd+bwd here
    assert "fwd_speedup_vs_anchor" not in recs[2]  # no anchor at T=16


def test_report_helpers():
    targets = {"fast": (2.0, ">="), "small": (0.5, "<=")}
    assert report.check(targets, "fast", 2.0)["pass"] is True
    assert report.check(targets, "small", 0.6)["pass"] is False
    assert report.check(targets, "small", None)["pass"] is None
    assert report.command_line(["lcjax"], [("--a", (1, 0.5)), ("--b", None), ("--c", False),
                                           ("--d", True), ("--e", "x y")]) == (
        "lcjax --a 1,0.5 --no-c --d --e 'x y'")
    stats, outs = timing.time_interleaved(
        {"sum": (jnp.sum, (jnp.arange(4.0),), True), "py": (sum, ([1, 2],), False)},
        repeats=3, warmup=1)
    assert float(outs["sum"]) == 6.0 and outs["py"] == 3
    assert len(stats["sum"]["times_s"]) == 3 and stats["py"]["compile_s"] is None
    assert stats["sum"]["median_s"] == sorted(stats["sum"]["times_s"])[1]


def test_results_json_and_cli_args(tmp_path):
    import argparse

    args = argparse.Namespace(seq_lens=(1024, 2048), out=str(tmp_path), repeats=2, fn=len,
                              dtype="float32")
    kept = report.cli_args(args)
    assert kept == {"seq_lens": (1024, 2048), "out": str(tmp_path), "repeats": 2,
                    "dtype": "float32"}
    result = {"rows": [{"t": np.float32(1.5), "a": np.arange(3)}], "args": kept}
    path = report.write_results_json(result, str(tmp_path / "sub"))
    assert json.loads(open(path).read()) == {
        "rows": [{"t": 1.5, "a": [0, 1, 2]}], "args": {**kept, "seq_lens": [1024, 2048]}}
    assert report.write_results_json(result, "none") is None
    assert report.write_results_json(result, "") is None
