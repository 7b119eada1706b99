"""The feature matrix of every registered attention variant, read from the specs.

One row per registered :class:`~lcjax.attention.AttentionSpec` (``lcjax.attention.specs()``):

- every field of :class:`~lcjax.attention.Features` (read with ``dataclasses.fields``, so a
  field added to the contract becomes a column without a change here): the flags as booleans,
  ``dtypes`` as the accepted dtype names;
- ``kv_cache_decoding``: whether a decoder layer (``causal=True``) with this variant decodes
  from a KV cache — :func:`lcjax.nn.attention.kv_cache_gap`, the check
  ``Attention``/``generate`` run, is None; ``kv_cache_note`` is its reason otherwise;
- ``method_prefill``: whether ``generate`` prefills with the method itself on the prompts and
  then decodes from the cache (:data:`lcjax.nn.sampling.SPLIT_PREFILL`), rather than writing
  the prompts through the cache in one cached call;
- ``parameters``: the name of the spec's parameter factory (learnable parameters a
  ``lcjax.nn.Attention`` layer builds), or None;
- ``implementations``: in dispatch order, each with the spec features it lacks (an
  implementation may support less than its spec, e.g. a Pallas kernel without masks).

``markdown()`` renders it (``docs/features.md`` is its output: ``lcjax variants --markdown
--out docs/features.md``, and a test keeps the file equal to it).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys

from lcjax.attention import Features, specs
from lcjax.errors import UsageError
from lcjax.nn.attention import kv_cache_gap
from lcjax.nn.sampling import SPLIT_PREFILL

__all__ = ["REGENERATE", "add_arguments", "feature_matrix", "markdown", "run"]

REGENERATE = "lcjax variants --markdown --out docs/features.md"


def _factory_name(params) -> str | None:
    """``"module:attr"`` strings give ``attr``; callables their ``__name__``."""
    if params is None:
        return None
    if isinstance(params, str):
        return params.rpartition(":")[2]
    return getattr(params, "__name__", type(params).__name__)


def _feature_values(features: Features) -> dict:
    """Every field of ``features`` by name (tuples as lists, for JSON)."""
    out = {}
    for field in dataclasses.fields(features):
        value = getattr(features, field.name)
        out[field.name] = list(value) if isinstance(value, tuple) else value
    return out


def feature_matrix() -> list[dict]:
    """One dict per registered variant, sorted by name::

        {"variant": str, "description": str,
         "features": {Features field: bool | list[str]},
         "kv_cache_decoding": bool, "kv_cache_note": str | None,
         "method_prefill": bool, "parameters": str | None,
         "implementations": [{"name": str, "lacks": [str]}]}
    """
    rows = []
    for spec in specs():
        gap = kv_cache_gap(spec, causal=True)
        impls = [{"name": impl.name,
                  "lacks": spec.features.exceeds(spec.features_of(impl.name))}
                 for impl in spec.implementations]
        rows.append({"variant": spec.name, "description": spec.description,
                     "features": _feature_values(spec.features),
                     "kv_cache_decoding": gap is None, "kv_cache_note": gap,
                     "method_prefill": spec.name in SPLIT_PREFILL,
                     "parameters": _factory_name(spec.params),
                     "implementations": impls})
    return rows


def _cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "—"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return "—" if value is None else f"`{value}`"


def _impls(impls: list[dict]) -> str:
    return ", ".join(i["name"] + (f" (not {', '.join(i['lacks'])})" if i["lacks"] else "")
                     for i in impls)


def _features_legend() -> list[str]:
    """The ``Features`` docstring after its first line, as the columns' legend."""
    doc = inspect.getdoc(Features) or ""
    body = doc.split("\n", 1)[1].strip() if "\n" in doc else ""
    return [f"    {line}" if line else "" for line in body.splitlines()]


def markdown() -> str:
    """``docs/features.md``: the table of :func:`feature_matrix` and its legend."""
    rows = feature_matrix()
    fields = [f.name for f in dataclasses.fields(Features)]
    head = ["variant", *fields, "KV-cache decoding", "method prefill", "parameters",
            "implementations (dispatch order)"]
    lines = [
        "# Feature matrix of the attention variants",
        "",
        f"Generated from the registered specs by `{REGENERATE}`",
        "(`lcjax.nn.variants.markdown()`); do not edit by hand — a test keeps this file equal",
        "to the generated text.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cells = [f"`{r['variant']}`", *(_cell(r["features"][f]) for f in fields),
                 _cell(r["kv_cache_decoding"]), _cell(r["method_prefill"]),
                 _cell(r["parameters"]), _impls(r["implementations"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Columns",
        "",
        f"The columns from `{fields[0]}` to `{fields[-1]}` are the fields of "
        "`lcjax.attention.Features`,",
        "what a call may use (a call using a feature its spec lacks is a `ValueError` before",
        "anything runs):",
        "",
        *_features_legend(),
        "",
        "- **KV-cache decoding**: a causal `lcjax.nn.Attention` layer with this variant decodes",
        "  from a KV cache (`generate`, `lcjax serve`, `lcjax eval`); the check is",
        "  `lcjax.nn.attention.kv_cache_gap`, whose reason is listed below where it fails.",
        "- **method prefill**: `generate` runs the method itself over each prompt (per row,",
        "  padding masked by segment ids), fills the caches with the K/V it received, then",
        "  decodes from them (`lcjax.nn.sampling.SPLIT_PREFILL`); for the other variants the",
        "  prompt is written through the cache in one cached call.",
        "- **parameters**: the variant's own learnable parameters (the spec's factory), built",
        "  by `lcjax.nn.Attention` and initialised by `load_hf(..., attention=...)`.",
        "- **implementations**: tried in this order with `implementation=None` (on a CPU target",
        "  the Pallas kernels run only when named, in the interpreter); \"not ...\" lists the",
        "  spec features an implementation lacks — dispatch passes it over for such a call.",
        "",
        "## Variants",
        "",
    ]
    for r in rows:
        note = "" if r["kv_cache_note"] is None else f" No KV-cache decoding: {r['kv_cache_note']}."
        lines.append(f"- `{r['variant']}`: {r['description'].rstrip('.')}.{note}")
    return "\n".join(lines) + "\n"


# --- `lcjax variants` ------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--markdown", action="store_true",
                        help="print the markdown page (docs/features.md) instead of JSON")
    parser.add_argument("--out", default=None,
                        help="write to this file instead of stdout")


def run(args: argparse.Namespace) -> int:
    import json

    text = markdown() if args.markdown else json.dumps(feature_matrix(), indent=1) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise UsageError(f"cannot write --out {args.out!r}: {e.strerror}") from None
    return 0
