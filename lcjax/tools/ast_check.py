"""An AST checker of function calls after the rules of the Berkeley Function-Calling
Leaderboard (BFCL; Patil et al., "The Berkeley Function Calling Leaderboard", ICML 2025),
as ParaTool (arXiv 2605.29561) evaluates calls.

``ast_check(call, gold, schema) -> (ok, reason)``. ``call`` is a dict
``{"name": ..., "arguments": {...}}`` or raw model text: JSON (that dict, ``"parameters"``
for ``"arguments"``, an OpenAI ``tool_calls`` entry whose arguments are a JSON string, or
a one-element list of these) or Python call syntax (``f(a=1, b="x")`` or ``[f(a=1)]``,
keyword arguments with literal values), optionally in a Markdown code fence or
``<tool_call>`` tags. Text is parsed with :mod:`json` and :mod:`ast` (``literal_eval`` of
each argument), never evaluated. ``gold`` is the reference call dict; ``schema`` the
tool's JSON schema (``{"name", "parameters"}``, an OpenAI ``{"type": "function",
"function": ...}`` tool, or the bare parameters object).

The rules, checked in this order (the first failure is the reason):

- ``parse_error``: text that is neither JSON nor a Python call, more than one call,
  positional arguments, non-literal values, or a dict without ``name``/``arguments``;
- ``wrong_name``: the function name differs from the gold name;
- ``unexpected_argument``: an argument the schema does not define (at any depth);
- ``missing_required``: a required argument (at any depth) is absent;
- ``wrong_type``: a value of the wrong JSON type: ``integer`` takes ints (not bools, not
  3.0), ``number`` takes ints and floats (BFCL: an int is accepted where the schema says
  float), ``boolean`` only bools, ``string`` only strings, ``array`` lists, ``object``
  dicts;
- ``bad_enum``: a value outside the schema's ``enum``;
- ``wrong_value``: a value that differs from gold's: strings compared after BFCL's
  standardisation (lowercase; spaces and ``,./-_*^`` removed; ``'`` as ``"``), numbers
  numerically (1 == 1.0), arrays element by element in order, objects recursively. An
  optional argument absent on one side and equal to its schema ``default`` on the other
  is equivalent; absent on one side with any other value (or no default) is
  ``wrong_value``.

Argument order never matters (dicts). ``reason`` is ``"ok"`` or
``"<category>: <detail>"`` with the argument path (``contact.email``, ``seats[1]``).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["ast_check", "parse_call", "CallParseError", "CATEGORIES", "standardize_string"]

CATEGORIES = ("ok", "parse_error", "wrong_name", "unexpected_argument", "missing_required",
              "wrong_type", "bad_enum", "wrong_value")
_MISSING = object()


class CallParseError(ValueError):
    """Model text that is not one well-formed call."""


class _Mismatch(Exception):
    def __init__(self, category: str, detail: str):
        super().__init__(f"{category}: {detail}")
        self.reason = f"{category}: {detail}"


def standardize_string(s: str) -> str:
    """BFCL's string normal form: spaces and ``,./-_*^`` removed, lowercase, ``'`` -> ``"``."""
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


# ------------------------------------------------------------------------------ parsing

def _strip(text: str) -> str:
    text = text.strip()
    m = re.fullmatch(r"```[A-Za-z0-9_-]*\s*(.*?)\s*```", text, flags=re.S)
    if m:
        text = m.group(1)
    m = re.fullmatch(r"<tool_call>\s*(.*?)\s*</tool_call>", text, flags=re.S)
    return m.group(1) if m else text


def _from_mapping(obj: Any) -> dict:
    if isinstance(obj, list):
        if len(obj) != 1:
            raise CallParseError(f"expected one call, got a list of {len(obj)}")
        obj = obj[0]
    if not isinstance(obj, Mapping):
        raise CallParseError(f"a call must be an object, got {type(obj).__name__}")
    if "function" in obj and isinstance(obj["function"], Mapping):  # OpenAI tool_calls entry
        obj = obj["function"]
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", _MISSING))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise CallParseError(f"arguments string is not JSON ({e.msg})") from None
    if not isinstance(name, str) or not isinstance(args, Mapping):
        raise CallParseError("a call needs a string `name` and an object `arguments`")
    if not all(isinstance(k, str) for k in args):
        raise CallParseError("argument names must be strings")
    return {"name": name, "arguments": dict(args)}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise CallParseError("the called function must be a (dotted) name")


