"""DecoderConfig(position="absolute"): sinusoidal embedding (closed form), the model equals
a NoPE model fed E[tokens] + PE(positions), KV-cache decoding equals the full pass,
hidden_states agree with the call, bad configurations raise."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding import cached_logits
from flax import nnx

from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.rope import sinusoidal_embedding

CFG = DecoderConfig(vocab_size=32, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=4, mlp_hidden=32, max_len=16, position="absolute")


def test_sinusoidal_embedding_closed_form():
    pos = np.array([[0, 3, 7], [11, 2, 5]])
    got = np.asarray(sinusoidal_embedding(jnp.asarray(pos), 8, base=100.0))
    want = np.zeros((2, 3, 8))
    for b in range(2):
        for t in range(3):
            for m in range(4):
                theta = 100.0 ** (-2 * m / 8)
                want[b, t, m] = math.sin(pos[b, t] * theta)
                want[b, t, m + 4] = math.cos(pos[b, t] * theta)
    np.testing.assert_allclose(got, want, atol=1e-5)
    with pytest.raises(ValueError, match="even"):
        sinusoidal_embedding(jnp.arange(3), 7)


def test_absolute_model_is_nope_on_shifted_embeddings():
    model = DecoderLM(CFG, rngs=nnx.Rngs(0))
    nope = DecoderLM(dataclasses.replace(CFG, position="none"), rngs=nnx.Rngs(0))
    assert all(b.attn.position == "none" for b in model.blocks)
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 32)
    positions = jnp.broadcast_to(jnp.arange(9) + 3, (2, 9))
    logits = model(tokens, positions=positions)
    # the same weights, positions added by hand to E[tokens]
    h0 = model.embed[...][tokens] + sinusoidal_embedding(positions, CFG.d_model)
    states = nope.hidden_states(embeddings=h0, positions=positions)
    by_hand = nope.logits(nope.final_norm(states[-1]))
    np.testing.assert_allclose(np.asarray(logits), np.asarray(by_hand), atol=1e-5)
    # the positions matter: shifted positions change the logits, NoPE's do not
    assert float(jnp.abs(model(tokens) - logits).max()) > 1e-3
    np.testing.assert_allclose(np.asarray(nope(tokens)),
                               np.asarray(nope(tokens, positions=positions)), atol=1e-6)
    # hidden_states from tokens: h_0 includes the position embedding, h_L gives the logits
    hs = model.hidden_states(tokens, positions=positions)
    np.testing.assert_allclose(np.asarray(hs[0]), np.asarray(h0), atol=1e-6)
    np.testing.assert_allclose(np.asarray(model.logits(model.final_norm(hs[-1]))),
                               np.asarray(logits), atol=1e-5)


def test_absolute_kv_cache_decoding_equals_full_pass():
    model = DecoderLM(CFG, rngs=nnx.Rngs(2))
    tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, 32)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)
    np.testing.assert_allclose(np.asarray(cached_logits(model, tokens, [5, 1, 1, 1, 1], 16)),
                               np.asarray(full), atol=2e-5, rtol=0)


def test_absolute_errors():
    with pytest.raises(ValueError, match="position"):
        DecoderConfig(position="learned")
    with pytest.raises(ValueError, match="even d_model"):
        dataclasses.replace(CFG, d_model=15, num_heads=3, num_kv_heads=3, head_dim=5)
