"""``lcjax serve`` conformance: the official ``openai`` client against a real server on
127.0.0.1 (uvicorn in a thread), replies checked against :func:`lcjax.nn.generate` run
directly, batching counted, OpenAI error bodies, the eval endpoint client, and the CLI in a
subprocess stopped by SIGTERM.

Compile budget: every served request pads to a 32-token prompt and 4 new tokens, so the
server compiles (1, 32, 4) and (4, 32, 4) greedy programs and one sampled one; the direct
references compile their own unpadded shapes.
"""

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import openai
import pytest
import requests
from flax import nnx

from lcjax.agents.scripted import ThreadedServer
from lcjax.data import tokenizer as tok
from lcjax.eval.endpoint import EndpointConfig, complete
from lcjax.nn import DecoderConfig, DecoderLM, generate
from lcjax.serve import (
    Batcher,
    ByteTokenizer,
    HFTokenizer,
    ServedModel,
    create_app,
    load_served,
    next_power_of_two,
    render_byte_chat,
)
from lcjax.serve.app import cut_at_stop

TINY = DecoderConfig(vocab_size=tok.VOCAB_SIZE, d_model=32, num_layers=1, num_heads=2,
                     num_kv_heads=2, head_dim=16, mlp_hidden=64, max_len=64)
MAX_TOKENS = 4
# BOS + 31 bytes = 32 tokens, the bucket itself: the direct reference on the unpadded prompt
# and the server's padded batch of one run the same compiled program
PROMPT = "To be, or not to be, that is th"
CHAT = [{"role": "user", "content": "Hi!"}]  # 21 tokens: the 32-token bucket


def direct_text(model, ids, max_tokens=MAX_TOKENS, **kw):
    """The reply by lcjax.nn.generate on the unpadded prompt alone: (text, tokens, stopped)."""
    out = generate(model, np.asarray(ids, np.int32)[None], max_tokens, stop_tokens=(tok.EOS,),
                   pad_id=tok.PAD, **kw)
    gen = np.asarray(out.tokens)[0, len(ids):int(out.lengths[0])]
    return ByteTokenizer().decode(gen), len(gen), bool(gen.size) and gen[-1] == tok.EOS


@pytest.fixture(scope="module")
def model():
    return DecoderLM(TINY, rngs=nnx.Rngs(3))


@pytest.fixture(scope="module")
def served(model):
    app = create_app(ServedModel(model, ByteTokenizer(), "tiny", TINY.max_len),
                     batch_window_ms=300, max_batch=4, min_bucket=32)
    with ThreadedServer(app) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                               timeout=60)
        yield server.url, client, app.state.batcher


def test_models_completion_and_chat_equal_direct_generate(model, served):
    url, client, batcher = served
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"

    prompt = PROMPT
    want, count, stopped = direct_text(model, tok.encode(prompt, bos=True))
    got = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                    temperature=0)
    assert got.choices[0].text == want
    assert got.usage.prompt_tokens == len(prompt) + 1  # BOS + bytes
    assert got.usage.completion_tokens == count
    assert got.usage.total_tokens == len(prompt) + 1 + count
    assert got.choices[0].finish_reason == ("stop" if stopped else "length")

    chat_ids = tok.encode(render_byte_chat(CHAT), bos=True)
    assert tok.decode(chat_ids) == "user: Hi!\nassistant:"
    assert render_byte_chat([{"role": "system", "content": "Be brief."}, *CHAT]) == (
        "system: Be brief.\nuser: Hi!\nassistant:")
    want_chat, count_chat, _ = direct_text(model, chat_ids)
    reply = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=MAX_TOKENS,
                                           temperature=0)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == want_chat
    assert reply.usage.prompt_tokens == len(chat_ids)
    assert reply.usage.completion_tokens == count_chat
    # a list of prompts: one choice each, in order
    two = client.completions.create(model="tiny", prompt=[prompt, prompt[:5]],
                                    max_tokens=MAX_TOKENS, temperature=0)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].text == want
    assert two.usage.prompt_tokens == len(prompt) + 1 + 6
    assert two.choices[1].text == client.completions.create(
        model="tiny", prompt=prompt[:5], max_tokens=MAX_TOKENS, temperature=0).choices[0].text


