"""OpenAI-compatible HTTP endpoints: ``/v1/completions`` and ``/v1/chat/completions``.

One request per prompt, ``concurrency`` of them in flight (daemon threads), each attempt
bounded as a whole by :func:`lcjax.eval.http_client.post_json`: ``timeout`` seconds in all
(not per read), a reply of at most ``max_reply_bytes`` bytes nested at most ``max_depth``
deep, an answer of at most :func:`max_answer_bytes` bytes. Up to ``retries`` retries with
exponential backoff (``backoff * 2**attempt`` seconds, at most ``max_backoff``; a numeric
``Retry-After`` header is honoured up to ``max_backoff``) on connection errors, the deadline,
truncated bodies and HTTP 408/429/5xx; so one prompt takes at most
``(retries + 1) * timeout`` plus the waits. Another HTTP error, a body too large, too deep,
not JSON, or JSON without the answer field fails the prompt at once. A failed prompt is
reported as an error for that item (:data:`lcjax.eval.runners.Runner`); nothing raises out
of the runner. Ctrl-C stops the runner at once: the answers already yielded are kept by the
caller, the requests in flight are abandoned (their threads are daemons).

Requests (greedy by default)::

    POST {base}/v1/completions       {"model", "prompt", "max_tokens", "temperature"}
    POST {base}/v1/chat/completions  {"model", "messages": [{"role": "user", ...}], ...}

answered by ``choices[0].text`` or ``choices[0].message.content``. No API key is sent unless
``api_key_env`` names the environment variable holding it (``--api-key-env NAME``; sent as
``Authorization: Bearer``), and never over plain ``http://`` to another machine
(:class:`EndpointConfig` refuses that: the key would travel unencrypted).
A :class:`TokenCounter` passed to :func:`complete` adds up the replies'
``usage`` (``prompt_tokens``, ``completion_tokens``) and counts the calls.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from lcjax.interrupts import sigint_latch
from lcjax.optional import require

with require("eval", "lcjax.eval.endpoint"):
    import requests

from lcjax.eval.http_client import RETRY_STATUS, HttpError, HttpLimits, is_loopback_url, post_json

__all__ = [
    "RETRY_STATUS",
    "EndpointConfig",
    "EndpointError",
    "TokenCounter",
    "complete",
    "endpoint_runner",
    "endpoint_url",
    "max_answer_bytes",
    "parse_reply",
    "request_body",
    "usage_of",
]

MAX_BYTES_PER_TOKEN = 64  # generous: the longest tokens of common vocabularies are shorter


class EndpointError(RuntimeError):
    """A prompt the endpoint did not answer (after the retries, where they apply)."""


@dataclasses.dataclass(frozen=True)
class EndpointConfig:
    """An OpenAI-compatible endpoint.

    Attributes:
      base_url: e.g. ``http://127.0.0.1:8000`` or ``https://api.openai.com/v1``.
      model: the ``model`` field of the request (None: left out, for servers with one).
      chat: use ``/v1/chat/completions`` (messages) instead of ``/v1/completions``.
      api_key_env: environment variable holding the API key (None, the default: no key is
        sent). With a plain ``http://`` URL the host must be this machine.
      timeout: seconds per attempt in all (connect, send and every read).
      max_reply_bytes: the largest reply body accepted.
      max_depth: the deepest JSON nesting accepted in a reply.
      retries: retries after the first attempt, for transient failures.
      backoff, max_backoff: the wait before retry a is ``min(max_backoff, backoff * 2**a)``.
      concurrency: requests in flight at once.
      temperature: sampling temperature (0: greedy).
      system_prompt: with ``chat``, an optional system message first.
    """

    base_url: str
    model: str | None = None
    chat: bool = False
    api_key_env: str | None = None
    timeout: float = 60.0
    max_reply_bytes: int = 4 << 20
    max_depth: int = 64
    retries: int = 3
    backoff: float = 1.0
    max_backoff: float = 30.0
    concurrency: int = 4
    temperature: float = 0.0
    system_prompt: str | None = None

    def __post_init__(self):
        if not isinstance(self.base_url, str) or not self.base_url.startswith(
                ("http://", "https://")):
            raise ValueError(f"EndpointConfig: `base_url` must be an http(s) URL, got "
                             f"{self.base_url!r}")
        for name in ("timeout", "max_backoff"):
            if not getattr(self, name) > 0:
                raise ValueError(f"EndpointConfig: `{name}` must be > 0, got "
                                 f"{getattr(self, name)!r}")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"EndpointConfig: `retries` must be an int >= 0, got "
                             f"{self.retries!r}")
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"EndpointConfig: `concurrency` must be an int >= 1, got "
                             f"{self.concurrency!r}")
        if self.api_key_env and self.base_url.startswith("http://") and not is_loopback_url(
                self.base_url):
            raise ValueError(f"EndpointConfig: refusing to send the API key in "
                             f"${self.api_key_env} over plain http to {self.base_url!r} (it "
                             "would travel unencrypted): use https, or no key")
        HttpLimits(self.timeout, self.max_reply_bytes, self.max_depth)  # validates them
        if self.backoff < 0 or self.temperature < 0:
            raise ValueError(f"EndpointConfig: `backoff` and `temperature` must be >= 0, got "
                             f"{self.backoff!r}, {self.temperature!r}")

    def describe(self) -> str:
        """``url model`` — what a results file records as its backend (never the key)."""
        return f"{endpoint_url(self)} {self.model or ''}".strip()


def endpoint_url(cfg: EndpointConfig) -> str:
    """The request URL: ``base_url`` (with or without a trailing ``/v1``) + the route."""
    base = cfg.base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return base + ("/chat/completions" if cfg.chat else "/completions")


def request_body(cfg: EndpointConfig, prompt: str, max_tokens: int) -> dict:
    """The JSON body for one prompt."""
    body: dict[str, Any] = {"max_tokens": int(max_tokens), "temperature": cfg.temperature}
    if cfg.model is not None:
        body["model"] = cfg.model
    if cfg.chat:
        system = [{"role": "system", "content": cfg.system_prompt}] * bool(cfg.system_prompt)
        body["messages"] = [*system, {"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def parse_reply(cfg: EndpointConfig, data: Any) -> str:
    """The answer text of a decoded JSON reply; :class:`EndpointError` if it has none."""
    try:
        choice = data["choices"][0]
        text = choice["message"]["content"] if cfg.chat else choice["text"]
    except (KeyError, IndexError, TypeError) as e:
        field = "choices[0].message.content" if cfg.chat else "choices[0].text"
        raise EndpointError(f"malformed reply (no {field}: {type(e).__name__} {e}): "
                            f"{str(data)[:200]!r}") from None
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise EndpointError(f"malformed reply: the answer is a {type(text).__name__}, not a "
                            "string")
    return text


def usage_of(data: Any) -> tuple[int, int] | None:
    """``(prompt_tokens, completion_tokens)`` of a reply's ``usage``; None when it has none
    (some servers leave it out) or it is not a pair of non-negative ints."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None
    pair = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in pair):
        return None
    return pair


