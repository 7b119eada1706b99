"""Flax NNX modules: norms, MLPs, the pluggable ``Attention`` module, ``DecoderLM``.

    model = DecoderLM(DecoderConfig(vocab_size=256), rngs=nnx.Rngs(0))
    logits = model(tokens)  # int [B, T] -> float32 [B, T, V]
    out = generate(model, prompts, 16, temperature=0.7, rng=jax.random.key(0))
"""

from lcjax.nn.attention import (
    Attention,
    AttentionConfig,
    AttentionTap,
    KVCache,
    attend,
    cache_mask,
    capture_attention,
    init_kv_cache,
    update_kv_cache,
)
from lcjax.nn.contextlm import ContextLM, ContextLMConfig, ContextLMState, context_lm_loss
from lcjax.nn.decoder import DecoderBlock, DecoderCache, DecoderConfig, DecoderLM
from lcjax.nn.diffusion import (
    BlockGeneration,
    MaskedDiffusionLoss,
    diffusion_config,
    generate_blocks,
)
from lcjax.nn.disentangled import DisentangledConfig, DisentangledTransformer
from lcjax.nn.layers import RMSNorm, SwiGLU, rms_norm
from lcjax.nn.lora import LoRAConfig, LoRAModel, LoRAParam, apply_lora
from lcjax.nn.plash import PlashAttention, plash_prototypes
from lcjax.nn.sampling import (
    DecodeResult,
    GenerateResult,
    decode_from_caches,
    generate,
    sample_logits,
    sampling_candidates,
)
from lcjax.nn.trsp import TRSPCache, TRSPGate, TRSPState, init_trsp_state, trsp_side_path
from lcjax.nn.variant_params import LearnableAlpha, VariantConfig, learnable_alpha

__all__ = [
    "ContextLM",
    "ContextLMConfig",
    "ContextLMState",
    "context_lm_loss",
    "Attention",
    "AttentionConfig",
    "AttentionTap",
    "LearnableAlpha",
    "LoRAConfig",
    "LoRAModel",
    "LoRAParam",
    "apply_lora",
    "PlashAttention",
    "plash_prototypes",
    "VariantConfig",
    "capture_attention",
    "learnable_alpha",
    "DecodeResult",
    "DecoderBlock",
    "DecoderCache",
    "DecoderConfig",
    "DecoderLM",
    "DisentangledConfig",
    "DisentangledTransformer",
    "BlockGeneration",
    "MaskedDiffusionLoss",
    "diffusion_config",
    "generate_blocks",
    "GenerateResult",
    "KVCache",
    "RMSNorm",
    "SwiGLU",
    "TRSPCache",
    "TRSPGate",
    "TRSPState",
    "attend",
    "cache_mask",
    "decode_from_caches",
    "generate",
    "init_kv_cache",
    "init_trsp_state",
    "rms_norm",
    "sample_logits",
    "sampling_candidates",
    "trsp_side_path",
    "update_kv_cache",
]
