"""The tool world (lcjax.tools.world) and the BFCL-style AST checker (lcjax.tools.ast_check):
42 hand-made checker cases with their expected reasons, schema forms and bad gold, and the
generator's tools, queries and gold calls checked against jsonschema and the checker."""

import copy
import json

import jsonschema
import pytest

from lcjax.data import tokenizer
from lcjax.tools import (
    CATEGORIES,
    ast_check,
    make_examples,
    make_tools,
    max_tools,
    openai_call,
    openai_tools,
    parse_call,
)
from lcjax.tools.world import call_text, make_tool_batch, prompt_text, render_value

SCHEMA = {
    "name": "book_flight",
    "description": "Book a flight.",
    "parameters": {
        "type": "object",
        "properties": {
            "origin": {"type": "string"},
            "destination": {"type": "string"},
            "date": {"type": "string", "format": "date"},
            "passengers": {"type": "integer", "default": 1},
            "max_price": {"type": "number"},
            "refundable": {"type": "boolean", "default": False},
            "cabin": {"type": "string", "enum": ["economy", "business", "first"],
                      "default": "economy"},
            "seats": {"type": "array", "items": {"type": "integer"}},
            "tags": {"type": "array", "items": {"type": "string"}},
            "contact": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "email": {"type": "string"},
                    "phone": {"type": "string"},
                    "prefs": {"type": "object",
                              "properties": {"window": {"type": "boolean", "default": False}}},
                },
                "required": ["name", "email"],
            },
        },
        "required": ["origin", "destination", "date"],
    },
}
ARGS = {"origin": "Paris", "destination": "New York", "date": "2027-03-01", "passengers": 2,
        "max_price": 300.0, "seats": [12, 14],
        "contact": {"name": "Ada Lovelace", "email": "ada@example.com"}}
GOLD = {"name": "book_flight", "arguments": ARGS}
PY = ("book_flight(destination='New York', origin='Paris', date='2027-03-01', passengers=2, "
      "max_price=300, seats=[12, 14], contact={'email': 'ada@example.com', "
      "'name': 'Ada Lovelace'})")


def edit(**changes):
    """GOLD with top-level arguments changed (None deletes one)."""
    args = copy.deepcopy(ARGS)
    for k, v in changes.items():
        if v is None:
            args.pop(k)
        else:
            args[k] = v
    return {"name": "book_flight", "arguments": args}


def contact(**changes):
    c = dict(ARGS["contact"])
    for k, v in changes.items():
        if v is None:
            c.pop(k)
        else:
            c[k] = v
    return edit(contact=c)


