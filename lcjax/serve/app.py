"""The OpenAI-compatible HTTP API of ``lcjax serve`` (FastAPI).

Routes (``model`` may be left out: the served model answers, as in vLLM)::

    GET  /v1/models             {"object": "list", "data": [{"id", "object": "model", ...}]}
    POST /v1/completions        {"model", "prompt": str | [str], "max_tokens" (16), ...}
    POST /v1/chat/completions   {"model", "messages": [{"role", "content"}], ...}
    GET  /health                {"status": "ok"}
    GET  /v1/lcjax/stats        the batcher's counters (generate calls, batch sizes, shapes)

Sampling fields: ``temperature`` (OpenAI's default 1; 0 = greedy), ``top_p``, ``seed``,
``stop`` (a string or up to 4: the reply is cut before the first occurrence, finish_reason
"stop"), ``n`` (replies per prompt; with a seed, reply i uses ``(seed + i) mod 2**64``;
seeds lie in [0, 2**64); a temperature below ``MIN_TEMPERATURE`` runs greedy), ``max_tokens``
(chat also ``max_completion_tokens``; chat's default is what the context leaves, at most
``default_chat_max_tokens``), ``stream`` (server-sent events: ``data: {chunk}`` lines, then
``data: [DONE]``; the chunks are sent once the batch has been generated, since one jitted
``generate`` call makes the whole reply). Replies carry ``usage`` (prompt, completion and
total tokens) and ``finish_reason`` ("stop": a stop id or string ended it; "length":
``max_tokens`` did).

Log-probs: completions take ``logprobs`` (null, or an int in [0, 5]) and answer OpenAI's
legacy object ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` per choice;
chat takes ``logprobs: true`` (and ``top_logprobs`` in [0, 5]) and answers
``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``. The numbers are
``generate``'s own (``return_logprobs`` / ``top_logprobs``: the model's log-softmax at
temperature 1, no top-p filtering, whatever the request's sampling), one per completion
token (those ``usage.completion_tokens`` counts, a final stop token included).

Errors use OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for an
invalid request (FastAPI's 422 validation errors included, ``param`` naming the field), 400
``context_length_exceeded`` when prompt tokens + ``max_tokens`` exceed the model's context,
404 ``model_not_found`` for another model id, 404/405 for unknown routes, 500 when
generation fails. :class:`ServeLimits` bound every request: 400 ``too_many_generations``
(prompts x ``n`` > ``max_rows``), 413 (body > ``max_body_bytes``), 429 with ``Retry-After``
(``max_queued_rows``), 504 (``request_timeout_s``), 503 while shutting down; a client that
disconnects has its waiting generations cancelled. Integers are strict (``true`` is not 1)
and text must be valid Unicode (a lone surrogate is a 400).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from typing import Annotated, Literal

import numpy as np

from lcjax.optional import require

with require("serve", "lcjax.serve"):
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from pydantic import (
        BaseModel,
        BeforeValidator,
        ConfigDict,
        Field,
        StrictBool,
        StrictInt,
        model_validator,
    )
    from starlette.exceptions import HTTPException as StarletteHTTPException

from lcjax.serve.batcher import SEED_LIMIT, TOP_LOGPROBS, Batcher, Generation, ShuttingDown
from lcjax.serve.model import ROLES, ServedModel

__all__ = ["APIError", "ChatRequest", "CompletionRequest", "ServeLimits", "chat_logprobs",
           "completion_logprobs", "create_app", "cut_at_stop"]

MAX_N = 8
# below this a temperature runs greedy: logits / T overflow float32 near T = 1e-38, and at
# T = 1e-4 a logit gap of 0.01 already has odds e**100, i.e. the argmax
MIN_TEMPERATURE = 1e-4


@dataclasses.dataclass(frozen=True)
class ServeLimits:
    """What one server accepts (all bounded; ``lcjax serve`` flags of the same names).

    Attributes:
      max_rows: the most generations per request (prompts x ``n``); more is a 400.
      max_body_bytes: the largest request body; more is a 413 (read no further).
      max_queued_rows: the most generations submitted and unfinished, all requests
        together; a request that would pass it is a 429 with ``Retry-After``.
      retry_after_s: the ``Retry-After`` of that 429, seconds.
      request_timeout_s: a request still waiting after this long is a 504 and its
        generations not yet started are cancelled.
      drain_s: on shutdown, how long the batch that is running may take (the waiting
        requests fail with 503 at once).
    """

    max_rows: int = 64
    max_body_bytes: int = 4 << 20
    max_queued_rows: int = 256
    retry_after_s: int = 1
    request_timeout_s: float = 120.0
    drain_s: float = 10.0

    def __post_init__(self):
        for name in ("max_rows", "max_body_bytes", "max_queued_rows", "retry_after_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ServeLimits: `{name}` must be an int >= 1, got {value!r}")
        for name in ("request_timeout_s", "drain_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServeLimits: `{name}` must be > 0, got "
                                 f"{getattr(self, name)!r}")
        if self.max_queued_rows < self.max_rows:
            raise ValueError(f"ServeLimits: `max_queued_rows` ({self.max_queued_rows}) must be "
                             f">= `max_rows` ({self.max_rows}), or no full request could run")


class APIError(Exception):
    """An error reply: HTTP ``status`` and OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error",
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status, message, param, code, type)
        self.headers = headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, param=self.param, code=self.code,
                              type=self.type, headers=self.headers)


