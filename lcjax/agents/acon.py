"""ACON: agent context compression with threshold gates and an optimised guideline.

After Kang et al., "ACON: Optimizing Context Compression for Long-horizon LLM Agents"
(arXiv 2510.00615). An agent acts on a growing history of (observation, action) turns. Two
gates bound its context, measured with a token counter ``n(.)``:

* observation gate: a new observation ``o_t`` with ``n(o_t) > T_obs`` is replaced by
  ``C_obs(o_t; g)``, the compressor LLM's rewrite of it under the guideline ``g``;
* history gate: before acting, when ``n(H_t) > T_hist`` the whole history ``H_t`` (earlier
  summary and turns) becomes one summary ``C_hist(H_t; g)``.

The agent's context at step ``t`` is ``prompt(H_t, o_t)``; the run records success, the
peak context ``max_t n(prompt(H_t, o_t))`` and how many compressions each gate made. The
guideline ``g`` (plain language) is optimised without gradients
(:func:`optimise_guideline`): on tasks where the full-context agent succeeds and the
compressed one fails, the LLM is shown both trajectories and asked what was lost, then asked
to rewrite ``g`` given that feedback; the rewrite is kept only if it makes more tasks succeed.

The agent, the compressor and the optimiser are any OpenAI-compatible endpoints, called
through :func:`lcjax.eval.endpoint.complete` (a total deadline per attempt, reply-size and
JSON-depth caps, an answer no longer than ``max_tokens`` allows, retries with backoff, a token
counter). Every LLM call is its own resumable phase of :class:`AgentState` (JSON): a failed
call raises :class:`AgentError` carrying the state as of the last completed call, untouched,
and :func:`run_task` continues from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Sequence

import numpy as np

from lcjax.optional import require

with require("eval", "lcjax.agents.acon"):
    import requests

from lcjax.agents.envs import RecallTask
from lcjax.data import tokenizer as tok
from lcjax.data.ruler import answer_rows
from lcjax.eval.endpoint import EndpointConfig, EndpointError, TokenCounter, complete
from lcjax.serve import render_byte_chat
from lcjax.train import answer_weighted_loss, train

__all__ = [
    "AGENT_PROMPT",
    "ANALYSE_PROMPT",
    "COMPRESS_HISTORY_PROMPT",
    "COMPRESS_OBS_PROMPT",
    "DEFAULT_GUIDELINE",
    "REWRITE_PROMPT",
    "AconAgent",
    "AconConfig",
    "AgentError",
    "AgentState",
    "GuidelineRound",
    "OptimisationResult",
    "advance",
    "agent_prompt",
    "byte_tokens",
    "distil_compressor",
    "endpoint_from_env",
    "distillation_batches",
    "distillation_rows",
    "optimise_guideline",
    "render_history",
    "run_task",
    "trajectory_text",
]

DEFAULT_GUIDELINE = "Summarise briefly: keep the important facts and drop routine output."

AGENT_PROMPT = ("You are an agent working through a task step by step. After each observation "
                "reply with one action: next, or answer <value> when asked a question.\n\n"
                "{history}Observation {step}:\n{observation}\nAction:")
COMPRESS_HISTORY_PROMPT = ("Compress the agent's history below into a short summary.\n"
                           "Guideline: {guideline}\n\n{history}Summary:")
COMPRESS_OBS_PROMPT = ("Compress the tool observation below.\nGuideline: {guideline}\n\n"
                       "{observation}\n\nCompressed:")
ANALYSE_PROMPT = ("With full context the agent succeeded; with compressed context it failed. "
                  "Compare the two trajectories and say what information the compression "
                  "lost.\n\nFULL CONTEXT TRAJECTORY:\n{full}\n\nCOMPRESSED CONTEXT "
                  "TRAJECTORY:\n{compressed}\n\nLost information:")
REWRITE_PROMPT = ("Rewrite the compression guideline so that compressed histories keep the "
                  "information listed as lost. Reply with the new guideline only.\n\n"
                  "Current guideline: {guideline}\n\nWhat was lost:\n{feedback}\n\n"
                  "New guideline:")

PHASES = ("observe", "history", "act")


def byte_tokens(text: str) -> int:
    """Tokens of ``text`` for a byte-level model: its UTF-8 length (lcjax byte models add
    one BOS per prompt). Pass another counter (a tokenizer's) for other models."""
    return len(text.encode("utf-8"))


def endpoint_from_env(prefix: str = "ACON", **fields) -> EndpointConfig:
    """An :class:`EndpointConfig` from the environment: ``{prefix}_BASE_URL`` (required),
    ``{prefix}_MODEL`` (optional) and the key in ``{prefix}_API_KEY`` (read at each
    request, never stored); ``fields`` set the rest (``chat`` defaults to True)."""
    base = os.environ.get(f"{prefix}_BASE_URL")
    if not base:
        raise ValueError(f"endpoint_from_env: set {prefix}_BASE_URL (e.g. "
                         "http://127.0.0.1:8000) to the OpenAI-compatible server")
    fields.setdefault("chat", True)
    return EndpointConfig(base, model=os.environ.get(f"{prefix}_MODEL") or None,
                          api_key_env=f"{prefix}_API_KEY", **fields)


class AgentError(RuntimeError):
    """An LLM call of the agent loop failed. ``state`` is the :class:`AgentState` as of the
    last completed call (unchanged by the failure); pass it back to :func:`run_task`."""

    def __init__(self, message: str, state: AgentState):
        super().__init__(message)
        self.state = state


@dataclasses.dataclass(frozen=True)
class AconConfig:
    """The gates and the guideline.

    Attributes:
      t_hist: compress the history when its tokens exceed this (None: never).
      t_obs: compress an observation when its tokens exceed this (None: never).
      guideline: the natural-language compression guideline.
      act_max_tokens, compress_max_tokens: reply budgets of the agent and the compressor.
    """

    t_hist: int | None = None
    t_obs: int | None = None
    guideline: str = DEFAULT_GUIDELINE
    act_max_tokens: int = 16
    compress_max_tokens: int = 128

    def __post_init__(self):
        for name in ("t_hist", "t_obs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"AconConfig: `{name}` must be None or an int >= 0, got "
                                 f"{value!r}")
        for name in ("act_max_tokens", "compress_max_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"AconConfig: `{name}` must be an int >= 1, got "
                                 f"{getattr(self, name)!r}")
        if not isinstance(self.guideline, str) or not self.guideline.strip():
            raise ValueError("AconConfig: `guideline` must be a non-empty string")


@dataclasses.dataclass(frozen=True)
class AconAgent:
    """The agent LLM, the compressor LLM (default: the same endpoint) and the gates."""

    llm: EndpointConfig
    config: AconConfig = AconConfig()
    compressor: EndpointConfig | None = None
    count_tokens: Callable[[str], int] = byte_tokens

    def replace(self, **config_fields) -> AconAgent:
        """A copy with some :class:`AconConfig` fields changed."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config,
                                                                    **config_fields))


@dataclasses.dataclass
class AgentState:
    """Everything a run needs to continue (JSON via :meth:`to_json` / :meth:`from_json`).

    ``history`` holds ``{"summary": str}`` (at most one, first) and
    ``{"step", "observation", "action"}`` turns; ``pending`` is the current step's
    observation after its gate; ``phase`` the next call (``observe``, ``history``, ``act``);
    ``trace`` one record per step: raw and kept observation tokens, the history's tokens at
    the gate, which gates fired, the context's tokens; ``compressions`` every compressor
    call as ``{"kind": "observation" | "history", "prompt", "output"}`` (distillation data).
    """

    task: dict
    step: int = 0
    phase: str = "observe"
    history: list = dataclasses.field(default_factory=list)
    pending: str | None = None
    done: bool = False
    last_action: str | None = None
    last_context: str | None = None
    success: bool | None = None
    trace: list = dataclasses.field(default_factory=list)
    compressions: list = dataclasses.field(default_factory=list)
    usage: dict = dataclasses.field(default_factory=lambda: {
        "agent": {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0},
        "compressor": {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}})

    def copy(self) -> AgentState:
        return AgentState.from_json(self.to_json())

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> AgentState:
        return cls(**json.loads(text))

    def metrics(self) -> dict:
        """``success``, ``peak_context_tokens``, ``history_compressions``,
        ``observation_compressions``, ``compressions``, ``steps`` and the endpoints' usage."""
        hist = sum(r["history_compressed"] for r in self.trace)
        obs = sum(r["obs_compressed"] for r in self.trace)
        return {"success": bool(self.success), "steps": self.step,
                "peak_context_tokens": max((r["context_tokens"] for r in self.trace
                                            if r.get("context_tokens") is not None), default=0),
                "history_compressions": hist, "observation_compressions": obs,
                "compressions": hist + obs, "usage": self.usage}


def render_history(history: Sequence[dict]) -> str:
    """The history as the prompts show it (a blank line after each entry; '' when empty)."""
    parts = []
    for entry in history:
        if "summary" in entry:
            parts.append(f"Summary of earlier steps:\n{entry['summary']}\n\n")
        else:
            parts.append(f"Observation {entry['step']}:\n{entry['observation']}\n"
                         f"Action: {entry['action']}\n\n")
    return "".join(parts)


def agent_prompt(history: Sequence[dict], step: int, observation: str) -> str:
    """The agent's context at ``step``: :data:`AGENT_PROMPT` with the history and the
    (gated) observation."""
    return AGENT_PROMPT.format(history=render_history(history), step=step,
                               observation=observation)


def trajectory_text(state: AgentState) -> str:
    """A finished run as the optimiser shows it: the last context and the last action."""
    return f"{state.last_context}{' ' if state.last_context else ''}{state.last_action}"


def _call(state: AgentState, good: AgentState, role: str, cfg: EndpointConfig, prompt: str,
          max_tokens: int, session: requests.Session, what: str) -> str:
    """The reply to ``prompt``, its usage added to ``state``; on failure an
    :class:`AgentError` carrying ``good`` (the state before this phase)."""
    counter = TokenCounter()
    try:
        text = complete(cfg, prompt, max_tokens, session=session, counter=counter)
    except EndpointError as e:
        raise AgentError(
            f"ACON step {good.step} ({what}) failed: {e}. The agent's state is as of the "
            "last completed call; resume with run_task(agent, task, state=err.state).",
            good) from e
    totals = state.usage[role]
    for key, value in counter.as_dict().items():
        if key in totals:
            totals[key] += value
    return text


def advance(agent: AconAgent, task: RecallTask, state: AgentState,
            session: requests.Session) -> AgentState:
    """One phase of one step (at most one LLM call); returns a new state, ``state`` itself is
    never modified (so it stays valid when a call raises :class:`AgentError`)."""
    cfg, n = agent.config, agent.count_tokens
    compressor = agent.compressor or agent.llm
    new = state.copy()
    if new.phase == "observe":
        obs = task.observation(new.step)
        record = {"step": new.step, "obs_tokens": n(obs), "obs_compressed": False,
                  "history_tokens": None, "history_compressed": False, "context_tokens": None}
        if cfg.t_obs is not None and n(obs) > cfg.t_obs:
            prompt = COMPRESS_OBS_PROMPT.format(guideline=cfg.guideline, observation=obs)
            obs = _call(new, state, "compressor", compressor, prompt, cfg.compress_max_tokens,
                        session, "observation compression").strip()
            new.compressions.append({"kind": "observation", "prompt": prompt, "output": obs})
            record["obs_compressed"] = True
        record["kept_obs_tokens"] = n(obs)
        new.trace.append(record)
        new.pending, new.phase = obs, "history"
    elif new.phase == "history":
        record = new.trace[-1]
        text = render_history(new.history)
        record["history_tokens"] = n(text)
        if cfg.t_hist is not None and n(text) > cfg.t_hist:
            prompt = COMPRESS_HISTORY_PROMPT.format(guideline=cfg.guideline, history=text)
            summary = _call(new, state, "compressor", compressor, prompt,
                            cfg.compress_max_tokens, session, "history compression").strip()
            new.compressions.append({"kind": "history", "prompt": prompt, "output": summary})
            new.history = [{"summary": summary}]
            record["history_compressed"] = True
        new.phase = "act"
    elif new.phase == "act":
        context = agent_prompt(new.history, new.step, new.pending)
        new.trace[-1]["context_tokens"] = n(context)
        action = _call(new, state, "agent", agent.llm, context, cfg.act_max_tokens, session,
                       "action").strip()
        new.history.append({"step": new.step, "observation": new.pending, "action": action})
        new.last_action, new.last_context, new.pending = action, context, None
        new.step += 1
        new.phase = "observe"
        if new.step == task.num_steps:
            new.done, new.success = True, task.success(action)
    else:
        raise ValueError(f"AgentState: unknown phase {new.phase!r}; expected one of {PHASES}")
    return new


def _save(state: AgentState, path: str | os.PathLike) -> None:
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w") as f:
        f.write(state.to_json())
    os.replace(tmp, path)


def run_task(agent: AconAgent, task: RecallTask, *, state: AgentState | None = None,
             state_path: str | os.PathLike | None = None) -> AgentState:
    """Run (or resume) ``task`` to its end; returns the finished state (see
    :meth:`AgentState.metrics`).

    ``state`` resumes a run (e.g. ``AgentError.state`` or :meth:`AgentState.from_json`);
    ``state_path`` (if given) gets the state as JSON after every completed call, and is read
    to resume when ``state`` is None and the file exists.

    Raises:
      AgentError: an LLM call failed (timeout, HTTP error, malformed reply); its ``state``
        is the last good one, already saved to ``state_path``.
      ValueError: ``state`` belongs to another task.
    """
    spec = dataclasses.asdict(task)
    if state is None and state_path is not None and os.path.exists(state_path):
        with open(state_path) as f:
            state = AgentState.from_json(f.read())
    if state is None:
        state = AgentState(task=spec)
    if state.task != spec:
        raise ValueError(f"run_task: the state is for task {state.task}, not {spec}")
    with requests.Session() as session:
        while not state.done:
            state = advance(agent, task, state, session)
            if state_path is not None:
                _save(state, state_path)
    return state


@dataclasses.dataclass
class GuidelineRound:
    """One optimiser round: the guideline tried, per-task success under it, the contrasted
    tasks (full context succeeds, compressed fails), the LLM's feedback on each, the
    rewritten candidate, per-task success under it, and whether it was kept."""

    guideline: str
    successes: list
    contrasted: list
    feedback: list
    candidate: str | None = None
    candidate_successes: list | None = None
    accepted: bool = False


@dataclasses.dataclass
class OptimisationResult:
    """The final guideline, full-context success per task, and the rounds."""

    guideline: str
    full_successes: list
    rounds: list


def optimise_guideline(agent: AconAgent, tasks: Sequence[RecallTask], *, rounds: int = 1,
                       optimiser: EndpointConfig | None = None,
                       feedback_max_tokens: int = 256,
                       state_dir: str | os.PathLike | None = None) -> OptimisationResult:
    """Contrastive guideline optimisation (no gradients).

    Each round: run every task with full context (no gates) and with ``agent``'s gates under
    the current guideline ``g``; for the contrasted tasks ``{i: full_i and not comp_i}`` ask
    ``optimiser`` (default: the agent's LLM) what was lost (:data:`ANALYSE_PROMPT`, both
    trajectories), then for a rewrite of ``g`` given all that feedback
    (:data:`REWRITE_PROMPT`); the candidate ``g'`` replaces ``g`` iff
    ``sum_i comp_i(g') > sum_i comp_i(g)``. Stops early when nothing is contrasted.

    ``state_dir`` (created if missing) keeps every run's :class:`AgentState` (after each
    call, ``full-<i>.json`` and ``g<sha of g>-<i>.json``) and every optimiser reply
    (``ask-<sha of the prompt>.json``): when a call fails (:class:`AgentError`,
    :class:`~lcjax.eval.endpoint.EndpointError`) or the process is stopped, calling again
    with the same ``state_dir`` keeps what finished and asks only for the rest.
    """
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"optimise_guideline: `rounds` must be an int >= 1, got {rounds!r}")
    if not tasks:
        raise ValueError("optimise_guideline: no tasks")
    if state_dir is not None:
        os.makedirs(state_dir, exist_ok=True)
    llm = optimiser or agent.llm

    def runs(run_agent: AconAgent, tag: str) -> list[AgentState]:
        return [run_task(run_agent, t, state_path=_state_file(state_dir, f"{tag}-{i}"))
                for i, t in enumerate(tasks)]

    full = runs(agent.replace(t_hist=None, t_obs=None), "full")
    full_ok = [bool(s.success) for s in full]
    guideline, done = agent.config.guideline, []
    comp = runs(agent, f"g{_sha(guideline)}")
    for _ in range(rounds):
        ok = [bool(s.success) for s in comp]
        contrasted = [i for i in range(len(tasks)) if full_ok[i] and not ok[i]]
        record = GuidelineRound(guideline, ok, contrasted, [])
        done.append(record)
        if not contrasted:
            break
        with requests.Session() as session:
            for i in contrasted:
                prompt = ANALYSE_PROMPT.format(full=trajectory_text(full[i]),
                                               compressed=trajectory_text(comp[i]))
                record.feedback.append(_ask(llm, prompt, feedback_max_tokens, session,
                                            "analysis", state_dir))
            candidate = _ask(llm, REWRITE_PROMPT.format(
                guideline=guideline, feedback="\n".join(f"- {f}" for f in record.feedback)),
                feedback_max_tokens, session, "guideline rewrite", state_dir)
        if not candidate:
            break
        trial = agent.replace(guideline=candidate)
        cand = runs(trial, f"g{_sha(candidate)}")
        record.candidate = candidate
        record.candidate_successes = [bool(s.success) for s in cand]
        if sum(record.candidate_successes) > sum(ok):
            record.accepted, guideline, comp, agent = True, candidate, cand, trial
    return OptimisationResult(guideline, full_ok, done)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _state_file(state_dir, name: str) -> str | None:
    return None if state_dir is None else os.path.join(state_dir, f"{name}.json")


