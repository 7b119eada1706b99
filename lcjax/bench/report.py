"""Report writing shared by every benchmark: :mod:`lcjax.reporting` (moved there, below the
evaluator that uses it too), re-exported here."""

from lcjax.reporting import *  # noqa: F403  (moved to lcjax.reporting; re-exported)
