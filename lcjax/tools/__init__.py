"""Tools: a synthetic tool world (typed JSON-Schema tools, queries with paraphrase and
distractor variation, gold calls, OpenAI function-calling serialisation) and a BFCL-style
AST checker of calls — ParaTool's data and metric (``docs/tools.md``)."""

from lcjax.lazy import lazy_exports

# public name -> the module that defines it, imported on first access (lcjax.lazy)
_EXPORTS = {
    "CATEGORIES": "lcjax.tools.ast_check",
    "CallParseError": "lcjax.tools.ast_check",
    "ast_check": "lcjax.tools.ast_check",
    "parse_call": "lcjax.tools.ast_check",
    "ArgSpec": "lcjax.tools.world",
    "Tool": "lcjax.tools.world",
    "ToolExample": "lcjax.tools.world",
    "make_examples": "lcjax.tools.world",
    "make_tools": "lcjax.tools.world",
    "max_tools": "lcjax.tools.world",
    "openai_call": "lcjax.tools.world",
    "openai_tools": "lcjax.tools.world",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
