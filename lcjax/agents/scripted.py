"""A scripted OpenAI-compatible server playing ACON's agent, compressor and optimiser.

A FastAPI app (``/v1/completions``, ``/v1/chat/completions``) that recognises the ACON
prompts of :mod:`lcjax.agents.acon` by their first line and answers deterministically:

* agent: :func:`lcjax.agents.envs.reference_policy` on the prompt (``next``, then the fact's
  value if the context still holds it);
* compressor: keeps the lines that state a fact (``The <fact> is <value>.``) or ask a
  question and drops routine output; unless the guideline asks to keep codes, numbers,
  identifiers or digits, it also blanks every digit (``K-48213`` -> ``K-#####``), the
  failure a vague guideline causes;
* analysis: names the values present in the full trajectory and missing from the
  compressed one;
* rewrite: appends "Keep every code, number and identifier verbatim." to the guideline when
  the feedback says digits or a code were lost.

``usage`` counts UTF-8 bytes (prompt, completion), ``app.state.calls`` counts answered
requests per role, and ``app.state.faults`` (``{n: kind}``: request ``n``, counted from 0 in
``app.state.requests``, fails) injects ``"500"``, ``"timeout"`` (sleeps
``app.state.delay_s``, then a 504 nobody reads), ``"malformed"`` (no choices) or
``"not_json"``. :class:`ThreadedServer` runs an app with uvicorn on 127.0.0.1.
"""

from __future__ import annotations

import collections
import re
import socket
import threading
import time

from lcjax.optional import require

with require("serve", "lcjax.agents.scripted"):
    from fastapi import Request

from lcjax.agents import acon
from lcjax.agents.envs import FACTS

__all__ = ["ThreadedServer", "create_scripted_app", "scripted_compress", "scripted_reply"]

KEEP_DIGITS = re.compile(r"\b(codes?|numbers?|identifiers?|digits?|verbatim)\b", re.IGNORECASE)
VALUE = re.compile(r"\b[A-Z]-\d{3,}")
FIX = "Keep every code, number and identifier verbatim."
_NAMES = "|".join(re.escape(name) for name, _ in FACTS)
_FACT_LINE = re.compile(rf"(The (?:{_NAMES}) is \S+|Question: .*)")


def _first_line(template: str) -> str:
    return template.split("\n")[0].split("{")[0]


ROLES = {"agent": _first_line(acon.AGENT_PROMPT),
         "compress_history": _first_line(acon.COMPRESS_HISTORY_PROMPT),
         "compress_obs": _first_line(acon.COMPRESS_OBS_PROMPT),
         "analyse": _first_line(acon.ANALYSE_PROMPT),
         "rewrite": _first_line(acon.REWRITE_PROMPT)}


def scripted_compress(text: str, guideline: str) -> str:
    """The fact and question lines of ``text`` (space-joined), digits blanked to ``#`` unless
    ``guideline`` asks to keep codes/numbers/identifiers/digits; ``"(routine output)"``
    when nothing is kept."""
    kept = " ".join(_FACT_LINE.findall(text)) or "(routine output)"
    return kept if KEEP_DIGITS.search(guideline) else re.sub(r"\d", "#", kept)


def _between(prompt: str, start: str, end: str) -> str:
    head = prompt.split(start, 1)[-1]
    return head.split(end, 1)[0]


