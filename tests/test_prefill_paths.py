"""Token-sparse prefill on an imported Hugging Face model through every user path (issue 36):
``generate``, ``lcjax serve`` (its app in-process) and ``lcjax eval --model HF_FOLDER`` give
the same replies and the same log-probs (to 1e-5), which differ from dense; ``lcjax eval``
encodes prompts with the folder's tokenizer and sizes them in its tokens."""

from __future__ import annotations

import argparse
import json
import os
import string

import numpy as np
import pytest
from flax import nnx

from lcjax.data.model_tokenizers import HFTokenizer
from lcjax.interop.hf import load_hf, save_hf
from lcjax.nn import DecoderConfig, DecoderLM, generate

SPARSE = {"coverage": 0.3, "min_tokens": 32, "window": 8, "pool": 3, "block_kv": 32}
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny Llama-format folder with a character-level tokenizer (one token per printable
    ASCII character, ``<s>`` added in front, ``</s>`` the EOS)."""
    from tokenizers import Tokenizer, models, processors

    path = str(tmp_path_factory.mktemp("hf") / "tiny")
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", *chars])}
    t = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    t.add_special_tokens(["<s>", "</s>"])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    cfg = DecoderConfig(vocab_size=len(vocab), d_model=32, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, mlp_hidden=64, max_len=1024)
    save_hf(DecoderLM(cfg, rngs=nnx.Rngs(5)), path)
    t.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "</s>", "bos_token": "<s>"}, f)
    with open(os.path.join(path, "config.json")) as f:
        hf = json.load(f)
    hf.update(eos_token_id=2, bos_token_id=1, max_position_embeddings=1024)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f)
    return path


def _reply(model, tokenizer, prompt: str, **kw):
    ids = tokenizer.encode(prompt)
    out = generate(model, ids[None], MAX_TOKENS, stop_tokens=tokenizer.eos_ids,
                   pad_id=tokenizer.pad_id, **kw)
    gen = np.asarray(out.tokens)[0, len(ids):int(out.lengths[0])]
    return tokenizer.decode(gen[~np.isin(gen, tokenizer.eos_ids)]), out


def test_generate_serve_and_eval_agree_and_differ_from_dense(hf_dir, tmp_path):
    import openai

    from lcjax.agents.scripted import ThreadedServer
    from lcjax.eval import cli as eval_cli
    from lcjax.serve import ServedModel, create_app

    tokenizer = HFTokenizer(hf_dir)
    dense, _ = load_hf(hf_dir)
    sparse, _ = load_hf(hf_dir, attention="token_sparse", attention_options=SPARSE)
    # the items `lcjax eval` builds (RULER niah at 512 tokens of this tokenizer)
    parser = argparse.ArgumentParser()
    eval_cli.add_arguments(parser)
    out = str(tmp_path / "eval")
    args = parser.parse_args([
        "--suite", "ruler", "--model", hf_dir, "--lengths", "512", "--tasks", "niah_single_1",
        "--depths", "0.5", "--n-per-cell", "2", "--attention", "token_sparse",
        "--attention-options", json.dumps(SPARSE), "--max-new-tokens", str(MAX_TOKENS),
        "--out", out, "--no-progress", "--batch-size", "2", "--allow-errors"])
    assert eval_cli.run(args) == 0
    with open(os.path.join(out, "results.jsonl")) as f:
        records = [json.loads(line) for line in f if '"prediction"' in line]
    assert len(records) == 2 and all(r["error"] is None for r in records)
    from lcjax.data.items import build_items

    items = build_items("ruler", (512,), (0.5,), 2, 0, tasks=["niah_single_1"],
                        tokenizer=tokenizer.encode)
    prompts = [it.prompt.decode() for it in items]
    for prompt in prompts:
        n = len(tokenizer.encode(prompt))
        assert abs(n - 512) <= 0.02 * 512, n  # sized in the folder's tokens
        assert n > SPARSE["min_tokens"] + SPARSE["window"]
    direct = [_reply(sparse, tokenizer, p, return_logprobs=True) for p in prompts]
    dense_out = [_reply(dense, tokenizer, p, return_logprobs=True)[1] for p in prompts]
    # generate's log-probs of each reply's tokens (a final stop token included)
    want = [np.asarray(out.logprobs)[0, :int(out.lengths[0]) - len(tokenizer.encode(p))]
            for p, (_, out) in zip(prompts, direct)]
    for (_, s), d in zip(direct, dense_out):
        assert np.max(np.abs(np.asarray(s.logprobs) - np.asarray(d.logprobs))) > 1e-3
    # eval's predictions are generate's replies, its log-probs generate's numbers
    assert [r["prediction"] for r in records] == [t for t, _ in direct]
    for r, w in zip(records, want):
        assert len(r["logprobs"]) == len(w) > 0
        np.testing.assert_allclose(r["logprobs"], w, rtol=0, atol=1e-5)
    # lcjax serve, in-process, with the same model: the same replies
    app = create_app(ServedModel(sparse, tokenizer, "tiny", 1024), batch_window_ms=0,
                     min_bucket=8)
    with ThreadedServer(app) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                               timeout=120)
        for prompt, (text, _), w, d in zip(prompts, direct, want, dense_out):
            reply = client.completions.create(model="tiny", prompt=prompt, logprobs=2,
                                              max_tokens=MAX_TOKENS, temperature=0)
            assert reply.choices[0].text == text
            served_lp = reply.choices[0].logprobs.token_logprobs
            np.testing.assert_allclose(served_lp, w, rtol=0, atol=1e-5)
            assert np.max(np.abs(np.asarray(served_lp)
                                 - np.asarray(d.logprobs)[0, :len(w)])) > 1e-3


def test_eval_exits_nonzero_when_items_fail_and_skips_short_tasks(hf_dir, tmp_path, capsys):
    from lcjax.eval import cli as eval_cli

    parser = argparse.ArgumentParser()
    eval_cli.add_arguments(parser)
    # 12 tokens cannot hold a needle task: skipped with a note; 512 runs
    base = ["--suite", "ruler", "--model", hf_dir, "--lengths", "12,512", "--tasks",
            "niah_single_1", "--depths", "0.5", "--n-per-cell", "1", "--max-new-tokens", "2",
            "--no-progress"]
    args = parser.parse_args(base + ["--out", str(tmp_path / "a")])
    assert eval_cli.run(args) == 0
    assert "skipped task 'niah_single_1' at length 12" in capsys.readouterr().err
    # a model whose every reply fails: summary and exit 1, exit 0 with --allow-errors
    import importlib

    ev = importlib.import_module("lcjax.eval.evaluate")

    def boom(*a, **k):
        def run(prompts):
            for i in range(len(prompts)):
                yield i, None, "HTTP 400: prompt longer than the context"
        return run, "broken"

    orig = ev.make_runner
    ev.make_runner = boom
    try:
        args = parser.parse_args(base + ["--out", str(tmp_path / "b")])
        assert eval_cli.run(args) == 1
        assert "1 of 1 items failed" in capsys.readouterr().err
        args = parser.parse_args(base + ["--out", str(tmp_path / "c"), "--allow-errors"])
        assert eval_cli.run(args) == 0
    finally:
        ev.make_runner = orig