def test_logprobs_are_generates_numbers(model, served):
    """``logprobs`` (completions) and ``logprobs``/``top_logprobs`` (chat) report
    ``generate``'s own log-probs of the reply's tokens and its most likely tokens."""
    url, client, batcher = served
    ids = tok.encode(PROMPT, bos=True)
    out = generate(model, np.asarray(ids, np.int32)[None], MAX_TOKENS, stop_tokens=(tok.EOS,),
                   pad_id=tok.PAD, return_logprobs=True, top_logprobs=3)
    n = int(out.lengths[0]) - len(ids)
    gen = np.asarray(out.tokens)[0, len(ids):len(ids) + n]
    want = np.asarray(out.logprobs)[0, :n]
    top_ids, top_lp = (np.asarray(x)[0, :n] for x in out.top_logprobs)
    # an independent check of generate's numbers: log-softmax of a full forward pass
    full = np.asarray(model(np.asarray(out.tokens)[:, :len(ids) + n]), np.float64)[0]
    top = full.max(-1, keepdims=True)
    logp = full - top - np.log(np.exp(full - top).sum(-1, keepdims=True))
    np.testing.assert_allclose(want, logp[len(ids) - 1 + np.arange(n), gen], atol=1e-4)
    np.testing.assert_allclose(top_lp, -np.sort(-logp[len(ids) - 1:len(ids) - 1 + n], -1)[:, :3],
                               atol=1e-4)

    got = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                    temperature=0, logprobs=3)
    lp = got.choices[0].logprobs
    assert lp.tokens == [ByteTokenizer().decode([t]) for t in gen]
    np.testing.assert_allclose(lp.token_logprobs, want, rtol=0, atol=1e-5)
    assert lp.text_offset == [len(ByteTokenizer().decode(gen[:i])) for i in range(n)]
    for i, top in enumerate(lp.top_logprobs):  # the 3 most likely, and the chosen token
        expect: dict = {}  # texts that collide (bytes >= 128 alone) keep the likelier one
        for t, v in [*zip(top_ids[i], top_lp[i]), (gen[i], want[i])]:
            expect.setdefault(ByteTokenizer().decode([t]), float(v))
        assert top.keys() == expect.keys()
        np.testing.assert_allclose([top[k] for k in expect], list(expect.values()), atol=1e-5)
    assert got.choices[0].logprobs.token_logprobs[0] == pytest.approx(max(lp.top_logprobs[0]
                                                                          .values()))  # greedy
    for bad in (-1, True, 1.5, TINY.vocab_size + 1):
        with pytest.raises(ValueError, match="top_logprobs"):
            generate(model, np.asarray(ids, np.int32)[None], 2, top_logprobs=bad)
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                      temperature=0)
    assert plain.choices[0].logprobs is None

    reply = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=MAX_TOKENS,
                                           temperature=0, logprobs=True, top_logprobs=2)
    chat_ids = tok.encode(render_byte_chat(CHAT), bos=True)
    ref = generate(model, np.asarray(chat_ids, np.int32)[None], MAX_TOKENS,
                   stop_tokens=(tok.EOS,), pad_id=tok.PAD, return_logprobs=True)
    content = reply.choices[0].logprobs.content
    m = int(ref.lengths[0]) - len(chat_ids)
    np.testing.assert_allclose([c.logprob for c in content], np.asarray(ref.logprobs)[0, :m],
                               atol=1e-5)
    assert all(len(c.top_logprobs) == 2 for c in content)
    assert all(bytes(c.bytes).decode() == c.token for c in content)

    for body, param in (({"prompt": "a", "logprobs": 6}, "logprobs"),
                        ({"prompt": "a", "logprobs": -1}, "logprobs"),
                        ({"prompt": "a", "logprobs": True}, "logprobs"),
                        ({"prompt": "a", "logprobs": 1.5}, "logprobs")):
        err = _error(url, "/v1/completions", {"model": "tiny", **body})
        assert err["param"] == param, err
    chat = {"model": "tiny", "messages": CHAT}
    assert _error(url, "/v1/chat/completions", {**chat, "logprobs": 1})["param"] == "logprobs"
    assert _error(url, "/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 9}
                  )["param"] == "top_logprobs"
    err = _error(url, "/v1/chat/completions", {**chat, "top_logprobs": 2})
    assert "`top_logprobs` needs `logprobs: true`" in err["message"]