class TokenCounter:
    """Running totals over the answered calls (thread-safe): ``calls``, ``prompt_tokens``,
    ``completion_tokens`` (sums of each reply's ``usage``), ``missing_usage`` (replies without
    one) and ``peak_prompt_tokens`` (the largest single prompt)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.calls = self.prompt_tokens = self.completion_tokens = 0
        self.missing_usage = self.peak_prompt_tokens = 0

    def add(self, data: Any) -> None:
        """Count one answered call whose decoded JSON reply is ``data``."""
        usage = usage_of(data)
        with self._lock:
            self.calls += 1
            if usage is None:
                self.missing_usage += 1
                return
            self.prompt_tokens += usage[0]
            self.completion_tokens += usage[1]
            self.peak_prompt_tokens = max(self.peak_prompt_tokens, usage[0])

    def as_dict(self) -> dict:
        """The totals as a JSON-able dict."""
        with self._lock:
            return {"calls": self.calls, "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens,
                    "missing_usage": self.missing_usage,
                    "peak_prompt_tokens": self.peak_prompt_tokens}


def _headers(cfg: EndpointConfig) -> dict:
    key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def _wait(cfg: EndpointConfig, attempt: int, retry_after: float | None) -> float:
    wait = cfg.backoff * 2**attempt
    if retry_after is not None:
        wait = max(wait, retry_after)
    return min(cfg.max_backoff, wait)


def max_answer_bytes(max_tokens: int) -> int:
    """The longest answer (UTF-8 bytes) accepted for ``max_tokens``:
    ``max(4096, 64 * max_tokens)``; a longer one means the server ignored ``max_tokens``."""
    return max(4096, MAX_BYTES_PER_TOKEN * int(max_tokens))


def complete(cfg: EndpointConfig, prompt: str, max_tokens: int, *,
             session: requests.Session | None = None,
             sleep: Callable[[float], None] = time.sleep,
             counter: TokenCounter | None = None) -> str:
    """The endpoint's answer to one prompt, retrying transient failures; ``counter`` (if
    given) counts the answered call and its ``usage``. Each attempt lasts at most
    ``cfg.timeout`` seconds in all.

    Raises:
      EndpointError: the reply is malformed, too large, too deep, an answer longer than
        :func:`max_answer_bytes`, an HTTP error that is not retried, or the last attempt
        failed; the message says which.
    """
    own = session is None
    session = session or requests.Session()
    url, body, headers = endpoint_url(cfg), request_body(cfg, prompt, max_tokens), _headers(cfg)
    limits = HttpLimits(cfg.timeout, cfg.max_reply_bytes, cfg.max_depth)
    last = "no attempt"
    try:
        for attempt in range(cfg.retries + 1):
            try:
                data = post_json(session, url, body, headers=headers, limits=limits)
            except HttpError as e:
                if not e.transient:
                    raise EndpointError(str(e)) from None
                last, retry_after = str(e), e.retry_after
            else:
                text = parse_reply(cfg, data)
                size = len(text.encode("utf-8", "surrogatepass"))
                if size > max_answer_bytes(max_tokens):
                    raise EndpointError(f"malformed reply: the answer has {size} bytes, more "
                                        f"than {max_answer_bytes(max_tokens)} for max_tokens="
                                        f"{max_tokens} (the server ignored max_tokens)")
                if counter is not None:
                    counter.add(data)
                return text
            if attempt < cfg.retries:
                sleep(_wait(cfg, attempt, retry_after))
    finally:
        if own:
            session.close()
    raise EndpointError(f"failed after {cfg.retries + 1} attempts; last: {last}")


def endpoint_runner(cfg: EndpointConfig, *, max_tokens: int,
                    sleep: Callable[[float], None] = time.sleep):
    """A runner (:data:`lcjax.eval.runners.Runner`) sending each prompt to ``cfg``'s endpoint,
    ``cfg.concurrency`` at a time (daemon threads), yielding answers as they finish. Closing
    the generator (Ctrl-C in the consumer) stops at once: no new prompt is sent and the
    requests in flight are abandoned."""

    def run(prompts: list[bytes]):
        todo: queue.Queue = queue.Queue()
        for item in enumerate(prompts):
            todo.put(item)
        done: queue.Queue = queue.Queue()
        stop = threading.Event()

        def worker():
            with requests.Session() as session:
                while not stop.is_set():
                    try:
                        i, prompt = todo.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        text = complete(cfg, prompt.decode("utf-8", "replace"), max_tokens,
                                        session=session, sleep=sleep)
                        done.put((i, text, None))
                    except EndpointError as e:
                        done.put((i, None, str(e)))
                    except Exception as e:  # anything unexpected fails the item, not the run
                        done.put((i, None, f"{type(e).__name__}: {e}"))

        for _ in range(min(cfg.concurrency, len(prompts))):
            threading.Thread(target=worker, name="lcjax-eval", daemon=True).start()
        try:
            with sigint_latch() as latch:
                for _ in range(len(prompts)):
                    while True:  # bounded waits, so Ctrl-C is seen at once, even one that
                        latch.check()  # a garbage-collection callback swallowed
                        try:
                            result = done.get(timeout=0.2)
                            break
                        except queue.Empty:
                            continue
                    yield result
        finally:
            stop.set()

    return run
