"""Agents: ACON context compression (:mod:`lcjax.agents.acon`) over OpenAI-compatible
endpoints, its generated recall tasks (:mod:`lcjax.agents.envs`) and a scripted server for
tests (:mod:`lcjax.agents.scripted`). See ``docs/acon.md``."""

from lcjax.lazy import lazy_exports

# public name -> the module that defines it, imported on first access (lcjax.lazy)
_EXPORTS = {
    "DEFAULT_GUIDELINE": "lcjax.agents.acon",
    "AconAgent": "lcjax.agents.acon",
    "AconConfig": "lcjax.agents.acon",
    "AgentError": "lcjax.agents.acon",
    "AgentState": "lcjax.agents.acon",
    "OptimisationResult": "lcjax.agents.acon",
    "agent_prompt": "lcjax.agents.acon",
    "byte_tokens": "lcjax.agents.acon",
    "distil_compressor": "lcjax.agents.acon",
    "distillation_batches": "lcjax.agents.acon",
    "distillation_rows": "lcjax.agents.acon",
    "endpoint_from_env": "lcjax.agents.acon",
    "optimise_guideline": "lcjax.agents.acon",
    "render_history": "lcjax.agents.acon",
    "run_task": "lcjax.agents.acon",
    "RecallTask": "lcjax.agents.envs",
    "make_tasks": "lcjax.agents.envs",
    "parse_answer": "lcjax.agents.envs",
    "reference_policy": "lcjax.agents.envs",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
