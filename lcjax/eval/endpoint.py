"""OpenAI-compatible HTTP endpoints: ``/v1/completions`` and ``/v1/chat/completions``.

One request per prompt, ``concurrency`` of them in flight (a thread pool), each with a
``timeout`` and up to ``retries`` retries with exponential backoff
(``backoff * 2**attempt`` seconds, at most ``max_backoff``; a numeric ``Retry-After``
header is honoured up to ``max_backoff``) on connection errors, timeouts, truncated
bodies and HTTP 408/429/5xx. Another HTTP error, a body that is not JSON, or JSON without
the answer field fails the prompt at once. A failed prompt is reported as an error for
that item (:data:`lcjax.eval.runners.Runner`); nothing raises out of the runner.

Requests (greedy by default)::

    POST {base}/v1/completions       {"model", "prompt", "max_tokens", "temperature"}
    POST {base}/v1/chat/completions  {"model", "messages": [{"role": "user", ...}], ...}

answered by ``choices[0].text`` or ``choices[0].message.content``. The API key is read from
the environment variable ``api_key_env`` (sent as ``Authorization: Bearer``); a local
server needs none. A :class:`TokenCounter` passed to :func:`complete` adds up the replies'
``usage`` (``prompt_tokens``, ``completion_tokens``) and counts the calls.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import requests

__all__ = [
    "EndpointConfig",
    "EndpointError",
    "TokenCounter",
    "complete",
    "endpoint_runner",
    "endpoint_url",
    "parse_reply",
    "request_body",
    "usage_of",
]

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504}) | frozenset(range(505, 600))
_TRANSIENT = (requests.ConnectionError, requests.Timeout,
              requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError)


class EndpointError(RuntimeError):
    """A prompt the endpoint did not answer (after the retries, where they apply)."""


@dataclasses.dataclass(frozen=True)
class EndpointConfig:
    """An OpenAI-compatible endpoint.

    Attributes:
      base_url: e.g. ``http://127.0.0.1:8000`` or ``https://api.openai.com/v1``.
      model: the ``model`` field of the request (None: left out, for servers with one).
      chat: use ``/v1/chat/completions`` (messages) instead of ``/v1/completions``.
      api_key_env: environment variable holding the API key (absent or None: no key).
      timeout: seconds per request (connect and each read).
      retries: retries after the first attempt, for transient failures.
      backoff, max_backoff: the wait before retry a is ``min(max_backoff, backoff * 2**a)``.
      concurrency: requests in flight at once.
      temperature: sampling temperature (0: greedy).
      system_prompt: with ``chat``, an optional system message first.
    """

    base_url: str
    model: str | None = None
    chat: bool = False
    api_key_env: str | None = "OPENAI_API_KEY"
    timeout: float = 60.0
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


def _wait(cfg: EndpointConfig, attempt: int, reply: requests.Response | None) -> float:
    wait = cfg.backoff * 2**attempt
    after = reply.headers.get("Retry-After") if reply is not None else None
    if after is not None:
        try:
            wait = max(wait, float(after))
        except ValueError:
            pass
    return min(cfg.max_backoff, wait)


def complete(cfg: EndpointConfig, prompt: str, max_tokens: int, *,
             session: requests.Session | None = None,
             sleep: Callable[[float], None] = time.sleep,
             counter: TokenCounter | None = None) -> str:
    """The endpoint's answer to one prompt, retrying transient failures; ``counter`` (if
    given) counts the answered call and its ``usage``.

    Raises:
      EndpointError: the reply is malformed, an HTTP error that is not retried, or the
        last attempt failed; the message says which.
    """
    post = (session or requests).post
    url, body, headers = endpoint_url(cfg), request_body(cfg, prompt, max_tokens), _headers(cfg)
    last = "no attempt"
    for attempt in range(cfg.retries + 1):
        reply = None
        try:
            reply = post(url, json=body, headers=headers, timeout=cfg.timeout)
        except _TRANSIENT as e:
            last = f"{type(e).__name__}: {e}"
        except requests.RequestException as e:
            raise EndpointError(f"request failed: {type(e).__name__}: {e}") from None
        else:
            if reply.status_code < 400:
                try:
                    data = reply.json()
                except ValueError:
                    raise EndpointError(f"malformed reply (not JSON, HTTP {reply.status_code})"
                                        f": {reply.text[:200]!r}") from None
                text = parse_reply(cfg, data)
                if counter is not None:
                    counter.add(data)
                return text
            last = f"HTTP {reply.status_code}: {reply.text[:200]!r}"
            if reply.status_code not in RETRY_STATUS:
                raise EndpointError(last)
        if attempt < cfg.retries:
            sleep(_wait(cfg, attempt, reply))
    raise EndpointError(f"failed after {cfg.retries + 1} attempts; last: {last}")


def endpoint_runner(cfg: EndpointConfig, *, max_tokens: int,
                    sleep: Callable[[float], None] = time.sleep):
    """A runner (:data:`lcjax.eval.runners.Runner`) sending each prompt to ``cfg``'s endpoint,
    ``cfg.concurrency`` at a time, yielding answers as they finish."""
    local = threading.local()

    def one(prompt: bytes) -> str:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        return complete(cfg, prompt.decode("utf-8", "replace"), max_tokens,
                        session=local.session, sleep=sleep)

    def run(prompts: list[bytes]):
        pool = concurrent.futures.ThreadPoolExecutor(cfg.concurrency,
                                                     thread_name_prefix="lcjax-eval")
        try:
            futures = {pool.submit(one, p): i for i, p in enumerate(prompts)}
            for fut in concurrent.futures.as_completed(futures):
                i = futures[fut]
                try:
                    yield i, fut.result(), None
                except EndpointError as e:
                    yield i, None, str(e)
                except Exception as e:  # anything unexpected fails the item, not the run
                    yield i, None, f"{type(e).__name__}: {e}"
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    return run
