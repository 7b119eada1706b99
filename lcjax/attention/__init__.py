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
from lcjax.attention.registry import available, get, register, spec, specs, unregister
from lcjax.attention.spec import AttentionSpec, Features, Implementation
from lcjax.attention.weights import attention_scores, attention_weights, variant_weights


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


def _no_aux(fn):
    """Adapter for a function without an aux dict: ``return_aux=True`` gives ``{}``."""

    def impl(q, k, v, *, return_aux=False, **kw):
        out = fn(q, k, v, **kw)
        return (out, {}) if return_aux else out

    return impl


_jax_impl = _no_aux(jax_dot_product_attention)


def _jax_impl_fn(q, k, v, *, mask=None, q_segment_ids=None, kv_segment_ids=None, **kw):
    if q_segment_ids is not None:  # folded into a dense mask
        mask = build_mask(q.shape[1], k.shape[1], mask=mask, q_segment_ids=q_segment_ids,
                          kv_segment_ids=kv_segment_ids)
    return _jax_impl(q, k, v, mask=mask, **kw)


register(AttentionSpec(
    "softmax", reference=dot_product_attention,
    implementations=(Implementation("xla", _no_aux(dot_product_attention)),),
    features=Features(lse=True), description="exact softmax attention (the reference)"))
register(AttentionSpec(
    "blockwise", reference=dot_product_attention,
    implementations=(Implementation("xla", _no_aux(blockwise_attention)),),
    features=Features(lse=True), test_options={"block_q": 8, "block_kv": 8},
    description="online-softmax (FlashAttention) attention in XLA"))
register(AttentionSpec(
    "jax", reference=dot_product_attention,
    implementations=(Implementation("xla", _jax_impl_fn),),
    description="jax.nn.dot_product_attention (XLA), the anchor we time against"))
_ENTMAX_AUX = {"tau": "[B, T, H] float32", "iterations": "[B, T, H] int32",
               "block_sparsity": "[] float32"}
register(AttentionSpec(
    "entmax", reference=entmax_attention, implementations=(
        Implementation("xla", entmax_attention),), aux=_ENTMAX_AUX,
    test_options={"block_q": 8, "block_kv": 8},
    params="lcjax.nn.variant_params:learnable_alpha",
    description="alpha-entmax sparse attention (AdaSplash-2)"))
register(AttentionSpec(
    "sparsemax", reference=sparsemax_attention, implementations=(
        Implementation("xla", sparsemax_attention),), aux=_ENTMAX_AUX,
    test_options={"block_q": 8, "block_kv": 8}, description="alpha = 2 entmax attention"))

__all__ = [
    "AttentionSpec",
    "Features",
    "Implementation",
    "spec",
    "specs",
    "unregister",
    "available",
    "attention_scores",
    "attention_weights",
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
    "variant_weights",
    "segment_mask",
    "sparsemax_attention",
    "validate_qkv",
]
