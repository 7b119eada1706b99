"""``lcjax serve``: serve a model folder over an OpenAI-compatible HTTP API.

    lcjax serve --checkpoint runs/a --port 8000
    lcjax serve --checkpoint Qwen3-0.6B --host 0.0.0.0 --port 8000 --batch-window-ms 20

``--checkpoint`` is an ``lcjax train --out DIR`` run folder or a Hugging Face checkpoint
folder (:func:`lcjax.serve.load_served`). The server (uvicorn) answers on
``http://HOST:PORT/v1`` until SIGINT or SIGTERM, then finishes the requests in flight,
stops the batcher and exits with status 0.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading

from lcjax.attention.options import attention_options_arg


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
    import uvicorn

    from lcjax.serve.app import create_app
    from lcjax.serve.model import load_served

    served = load_served(args.checkpoint, name=args.name, max_len=args.max_len,
                         attention=args.attention, attention_options=args.attention_options)
    app = create_app(served, batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
                     min_bucket=args.min_bucket)
    print(f"lcjax serve: {served.name!r} (context {served.max_len}) on "
          f"http://{args.host}:{args.port}/v1", flush=True)
    server = _server_class()(uvicorn.Config(app, host=args.host, port=args.port,
                                           log_level=args.log_level))
    server.run()
    return 0 if server.started else 1
