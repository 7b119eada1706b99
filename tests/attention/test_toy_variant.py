"""A new variant needs only its spec: a toy "softmax with a temperature" is registered
here (with its own dense reference, two implementations, a config, an aux schema and a
parameter factory) and is then picked up, with no other edit, by

- the conformance suite (every check of ``conformance.ConformanceSuite``),
- the model config (``DecoderConfig(attention=NAME)``, including a learnable
  temperature through the spec's ``params`` factory),
- ``lcjax bench attention`` (its Python entry point, tiny shapes).

The spec is registered by a module fixture and removed with ``unregister`` afterwards.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conformance import (
    FORWARD_CASES,
    ConformanceSuite,
    assert_close,
    cases,
    make_inputs,
    reference_result,
    variant_fn,
)
from flax import nnx

from lcjax import attention
from lcjax.attention import AttentionSpec, Features, Implementation
from lcjax.attention.core import blockwise_attention, build_mask, default_scale

NAME = "toy_temperature_softmax"


def toy_reference(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
                  kv_segment_ids=None, temperature=1.0):
    """softmax(scale · q·k / temperature) v, dense, float32, written independently of
    ``lcjax.attention.core``'s attention (kv heads repeated, explicit empty-row guard).

    q: [B, T, H, D]; k, v: [B, S, Hkv, D]; temperature: a number or [H].
    """
    b, t, h, d = q.shape
    group = h // k.shape[2]
    kx = jnp.repeat(k.astype(jnp.float32), group, axis=2)
    vx = jnp.repeat(v.astype(jnp.float32), group, axis=2)
    temp = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (h,))
    s = jnp.einsum("bthd,bshd->bhts", q.astype(jnp.float32), kx)
    s = s * default_scale(d, scale) / temp[None, :, None, None]
    visible = build_mask(t, k.shape[1], causal=causal, mask=mask, q_segment_ids=q_segment_ids,
                         kv_segment_ids=kv_segment_ids)
    if visible is None:
        visible = jnp.ones((1, 1, t, k.shape[1]), bool)
    s = jnp.where(visible, s, -jnp.inf)
    row_max = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.where(visible, jnp.exp(s - jnp.where(jnp.isfinite(row_max), row_max, 0.0)), 0.0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    p = e / jnp.where(total > 0, total, 1.0)
    return jnp.einsum("bhts,bshd->bthd", p, vx).astype(q.dtype)


def _tempered(q, temperature):
    """q / temperature per head: softmax(scale q·k / τ) is attention of q / τ."""
    temp = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (q.shape[2],))
    return (q.astype(jnp.float32) / temp[:, None]).astype(q.dtype)


def _aux(q, temperature):
    return {"temperature": jnp.broadcast_to(jnp.asarray(temperature, jnp.float32),
                                            (q.shape[2],))}


def toy_dense(q, k, v, *, causal, mask, scale, q_segment_ids, kv_segment_ids, return_aux,
              temperature=1.0):
    out = attention.dot_product_attention(
        _tempered(q, temperature), k, v, causal=causal, mask=mask, scale=scale,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
    return (out, _aux(q, temperature)) if return_aux else out


@dataclasses.dataclass(frozen=True)
class ToyBlocks:
    block_q: int = 64
    block_kv: int = 64

    def __post_init__(self):
        if min(self.block_q, self.block_kv) <= 0:
            raise ValueError(f"ToyBlocks: block sizes must be positive, got {self}")


def toy_blocked(q, k, v, *, causal, mask, scale, q_segment_ids, kv_segment_ids, return_aux,
                temperature=1.0, block_q=64, block_kv=64):
    out = blockwise_attention(
        _tempered(q, temperature), k, v, causal=causal, mask=mask, scale=scale,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, block_q=block_q,
        block_kv=block_kv)
    return (out, _aux(q, temperature)) if return_aux else out


class LearnableTemperature(nnx.Module):
    """A per-head temperature exp(raw) [H], raw initialised at log(options temperature)."""

    def __init__(self, num_heads, temperature=1.0, *, param_dtype=jnp.float32):
        self.log_temperature = nnx.Param(jnp.full((num_heads,), np.log(temperature),
                                                  param_dtype))

    def __call__(self, **_):
        return {"temperature": jnp.exp(self.log_temperature[...])}


def learnable_temperature(config, *, rngs):
    config.unknown_learn(("temperature",), NAME)
    if "temperature" not in config.learn:
        return None
    return LearnableTemperature(config.num_heads, config.options.get("temperature", 1.0),
                                param_dtype=config.param_dtype)


TOY = AttentionSpec(
    NAME, reference=toy_reference,
    implementations=(Implementation("blocked", toy_blocked, config=ToyBlocks),
                     Implementation("dense", toy_dense)),
    features=Features(), aux={"temperature": "[H] float32"}, params=learnable_temperature,
    test_options={"temperature": 0.7, "block_q": 8, "block_kv": 8},
    description="softmax attention with a temperature (a test toy)")


@pytest.fixture(scope="module", autouse=True)
def registered():
    attention.register(TOY)
    yield TOY
    attention.unregister(NAME)


class TestToyConformance(ConformanceSuite):
    """The whole conformance suite on the toy (its "dense" implementation: "blocked" is
    blockwise attention of q / τ, and would repeat the blockwise checks' cost)."""

    VARIANTS = [(NAME, "dense")]


def test_the_blocked_toy_gets_its_config_and_the_dense_one_does_not():
    case = FORWARD_CASES["ragged_cross"]
    inputs = make_inputs(case)
    want = reference_result(TOY, case)
    for impl in TOY.implementations:  # test_options' block sizes reach "blocked" only
        assert_close(variant_fn(TOY, impl, case)(**inputs), want,
                     TOY.tolerance["float32"], impl.name)
    with pytest.raises(ValueError, match="ToyBlocks"):
        TOY(inputs["q"], inputs["k"], inputs["v"], block_q=0)
    with pytest.raises(NotImplementedError, match=r"does not take option\(s\) \['block_q'\]"):
        TOY(inputs["q"], inputs["k"], inputs["v"], block_q=8, implementation="dense")


def test_the_registry_and_the_suite_see_the_toy():
    assert attention.get(NAME) is TOY and NAME in attention.available()
    assert {(NAME, "blocked"), (NAME, "dense")} <= set(cases())


def test_toy_reference_is_softmax_at_temperature_one_and_sharper_below():
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(3), 3)
    q, k, v = (jax.random.normal(x, (1, 9, 2, 8)) for x in (kq, kk, kv))
    np.testing.assert_allclose(toy_reference(q, k, v, causal=True),
                               attention.dot_product_attention(q, k, v, causal=True), atol=1e-6)
    np.testing.assert_allclose(toy_reference(q, k, v, temperature=0.5),
                               attention.dot_product_attention(q, k, v, scale=2 / np.sqrt(8)),
                               atol=1e-6)


