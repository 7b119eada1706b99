"""One pre-norm decoder block (its own module so that :mod:`lcjax.nn.contextlm`'s predictor
and :class:`lcjax.nn.decoder.DecoderLM` share it without importing each other)::

    h'  = h + Attn(RMSNorm(h), positions)          (+ the TRSP side path in a TRSP layer)
    out = h' + SwiGLU(RMSNorm(h'))
"""

from __future__ import annotations

from flax import nnx

from lcjax.nn.attention import Attention, KVCache
from lcjax.nn.layers import RMSNorm, SwiGLU
from lcjax.nn.trsp import TRSPCache, TRSPGate, trsp_side_path

__all__ = ["DecoderBlock"]


class DecoderBlock(nnx.Module):
    """Pre-norm block: x + Attn(norm(x)), then + SwiGLU(norm(.)); ``layer`` selects the
    layer's attention when the config (a :class:`lcjax.nn.decoder.DecoderConfig`) has one per
    layer."""

    def __init__(self, config, *, rngs: nnx.Rngs, layer: int = 0):
        c = config
        self.attn_norm = RMSNorm(c.d_model, eps=c.norm_eps, param_dtype=c.param_dtype)
        self.attn = Attention(c.layer_attention_config(layer), rngs=rngs)
        self.mlp_norm = RMSNorm(c.d_model, eps=c.norm_eps, param_dtype=c.param_dtype)
        self.mlp = SwiGLU(c.d_model, c.mlp_hidden, dtype=c.dtype, param_dtype=c.param_dtype,
                          rngs=rngs)
        # TRSP side path (level ℓ = layer); its gate is the model's, passed on each call
        self.trsp_level, self.trsp_context = (layer if c.trsp else None), c.trsp_context

    def __call__(self, x, positions, *, segment_ids=None, cache: KVCache | None = None,
                 trsp_gate: TRSPGate | None = None, mask=None):
        """x [B, T, D] -> ([B, T, D], updated cache or None); with TRSP, ``trsp_gate`` is
        the shared gate and the cache a :class:`~lcjax.nn.trsp.TRSPCache`. ``mask``: bool
        broadcastable to [B, H, T, S] (S = T, or the cache length), passed to the
        attention (ANDed with its causal and segment masks)."""
        trsp_state = None
        if self.trsp_level is not None and cache is not None:
            if not isinstance(cache, TRSPCache):
                raise ValueError("DecoderBlock: a TRSP layer needs a TRSPCache (from "
                                 f"DecoderLM.init_cache), got {type(cache).__name__}")
            cache, trsp_state = cache.kv, cache.trsp
        h, cache = self.attn(self.attn_norm(x), positions, segment_ids=segment_ids, cache=cache,
                             mask=mask)
        if self.trsp_level is not None:  # X_mid = X_in + Attn(LN(X_in)) + γ_ℓ·Tri_ℓ(X_in)
            side, trsp_state = trsp_side_path(x, self.trsp_level, trsp_gate,
                                              segment_ids=segment_ids,
                                              context=self.trsp_context, state=trsp_state)
            h = h + side
            if trsp_state is not None:
                cache = TRSPCache.of(cache, trsp_state)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), cache
