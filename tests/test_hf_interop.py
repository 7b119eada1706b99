"""lcjax.interop.hf: Llama / Qwen2 / Qwen3 safetensors checkpoints <-> DecoderLM, no torch.

The reference is an independent numpy forward pass of the HF architectures written here
from config.json and the tensor dict (HF names and [out, in] layout, rotate_half RoPE with
the Llama-3 / linear frequency scaling re-derived here, GQA by repetition); it never calls
lcjax.nn. Checkpoints are tiny random ones this test writes with safetensors.numpy, sharded
with an index and not, bf16 and f32, in both config layouts. The peer test against
transformers itself is tests/test_hf_peer.py (the `hf` extra).
"""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from lcjax.interop import load_hf, save_hf
from lcjax.interop.hf import read_qk_weights

BF16 = np.dtype(ml_dtypes.bfloat16)
_forward = nnx.jit(lambda model, tokens: model(tokens))  # one compile per architecture


def forward(model, tokens) -> np.ndarray:
    return np.asarray(_forward(model, jnp.asarray(tokens)))


def params_equal(a, b) -> None:
    """Every parameter of models a and b has the same dtype and bits."""
    la = jax.tree_util.tree_flatten_with_path(nnx.state(a, nnx.Param))[0]
    lb = jax.tree_util.tree_flatten_with_path(nnx.state(b, nnx.Param))[0]
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (path, x), (_, y) in zip(la, lb):
        assert x.dtype == y.dtype, path
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))

# (name, config.json, storage dtype, number of shards)
CASES = {
    # Llama, legacy layout (rope_theta + rope_scaling llama3), q/k/v/o biases, untied, f32
    "llama": ({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
               "vocab_size": 61, "hidden_size": 32, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48,
               "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
               "rope_theta": 500000.0, "attention_bias": True, "tie_word_embeddings": False,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 16},
               "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2},
              np.float32, 1),
    # Qwen2, new layout (rope_parameters, dtype), q/k/v biases, tied, bf16, 2 shards
    "qwen2": ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
               "vocab_size": 53, "hidden_size": 32, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 40,
               "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
               "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
               "tie_word_embeddings": True, "use_sliding_window": False, "dtype": "bfloat16"},
              BF16, 2),
    # Qwen3, new layout with linear scaling, q/k norms, head_dim != hidden / heads, 3 shards
    "qwen3": ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
               "vocab_size": 47, "hidden_size": 32, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "intermediate_size": 44, "hidden_act": "silu", "rms_norm_eps": 1e-6,
               "max_position_embeddings": 256, "attention_bias": False,
               "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                   "rope_theta": 1000000.0},
               "tie_word_embeddings": False, "dtype": "float32"},
              np.float32, 3),
}


def _dims(hf):
    heads = hf["num_attention_heads"]
    return heads, hf["num_key_value_heads"], hf.get("head_dim") or hf["hidden_size"] // heads


def random_tensors(hf: dict, seed: int) -> dict[str, np.ndarray]:
    """HF-named float32 tensors of a random checkpoint of config ``hf``."""
    rng = np.random.default_rng(seed)
    v, d, f = hf["vocab_size"], hf["hidden_size"], hf["intermediate_size"]
    h, hkv, hd = _dims(hf)
    kind = hf["model_type"]
    dense = lambda o, i: rng.normal(0, 1 / math.sqrt(i), (o, i))
    norm = lambda n: 1 + 0.2 * rng.normal(size=n)
    t = {"model.embed_tokens.weight": rng.normal(size=(v, d)), "model.norm.weight": norm(d)}
    if not hf["tie_word_embeddings"]:
        t["lm_head.weight"] = dense(v, d)
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(d)
        t[p + "post_attention_layernorm.weight"] = norm(d)
        for n, out in (("q", h * hd), ("k", hkv * hd), ("v", hkv * hd)):
            t[p + f"self_attn.{n}_proj.weight"] = dense(out, d)
            if kind == "qwen2" or hf.get("attention_bias"):
                t[p + f"self_attn.{n}_proj.bias"] = 0.3 * rng.normal(size=out)
        t[p + "self_attn.o_proj.weight"] = dense(d, h * hd)
        if kind != "qwen2" and hf.get("attention_bias"):
            t[p + "self_attn.o_proj.bias"] = 0.3 * rng.normal(size=d)
        if kind == "qwen3":
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "mlp.gate_proj.weight"] = dense(f, d)
        t[p + "mlp.up_proj.weight"] = dense(f, d)
        t[p + "mlp.down_proj.weight"] = dense(d, f)
    return {k: x.astype(np.float32) for k, x in t.items()}


