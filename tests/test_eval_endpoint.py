"""lcjax.eval through an OpenAI-compatible endpoint: a real HTTP server on 127.0.0.1 that
the test starts, answering from a script (oracle, random, slow, malformed, 500, truncated)."""

import collections
import http.server
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from lcjax.data import ruler
from lcjax.data.suites import Suite, SuiteTask
from lcjax.eval import EndpointConfig, EndpointError, build_items, complete, evaluate
from lcjax.eval.endpoint import endpoint_url, parse_reply
from lcjax.eval.results import read_results

TASKS = (SuiteTask("single", "niah_single_1"), SuiteTask("vt", "vt", uses_depth=False))


def mini_suite() -> Suite:
    return Suite("mini", ruler.generate, TASKS)


class ScriptedServer:
    """A ThreadingHTTPServer on 127.0.0.1 answering ``/v1/completions`` and
    ``/v1/chat/completions``. ``plans[prompt]`` lists the action of each successive request
    for that prompt (then "ok"); ``default`` is the action otherwise. Counts requests per
    prompt and the most requests in flight at once."""

    def __init__(self, answers: dict, plans: dict | None = None, *, default: str = "ok",
                 delay: float = 0.0, slow: float = 1.5, seed: int = 0):
        self.answers, self.plans, self.default = answers, plans or {}, default
        self.delay, self.slow = delay, slow
        self.counts = collections.Counter()
        self.paths, self.auth, self.models = set(), set(), set()
        self.inflight = self.max_inflight = 0
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                chat = self.path == "/v1/chat/completions"
                prompt = body["messages"][-1]["content"] if chat else body["prompt"]
                with server.lock:
                    k = server.counts[prompt]
                    server.counts[prompt] += 1
                    server.paths.add(self.path)
                    server.auth.add(self.headers.get("Authorization"))
                    server.models.add(body.get("model"))
                    server.inflight += 1
                    server.max_inflight = max(server.max_inflight, server.inflight)
                    plan = server.plans.get(prompt, [])
                    action = plan[k] if k < len(plan) else server.default
                self.counted = True
                try:
                    time.sleep(server.delay)
                    self.act(action, prompt, chat)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left
                finally:
                    self.leave()

            def leave(self):
                # in flight until the reply starts: once the client has it, its thread may
                # send the next request before this handler thread gets to run again
                if getattr(self, "counted", False):
                    self.counted = False
                    with server.lock:
                        server.inflight -= 1

            def send(self, code: int, payload: bytes, length: int | None = None):
                self.leave()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload) if length is None
                                                       else length))
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()

            def act(self, action: str, prompt: str, chat: bool):
                if action in ("ok", "slow", "random"):
                    if action == "slow":
                        time.sleep(server.slow)
                    text = (server.answers[prompt] if action != "random"
                            else str(server.rng.randrange(10**6, 10**7)))
                    choice = {"message": {"role": "assistant", "content": text}} if chat \
                        else {"text": text}
                    self.send(200, json.dumps({"choices": [choice]}).encode())
                elif action == "malformed":
                    self.send(200, b'{"choices": [{"text": "oops')
                elif action == "missing":
                    self.send(200, json.dumps({"choices": []}).encode())
                elif action == "truncated":  # promise 400 bytes, send 20, hang up
                    self.close_connection = True
                    self.send(200, json.dumps({"choices": [{"text": "x" * 300}]}).encode()[:20],
                              length=400)
                elif action.isdigit():
                    self.send(int(action), b"server error")
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
        self.thread.join(10)


def oracle_answers(items) -> dict[str, str]:
    return {it.prompt.decode(): ", ".join(r.decode() for r in it.references) for it in items}


def cfg(url, **kw) -> EndpointConfig:
    return EndpointConfig(url, **{"model": "m", "timeout": 0.5, "retries": 2, "backoff": 0.01,
                                  "concurrency": 3, "api_key_env": "LCJAX_TEST_KEY", **kw})


ARGS = dict(lengths=(500, 700), depths=(0.0, 1.0), n_per_cell=2)  # 12 items