def error_response(status: int, message: str, *, param: str | None = None,
                   code: str | None = None, type: str = "invalid_request_error",
                   headers: dict | None = None) -> JSONResponse:
    """OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``."""
    return JSONResponse({"error": {"message": message, "type": type, "param": param,
                                   "code": code}}, status_code=status, headers=headers)


# --- request bodies ---------------------------------------------------------------------

def _no_bool(value):
    """JSON true/false is not a number (pydantic's lax mode would take it as 1/0)."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    return value


Number = Annotated[float, BeforeValidator(_no_bool)]


# OpenAI request fields this server does not implement, with the value that means "off":
# any other value is refused (400 naming the field), never silently ignored.
UNSUPPORTED_FIELDS = {"echo": False, "best_of": 1, "suffix": None, "logit_bias": None,
                      "presence_penalty": 0, "frequency_penalty": 0, "tools": None,
                      "tool_choice": None, "response_format": None}


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data):
        """A field of OpenAI's API that lcjax serve does not implement, set to anything
        but its "off" value, is an error (computing without it would be a silent
        fallback); ``logit_bias: {}`` counts as off."""
        if isinstance(data, dict):
            for name, off in UNSUPPORTED_FIELDS.items():
                value = data.get(name, off)
                if value != off and value != {} and not (off == 0 and value == 0.0):
                    raise ValueError(f"`{name}` is not supported by lcjax serve (got "
                                     f"{value!r}; leave it out or set it to {off!r})")
        return data

    model: str | None = None  # None: the served model (as vLLM; the eval client may omit it)
    temperature: Annotated[Number, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[Number, Field(gt=0, le=1)] = 1.0
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    seed: Annotated[StrictInt, Field(ge=0, lt=SEED_LIMIT)] | None = None
    stream: StrictBool = False
    user: str | None = None


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: ``prompt`` a string or a list of them."""

    prompt: str | Annotated[list[str], Field(min_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = 16
    # null: no log-probs; k: the chosen tokens' and the k most likely tokens' log-probs
    logprobs: Annotated[StrictInt, Field(ge=0, le=TOP_LOGPROBS)] | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal[ROLES]  # type: ignore[valid-type]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatRequest(_Sampling):
    """``POST /v1/chat/completions``: ``messages`` with ``role`` and ``content``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    logprobs: StrictBool | None = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=TOP_LOGPROBS)] | None = None

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("`top_logprobs` needs `logprobs: true`")
        return self


# --- helpers ----------------------------------------------------------------------------

def _stops(stop) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    return [s for s in stops if s]


def cut_at_stop(tokenizer, tokens: np.ndarray, stops: list[str]) -> tuple[str, int, bool]:
    """(text, completion tokens, stopped by a string): the text before the first stop
    string, and the fewest tokens whose text contains it (a binary search: containing a
    stop string only grows with the prefix)."""
    text = tokenizer.decode(tokens)
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if not hits:
        return text, len(tokens), False
    found = lambda k: any(s in tokenizer.decode(tokens[:k]) for s in stops)
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if found(mid) else (mid + 1, hi)
    return text[:min(hits)], lo, True


def _token_texts(tokenizer, ids) -> list[str]:
    """The text of each token alone (a special token decodes to "")."""
    return [tokenizer.decode(np.asarray([i], np.int32)) for i in np.asarray(ids).reshape(-1)]


def _top(tokenizer, gen: Generation, i: int, k: int) -> dict[str, float]:
    """Step i's ``k`` most likely tokens and the chosen one: text -> log-prob."""
    top = {}
    for tid, lp in zip(gen.top_ids[i, :k], gen.top_logprobs[i, :k]):
        top.setdefault(_token_texts(tokenizer, [tid])[0], float(lp))
    top.setdefault(_token_texts(tokenizer, [gen.tokens[i]])[0], float(gen.logprobs[i]))
    return top


def completion_logprobs(tokenizer, gen: Generation, count: int, k: int) -> dict:
    """OpenAI's legacy completions ``logprobs`` object of the first ``count`` tokens of
    ``gen``: ``tokens`` (each token's text), ``token_logprobs`` (log p of each),
    ``top_logprobs`` (per token, the ``k`` most likely tokens and the chosen one, text ->
    log-prob) and ``text_offset`` (where each token's text starts in the choice's text)."""
    ids = gen.tokens[:count]
    offsets = [len(tokenizer.decode(ids[:i])) for i in range(len(ids))]
    return {"tokens": _token_texts(tokenizer, ids),
            "token_logprobs": [float(x) for x in gen.logprobs[:count]],
            "top_logprobs": [_top(tokenizer, gen, i, k) for i in range(len(ids))],
            "text_offset": offsets}


def chat_logprobs(tokenizer, gen: Generation, count: int, k: int) -> dict:
    """OpenAI's chat ``logprobs`` object of the first ``count`` tokens of ``gen``:
    ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
    "bytes"}] (the k most likely)}]}``."""
    def entry(text: str, lp: float) -> dict:
        return {"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8"))}

    content = []
    for i, text in enumerate(_token_texts(tokenizer, gen.tokens[:count])):
        tops = [entry(t, lp) for t, lp in zip(_token_texts(tokenizer, gen.top_ids[i, :k]),
                                               gen.top_logprobs[i, :k])]
        content.append({**entry(text, gen.logprobs[i]), "top_logprobs": tops})
    return {"content": content}


