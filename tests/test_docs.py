"""The user docs cannot drift from the code: ``docs/features.md`` is the text
``lcjax.nn.variants.markdown()`` generates from the registered specs, and every block of
``docs/quickstart.md`` runs (Python blocks executed in one namespace on a tiny random
Llama-format folder written by ``save_hf``; each ``lcjax`` shell command parsed by the CLI's
own parser, and the ``lcjax serve`` one served in-process with the parsed options)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from lcjax import attention
from lcjax.attention import AttentionSpec, Features, Implementation
from lcjax.nn import variants

DOCS = Path(__file__).resolve().parents[1] / "docs"
HF_NAME = "Llama-3.2-1B"  # the folder name the quickstart uses; the test's tiny folder has it


def test_features_md_is_the_generated_text():
    text = (DOCS / "features.md").read_text(encoding="utf-8")
    assert text == variants.markdown(), (
        f"docs/features.md is out of date with the registered specs; regenerate it with "
        f"`{variants.REGENERATE}`")


def test_feature_matrix_reads_every_spec_and_every_features_field(capsys):
    def toy(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
            kv_segment_ids=None, return_aux=False):
        return v

    feats = Features(mask=False, segment_ids=False, lse=True, dtypes=("float32",))
    spec = AttentionSpec(
        name="toy_matrix", reference=toy, description="a toy.",
        implementations=(Implementation("fast", toy, features=dataclasses.replace(
            feats, lse=False)), Implementation("xla", toy)),
        features=feats, params="somewhere.module:toy_params")
    attention.register(spec)
    try:
        rows = {r["variant"]: r for r in variants.feature_matrix()}
        text = variants.markdown()
    finally:
        attention.unregister("toy_matrix")
    assert sorted(rows) == sorted(attention.available() + ["toy_matrix"])
    names = [f.name for f in dataclasses.fields(Features)]
    for row in rows.values():  # every Features field, whatever fields the contract has
        assert list(row["features"]) == names
    row = rows["toy_matrix"]
    assert row["features"]["mask"] is False and row["features"]["lse"] is True
    assert row["features"]["dtypes"] == ["float32"]
    assert row["parameters"] == "toy_params"
    assert row["implementations"] == [{"name": "fast", "lacks": ["lse"]},
                                      {"name": "xla", "lacks": []}]
    # no mask: the cache path cannot hide empty slots, so a decoder cannot decode with it
    assert row["kv_cache_decoding"] is False and "mask" in row["kv_cache_note"]
    assert not row["method_prefill"]
    assert "| `toy_matrix` |" in text and "fast (not lse), xla" in text
    assert "No KV-cache decoding" in text.split("`toy_matrix`: a toy.")[1].splitlines()[0]
    # what generate itself does with the registered variants
    assert rows["token_sparse"]["method_prefill"] and rows["softmax"]["kv_cache_decoding"]
    assert not rows["performer"]["kv_cache_decoding"]  # no mask (docs/performer)
    assert not rows["nystrom"]["kv_cache_decoding"]  # not causal
    # the CLI prints the same rows as JSON
    from lcjax.cli import main

    assert main(["variants"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == [r for r in variants.feature_matrix()]
    assert main(["variants", "--markdown", "--out", "/nonexistent/dir/features.md"]) == 2
    assert "cannot write --out" in capsys.readouterr().err


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A random Llama-format folder with lcjax's byte tokenizer (``save_hf`` writes it)."""
    from flax import nnx

    from lcjax.data import tokenizer as tok
    from lcjax.interop.hf import save_hf
    from lcjax.nn import DecoderConfig, DecoderLM

    path = tmp_path_factory.mktemp("quickstart") / HF_NAME
    cfg = DecoderConfig(vocab_size=tok.VOCAB_SIZE, d_model=32, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, mlp_hidden=64, max_len=4096)
    save_hf(DecoderLM(cfg, rngs=nnx.Rngs(7)), path)
    assert (path / "tokenizer.json").is_file()
    return str(path)


def _cli_commands(text: str) -> list[list[str]]:
    """argv of every ``lcjax`` command in the doc's bash blocks."""
    out = []
    for block in _blocks(text, "bash"):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words and os.path.basename(words[0]) == "lcjax":
                out.append(words[1:])
    return out


def test_quickstart_blocks_run(tiny_hf, tmp_path, monkeypatch):
    from lcjax.agents.scripted import ThreadedServer
    from lcjax.cli import build_parser
    from lcjax.serve import create_app, load_served

    text = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    commands = _cli_commands(text)
    assert {c[0] for c in commands} >= {"variants", "eval", "serve"}
    parsed = {}
    for argv in commands:
        argv = [tiny_hf if w == HF_NAME else w for w in argv]
        parsed[argv[0]] = build_parser(argv).parse_args(argv)  # a bad flag exits here
    serve = parsed["serve"]
    assert serve.attention == "token_sparse" and serve.checkpoint == tiny_hf
    served = load_served(serve.checkpoint, name=serve.name, max_len=serve.max_len,
                         attention=serve.attention, attention_options=serve.attention_options)
    assert served.name == HF_NAME
    app = create_app(served, batch_window_ms=0, min_bucket=serve.min_bucket)

    python = _blocks(text, "python")
    assert len(python) == 5
    source = "\n".join(python)
    assert source.count(f'path = "{HF_NAME}"') == 1 and "http://127.0.0.1:8000" in source
    source = source.replace(f'path = "{HF_NAME}"', f"path = {tiny_hf!r}")
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    with ThreadedServer(app) as server:
        source = source.replace("http://127.0.0.1:8000", server.url)
        exec(compile(source, str(DOCS / "quickstart.md"), "exec"), ns)
    assert ns["err"] < 1e-5                        # drop-in: equals jax.nn's attention
    assert ns["sparse_out"].shape == ns["ref"].shape
    n = len(ns["ids"])
    assert n > ns["SPARSE"]["min_tokens"] + 128     # the prompt is long enough to be sparse
    assert ns["gap"].max() > 1e-3                  # sparse is not dense
    assert np.abs(ns["served"] - ns["want"]).max() < 1e-5 and ns["served"].size > 0
    records = ns["res"].records
    assert len(records) == 2 and all(r["error"] is None and r["logprobs"] for r in records)