def _ask(cfg: EndpointConfig, prompt: str, max_tokens: int, session: requests.Session,
         what: str, state_dir=None) -> str:
    """The optimiser's (stripped) reply to ``prompt``, read from / kept in ``state_dir``."""
    path = _state_file(state_dir, f"ask-{_sha(prompt)}")
    if path is not None and os.path.exists(path):
        with open(path) as f:
            return json.load(f)["reply"]
    try:
        reply = complete(cfg, prompt, max_tokens, session=session).strip()
    except EndpointError as e:
        raise EndpointError(f"ACON guideline optimiser ({what}) failed: {e}") from e
    if path is not None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump({"prompt": prompt, "reply": reply}, f)
        os.replace(tmp, path)
    return reply


def distillation_rows(states: Sequence[AgentState], seq_len: int) -> dict:
    """One training row per recorded compressor call: the tokens
    ``BOS chat(prompt) reply EOS``, where ``chat(prompt)`` is
    ``render_byte_chat([user: prompt])`` — exactly the prompt ``lcjax serve`` builds for a byte
    model's chat request — left-truncated to ``seq_len + 1`` tokens (so the reply is kept),
    PAD after (:func:`lcjax.data.ruler.answer_rows`).

    Returns:
      ``inputs``, ``targets`` int32 ``[N, seq_len]`` (``targets`` = ``inputs`` shifted by
      one) and bool ``loss_mask`` ``[N, seq_len]``, True exactly on the targets that are
      reply bytes or its EOS.
    """
    if not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"distillation_rows: `seq_len` must be an int >= 2, got {seq_len!r}")
    prompts, replies = [], []
    for c in (c for s in states for c in s.compressions):
        head = tok.encode(render_byte_chat([{"role": "user", "content": c["prompt"]}]),
                          bos=True)
        reply = tok.encode(c["output"], eos=True)
        ids = np.concatenate([head, reply])[-(seq_len + 1):]
        split = max(1, len(ids) - len(reply))   # a reply longer than the row keeps its tail
        prompts.append(ids[:split])
        replies.append(ids[split:])
    if not prompts:
        empty = np.zeros((0, seq_len), np.int32)
        return {"inputs": empty, "targets": empty.copy(), "loss_mask": empty.astype(bool)}
    rows = answer_rows(prompts, replies, seq_len)
    return {k: rows[k] for k in ("inputs", "targets", "loss_mask")}