def _finish(served: ServedModel, gen: Generation, stops: list[str]) -> tuple[str, int, str]:
    """(text, completion tokens, finish_reason) of one generation."""
    text, count, by_string = cut_at_stop(served.tokenizer, gen.tokens, stops)
    return text, count, "stop" if (by_string or gen.stopped) else "length"


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _param(loc) -> str:
    """The field path of a pydantic error location, e.g. ``messages.0.role``: the leading
    ``body`` and union-branch labels (``str``, ``list[str]``, ...) left out."""
    parts = []
    for x in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(x, int) or (isinstance(x, str) and x.isidentifier()
                                  and x not in _TYPE_NAMES):
            parts.append(str(x))
        else:
            break
    return ".".join(parts)


def _check_context(served: ServedModel, prompt_tokens: int, max_tokens: int,
                   param: str) -> None:
    if prompt_tokens + max_tokens > served.max_len:
        raise APIError(400, f"This model's maximum context length is {served.max_len} tokens; "
                       f"the prompt has {prompt_tokens} tokens and max_tokens is {max_tokens} "
                       f"({prompt_tokens + max_tokens} in all). Shorten the prompt or lower "
                       "max_tokens.", param=param, code="context_length_exceeded")


def _check_model(served: ServedModel, name: str | None) -> None:
    if name is not None and name != served.name:
        raise APIError(404, f"The model {name!r} does not exist; this server serves "
                       f"{served.name!r}.", param="model", code="model_not_found")


def _check_text(text: str | None, param: str) -> None:
    """400 unless ``text`` is valid Unicode (JSON lets a lone surrogate such as
    ``"\\ud800"`` through; no tokenizer can encode it)."""
    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(400, f"`{param}` is not valid Unicode text: a lone surrogate "
                       f"{text[e.start]!a} at character {e.start}", param=param,
                       code="invalid_text") from None


