"""Report writing shared by every benchmark: number formats, targets and verdicts, the
machine line, the rerun command, the JSON + markdown + PNG files and the log-log axes.

A benchmark's result is a JSON-ready dict with at least ``command`` (the ``lcjax`` command
that reruns it) and ``machine`` (:func:`lcjax.bench.timing.machine_info`);
:func:`write_report` writes ``<stem>.json``, ``<stem>.md`` and one PNG per plot.
"""

from lcjax.reporting import *  # noqa: F403  (moved to lcjax.reporting; re-exported)
