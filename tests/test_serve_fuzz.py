"""A fuzz of ``lcjax serve``'s OpenAPI schema (schemathesis: valid and invalid bodies for
every route) against a real uvicorn server on 127.0.0.1: no reply is a 5xx.

The model call (``lcjax.nn.generate``) is replaced by a stub that keeps its contract (each
row: the prompt, then ``max_new_tokens`` random ids, byte, special and EOS ids among them)
so the fuzz spends its bounded time (<= 40 examples per route, ~1 min) on the HTTP layer,
validation, batching and decoding rather than on compiling one program per padded shape;
the real model path is tested in test_serve.py and test_serve_limits.py."""

import collections
import types

import numpy as np
import pytest
import schemathesis
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from lcjax.agents.scripted import ThreadedServer
from lcjax.data import tokenizer as tok
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.serve import ByteTokenizer, ServedModel, create_app
from lcjax.serve.app import ServeLimits

EXAMPLES = 25  # per route and mode (valid, invalid)
TINY = DecoderConfig(vocab_size=tok.VOCAB_SIZE, d_model=16, num_layers=1, num_heads=2,
                     num_kv_heads=2, head_dim=8, mlp_hidden=32, max_len=64)


def stub_generate(model, rows, n, *, prompt_lengths, pad_id, rng=None, return_logprobs=False,
                  top_logprobs=0, **kw):
    """``generate``'s output layout: row b is its prompt, then ``n`` random ids (with
    random negative log-probs and ``top_logprobs`` random ids, when asked)."""
    rows, lengths = np.asarray(rows), np.asarray(prompt_lengths)
    seed = 0 if rng is None else int(np.asarray(__import__("jax").random.key_data(rng))[-1])
    gen = np.random.default_rng(seed)
    ids = gen.integers(0, tok.VOCAB_SIZE, (len(rows), n))
    out = np.full((len(rows), rows.shape[1] + n), pad_id, np.int32)
    for b, length in enumerate(lengths):
        out[b, :length] = rows[b, :length]
        out[b, length:length + n] = ids[b]
    top = ((gen.integers(0, tok.VOCAB_SIZE, (len(rows), n, top_logprobs)),
            -np.sort(gen.exponential(size=(len(rows), n, top_logprobs)), -1))
           if top_logprobs else None)
    return types.SimpleNamespace(tokens=out, lengths=lengths + n, top_logprobs=top,
                                 logprobs=-gen.exponential(size=(len(rows), n))
                                 if return_logprobs else None)


@pytest.fixture(scope="module")
def served():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("lcjax.nn.generate", stub_generate)
        model = DecoderLM(TINY, rngs=nnx.Rngs(0))
        limits = ServeLimits(max_rows=16, max_body_bytes=256 << 10, max_queued_rows=64,
                             request_timeout_s=30.0)
        app = create_app(ServedModel(model, ByteTokenizer(), "tiny", TINY.max_len),
                         batch_window_ms=1, max_batch=4, limits=limits)
        with ThreadedServer(app) as server:
            yield server.url, app


def test_no_5xx_over_the_openapi_schema(served):
    url, app = served
    schema = schemathesis.openapi.from_dict(app.openapi())
    seen = collections.Counter()
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions",
                                              "/v1/models", "/v1/models/{model_id}"}
    for op in operations:
        for mode in schemathesis.GenerationMode:
            @settings(max_examples=EXAMPLES, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(op.as_strategy(generation_mode=mode))
            def run(case):
                response = case.call(base_url=url, timeout=30)
                seen[response.status_code // 100] += 1
                assert response.status_code < 500, (case.method, case.path, case.body,
                                                    response.text)

            try:
                run()
            except Unsatisfiable:  # a GET without inputs, or any string, has no invalid one
                assert mode.value == "negative" and op.method.upper() == "GET"
    assert seen[2] > 0 and seen[4] > 0, seen  # both valid and refused requests were made