def _check_rows(rows: int, limits: ServeLimits, param: str) -> None:
    if rows > limits.max_rows:
        raise APIError(400, f"This request asks for {rows} generations (prompts x n); the "
                       f"server takes at most {limits.max_rows} per request (max_rows). "
                       "Split it into several requests.", param=param,
                       code="too_many_generations")


async def _generate_all(batcher: Batcher, prompts: list[np.ndarray], max_tokens: list[int],
                        req: _Sampling, request: Request,
                        limits: ServeLimits) -> list[list[Generation]]:
    """``req.n`` generations per prompt, all submitted at once (so they batch), within the
    queue limit (429), the request deadline (504) and while the client is connected (the
    generations not yet started are cancelled otherwise)."""
    rows = len(prompts) * req.n
    if batcher.pending + rows > limits.max_queued_rows:
        raise APIError(429, f"The server is busy: {batcher.pending} generations are queued and "
                       f"this request adds {rows} (max_queued_rows={limits.max_queued_rows}). "
                       f"Retry after {limits.retry_after_s} s.", code="server_busy",
                       type="rate_limit_error",
                       headers={"Retry-After": str(limits.retry_after_s)})
    temperature = 0.0 if req.temperature < MIN_TEMPERATURE else req.temperature
    futures = [batcher.submit(ids, m, temperature=temperature, top_p=req.top_p,
                              seed=None if req.seed is None else (req.seed + i) % SEED_LIMIT)
               for ids, m in zip(prompts, max_tokens) for i in range(req.n)]
    gathered = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    gathered.add_done_callback(_retrieve)  # a cancelled or abandoned gather logs nothing
    loop = asyncio.get_running_loop()
    end = loop.time() + limits.request_timeout_s
    try:
        while not gathered.done():
            left = end - loop.time()
            if left <= 0:
                raise APIError(504, f"The request did not finish within the server's "
                               f"{limits.request_timeout_s:g} s (request_timeout_s); its "
                               "generations not yet started were cancelled.",
                               type="server_error", code="timeout")
            await asyncio.wait({gathered}, timeout=min(0.25, left))
            if not gathered.done() and await request.is_disconnected():
                raise APIError(499, "the client disconnected", code="client_disconnected")
        try:
            flat = gathered.result()
        except ShuttingDown:
            raise APIError(503, "The server is shutting down; retry on another server.",
                           type="server_error", code="shutting_down",
                           headers={"Retry-After": str(limits.retry_after_s)}) from None
        except Exception as e:  # the generate call failed: a 500, the server goes on
            raise APIError(500, f"generation failed: {type(e).__name__}: {e}",
                           type="server_error", code="generation_failed") from None
    finally:
        for f in futures:
            f.cancel()  # no-op once started or done
        if not gathered.done():
            gathered.cancel()
    return [flat[i * req.n:(i + 1) * req.n] for i in range(len(prompts))]


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered 413 without reading
    the rest (a ``Content-Length`` over it, before reading anything); the body read is
    replayed to the app, then ``receive`` passes through (so disconnects are seen)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def _too_large(self, scope, receive, send, size: str) -> None:
        await error_response(413, f"The request body has {size} bytes; the server takes at "
                             f"most {self.max_bytes} (max_body_bytes).",
                             code="request_too_large")(scope, receive, send)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(scope, receive, send, declared.decode())
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._too_large(scope, receive, send, f"more than {size - 1}")
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _sse(chunks: list[dict]) -> StreamingResponse:
    async def events():
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


# --- the app ----------------------------------------------------------------------------

