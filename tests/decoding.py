"""Shared by the tests that check KV-cache decoding against the full pass."""

import jax.numpy as jnp
from flax import nnx


@nnx.jit
def _step(model, tokens, cache):
    return model(tokens, cache=cache)


def cached_logits(model, tokens, chunks, cache_len: int):
    """Logits [B, T, V] of ``tokens`` [B, T] fed through ``model.init_cache(B, cache_len)``
    in consecutive chunks of the given sizes (summing to T), concatenated."""
    cache, outs, start = model.init_cache(tokens.shape[0], cache_len), [], 0
    for n in chunks:
        logits, cache = _step(model, tokens[:, start:start + n], cache)
        outs.append(logits)
        start += n
    assert start == tokens.shape[1], (start, tokens.shape)
    return jnp.concatenate(outs, 1)
