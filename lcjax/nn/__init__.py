"""Flax NNX modules: norms, MLPs, the pluggable ``Attention`` module, ``DecoderLM``.

    model = DecoderLM(DecoderConfig(vocab_size=256), rngs=nnx.Rngs(0))
    logits = model(tokens)  # int [B, T] -> float32 [B, T, V]
"""

from lcjax.nn.attention import (
    Attention,
    KVCache,
    attend,
    cache_mask,
    init_kv_cache,
    update_kv_cache,
)
from lcjax.nn.decoder import DecoderBlock, DecoderCache, DecoderConfig, DecoderLM, generate
from lcjax.nn.layers import RMSNorm, SwiGLU, rms_norm

__all__ = [
    "Attention",
    "DecoderBlock",
    "DecoderCache",
    "DecoderConfig",
    "DecoderLM",
    "KVCache",
    "RMSNorm",
    "SwiGLU",
    "attend",
    "cache_mask",
    "generate",
    "init_kv_cache",
    "rms_norm",
    "update_kv_cache",
]
