"""experiments/gpu_check.py on CPU (interpret mode, tiny shapes), so it never rots.

A toy kernel — softmax attention as one ``pallas_call`` per (batch, head), its backward
through the XLA reference — is registered as a temporary spec; a second spec whose
"pallas" output is scaled by (1 + ε) checks that the harness measures exactly that error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from experiments import gpu_check
from lcjax import attention
from lcjax.attention import AttentionSpec, Features, Implementation, dot_product_attention

ROOT = Path(__file__).resolve().parents[1]
EPS = 0.1  # above the bfloat16 tolerance (3e-2), so both dtypes must fail


def _toy_kernel(q_ref, k_ref, v_ref, o_ref, *, scale: float, causal: bool):
    q, k, v = (r[...].astype(jnp.float32) for r in (q_ref, k_ref, v_ref))  # [T, D]
    s = jnp.dot(q, k.T) * scale
    if causal:
        rows = jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(cols <= rows, s, -1e30)
    p = jnp.exp(s - jnp.max(s, axis=1, keepdims=True))
    o_ref[...] = (jnp.dot(p, v) / jnp.sum(p, axis=1, keepdims=True)).astype(o_ref.dtype)


def _toy_forward(q, k, v, causal: bool, scale: float):
    b, t, h, d = q.shape
    spec = pl.BlockSpec((None, None, t, d), lambda i, j: (i, j, 0, 0))
    out = pl.pallas_call(
        lambda *refs: _toy_kernel(*refs, scale=scale, causal=causal), grid=(b, h),
        in_specs=[spec] * 3, out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((b, h, t, d), q.dtype), interpret=True,
    )(*(jnp.swapaxes(x, 1, 2) for x in (q, k, v)))
    return jnp.swapaxes(out, 1, 2)


def _toy_attention(q, k, v, causal, scale):
    @jax.custom_vjp
    def f(q, k, v):
        return _toy_forward(q, k, v, causal, scale)

    def ref(q, k, v):
        return dot_product_attention(q, k, v, causal=causal, scale=scale)

    f.defvjp(lambda q, k, v: (f(q, k, v), (q, k, v)),
             lambda res, g: jax.vjp(ref, *res)[1](g))
    return f(q, k, v)


def _impl(fn, factor: float = 1.0):
    def impl(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
             kv_segment_ids=None, return_aux=False):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        out = fn(q, k, v, causal, scale) * factor
        return (out, {}) if return_aux else out

    return impl


def _xla(q, k, v, causal, scale):
    return dot_product_attention(q, k, v, causal=causal, scale=scale)


TOY_FEATURES = Features(mask=False, segment_ids=False, gqa=False, cross=False)


@pytest.fixture
def toy_specs():
    specs = {
        "toy_softmax": (_impl(_toy_attention), "toy softmax kernel"),
        "toy_scaled": (_impl(_toy_attention, 1.0 + EPS), "kernel output scaled by 1 + eps"),
    }
    for name, (fn, desc) in specs.items():
        attention.register(AttentionSpec(
            name, reference=dot_product_attention, features=TOY_FEATURES, description=desc,
            implementations=(Implementation("pallas", fn), Implementation("xla", _impl(_xla)))))
    yield sorted(specs)
    for name in specs:
        attention.unregister(name)


def _load(stem: Path) -> dict:
    assert stem.with_suffix(".md").exists()
    return json.loads(stem.with_suffix(".json").read_text())


def test_report_rows_for_a_toy_kernel(toy_specs, tmp_path):
    stem = gpu_check.main(["--cpu-smoke", "--specs", "toy_softmax", "--lengths", "32",
                           "--out", str(tmp_path)])
    data = _load(stem)
    assert data["status"] == "complete"
    assert stem.name.endswith(gpu_check.device_slug())
    assert data["header"]["machine"]["device_kind"] == jax.devices()[0].device_kind
    assert data["header"]["kernels"] == ["toy_softmax"]
    rows = {(r["spec"], r["dtype"], r["causal"]): r for r in data["correctness"]}
    assert set(rows) == {("toy_softmax", d, c) for d in ("float32", "bfloat16")
                         for c in (True, False)}
    for (_, dtype, _), row in rows.items():  # the kernel computes what the XLA path does
        assert row["ok"], row
        assert row["fwd"]["rel"] < (1e-5 if dtype == "float32" else 2e-2)
        assert row["fwd"]["ref_max"] > 0.1
    timed = {(r["spec"], r["implementation"], r["mode"], r["T"]) for r in data["timing"]
             if r.get("median_s", 0) > 0}
    variants = [("toy_softmax", "pallas"), ("toy_softmax", "xla"), (gpu_check.BASELINE, "xla")]
    assert timed == {(s, i, m, 32) for s, i in variants for m in ("fwd", "fwd+bwd")}
    md = stem.with_suffix(".md").read_text()
    assert "toy_softmax" in md and "Status: **complete**" in md and "**no**" not in md


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_errors_of_a_wrong_kernel_are_measured(toy_specs, dtype):
    # out·(1+ε) - out = ε·out, so max |diff| / max |out| = ε, and the same for the gradients
    spec = attention.spec("toy_scaled")
    row = gpu_check.check_one(spec, dtype, True, gpu_check.SMOKE_PLAN)
    assert not row["ok"]
    rtol = 1e-3 if dtype == "float32" else 0.1
    for what in ("fwd", "dq", "dk", "dv"):
        assert row[what]["rel"] == pytest.approx(EPS, rel=rtol), (what, row)
    assert "FAIL" in gpu_check.format_check(row)


def test_zero_budget_skips_everything_and_still_reports(toy_specs, tmp_path):
    stem = gpu_check.main(["--cpu-smoke", "--specs", "toy_softmax", "--time-budget", "0",
                           "--out", str(tmp_path)])
    data = _load(stem)
    assert data["status"] == "complete"
    assert data["correctness"] and all("skipped" in r for r in data["correctness"])
    assert data["timing"] and all("time budget of 0 s spent" == r["skipped"]
                                  for r in data["timing"])


def test_estimate_and_skip_rules():
    plan = gpu_check.SMOKE_PLAN
    prev = {"T": 1024, "compile_s": 2.0, "median_s": 0.5}
    assert gpu_check.estimate_s(prev, 2048, calls=3) == pytest.approx(2.0 + 3 * 0.5 * 4)
    assert gpu_check.estimate_s(None, 2048, calls=3) == 0.0
    roomy, tight, spent = gpu_check.Clock(1e6), gpu_check.Clock(5.0), gpu_check.Clock(0)
    assert gpu_check.skip_reason(prev, prev, 2048, plan, roomy) is None
    assert "estimated 6 s > " in gpu_check.skip_reason(prev, prev, 2048, plan, tight)
    assert "spent" in gpu_check.skip_reason(None, None, 2048, plan, spent)
    assert gpu_check.skip_reason(None, None, 2048, plan, tight, floor_s=4.0) is None
    assert "estimated 9 s" in gpu_check.skip_reason(None, None, 2048, plan, tight, floor_s=9.0)
    failed = {"T": 1024, "error": "RESOURCE_EXHAUSTED"}
    assert "T=1024 already failed" in gpu_check.skip_reason(failed, prev, 2048, plan, roomy)
    big = {"T": 1024, "skipped": "needs 200.0 GiB of temporaries > 139.0 GiB on the device"}
    assert "device memory" in gpu_check.skip_reason(big, None, 2048, plan, roomy)


def test_unknown_spec_is_a_clear_error():
    with pytest.raises(ValueError, match="no 'pallas' implementation"):
        gpu_check.kernel_specs(["softmax"])


def test_watchdog_writes_the_report_and_exits(tmp_path):
    # a kernel that hangs (sleeps while being traced) past budget + grace
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from experiments import gpu_check
        from lcjax import attention
        from lcjax.attention import AttentionSpec, Implementation, dot_product_attention

        def hang(q, k, v, **kw):
            time.sleep(60)

        attention.register(AttentionSpec("hang", reference=dot_product_attention,
            implementations=(Implementation("pallas", hang), Implementation("xla", hang))))
        gpu_check.main(["--cpu-smoke", "--specs", "hang", "--time-budget", "1",
                        "--grace", "1", "--out", {str(tmp_path)!r}])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3, proc.stderr
    (stem,) = {p.with_suffix("") for p in tmp_path.glob("*.json")}
    data = _load(stem)
    assert data["status"].startswith("cut short by the watchdog")
    assert data["current"] == "check hang float32 causal=True"


@pytest.mark.slow
def test_every_registered_kernel(tmp_path):
    """Whatever kernels are registered today pass the smoke check against their XLA path."""
    specs = gpu_check.kernel_specs()
    if not specs:
        pytest.skip("no registered spec has a 'pallas' implementation yet")
    # interpret mode is slow: one case per kernel (the toy kernel's test covers timing)
    data = _load(gpu_check.main(["--cpu-smoke", "--lengths", "", "--dtypes", "float32",
                                 "--causal", "true", "--time-budget", "1800",
                                 "--out", str(tmp_path)]))
    assert data["status"] == "complete" and data["timing"] == []
    assert [r["spec"] for r in data["correctness"]] == [s.name for s in specs]
    for row in data["correctness"]:
        assert row.get("ok"), row


def test_every_kernel_comes_first_in_the_check_order(toy_specs):
    specs = [attention.spec(n) for n in toy_specs]
    order = [(s.name, d, c) for s, d, c in gpu_check.check_order(specs, gpu_check.SMOKE_PLAN)]
    assert order[:2] == [("toy_scaled", "float32", True), ("toy_softmax", "float32", True)]
    assert len(order) == 8 and len(set(order)) == 8
