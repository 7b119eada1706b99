"""ParaTool's soft selection (lcjax.tools.paratool): a one-hot gate is that tool's module
alone, the logits are linear in the gate weights where the modules sit on the output
head, top-k renormalisation, the balance term's closed forms, the masked query embedding;
the three training stages change only their variables (stage 1 against K separate
runs), and inference decodes what a slow greedy loop over the gated model decodes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.data import tokenizer as tok
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.nn.lora import LoRAConfig, LoRAModel, LoRAParam, adapter_filter
from lcjax.tools import make_examples, make_tools
from lcjax.tools.paratool import (
    ParaToolModel,
    ToolGate,
    call_model,
    gate_filter,
    generate_calls,
    joint_filter,
    load_balancing_loss,
    mixed_call,
    query_embedding,
    tool_index,
    top_k_weights,
    train_gate,
    train_joint,
    train_tool_modules,
)
from lcjax.tools.world import make_tool_batch
from lcjax.train import TrainConfig, train
from lcjax.train.losses import answer_weighted_nll

CFG = DecoderConfig(vocab_size=260, d_model=16, num_layers=1, num_heads=2, num_kv_heads=2,
                    head_dim=8, mlp_hidden=32, tie_embeddings=False)
NAMES = ("book_hotel", "search_flight", "cancel_meeting")


def tools_model(targets, seed=0):
    lora = LoRAModel(DecoderLM(CFG, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(seed)
    for i, name in enumerate(NAMES):
        lora.add_adapter(name, LoRAConfig(rank=2, alpha=4.0, target_modules=targets[i]),
                         rngs=nnx.Rngs(i + 1))
        for layer in lora.adapters[name].layers.values():
            layer.b.set_value(jnp.asarray(rng.normal(0, 0.5, layer.b.shape), jnp.float32))
    return lora


def alone(lora, name, x):
    lora.set_adapter(name)
    return np.asarray(lora(x))


@pytest.fixture(scope="module")
def x():
    return jnp.asarray(np.random.default_rng(1).integers(0, 64, (3, 6)), jnp.int32)


def test_one_hot_gate_is_that_tools_module_alone(x):
    # tools on different kernels (one shared), so a leak of another tool would show
    lora = tools_model([("q_proj", "w_up"), ("q_proj",), ("o_proj", "lm_head")])
    # one compile; jitted vs eager: float rounding only (1e-5)
    mix = jax.jit(lambda g: mixed_call(lora, NAMES, g, x))
    gates = jnp.stack([jnp.eye(3)[2], jnp.eye(3)[0], jnp.zeros(3)])  # tool 2, tool 0, none
    mixed = np.asarray(mix(gates))
    for b, k in enumerate((2, 0)):
        np.testing.assert_allclose(mixed[b], alone(lora, NAMES[k], x)[b], rtol=1e-5, atol=1e-5)
    lora.set_adapter(None)
    np.testing.assert_allclose(mixed[2], np.asarray(lora(x))[2], rtol=1e-5, atol=1e-5)
    assert np.abs(alone(lora, NAMES[0], x) - alone(lora, NAMES[1], x)).max() > 1e-3


def test_aggregation_is_linear_in_the_gate_weights(x):
    """Modules on lm_head: logits(g) = base + Σ_k g_k (logits_k − base), for any g (not
    only convex), and logits(a g1 + b g2) − base = a (logits(g1) − base) + b (...)."""
    lora = tools_model([("lm_head",)] * 3, seed=2)
    lora.set_adapter(None)
    base = np.asarray(lora(x), np.float64)
    singles = [alone(lora, n, x).astype(np.float64) - base for n in NAMES]
    rng = np.random.default_rng(3)
    g1, g2 = rng.normal(size=(2, 3, 3))
    a, b = 0.3, -1.7
    out = {}
    mix = jax.jit(lambda g: mixed_call(lora, NAMES, g, x))
    for key, g in (("g1", g1), ("g2", g2), ("mix", a * g1 + b * g2)):
        out[key] = np.asarray(mix(jnp.asarray(g, jnp.float32)), np.float64) - base
        expected = sum(g[:, k, None, None] * singles[k] for k in range(3))
        np.testing.assert_allclose(out[key], expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["mix"], a * out["g1"] + b * out["g2"], rtol=1e-4, atol=1e-4)
    # one mixture for the whole batch ([K] gates) = the same gates on every row
    shared = np.asarray(mixed_call(lora, NAMES, jnp.asarray(g1[1], jnp.float32), x), np.float64)
    expected = sum(g1[1, k] * singles[k] for k in range(3))
    np.testing.assert_allclose(shared - base, expected, rtol=1e-4, atol=1e-4)
    assert np.abs(out["mix"]).max() > 1e-2


def test_gate_top_k_and_balance():
    logits = jnp.asarray(np.random.default_rng(4).normal(size=(5, 4)), jnp.float32)
    full = np.asarray(top_k_weights(logits, None))
    np.testing.assert_allclose(full, np.asarray(jax.nn.softmax(logits, -1)), rtol=1e-6)
    two = np.asarray(top_k_weights(logits, 2))
    assert ((two > 0).sum(1) == 2).all()
    np.testing.assert_allclose(two.sum(1), 1.0, rtol=1e-6)
    top = np.argsort(-np.asarray(logits), 1)[:, :2]
    for r in range(5):
        i, j = top[r]
        np.testing.assert_allclose(two[r, i] / two[r, j], full[r, i] / full[r, j], rtol=1e-5)
    # balance: K·Σ f_k P_k, by hand
    np.testing.assert_allclose(float(load_balancing_loss(jnp.full((6, 3), 1 / 3))), 1.0,
                               rtol=1e-6)
    np.testing.assert_allclose(float(load_balancing_loss(jnp.eye(3)[jnp.zeros(4, int)])), 3.0)
    w = jnp.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]])
    # f = (1/2, 1/2, 0), P = (0.4, 0.4, 0.2): 3 * (0.2 + 0.2) = 1.2
    np.testing.assert_allclose(float(load_balancing_loss(w)), 1.2, rtol=1e-6)
    gate = ToolGate(16, 3, rngs=nnx.Rngs(0), hidden=8, top_k=2)
    g = np.asarray(gate(jnp.asarray(np.random.default_rng(5).normal(size=(4, 16)),
                                    jnp.float32)))
    assert g.shape == (4, 3) and ((g > 0).sum(1) == 2).all()
    np.testing.assert_allclose(g.sum(1), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="top_k"):
        ToolGate(16, 3, rngs=nnx.Rngs(0), top_k=0)


def test_query_embedding_masks_and_errors(x):
    base = DecoderLM(CFG, rngs=nnx.Rngs(0))
    mask = jnp.asarray(np.arange(6)[None, :] < np.array([[2], [6], [4]]))
    emb = np.asarray(query_embedding(base, x, mask))
    h = np.asarray(base.final_norm(base.hidden_states(x)[-1]))
    for b, n in enumerate((2, 6, 4)):
        np.testing.assert_allclose(emb[b], h[b, :n].mean(0), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="mask"):
        query_embedding(base, x, mask[:, :3])
    lora = tools_model([("lm_head",)] * 3)
    with pytest.raises(ValueError, match="gates must be"):
        mixed_call(lora, NAMES, jnp.ones((2, 3)), x)
    with pytest.raises(ValueError, match="no adapters"):
        mixed_call(lora, ("nope",), jnp.ones(1), x)


def test_stage_two_trains_the_gate_alone_through_train():
    """ParaToolModel + paratool_loss through lcjax.train.train(wrt=gate_filter): the gate
    moves, the tool adapters and the base stay bit-identical; the stage filters select
    the gate (stage 2) and the gate plus every adapter (stage 3)."""
    tools = make_tools(3, seed=0)
    names = [t.name for t in tools]
    lora = LoRAModel(DecoderLM(CFG, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(6)
    for i, name in enumerate(names):
        lora.add_adapter(name, LoRAConfig(rank=2, target_modules=("lm_head",)),
                         rngs=nnx.Rngs(i))
        layer = lora.adapters[name].layers["lm_head"]
        layer.b.set_value(jnp.asarray(rng.normal(0, 0.5, layer.b.shape), jnp.float32))
    model = ParaToolModel(lora, names, rngs=nnx.Rngs(9), top_k=2)
    gate_leaves = len(jax.tree.leaves(nnx.state(model.gate, nnx.Param)))
    _, stage2, _ = nnx.split(model, gate_filter, ...)
    _, stage3, _ = nnx.split(model, joint_filter, ...)
    assert len(jax.tree.leaves(stage2)) == gate_leaves == 2  # kernel, bias
    assert len(jax.tree.leaves(stage3)) == gate_leaves + 2 * len(names)
    batch = make_tool_batch(make_examples(tools, 4, seed=0))
    frozen = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model.lora, nnx.Param)))
    gate = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model.gate)))
    cfg = TrainConfig(steps=2, warmup_steps=1, lr=5e-2, progress=False, eval_batches=0)
    result = train_gate(model, cfg, [batch, batch], balance_weight=0.1)
    trained = result.model
    jax.tree.map(np.testing.assert_array_equal,
                 jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(trained.lora, nnx.Param))),
                 frozen)
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()),
                         nnx.to_pure_dict(nnx.state(trained.gate)), gate)
    assert min(jax.tree.leaves(moved)) > 0
    assert all(1.0 - 1e-6 <= r["balance"] <= 3.0 + 1e-6 for r in result.history)
    assert all(np.isfinite(r["loss"]) for r in result.history)
    assert len(jax.tree.leaves(nnx.state(trained, LoRAParam))) == 2 * len(names)


def world_model(targets=("lm_head", "q_proj"), seed=0):
    """A ParaToolModel on 3 world tools with random (nonzero) A and zero B, as stage 1
    starts."""
    tools = make_tools(3, seed=0)
    names = [t.name for t in tools]
    lora = LoRAModel(DecoderLM(CFG, rngs=nnx.Rngs(seed)))
    for i, name in enumerate(names):
        lora.add_adapter(name, LoRAConfig(rank=2, alpha=4.0, target_modules=targets),
                         rngs=nnx.Rngs(10 + i))
    return tools, names, lora


def params_of(module, filt=nnx.Param):
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(module, filt)))


STAGE_CFG = TrainConfig(steps=2, warmup_steps=1, lr=1e-2, weight_decay=0.0, grad_clip=1e9,
                        eps=1e-12, progress=False, eval_batches=0)


def test_stage_one_routes_rows_and_equals_separate_runs():
    """Stage 1 on rows of tools 0 and 1: base, gate and tool 2's module bit-identical;
    tool k's module equals what a separate run (that adapter active, wrt=adapter_filter(k))
    on tool k's rows alone gives (Adam without clipping or decay is invariant to the
    loss normaliser, so only rounding differs)."""
    tools, names, lora = world_model()
    ex = [e for e in make_examples(tools, 9, seed=3) if e.tool != names[2]]
    batch = make_tool_batch(ex)
    batch["tool_index"] = tool_index(ex, names)
    model = ParaToolModel(lora, names, rngs=nnx.Rngs(9))
    base0, gate0 = params_of(model.lora.base), params_of(model.gate)
    adapters0 = params_of(model.lora.adapters, LoRAParam)
    trained = train_tool_modules(model, STAGE_CFG, [batch, batch]).model
    jax.tree.map(np.testing.assert_array_equal, params_of(trained.lora.base), base0)
    jax.tree.map(np.testing.assert_array_equal, params_of(trained.gate), gate0)
    after = params_of(trained.lora.adapters, LoRAParam)
    jax.tree.map(np.testing.assert_array_equal, after[names[2]], adapters0[names[2]])
    for k in (0, 1):
        rows = [e for e in ex if e.tool == names[k]]
        _, _, ref = world_model()
        ref.set_adapter(names[k])
        alone_batch = make_tool_batch(rows)
        out = train(CFG, STAGE_CFG, dataset=[alone_batch] * 2, model_fn=lambda *_, m=ref: m,
                    loss_fn=lambda m, b, r: answer_weighted_nll(m, b, r, other_weight=0.0),
                    wrt=adapter_filter(names[k])).model
        expected = params_of(out.adapters, LoRAParam)[names[k]]
        moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), after[names[k]],
                             adapters0[names[k]])
        assert min(jax.tree.leaves(moved)) > 1e-4  # A (step 2) and B (both steps) moved
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-6),
                     after[names[k]], expected)
    with pytest.raises(ValueError, match="tool_index"):
        train_tool_modules(trained, STAGE_CFG, [make_tool_batch(ex)] * 2)


def test_stage_three_trains_gate_and_modules_not_base():
    tools, names, lora = world_model()
    for name in names:  # nonzero B so the gate's gradient is not zero
        for layer in lora.adapters[name].layers.values():
            layer.b.set_value(jnp.asarray(np.random.default_rng(1).normal(0, 0.3,
                                                                          layer.b.shape),
                                          jnp.float32))
    ex = make_examples(tools, 6, seed=4)
    batch = make_tool_batch(ex)
    batch["tool_index"] = tool_index(ex, names)
    model = ParaToolModel(lora, names, rngs=nnx.Rngs(9))
    t = batch["inputs"].shape[1]
    query = jnp.arange(t)[None, :] <= batch["answer_start"][:, None]
    g = np.asarray(model.gate_weights(jnp.asarray(batch["inputs"]), query))
    sel = -np.mean(np.log(g[np.arange(len(ex)), batch["tool_index"]]))
    base0, gate0 = params_of(model.lora.base), params_of(model.gate)
    adapters0 = params_of(model.lora.adapters, LoRAParam)
    result = train_joint(model, STAGE_CFG, [batch, batch], selection_weight=0.5)
    np.testing.assert_allclose(result.history[0]["selection_nll"], sel, rtol=1e-5)
    trained = result.model
    jax.tree.map(np.testing.assert_array_equal, params_of(trained.lora.base), base0)
    for before, after in ((gate0, params_of(trained.gate)),
                          (adapters0, params_of(trained.lora.adapters, LoRAParam))):
        moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), after, before)
        assert min(jax.tree.leaves(moved)) > 0


def test_inference_decodes_like_a_slow_greedy_loop():
    """generate_calls: the gate from the prompt tokens, then greedy decoding with
    call_model = a full forward pass of mixed_call per step (argmax, EOS stops, bytes kept);
    a one-hot call_model is that tool's adapter alone."""
    tools, names, lora = world_model(targets=("q_proj", "w_up", "lm_head"))
    rng = np.random.default_rng(8)
    for name in names:
        for layer in lora.adapters[name].layers.values():
            layer.b.set_value(jnp.asarray(rng.normal(0, 0.5, layer.b.shape), jnp.float32))
    model = ParaToolModel(lora, names, rngs=nnx.Rngs(5), hidden=8)
    prompts = ["Query: book a hotel\nCall: ", "Query: x\nCall: "]
    texts, gates = generate_calls(model, prompts, 5)
    # the slow reference: a full forward pass per step over a fixed-length row (causal, so
    # the padding after position n - 1 does not change its logits; one compile)
    step = jax.jit(lambda g, row: mixed_call(model.lora, names, g, row[None])[0])
    for p, text, g in zip(prompts, texts, gates):
        ids = list(tok.encode(p.encode(), bos=True))
        np.testing.assert_allclose(
            g, np.asarray(model.gate_weights(jnp.asarray(ids)[None]))[0], rtol=1e-5,
            atol=1e-7)  # batched over padded prompts: rounding only
        out = []
        for _ in range(5):
            row = np.full(48, tok.PAD, np.int32)
            row[:len(ids)] = ids
            nxt = int(np.argmax(np.asarray(step(jnp.asarray(g), jnp.asarray(row)))[len(ids) - 1]))
            if nxt == tok.EOS:
                break
            out.append(nxt)
            ids.append(nxt)
        assert text == tok.decode(np.asarray([t for t in out if t < 256], np.int32))
    x = jnp.asarray(tok.encode(prompts[0].encode(), bos=True))[None]
    np.testing.assert_allclose(np.asarray(call_model(model, jnp.eye(3)[1])(x)),
                               alone(model.lora, names[1], x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="gates must be"):
        call_model(model, jnp.ones(2))