# (id, call, gold or None for GOLD, expected category, substring of the reason)
CASES = [
    # --- accepted: equivalent calls
    ("gold itself", GOLD, None, "ok", "ok"),
    ("argument order", {"name": "book_flight", "arguments": dict(reversed(ARGS.items()))},
     None, "ok", "ok"),
    ("int where number", edit(max_price=300), None, "ok", "ok"),
    ("json text", json.dumps(GOLD), None, "ok", "ok"),
    ("python call", PY, None, "ok", "ok"),
    ("python list of one call", f"[{PY}]", None, "ok", "ok"),
    ("json in a code fence", "```json\n" + json.dumps(GOLD) + "\n```", None, "ok", "ok"),
    ("python in a code fence", f"```python\n{PY}\n```", None, "ok", "ok"),
    ("tool_call tags", f"<tool_call>{json.dumps(GOLD)}</tool_call>", None, "ok", "ok"),
    ("openai tool_calls entry", openai_call(GOLD), None, "ok", "ok"),
    ("parameters key", {"name": "book_flight", "parameters": ARGS}, None, "ok", "ok"),
    ("optional given at its default", edit(refundable=False, cabin="economy"), None, "ok",
     "ok"),
    ("optional omitted, gold at default", edit(passengers=None), edit(passengers=1), "ok",
     "ok"),
    ("BFCL string normal form", edit(destination="new-york"), None, "ok", "ok"),
    ("nested order and nested default",
     contact(prefs={"window": False}, email="ada@example.com"), contact(prefs={}), "ok", "ok"),
    ("optional object without default, gold omits", contact(prefs={"window": False}), None,
     "wrong_value", "contact.prefs"),
    ("json list of one call", json.dumps([GOLD]), None, "ok", "ok"),
    # --- rejected
    ("wrong name", {"name": "book_train", "arguments": ARGS}, None, "wrong_name",
     "'book_train'"),
    ("wrong name in text", PY.replace("book_flight", "flights.book"), None, "wrong_name",
     "'flights.book'"),
    ("missing required", edit(origin=None), None, "missing_required", "origin"),
    ("missing nested required", contact(email=None), None, "missing_required",
     "contact.email"),
    ("string for integer", edit(passengers="2"), None, "wrong_type", "passengers"),
    ("float for integer", edit(passengers=2.0), None, "wrong_type", "passengers"),
    ("bool for integer", edit(passengers=True), None, "wrong_type", "passengers"),
    ("string for number", edit(max_price="300"), None, "wrong_type", "max_price"),
    ("string for boolean", edit(refundable="false"), None, "wrong_type", "refundable"),
    ("wrong item type", edit(seats=[12, "14"]), None, "wrong_type", "seats[1]"),
    ("string for object", edit(contact="Ada"), None, "wrong_type", "contact"),
    ("number for array", edit(seats=12), None, "wrong_type", "seats"),
    ("bad enum", edit(cabin="premium"), None, "bad_enum", "cabin"),
    ("enum case matters", edit(cabin="Economy"), None, "bad_enum", "cabin"),
    ("extra argument", edit(meal="vegan"), None, "unexpected_argument", "meal"),
    ("extra nested argument", contact(age=36), None, "unexpected_argument", "contact.age"),
    ("plain text", "Sure, I will book a flight to New York.", None, "parse_error", "JSON"),
    ("positional arguments", "book_flight('Paris', 'New York', '2027-03-01')", None,
     "parse_error", "positional"),
    ("two calls", f"[{PY}, {PY}]", None, "parse_error", "one call"),
    ("truncated json", json.dumps(GOLD)[:-5], None, "parse_error", ""),
    ("non-literal value", "book_flight(origin=city, destination='New York', "
                          "date='2027-03-01')", None, "parse_error", "literal"),
    ("dict without arguments", {"name": "book_flight"}, None, "parse_error", "arguments"),
    ("openai arguments not json", {"type": "function", "function": {
        "name": "book_flight", "arguments": "{origin: Paris"}}, None, "parse_error", "JSON"),
    ("wrong string value", edit(destination="Boston"), None, "wrong_value", "destination"),
    ("array order", edit(seats=[14, 12]), None, "wrong_value", "seats[0]"),
    ("array length", edit(seats=[12]), None, "wrong_value", "seats"),
    ("wrong number", edit(max_price=299.5), None, "wrong_value", "max_price"),
    ("optional omitted, gold not default", edit(passengers=None), None, "wrong_value",
     "passengers"),
    ("optional given off default, gold omits", edit(refundable=True), None, "wrong_value",
     "refundable"),
    ("optional without default, gold omits", edit(tags=["aisle"]), None, "wrong_value",
     "tags"),
    ("nested wrong value", contact(name="Ada King"), None, "wrong_value", "contact.name"),
]


def test_enough_hand_made_cases():
    assert len(CASES) >= 30
    assert {c[3] for c in CASES} == set(CATEGORIES)