def test_concurrent_requests_batch_into_fewer_generate_calls(served):
    url, client, batcher = served
    prompts = ["A", "Hark, who", "Once more unto", "Now is the winter of"]

    def ask(p):
        r = client.completions.create(model="tiny", prompt=p, max_tokens=MAX_TOKENS - p.count(
            "o") % 2, temperature=0)  # mixed max_tokens in one batch
        return r.choices[0].text, r.usage.completion_tokens

    alone = [ask(p) for p in prompts]  # one at a time: batches of one
    calls = batcher.stats.generate_calls
    barrier = threading.Barrier(len(prompts))

    def together(p):
        barrier.wait()
        return ask(p)

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        batched = list(pool.map(together, prompts))
    new_sizes = batcher.stats.batch_sizes[calls:]
    assert sum(new_sizes) == len(prompts)
    assert len(new_sizes) < len(prompts) and max(new_sizes) > 1, new_sizes
    assert batched == alone
    assert max(c for _, c in alone) <= MAX_TOKENS
    stats = requests.get(url + "/v1/lcjax/stats", timeout=10).json()
    assert stats["generate_calls"] == batcher.stats.generate_calls
    assert stats["distinct_shapes"] <= 3  # (1, 32, 4), (4, 32, 4) [, (2, 32, 4)]


def test_stop_strings_cut_the_text_and_count_tokens():
    ids = tok.encode("hello world")
    text, count, hit = cut_at_stop(ByteTokenizer(), ids, ["o w", "zz"])
    assert (text, count, hit) == ("hell", 7, True)  # "hello w" is the shortest prefix with it
    assert cut_at_stop(ByteTokenizer(), ids, ["q"]) == ("hello world", 11, False)
    assert cut_at_stop(ByteTokenizer(), ids, ["ld", "l"])[:2] == ("he", 3)


