"""Test configuration, set before jax is imported and exported through ``os.environ`` so
that subprocess tests and notebook kernels (nbmake) inherit it:

- 8 CPU devices for multi-device tests;
- XLA's default CPU code generation. ``LCJAX_TEST_XLA_OPT=0`` sets
  ``--xla_backend_optimization_level=0`` (LLVM's opt level), which compiles this
  compile-bound suite 20-30% faster but is not the default: at level 0 the jitted gradient
  of the dense ALiBi reference in ``tests/test_alibi.py`` comes out NaN in one row (eager,
  and level 2, are finite), so level 0 is for quick local runs only.

JAX's persistent compilation cache was measured and is not used: from an empty cache (as in
CI) tests/test_parallel_train.py, whose train() calls compile the same step programs again,
took 531 s with it and 521 s without, side by side (shared machine under load).
"""

import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
_opt = os.environ.get("LCJAX_TEST_XLA_OPT", "")
if _opt and "xla_backend_optimization_level" not in _flags:
    _flags += f" --xla_backend_optimization_level={_opt}"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_report_header(config):
    return (f"jax {jax.__version__}, devices: {jax.device_count()} x "
            f"{jax.devices()[0].platform}; XLA_FLAGS={os.environ['XLA_FLAGS']!r}")
