"""LoRA (lcjax.nn.lora): identity at B = 0, the x-path equation on an untied lm_head, the
flattening of 3-D kernels against the Hugging Face exporter, merge/unmerge, several
adapters, dropout, training through lcjax.train.train with only the adapters trained,
and save/load in orbax and PEFT layouts."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.interop import load_hf, save_hf
from lcjax.interop.peft import PEFT_CONFIG, PEFT_WEIGHTS, load_peft, save_peft
from lcjax.nn import DecoderConfig, DecoderLM, generate
from lcjax.nn.lora import (
    LoRAConfig,
    LoRAModel,
    LoRAParam,
    adapter_filter,
    apply_lora,
    load_adapter,
    lora_param_count,
    save_adapter,
)
from lcjax.train import TrainConfig, train
from lcjax.train.checkpoint import checkpoint_manager, read_meta

CFG = DecoderConfig(vocab_size=260, d_model=16, num_layers=2, num_heads=2, num_kv_heads=1,
                    head_dim=8, mlp_hidden=32, tie_embeddings=False)
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "w_*", "lm_head")


def tokens(seed=0, shape=(2, 8)):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 256, shape), jnp.int32)


def randomise(model: LoRAModel, name=None, seed=3, scale=0.3):
    """Random (non-zero) B (and A) for adapter ``name``: B = 0 would hide every bug."""
    rng = np.random.default_rng(seed)
    for layer in model.adapters[name or model.active].layers.values():
        for var in (layer.a, layer.b):
            var.set_value(jnp.asarray(rng.normal(0, scale, var.shape), jnp.float32))


@pytest.fixture(scope="module")
def base():
    return DecoderLM(CFG, rngs=nnx.Rngs(0))


def fresh(base):
    """A copy of ``base`` with its own arrays and variables (merge mutates in place)."""
    graphdef, state = nnx.split(base)
    return nnx.merge(graphdef, jax.tree.map(jnp.array, state))


def test_zero_b_equals_base_exactly(base):
    x = tokens()
    model = apply_lora(fresh(base), LoRAConfig(rank=4, alpha=8, target_modules=ALL),
                       rngs=nnx.Rngs(1))
    assert len(model.adapters["default"].layers) == 2 * 7 + 1
    assert np.array_equal(model(x), base(x))
    # A is random (not zero), so the identity comes from B = 0 alone
    for layer in model.adapters["default"].layers.values():
        assert float(jnp.abs(layer.a[...]).min()) > 0
        assert not np.any(np.asarray(layer.b[...]))


def test_lm_head_follows_the_x_path_equation(base):
    """logits = h W + (α/r) (h Aᵀ) Bᵀ with h the final normed hidden state (numpy)."""
    x = tokens(1)
    model = apply_lora(fresh(base), LoRAConfig(rank=3, alpha=5.0, target_modules=("lm_head",)),
                       rngs=nnx.Rngs(2))
    randomise(model)
    layer = model.adapters["default"].layers["lm_head"]
    h = np.asarray(base.final_norm(base.hidden_states(x)[-1]), np.float64)
    w = np.asarray(base.lm_head[...], np.float64)
    a, b = np.asarray(layer.a[...], np.float64), np.asarray(layer.b[...], np.float64)
    expected = h @ w + (5.0 / 3) * (h @ a.T) @ b.T
    np.testing.assert_allclose(np.asarray(model(x)), expected, rtol=1e-5, atol=1e-5)
    assert np.abs(expected - h @ w).max() > 1e-2  # the adapter changes the logits


def test_merge_equals_unmerged_and_matches_hf_layout(base, tmp_path):
    """Merged = unmerged to 1e-6; the merged HF tensors are W_hf + (α/r) B A for every
    projection (checks the flattening of q/k/v [D, N, H] and o [N, H, D]); unmerge restores."""
    x = tokens(2)
    model = apply_lora(fresh(base), LoRAConfig(rank=2, alpha=3.0, target_modules=ALL),
                       rngs=nnx.Rngs(3))
    randomise(model, scale=0.2)
    unmerged = np.asarray(model(x))
    save_hf(model.base, tmp_path / "before")
    model.merge()
    assert model.merged == ("default",)
    np.testing.assert_allclose(np.asarray(model(x)), unmerged, rtol=1e-6, atol=1e-6)
    assert np.abs(unmerged - np.asarray(base(x))).max() > 1e-2
    save_hf(model.base, tmp_path / "after")
    from safetensors.numpy import load_file

    before, after = (load_file(tmp_path / d / "model.safetensors") for d in ("before", "after"))
    hf = {"blocks.1.attn.q_proj": "model.layers.1.self_attn.q_proj",
          "blocks.0.attn.o_proj": "model.layers.0.self_attn.o_proj",
          "blocks.1.attn.k_proj": "model.layers.1.self_attn.k_proj",
          "blocks.0.mlp.w_down": "model.layers.0.mlp.down_proj", "lm_head": "lm_head"}
    for ours, name in hf.items():
        layer = model.adapters["default"].layers[ours]
        ba = 1.5 * np.asarray(layer.b[...]) @ np.asarray(layer.a[...])
        np.testing.assert_allclose(after[name + ".weight"] - before[name + ".weight"], ba,
                                   rtol=1e-5, atol=1e-6)
    model.unmerge()
    assert model.merged == ()
    np.testing.assert_allclose(np.asarray(model.base.blocks[0].attn.o_proj[...]),
                               np.asarray(base.blocks[0].attn.o_proj[...]), atol=1e-6)
    np.testing.assert_allclose(np.asarray(model(x)), unmerged, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="not merged"):
        model.unmerge()


def test_several_adapters_switch(base):
    x = tokens(3)
    model = apply_lora(fresh(base), LoRAConfig(rank=2, target_modules=("q_proj",)),
                       rngs=nnx.Rngs(4), name="one")
    model.add_adapter("two", LoRAConfig(rank=4, alpha=2.0, target_modules=("w_up",)),
                      rngs=nnx.Rngs(5))
    assert model.active == "two"
    randomise(model, "one", seed=1)
    randomise(model, "two", seed=2)
    out_two = np.asarray(model(x))
    model.set_adapter("one")
    out_one = np.asarray(model(x))
    model.set_adapter(None)
    np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(base(x)))
    assert np.abs(out_one - out_two).max() > 1e-2
    # adapter "one" alone on its own wrapper (same weights) gives the same logits
    alone = LoRAModel(fresh(base))
    alone.add_adapter("one", LoRAConfig(rank=2, target_modules=("q_proj",)), rngs=nnx.Rngs(9))
    nnx.update(alone.adapters["one"], nnx.state(model.adapters["one"], LoRAParam))
    np.testing.assert_array_equal(np.asarray(alone(x)), out_one)
    # the wrapper forwards the base's methods with the adapter applied
    model.set_adapter("two")
    h = model.hidden_states(x)
    np.testing.assert_allclose(np.asarray(model.logits(model.final_norm(h[-1]))), out_two,
                               rtol=1e-5, atol=1e-5)
    # one adapter's parameters alone (what train(wrt=...) trains), though both have a/b
    _, one, rest = nnx.split(model, adapter_filter("one"), ...)
    assert set(nnx.to_pure_dict(one)["adapters"]) == {"one"}
    assert len(jax.tree.leaves(one)) == 2 * 2  # A, B of q_proj in 2 layers
    assert len(jax.tree.leaves(nnx.state(rest, LoRAParam))) == 2 * 2  # "two": w_up x 2 layers
    with pytest.raises(ValueError, match="no adapter 'three'"):
        model.set_adapter("three")
    with pytest.raises(ValueError, match="exists"):
        model.add_adapter("one", LoRAConfig(), rngs=nnx.Rngs(0))


def test_generate_with_an_adapter(base):
    """generate (one jax.jit over nnx.split state, KV cache) decodes with the adapter: each
    greedy token is the argmax of the adapted model's full forward pass over the sequence
    so far (teacher-forced on the generated sequence)."""
    x = tokens(7, (2, 5))
    model = apply_lora(fresh(base), LoRAConfig(rank=2, target_modules=("q_proj", "w_up")),
                       rngs=nnx.Rngs(11))
    randomise(model, scale=0.5)
    out = generate(model, x, 3).tokens
    logits = model(jnp.asarray(out, jnp.int32))
    np.testing.assert_array_equal(np.asarray(out[:, 5:]),
                                  np.asarray(jnp.argmax(logits[:, 4:7], -1)))
    assert not np.array_equal(np.asarray(jnp.argmax(base(jnp.asarray(out, jnp.int32))[:, 4:7],
                                                    -1)), np.asarray(out[:, 5:]))


def test_dropout_masks_input_features_in_training_only(base):
    model = apply_lora(fresh(base), LoRAConfig(rank=2, dropout=0.5, target_modules=("w_down",)),
                       rngs=nnx.Rngs(6))
    randomise(model)
    adapter = model.adapters["default"]
    layer = adapter.layers["blocks.0.mlp.w_down"]
    full = np.asarray(layer.delta(adapter.config.scale))  # [F, D]
    dropped = np.asarray(adapter.deltas()[("blocks", 0, "mlp", "w_down")])
    kept = np.abs(dropped).max(axis=1) > 0  # input features (rows of the [in, out] delta)
    assert 0 < kept.sum() < kept.size
    np.testing.assert_allclose(dropped[kept], 2.0 * full[kept], rtol=1e-6)
    model.eval()
    np.testing.assert_array_equal(np.asarray(adapter.deltas()[("blocks", 0, "mlp", "w_down")]),
                                  full)
    x = tokens(4)
    no_drop = apply_lora(fresh(base), LoRAConfig(rank=2, target_modules=("w_down",)),
                         rngs=nnx.Rngs(6))
    nnx.update(no_drop.adapters["default"], nnx.state(adapter, LoRAParam))
    np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(no_drop(x)))
    # merging folds the dropout-free delta and leaves the mode as it was
    model.train()
    model.merge()
    assert adapter.dropout.deterministic is False
    merged_w = np.asarray(model.base.blocks[0].mlp.w_down[...])
    np.testing.assert_allclose(merged_w - np.asarray(base.blocks[0].mlp.w_down[...]), full,
                               rtol=1e-5, atol=1e-6)


def test_training_changes_only_the_adapters(base, tmp_path):
    """lcjax.train.train(wrt=LoRAParam): base parameters bit-identical, every B moved off
    zero, and the checkpointed params / optimizer state hold the adapters alone."""
    model = apply_lora(fresh(base), LoRAConfig(rank=2, alpha=4.0, dropout=0.1,
                                               target_modules=("q_proj", "w_up")),
                       rngs=nnx.Rngs(7))
    base_before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model.base)))
    a_before = {k: np.asarray(v.a[...]) for k, v in model.adapters["default"].layers.items()}
    rng = np.random.default_rng(0)
    data = [{"inputs": rng.integers(0, 256, (2, 8)), "targets": rng.integers(0, 256, (2, 8))}
            for _ in range(2)]
    cfg = TrainConfig(steps=2, warmup_steps=1, lr=1e-2, progress=False, eval_batches=0,
                      out_dir=str(tmp_path / "run"))
    result = train(CFG, cfg, dataset=data, model_fn=lambda *_: model, wrt=LoRAParam)
    trained = result.model
    base_after = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(trained.base)))
    jax.tree.map(np.testing.assert_array_equal, base_after, base_before)
    for k, layer in trained.adapters["default"].layers.items():
        assert float(jnp.abs(layer.b[...]).max()) > 0, k
        assert np.abs(np.asarray(layer.a[...]) - a_before[k]).max() > 0, k
    n_adapter = lora_param_count(trained)
    assert n_adapter == 2 * (2 * (16 + 16) + 2 * (16 + 32))
    manager = checkpoint_manager(tmp_path / "run" / "checkpoints")
    shapes = read_meta(manager)["params"]
    manager.close()
    assert all("adapters" in path for path in shapes) and len(shapes) == 8
    # the optimizer state's arrays, from orbax's tree metadata: Adam's mu and nu of the
    # 8 adapter matrices, nothing of the base
    with open(tmp_path / "run" / "checkpoints" / "2" / "opt_state" / "_METADATA") as f:
        tree = json.load(f)["tree_metadata"]
    arrays = {k: v["value_metadata"]["write_shape"] for k, v in tree.items()
              if v["value_metadata"].get("write_shape")}
    assert len(arrays) == 16 and all("adapters" in k for k in arrays), sorted(arrays)
    assert sum(int(np.prod(s)) for s in arrays.values()) == 2 * n_adapter
    # a second adapter trained alone (adapter_filter): the first one stays as it was (with
    # wrt=LoRAParam its zero gradients would still move it, by AdamW's weight decay)
    trained.add_adapter("other", LoRAConfig(rank=2, target_modules=("w_down",)),
                        rngs=nnx.Rngs(12))
    first = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(trained.adapters["default"],
                                                                    LoRAParam)))
    again = train(CFG, TrainConfig(steps=1, warmup_steps=0, lr=1e-2, progress=False,
                                   eval_batches=0), dataset=data,
                  model_fn=lambda *_: trained, wrt=adapter_filter("other")).model
    jax.tree.map(np.testing.assert_array_equal,
                 jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(again.adapters["default"],
                                                                    LoRAParam))),
                 first)
    assert all(float(jnp.abs(lay.b[...]).max()) > 0
               for lay in again.adapters["other"].layers.values())


def test_orbax_round_trip(base, tmp_path):
    x = tokens(5)
    model = apply_lora(fresh(base), LoRAConfig(rank=3, alpha=6.0, target_modules=("o_proj",
                                                                                  "w_gate")),
                       rngs=nnx.Rngs(8), name="task")
    randomise(model)
    save_adapter(model, tmp_path / "adapter")
    other = LoRAModel(fresh(base))
    assert load_adapter(other, tmp_path / "adapter") == "task"
    np.testing.assert_array_equal(np.asarray(other(x)), np.asarray(model(x)))
    assert other.adapters["task"].config == model.adapters["task"].config
    small = LoRAModel(DecoderLM(DecoderConfig(vocab_size=260, d_model=8, num_layers=2,
                                              num_heads=2, num_kv_heads=1, head_dim=4,
                                              mlp_hidden=16), rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="shape"):
        load_adapter(small, tmp_path / "adapter")
    assert "task" not in small.adapters and small.active is None


def test_peft_round_trip_and_layout(base, tmp_path):
    x = tokens(6)
    model = apply_lora(fresh(base), LoRAConfig(rank=2, alpha=4.0, dropout=0.05,
                                               target_modules=("q_proj", "v_proj", "w_down")),
                       rngs=nnx.Rngs(10))
    randomise(model)
    save_peft(model, tmp_path / "peft", base_model_name_or_path="tiny")
    from safetensors.numpy import load_file

    tensors = load_file(tmp_path / "peft" / PEFT_WEIGHTS)
    key = "base_model.model.model.layers.1.self_attn.v_proj.lora_{}.weight"
    assert tensors[key.format("A")].shape == (2, 16)      # [r, in]
    assert tensors[key.format("B")].shape == (8, 2)       # [out = kv_heads * head_dim, r]
    assert tensors["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"].shape == (2,
                                                                                            32)
    assert len(tensors) == 2 * 3 * 2
    with open(tmp_path / "peft" / PEFT_CONFIG) as f:
        config = json.load(f)
    assert (config["peft_type"], config["r"], config["lora_alpha"], config["lora_dropout"]) == (
        "LORA", 2, 4.0, 0.05)
    assert config["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    other = LoRAModel(fresh(base))
    load_peft(other, tmp_path / "peft", name="peft")
    other.eval(), model.eval()
    np.testing.assert_array_equal(np.asarray(other(x)), np.asarray(model(x)))
    # the same adapter on the base imported from its Hugging Face checkpoint
    save_hf(base, tmp_path / "hf")
    imported = LoRAModel(load_hf(tmp_path / "hf")[0])
    load_peft(imported, tmp_path / "peft")
    imported.eval()
    np.testing.assert_allclose(np.asarray(imported(x)), np.asarray(model(x)), rtol=1e-6,
                               atol=1e-6)
    config["use_rslora"] = True
    with open(tmp_path / "peft" / PEFT_CONFIG, "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match="use_rslora"):
        load_peft(LoRAModel(fresh(base)), tmp_path / "peft")


def test_bad_options_raise(base):
    with pytest.raises(ValueError, match="match no parameter"):
        apply_lora(fresh(base), LoRAConfig(target_modules=("c_attn",)), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="not a linear kernel"):
        apply_lora(fresh(base), LoRAConfig(target_modules=("embed",)), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="not a linear kernel"):
        apply_lora(fresh(base), LoRAConfig(target_modules=("re:.*norm.*",)), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="rank"):
        LoRAConfig(rank=0)
    with pytest.raises(ValueError, match="dropout"):
        LoRAConfig(dropout=1.0)
    model = apply_lora(fresh(base), LoRAConfig(target_modules=("re:blocks\\.1\\.attn\\.q_proj",)),
                       rngs=nnx.Rngs(0))
    assert list(model.adapters["default"].layers) == ["blocks.1.attn.q_proj"]
    model.merge()
    with pytest.raises(ValueError, match="already merged"):
        model.merge()
    assert not os.path.exists("adapter_model.safetensors")