def create_app(served: ServedModel, *, batch_window_ms: float = 10.0, max_batch: int = 8,
               min_bucket: int = 16, default_chat_max_tokens: int = 256,
               limits: ServeLimits = ServeLimits(), max_shapes: int = 32,
               precompile: tuple[int, int] | None = None) -> FastAPI:
    """The FastAPI app serving ``served``; its batcher runs while the app does (lifespan)
    and is ``app.state.batcher``.

    Args:
      served: the model, tokenizer, name and context (:func:`lcjax.serve.load_served`).
      batch_window_ms, max_batch, min_bucket: the :class:`~lcjax.serve.Batcher`'s.
      default_chat_max_tokens: a chat reply's ``max_tokens`` when the request gives none
        (at most what the context leaves).
      limits: request, queue, time and body bounds (:class:`ServeLimits`).
      max_shapes: the most compiled ``generate`` shapes kept (the Batcher's).
      precompile: ``(max_prompt_len, max_tokens)``: compile those greedy shapes at startup,
        before the server accepts requests (:meth:`~lcjax.serve.Batcher.precompile`).
    """
    batcher = Batcher(served.model, stop_ids=served.tokenizer.eos_ids,
                      pad_id=served.tokenizer.pad_id, window_ms=batch_window_ms,
                      max_batch=max_batch, min_bucket=min_bucket, max_shapes=max_shapes)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if precompile is not None:
            await asyncio.to_thread(batcher.precompile, *precompile)
        batcher.start()
        try:
            yield
        finally:
            await asyncio.to_thread(batcher.stop, limits.drain_s)

    app = FastAPI(title="lcjax serve", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    app.state.batcher = batcher
    app.state.served = served
    app.state.limits = limits
    _add_error_handlers(app)
    _add_info_routes(app, served, batcher, limits, created=int(time.time()))
    _add_completions_route(app, served, batcher, limits)
    _add_chat_route(app, served, batcher, limits, default_chat_max_tokens)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as an OpenAI error body: :class:`APIError`s as raised, invalid requests
    400 naming the first bad parameter, HTTP errors with their status, anything else 500."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        param = _param(first.get("loc", ())) or None
        detail = "; ".join(f"{_param(e.get('loc', ()))}: {e.get('msg')}" for e in errors)
        return error_response(400, f"Invalid request: {detail}", param=param,
                              code=first.get("type"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, f"{exc.detail}: {request.method} "
                              f"{request.url.path}", code=None,
                              type="invalid_request_error" if exc.status_code < 500
                              else "server_error")

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception):
        return error_response(500, f"generation failed: {type(exc).__name__}: {exc}",
                              type="server_error")


def _add_info_routes(app: FastAPI, served: ServedModel, batcher: Batcher,
                     limits: ServeLimits, *, created: int) -> None:
    """``GET /health``, ``/v1/models``, ``/v1/models/{model_id}`` and ``/v1/lcjax/stats``
    (the batcher's counters, pending requests and the limits)."""

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model",
                                            "created": created, "owned_by": "lcjax"}]}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str):
        _check_model(served, model_id)
        return {"id": served.name, "object": "model", "created": created, "owned_by": "lcjax"}

    @app.get("/v1/lcjax/stats")
    async def stats():
        return {**batcher.stats.as_dict(), "pending": batcher.pending,
                "limits": dataclasses.asdict(limits)}


def _completion_ids(served: ServedModel, req: CompletionRequest, limits: ServeLimits
                    ) -> tuple[list[list[int]], int]:
    """The checked request's token ids per prompt and its ``max_tokens`` (default 16)."""
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    _check_rows(len(prompts) * req.n, limits, "prompt")
    for i, p in enumerate(prompts):
        _check_text(p, "prompt" if isinstance(req.prompt, str) else f"prompt.{i}")
    for s in _stops(req.stop):
        _check_text(s, "stop")
    max_tokens = 16 if req.max_tokens is None else req.max_tokens  # OpenAI's default
    ids = [served.tokenizer.encode(p) for p in prompts]
    for i, x in enumerate(ids):
        if len(x) == 0:
            raise APIError(400, f"prompt {i} has no tokens", param="prompt")
        _check_context(served, len(x), max_tokens, "max_tokens")
    return ids, max_tokens


