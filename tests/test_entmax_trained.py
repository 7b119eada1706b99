"""`experiments.entmax.trained`: the q, k, v a DecoderLM's layers pass to attention (checked against
the model's projections and RoPE recomputed by hand), score rows (against a numpy loop) and
held-out windows (slices of the packed held-out stream)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.entmax import trained
from lcjax.data import VOCAB_SIZE, pack_stream, shakespeare_split
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.rope import apply_rope


def _model():
    cfg = DecoderConfig(vocab_size=VOCAB_SIZE, d_model=16, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, mlp_hidden=32, max_len=32)
    return DecoderLM(cfg, rngs=nnx.Rngs(0))


def test_capture_qkv_matches_the_first_layer_by_hand():
    model = _model()
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 256)
    captured = trained.capture_qkv(model, tokens)
    assert len(captured) == 2
    # layer 0 by hand: embedding -> RMSNorm -> projections -> RoPE at positions 0..T-1
    block = model.blocks[0]
    h = block.attn_norm(jnp.take(model.embed[...], tokens, axis=0))
    pos = jnp.arange(12)
    q = apply_rope(jnp.einsum("BTD,DNH->BTNH", h, block.attn.q_proj[...]), pos)
    k = apply_rope(jnp.einsum("BTD,DKH->BTKH", h, block.attn.k_proj[...]), pos)
    v = jnp.einsum("BTD,DKH->BTKH", h, block.attn.v_proj[...])
    cq, ck, cv, scale = captured[0]
    assert cq.shape == (2, 12, 4, 8) and ck.shape == (2, 12, 2, 8)
    np.testing.assert_allclose(cq, q, atol=1e-5)
    np.testing.assert_allclose(ck, k, atol=1e-5)
    np.testing.assert_allclose(cv, v, atol=1e-5)
    assert scale == 1 / math.sqrt(8)
    assert not np.allclose(captured[1][0], cq)  # the second layer's own q


def test_score_rows_against_a_loop():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 6, 4, 3)).astype(np.float32)
    k = rng.normal(size=(1, 6, 2, 3)).astype(np.float32)
    rows = trained.score_rows(jnp.asarray(q), jnp.asarray(k), 0.5, from_row=3)
    assert rows.shape == (4 * 3, 6)  # heads x (queries 3..5), keys
    expected = np.full((4, 3, 6), -np.inf, np.float32)
    for h in range(4):
        for i in range(3, 6):
            for j in range(i + 1):
                expected[h, i - 3, j] = 0.5 * q[0, i, h] @ k[0, j, h // 2]
    np.testing.assert_allclose(rows, expected.reshape(12, 6), rtol=1e-5)


def test_heldout_windows_are_slices_of_the_heldout_stream():
    windows = trained.heldout_windows(64, 3)
    _, heldout = shakespeare_split(0.1, 0)  # TrainConfig's defaults
    stream = pack_stream(heldout, 64)
    last = (len(stream) - 1) // 64 - 1
    assert windows.shape == (3, 64) and windows.dtype == np.int32
    np.testing.assert_array_equal(windows[0], stream[:64])
    np.testing.assert_array_equal(windows[-1], stream[last * 64:last * 64 + 64])
