"""A synthetic tool world: K tools with typed JSON-Schema arguments, natural-language
queries with paraphrase and distractor variation, and their gold calls — the data side of
ParaTool (parameterized tools; BUPT-GAMMA, arXiv 2605.29561), evaluated like BFCL (AST
match of the call).

A tool is an *action* on an *object* (``book_hotel``, ``search_flight``, ...). Each object
has a pool of typed arguments (the JSON-Schema subset ``string``, ``integer``, ``number``,
``boolean``, ``enum``, ``array`` and nested ``object``); a tool takes some of them, a few
required, the others optional, some with a ``default``. Values come from Faker (cities,
names, e-mails, dates, companies) and seeded ranges.

A query is a paraphrase template of the action (``"Can you look up {objects} {args}?"``)
filled with one phrase per argument the call gives (``"in {v}"``, ``"for {v} guests"``);
optional arguments appear with probability ``optional_prob``. Templates and phrases are
numbered; ``split="seen"`` draws from all but the last of each list, ``split="heldout"``
only from the last one, so held-out queries use wordings never seen in training. A
distractor sentence (a second value of the same type that is not the answer) is added
with probability ``distractor_prob``, and each example lists ``candidates``: the gold tool
and distractor tools (same object or same action first). The gold call is
``{"name": tool, "arguments": {...}}`` with exactly the arguments the query states.

    tools = make_tools(16, seed=0)
    examples = make_examples(tools, 100, seed=1, split="seen")
    openai_tools(tools)                       # [{"type": "function", "function": {...}}]
    ast_check(model_text, examples[0].call, tools_by_name[examples[0].tool].schema)
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from lcjax.data.ruler import make_batch
from lcjax.optional import require

__all__ = ["ArgSpec", "Tool", "ToolExample", "make_tools", "make_examples", "openai_tools",
           "openai_call", "render_value", "OBJECTS", "ACTIONS", "max_tools", "call_text",
           "tool_docs", "prompt_text", "make_tool_batch", "PromptAnswer"]


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    """One argument: its JSON schema, a value sampler ``(faker, rng) -> value`` and the
    phrases that state it in a query (``{v}`` the rendered value; for an object, one
    ``{field}`` per property; booleans use ``phrases`` when true, ``false_phrases`` when
    false)."""

    name: str
    schema: dict
    sample: Callable[[Any, random.Random], Any]
    phrases: tuple[str, ...]
    false_phrases: tuple[str, ...] = ()


def _s(desc: str, **kw) -> dict:
    return {"type": "string", "description": desc, **kw}


def _date(f, r):
    return f.date_between(start_date="+1d", end_date="+1y").isoformat()


def _people(f, r):
    return [f.first_name() for _ in range(r.randint(1, 3))]


def _contact(f, r):
    out = {"name": f.name(), "email": f.email()}
    if r.random() < 0.5:
        out["phone"] = f.numerify("###-###-####")
    return out


_CONTACT_SCHEMA = {
    "type": "object", "description": "who to contact",
    "properties": {"name": _s("full name"), "email": _s("e-mail address"),
                   "phone": _s("phone number")},
    "required": ["name", "email"],
}

# shared argument factories (name -> spec); objects pick from these
_ARGS: dict[str, ArgSpec] = {a.name: a for a in [
    ArgSpec("city", _s("city name"), lambda f, r: f.city(),
            ("in {v}", "located in {v}", "around {v}")),
    ArgSpec("origin", _s("departure city"), lambda f, r: f.city(),
            ("from {v}", "leaving from {v}", "departing {v}")),
    ArgSpec("destination", _s("arrival city"), lambda f, r: f.city(),
            ("to {v}", "going to {v}", "arriving in {v}")),
    ArgSpec("date", _s("date, YYYY-MM-DD", format="date"), _date,
            ("on {v}", "for {v}", "dated {v}")),
    ArgSpec("guests", {"type": "integer", "description": "number of people", "minimum": 1,
                       "maximum": 12, "default": 2},
            lambda f, r: r.randint(1, 12),
            ("for {v} guests", "for a party of {v}", "with {v} people")),
    ArgSpec("nights", {"type": "integer", "description": "number of nights", "minimum": 1,
                       "maximum": 30}, lambda f, r: r.randint(1, 30),
            ("for {v} nights", "lasting {v} nights", "staying {v} nights")),
    ArgSpec("max_price", {"type": "number", "description": "highest price in dollars",
                          "minimum": 0}, lambda f, r: round(r.uniform(20, 900), 2),
            ("under {v} dollars", "costing at most {v} dollars", "below ${v}")),
    ArgSpec("min_rating", {"type": "number", "description": "lowest rating, 0 to 5",
                           "minimum": 0, "maximum": 5, "default": 0},
            lambda f, r: round(r.uniform(1, 5), 1),
            ("rated at least {v}", "with a rating of {v} or more", "scoring {v}+")),
    ArgSpec("refundable", {"type": "boolean", "description": "refundable only",
                           "default": False}, lambda f, r: r.random() < 0.5,
            ("that is refundable", "with a refund option", "refundable"),
            ("that is non-refundable", "without a refund option", "non-refundable")),
    ArgSpec("breakfast", {"type": "boolean", "description": "breakfast included"},
            lambda f, r: r.random() < 0.5,
            ("with breakfast included", "including breakfast", "breakfast included"),
            ("without breakfast", "with no breakfast", "breakfast excluded")),
    ArgSpec("cabin", {"type": "string", "enum": ["economy", "premium", "business", "first"],
                      "description": "cabin class", "default": "economy"},
            lambda f, r: r.choice(["economy", "premium", "business", "first"]),
            ("in {v} class", "flying {v}", "with a {v} seat")),
    ArgSpec("room", {"type": "string", "enum": ["single", "double", "suite"],
                     "description": "room type"},
            lambda f, r: r.choice(["single", "double", "suite"]),
            ("with a {v} room", "in a {v} room", "booking a {v}")),
    ArgSpec("cuisine", {"type": "string", "enum": ["italian", "thai", "mexican", "indian",
                                                   "japanese"], "description": "cuisine"},
            lambda f, r: r.choice(["italian", "thai", "mexican", "indian", "japanese"]),
            ("serving {v} food", "with {v} cuisine", "that does {v}")),
    ArgSpec("attendees", {"type": "array", "items": _s("first name"),
                          "description": "people invited"}, _people,
            ("with {v}", "inviting {v}", "including {v}")),
    ArgSpec("seats", {"type": "array", "items": {"type": "integer", "minimum": 1},
                      "description": "seat numbers"},
            lambda f, r: sorted(r.sample(range(1, 60), r.randint(1, 3))),
            ("in seats {v}", "seated at {v}", "taking seats {v}")),
    ArgSpec("contact", _CONTACT_SCHEMA, _contact,
            ("with contact {name} ({email}{phone})", "reachable as {name} at {email}{phone}",
             "under the name {name}, e-mail {email}{phone}")),
    ArgSpec("company", _s("company name"), lambda f, r: f.company(),
            ("at {v}", "for {v}", "with {v}")),
    ArgSpec("title", _s("a short title"), lambda f, r: " ".join(f.words(2)).title(),
            ("titled {v}", "called {v}", "named {v}")),
    ArgSpec("duration", {"type": "integer", "description": "length in minutes",
                         "minimum": 5, "maximum": 240, "default": 30},
            lambda f, r: r.choice([15, 20, 30, 45, 60, 90, 120]),
            ("for {v} minutes", "lasting {v} minutes", "of {v} minutes")),
    ArgSpec("quantity", {"type": "integer", "description": "how many", "minimum": 1,
                         "maximum": 20, "default": 1}, lambda f, r: r.randint(1, 20),
            ("{v} of them", "a quantity of {v}", "times {v}")),
    ArgSpec("urgent", {"type": "boolean", "description": "mark as urgent", "default": False},
            lambda f, r: r.random() < 0.5,
            ("marked urgent", "as a priority", "urgently"),
            ("not urgent", "with no rush", "at normal priority")),
    ArgSpec("weight", {"type": "number", "description": "weight in kilograms",
                       "minimum": 0}, lambda f, r: round(r.uniform(0.2, 40), 1),
            ("weighing {v} kg", "of {v} kilograms", "at {v} kg")),
]}

# object -> (plural noun phrase, argument names; the first `n_required` of a tool's
# sample are required)
OBJECTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "hotel": ("hotels", ("city", "date", "nights", "guests", "room", "breakfast",
                         "max_price", "min_rating", "refundable")),
    "flight": ("flights", ("origin", "destination", "date", "cabin", "seats", "max_price",
                           "refundable", "guests")),
    "restaurant": ("restaurants", ("city", "cuisine", "date", "guests", "min_rating",
                                   "max_price")),
    "meeting": ("meetings", ("title", "date", "attendees", "duration", "urgent", "company")),
    "train": ("train tickets", ("origin", "destination", "date", "seats", "refundable",
                                "max_price")),
    "parcel": ("parcels", ("destination", "weight", "contact", "urgent", "date")),
    "concert": ("concert tickets", ("city", "date", "quantity", "seats", "max_price")),
    "car": ("rental cars", ("city", "date", "nights", "max_price", "contact", "refundable")),
    "delivery": ("food deliveries", ("cuisine", "city", "quantity", "contact", "urgent")),
    "appointment": ("appointments", ("company", "date", "duration", "contact", "urgent")),
    "tour": ("guided tours", ("city", "date", "guests", "min_rating", "attendees")),
    "invoice": ("invoices", ("company", "date", "max_price", "contact", "urgent")),
}

# action -> (verb for descriptions, query templates with {objects} and {args})
ACTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "search": ("Search for", ("Find me {objects} {args}.", "Can you look up {objects} {args}?",
                              "Show {objects} {args}, please.",
                              "I am looking for {objects} {args}.")),
    "book": ("Book one of the", ("Book {objects} {args}.", "Please reserve {objects} {args}.",
                                 "I'd like to book {objects} {args}.",
                                 "Get a booking for {objects} {args}.")),
    "cancel": ("Cancel", ("Cancel my {objects} {args}.", "Please call off the {objects} {args}.",
                          "I need to cancel {objects} {args}.",
                          "Drop the reservation of {objects} {args}.")),
    "price": ("Quote the price of", ("How much are {objects} {args}?",
                                     "Give me a price for {objects} {args}.",
                                     "What would {objects} {args} cost?",
                                     "Quote {objects} {args}.")),
}


# sentences that mention a second value of an argument's type that is not the answer
_DISTRACTORS = ("(Last time it was {v}, ignore that.)", "Not {v} like before.",
                "My colleague mentioned {v}, but that is not what I want.")


def max_tools() -> int:
    """The most tools :func:`make_tools` can make (objects x actions)."""
    return len(OBJECTS) * len(ACTIONS)


@dataclasses.dataclass(frozen=True)
class Tool:
    """A function: ``name``, ``description``, JSON schema ``parameters`` (an object with
    ``properties`` and ``required``), its object's plural noun and action templates."""

    name: str
    description: str
    parameters: dict
    action: str
    object: str
    args: tuple[ArgSpec, ...]

    @property
    def schema(self) -> dict:
        """The function schema ``{"name", "description", "parameters"}`` (what
        :func:`lcjax.tools.ast_check` takes)."""
        return {"name": self.name, "description": self.description,
                "parameters": self.parameters}

    def openai(self) -> dict:
        """OpenAI function-calling tool: ``{"type": "function", "function": schema}``."""
        return {"type": "function", "function": self.schema}


