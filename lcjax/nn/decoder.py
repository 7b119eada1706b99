"""Decoder-only language model (pre-norm Transformer, Llama-style) with KV-cache decoding.

    h_0 = E[tokens]
    h'  = h_l + Attn(RMSNorm(h_l), positions)          (RoPE, GQA, pluggable variant)
    h_{l+1} = h' + SwiGLU(RMSNorm(h'))
    logits = RMSNorm(h_L) E^T   (tied) or RMSNorm(h_L) W_out,   float32 [B, T, V]

Usage::

    model = DecoderLM(DecoderConfig(vocab_size=256), rngs=nnx.Rngs(0))
    logits = model(tokens)                                  # [B, T] -> [B, T, V]
    cache = model.init_cache(batch, max_len)
    logits, cache = model(prompt, cache=cache)              # prefill
    logits, cache = model(next_tokens[:, None], cache=cache)  # one decoding step

Sampling (greedy, temperature, top-k/top-p, ragged batches) is ``lcjax.nn.generate``
(:mod:`lcjax.nn.sampling`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import FrozenDict

from lcjax.attention import get
from lcjax.nn.attention import POSITIONS, AttentionConfig, KVCache
from lcjax.nn.block import DecoderBlock
from lcjax.nn.contextlm import ContextLM, ContextLMConfig, check_context_lm
from lcjax.nn.layers import RMSNorm, dense_init
from lcjax.nn.trsp import CONTEXTS as TRSP_CONTEXTS
from lcjax.nn.trsp import TRSPCache, TRSPGate, init_trsp_state
from lcjax.rope import check_rope_scaling, sinusoidal_embedding

# DecoderConfig.position: the Attention module's positions, and absolute sinusoidal
DECODER_POSITIONS = (*POSITIONS, "absolute")

__all__ = ["DecoderConfig", "DecoderBlock", "DecoderLM", "DecoderCache"]

DecoderCache = tuple[KVCache, ...]  # one KVCache per layer (+ a ContextLMState with ContextLM)


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Hyper-parameters of :class:`DecoderLM` (hashable: usable as a static jit argument).

    ``attention`` is a registry name or a callable under the attention contract;
    ``attention_options`` are extra keywords for it (stored as a FrozenDict). Either may
    also be a tuple with one entry per layer (e.g. token-sparse attention in the
    drift-selected layers, ``lcjax.attention.token_sparse.layer_attention``); a single
    value applies to every layer. :meth:`layer_attention` gives layer ``i``'s pair.
    ``attention_learn``: names of variant quantities to learn in every layer, built by
    the variant spec's ``params`` factory (``lcjax.nn.variant_params``), e.g.
    ``("alpha",)`` for "entmax"; a variant whose spec always has parameters builds them
    with the default ``()``. ``capture_attention_weights``: enable every layer's
    attention-weights tap (``lcjax.nn.AttentionTap``; see
    ``lcjax.nn.capture_attention``, which enables them for one call).
    ``context_parallel``: None, "ulysses", "ring", "upipe" or "usp" — every layer's
    attention (without a KV cache) runs that :mod:`lcjax.parallel` strategy over the mesh
    given by ``with jax.set_mesh(mesh):`` around the call (tokens sharded
    ``P("data", "context")``; "usp": a ``make_mesh(data=, ring=, context=)`` mesh, tokens
    ``P("data", ("ring", "context"))``).
    ``position``: "rope" (default), "nape" (no RoPE; half the heads ALiBi, half NoPE, as
    in ASEntmax), "none" (NoPE; see ``lcjax.nn.Attention``) or "absolute" (no RoPE; the
    sinusoidal embedding of the positions, ``lcjax.rope.sinusoidal_embedding``, added to
    the token embeddings, as in the original Transformer: every layer can read a token's
    absolute position from the residual stream).
    ``trsp``: add TRSP's side path γ_ℓ·Tri_ℓ(x) to every layer's attention residual, with
    one gate shared by all layers (``model.trsp_gate``; ``lcjax.nn.trsp``, ``docs/trsp.md``);
    ``trsp_context``: its L_ctx, "causal" (per position; decoding with the cache equals the
    full pass) or "sequence" (the paper's whole-sequence length; not causal, no cache).
    ``max_len`` is the default KV-cache length; the full forward pass accepts any length.
    ``causal``: every layer's attention is causal (the default); False makes it
    bidirectional, the mask then coming only from the call's ``mask=`` and the cache's
    filled slots (the block-diffusion LM, ``lcjax.nn.diffusion``).
    ``context_lm``: None (default) or a :class:`~lcjax.nn.contextlm.ContextLMConfig` —
    next-context prediction (ContextLM, ``lcjax.nn.contextlm``, ``docs/contextlm.md``):
    chunk embeddings of the stream after block k, a causal predictor over them, its
    prediction fed back to the next chunk's tokens; the loss hook is
    ``lcjax.train.context_lm_loss``.
    ``dtype`` is the compute dtype, ``param_dtype`` the storage dtype; logits are float32.
    Hugging Face architectures (``lcjax.interop.hf``; all off by default):
    ``attention_bias`` (q, k, v biases: Qwen2, Llama's ``attention_bias``),
    ``attention_out_bias`` (output-projection bias: Llama's ``attention_bias``),
    ``qk_norm`` (per-head RMSNorm of q and k before RoPE, eps ``norm_eps``: Qwen3),
    ``rope_scaling`` (None or ``{"rope_type": "linear" | "llama3", ...}``, see
    ``lcjax.rope.scaled_inv_freq``); ``rope_base`` is HF's ``rope_theta``, ``norm_eps`` its
    ``rms_norm_eps``, ``tie_embeddings=False`` its untied ``lm_head``, ``sliding_window``
    (None, an int W for every layer, or one entry per layer, None = full attention) its
    sliding window: a query sees itself and the W - 1 tokens before it
    (``local_window_size=(W - 1, 0)`` of the layer's variant, which must support it;
    decoding from the KV cache keeps it).
    """

    vocab_size: int = 256
    d_model: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 64
    mlp_hidden: int = 1024
    max_len: int = 2048
    rope_base: float = 10000.0
    rope_layout: str = "half"
    position: str = "rope"
    attention: str | Callable | tuple[str | Callable, ...] = "softmax"
    attention_options: Mapping[str, Any] | tuple[Mapping[str, Any], ...] = dataclasses.field(
        default_factory=FrozenDict)
    attention_learn: tuple[str, ...] = ()
    capture_attention_weights: bool = False
    context_parallel: str | None = None
    trsp: bool = False
    trsp_context: str = "causal"
    norm_eps: float = 1e-6
    tie_embeddings: bool = True
    attention_bias: bool = False
    attention_out_bias: bool = False
    qk_norm: bool = False
    rope_scaling: Mapping[str, Any] | None = None
    causal: bool = True
    sliding_window: int | None | tuple[int | None, ...] = None
    context_lm: ContextLMConfig | None = None
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if isinstance(self.attention_options, (tuple, list)):
            object.__setattr__(self, "attention_options",
                               tuple(FrozenDict(o) for o in self.attention_options))
        else:
            object.__setattr__(self, "attention_options", FrozenDict(self.attention_options))
        for name in ("attention", "attention_options"):
            value = getattr(self, name)
            if isinstance(value, list):
                value = tuple(value)
                object.__setattr__(self, name, value)
            if isinstance(value, tuple) and len(value) != self.num_layers:
                raise ValueError(f"DecoderConfig: `{name}` per layer needs num_layers = "
                                 f"{self.num_layers} entries, got {len(value)}")
        if self.rope_scaling is not None:
            scaling = check_rope_scaling(self.rope_scaling)  # ValueError if unknown
            object.__setattr__(self, "rope_scaling",
                               None if scaling is None else FrozenDict(scaling))
        if isinstance(self.attention_learn, str):
            raise ValueError(f"DecoderConfig: `attention_learn` must be a sequence of names, "
                             f"e.g. ({self.attention_learn!r},), got a string")
        object.__setattr__(self, "attention_learn", tuple(self.attention_learn))
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "mlp_hidden", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"DecoderConfig: `{name}` must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"DecoderConfig: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.position not in DECODER_POSITIONS:
            raise ValueError(f"DecoderConfig: `position` must be one of {DECODER_POSITIONS}, "
                             f"got {self.position!r}")
        if self.position == "absolute" and self.d_model % 2:
            raise ValueError(f"DecoderConfig: position='absolute' needs an even d_model, "
                             f"got {self.d_model}")
        if self.position == "rope" and self.head_dim % 2:
            raise ValueError(f"DecoderConfig: RoPE needs an even head_dim, got {self.head_dim}")
        if self.rope_layout not in ("half", "interleaved"):
            raise ValueError(f"DecoderConfig: rope_layout must be 'half' or 'interleaved', "
                             f"got {self.rope_layout!r}")
        if self.context_parallel not in (None, "ulysses", "ring", "upipe", "usp"):
            raise ValueError(f"DecoderConfig: `context_parallel` must be None, 'ulysses', "
                             f"'ring', 'upipe' or 'usp', got {self.context_parallel!r}")
        if not isinstance(self.trsp, bool) or self.trsp_context not in TRSP_CONTEXTS:
            raise ValueError(f"DecoderConfig: `trsp` must be a bool and `trsp_context` one of "
                             f"{TRSP_CONTEXTS}, got {self.trsp!r} and {self.trsp_context!r}")
        if self.context_lm is not None:
            check_context_lm(self.context_lm, self.num_layers)  # ValueError naming both
        self._check_sliding_window()

    def _check_sliding_window(self) -> None:
        window = self.sliding_window
        if isinstance(window, list):
            window = tuple(window)
            object.__setattr__(self, "sliding_window", window)
        if isinstance(window, tuple) and len(window) != self.num_layers:
            raise ValueError(f"DecoderConfig: `sliding_window` per layer needs num_layers = "
                             f"{self.num_layers} entries, got {len(window)}")
        for w in window if isinstance(window, tuple) else (window,):
            if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
                raise ValueError(f"DecoderConfig: `sliding_window` entries must be None or a "
                                 f"positive int, got {w!r}")
        if window is not None and not self.causal:
            raise ValueError("DecoderConfig: `sliding_window` is a causal window (HF's); "
                             "it needs causal=True")

    def layer_window(self, i: int) -> tuple[int, int] | None:
        """Layer ``i``'s ``local_window_size``: HF's ``sliding_window`` W (the query and
        the W - 1 keys before it) is (W - 1, 0); None for full attention."""
        w = self.sliding_window[i] if isinstance(self.sliding_window, tuple) else (
            self.sliding_window)
        return None if w is None else (w - 1, 0)


    def layer_attention(self, i: int) -> tuple[str | Callable, Mapping[str, Any]]:
        """(attention, attention_options) of layer ``i``."""
        pick = lambda x: x[i] if isinstance(x, tuple) else x
        return pick(self.attention), pick(self.attention_options)

    def layer_attention_config(self, i: int) -> AttentionConfig:
        """The :class:`~lcjax.nn.attention.AttentionConfig` of layer ``i``'s attention."""
        attention, attention_options = self.layer_attention(i)
        return AttentionConfig(
            self.d_model, self.num_heads, self.num_kv_heads, self.head_dim,
            attention=attention, attention_options=attention_options, causal=self.causal,
            learn=self.attention_learn, capture_weights=self.capture_attention_weights,
            rope_base=self.rope_base, rope_layout=self.rope_layout,
            position="none" if self.position == "absolute" else self.position,
            context_parallel=self.context_parallel,
            qkv_bias=self.attention_bias, out_bias=self.attention_out_bias,
            qk_norm=self.qk_norm, norm_eps=self.norm_eps, rope_scaling=self.rope_scaling,
            local_window_size=self.layer_window(i),
            dtype=self.dtype, param_dtype=self.param_dtype,
        )


