"""Test configuration, set before jax is imported and exported through ``os.environ`` so
that subprocess tests and notebook kernels (nbmake) inherit it:

- 8 CPU devices for multi-device tests;
- ``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` so parallel workers can all compile for TPU topologies
  (``tests/tpu``);
- ``--xla_backend_optimization_level=0`` (LLVM's opt level for the CPU code): this suite
  is compile-bound (~1,100 tests, mostly tiny programs) and compiles 20-30% faster at level
  0 with the same IEEE results. ``LCJAX_TEST_XLA_OPT=<n>`` picks another level and
  ``LCJAX_TEST_XLA_OPT=default`` leaves XLA's default. Level 0 once turned up a NaN in the
  jitted gradient of the dense reference (tests/test_alibi.py): the gradient of the row max
  in ``core.softmax_rows`` divided by a tie count of 0, because two fusions rounded the
  ALiBi-biased scores differently; the max is now under ``stop_gradient`` (exact: the
  softmax does not depend on its shift), and the whole suite passes at level 0.

JAX's persistent compilation cache is not used. Measured twice: from an empty cache (as in
CI) tests/test_parallel_train.py took 531 s with it and 521 s without; on 2026-12-01, in a
fresh directory per run with every program cached (min compile time 0), 12 tests of
tests/test_generate.py took 77.7 CPU-s with it and 74.9 without (side by side, -n 0), with
1 hit in 184 compiles: the suite's repeated programs are already reused from JAX's
in-memory caches (a second identical ``train()`` in one process compiles nothing), so the
cache only adds the writes.
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
# the TPU compile gate (tests/tpu) loads libtpu in every pytest worker: allow it, and quiet
# libtpu's harmless "no host bounds" error on a host without TPUs
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_report_header(config):
    return (f"jax {jax.__version__}, devices: {jax.device_count()} x "
            f"{jax.devices()[0].platform}; XLA_FLAGS={os.environ['XLA_FLAGS']!r}")


def pytest_collection_modifyitems(session, config, items):
    """Notebooks (nbmake) first, the rest in collection order: each notebook is among the
    slowest items of the suite (a kernel start, then 25-35 s); collected last, they were
    among the last items xdist handed out, where one of them can keep a worker busy for
    half a minute after the other has run out of tests.

    Tests that compile for a TPU topology (``tests/tpu/``, ``test_compile_report.py``) load
    libtpu into their process and are marked ``tpu_compile``: ``make test`` runs them in a
    pytest process of their own (a CPU compile in a worker that had loaded libtpu segfaulted
    once in a full run, 2026-12-06). Their time limit is 900 s, not the suite's (pyproject.toml):
    the slowest, token_sparse fwd+bwd at 8K/32K/128K on v5e, took 282-348 s on the loaded
    2-core host (2026-12-06)."""
    for item in items:
        path = item.path.as_posix()
        if "/tests/tpu/" in path or path.endswith("/test_compile_report.py"):
            item.add_marker(pytest.mark.tpu_compile)
            item.add_marker(pytest.mark.timeout(900))
    items.sort(key=lambda item: not str(item.path).endswith(".ipynb"))


# --- a pytest-xdist worker that dies takes its test with it -----------------------------------
# CI of 2026-12-06 lost a run to "worker 'gw1' crashed while running
# tests/test_token_sparse.py::test_jit_vmap_grad" (the test passes alone). Three full runs here
# that day crashed once each, natively, inside XLA's CPU compiler (`backend_compile_and_load`):
# a segfault compiling that same test's token_sparse call, a segfault compiling a `randint` in
# the next test of test_token_sparse.py, an abort in test_train_loop.py — with and without torch
# in the workers; the cause is not found. Each worker now writes its faulthandler dump (a
# segfault or abort in native code: its Python stack) to a file, the controller records why a
# worker went down, and a crashed test runs ONCE more on a fresh worker: a second crash fails
# it. Every crash is listed at the end of the run with the worker's error and dump, whether or
# not the rerun passed, so a crash is never hidden.

_CRASH_DIR = os.environ.setdefault(
    "LCJAX_TEST_CRASH_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                         f"lcjax-test-crashes-{os.getpid()}"))
_crashes: dict[str, list[str]] = {}
_node_errors: dict[str, str] = {}


def _dump_path(worker_id: str) -> str:
    return os.path.join(_CRASH_DIR, f"faulthandler-{worker_id}.log")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    worker_id = os.environ.get("PYTEST_XDIST_WORKER")
    if worker_id:  # in a worker: native crashes dump every thread's stack to a file
        import faulthandler
        os.makedirs(_CRASH_DIR, exist_ok=True)
        config._lcjax_dump_file = open(_dump_path(worker_id), "a")  # noqa: SIM115
        faulthandler.enable(file=config._lcjax_dump_file, all_threads=True)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    if error:
        _node_errors[node.gateway.id] = str(error)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    worker_id = report.node.gateway.id
    dump = _dump_path(worker_id)
    text = open(dump).read()[:3000] if os.path.exists(dump) else ""  # the crashing thread first
    _crashes.setdefault(crashitem, []).append(
        f"{worker_id}: {_node_errors.get(worker_id, 'no error reported')}\n{text}")
    if len(_crashes[crashitem]) == 1:  # first crash of this test: once more, fresh worker
        report.outcome = "rerun"
        sched.mark_test_pending(crashitem)


# Every native crash so far came late in a worker's life: at 90-98% of the run (CI and four
# fresh-clone runs here, 2026-12-06), inside `backend_compile_and_load`, in tests that pass
# alone and on their rerun in a fresh worker. Compiling each program on one thread
# (--xla_cpu_parallel_codegen_split_count=1) did not stop them (two aborts in the next full
# run). A worker keeps every executable it ever compiled in jax's caches; after each test
# module they are dropped, so a late worker holds no more than a young one. No cost measured:
# test_generate, _sliding_window, _trsp, _nn, _prefill_sparse, _eval at -n 2 took 313 CPU-s
# with it and 351 without (2026-12-06).
@pytest.fixture(autouse=True, scope="module")
def _drop_compiled_programs_after_each_module():
    yield
    jax.clear_caches()


def pytest_terminal_summary(terminalreporter):
    for nodeid, reports in _crashes.items():
        terminalreporter.write_sep("=", f"worker crash: {nodeid} ({len(reports)}x)")
        for text in reports:
            terminalreporter.write_line(text)