@dataclasses.dataclass(frozen=True)
class ToolExample:
    """A query, its gold call ``{"name", "arguments"}``, the gold tool's name, the
    candidate tools (gold included, shuffled), the template index, the split and the
    distractor sentence (or None)."""

    query: str
    call: dict
    tool: str
    candidates: tuple[str, ...]
    template: int
    split: str
    distractor: str | None


def make_tools(k: int, *, seed: int = 0, min_args: int = 3, max_args: int = 5) -> list[Tool]:
    """``k`` distinct tools (action x object pairs drawn without replacement), each with
    ``min_args..max_args`` arguments of its object, 1-2 of them required.

    Raises:
      ValueError: ``k`` outside ``1..max_tools()`` or a bad argument range.
    """
    if not 1 <= k <= max_tools():
        raise ValueError(f"make_tools: k must be in 1..{max_tools()}, got {k}")
    if not 1 <= min_args <= max_args:
        raise ValueError(f"make_tools: need 1 <= min_args <= max_args, got {min_args}, "
                         f"{max_args}")
    rng = random.Random(seed)
    pairs = [(a, o) for o in OBJECTS for a in ACTIONS]
    rng.shuffle(pairs)
    tools = []
    for action, obj in sorted(pairs[:k], key=lambda p: (p[1], p[0])):
        noun, pool = OBJECTS[obj]
        n = rng.randint(min(min_args, len(pool)), min(max_args, len(pool)))
        names = rng.sample(pool, n)
        n_required = rng.randint(1, min(2, n))
        specs = tuple(_ARGS[a] for a in names)
        required = [a for a in names[:n_required]]
        properties = {}
        for spec in specs:
            schema = json.loads(json.dumps(spec.schema))
            if spec.name in required:
                schema.pop("default", None)  # a required argument has no default
            properties[spec.name] = schema
        params = {"type": "object", "properties": properties, "required": required}
        verb = ACTIONS[action][0]
        tools.append(Tool(f"{action}_{obj}", f"{verb} {noun}.", params, action, obj, specs))
    return tools