@pytest.mark.parametrize("call, gold, category, detail", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_ast_check_case(call, gold, category, detail):
    ok, reason = ast_check(call, GOLD if gold is None else gold, SCHEMA)
    assert reason.split(":")[0] == category, reason
    assert ok == (category == "ok")
    assert detail in reason, reason


def test_schema_forms_and_bad_gold():
    tool = {"type": "function", "function": SCHEMA}
    assert ast_check(PY, GOLD, tool) == (True, "ok")
    assert ast_check(PY, GOLD, SCHEMA["parameters"]) == (True, "ok")
    assert ast_check(edit(meal="x"), GOLD, tool)[1].startswith("unexpected_argument")
    with pytest.raises(ValueError, match="gold"):
        ast_check(GOLD, edit(origin=None), SCHEMA)
    with pytest.raises(ValueError, match="gold calls"):
        ast_check(GOLD, {"name": "other", "arguments": ARGS}, SCHEMA)
    with pytest.raises(ValueError, match="schema"):
        ast_check(GOLD, GOLD, {"name": "book_flight"})
    untyped = {"name": "f", "parameters": {"type": "object", "properties": {"x": {}}}}
    assert ast_check({"name": "f", "arguments": {"x": "3"}},
                     {"name": "f", "arguments": {"x": 3}}, untyped)[1].startswith("wrong_type")
    assert ast_check("f(x=3.0)", {"name": "f", "arguments": {"x": 3}}, untyped) == (True, "ok")
    assert parse_call(PY) == {"name": "book_flight", "arguments": {
        **edit(max_price=300)["arguments"]}}


@pytest.fixture(scope="module")
def world():
    tools = make_tools(16, seed=0)
    seen = make_examples(tools, 96, seed=1, split="seen")
    heldout = make_examples(tools, 48, seed=2, split="heldout")
    return {t.name: t for t in tools}, seen, heldout


def test_tools_are_valid_schemas(world):
    tools, _, _ = world
    assert len(tools) == 16
    for tool in tools.values():
        params = tool.parameters
        jsonschema.Draft202012Validator.check_schema(params)
        assert params["type"] == "object" and set(params["required"]) <= set(
            params["properties"]) and params["required"]
        for name, sub in params["properties"].items():
            if "default" in sub:
                assert name not in params["required"]
                jsonschema.validate(sub["default"], sub)
        fn = tool.openai()
        assert fn["type"] == "function" and fn["function"]["name"] == tool.name
        assert json.loads(json.dumps(fn)) == fn  # JSON-serialisable as the API sends it
    kinds = {s.get("type") for t in tools.values() for s in t.parameters["properties"].values()}
    assert {"string", "integer", "number", "boolean", "array", "object"} <= kinds
    assert any("enum" in s for t in tools.values() for s in t.parameters["properties"].values())
    assert openai_tools(list(tools.values()))[0] == next(iter(tools.values())).openai()
    assert len({t.name for t in make_tools(max_tools())}) == max_tools()


def test_every_gold_call_passes_its_own_schema(world):
    tools, seen, heldout = world
    for ex in seen + heldout:
        schema = tools[ex.tool].schema
        assert ast_check(ex.call, ex.call, schema) == (True, "ok"), ex
        jsonschema.validate(ex.call["arguments"], schema["parameters"])  # an independent check
        assert ast_check(json.dumps(ex.call), ex.call, schema)[0]
        assert ast_check(openai_call(ex.call), ex.call, schema)[0]
        required = schema["parameters"]["required"]
        assert set(required) <= set(ex.call["arguments"])
        broken = {"name": ex.tool, "arguments": {k: v for k, v in ex.call["arguments"].items()
                                                 if k != required[0]}}
        assert ast_check(broken, ex.call, schema)[1] == f"missing_required: {required[0]}"
        assert ex.tool in ex.candidates and len(set(ex.candidates)) == 4


def test_queries_state_the_gold_values(world):
    tools, seen, heldout = world
    for ex in seen + heldout:
        props = tools[ex.tool].parameters["properties"]
        for name, value in ex.call["arguments"].items():
            if props[name]["type"] == "object":
                assert value["name"] in ex.query and value["email"] in ex.query
            elif props[name]["type"] != "boolean":
                assert render_value(value, props[name]) in ex.query, (name, value, ex.query)


def test_splits_paraphrases_and_distractors(world):
    _, seen, heldout = world
    assert {e.template for e in heldout} == {3}
    assert {e.template for e in seen} == {0, 1, 2}
    seen_queries = {e.query for e in seen}
    assert not seen_queries & {e.query for e in heldout}
    with_distractor = [e for e in seen if e.distractor]
    assert 0 < len(with_distractor) < len(seen)
    assert all(e.distractor in e.query for e in with_distractor)
    # optional arguments vary: some calls omit some optional argument
    assert len({len(e.call["arguments"]) for e in seen}) > 1
    again = make_examples(make_tools(16, seed=0), 96, seed=1, split="seen")
    assert [e.query for e in again] == [e.query for e in seen]  # seeded


def test_bad_generator_options():
    with pytest.raises(ValueError, match="k must be"):
        make_tools(0)
    with pytest.raises(ValueError, match="k must be"):
        make_tools(max_tools() + 1)
    with pytest.raises(ValueError, match="split"):
        make_examples(make_tools(2), 2, split="test")
    with pytest.raises(ValueError, match="optional_prob"):
        make_examples(make_tools(2), 2, optional_prob=1.5)


def test_training_rows_and_context_cost(world):
    """Rows are prompt + call text with the loss on the call bytes and EOS; the call text
    parses back to the gold call; the in-context docs baseline carries every candidate's
    OpenAI schema, and context_tokens counts the prompt's tokens."""
    tools, seen, _ = world
    examples = seen[:6]
    bare = make_tool_batch(examples)
    docs = make_tool_batch(examples, tools=list(tools.values()))
    for i, ex in enumerate(examples):
        answer = bare["targets"][i][bare["loss_mask"][i]]
        assert answer[-1] == tokenizer.EOS
        text = tokenizer.decode(answer[:-1])
        assert text == call_text(ex.call)
        assert ast_check(text, ex.call, tools[ex.tool].schema) == (True, "ok")
        prompt = tokenizer.decode(bare["inputs"][i][1:bare["answer_start"][i] + 1])
        assert prompt == prompt_text(ex) and ex.query in prompt
        assert bare["context_tokens"][i] == len(prompt.encode()) + 1  # + BOS
        with_docs = prompt_text(ex, list(tools.values()))
        for name in ex.candidates:
            assert json.dumps(tools[name].openai(), separators=(",", ":")) in with_docs
        assert docs["context_tokens"][i] == len(with_docs.encode()) + 1
        assert docs["context_tokens"][i] > 5 * bare["context_tokens"][i]
    with pytest.raises(ValueError, match="candidates"):
        prompt_text(examples[0], [tools[examples[0].tool]])
