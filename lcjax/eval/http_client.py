"""One bounded HTTP POST of JSON (``requests``): a total deadline, a reply-size cap and a
JSON nesting cap, for every remote call of the evaluator and the agents.

``requests``' own ``timeout`` bounds each socket read, not the request: a server that sends
one byte a second never trips it. :func:`post_json` bounds the whole attempt instead:

* the attempt runs in a daemon thread and the caller waits at most ``deadline`` seconds
  for it (the wait is interruptible, so Ctrl-C stops the caller at once, and a daemon
  thread never keeps the process alive);
* the attempt streams the reply with ``read1`` (one socket read at a time) and stops as
  soon as ``deadline`` has passed or more than ``max_bytes`` have arrived (a
  ``Content-Length`` above ``max_bytes`` is refused before reading), so an abandoned attempt
  ends within one read of its deadline; each read waits at most ``deadline`` seconds;
* the body is parsed only if its nesting (``[``/``{`` outside strings) is at most
  ``max_depth`` (:func:`json_depth`), so a deeply nested reply is an error, never a
  ``RecursionError``.

Failures are :class:`HttpError` with ``transient`` True for what a retry may cure
(connection errors, the deadline, a truncated body, HTTP 408/429/5xx) and the reply's
``retry_after`` seconds when it gave a numeric ``Retry-After``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import json
import re
import threading
import time
import urllib.parse
from typing import Any

from lcjax.interrupts import sigint_latch
from lcjax.optional import require

with require("eval", "lcjax.eval.http_client"):
    import requests

__all__ = [
    "RETRY_STATUS",
    "HttpError",
    "HttpLimits",
    "is_loopback_url",
    "json_depth",
    "post_json",
]

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504}) | frozenset(range(505, 600))
_TRANSIENT = (requests.ConnectionError, requests.Timeout,
              requests.exceptions.ChunkedEncodingError,
              requests.exceptions.ContentDecodingError)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(rb"[\[\]{}]")


class HttpError(RuntimeError):
    """An attempt that got no usable reply. ``transient``: a retry may succeed;
    ``status``: the HTTP status (None when there was no reply); ``retry_after``: the
    reply's numeric ``Retry-After`` in seconds (or None)."""

    def __init__(self, message: str, *, transient: bool, status: int | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.transient, self.status, self.retry_after = transient, status, retry_after


@dataclasses.dataclass(frozen=True)
class HttpLimits:
    """Bounds of one attempt.

    Attributes:
      deadline: seconds for the whole attempt (connect, send, every read), > 0.
      max_bytes: the largest reply body accepted, bytes.
      max_depth: the deepest JSON nesting accepted (arrays and objects).
    """

    deadline: float = 60.0
    max_bytes: int = 4 << 20
    max_depth: int = 64

    def __post_init__(self):
        if not self.deadline > 0:
            raise ValueError(f"HttpLimits: `deadline` must be > 0, got {self.deadline!r}")
        for name in ("max_bytes", "max_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"HttpLimits: `{name}` must be an int >= 1, got {value!r}")


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays/objects in the JSON text ``raw`` (brackets inside
    strings ignored; a scalar is depth 0). Linear time, no recursion."""
    brackets = _BRACKET.findall(_STRING.sub(b'""', raw))
    steps = (1 if b in (b"[", b"{") else -1 for b in brackets)
    return max(itertools.accumulate(steps, initial=0))


def is_loopback_url(url: str) -> bool:
    """Whether ``url``'s host is this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _retry_after(reply: requests.Response) -> float | None:
    try:
        value = float(reply.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return value if value >= 0 else None


def _read_body(reply: requests.Response, limits: HttpLimits, end: float) -> bytes:
    """The body, read one socket read at a time, within ``end`` and ``max_bytes``."""
    declared = reply.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limits.max_bytes:
        raise HttpError(f"reply too large: Content-Length {declared} > max_bytes "
                        f"{limits.max_bytes}", transient=False, status=reply.status_code)
    parts, size = [], 0
    while True:
        if time.monotonic() > end:
            raise HttpError(f"deadline of {limits.deadline:g} s passed after {size} bytes of "
                            "the reply", transient=True, status=reply.status_code)
        chunk = reply.raw.read1(65536, decode_content=True)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > limits.max_bytes:
            raise HttpError(f"reply too large: more than max_bytes {limits.max_bytes} bytes",
                            transient=False, status=reply.status_code)
        parts.append(chunk)


def _attempt(session: requests.Session, url: str, body: Any, headers: dict,
             limits: HttpLimits, end: float) -> tuple[int, bytes, float | None]:
    """``(status, body, retry_after)`` of one POST; raises :class:`HttpError`."""
    try:
        reply = session.post(url, json=body, headers=headers, stream=True,
                             timeout=(limits.deadline, limits.deadline))
    except _TRANSIENT as e:
        raise HttpError(f"{type(e).__name__}: {e}", transient=True) from None
    except requests.RequestException as e:
        raise HttpError(f"request failed: {type(e).__name__}: {e}", transient=False) from None
    try:
        raw = _read_body(reply, limits, end)
    except _TRANSIENT + (OSError,) as e:
        raise HttpError(f"reply cut off: {type(e).__name__}: {e}", transient=True,
                        status=reply.status_code) from None
    except Exception as e:  # urllib3's ProtocolError and kin: a body cut short
        if isinstance(e, HttpError):
            raise
        raise HttpError(f"reply cut off: {type(e).__name__}: {e}", transient=True,
                        status=reply.status_code) from None
    finally:
        reply.close()
    return reply.status_code, raw, _retry_after(reply)


def _decode(status: int, raw: bytes, limits: HttpLimits) -> Any:
    depth = json_depth(raw)
    if depth > limits.max_depth:
        raise HttpError(f"malformed reply: JSON nested {depth} deep > max_depth "
                        f"{limits.max_depth}", transient=False, status=status)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise HttpError(f"malformed reply (not JSON, HTTP {status}: {type(e).__name__}): "
                        f"{raw[:200]!r}", transient=False, status=status) from None


def post_json(session: requests.Session, url: str, body: Any, *, headers: dict | None = None,
              limits: HttpLimits = HttpLimits()) -> Any:
    """POST ``body`` as JSON to ``url`` once, within ``limits``; the decoded JSON reply.

    Raises:
      HttpError: no reply within ``limits.deadline`` (transient), a connection error or a
        body cut short (transient), an HTTP status >= 400 (transient iff in
        :data:`RETRY_STATUS`), a body over ``max_bytes``, nested deeper than ``max_depth``
        or not JSON (not transient).
    """
    end = time.monotonic() + limits.deadline
    box: dict = {}
    done = threading.Event()

    def work():
        try:
            box["value"] = _attempt(session, url, body, dict(headers or {}), limits, end)
        except BaseException as e:  # handed to the caller
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=work, name="lcjax-http", daemon=True).start()
    with sigint_latch() as latch:  # bounded waits: a swallowed Ctrl-C is raised again
        while not done.wait(min(0.2, max(0.0, end - time.monotonic()) + 0.05)):
            latch.check()
            if time.monotonic() > end + 0.05:
                raise HttpError(f"deadline of {limits.deadline:g} s passed before the reply "
                                "was complete", transient=True)
        latch.check()
    if "error" in box:
        raise box["error"]
    status, raw, retry_after = box["value"]
    if status >= 400:
        raise HttpError(f"HTTP {status}: {raw[:200]!r}", transient=status in RETRY_STATUS,
                        status=status, retry_after=retry_after)
    return _decode(status, raw, limits)
