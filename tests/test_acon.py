"""ACON over real HTTP: the scripted OpenAI-compatible server (uvicorn on 127.0.0.1) and
``lcjax serve`` with a tiny random byte model.

References: the gate decisions and peak context are recomputed by an independent loop in
this file that calls the scripted compressor function directly (no HTTP, no AgentState);
compressor calls are counted server-side; token usage is checked against the prompts'
byte lengths (plus lcjax serve's BOS and chat template, by hand).
"""

import json

import numpy as np
import pytest
import requests
from flax import nnx

from lcjax.agents import (
    DEFAULT_GUIDELINE,
    AconAgent,
    AconConfig,
    AgentError,
    AgentState,
    RecallTask,
    agent_prompt,
    distil_compressor,
    distillation_rows,
    endpoint_from_env,
    make_tasks,
    optimise_guideline,
    parse_answer,
    reference_policy,
    render_history,
    run_task,
)
from lcjax.agents.acon import COMPRESS_OBS_PROMPT
from lcjax.agents.scripted import (
    FIX,
    ThreadedServer,
    create_scripted_app,
    scripted_compress,
    scripted_reply,
)
from lcjax.eval.endpoint import EndpointConfig, EndpointError

T_OBS, T_HIST = 160, 260


@pytest.fixture(scope="module")
def scripted():
    app = create_scripted_app()
    with ThreadedServer(app) as server:
        yield server.url, app.state


def reset(state):
    state.calls.clear()
    state.prompts.clear()
    state.headers.clear()
    state.bodies.clear()
    state.faults.clear()
    state.requests = 0


def agent_for(url, *, chat=True, timeout=10.0, **config):
    llm = EndpointConfig(url, model="scripted", chat=chat, api_key_env=None, timeout=timeout,
                         retries=0, backoff=0.0)
    return AconAgent(llm, AconConfig(**config))


def reference_run(task, t_obs, t_hist, guideline):
    """The gates by hand: per step (obs compressed, history compressed), the peak context
    and the final answer, with the scripted compressor called as a function."""
    history, flags, peak = [], [], 0
    for step in range(task.num_steps):
        obs = task.observation(step)
        obs_c = t_obs is not None and len(obs.encode()) > t_obs
        if obs_c:
            obs = scripted_compress(COMPRESS_OBS_PROMPT.format(
                guideline=guideline, observation=obs).split("\n\n", 1)[1], guideline)
        text = render_history(history)
        hist_c = t_hist is not None and len(text.encode()) > t_hist
        if hist_c:
            history = [{"summary": scripted_compress(text, guideline)}]
        context = agent_prompt(history, step, obs)
        peak = max(peak, len(context.encode()))
        action = reference_policy(task, context, step)
        history.append({"step": step, "observation": obs, "action": action})
        flags.append((obs_c, hist_c))
    return flags, peak, action


def test_tasks_are_deterministic_and_need_the_early_fact():
    a, b = RecallTask(5), RecallTask(5)
    assert [a.observation(i) for i in range(8)] == [b.observation(i) for i in range(8)]
    assert RecallTask(6).observation(0) != a.observation(0)
    assert f"The {a.fact} is {a.answer}." in a.observation(0)
    assert a.fact in a.observation(7) and a.answer not in a.observation(7)
    assert all(a.answer not in a.observation(i) for i in range(1, 8))
    full = "\n".join(a.observation(i) for i in range(8))
    assert reference_policy(a, full, 7) == f"answer {a.answer}"
    assert reference_policy(a, full, 3) == "next"
    assert reference_policy(a, full.replace(a.answer, "K-#####"), 7) == "answer unknown"
    assert a.success(f"answer {a.answer}") and not a.success(f"answer {a.answer}9")
    assert parse_answer("Answer: `D-123`.") == "D-123" and parse_answer("next") is None
    assert a.long_steps() == [0, 3, 6]
    long_ = min(len(a.observation(i).encode()) for i in a.long_steps())
    short = max(len(a.observation(i).encode()) for i in range(7) if i not in a.long_steps())
    assert short <= T_OBS < long_  # the observation gate below fires on long outputs only
    with pytest.raises(ValueError, match="num_steps"):
        RecallTask(0, num_steps=1)
    with pytest.raises(ValueError, match="step 8"):
        a.observation(8)
    with pytest.raises(ValueError, match="t_hist"):
        AconConfig(t_hist=-1)
    with pytest.raises(ValueError, match="guideline"):
        AconConfig(guideline=" ")


