"""DecoderConfig(context_parallel=...): the LM's attention runs the strategy over the mesh
of ``jax.set_mesh``, and its logits and gradients equal the one-device model's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.parallel import make_mesh, token_sharding


def _loss(model, tokens):
    logits = model(tokens)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0] * jnp.arange(tokens.shape[1]))


@pytest.mark.parametrize("strategy", ["ulysses", "upipe", "usp"])
def test_decoder_context_parallel_equals_one_device(strategy):
    cfg = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=8, num_kv_heads=4,
               head_dim=8, mlp_hidden=64)
    ref = DecoderLM(DecoderConfig(**cfg), rngs=nnx.Rngs(0))
    cp = DecoderLM(DecoderConfig(**cfg, context_parallel=strategy), rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 32), 0, 64)
    want, want_g = nnx.jit(nnx.value_and_grad(_loss))(ref, tokens)
    # usp: Ulysses over "context" (U = 2), ring over "ring" (R = 2), causal zigzag
    mesh = make_mesh(data=2, ring=2, context=2) if strategy == "usp" else make_mesh(
        data=2, context=4)
    with jax.set_mesh(mesh):
        placed = jax.device_put(tokens, token_sharding(mesh))
        got, got_g = nnx.jit(nnx.value_and_grad(_loss))(cp, placed)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(nnx.state(got_g)), jax.tree.leaves(nnx.state(want_g))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(jnp.abs(b).max()))


def test_decoder_context_parallel_config_errors():
    with pytest.raises(ValueError, match="context_parallel"):
        DecoderConfig(context_parallel="tree")
    model = DecoderLM(DecoderConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=4,
                                    num_kv_heads=4, head_dim=8, mlp_hidden=64,
                                    context_parallel="ulysses"), rngs=nnx.Rngs(0))
    tokens = jnp.zeros((1, 16), jnp.int32)
    with pytest.raises(ValueError, match="no mesh"):
        model(tokens)
    with jax.set_mesh(make_mesh(data=1, context=8)):
        with pytest.raises(ValueError, match=r"H=4 is not divisible by the context size C=8"):
            model(tokens)
        with pytest.raises(ValueError, match="does not support segment_ids"):
            model(tokens, segment_ids=jnp.zeros((1, 16), jnp.int32))