def test_endpoint_oracle_failures_and_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("LCJAX_TEST_KEY", "secret")
    items = build_items(mini_suite(), seed=3, **ARGS)
    prompts = [it.prompt.decode() for it in random.Random(0).sample(items, 9)]
    plans = {  # what each of these prompts gets on its 1st, 2nd, 3rd request
        prompts[0]: ["500", "ok"], prompts[1]: ["slow", "ok"], prompts[2]: ["truncated", "ok"],
        prompts[3]: ["500"] * 3, prompts[4]: ["truncated"] * 3, prompts[5]: ["slow"] * 3,
        prompts[6]: ["malformed"], prompts[7]: ["missing"], prompts[8]: ["400"],
    }
    requests_per_prompt = [2, 2, 2, 3, 3, 3, 1, 1, 1]
    failed = set(prompts[3:])
    path = tmp_path / "results.jsonl"
    with ScriptedServer(oracle_answers(items), plans) as server:
        res = evaluate(cfg(server.url), mini_suite(), seed=3, results_file=path,
                       progress=False, **ARGS)
        assert server.paths == {"/v1/completions"} and server.models == {"m"}
        assert server.auth == {"Bearer secret"}
        for p, n in zip(prompts, requests_per_prompt):
            assert server.counts[p] == n, (plans[p], server.counts[p])
        assert sum(server.counts.values()) == len(items) - 9 + sum(requests_per_prompt)

        by_prompt = {it.prompt.decode(): r for it, r in zip(items, res.records)}
        for p, r in by_prompt.items():
            if p in failed:
                assert r["error"] and r["prediction"] is None and r["string_match_all"] == 0
            else:
                assert r["error"] is None and r["string_match_all"] == 100.0
        errors = [by_prompt[p]["error"] for p in prompts[3:]]
        assert "HTTP 500" in errors[0] and "3 attempts" in errors[0]
        assert "3 attempts" in errors[1] and "3 attempts" in errors[2]
        assert "malformed" in errors[3] and "not JSON" in errors[3]
        assert "malformed" in errors[4] and "choices[0].text" in errors[4]
        assert "HTTP 400" in errors[5]
        s = res.summary["overall"]
        assert s["errors"] == 6 and s["n"] == 12
        assert s["string_match_all"] == pytest.approx(100 * 6 / 12)
        _, saved = read_results(path)
        assert len(saved) == 12

        # restart: finished items are skipped (errors too without retry_errors)
        before = sum(server.counts.values())
        again = evaluate(cfg(server.url), mini_suite(), seed=3, results_file=path, resume=True,
                         retry_errors=False, progress=False, **ARGS)
        assert sum(server.counts.values()) == before
        assert again.records == res.records and again.config["resumed"] == 12

        # restart retrying the errors: only those are requested (and now answered)
        counts = server.counts.copy()
        fixed = evaluate(cfg(server.url), mini_suite(), seed=3, results_file=path,
                         resume=True, progress=False, **ARGS)
        assert server.counts - counts == collections.Counter(failed)
        assert fixed.summary["overall"] == {"n": 12, "errors": 0, "string_match_all": 100.0,
                                            "string_match_part": 100.0}
        with pytest.raises(ValueError, match="resume=True"):
            evaluate(cfg(server.url), mini_suite(), seed=3, results_file=path,
                     progress=False, **ARGS)
        with pytest.raises(ValueError, match="seed"):
            evaluate(cfg(server.url), mini_suite(), seed=4, results_file=path, resume=True,
                     progress=False, **ARGS)


def test_endpoint_random_is_near_chance_chat_and_concurrency():
    items = build_items(mini_suite(), seed=5, **ARGS)
    with ScriptedServer(oracle_answers(items), default="random", delay=0.05) as server:
        res = evaluate(cfg(server.url, chat=True, concurrency=2, model=None, timeout=5),
                       mini_suite(), seed=5, progress=False, **ARGS)
        assert server.paths == {"/v1/chat/completions"} and server.models == {None}
        assert server.auth == {None}  # LCJAX_TEST_KEY unset: no key sent
        assert server.max_inflight == 2  # at most `concurrency`, and really concurrent
    s = res.summary["overall"]
    assert s["errors"] == 0 and s["string_match_all"] <= 5 and s["string_match_part"] <= 10
    assert all(r["prediction"].isdigit() for r in res.records)