def test_endpoint_from_env_sends_the_key(scripted, monkeypatch):
    url, server = scripted
    monkeypatch.delenv("ACONT_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="ACONT_BASE_URL"):
        endpoint_from_env("ACONT")
    monkeypatch.setenv("ACONT_BASE_URL", url)
    monkeypatch.setenv("ACONT_MODEL", "m1")
    monkeypatch.setenv("ACONT_API_KEY", "sk-test")
    cfg = endpoint_from_env("ACONT", timeout=5.0)
    assert (cfg.base_url, cfg.model, cfg.chat, cfg.timeout) == (url, "m1", True, 5.0)
    reset(server)
    state = run_task(AconAgent(cfg), RecallTask(1, num_steps=2))
    assert state.success and server.headers[-1]["authorization"] == "Bearer sk-test"
    assert server.bodies[-1]["model"] == "m1"


def test_scripted_compressor_depends_on_the_guideline():
    text = "Tool output:\nfound file a.txt\nThe vault code is K-48213.\nlog: x 12"
    assert scripted_compress(text, DEFAULT_GUIDELINE) == "The vault code is K-#####."
    assert scripted_compress(text, "Keep codes verbatim.") == "The vault code is K-48213."
    assert scripted_compress("log: nothing", DEFAULT_GUIDELINE) == "(routine output)"
    assert scripted_reply("hello")[0] == "other"


@pytest.mark.parametrize("chat", [True, False])
def test_gates_fire_exactly_when_the_thresholds_say(scripted, chat):
    url, server = scripted
    task = RecallTask(3)
    agent = agent_for(url, chat=chat, t_obs=T_OBS, t_hist=T_HIST,
                      guideline="Keep codes and numbers.")
    reset(server)
    state = run_task(agent, task)
    flags, peak, action = reference_run(task, T_OBS, T_HIST, agent.config.guideline)
    got = [(r["obs_compressed"], r["history_compressed"]) for r in state.trace]
    assert got == flags
    assert sum(h for _, h in flags) >= 2 and sum(o for o, _ in flags) == 3  # both gates used
    for r in state.trace:  # each decision against its own measured size
        assert r["obs_compressed"] == (r["obs_tokens"] > T_OBS)
        assert r["history_compressed"] == (r["history_tokens"] > T_HIST)
    m = state.metrics()
    assert server.calls["compress_obs"] == m["observation_compressions"] == 3
    assert server.calls["compress_history"] == m["history_compressions"]
    assert server.calls["agent"] == task.num_steps
    assert m["peak_context_tokens"] == peak and state.last_action == action
    assert m["success"] and state.last_action == f"answer {task.answer}"
    agent_prompts = [p for role, p in server.prompts if role == "agent"]
    assert state.usage["agent"]["prompt_tokens"] == sum(len(p.encode()) for p in agent_prompts)
    assert state.usage["compressor"]["calls"] == m["compressions"]

    reset(server)  # no thresholds: no compression, more context
    full = run_task(agent.replace(t_obs=None, t_hist=None), task)
    assert server.calls["compress_obs"] == server.calls["compress_history"] == 0
    assert full.metrics()["compressions"] == 0 and full.success
    assert full.metrics()["peak_context_tokens"] == reference_run(task, None, None, "")[1]
    assert full.metrics()["peak_context_tokens"] > 1.5 * m["peak_context_tokens"]


def test_a_gate_at_exactly_its_threshold_does_not_fire(scripted):
    """The gates compress when the size *exceeds* T (not when it equals it): thresholds set
    to sizes measured in an uncompressed run leave those decisions uncompressed."""
    url, server = scripted
    task = RecallTask(3)
    agent = agent_for(url, guideline="Keep codes and numbers.")
    reset(server)
    plain = run_task(agent, task).trace  # no thresholds: every size as it comes
    obs0, hist1 = plain[0]["obs_tokens"], plain[1]["history_tokens"]
    assert hist1 > 0
    at_obs = run_task(agent.replace(t_obs=obs0), task).trace
    assert at_obs[0]["obs_tokens"] == obs0 and not at_obs[0]["obs_compressed"]
    at_hist = run_task(agent.replace(t_hist=hist1), task).trace
    assert at_hist[1]["history_tokens"] == hist1 and not at_hist[1]["history_compressed"]
    assert any(r["history_compressed"] for r in at_hist[2:])  # it does fire once exceeded
    below = run_task(agent.replace(t_hist=hist1 - 1), task).trace
    assert below[1]["history_compressed"]


def test_optimised_guideline_fixes_the_contrasted_failures(scripted):
    url, server = scripted
    reset(server)
    tasks = make_tasks(3, seed=10)
    agent = agent_for(url, t_obs=T_OBS, t_hist=T_HIST)
    result = optimise_guideline(agent, tasks, rounds=2)
    first = result.rounds[0]
    assert result.full_successes == [True] * 3
    assert first.guideline == DEFAULT_GUIDELINE and first.successes == [False] * 3
    assert first.contrasted == [0, 1, 2]
    for task, feedback in zip(tasks, first.feedback):
        assert task.answer in feedback  # the analysis names what was lost
    assert first.accepted and first.candidate_successes == [True] * 3
    assert result.guideline == f"{DEFAULT_GUIDELINE} {FIX}"
    assert len(result.rounds) == 2 and result.rounds[1].contrasted == []  # nothing left
    assert server.calls["analyse"] == 3 and server.calls["rewrite"] == 1
    state = run_task(agent.replace(guideline=result.guideline), tasks[0])
    assert state.success and state.metrics()["compressions"] > 0


def test_optimiser_keeps_finished_runs_and_resumes(scripted, tmp_path):
    url, server = scripted
    tasks = make_tasks(2, seed=10)
    agent = agent_for(url, t_obs=T_OBS, t_hist=T_HIST)
    reset(server)
    clean = optimise_guideline(agent, tasks, rounds=1)
    clean_calls = server.requests
    for fault_at in (clean_calls // 3, clean_calls - 2):  # in a task run; in the rewrite
        reset(server)
        server.faults[fault_at] = "500"
        state_dir = tmp_path / f"at{fault_at}"
        with pytest.raises((AgentError, EndpointError), match="HTTP 500"):
            optimise_guideline(agent, tasks, rounds=1, state_dir=state_dir)
        assert server.requests == fault_at + 1
        resumed = optimise_guideline(agent, tasks, rounds=1, state_dir=state_dir)
        assert server.requests == clean_calls + 1  # only the failed call is asked again
        assert resumed == clean


@pytest.mark.parametrize("fault, message", [("timeout", "timed out|deadline"), ("500", "HTTP 500"),
                                            ("malformed", "malformed reply"),
                                            ("not_json", "not JSON")])
def test_failures_leave_history_intact_and_resume(scripted, tmp_path, fault, message):
    url, server = scripted
    task = RecallTask(4)
    agent = agent_for(url, timeout=2.0, t_obs=T_OBS, t_hist=T_HIST, guideline="Keep codes.")
    reset(server)
    clean = run_task(agent, task)
    clean_calls = server.requests
    reset(server)
    server.delay_s = 3.0  # > the client's 2 s timeout
    server.faults[7] = fault  # mid-run (the 8th call)
    path = tmp_path / "state.json"
    with pytest.raises(AgentError, match=message) as err:
        run_task(agent, task, state_path=path)
    assert "resume" in str(err.value) and f"step {err.value.state.step}" in str(err.value)
    saved = AgentState.from_json(path.read_text())
    assert saved == err.value.state and not saved.done
    assert sum(r["obs_compressed"] + r["history_compressed"] for r in saved.trace) + sum(
        r["context_tokens"] is not None for r in saved.trace) == 7  # the 7 answered calls
    before = json.loads(path.read_text())
    resumed = run_task(agent, task, state_path=path)
    assert before["history"] == err.value.state.history  # the error did not touch it
    assert resumed.success and resumed.metrics() == clean.metrics()
    assert resumed.history == clean.history
    assert server.requests == clean_calls + 1  # the failed call, then only what was left
    with pytest.raises(ValueError, match="state is for task"):
        run_task(agent, RecallTask(99), state=resumed)


def test_runs_against_lcjax_serve(monkeypatch):
    from lcjax.data import tokenizer as tok
    from lcjax.nn import DecoderConfig, DecoderLM
    from lcjax.serve import ByteTokenizer, ServedModel, create_app, render_byte_chat

    cfg = DecoderConfig(vocab_size=tok.VOCAB_SIZE, d_model=32, num_layers=1, num_heads=2,
                        num_kv_heads=2, head_dim=16, mlp_hidden=64, max_len=512)
    model = DecoderLM(cfg, rngs=nnx.Rngs(0))
    app = create_app(ServedModel(model, ByteTokenizer(), "tiny", cfg.max_len),
                     batch_window_ms=1, max_batch=1, min_bucket=512)
    task = RecallTask(2, num_steps=4, long_every=2, short_lines=1, long_lines=3)
    t_obs = max(len(task.observation(s).encode()) for s in range(3)
                if s not in task.long_steps())
    sizes = [len(task.observation(s).encode()) for s in range(task.num_steps)]
    with ThreadedServer(app) as server:
        llm = EndpointConfig(server.url, model="tiny", chat=True, api_key_env=None,
                             timeout=120, retries=0)
        agent = AconAgent(llm, AconConfig(t_obs=t_obs, t_hist=60, act_max_tokens=8,
                                          compress_max_tokens=8))
        import lcjax.agents.acon as acon

        sent, real = [], acon.complete
        monkeypatch.setattr(acon, "complete",
                            lambda c, prompt, *a, **k: sent.append(prompt) or real(c, prompt,
                                                                                   *a, **k))
        state = run_task(agent, task)
        stats = requests.get(server.url + "/v1/lcjax/stats", timeout=10).json()
    m = state.metrics()
    assert state.done and m["steps"] == task.num_steps and isinstance(m["success"], bool)
    assert m["observation_compressions"] == sum(n > t_obs for n in sizes) >= 2
    assert m["history_compressions"] >= 1
    for r in state.trace:
        assert r["history_compressed"] == (r["history_tokens"] > 60)
    calls = task.num_steps + m["compressions"]
    assert stats["generate_calls"] == calls
    assert state.usage["agent"]["calls"] + state.usage["compressor"]["calls"] == calls
    # lcjax serve counts BOS + "user: " + the escaped prompt + "\nassistant:" bytes
    contexts = np.array([r["context_tokens"] for r in state.trace])
    acts = [p for p in sent if p.startswith("You are an agent")]
    assert [len(p.encode()) for p in acts] == contexts.tolist()
    served = [1 + len(render_byte_chat([{"role": "user", "content": p}]).encode())
              for p in acts]
    assert all(n > len(p.encode()) + len("user: \nassistant:") for n, p in zip(served, acts))
    assert state.usage["agent"]["prompt_tokens"] == sum(served)
    assert m["peak_context_tokens"] == contexts.max() > 0
    assert 0 < state.usage["agent"]["completion_tokens"] <= 8 * task.num_steps


def test_compressor_calls_are_recorded_and_distil_through_train(scripted):
    from lcjax.data import tokenizer as tok
    from lcjax.nn import DecoderConfig
    from lcjax.serve import render_byte_chat
    from lcjax.train import TrainConfig

    url, server = scripted
    reset(server)
    agent = agent_for(url, t_obs=T_OBS, t_hist=T_HIST, guideline="Keep codes.")
    states = [run_task(agent, t) for t in make_tasks(2, seed=20)]
    calls = [c for s in states for c in s.compressions]   # the serve chat prompt, then reply
    docs = [render_byte_chat([{"role": "user", "content": c["prompt"]}]) + c["output"]
            for c in calls]
    served = [(role, p) for role, p in server.prompts if role.startswith("compress")]
    assert len(docs) == sum(s.metrics()["compressions"] for s in states) == len(served)
    for doc, (_, prompt) in zip(docs, served):  # the teacher's prompt, then its reply
        head = render_byte_chat([{"role": "user", "content": prompt}])
        assert doc.startswith(head) and doc[len(head):] == scripted_reply(prompt)[1]
    kept = [r for s in states for r in s.history if "summary" in r]
    assert all(any(k["summary"] == c["output"] for s in states for c in s.compressions)
               for k in kept)
    rows = distillation_rows(states, 128)
    for i, doc in enumerate(docs):  # targets: the doc's last bytes, then EOS; mask: reply+EOS
        reply = calls
        t, m = rows["targets"][i], rows["loss_mask"][i]
        n = int((t != tok.PAD).sum())
        assert t[n - 1] == tok.EOS and tok.decode(t[:n - 1]) == doc[-(n - 1):]
        assert (rows["inputs"][i, 1:n] == t[:n - 1]).all()
        assert tok.decode(t[m][:-1]) == reply[i]["output"] and m.sum() == len(
            reply[i]["output"].encode()) + 1
    with pytest.raises(ValueError, match="no compressor calls"):
        distil_compressor([AgentState(task={})], None, TrainConfig(steps=2, warmup_steps=0))
    with pytest.raises(ValueError, match="seq_len"):
        distillation_rows(states, 1)
    cfg = DecoderConfig(vocab_size=tok.VOCAB_SIZE, d_model=32, num_layers=1, num_heads=2,
                        num_kv_heads=2, head_dim=16, mlp_hidden=64, max_len=128)
    result = distil_compressor(states, cfg, TrainConfig(
        steps=25, batch_size=4, seq_len=128, lr=1e-2, warmup_steps=2, progress=False,
        log_every=1))
    losses = np.array(result.losses)
    assert np.isfinite(losses).all() and losses[-5:].mean() < losses[:2].mean() - 1.0
