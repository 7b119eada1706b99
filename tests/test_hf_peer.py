"""lcjax.interop.hf against Hugging Face ``transformers`` itself (the peer is the reference).

Tiny random LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM (torch CPU, float32)
are saved with ``save_pretrained`` (one file, and sharded with an index); ``load_hf`` must
give their logits to 1e-4, and ``save_hf`` of the loaded model must load back in
transformers with the same logits. These are the tests of the ``hf`` extra
(``make test-hf``): without transformers they skip, saying so.
"""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip(
    "transformers", reason="the peer tests need the `hf-peer` extra: pip install -e '.[hf-peer]' "
    "(make test-hf)")
torch = pytest.importorskip("torch", reason="the peer tests need torch (the `hf-peer` extra)")

import jax.numpy as jnp  # noqa: E402

from lcjax.interop import load_hf, save_hf  # noqa: E402

COMMON = dict(vocab_size=67, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-6)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def _config(kind: str):
    major = int(transformers.__version__.split(".")[0])
    if kind == "llama":
        rope = dict(rope_theta=500000.0, rope_scaling=LLAMA3)
        if major >= 5:
            rope = dict(rope_parameters={**LLAMA3, "rope_theta": 500000.0})
        return transformers.LlamaConfig(**COMMON, attention_bias=True,
                                        tie_word_embeddings=False, **rope)
    if kind == "qwen2":
        return transformers.Qwen2Config(**COMMON, tie_word_embeddings=True)
    return transformers.Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=False)


def _randomised(model):
    """``model`` in float32 eval mode with weights of order 1/sqrt(fan_in), norms around 1
    and nonzero biases (torch's own seed decides them)."""
    model = model.float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 if "embed" not in name
                        else torch.randn_like(p))
    return model


def _peer(kind: str):
    classes = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
               "qwen3": transformers.Qwen3ForCausalLM}
    torch.manual_seed(0)
    return _randomised(classes[kind](_config(kind)))


def _torch_logits(model, tokens):
    with torch.no_grad():
        return model(torch.as_tensor(tokens)).logits.float().numpy()


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("shard", [None, "20KB"])
def test_load_hf_equals_transformers(kind, shard, tmp_path):
    peer = _peer(kind)
    kwargs = {} if shard is None else {"max_shard_size": shard}
    peer.save_pretrained(tmp_path / "peer", **kwargs)
    if shard is not None:
        assert (tmp_path / "peer" / "model.safetensors.index.json").is_file()
    tokens = np.random.default_rng(0).integers(0, COMMON["vocab_size"], (2, 11))
    want = _torch_logits(peer, tokens)
    assert want.std() > 0.3
    model, config = load_hf(tmp_path / "peer", dtype=jnp.float32)
    got = np.asarray(model(jnp.asarray(tokens)))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    # save_hf output loads in transformers with the same logits
    save_hf(model, tmp_path / "ours", like=tmp_path / "peer", max_shard_bytes=30_000)
    back = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "ours", torch_dtype=torch.float32).eval()
    assert type(back) is type(peer)
    np.testing.assert_allclose(_torch_logits(back, tokens), want, atol=1e-4, rtol=1e-4)


def _window_peer(kind: str):
    """A tiny random sliding-window model: Mistral (window 4, every layer) or Qwen2
    (window 3 in layers >= max_window_layers = 1)."""
    common = {**COMMON, "num_hidden_layers": 3}
    if kind == "mistral":
        config = transformers.MistralConfig(**common, sliding_window=4, tie_word_embeddings=False)
        cls = transformers.MistralForCausalLM
    else:
        config = transformers.Qwen2Config(**common, use_sliding_window=True, sliding_window=3,
                                          max_window_layers=1)
        cls = transformers.Qwen2ForCausalLM
    torch.manual_seed(1)
    return _randomised(cls(config))


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_sliding_window_checkpoints_equal_transformers(kind, tmp_path):
    """Sequences longer than the window: load_hf's logits equal transformers' (and differ
    from the same weights without the window); save_hf writes a config transformers loads
    with the same windows; greedy decoding through the KV cache equals the full forward."""
    from lcjax.nn import generate

    peer = _window_peer(kind)
    peer.save_pretrained(tmp_path / "peer")
    tokens = np.random.default_rng(1).integers(0, COMMON["vocab_size"], (2, 13))
    want = _torch_logits(peer, tokens)
    model, config = load_hf(tmp_path / "peer", dtype=jnp.float32)
    assert config.sliding_window == (4 if kind == "mistral" else (None, 3, 3))
    got = np.asarray(model(jnp.asarray(tokens)))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    full, _ = load_hf(tmp_path / "peer", dtype=jnp.float32, sliding_window=None)
    assert np.abs(np.asarray(full(jnp.asarray(tokens))) - want).max() > 1e-2
    save_hf(model, tmp_path / "ours", like=tmp_path / "peer")
    back = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "ours", torch_dtype=torch.float32).eval()
    assert type(back) is type(peer)
    np.testing.assert_allclose(_torch_logits(back, tokens), want, atol=1e-4, rtol=1e-4)
    prompt, n = jnp.asarray(tokens[:1, :5]), 8
    out = np.asarray(generate(model, prompt, n).tokens)
    seq = np.array(prompt)  # a writable copy (torch.as_tensor)
    for _ in range(n):
        seq = np.concatenate([seq, _torch_logits(peer, seq)[:, -1].argmax(-1)[:, None]], 1)
    np.testing.assert_array_equal(out, seq)
