"""Agents: ACON context compression (:mod:`lcjax.agents.acon`) over OpenAI-compatible
endpoints, its generated recall tasks (:mod:`lcjax.agents.envs`) and a scripted server for
tests (:mod:`lcjax.agents.scripted`). See ``docs/acon.md``."""

from lcjax.agents.acon import (
    DEFAULT_GUIDELINE,
    AconAgent,
    AconConfig,
    AgentError,
    AgentState,
    OptimisationResult,
    agent_prompt,
    byte_tokens,
    distil_compressor,
    distillation_batches,
    distillation_rows,
    endpoint_from_env,
    optimise_guideline,
    render_history,
    run_task,
)
from lcjax.agents.envs import RecallTask, make_tasks, parse_answer, reference_policy

__all__ = [
    "DEFAULT_GUIDELINE",
    "AconAgent",
    "AconConfig",
    "AgentError",
    "AgentState",
    "OptimisationResult",
    "RecallTask",
    "agent_prompt",
    "byte_tokens",
    "distil_compressor",
    "distillation_batches",
    "distillation_rows",
    "endpoint_from_env",
    "make_tasks",
    "optimise_guideline",
    "parse_answer",
    "reference_policy",
    "render_history",
    "run_task",
]