def render_value(value: Any, schema: dict) -> str:
    """A value as a query states it: lists as "a, b and c", numbers as Python prints them."""
    if isinstance(value, list):
        items = [render_value(v, schema.get("items", {})) for v in value]
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    return str(value)


def _phrase(spec: ArgSpec, value: Any, index: int) -> str:
    if spec.schema["type"] == "boolean":
        return (spec.phrases if value else spec.false_phrases)[index]
    if spec.schema["type"] == "object":
        fields = {k: value.get(k, "") for k in spec.schema["properties"]}
        fields["phone"] = f", phone {value['phone']}" if "phone" in value else ""
        return spec.phrases[index].format(**fields)
    return spec.phrases[index].format(v=render_value(value, spec.schema))


def _indices(n: int, split: str) -> list[int]:
    return list(range(n - 1)) if split == "seen" else [n - 1]


def _candidates(tool: Tool, tools: Sequence[Tool], n: int, rng: random.Random) -> list[str]:
    """The gold tool and ``n - 1`` others, the most confusable (same object, then same
    action) first, shuffled."""
    others = [t for t in tools if t.name != tool.name]
    rng.shuffle(others)
    others.sort(key=lambda t: (t.object != tool.object, t.action != tool.action))
    names = [tool.name] + [t.name for t in others[:max(n - 1, 0)]]
    rng.shuffle(names)
    return names