def distillation_batches(states: Sequence[AgentState], *, steps: int, batch_size: int,
                         seq_len: int, seed: int = 0) -> list[dict]:
    """``steps`` batches of :func:`distillation_rows`, rows drawn uniformly (seeded)."""
    rows = distillation_rows(states, seq_len)
    if not len(rows["inputs"]):
        raise ValueError("distillation: the runs made no compressor calls to learn from")
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(rows["inputs"]), size=(steps, batch_size))
    return [{k: v[p] for k, v in rows.items()} for p in picks]


def distil_compressor(states: Sequence[AgentState], model_cfg, train_cfg, *,
                      other_weight: float = 0.1, **train_kw):
    """Distil the compressor into a small lcjax byte model through
    :func:`lcjax.train.train`: :func:`distillation_batches` of the teacher's calls, loss
    :func:`lcjax.train.answer_weighted_loss` (reply bytes weigh 1, prompt bytes
    ``other_weight``). ``train_kw``: train's other arguments. Returns its ``TrainResult``;
    with ``train_cfg.out_dir`` set, ``lcjax serve --checkpoint out_dir`` serves the student
    as the compressor endpoint."""
    batches = distillation_batches(states, steps=train_cfg.steps,
                                   batch_size=train_cfg.batch_size, seq_len=train_cfg.seq_len,
                                   seed=train_cfg.data_seed)
    return train(model_cfg, train_cfg, dataset=batches,
                 loss_fn=answer_weighted_loss(other_weight), **train_kw)