def write_checkpoint(path, hf: dict, tensors: dict, dtype, shards: int) -> dict:
    """Write config.json and the tensors (cast to ``dtype``) in ``shards`` files; returns
    the stored tensors."""
    os.makedirs(path, exist_ok=True)
    stored = {k: x.astype(dtype) for k, x in tensors.items()}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f)
    names = list(stored)
    if shards == 1:
        save_file(stored, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return stored
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        save_file({k: stored[k] for k in part}, os.path.join(path, file),
                  metadata={"format": "pt"})
        weight_map.update({k: file for k in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    return stored


# ------------------------------------------------------------- independent numpy reference


def np_frequencies(hf: dict, head_dim: int) -> np.ndarray:
    """HF's inv_freq, from either config layout, with linear / llama3 scaling."""
    params = hf.get("rope_parameters")
    if params is not None:
        theta, scaling = params["rope_theta"], params
    else:
        theta, scaling = hf["rope_theta"], hf.get("rope_scaling") or {"rope_type": "default"}
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        return inv / scaling["factor"]
    if kind == "llama3":
        out = []
        old = scaling["original_max_position_embeddings"]
        for f in inv:
            wavelength = 2 * math.pi / f
            if wavelength < old / scaling["high_freq_factor"]:
                out.append(f)
            elif wavelength > old / scaling["low_freq_factor"]:
                out.append(f / scaling["factor"])
            else:
                smooth = (old / wavelength - scaling["low_freq_factor"]) / (
                    scaling["high_freq_factor"] - scaling["low_freq_factor"])
                out.append((1 - smooth) * f / scaling["factor"] + smooth * f)
        return np.array(out)
    return inv


def np_rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def np_logits(hf: dict, t: dict, tokens: np.ndarray) -> np.ndarray:
    """float64 logits [B, T, V] of the HF architecture ``hf`` with tensors ``t``."""
    t = {k: np.asarray(x, np.float64) for k, x in t.items()}
    h, hkv, hd = _dims(hf)
    eps, kind = hf["rms_norm_eps"], hf["model_type"]
    out = []
    for row in tokens:
        n = len(row)
        ang = np.arange(n)[:, None] * np_frequencies(hf, hd)[None]
        cos = np.cos(np.concatenate([ang, ang], -1))[:, None]
        sin = np.sin(np.concatenate([ang, ang], -1))[:, None]
        rot = lambda z, cos=cos, sin=sin: (
            z * cos + np.concatenate([-z[..., hd // 2:], z[..., :hd // 2]], -1) * sin)
        x = t["model.embed_tokens.weight"][row]
        for i in range(hf["num_hidden_layers"]):
            p = f"model.layers.{i}.self_attn."
            a = np_rms(x, t[f"model.layers.{i}.input_layernorm.weight"], eps)
            proj = {}
            for name, heads in (("q", h), ("k", hkv), ("v", hkv)):
                y = a @ t[p + f"{name}_proj.weight"].T
                if p + f"{name}_proj.bias" in t:
                    y = y + t[p + f"{name}_proj.bias"]
                proj[name] = y.reshape(n, heads, hd)
            q, k, v = proj["q"], proj["k"], proj["v"]
            if kind == "qwen3":
                q = np_rms(q, t[p + "q_norm.weight"], eps)
                k = np_rms(k, t[p + "k_norm.weight"], eps)
            q, k = rot(q), rot(k)
            k, v = np.repeat(k, h // hkv, axis=1), np.repeat(v, h // hkv, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
            s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
            w = np.exp(s - s.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", w, v).reshape(n, h * hd) @ t[p + "o_proj.weight"].T
            if p + "o_proj.bias" in t:
                o = o + t[p + "o_proj.bias"]
            x = x + o
            m = f"model.layers.{i}.mlp."
            b = np_rms(x, t[f"model.layers.{i}.post_attention_layernorm.weight"], eps)
            g = b @ t[m + "gate_proj.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * (b @ t[m + "up_proj.weight"].T)) @ t[
                m + "down_proj.weight"].T
        x = np_rms(x, t["model.norm.weight"], eps)
        head = t["model.embed_tokens.weight"] if hf["tie_word_embeddings"] else t["lm_head.weight"]
        out.append(x @ head.T)
    return np.stack(out)


# ------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module", params=sorted(CASES))
def checkpoint(request, tmp_path_factory):
    name = request.param
    hf, dtype, shards = CASES[name]
    path = str(tmp_path_factory.mktemp(name))
    stored = write_checkpoint(path, hf, random_tensors(hf, seed=len(name)), dtype, shards)
    tokens = np.random.default_rng(7).integers(0, hf["vocab_size"], (2, 9))
    return name, path, hf, stored, tokens


def test_numpy_reference_is_not_trivial(checkpoint):
    """The reference depends on the tokens' order (causal attention) and its logits vary."""
    _, _, hf, stored, tokens = checkpoint
    ref = np_logits(hf, stored, tokens)
    assert ref.std() > 0.3
    swapped = np_logits(hf, stored, tokens[:, ::-1].copy())
    assert np.abs(ref[:, -1] - swapped[:, -1]).max() > 1e-2


def test_load_hf_logits_equal_numpy_reference(checkpoint):
    name, path, hf, stored, tokens = checkpoint
    model, config = load_hf(path, dtype=jnp.float32)
    assert config.param_dtype == jnp.float32 and model.embed[...].dtype == jnp.float32
    assert config.tie_embeddings == hf["tie_word_embeddings"]
    assert config.qk_norm == (name == "qwen3")
    ref = np_logits(hf, stored, tokens)
    np.testing.assert_allclose(forward(model, tokens), ref, atol=1e-4, rtol=1e-4)
    if CASES[name][1] != BF16:
        return
    # a bf16 checkpoint loads as bf16 (dtype=None): the stored bits, computed in bf16
    model, config = load_hf(path)
    assert config.param_dtype == jnp.bfloat16 and config.dtype == jnp.bfloat16
    q = model.blocks[0].attn.q_proj[...]
    assert q.dtype == jnp.bfloat16
    want = stored["model.layers.0.self_attn.q_proj.weight"].T.reshape(q.shape)  # [d, H, D]
    np.testing.assert_array_equal(np.asarray(q).view(np.uint16), want.view(np.uint16))
    got = forward(model, tokens)
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()  # bf16 compute


def test_save_hf_round_trip(checkpoint, tmp_path):
    name, path, hf, stored, tokens = checkpoint
    dtype = None if CASES[name][1] == BF16 else jnp.float32
    model, _ = load_hf(path, dtype=dtype)
    files = save_hf(model, tmp_path / "out", like=path)
    assert files == [str(tmp_path / "out" / "model.safetensors")]
    with open(tmp_path / "out" / "config.json") as f:
        saved = json.load(f)
    assert saved["architectures"] == hf["architectures"]
    assert saved["max_position_embeddings"] == hf["max_position_embeddings"]
    with safe_open(files[0], framework="numpy") as f:
        assert sorted(f.keys()) == sorted(stored)
        for key in stored:  # the same bits, the same HF layout and dtype
            x = f.get_tensor(key)
            assert x.dtype == stored[key].dtype and x.shape == stored[key].shape, key
            np.testing.assert_array_equal(x, stored[key], err_msg=key)
    again, _ = load_hf(tmp_path / "out")
    params_equal(again, model)


def test_save_hf_sharded(tmp_path):
    hf, _, _ = CASES["qwen3"]
    src = tmp_path / "src"
    stored = write_checkpoint(str(src), hf, random_tensors(hf, seed=5), np.float32, 1)
    model, _ = load_hf(src)
    files = save_hf(model, tmp_path / "out", max_shard_bytes=20_000)
    assert len(files) > 2 and all(os.path.isfile(f) for f in files)
    with open(tmp_path / "out" / "model.safetensors.index.json") as f:
        index = json.load(f)
    assert sorted(index["weight_map"]) == sorted(stored)
    assert index["metadata"]["total_size"] == sum(x.nbytes for x in stored.values())
    again, _ = load_hf(tmp_path / "out")
    params_equal(again, model)
    _, wq, wk = read_qk_weights(tmp_path / "out")
    np.testing.assert_array_equal(wq[1], np.asarray(model.blocks[1].attn.q_proj[...]))
    np.testing.assert_array_equal(wk[0], np.asarray(model.blocks[0].attn.k_proj[...]))


def test_load_hf_errors(tmp_path):
    hf, _, _ = CASES["llama"]
    tensors = random_tensors(hf, seed=1)
    bad = {**hf, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}
    write_checkpoint(str(tmp_path / "a"), bad, tensors, np.float32, 1)
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        load_hf(tmp_path / "a")
    yarn = {**hf, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    write_checkpoint(str(tmp_path / "b"), yarn, tensors, np.float32, 1)
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        load_hf(tmp_path / "b")
    short = {k: x for k, x in tensors.items() if "layers.1.mlp.up_proj" not in k}
    write_checkpoint(str(tmp_path / "c"), hf, short, np.float32, 1)
    with pytest.raises(ValueError, match="lacks 1 tensors"):
        load_hf(tmp_path / "c")
    with pytest.raises(ValueError, match="no config.json"):
        load_hf(tmp_path)