def make_examples(tools: Sequence[Tool], n: int, *, seed: int = 0, split: str = "seen",
                  optional_prob: float = 0.5, distractor_prob: float = 0.5,
                  candidates: int = 4, locale: str = "en_US") -> list[ToolExample]:
    """``n`` queries over ``tools`` (round-robin, so each tool gets n/K), with gold calls.

    Raises:
      ValueError: an unknown split or a probability outside [0, 1].
    """
    with require("data", "lcjax.tools.world"):
        from faker import Faker

    if split not in ("seen", "heldout"):
        raise ValueError(f"make_examples: split must be 'seen' or 'heldout', got {split!r}")
    for name, p in (("optional_prob", optional_prob), ("distractor_prob", distractor_prob)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"make_examples: {name} must be in [0, 1], got {p}")
    if not tools:
        raise ValueError("make_examples: no tools")
    rng = random.Random(seed)
    fake = Faker(locale)
    fake.seed_instance(seed)
    out = []
    for i in range(n):
        tool = tools[i % len(tools)]
        required = set(tool.parameters["required"])
        given = [s for s in tool.args if s.name in required or rng.random() < optional_prob]
        rng.shuffle(given)
        arguments = {s.name: s.sample(fake, rng) for s in given}
        phrases = [_phrase(s, arguments[s.name],
                           rng.choice(_indices(len(s.phrases), split))) for s in given]
        templates = ACTIONS[tool.action][1]
        t = rng.choice(_indices(len(templates), split))
        query = templates[t].format(objects=OBJECTS[tool.object][0], args=" ".join(phrases))
        distractor = None
        if rng.random() < distractor_prob and given:
            spec = rng.choice(given)
            other = spec.sample(fake, rng)
            if other != arguments[spec.name] and spec.schema["type"] != "boolean":
                value = (render_value(other, spec.schema) if spec.schema["type"] != "object"
                         else other["name"])
                distractor = rng.choice(_DISTRACTORS).format(v=value)
                query = f"{query} {distractor}" if rng.random() < 0.5 else f"{distractor} {query}"
        call = {"name": tool.name, "arguments": {s.name: arguments[s.name]
                                                 for s in tool.args if s.name in arguments}}
        out.append(ToolExample(query, call, tool.name,
                               tuple(_candidates(tool, tools, candidates, rng)), t, split,
                               distractor))
    return out


