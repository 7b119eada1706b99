"""lcjax.interrupts: a Ctrl-C that lands during a garbage collection is swallowed by a
``gc.callbacks`` function (jax registers one), and :func:`sigint_latch` raises it again.

The signal tests run in a subprocess (a SIGINT inside a pytest worker would stop the run):
a heap whose full collection takes a while, a gc callback like jax's, a loop that collects
again and again, and a SIGINT from a timer thread 0.5 s in."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from lcjax.interrupts import sigint_latch

# A pytest-xdist worker restarted after a crash ignores SIGINT and its children inherit the
# ignored signal; a shell starts Python with the default handler, so the scripts install it.
DEFAULT_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"

LOOP = DEFAULT_SIGINT + """
import gc, os, signal, sys, threading, time
from lcjax.interrupts import sigint_latch
gc.callbacks.append(lambda *a: None)   # what jax's _xla_gc_callback is to Python
heap = [[i] for i in range(1_000_000)]  # each full collection takes milliseconds
def ctrl_c():
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=ctrl_c, daemon=True).start()
t0 = time.monotonic()
try:
    with sigint_latch() as latch:
        while time.monotonic() - t0 < 4:
            if sys.argv[1] == "latch":
                latch.check()
            gc.collect()
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - t0:.2f} s", flush=True)
"""


def _run(mode: str) -> str:
    out = subprocess.run([sys.executable, "-c", LOOP, mode], capture_output=True, text=True,
                         timeout=60)
    return out.stdout.strip()


def test_a_ctrl_c_during_collection_is_swallowed_without_the_check_and_raised_with_it():
    # without latch.check() the only KeyboardInterrupt is raised inside the gc callback,
    # printed as "Exception ignored" and lost: the loop runs on to its end
    assert _run("plain") == "not interrupted"
    with_check = _run("latch")
    assert with_check.startswith("interrupted after"), with_check
    assert float(with_check.split()[2]) < 2.0  # at the first check after the Ctrl-C


def test_handler_restored_and_ignored_sigint_respected():
    inherited = signal.getsignal(signal.SIGINT)  # SIG_IGN in a restarted xdist worker
    before = signal.default_int_handler
    signal.signal(signal.SIGINT, before)
    try:
        _restored_and_ignored(before)
    finally:
        signal.signal(signal.SIGINT, inherited)


def _restored_and_ignored(before):
    with sigint_latch() as latch:
        assert signal.getsignal(signal.SIGINT) is not before
        assert not latch.interrupted
        latch.check()  # nothing recorded: no raise
    assert signal.getsignal(signal.SIGINT) is before
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with sigint_latch():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_recorded_interrupt_raises_and_other_threads_install_nothing():
    with sigint_latch() as latch:
        latch.record()
        with pytest.raises(KeyboardInterrupt):
            latch.check()
    seen = {}

    def worker():
        with sigint_latch() as other:
            seen["handler"] = signal.getsignal(signal.SIGINT)
            seen["interrupted"] = other.interrupted

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"handler": signal.getsignal(signal.SIGINT), "interrupted": False}
