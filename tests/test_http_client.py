"""The bounded HTTP client of the evaluator and ACON (lcjax.eval.http_client) against a fake
endpoint on 127.0.0.1 (http.server in a thread) that drips, floods, nests, drops, throttles:
every call ends within its deadline, never stores an oversized reply, never recurses, and
Ctrl-C stops an eval at once keeping exactly the finished items. API key policy."""

import collections
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests

from lcjax.agents import AconAgent, AgentError, RecallTask, run_task
from lcjax.data import ruler
from lcjax.data.suites import Suite, SuiteTask
from lcjax.eval import EndpointConfig, EndpointError, build_items, complete, evaluate
from lcjax.eval.http_client import HttpError, HttpLimits, is_loopback_url, json_depth, post_json
from lcjax.eval.results import read_results

SUITE = Suite("mini", ruler.generate, (SuiteTask("single", "niah_single_1"),
                                       SuiteTask("vt", "vt", uses_depth=False)))
ARGS = dict(lengths=(500,), depths=(0.0,), n_per_cell=2)  # 4 items


class FakeEndpoint:
    """``/v1/completions`` on 127.0.0.1; ``plan(prompt, k)`` names the action of the k-th
    request for ``prompt``: ok, drip (one byte per 0.2 s, forever), huge (``huge_mb`` MB
    with a Content-Length), flood (the same, close-delimited, no length), nested (JSON
    100,000 deep), drop (half a body, then the connection closes), 429 (Retry-After: 0.3)."""

    def __init__(self, plan, *, huge_mb: int = 8):
        self.plan, self.huge_mb = plan, huge_mb
        self.counts = collections.Counter()
        self.auth = []
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body.get("prompt") or body["messages"][-1]["content"]
                with server.lock:
                    k = server.counts[prompt]
                    server.counts[prompt] += 1
                    server.auth.append(self.headers.get("Authorization"))
                try:
                    self.act(server.plan(prompt, k), body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up

            def head(self, code=200, length=None, extra=()):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                if length is not None:
                    self.send_header("Content-Length", str(length))
                else:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                for k, v in extra:
                    self.send_header(k, v)
                self.end_headers()

            def act(self, action, body):
                chat = "messages" in body
                answer = body.get("answer", "fine")
                choice = ({"message": {"role": "assistant", "content": answer}} if chat
                          else {"text": answer})
                ok = json.dumps({"choices": [choice]}).encode()
                if action == "ok":
                    self.head(length=len(ok))
                    self.wfile.write(ok)
                elif action == "drip":
                    self.head(length=10**6)
                    for _ in range(10**6):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(0.2)
                elif action in ("huge", "flood"):
                    text = "x" * (server.huge_mb << 20)
                    payload = json.dumps({"choices": [{"text": text}]}).encode()
                    self.head(length=len(payload) if action == "huge" else None)
                    self.wfile.write(payload)
                elif action == "nested":
                    payload = b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
                    self.head(length=len(payload))
                    self.wfile.write(payload)
                elif action == "drop":
                    self.head(length=len(ok))
                    self.wfile.write(ok[:len(ok) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                elif action == "429":
                    self.head(429, length=2, extra=[("Retry-After", "0.3")])
                    self.wfile.write(b"{}")
                else:
                    raise AssertionError(action)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def cfg(url, **kw):
    return EndpointConfig(url, **{"timeout": 1.0, "retries": 0, "backoff": 0.01, **kw})


def test_json_depth_and_loopback():
    assert json_depth(b'{"a": [1, {"b": "[[[{"}], "c": "\\"]"}') == 3
    assert json_depth(b"3") == 0 and json_depth(b"[" * 500 + b"]" * 500) == 500
    assert is_loopback_url("http://127.0.0.1:8000") and is_loopback_url("http://localhost")
    assert is_loopback_url("http://[::1]:80/v1")
    assert not is_loopback_url("http://example.com") and not is_loopback_url("http://10.0.0.1")
    with pytest.raises(ValueError, match="max_bytes"):
        HttpLimits(max_bytes=0)


def test_slow_drip_eval_finishes_within_its_deadline_with_the_item_an_error(tmp_path):
    items = build_items(SUITE, seed=1, **ARGS)
    slow = items[1].prompt.decode()
    answers = {it.prompt.decode(): ", ".join(r.decode() for r in it.references) for it in items}

    def plan(prompt, k):
        return "drip" if prompt == slow else "ok"

    with FakeEndpoint(plan) as server:
        # the fake answers "fine": every item but the dripping one is answered, wrongly
        path = tmp_path / "results.jsonl"
        t0 = time.monotonic()
        res = evaluate(cfg(server.url, retries=1, concurrency=2), SUITE, seed=1,
                       results_file=path, progress=False, **ARGS)
        took = time.monotonic() - t0
    assert took < 2 * 1.0 + 0.01 + 3.0  # two 1 s attempts and a backoff, plus slack
    by_prompt = {it.prompt.decode(): r for it, r in zip(items, res.records)}
    assert "deadline of 1 s passed" in by_prompt[slow]["error"]
    assert "2 attempts" in by_prompt[slow]["error"]
    assert all(r["error"] is None for p, r in by_prompt.items() if p != slow)
    assert server.counts[slow] == 2 and len(answers) == 4
    assert len(read_results(path)[1]) == 4


@pytest.mark.parametrize("action, message", [("huge", "Content-Length"),
                                             ("flood", "more than max_bytes"),
                                             ("nested", "nested 100001 deep")])
def test_huge_and_nested_replies_are_refused_not_stored(action, message):
    with FakeEndpoint(lambda p, k: action) as server:
        c = cfg(server.url, max_reply_bytes=1 << 20, timeout=20.0)
        with pytest.raises(EndpointError, match=message):
            complete(c, "q", 8)
        assert sum(server.counts.values()) == 1  # not transient: no retry


def test_nested_reply_in_acon_is_an_agent_error_not_a_recursion_error():
    with FakeEndpoint(lambda p, k: "nested") as server:
        agent = AconAgent(cfg(server.url, chat=True, timeout=20.0))
        with pytest.raises(AgentError, match="nested") as err:
            run_task(agent, RecallTask(1, num_steps=2))
        assert err.value.state.step == 0


def test_an_answer_longer_than_max_tokens_allows_is_an_error(monkeypatch):
    import lcjax.eval.endpoint as ep

    real = ep.request_body  # the fake answers the body's `answer` field
    monkeypatch.setattr(ep, "request_body", lambda c, p, m: {**real(c, p, m),
                                                             "answer": "y" * 5000})
    with FakeEndpoint(lambda p, k: "ok") as server:
        with pytest.raises(EndpointError, match="5000 bytes, more than 4096"):
            complete(cfg(server.url), "a", 8)  # 5000 > max(4096, 64 * 8)
        assert complete(cfg(server.url), "a", 100) == "y" * 5000  # 6400 allowed


def test_dropped_and_throttled_replies_are_retried_with_backoff():
    waits = []
    plans = {"drop": ["drop", "ok"], "429": ["429", "429", "ok", "429"]}
    with FakeEndpoint(lambda p, k: plans[p][k]) as server:
        c = cfg(server.url, retries=2, backoff=0.01, max_backoff=5.0)
        assert complete(c, "drop", 8, sleep=waits.append) == "fine"
        assert complete(c, "429", 8, sleep=waits.append) == "fine"
        with pytest.raises(HttpError, match="HTTP 429") as err, requests.Session() as s:
            post_json(s, server.url + "/v1/completions", {"prompt": "429"})
        assert err.value.transient and err.value.retry_after == 0.3
    assert waits[0] == 0.01 and waits[1:] == [0.3, 0.3]  # Retry-After beats the backoff
    assert server.counts == {"drop": 2, "429": 4}


def test_the_key_is_sent_only_where_the_user_says(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-global")
    monkeypatch.setenv("LCJAX_TEST_KEY", "sk-local")
    with FakeEndpoint(lambda p, k: "ok") as server:
        complete(cfg(server.url), "a", 8)  # default: no key, whatever the environment holds
        complete(cfg(server.url, api_key_env="LCJAX_TEST_KEY"), "b", 8)
    assert server.auth == [None, "Bearer sk-local"]
    with pytest.raises(ValueError, match="plain http"):
        EndpointConfig("http://example.com/v1", api_key_env="OPENAI_API_KEY")
    EndpointConfig("https://example.com/v1", api_key_env="OPENAI_API_KEY")  # fine
    from lcjax.cli import main

    with pytest.raises(SystemExit, match="plain http"):
        main(["eval", "--suite", "ruler", "--endpoint", "http://10.1.2.3:8000",
              "--api-key-env", "OPENAI_API_KEY", "--lengths", "1k", "--out", "/nonexistent"])


# A pytest-xdist worker restarted after a crash ignores SIGINT and its children inherit the
# ignored signal (both fresh-clone failures of the Ctrl-C test below ran on such a worker);
# a user's shell starts Python with the default handler, so the script installs it.
INTERRUPTED_RUN = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
import sys
from lcjax.data import ruler
from lcjax.data.suites import Suite, SuiteTask
from lcjax.eval import EndpointConfig, evaluate
suite = Suite("mini", ruler.generate, (SuiteTask("single", "niah_single_1"),
                                       SuiteTask("vt", "vt", uses_depth=False)))
evaluate(EndpointConfig(sys.argv[1], concurrency=2, timeout=600, retries=0), suite,
         (500,), (0.0,), 2, 1, results_file=sys.argv[2], progress=False)
"""


def test_ctrl_c_stops_the_eval_at_once_keeping_the_finished_items(tmp_path):
    items = build_items(SUITE, seed=1, **ARGS)
    fast = {it.prompt.decode() for it in items[:2]}
    path = tmp_path / "results.jsonl"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    with FakeEndpoint(lambda p, k: "ok" if p in fast else "drip") as server:
        proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_RUN, server.url, str(path)],
                                env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                if path.exists() and len(path.read_text().splitlines()) >= 1 + 2 and \
                        sum(server.counts.values()) == 4:
                    break
                time.sleep(0.05)
            assert proc.poll() is None, "the run ended before it was interrupted"
            time.sleep(0.5)  # both dripping requests in flight
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)  # one Ctrl-C
            proc.wait(10)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    assert took < 3.0, took
    assert proc.returncode != 0
    _, finished = read_results(path)
    shas = {it.prompt_sha for it in items[:2]}
    assert {r["prompt_sha"] for r in finished.values()} == shas  # the interrupted: absent
