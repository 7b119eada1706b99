"""Tools: a synthetic tool world (typed JSON-Schema tools, queries with paraphrase and
distractor variation, gold calls, OpenAI function-calling serialisation) and a BFCL-style
AST checker of calls — ParaTool's data and metric (``docs/tools.md``)."""

from lcjax.tools.ast_check import CATEGORIES, CallParseError, ast_check, parse_call
from lcjax.tools.world import (
    ArgSpec,
    Tool,
    ToolExample,
    make_examples,
    make_tools,
    max_tools,
    openai_call,
    openai_tools,
)

__all__ = ["ArgSpec", "CATEGORIES", "CallParseError", "Tool", "ToolExample", "ast_check",
           "make_examples", "make_tools", "max_tools", "openai_call", "openai_tools",
           "parse_call"]
