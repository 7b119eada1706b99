"""A Ctrl-C that is never lost while lcjax waits.

Python runs a signal's handler at the next check of the main thread's eval loop. When that
check falls inside a ``gc.callbacks`` function the ``KeyboardInterrupt`` the handler raises
is printed as "Exception ignored in ..." and dropped. jax registers such a callback
(``jax._src.lib._xla_gc_callback``, run at the start and the end of every collection), so a
Ctrl-C that arrives during a garbage collection is swallowed and a waiting loop goes on
waiting: a loop that collects again and again with jax imported lost the Ctrl-C in 6 of 6
tries (2026-12-06; ``tests/test_interrupts.py`` shows it with a callback of its own).

:func:`sigint_latch` installs, for the duration of a ``with`` block in the main thread, a
SIGINT handler that records the interrupt before handing it to the previous handler; a
waiting loop calls :meth:`SigintLatch.check` between bounded waits, which raises
``KeyboardInterrupt`` again when one was recorded (whether or not the first was swallowed).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["SigintLatch", "sigint_latch"]


class SigintLatch:
    """Remembers a SIGINT received inside :func:`sigint_latch`'s block."""

    def __init__(self):
        self._event = threading.Event()

    @property
    def interrupted(self) -> bool:
        """True once a SIGINT arrived inside the block."""
        return self._event.is_set()

    def record(self) -> None:
        self._event.set()

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if a SIGINT arrived inside the block."""
        if self._event.is_set():
            raise KeyboardInterrupt


@contextlib.contextmanager
def sigint_latch() -> Iterator[SigintLatch]:
    """Yield a :class:`SigintLatch` recording every SIGINT while the block runs; the previous
    handler still runs on each one (Python's default raises ``KeyboardInterrupt``; an
    ignored SIGINT stays ignored and is not recorded). Outside the main thread, where no
    handler can be installed, the latch never fires. The previous handler is restored on
    exit."""
    latch = SigintLatch()
    if threading.current_thread() is not threading.main_thread():
        yield latch
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        yield latch
        return

    def handler(signum, frame):
        latch.record()
        if callable(previous):
            previous(signum, frame)
        else:  # SIG_DFL or a handler not set from Python: the interrupt Python would raise
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield latch
    finally:
        signal.signal(signal.SIGINT, previous)
