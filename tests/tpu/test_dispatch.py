"""Dispatch by target, not by host: ``spec(q, k, v, implementation="pallas")`` jitted for TPU
devices of ``lcjax.aot`` (from this CPU host) lowers to Mosaic kernels
(``tpu_custom_call``), for every registered spec with a Pallas implementation, and so does
``implementation=None``; for CPU devices the same calls lower without any Mosaic call (the
interpreter, or the XLA path). Bad inputs for a TPU target raise ``ValueError`` naming the
numbers before compilation, never a compiler error."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

pytest.importorskip("libtpu", reason="compiling for a TPU topology needs libtpu: pip install "
                                     "'lcjax[tpu]' (make test installs it)")

from experiments import tpu_gate  # noqa: E402
from lcjax import aot, attention  # noqa: E402

METHODS = tpu_gate.pallas_methods()
T = 2048  # long enough for every kernel's default blocks and token_sparse's sparse path


def _structs(devices, t=T, d=128, dk=128):
    q = aot.struct((1, t, 8, d), "bfloat16", devices)
    kv = aot.struct((1, t, 2, dk), "bfloat16", devices)
    return q, kv, kv


def _cpu_structs(t=T):
    cpu = jax.devices("cpu")[:1]
    return tuple(jax.ShapeDtypeStruct(s.shape, s.dtype,
                                      sharding=jax.sharding.SingleDeviceSharding(cpu[0]))
                 for s in _structs(aot.topology_devices("v5e:2x2"), t))


def _hlo(method, args, **kwargs):
    spec = attention.get(method)
    options = {**spec.options_for("pallas", spec.benchmark_options), **kwargs}
    fn = lambda q, k, v: spec(q, k, v, causal=True, **options)  # noqa: E731
    return jax.jit(fn).trace(*args).lower().as_text()


@pytest.mark.parametrize("method", METHODS)
def test_pallas_for_a_tpu_target_lowers_to_mosaic(method):
    args = _structs(aot.topology_devices("v5e:2x2"))
    assert "tpu_custom_call" in _hlo(method, args, implementation="pallas")
    assert "tpu_custom_call" in _hlo(method, args)  # implementation=None: Pallas serves


@pytest.mark.parametrize("method", METHODS)
def test_a_cpu_target_gets_no_mosaic_call(method):
    args = _cpu_structs()
    assert "tpu_custom_call" not in _hlo(method, args, implementation="pallas")
    assert "tpu_custom_call" not in _hlo(method, args)


def _block_fields(method) -> tuple[str, ...]:
    config = attention.get(method).implementation("pallas").config
    return tuple(f.name for f in dataclasses.fields(config) if f.name.startswith("block"))


@pytest.mark.parametrize("method", METHODS)
def test_a_block_size_that_is_not_a_power_of_two_is_refused_naming_it(method):
    """A ``ValueError`` when the config rejects it for every implementation; when only the
    named kernel cannot take it, the contract's ``NotImplementedError`` (the XLA path may
    take it). Either way while tracing, naming the option and the number."""
    args = _structs(aot.topology_devices("v5e:2x2"))
    for field in _block_fields(method):
        with pytest.raises((ValueError, NotImplementedError), match=rf"{field}.*\b96\b"):
            _hlo(method, args, implementation="pallas", **{field: 96})


@pytest.mark.parametrize("method", METHODS)
def test_a_head_dim_mismatch_is_a_value_error(method):
    args = _structs(aot.topology_devices("v5e:2x2"), dk=64)
    with pytest.raises(ValueError, match=r"head_dim.*128.*64"):
        _hlo(method, args, implementation="pallas")


def _compile_or_value_error(method, args, **kwargs):
    """Lower (a ``ValueError`` here is the clear refusal) and compile: a compiler error
    means the kernel took an input it cannot handle."""
    spec = attention.get(method)
    options = {**spec.options_for("pallas", spec.benchmark_options), **kwargs}
    fn = lambda q, k, v: spec(q, k, v, causal=True, implementation="pallas", **options)  # noqa: E731
    try:
        with jax.default_matmul_precision(tpu_gate.PRECISION):
            lowered = jax.jit(fn).trace(*args).lower()
    except ValueError as err:
        numbers = [str(n) for n in (*kwargs.values(), args[0].shape[1])]
        assert any(n in str(err) for n in numbers), f"ValueError names none of {numbers}: {err}"
        return "ValueError"
    lowered.compile()
    return "compiled"


@pytest.mark.parametrize("method", METHODS)
def test_the_kernels_compile_under_the_highest_matmul_precision(method):
    """``jax_default_matmul_precision="highest"`` (this suite's setting, and a user's) must
    not break the TPU compile: a kernel pins the precision of its own dots."""
    spec = attention.get(method)
    options = spec.options_for("pallas", spec.benchmark_options)
    fn = lambda q, k, v: spec(q, k, v, causal=True, implementation="pallas", **options)  # noqa: E731
    with jax.default_matmul_precision("highest"):
        jax.jit(fn).trace(*_structs(aot.topology_devices("v5e:2x2"))).lower().compile()


@pytest.mark.parametrize("method", METHODS)
def test_the_smallest_blocks_compile_or_are_refused_before_compiling(method):
    """Every block field at 16 (the compiled kernels' smallest power of two) and 64 (not a
    multiple of 128): compiles for a TPU, or a ``ValueError`` naming it, while lowering."""
    args = _structs(aot.topology_devices("v5e:2x2"), t=1024)
    for field in _block_fields(method):
        for size in (16, 64):
            _compile_or_value_error(method, args, **{field: size})


@pytest.mark.parametrize("method", METHODS)
def test_a_length_off_the_block_grid_compiles_or_is_refused_before_compiling(method):
    args = _structs(aot.topology_devices("v5e:2x2"), t=1000)
    _compile_or_value_error(method, args)


def test_interpreter_only_blocks_run_on_cpu_and_fail_only_when_lowered_for_tpu():
    """token_sparse's conformance options take 8-key scoring blocks, which only the
    interpreter runs: the CPU lowering works, the TPU lowering raises the kernel's reason
    (deferred from tracing to the target it concerns)."""
    spec = attention.get("token_sparse")
    fn = lambda q, k, v: spec(q, k, v, causal=True, implementation="pallas",  # noqa: E731
                              **spec.test_options)
    jax.jit(fn).trace(*_cpu_structs(t=64)).lower()
    with pytest.raises(NotImplementedError, match=r"\b8\b"):
        jax.jit(fn).trace(*_structs(aot.topology_devices("v5e:2x2"), t=64)).lower()


def test_cpu_execution_equals_the_reference_under_the_per_target_dispatch():
    """Executed on CPU, ``implementation="pallas"`` (interpreter) and None (XLA path) equal
    the reference; the conformance suite checks this for every spec and option set."""
    spec = attention.get("entmax")
    rng = np.random.default_rng(0)
    q, k, v = (jax.numpy.asarray(rng.standard_normal((1, 32, 2, 16)), "float32")
               for _ in range(3))
    ref = spec.reference(q, k, v, causal=True)
    for impl in ("pallas", None):
        out = jax.jit(lambda q, k, v, impl=impl: spec(
            q, k, v, causal=True, implementation=impl, **spec.test_options))(q, k, v)
        np.testing.assert_allclose(out, ref, atol=2e-5, rtol=0)