class DecoderLM(nnx.Module):
    """Decoder-only LM: ``DecoderLM(config, rngs=nnx.Rngs(0))(tokens) -> logits``."""

    def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs):
        c = self.config = config
        for i in range(c.num_layers):  # ValueError for an unknown variant, before any parameter
            get(c.layer_attention(i)[0])
        embed_init = nnx.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)
        self.embed = nnx.Param(embed_init(rngs.params(), (c.vocab_size, c.d_model),
                                          c.param_dtype))
        self.blocks = nnx.List([DecoderBlock(c, rngs=rngs, layer=i)
                                for i in range(c.num_layers)])
        self.final_norm = RMSNorm(c.d_model, eps=c.norm_eps, param_dtype=c.param_dtype)
        self.lm_head = None if c.tie_embeddings else nnx.Param(
            dense_init()(rngs.params(), (c.d_model, c.vocab_size), c.param_dtype))
        # last, so that the other parameters are the same with and without TRSP
        self.trsp_gate = TRSPGate(rngs=rngs, param_dtype=c.param_dtype) if c.trsp else None
        # last too: the base parameters are the same with and without ContextLM
        self.context_lm = None if c.context_lm is None else ContextLM(c, rngs=rngs)

    def init_cache(self, batch: int, max_len: int | None = None, *, dtype=None) -> DecoderCache:
        """Empty cache, one :class:`KVCache` [batch, max_len, Hkv, D] per layer
        (max_len defaults to ``config.max_len``, dtype to ``config.dtype``); with TRSP,
        a :class:`~lcjax.nn.trsp.TRSPCache` (the KVCache and the side path's sums); with
        ContextLM, one more entry at the end: its :class:`~lcjax.nn.ContextLMState`."""
        max_len = self.config.max_len if max_len is None else max_len
        caches = tuple(b.attn.init_cache(batch, max_len, dtype=dtype) for b in self.blocks)
        if self.config.trsp:
            caches = tuple(TRSPCache.of(kv, init_trsp_state(batch, self.config.d_model, i,
                                                            max_len))
                           for i, kv in enumerate(caches))
        if self.context_lm is not None:
            caches = (*caches, self.context_lm.init_state(batch, max_len, dtype=dtype))
        return caches

    def embed_inputs(self, embeddings: jax.Array, positions: jax.Array) -> jax.Array:
        """The first residual stream h_0 [B, T, D] (compute dtype) from token embeddings
        [B, T, D]: with ``position="absolute"`` plus the sinusoidal embedding of
        ``positions`` [B, T], else the embeddings as they are."""
        if self.config.position == "absolute":
            embeddings = embeddings + sinusoidal_embedding(positions, self.config.d_model)
        return embeddings.astype(self.config.dtype)

    def logits(self, x: jax.Array) -> jax.Array:
        """Final hidden states [B, T, D] (already normed) -> float32 logits [B, T, V]."""
        dt = self.config.dtype
        if self.lm_head is None:
            return jnp.einsum("BTD,VD->BTV", x.astype(dt), self.embed[...].astype(dt),
                              preferred_element_type=jnp.float32)
        return jnp.einsum("BTD,DV->BTV", x.astype(dt), self.lm_head[...].astype(dt),
                          preferred_element_type=jnp.float32)

    def __call__(
        self,
        tokens: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache: DecoderCache | None = None,
        mask: jax.Array | None = None,
        return_aux: bool = False,
    ):
        """Run the model.

        Args:
          tokens: int [B, T].
          positions: int [B, T] RoPE positions; default ``arange(T)`` (offset by the
            cache index when decoding). Pass them for packed or left-padded inputs.
          segment_ids: int [B, T]; attend within a segment, negative = padding. With a
            cache, tokens default to segment 0.
          cache: from :meth:`init_cache`; the T tokens are appended at its index.
            index + T must not exceed the cache length (checked only outside jit,
            where the index is concrete; under jit an overflow would clamp the write).
          mask: bool broadcastable to [B, H, T, S] (S = T, or the cache length), True = may
            attend; every layer ANDs it with its causal and segment masks (e.g. the
            block-causal mask of ``lcjax.attention.block_causal_mask``).
          return_aux: also return the auxiliary outputs, a dict: with ContextLM and no
            cache ``{"context_loss": (L_ctx, pairs)}`` (``lcjax.nn.contextlm``), else ``{}``.

        Returns:
          float32 logits [B, T, V]; with a cache, ``(logits, new_cache)``; with
          ``return_aux``, the aux dict appended: ``(logits, aux)`` / ``(logits, cache, aux)``.
        """
        c = self.config
        if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"DecoderLM: `tokens` must be int [batch, len], got "
                             f"{tokens.dtype} {tokens.shape}")
        b, t = tokens.shape
        ctx = self.context_lm
        if cache is not None and len(cache) != c.num_layers + (ctx is not None):
            raise ValueError(f"DecoderLM: cache has {len(cache)} entries, model "
                             f"{c.num_layers} layers" + (" + the ContextLM state" if ctx else ""))
        if cache is not None and t > cache[0].k.shape[1]:
            raise ValueError(f"DecoderLM: {t} new tokens exceed cache length {cache[0].k.shape[1]}")
        if cache is not None and not isinstance(cache[0].index, jax.core.Tracer):
            if int(cache[0].index) + t > cache[0].k.shape[1]:
                raise ValueError(f"DecoderLM: cache index {int(cache[0].index)} + {t} new tokens "
                                 f"exceed cache length {cache[0].k.shape[1]}")
        if positions is None:
            start = 0 if cache is None else cache[0].index
            positions = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32), (b, t))
        x = self.embed_inputs(jnp.take(self.embed[...], tokens, axis=0), positions)
        new_cache, aux, ctx_state = [], {}, None
        for i, block in enumerate(self.blocks):
            if ctx is not None and i == ctx.layer:  # the context branch (lcjax.nn.contextlm)
                x, ctx_state, aux = ctx(x, segment_ids=segment_ids,
                                        state=None if cache is None else cache[-1])
            x, layer_cache = block(x, positions, segment_ids=segment_ids,
                                   cache=None if cache is None else cache[i],
                                   trsp_gate=self.trsp_gate, mask=mask)
            new_cache.append(layer_cache)
        logits = self.logits(self.final_norm(x))
        if ctx_state is not None:
            new_cache.append(ctx_state)
        out = (logits,) if cache is None else (logits, tuple(new_cache))
        out = (*out, aux) if return_aux else out
        return out[0] if len(out) == 1 else out

    def hidden_states(self, tokens: jax.Array | None = None, *,
                      embeddings: jax.Array | None = None, positions: jax.Array | None = None,
                      segment_ids: jax.Array | None = None) -> list[jax.Array]:
        """The residual stream of a full pass (no cache): ``[h_0, h_1, ..., h_L]``, each
        [B, T, D] in the compute dtype — h_0 the embeddings (:meth:`embed_inputs`), h_l
        block l's output (h_L before the final norm: ``logits(final_norm(h_L))`` is the
        call's logits). ``embeddings`` [B, T, D] replaces h_0 (e.g. a perturbed h_0, for
        ``lcjax.analysis.spectral``; E[tokens] unless ``position="absolute"``); positions
        default to ``arange(T)``."""
        c = self.config
        if (tokens is None) == (embeddings is None):
            raise ValueError("DecoderLM.hidden_states: pass `tokens` or `embeddings`")
        x = (jnp.take(self.embed[...], tokens, axis=0) if embeddings is None
             else embeddings)
        if x.ndim != 3 or x.shape[-1] != c.d_model:
            raise ValueError(f"DecoderLM.hidden_states: embeddings must be [batch, len, "
                             f"{c.d_model}], got {x.shape}")
        b, t = x.shape[:2]
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        x = self.embed_inputs(x, positions) if embeddings is None else x.astype(c.dtype)
        states = [x]
        for i, block in enumerate(self.blocks):
            if self.context_lm is not None and i == self.context_lm.layer:
                x = self.context_lm(x, segment_ids=segment_ids)[0]  # block i gets the feedback
            x, _ = block(x, positions, segment_ids=segment_ids, trsp_gate=self.trsp_gate)
            states.append(x)
        return states
