"""ASEntmax / SSMax length scaling (``lcjax.attention.entmax.length_scaling``).

- the key counts n_i (sort and binary search, no [T, S] matrix) equal the dense mask's;
- β = 0, δ = 1 gives exactly the unscaled entmax output (XLA path and the kernel);
- dβ, dγ, dα match central finite differences in float64 (XLA path) and, through the
  Pallas kernel in interpret mode (float32), the same float64 finite differences;
- a model with ASEntmax + NAPE and one with SSMax decode through the KV cache exactly as
  the full forward pass does, and the learned β, γ, s get finite, non-zero gradients;
- bad options raise ValueError naming them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding import cached_logits
from flax import nnx

from lcjax import attention
from lcjax.attention.core import build_mask
from lcjax.attention.entmax import length_scaling as ls
from lcjax.nn import DecoderConfig, DecoderLM

B, T, S, H, HKV, D = 2, 13, 13, 4, 2, 8
BLOCKS = {"block_q": 8, "block_kv": 8}


def _qkv(seed, dtype=jnp.float32, t=T, s=S):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(kq, (B, t, H, D), dtype),
            jax.random.normal(kk, (B, s, HKV, D), dtype),
            jax.random.normal(kv, (B, s, HKV, D), dtype))


def test_counts_equal_the_dense_mask_count():
    """visible_key_counts (closed form / stable sort + binary search) equals the row sums of
    the dense build_mask, for unsorted ids with padding, causal or not, with offsets."""
    rng = np.random.default_rng(0)
    for trial in range(6):
        t, s = int(rng.integers(1, 20)), int(rng.integers(1, 26))
        q_seg = rng.integers(-1, 4, size=(B, t))
        kv_seg = rng.integers(-1, 4, size=(B, s))
        if trial % 2:
            q_seg, kv_seg = np.sort(q_seg), np.sort(kv_seg)
        for causal in (False, True):
            off = int(rng.integers(0, 6))
            for segs in ((q_seg, kv_seg), (None, None)):
                got = ls.visible_key_counts(t, s, causal=causal, q_segment_ids=segs[0],
                                            kv_segment_ids=segs[1], q_offset=off)
                full = build_mask(t, s, causal=causal, q_segment_ids=segs[0],
                                  kv_segment_ids=segs[1], q_offset=off)
                want = (np.full((1, t), s) if full is None
                        else np.asarray(jnp.broadcast_to(full, full.shape[:2] + (t, s)))
                        .sum(-1)[:, 0])
                np.testing.assert_array_equal(np.asarray(got)[..., 0],
                                              np.broadcast_to(want, got.shape[:2]))
    # one causal document: log n_i = log(i + 2), the paper's log(pos + 2)
    log_n = ls.log_length(ls.visible_key_counts(5, 5, causal=True))
    np.testing.assert_allclose(np.asarray(log_n)[0, :, 0], np.log(np.arange(5) + 2.0), rtol=1e-6)


@pytest.mark.parametrize("implementation", ["xla", "pallas"])
def test_beta_zero_is_exactly_unscaled_entmax(implementation):
    q, k, v = _qkv(1)

    @jax.jit
    def run(q, k, v):
        asentmax = attention.get("asentmax")
        scaled = asentmax(q, k, v, causal=True, implementation=implementation, length_beta=0.0,
                          length_gamma=0.7, length_delta=1.0, **BLOCKS)
        plain = attention.get("entmax")(q, k, v, causal=True, implementation=implementation,
                                        **BLOCKS)
        other = asentmax(q, k, v, causal=True, implementation=implementation, length_beta=0.8,
                         **BLOCKS)
        return scaled, plain, other

    scaled, plain, other = run(q, k, v)
    np.testing.assert_array_equal(np.asarray(scaled), np.asarray(plain))
    # and β ≠ 0 changes it (the option is not ignored)
    assert float(jnp.abs(other - plain).max()) > 1e-3


def _loss_fn(implementation, q, k, v, cot):
    def loss(theta):
        beta, gamma, alpha = theta
        out = attention.get("asentmax")(q, k, v, causal=True, implementation=implementation,
                                        alpha=alpha, length_beta=beta, length_gamma=gamma,
                                        length_delta=0.9, **BLOCKS)
        return jnp.sum(out.astype(cot.dtype) * cot)
    return loss


def _directional_fd(loss, theta, direction, eps):
    plus = loss(jax.tree.map(lambda t, u: t + eps * u, theta, direction))
    minus = loss(jax.tree.map(lambda t, u: t - eps * u, theta, direction))
    return (plus - minus) / (2 * eps)


def test_gradients_beta_gamma_alpha_match_finite_differences():
    """dβ, dγ, dα [H] of sum(out · c): the XLA path in float64 against central differences
    (eps 1e-5) along random directions, and the Pallas kernel (interpret, float32) against
    the same float64 differences."""
    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        q, k, v = _qkv(2, jnp.float64)
        cot = jax.random.normal(jax.random.key(9), (B, T, H, D), jnp.float64)
        theta = (jnp.asarray(rng.uniform(0.2, 0.9, H)), jnp.asarray(rng.normal(0, 0.5, H)),
                 jnp.asarray([1.3, 1.5, 1.7, 1.9]))
        loss = jax.jit(_loss_fn("xla", q, k, v, cot))
        grads = jax.grad(loss)(theta)
        fd_dirs = []
        for _ in range(3):
            direction = tuple(jnp.asarray(rng.normal(size=H)) for _part in range(3))
            fd = float(_directional_fd(loss, theta, direction, 1e-5))
            got = sum(float(jnp.dot(g, u)) for g, u in zip(grads, direction))
            np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)
            fd_dirs.append((direction, fd))
        # each part alone is non-trivial
        assert all(float(jnp.abs(g).max()) > 1e-3 for g in grads)
        grads64 = [np.asarray(g) for g in grads]
    f32 = lambda x: jnp.asarray(np.asarray(x), jnp.float32)
    q32, k32, v32, cot32 = (f32(x) for x in (q, k, v, cot))
    theta32 = jax.tree.map(f32, theta)
    kernel_loss = jax.jit(_loss_fn("pallas", q32, k32, v32, cot32))
    kgrads = jax.grad(kernel_loss)(theta32)
    scale = max(float(np.abs(g).max()) for g in grads64)
    for name, g, want in zip(("beta", "gamma", "alpha"), kgrads, grads64):
        np.testing.assert_allclose(np.asarray(g), want, atol=2e-4 * scale, rtol=0,
                                   err_msg=f"kernel d{name}")
    for direction, fd in fd_dirs:
        got = sum(float(jnp.dot(g, f32(u))) for g, u in zip(kgrads, direction))
        np.testing.assert_allclose(got, fd, rtol=2e-4, atol=2e-4 * scale)


def test_length_heads_limit_the_scaling_and_options_are_validated():
    q, k, v = _qkv(4)
    heads = jnp.asarray([True, False, True, False])
    spec = attention.get("ssmax")
    got = spec(q, k, v, causal=True, length_s=0.7, length_heads=heads, **BLOCKS)
    plain = attention.get("blockwise")(q, k, v, causal=True, **BLOCKS)
    full = spec(q, k, v, causal=True, length_s=0.7, **BLOCKS)
    np.testing.assert_allclose(got[:, :, 1::2], plain[:, :, 1::2], atol=1e-6)
    np.testing.assert_allclose(got[:, :, 0::2], full[:, :, 0::2], atol=1e-6)
    assert float(jnp.abs(full - plain)[:, :, 1::2].max()) > 1e-3
    with pytest.raises(ValueError, match="length_beta"):
        attention.get("asentmax")(q, k, v, length_beta=jnp.ones(3))
    with pytest.raises(ValueError, match="length_heads"):
        spec(q, k, v, length_heads=jnp.ones(H))  # not boolean


def _decode_matches_full(config, steps=(6, 1, 1, 1)):
    model = DecoderLM(config, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(5), (B, sum(steps)), 0, config.vocab_size)

    @nnx.jit
    def full(m, toks):
        return m(toks)

    want = full(model, tokens)
    np.testing.assert_allclose(np.asarray(cached_logits(model, tokens, steps, 16)),
                               np.asarray(want), atol=2e-5, rtol=0)
    return model, tokens


def test_kv_cache_decoding_equals_full_pass_and_scaling_trains():
    """ASEntmax with input-dependent β, γ and NAPE positions: prefill + 3 decoding steps
    equal the full pass; β, γ projections get finite, non-zero gradients."""
    options = {**BLOCKS, "length_mode": "input"}
    config = DecoderConfig(vocab_size=32, d_model=32, num_layers=1, num_heads=H,
                           num_kv_heads=HKV, head_dim=D, mlp_hidden=32, max_len=16,
                           attention="asentmax", attention_options=options, position="nape")
    model, tokens = _decode_matches_full(config)
    params = model.blocks[0].attn.variant_params
    assert params.length_heads == (False, False, True, True)  # NAPE: only NoPE heads scaled
    assert params.beta_proj.shape == params.gamma_proj.shape == (32, H)

    def loss(p):
        m = nnx.merge(graphdef, p, rest)
        return jnp.mean(m(tokens) ** 2)

    graphdef, p, rest = nnx.split(model, nnx.Param, ...)
    grads = jax.jit(jax.grad(loss))(p)  # one compile, not one per primitive of the model
    leaves = jax.tree.leaves(nnx.state(grads["blocks"][0]["attn"]["variant_params"]))
    assert leaves and all(np.isfinite(np.asarray(g)).all() for g in leaves)
    assert all(float(jnp.abs(g).max()) > 0 for g in leaves)


def test_params_factories_build_per_head_parameters():
    """DecoderConfig(attention="asentmax" | "ssmax") builds β, γ [H] (and α with
    attention_learn=("alpha",)) / s [H]; options give the initial values."""
    base = dict(vocab_size=32, d_model=16, num_layers=1, num_heads=H, num_kv_heads=HKV,
                head_dim=D, mlp_hidden=16)
    m = DecoderLM(DecoderConfig(**base, attention="asentmax", attention_learn=("alpha",),
                                attention_options={"length_beta": 0.3, "alpha": 1.4}),
                  rngs=nnx.Rngs(0))
    p = m.blocks[0].attn.variant_params
    out = p()
    np.testing.assert_allclose(out["length_beta"], np.full(H, 0.3))
    assert out["length_gamma"].shape == (H,) and "length_heads" not in out
    np.testing.assert_allclose(out["alpha"], np.full(H, 1.4), rtol=1e-5)
    s = DecoderLM(DecoderConfig(**base, attention="ssmax", attention_options={"length_s": 0.5}),
                  rngs=nnx.Rngs(0)).blocks[0].attn.variant_params
    np.testing.assert_allclose(s()["length_s"], np.full(H, 0.5))
    with pytest.raises(ValueError, match="length_mode"):
        DecoderLM(DecoderConfig(**base, attention="asentmax",
                                attention_options={"length_mode": "bad"}), rngs=nnx.Rngs(0))