def openai_tools(tools: Sequence[Tool]) -> list[dict]:
    """The ``tools=`` list of an OpenAI chat-completions request."""
    return [t.openai() for t in tools]


def openai_call(call: dict, call_id: str = "call_0") -> dict:
    """A call ``{"name", "arguments"}`` as an OpenAI assistant ``tool_calls`` entry (the
    arguments JSON-encoded, as the API sends them)."""
    return {"id": call_id, "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}


# ------------------------------------------------------------------ training text

def call_text(call: dict) -> str:
    """The canonical text of a call, what a model is trained to emit after the prompt:
    compact JSON ``{"name": ..., "arguments": {...}}`` (``ast_check`` parses it back)."""
    return json.dumps({"name": call["name"], "arguments": call["arguments"]},
                      separators=(",", ":"), ensure_ascii=False)


def tool_docs(tools: Sequence[Tool]) -> str:
    """In-context tool documentation: one OpenAI tool JSON per line (the baseline that
    ParaTool's parameterized tools remove from the context)."""
    return "\n".join(json.dumps(t.openai(), separators=(",", ":"), ensure_ascii=False)
                     for t in tools)


def prompt_text(example: ToolExample, tools: Sequence[Tool] | None = None) -> str:
    """The prompt before the call: ``"Query: <query>\nCall: "``, preceded by
    ``"Tools:\n<tool_docs of the example's candidates>\n"`` when ``tools`` (the world's
    tools, looked up by name) is given."""
    head = ""
    if tools is not None:
        by_name = {t.name: t for t in tools}
        missing = [n for n in example.candidates if n not in by_name]
        if missing:
            raise ValueError(f"prompt_text: candidates {missing} are not among the tools")
        head = "Tools:\n" + tool_docs([by_name[n] for n in example.candidates]) + "\n"
    return f"{head}Query: {example.query}\nCall: "


@dataclasses.dataclass(frozen=True)
class PromptAnswer:
    """A prompt and the answer a model should produce after it (bytes), the fields
    :func:`lcjax.data.ruler.make_batch` reads."""

    prompt: bytes
    answer: bytes


def make_tool_batch(examples: Sequence[ToolExample], seq_len: int | None = None, *,
                    tools: Sequence[Tool] | None = None, eos: bool = True) -> dict:
    """Byte-token training/eval arrays: row b is ``prompt_text + call_text`` (with the
    candidates' docs in context when ``tools`` is given), ``loss_mask`` on the call bytes
    (and EOS) — :func:`lcjax.data.ruler.make_batch`'s layout (``inputs``, ``targets``,
    ``loss_mask``, ``answer_start``, ``answer_len``), plus ``context_tokens`` [B]: the
    prompt's byte tokens (BOS included), the context cost a method pays per query."""
    samples = [PromptAnswer(prompt_text(e, tools).encode(), call_text(e.call).encode())
               for e in examples]
    batch = make_batch(samples, seq_len, bos=True, eos=eos)
    batch["context_tokens"] = batch["answer_start"] + 1
    return batch
