"""Attention variants under one contract; ``get(name)`` returns one by name.

    out = variant(q, k, v, *, causal=False, mask=None, scale=None, **options)
    q: [B, T, H, D]; k, v: [B, S, Hkv, D] -> [B, T, H, D]

Each method module declares its :class:`AttentionSpec`; ``builtin_specs`` lists the
built-in ones, registered here once (``register_builtins``), independent of import order.
``get``/``spec``/``specs``/``available`` are functions of ``registry``; the spec types live
in ``base``. See ``docs/attention.md`` for the contract, the specs,
the dispatch rules and how to add a variant.
"""

from lcjax.attention.base import AttentionSpec, Features, Implementation, LearnedParams
from lcjax.attention.builtin_specs import BUILTIN_SPECS, register_builtins
from lcjax.attention.core import (
    block_causal_mask,
    blockwise_attention,
    blockwise_attention_bwd,
    build_mask,
    causal_mask,
    dot_product_attention,
    lengths_to_segment_ids,
    merge_attention,
    segment_mask,
    validate_qkv,
    window_mask,
)
from lcjax.attention.entmax import entmax_attention, sparsemax_attention
from lcjax.attention.flashblock import FlashBlockConfig, flashblock_attention
from lcjax.attention.linear import icl_predict, linear_attention
from lcjax.attention.nystrom import nystrom_attention
from lcjax.attention.performer import performer_attention
from lcjax.attention.plash import plash_attention
from lcjax.attention.registry import available, get, register, spec, specs, unregister
from lcjax.attention.softmax import BlockwiseConfig, jax_dot_product_attention
from lcjax.attention.token_sparse import token_sparse_attention
from lcjax.attention.weights import attention_scores, attention_weights, variant_weights

register_builtins()

__all__ = [
    "AttentionSpec",
    "BUILTIN_SPECS",
    "LearnedParams",
    "BlockwiseConfig",
    "Features",
    "FlashBlockConfig",
    "flashblock_attention",
    "Implementation",
    "spec",
    "specs",
    "unregister",
    "available",
    "attention_scores",
    "attention_weights",
    "block_causal_mask",
    "blockwise_attention",
    "blockwise_attention_bwd",
    "build_mask",
    "causal_mask",
    "dot_product_attention",
    "entmax_attention",
    "get",
    "icl_predict",
    "jax_dot_product_attention",
    "lengths_to_segment_ids",
    "linear_attention",
    "merge_attention",
    "nystrom_attention",
    "performer_attention",
    "plash_attention",
    "register",
    "variant_weights",
    "segment_mask",
    "sparsemax_attention",
    "token_sparse_attention",
    "validate_qkv",
    "window_mask",
]