def _model(attention_name, **kw):
    from lcjax.nn import DecoderConfig, DecoderLM

    config = DecoderConfig(vocab_size=32, d_model=32, num_layers=1, num_heads=4,
                           num_kv_heads=2, head_dim=8, mlp_hidden=64, attention=attention_name,
                           **kw)
    return DecoderLM(config, rngs=nnx.Rngs(0))


def test_model_config_picks_up_the_toy():
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 12), 0, 32)
    softmax_logits = _model("softmax")(tokens)
    logits = _model(NAME, attention_options={"temperature": 1.0})(tokens)
    logits = logits[0] if isinstance(logits, tuple) else logits
    softmax_logits = softmax_logits[0] if isinstance(softmax_logits, tuple) else softmax_logits
    np.testing.assert_allclose(logits, softmax_logits, atol=1e-5)
    hot = _model(NAME, attention_options={"temperature": 3.0})(tokens)
    hot = hot[0] if isinstance(hot, tuple) else hot
    assert float(jnp.abs(hot - softmax_logits).max()) > 1e-3


def test_model_learns_the_toy_temperature_through_its_params_factory():
    model = _model(NAME, attention_options={"temperature": 2.0},
                   attention_learn=("temperature",))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 0, 32)
    params = nnx.state(model, nnx.Param)
    raw = [x for path, x in jax.tree_util.tree_leaves_with_path(params)
           if "log_temperature" in jax.tree_util.keystr(path)]
    assert len(raw) == 1 and np.allclose(raw[0], np.log(2.0))

    def loss(model):
        out = model(tokens)
        out = out[0] if isinstance(out, tuple) else out
        return jnp.mean(jax.nn.log_softmax(out)[..., 0])

    grads = nnx.grad(loss)(model)
    g = [x for path, x in jax.tree_util.tree_leaves_with_path(nnx.state(grads))
         if "log_temperature" in jax.tree_util.keystr(path)]
    assert len(g) == 1 and np.isfinite(g[0]).all() and np.abs(g[0]).max() > 0


def test_bench_attention_picks_up_the_toy():
    from lcjax.bench import AttentionBenchConfig, run_attention_benchmark

    config = AttentionBenchConfig(variants=(NAME, "softmax"), seq_lens=(16,), batch=1, heads=2,
                                  head_dim=8, repeats=1, warmup=0, matmul_n=64,
                                  ref_max_len=16, out_dir=None,
                                  options={NAME: {"temperature": 1.0}})
    result = run_attention_benchmark(config, log=lambda _: None)
    rows = [r for r in result["records"] if r["variant"] == NAME]
    assert rows and all(r["status"] == "ok" for r in rows), rows
    # temperature 1 is softmax: the error against the softmax reference is rounding only
    assert all(r["max_abs_err"] < 1e-5 for r in rows), rows
