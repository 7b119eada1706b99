"""``lcjax serve``: serve a model folder over an OpenAI-compatible HTTP API.

    lcjax serve --checkpoint runs/a --port 8000
    lcjax serve --checkpoint Qwen3-0.6B --host 0.0.0.0 --port 8000 --batch-window-ms 20

``--checkpoint`` is an ``lcjax train --out DIR`` run folder or a Hugging Face checkpoint
folder (:func:`lcjax.serve.load_served`). The server (uvicorn) answers on
``http://HOST:PORT/v1`` until SIGINT or SIGTERM, then stops accepting, gives the requests in
flight at most ``--drain-s`` seconds, fails the rest with 503, stops the batcher and exits
with status 0. The limits (:class:`lcjax.serve.app.ServeLimits`) are flags of the same
names; see ``docs/serve.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading

from lcjax.attention.options import attention_options_arg
from lcjax.optional import require
from lcjax.serve.model import load_served


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``lcjax serve`` flags to ``parser``."""
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="an `lcjax train` run folder or a Hugging Face checkpoint folder")
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="default 8000")
    parser.add_argument("--name", help="the served model id (default: the folder's name)")
    parser.add_argument("--max-len", type=int, metavar="INT",
                        help="context: prompt + max_tokens (default: the model's)")
    parser.add_argument("--batch-window-ms", type=float, default=10.0, metavar="MS",
                        help="how long a batch waits for more requests (default 10)")
    parser.add_argument("--max-batch", type=int, default=8, metavar="INT",
                        help="the most requests in one generate call (default 8)")
    parser.add_argument("--min-bucket", type=int, default=16, metavar="INT",
                        help="smallest padded prompt length (default 16)")
    from lcjax.serve.app import ServeLimits

    d = ServeLimits()
    lim = parser.add_argument_group("limits (docs/serve.md)")
    lim.add_argument("--max-rows", type=int, default=d.max_rows, metavar="INT",
                     help=f"most generations (prompts x n) per request; more: 400 "
                     f"(default {d.max_rows})")
    lim.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, metavar="INT",
                     help=f"largest request body; more: 413 (default {d.max_body_bytes})")
    lim.add_argument("--max-queued-rows", type=int, default=d.max_queued_rows, metavar="INT",
                     help="most unfinished generations, all requests together; more: 429 "
                     f"with Retry-After (default {d.max_queued_rows})")
    lim.add_argument("--retry-after-s", type=int, default=d.retry_after_s, metavar="S",
                     help=f"the 429's Retry-After (default {d.retry_after_s})")
    lim.add_argument("--request-timeout-s", type=float, default=d.request_timeout_s,
                     metavar="S", help="a request still waiting after this long: 504 "
                     f"(default {d.request_timeout_s:g})")
    lim.add_argument("--drain-s", type=float, default=d.drain_s, metavar="S",
                     help=f"on SIGTERM, how long requests in flight may finish "
                     f"(default {d.drain_s:g})")
    lim.add_argument("--max-shapes", type=int, default=32, metavar="INT",
                     help="most compiled generate shapes kept (default 32)")
    lim.add_argument("--precompile", default=None, metavar="PROMPT_LEN:MAX_TOKENS",
                     help="compile the greedy shapes up to these prompt tokens and this "
                     "max_tokens before accepting requests (default: none)")
    parser.add_argument("--attention", default=None, metavar="NAME",
                        help="attention variant to serve with (default: the checkpoint's); "
                        "e.g. token_sparse")
    parser.add_argument("--attention-options", type=attention_options_arg, default=None,
                        metavar="JSON",
                        help="the variant's options as a JSON object (or @FILE)")
    parser.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"])


def _server_class():
    """uvicorn's Server, except that SIGINT/SIGTERM end it with status 0: uvicorn (>= 0.29)
    re-raises the signal after its graceful shutdown, so the process would die by it."""
    with require("serve", "lcjax serve"):
        import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            before = {s: signal.signal(s, self.handle_exit)
                      for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in before.items():
                    signal.signal(s, handler)

    return Server


def run(args: argparse.Namespace) -> int:
    """Loads the model and serves it until SIGINT/SIGTERM; returns the exit status."""
    with require("serve", "lcjax serve"):
        import uvicorn

    from lcjax.serve.app import ServeLimits, create_app

    try:
        limits = ServeLimits(max_rows=args.max_rows, max_body_bytes=args.max_body_bytes,
                             max_queued_rows=args.max_queued_rows,
                             retry_after_s=args.retry_after_s,
                             request_timeout_s=args.request_timeout_s, drain_s=args.drain_s)
    except ValueError as e:
        raise SystemExit(f"lcjax serve: {e}") from None
    precompile = None
    if args.precompile:
        try:
            precompile = tuple(int(x) for x in args.precompile.split(":"))
            assert len(precompile) == 2 and min(precompile) >= 1
        except (ValueError, AssertionError):
            raise SystemExit(f"lcjax serve: --precompile takes PROMPT_LEN:MAX_TOKENS (two ints "
                             f">= 1), got {args.precompile!r}") from None
    served = load_served(args.checkpoint, name=args.name, max_len=args.max_len,
                         attention=args.attention, attention_options=args.attention_options)
    app = create_app(served, batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
                     min_bucket=args.min_bucket, limits=limits, max_shapes=args.max_shapes,
                     precompile=precompile)
    print(f"lcjax serve: {served.name!r} (context {served.max_len}) on "
          f"http://{args.host}:{args.port}/v1", flush=True)
    server = _server_class()(uvicorn.Config(app, host=args.host, port=args.port,
                                           log_level=args.log_level,
                                           timeout_graceful_shutdown=args.drain_s))
    server.run()
    return 0 if server.started else 1
