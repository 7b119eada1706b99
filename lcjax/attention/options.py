"""``--attention-options`` of the ``lcjax`` commands: one parser for every command."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

__all__ = ["attention_options_arg", "parse_attention_options"]


def parse_attention_options(text: str) -> dict[str, Any]:
    """A JSON object of attention options (``'{"min_tokens": 64, "coverage": 0.1}'``), or
    ``@FILE`` holding one. Lists become tuples (hashable, as static options must be).

    Raises:
      ValueError: not JSON, or not an object, naming what was given.
    """
    src = text
    if isinstance(text, str) and text.startswith("@"):
        path = text[1:]
        if not os.path.isfile(path):
            raise ValueError(f"--attention-options: no file {path!r}")
        with open(path, encoding="utf-8") as f:
            src = f.read()
    try:
        value = json.loads(src)
    except (TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"--attention-options: not JSON ({e.msg if hasattr(e, 'msg') else e}):"
                         f" {text!r}; e.g. '{{\"min_tokens\": 64}}'") from None
    if not isinstance(value, dict):
        raise ValueError(f"--attention-options: needs a JSON object, got "
                         f"{type(value).__name__} {text!r}")

    def freeze(x):
        return tuple(freeze(y) for y in x) if isinstance(x, list) else x

    return {str(k): freeze(v) for k, v in value.items()}


def attention_options_arg(text: str) -> dict[str, Any]:
    """:func:`parse_attention_options` as an argparse ``type=`` (a usage error, exit 2)."""
    try:
        return parse_attention_options(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