def test_stop_and_stream_over_http(model, served):
    url, client, _ = served
    prompt = PROMPT
    want, _, _ = direct_text(model, tok.encode(prompt, bos=True))
    stop = want[1:3] or "never"
    got = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                    temperature=0, stop=[stop])
    cut = want.find(stop)
    assert got.choices[0].text == (want[:cut] if cut >= 0 else want)
    assert got.choices[0].finish_reason == ("stop" if cut >= 0 else "length")

    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT,
                                                 max_tokens=MAX_TOKENS, temperature=0,
                                                 stream=True))
    want_chat, _, _ = direct_text(model, tok.encode(render_byte_chat(CHAT), bos=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want_chat
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    raw = requests.post(url + "/v1/completions", json={"model": "tiny", "prompt": prompt,
                        "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}, timeout=60)
    lines = [x for x in raw.text.split("\n") if x]
    assert lines[-1] == "data: [DONE]" and all(x.startswith("data: ") for x in lines)
    assert json.loads(lines[0][6:])["choices"][0]["text"] == want


def test_seeded_sampling_is_reproducible_and_matches_generate(model, served):
    _, client, _ = served
    prompt = PROMPT[::-1]
    ids = tok.encode(prompt, bos=True)
    want, _, _ = direct_text(model, ids, temperature=0.9, rng=jax.random.key(11))
    args = dict(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.9, seed=11)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # in flight with greedy requests
        seeded = pool.submit(lambda: client.completions.create(**args).choices[0].text)
        others = [pool.submit(client.completions.create, model="tiny", prompt="x",
                              max_tokens=MAX_TOKENS, temperature=0) for _ in range(3)]
        assert seeded.result() == want
        [o.result() for o in others]
    assert client.completions.create(**args).choices[0].text == want


def test_eval_endpoint_client_gets_the_same_replies(model, served):
    url, client, _ = served
    prompt = PROMPT
    want, _, _ = direct_text(model, tok.encode(prompt, bos=True))
    cfg = EndpointConfig(url, model="tiny", retries=0, timeout=60)
    assert complete(cfg, prompt, MAX_TOKENS) == want
    # without a model id (EndpointConfig's default): the served model answers
    assert complete(EndpointConfig(url, retries=0, timeout=60), prompt, MAX_TOKENS) == want
    chat = EndpointConfig(url, model="tiny", chat=True, retries=0, timeout=60)
    want_chat = client.chat.completions.create(model="tiny", messages=CHAT,
                                               max_tokens=MAX_TOKENS, temperature=0)
    assert complete(chat, CHAT[0]["content"], MAX_TOKENS) == want_chat.choices[0].message.content


def _error(url, route, body, status=400):
    r = requests.post(url + route, json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_bad_requests_get_openai_error_bodies(served):
    url, client, batcher = served
    calls = batcher.stats.generate_calls
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="a", max_tokens=2)
    assert e.value.body["code"] == "model_not_found" and "'tiny'" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="a", max_tokens=0)
    assert e.value.body["param"] == "max_tokens"
    long = "a" * 60  # 61 tokens with BOS; + 8 > 64
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=long, max_tokens=8)
    msg = e.value.body["message"]
    assert e.value.body["code"] == "context_length_exceeded"
    assert "64" in msg and "61" in msg and "max_tokens is 8" in msg
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user",
                                       "content": long}], max_tokens=40)
    assert e.value.body["code"] == "context_length_exceeded"

    assert _error(url, "/v1/completions", {"model": "tiny"})["param"] == "prompt"
    null = _error(url, "/v1/completions", {"model": "tiny", "prompt": long, "max_tokens": None})
    assert "max_tokens is 16" in null["message"]  # null is OpenAI's default, 16
    assert _error(url, "/v1/completions", {"model": "tiny", "prompt": 7})["param"] == "prompt"
    assert _error(url, "/v1/completions", {"model": 3, "prompt": "a"})["param"] == "model"
    assert _error(url, "/v1/completions", {"model": "tiny", "prompt": "a",
                                           "temperature": -1})["param"] == "temperature"
    assert _error(url, "/v1/completions", {"model": "tiny", "prompt": "a", "n": 99}
                  )["param"] == "n"
    assert _error(url, "/v1/chat/completions", {"model": "tiny", "messages": []}
                  )["param"] == "messages"
    for field, value in (("echo", True), ("best_of", 3), ("presence_penalty", 0.5),
                         ("logit_bias", {"5": 10}), ("suffix", "x")):  # not implemented
        err = _error(url, "/v1/completions", {"model": "tiny", "prompt": "a", field: value})
        assert f"`{field}` is not supported" in err["message"], err
    ok = {"model": "tiny", "prompt": "a", "max_tokens": 1, "echo": False, "best_of": 1,
          "logit_bias": {}, "presence_penalty": 0, "frequency_penalty": 0.0}
    assert requests.post(url + "/v1/completions", json=ok, timeout=30).status_code == 200
    bad_role = _error(url, "/v1/chat/completions",
                      {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]})
    assert bad_role["param"].startswith("messages.0.role")
    r = requests.post(url + "/v1/completions", data="{not json", timeout=30,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"]
    r = requests.get(url + "/v1/nothing", timeout=30)
    assert r.status_code == 404 and "/v1/nothing" in r.json()["error"]["message"]
    assert batcher.stats.generate_calls == calls + 1  # only the one valid request ran


def test_option_errors():
    m = DecoderLM(TINY, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="window_ms"):
        Batcher(m, stop_ids=(tok.EOS,), pad_id=tok.PAD, window_ms=-1)
    with pytest.raises(ValueError, match="max_batch"):
        Batcher(m, stop_ids=(tok.EOS,), pad_id=tok.PAD, max_batch=0)
    b = Batcher(m, stop_ids=(tok.EOS,), pad_id=tok.PAD)
    with pytest.raises(RuntimeError, match="start"):
        b.submit([1, 2], 3)
    with pytest.raises(ValueError, match="max_tokens"):
        b.submit([1, 2], 0)
    with pytest.raises(ValueError, match="max_len"):
        ServedModel(m, ByteTokenizer(), "tiny", 1)
    assert [next_power_of_two(n) for n in (1, 2, 3, 4, 5, 17)] == [1, 2, 4, 4, 8, 32]
    with pytest.raises(ValueError, match="not a folder"):
        load_served("/nonexistent/dir")


def _write_run_dir(model, path):
    """A run folder as `lcjax train --out` leaves it (config.json + checkpoints/)."""
    from lcjax.train import checkpoint
    from lcjax.train.loop import config_dict

    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model": config_dict(model.config), "train": {}}, f)
    _, params, rest = nnx.split(model, nnx.Param, ...)
    manager = checkpoint.checkpoint_manager(os.path.join(path, "checkpoints"))
    checkpoint.save_checkpoint(manager, 1, params=params, rest=rest,
                               opt_state={"count": np.zeros((), np.int32)}, data_state={})
    manager.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_serves_a_run_folder_and_stops_on_sigterm(model, tmp_path):
    run = str(tmp_path / "run")
    _write_run_dir(model, run)
    served = load_served(run)
    assert served.name == "run" and served.max_len == TINY.max_len
    assert isinstance(served.tokenizer, ByteTokenizer)
    for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)),
                    jax.tree.leaves(nnx.state(served.model, nnx.Param)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model": {}}))
    with pytest.raises(ValueError, match="no checkpoints"):
        load_served(bare)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lcjax.cli", "serve", "--checkpoint", run,
                             "--port", str(port), "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "lcjax serve did not start"
            try:
                if requests.get(url + "/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        prompt = PROMPT
        want, _, _ = direct_text(model, tok.encode(prompt, bos=True))
        cfg = EndpointConfig(url, model="run", retries=0, timeout=120)
        assert complete(cfg, prompt, MAX_TOKENS) == want
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    with socket.socket() as s:  # the port is free again
        s.bind(("127.0.0.1", port))


def test_hf_folder_tokenizer_and_chat_template(tmp_path):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    from lcjax.interop.hf import save_hf

    hf_dir = str(tmp_path / "hf")
    cfg = DecoderConfig(vocab_size=10, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1,
                        head_dim=8, mlp_hidden=32, max_len=32)
    save_hf(DecoderLM(cfg, rngs=nnx.Rngs(0)), hf_dir)
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>",
                                         "user", "assistant", "hi", "there", "\n"])}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Split(Regex(r"\n| "), "isolated")
    t.add_special_tokens(["<s>", "</s>", "<|im_start|>", "<|im_end|>"])
    t.save(os.path.join(hf_dir, "tokenizer.json"))
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with open(os.path.join(hf_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": template, "eos_token": "<|im_end|>", "bos_token": "<s>"}, f)
    with open(os.path.join(hf_dir, "config.json")) as f:
        hf = json.load(f)
    hf.update(eos_token_id=2, max_position_embeddings=24)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(hf, f)

    served = load_served(hf_dir, name="small")
    assert isinstance(served.tokenizer, HFTokenizer) and served.max_len == 24
    assert served.model.config.num_kv_heads == 1
    assert served.tokenizer.eos_ids == (2, 4) and served.tokenizer.pad_id == 2
    messages = [{"role": "user", "content": "hi there"}]
    text = served.tokenizer.render_chat(messages)
    assert text == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    ids = served.tokenizer.encode_chat(messages)
    assert list(ids) == [3, 5, 9, 7, 0, 8, 4, 9, 3, 6, 9]
    assert served.tokenizer.decode([7, 4, 8]) == "hi there"
    # served over HTTP: the chat reply is generate's on the template's ids, stopped by the
    # checkpoint's stop ids (an 11-token bucket: the direct call shares the program)
    want = generate(served.model, ids[None], MAX_TOKENS, stop_tokens=(2, 4), pad_id=2)
    gen = np.asarray(want.tokens)[0, len(ids):int(want.lengths[0])]
    with ThreadedServer(create_app(served, min_bucket=len(ids), batch_window_ms=0)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="small", messages=messages,
                                               max_tokens=MAX_TOKENS, temperature=0)
        with pytest.raises(openai.BadRequestError) as e:  # 11 + 14 > 24
            client.chat.completions.create(model="small", messages=messages, max_tokens=14)
    assert reply.choices[0].message.content  # the random model writes words (seed 0)
    assert reply.choices[0].message.content == served.tokenizer.decode(gen)
    assert reply.usage.prompt_tokens == len(ids) and reply.usage.completion_tokens == len(gen)
    assert reply.choices[0].finish_reason == ("stop" if gen[-1] in (2, 4) else "length")
    assert "24" in e.value.body["message"] and "11" in e.value.body["message"]


def test_batcher_stop_ids_end_a_row_and_report_stop(model):
    ids = tok.encode(PROMPT, bos=True)
    out = generate(model, ids[None], MAX_TOKENS, stop_tokens=(tok.EOS,), pad_id=tok.PAD)
    gen = [int(t) for t in np.asarray(out.tokens)[0, len(ids):int(out.lengths[0])]]
    stop = gen[-1]  # decoding ends at its first occurrence
    end = gen.index(stop) + 1
    batcher = Batcher(model, stop_ids=(stop,), pad_id=tok.PAD, window_ms=0, min_bucket=32)
    batcher.start()
    try:
        got = batcher.submit(ids, MAX_TOKENS).result(60)
        short = batcher.submit(ids, MAX_TOKENS - 1).result(60)  # same padded shape
    finally:
        batcher.stop()
    assert list(got.tokens) == gen[:end] and got.stopped
    assert list(short.tokens) == gen[:min(end, MAX_TOKENS - 1)]
    assert short.stopped == (end <= MAX_TOKENS - 1)
    with pytest.raises(RuntimeError, match="start"):
        batcher.submit(ids, 2)


def test_reply_keeps_its_own_max_tokens_under_the_padded_decode(model):
    # the batcher decodes next_power_of_two(3) = 4 steps; the reply must still be the
    # 3 tokens generate gives with max_tokens=3 (the model emits no EOS this early)
    ids = tok.encode(PROMPT, bos=True)
    out = generate(model, ids[None], 3, stop_tokens=(tok.EOS,), pad_id=tok.PAD)
    want = [int(t) for t in np.asarray(out.tokens)[0, len(ids):int(out.lengths[0])]]
    assert len(want) == 3 and tok.EOS not in want
    batcher = Batcher(model, stop_ids=(tok.EOS,), pad_id=tok.PAD, window_ms=0, min_bucket=32)
    batcher.start()
    try:
        got = batcher.submit(ids, 3).result(60)
    finally:
        batcher.stop()
    assert batcher.stats.shapes == [(1, 32, 4)]
    assert list(got.tokens) == want and not got.stopped


def test_generation_failure_is_a_500_and_the_server_goes_on(model, served, monkeypatch):
    url, client, _ = served

    def broken(*args, **kwargs):
        raise FloatingPointError("simulated device failure")

    monkeypatch.setattr("lcjax.nn.generate", broken)
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                  temperature=0)
    assert e.value.body["type"] == "server_error"
    assert "simulated device failure" in e.value.body["message"]
    monkeypatch.undo()
    ok = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                   temperature=0)
    assert ok.choices[0].text == direct_text(model, tok.encode(PROMPT, bos=True))[0]