def _from_python(text: str) -> dict:
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise CallParseError(f"neither JSON nor Python call syntax ({e.msg})") from None
    if isinstance(tree, ast.List | ast.Tuple):
        if len(tree.elts) != 1:
            raise CallParseError(f"expected one call, got {len(tree.elts)}")
        tree = tree.elts[0]
    if not isinstance(tree, ast.Call):
        raise CallParseError(f"not a function call ({type(tree).__name__})")
    if tree.args:
        raise CallParseError("positional arguments are not allowed (name every argument)")
    args = {}
    for kw in tree.keywords:
        if kw.arg is None:
            raise CallParseError("**kwargs are not allowed")
        try:
            args[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, SyntaxError, TypeError):
            raise CallParseError(f"argument {kw.arg!r} is not a literal value") from None
    return {"name": _dotted(tree.func), "arguments": args}


def parse_call(call: str | Mapping) -> dict:
    """A call dict or model text -> ``{"name": str, "arguments": dict}``.

    Raises:
      CallParseError: text that is not exactly one call (module docstring).
    """
    if isinstance(call, Mapping):
        return _from_mapping(call)
    if not isinstance(call, str):
        raise CallParseError(f"a call is a dict or a string, got {type(call).__name__}")
    text = _strip(call)
    if not text:
        raise CallParseError("empty text")
    if text[0] in "{[":
        try:
            return _from_mapping(json.loads(text))
        except json.JSONDecodeError:
            pass  # e.g. [f(a=1)]: Python list syntax
    return _from_python(text)


# ------------------------------------------------------------------------------ checking

def _parameters(schema: Mapping) -> tuple[str | None, Mapping]:
    """(function name or None, parameters object schema) of the accepted schema forms."""
    if schema.get("type") == "function" and isinstance(schema.get("function"), Mapping):
        schema = schema["function"]
    if "parameters" in schema:
        return schema.get("name"), schema["parameters"]
    if schema.get("type") == "object":
        return None, schema
    raise ValueError("ast_check: schema must be a function schema {name, parameters}, an "
                     "OpenAI tool, or an object schema")


def _type_name(v: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object", type(None): "null"}.get(type(v), type(v).__name__)


def _check_type(value: Any, schema: Mapping, path: str) -> None:
    kind = schema.get("type")
    ok = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
          "boolean": lambda v: isinstance(v, bool),
          "string": lambda v: isinstance(v, str),
          "array": lambda v: isinstance(v, list | tuple),
          "object": lambda v: isinstance(v, Mapping),
          None: lambda v: True}.get(kind)
    if ok is None:
        raise ValueError(f"ast_check: unsupported schema type {kind!r} at {path}")
    if not ok(value):
        raise _Mismatch("wrong_type", f"{path} should be {kind}, got {_type_name(value)} "
                                      f"{value!r}")
    if "enum" in schema and value not in schema["enum"]:
        raise _Mismatch("bad_enum", f"{path} = {value!r} is not one of {schema['enum']}")


def _validate(value: Any, schema: Mapping, path: str) -> None:
    """Structure and types of ``value`` against ``schema`` (no comparison with gold)."""
    _check_type(value, schema, path)
    if schema.get("type") == "array":
        for i, v in enumerate(value):
            _validate(v, schema.get("items", {}), f"{path}[{i}]")
    elif schema.get("type") == "object":
        _validate_object(value, schema, path)


def _validate_object(args: Mapping, schema: Mapping, path: str) -> None:
    props = schema.get("properties", {})
    prefix = f"{path}." if path else ""
    for k in args:
        if k not in props:
            raise _Mismatch("unexpected_argument", f"{prefix}{k} is not a parameter "
                                                   f"(parameters: {sorted(props)})")
    for k in schema.get("required", ()):
        if k not in args:
            raise _Mismatch("missing_required", f"{prefix}{k}")
    for k, v in args.items():
        _validate(v, props[k], prefix + k)