def test_endpoint_oracle_chat_via_cli(tmp_path, capsys):
    from lcjax.cli import main
    from lcjax.data.suites import register_suite

    register_suite("eval_endpoint_mini", mini_suite)
    items = build_items(mini_suite(), (500,), (0.5,), 2, seed=0)
    with ScriptedServer(oracle_answers(items)) as server:
        argv = ["eval", "--suite", "eval_endpoint_mini", "--endpoint", server.url + "/v1",
                "--api-model", "m", "--chat", "--lengths", "500", "--depths", "0.5",
                "--n-per-cell", "2", "--out", str(tmp_path), "--no-progress",
                "--retries", "0", "--timeout", "5"]
        assert main(argv) == 0
        assert server.paths == {"/v1/chat/completions"} and sum(server.counts.values()) == 4
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["overall"]["string_match_all"] == 100.0 and out["overall"]["n"] == 4
        assert main(argv + ["--resume"]) == 0  # nothing left to ask
        assert sum(server.counts.values()) == 4
    for name in ("results.json", "results.md", "results.jsonl", "single_heatmap.png",
                 "vt_heatmap.png"):
        assert (tmp_path / name).stat().st_size > 0


KILLED_RUN = """
import sys
from lcjax.data import ruler
from lcjax.data.suites import Suite, SuiteTask
from lcjax.eval import EndpointConfig, evaluate
suite = Suite("mini", ruler.generate, (SuiteTask("single", "niah_single_1"),
                                       SuiteTask("vt", "vt", uses_depth=False)))
evaluate(EndpointConfig(sys.argv[1], concurrency=1, timeout=5, retries=0), suite,
         (500, 700), (0.0, 1.0), 2, 3, results_file=sys.argv[2], progress=False)
"""


def test_killed_run_resumes_without_asking_finished_items_again(tmp_path):
    items = build_items(mini_suite(), seed=3, **ARGS)
    path = tmp_path / "results.jsonl"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    with ScriptedServer(oracle_answers(items), delay=0.3) as server:
        proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, server.url, str(path)],
                                env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                if path.exists() and len(path.read_text().splitlines()) >= 1 + 4:
                    break
                time.sleep(0.05)
            assert proc.poll() is None, "the run ended before it was killed"
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(30)
        time.sleep(0.5)  # a request the run sent just before it died is counted by now
        while server.inflight:
            time.sleep(0.05)
        _, finished = read_results(path)
        assert 4 <= len(finished) < len(items)
        asked = sum(server.counts.values())
        res = evaluate(cfg(server.url, model=None, api_key_env=None, concurrency=1, timeout=5,
                           retries=0),
                       mini_suite(), seed=3, results_file=path, resume=True, progress=False,
                       **ARGS)
        by_sha = {r["prompt_sha"]: r for r in finished.values()}
        for it in items:  # a finished item is never asked again
            if it.prompt_sha in by_sha:
                assert server.counts[it.prompt.decode()] == 1
        # what the killed run had not finished is asked once more (plus the one in flight)
        assert sum(server.counts.values()) - asked == len(items) - len(finished)
    assert res.config["resumed"] == len(finished)
    assert res.summary["overall"] == {"n": 12, "errors": 0, "string_match_all": 100.0,
                                      "string_match_part": 100.0}


def test_endpoint_helpers_and_errors():
    assert endpoint_url(EndpointConfig("http://h:1")) == "http://h:1/v1/completions"
    assert endpoint_url(EndpointConfig("http://h:1/v1/", chat=True)) == \
        "http://h:1/v1/chat/completions"
    c = EndpointConfig("http://h:1", chat=True)
    assert parse_reply(c, {"choices": [{"message": {"content": "hi"}}]}) == "hi"
    for bad in ({}, {"choices": []}, {"choices": [{"text": "x"}]}, [1],
                {"choices": [{"message": {"content": 3}}]}):
        with pytest.raises(EndpointError, match="malformed"):
            parse_reply(c, bad)
    for kw, name in (({"base_url": "h:1"}, "base_url"), ({"timeout": 0}, "timeout"),
                     ({"retries": -1}, "retries"), ({"concurrency": 0}, "concurrency")):
        with pytest.raises(ValueError, match=name):
            EndpointConfig(**{"base_url": "http://h", **kw})
    # nothing listens on this port: connection errors are retried, then reported
    waits = []
    with pytest.raises(EndpointError, match="3 attempts"):
        complete(EndpointConfig("http://127.0.0.1:9", retries=2, backoff=0.5, max_backoff=0.7,
                                timeout=1), "p", 4, sleep=waits.append)
    assert waits == [0.5, 0.7]  # exponential, capped