def scripted_reply(prompt: str) -> tuple[str, str]:
    """``(role, reply)`` for one prompt (role ``"other"`` answers ``""``)."""
    role = next((r for r, first in ROLES.items() if prompt.startswith(first)), "other")
    if role == "agent":
        body = prompt[len(ROLES["agent"]):]
        last = body.rsplit("Observation ", 1)[-1]
        if "Question:" not in last:
            return role, "next"
        fact = re.search(r"what is the (.+?)\?", last)
        value = fact and re.search(rf"{re.escape(fact.group(1))} is ([A-Z]-[\d#]+)", body)
        return role, f"answer {value.group(1)}" if value else "answer unknown"
    if role in ("compress_history", "compress_obs"):
        guideline = _between(prompt, "Guideline: ", "\n")
        return role, scripted_compress(prompt.split("\n\n", 1)[-1], guideline)
    if role == "analyse":
        full = _between(prompt, "FULL CONTEXT TRAJECTORY:\n", "\n\nCOMPRESSED CONTEXT")
        comp = _between(prompt, "COMPRESSED CONTEXT TRAJECTORY:\n", "\n\nLost information:")
        lost = [v for v in dict.fromkeys(VALUE.findall(full)) if v not in comp]
        if not lost:
            return role, "Nothing specific was lost."
        return role, (f"The compressed history lost the value {', '.join(lost)}: its digits "
                      "were removed, so the code could not be reported.")
    if role == "rewrite":
        guideline = _between(prompt, "Current guideline: ", "\n\n")
        feedback = _between(prompt, "What was lost:\n", "\n\nNew guideline:")
        if re.search(r"\b(digits|code)\b", feedback) and FIX not in guideline:
            return role, f"{guideline} {FIX}"
        return role, guideline
    return role, ""


def create_scripted_app():
    """The FastAPI app (state: ``calls`` Counter per answered role, ``prompts`` list of
    (role, prompt), ``headers`` and ``bodies`` of every request, ``requests`` count,
    ``faults`` dict, ``delay_s``)."""
    with require("serve", "lcjax.agents.scripted"):
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse, PlainTextResponse

    app = FastAPI()
    app.state.calls = collections.Counter()
    app.state.prompts = []
    app.state.headers, app.state.bodies = [], []  # of every request, for tests
    app.state.faults = {}
    app.state.requests = 0
    app.state.delay_s = 1.0
    lock = threading.Lock()

    def answer(body: dict, chat: bool, headers: dict):
        with lock:
            app.state.headers.append(headers)
            app.state.bodies.append(body)
            fault = app.state.faults.get(app.state.requests)
            app.state.requests += 1
        if fault == "500":
            return JSONResponse({"error": {"message": "scripted failure", "type": "server",
                                           "param": None, "code": None}}, status_code=500)
        if fault == "timeout":  # answer too late, and record nothing (the client has gone)
            time.sleep(app.state.delay_s)
            return JSONResponse({"error": {"message": "too late", "type": "server",
                                           "param": None, "code": None}}, status_code=504)
        if fault == "malformed":
            return JSONResponse({"object": "text_completion", "choices": []})
        if fault == "not_json":
            return PlainTextResponse("<html>oops</html>")
        if chat:
            prompt = "\n".join(m.get("content", "") for m in body.get("messages", [])
                               if m.get("role") == "user")
        else:
            prompt = body.get("prompt", "")
        role, text = scripted_reply(prompt)
        with lock:
            app.state.calls[role] += 1
            app.state.prompts.append((role, prompt))
        usage = {"prompt_tokens": len(prompt.encode()),
                 "completion_tokens": len(text.encode()),
                 "total_tokens": len(prompt.encode()) + len(text.encode())}
        choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                   "finish_reason": "stop"} if chat else
                  {"index": 0, "text": text, "finish_reason": "stop"})
        return JSONResponse({"object": "chat.completion" if chat else "text_completion",
                             "model": body.get("model") or "scripted", "choices": [choice],
                             "usage": usage})

    @app.post("/v1/completions")
    def completions(body: dict, request: Request):
        return answer(body, False, dict(request.headers))

    @app.post("/v1/chat/completions")
    def chat_completions(body: dict, request: Request):
        return answer(body, True, dict(request.headers))

    return app


class ThreadedServer:
    """uvicorn serving an ASGI ``app`` in a daemon thread on a free 127.0.0.1 port
    (``url``); a context manager. ``config``: more ``uvicorn.Config`` keywords."""

    def __init__(self, app, *, start_timeout: float = 60.0, **config):
        with require("serve", "lcjax.agents.scripted.ThreadedServer"):
            import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **config))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.start_timeout = start_timeout

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("ThreadedServer: uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
