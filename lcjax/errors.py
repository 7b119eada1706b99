"""The one error type for mistakes of the person running a command (a flag value, a missing
file, a folder that is not a run): ``lcjax`` prints its message on one line and exits with
status 2, without a traceback. Anything else that goes wrong keeps its traceback — it is a
bug (or a failure the message alone would not explain). No imports: any layer may raise it.
"""

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A user error of an ``lcjax`` command; its message says what to change. A
    ``ValueError``, so library callers catching bad arguments catch it too."""
