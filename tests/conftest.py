"""Test configuration, set before jax is imported and exported through ``os.environ`` so
that subprocess tests and notebook kernels (nbmake) inherit it:

- 8 CPU devices for multi-device tests;
- ``--xla_backend_optimization_level=0`` (LLVM's opt level for the CPU code): this suite
  is compile-bound (~1,100 tests, mostly tiny programs) and compiles 20-30% faster at level
  0 with the same IEEE results. ``LCJAX_TEST_XLA_OPT=<n>`` picks another level and
  ``LCJAX_TEST_XLA_OPT=default`` leaves XLA's default. Level 0 once turned up a NaN in the
  jitted gradient of the dense reference (tests/test_alibi.py): the gradient of the row max
  in ``core.softmax_rows`` divided by a tie count of 0, because two fusions rounded the
  ALiBi-biased scores differently; the max is now under ``stop_gradient`` (exact: the
  softmax does not depend on its shift), and the whole suite passes at level 0.

JAX's persistent compilation cache was measured and is not used: from an empty cache (as in
CI) tests/test_parallel_train.py, whose train() calls compile the same step programs again,
took 531 s with it and 521 s without, side by side (shared machine under load).
"""

import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
_opt = os.environ.get("LCJAX_TEST_XLA_OPT", "0")
if _opt != "default" and "xla_backend_optimization_level" not in _flags:
    _flags += f" --xla_backend_optimization_level={_opt}"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_report_header(config):
    return (f"jax {jax.__version__}, devices: {jax.device_count()} x "
            f"{jax.devices()[0].platform}; XLA_FLAGS={os.environ['XLA_FLAGS']!r}")
