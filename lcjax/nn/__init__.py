"""Flax NNX modules: norms, MLPs, the pluggable ``Attention`` module, ``DecoderLM``.

    model = DecoderLM(DecoderConfig(vocab_size=256), rngs=nnx.Rngs(0))
    logits = model(tokens)  # int [B, T] -> float32 [B, T, V]
    out = generate(model, prompts, 16, temperature=0.7, rng=jax.random.key(0))
"""

from lcjax.lazy import lazy_exports

# public name -> the module that defines it, imported on first access (lcjax.lazy)
_EXPORTS = {
    "Attention": "lcjax.nn.attention",
    "AttentionConfig": "lcjax.nn.attention",
    "AttentionTap": "lcjax.nn.attention",
    "KVCache": "lcjax.nn.attention",
    "attend": "lcjax.nn.attention",
    "cache_mask": "lcjax.nn.attention",
    "capture_attention": "lcjax.nn.attention",
    "init_kv_cache": "lcjax.nn.attention",
    "update_kv_cache": "lcjax.nn.attention",
    "ContextLM": "lcjax.nn.contextlm",
    "ContextLMConfig": "lcjax.nn.contextlm",
    "ContextLMState": "lcjax.nn.contextlm",
    "DecoderBlock": "lcjax.nn.block",
    "DecoderCache": "lcjax.nn.decoder",
    "DecoderConfig": "lcjax.nn.decoder",
    "DecoderLM": "lcjax.nn.decoder",
    "BlockGeneration": "lcjax.nn.diffusion",
    "diffusion_config": "lcjax.nn.diffusion",
    "generate_blocks": "lcjax.nn.diffusion",
    "DisentangledConfig": "lcjax.nn.disentangled",
    "DisentangledTransformer": "lcjax.nn.disentangled",
    "RMSNorm": "lcjax.nn.layers",
    "SwiGLU": "lcjax.nn.layers",
    "rms_norm": "lcjax.nn.layers",
    "LoRAConfig": "lcjax.nn.lora",
    "LoRAModel": "lcjax.nn.lora",
    "LoRAParam": "lcjax.nn.lora",
    "apply_lora": "lcjax.nn.lora",
    "PlashAttention": "lcjax.nn.plash",
    "plash_prototypes": "lcjax.nn.plash",
    "DecodeResult": "lcjax.nn.sampling",
    "GenerateResult": "lcjax.nn.sampling",
    "decode_from_caches": "lcjax.nn.sampling",
    "generate": "lcjax.nn.sampling",
    "sample_logits": "lcjax.nn.sampling",
    "sampling_candidates": "lcjax.nn.sampling",
    "TRSPCache": "lcjax.nn.trsp",
    "TRSPGate": "lcjax.nn.trsp",
    "TRSPState": "lcjax.nn.trsp",
    "init_trsp_state": "lcjax.nn.trsp",
    "trsp_side_path": "lcjax.nn.trsp",
    "LearnableAlpha": "lcjax.nn.variant_params",
    "VariantConfig": "lcjax.nn.variant_params",
    "learnable_alpha": "lcjax.nn.variant_params",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
