"""Attention variants under one contract; ``get(name)`` returns one by name.

    out = variant(q, k, v, *, causal=False, mask=None, scale=None, **options)
    q: [B, T, H, D]; k, v: [B, S, Hkv, D] -> [B, T, H, D]
"""

import jax

from lcjax.attention.core import (
    blockwise_attention,
    build_mask,
    causal_mask,
    dot_product_attention,
    lengths_to_segment_ids,
    merge_attention,
    segment_mask,
    validate_qkv,
)
from lcjax.attention.entmax import entmax_attention, sparsemax_attention
from lcjax.attention.registry import available, get, register


def jax_dot_product_attention(q, k, v, *, causal=False, mask=None, scale=None):
    """``jax.nn.dot_product_attention`` (XLA) under our contract: the anchor we time
    and test against."""
    validate_qkv(q, k, v, mask=mask, name="jax_dot_product_attention")
    if mask is not None:
        mask = jax.numpy.asarray(mask)
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    return jax.nn.dot_product_attention(
        q, k, v, mask=mask, scale=scale, is_causal=causal, implementation="xla"
    )


register("softmax", dot_product_attention)
register("blockwise", blockwise_attention)
register("jax", jax_dot_product_attention)
register("entmax", entmax_attention)  # α = 1.5 by default; alpha= per call or per head
register("sparsemax", sparsemax_attention)  # α = 2

__all__ = [
    "available",
    "blockwise_attention",
    "build_mask",
    "causal_mask",
    "dot_product_attention",
    "entmax_attention",
    "get",
    "jax_dot_product_attention",
    "lengths_to_segment_ids",
    "merge_attention",
    "register",
    "segment_mask",
    "sparsemax_attention",
    "validate_qkv",
]