def _equal(value: Any, gold: Any, schema: Mapping, path: str) -> None:
    kind = schema.get("type")
    if kind == "object" or (kind is None and isinstance(gold, Mapping)):
        _equal_object(value, gold, schema, path)
    elif kind == "array" or (kind is None and isinstance(gold, list | tuple)):
        if len(value) != len(gold):
            raise _Mismatch("wrong_value", f"{path} has {len(value)} items, gold {len(gold)}: "
                                           f"{list(value)!r} vs {list(gold)!r}")
        for i, (v, g) in enumerate(zip(value, gold)):
            _equal(v, g, schema.get("items", {}), f"{path}[{i}]")
    elif isinstance(gold, str) and isinstance(value, str):
        if standardize_string(value) != standardize_string(gold):
            raise _Mismatch("wrong_value", f"{path} = {value!r}, gold {gold!r}")
    elif isinstance(gold, int | float) and not isinstance(gold, bool) and kind != "boolean":
        if not isinstance(value, int | float) or isinstance(value, bool):  # untyped schema
            raise _Mismatch("wrong_type", f"{path} should be a number, got "
                                          f"{_type_name(value)} {value!r}")
        if not math.isclose(float(value), float(gold), rel_tol=1e-9, abs_tol=0.0):
            raise _Mismatch("wrong_value", f"{path} = {value!r}, gold {gold!r}")
    elif value != gold:
        raise _Mismatch("wrong_value", f"{path} = {value!r}, gold {gold!r}")


def _equal_object(args: Mapping, gold: Mapping, schema: Mapping, path: str) -> None:
    props = schema.get("properties", {})
    prefix = f"{path}." if path else ""
    for k in sorted(set(args) | set(gold), key=str):
        sub = props.get(k, {})
        v, g = args.get(k, _MISSING), gold.get(k, _MISSING)
        if v is _MISSING or g is _MISSING:  # optional: absent on one side = its default
            present, side = (g, "the call omits it") if v is _MISSING else (v, "gold omits it")
            if "default" not in sub:
                raise _Mismatch("wrong_value", f"{prefix}{k}: {side} (no default), the other "
                                               f"gives {present!r}")
            try:
                _equal(present, sub["default"], sub, prefix + k)
            except _Mismatch:
                raise _Mismatch("wrong_value", f"{prefix}{k}: {side}, the other gives "
                                               f"{present!r} (default {sub['default']!r})"
                                ) from None
            continue
        _equal(v, g, sub, prefix + k)


def ast_check(call: str | Mapping, gold: Mapping, schema: Mapping) -> tuple[bool, str]:
    """``(ok, reason)``: whether ``call`` matches ``gold`` under ``schema`` by BFCL's AST
    rules (module docstring); ``reason`` is ``"ok"`` or ``"<category>: <detail>"``.

    Raises:
      ValueError: a malformed ``gold`` or ``schema`` (gold must itself pass the schema).
    """
    fn_name, params = _parameters(schema)
    try:
        gold = _from_mapping(gold)
        if fn_name is not None and gold["name"] != fn_name:
            raise ValueError(f"ast_check: gold calls {gold['name']!r}, the schema is "
                             f"{fn_name!r}")
        _validate_object(gold["arguments"], params, "")
    except (CallParseError, _Mismatch) as e:
        raise ValueError(f"ast_check: the gold call does not fit the schema: {e}") from None
    try:
        parsed = parse_call(call)
    except CallParseError as e:
        return False, f"parse_error: {e}"
    if parsed["name"] != gold["name"]:
        return False, f"wrong_name: expected {gold['name']!r}, got {parsed['name']!r}"
    try:
        _validate_object(parsed["arguments"], params, "")
        _equal_object(parsed["arguments"], gold["arguments"], params, "")
    except _Mismatch as e:
        return False, e.reason
    return True, "ok"