def _add_completions_route(app: FastAPI, served: ServedModel, batcher: Batcher,
                           limits: ServeLimits) -> None:
    """``POST /v1/completions``: ``n`` completions of each prompt (OpenAI's body; SSE
    with ``stream``: one event per choice, then the usage)."""

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        _check_model(served, req.model)
        ids, max_tokens = _completion_ids(served, req, limits)
        gens = await _generate_all(batcher, ids, [max_tokens] * len(ids), req, request,
                                   limits)
        stops = _stops(req.stop)
        choices, completion = [], 0
        for i, row in enumerate(gens):
            for j, gen in enumerate(row):
                text, count, reason = _finish(served, gen, stops)
                completion += count
                logprobs = (None if req.logprobs is None else
                            completion_logprobs(served.tokenizer, gen, count, req.logprobs))
                choices.append({"index": i * req.n + j, "text": text, "logprobs": logprobs,
                                "finish_reason": reason})
        rid = f"cmpl-{uuid.uuid4().hex}"
        usage = _usage(sum(len(x) for x in ids), completion)
        body = {"id": rid, "object": "text_completion", "created": int(time.time()),
                "model": served.name, "choices": choices, "usage": usage}
        if req.stream:
            return _sse([{**body, "choices": [c], "usage": None} for c in choices]
                        + [{**body, "choices": [], "usage": usage}])
        return body


def _chat_ids(served: ServedModel, req: ChatRequest, limits: ServeLimits,
              default_max_tokens: int) -> tuple[list[int], int]:
    """The checked chat request's prompt ids (through the chat template) and the tokens
    to generate (``max_completion_tokens``, ``max_tokens``, else the default, at most
    what the context leaves)."""
    _check_rows(req.n, limits, "n")
    for i, m in enumerate(req.messages):
        _check_text(m.text(), f"messages.{i}.content")
        _check_text(m.name, f"messages.{i}.name")
    for s in _stops(req.stop):
        _check_text(s, "stop")
    messages = [{"role": m.role, "content": m.text(),
                 **({"name": m.name} if m.name else {})} for m in req.messages]
    try:
        ids = served.tokenizer.encode_chat(messages)
    except Exception as e:  # a template's raise_exception, e.g. roles out of order
        raise APIError(400, f"the chat template failed: {e}", param="messages") from None
    if len(ids) == 0:
        raise APIError(400, "the messages have no tokens", param="messages")
    asked = req.max_completion_tokens or req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    if asked is None:
        asked = min(default_max_tokens, served.max_len - len(ids))
        if asked < 1:
            asked = 1  # then the guard below names the over-long prompt
    _check_context(served, len(ids), asked, param)
    return ids, asked


def _chat_events(body: dict) -> list[dict]:
    """A chat completion ``body`` as SSE chunks: per choice its whole content, then its
    finish reason; last the usage."""
    chunk = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"],
             "model": body["model"]}
    events = []
    for c in body["choices"]:
        events.append({**chunk, "choices": [{"index": c["index"], "delta": {
            "role": "assistant", "content": c["message"]["content"]},
            "logprobs": c["logprobs"], "finish_reason": None}]})
        events.append({**chunk, "choices": [{"index": c["index"], "delta": {},
                                             "logprobs": None,
                                             "finish_reason": c["finish_reason"]}]})
    return events + [{**chunk, "choices": [], "usage": body["usage"]}]


def _add_chat_route(app: FastAPI, served: ServedModel, batcher: Batcher,
                    limits: ServeLimits, default_chat_max_tokens: int) -> None:
    """``POST /v1/chat/completions``: ``n`` replies to the messages (OpenAI's body; SSE
    with ``stream``: :func:`_chat_events`)."""

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):
        _check_model(served, req.model)
        ids, asked = _chat_ids(served, req, limits, default_chat_max_tokens)
        [row] = await _generate_all(batcher, [ids], [asked], req, request, limits)
        stops = _stops(req.stop)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        choices, completion = [], 0
        for j, gen in enumerate(row):
            text, count, reason = _finish(served, gen, stops)
            completion += count
            logprobs = (chat_logprobs(served.tokenizer, gen, count, req.top_logprobs or 0)
                        if req.logprobs else None)
            choices.append({"index": j, "message": {"role": "assistant", "content": text},
                            "logprobs": logprobs, "finish_reason": reason})
        usage = _usage(len(ids), completion)
        body = {"id": rid, "object": "chat.completion", "created": int(time.time()),
                "model": served.name, "choices": choices, "usage": usage}
        if req.stream:
            return _sse(_chat_events(body))
        return body

