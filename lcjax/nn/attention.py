"""Multi-head attention module with a pluggable attention variant and a functional KV cache.

    q = x W_q  [B, T, H, D]     k = x W_k, v = x W_v  [B, T, Hkv, D]   (H % Hkv == 0, GQA)
    q, k <- RoPE(q, positions), RoPE(k, positions)        (Su et al., 2021; position="rope")
    o = variant(q, k, v, causal=..., mask=..., scale=..., **attention_options)

Positions (``position=``): ``"rope"`` (default), ``"none"`` (NoPE: no position signal but
the causal mask), or ``"nape"`` (NAPE, as in ASEntmax, Vasylenko et al., ICLR 2026: no RoPE;
the first H/2 heads get the ALiBi bias -m_h·(i - j) of Press et al. 2022 with the slopes
1/1, 1/2, ..., 1/(H/2) of the ASEntmax code — :func:`nape_slopes` —, the other heads none).
NAPE passes ``alibi_slopes`` (a static tuple [H]) to the variant, and, when decoding with a
cache, ``alibi_offset`` = the cache index, so the new queries sit at their slots.
    y = o W_o  [B, T, D_model]

Hugging Face architectures (``lcjax.interop.hf``) add, all off by default: biases on q, k, v
(``qkv_bias``, Qwen2) and on the output (``out_bias``); a per-head RMSNorm of q and k over
the head dimension before RoPE (``qk_norm``, Qwen3: q <- RMSNorm(q) γ_q, k <- RMSNorm(k) γ_k,
γ [D] shared by the heads); scaled RoPE frequencies (``rope_scaling``,
``lcjax.rope.scaled_inv_freq``: "linear", "llama3").

``attention`` is a registry name (``lcjax.attention.get``) or any callable under the
attention contract. What a variant can do comes from its spec (``AttentionSpec``); a
plain callable has no spec, so it gets the contract alone. Padding and packing use
segment ids (negative = padding): they are handed to the variant natively when its spec
says ``features.segment_ids`` (no dense mask is built, which matters for long
sequences), and folded into ``mask`` otherwise (always, for a plain callable).

Variant parameters: a spec's ``params`` factory builds an ``nnx.Module``
(``attn.variant_params``) whose call returns extra keyword options for the variant
(``lcjax.nn.variant_params`` documents the protocol; e.g. a learnable per-head α for
entmax with ``learn=("alpha",)``).

Taps (:class:`AttentionTap`, identity modules: the output is unchanged; disabled, the
default, they compute nothing): ``attn.attention_weights`` sows the dense attention
weights [B, H, T, S] of the variant on the same q, k; ``attn.attention_inputs`` sows the
``{"q", "k", "v", "scale"}`` the variant receives (after RoPE). Read them with
:func:`capture_attention` (``capture_attention(model, tokens)`` -> per-layer weights),
no monkey-patching needed.

The KV cache is a pytree (:class:`KVCache`) passed in and returned, so decoding works
under ``jax.jit``. New keys/values are written at ``cache.index``. Empty slots carry
segment id -1, so the segment mask alone hides them (and any padding written into the
cache); a causal layer adds only the causal mask of the new queries' slots, built from
the index (a traced value).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import FrozenDict
from jax import lax

from lcjax.attention import AttentionSpec, build_mask, causal_mask, get
from lcjax.attention.base import keyword_names
from lcjax.attention.core import default_scale, window_size
from lcjax.attention.weights import variant_weights
from lcjax.nn.layers import RMSNorm, dense_init
from lcjax.nn.variant_params import VariantConfig, build_variant_params
from lcjax.parallel.layer import layer_apply
from lcjax.rope import apply_rope, check_rope_scaling, scaled_inv_freq

__all__ = ["Attention", "AttentionConfig", "AttentionTap", "KVCache", "init_kv_cache",
           "update_kv_cache", "cache_mask", "cache_window_mask", "attend", "capture_attention",
           "kv_cache_gap",
           "nape_slopes",
           "takes_segment_ids",
           "POSITIONS"]

POSITIONS = ("rope", "nape", "none")


def nape_slopes(num_heads: int, alibi_heads: int | None = None) -> tuple[float, ...]:
    """NAPE's ALiBi slopes [num_heads]: 1/1, 1/2, ..., 1/alibi_heads for the first
    ``alibi_heads`` heads (default num_heads // 2; the "linear" slopes of the ASEntmax code,
    not ALiBi's geometric 2^{-8h/H}), then 0 (NoPE heads)."""
    alibi_heads = num_heads // 2 if alibi_heads is None else alibi_heads
    if not 0 <= alibi_heads <= num_heads:
        raise ValueError(f"nape_slopes: `alibi_heads` must be in [0, {num_heads}], "
                         f"got {alibi_heads}")
    return tuple(1.0 / (h + 1) for h in range(alibi_heads)) + (0.0,) * (num_heads - alibi_heads)


def _takes_alibi(fn: Callable) -> bool:
    """Whether variant ``fn`` accepts the ``alibi_slopes`` option (some implementation of
    its spec does, or a plain callable's signature has it or ``**kwargs``)."""
    if isinstance(fn, AttentionSpec):
        return any(impl.takes("alibi_slopes") for impl in fn.implementations)
    names = keyword_names(fn)
    return names is None or "alibi_slopes" in names


class KVCache(NamedTuple):
    """Per-layer decoding cache.

    k, v: [B, S_max, Hkv, D] rotated keys and values; segment_ids: int32 [B, S_max]
    (negative = padding or an empty slot: never attended); index: int32 scalar, the
    next slot to write (slots >= index are empty, segment id -1).
    """

    k: jax.Array
    v: jax.Array
    segment_ids: jax.Array
    index: jax.Array


def init_kv_cache(batch: int, max_len: int, kv_heads: int, head_dim: int,
                  dtype=jnp.float32) -> KVCache:
    """Empty cache: zero buffers [batch, max_len, kv_heads, head_dim], every slot's
    segment id -1 (masked by ``lcjax.attention.segment_mask``), index 0."""
    shape = (batch, max_len, kv_heads, head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        segment_ids=jnp.full((batch, max_len), -1, jnp.int32),
        index=jnp.zeros((), jnp.int32),
    )


def update_kv_cache(cache: KVCache, k: jax.Array, v: jax.Array,
                    segment_ids: jax.Array) -> KVCache:
    """Write k, v [B, T, Hkv, D] and segment ids [B, T] at slots [index, index + T)."""
    i = cache.index
    return KVCache(
        k=lax.dynamic_update_slice_in_dim(cache.k, k.astype(cache.k.dtype), i, axis=1),
        v=lax.dynamic_update_slice_in_dim(cache.v, v.astype(cache.v.dtype), i, axis=1),
        segment_ids=lax.dynamic_update_slice_in_dim(
            cache.segment_ids, segment_ids.astype(jnp.int32), i, axis=1
        ),
        index=i + k.shape[1],
    )


def cache_mask(index: jax.Array, q_len: int, kv_len: int, *,
               causal: bool) -> jax.Array | None:
    """Mask [1, 1, q_len, kv_len] for q_len new queries written at slot ``index``.

    Causal: query t (slot index + t) sees slots <= index + t. Not causal: ``None``
    (nothing beyond the segment mask: empty slots have segment id -1).
    """
    if not causal:
        return None
    return causal_mask(q_len, kv_len, q_offset=index)[None, None]


def cache_window_mask(segment_ids: jax.Array, index: jax.Array, q_len: int,
                      window: tuple[int, int]) -> jax.Array:
    """Sliding-window mask [B, 1, q_len, S] over a KV cache whose segment ids
    [B, S] already hold the q_len new tokens at slots index ... index + q_len - 1.

    Distances count filled slots (segment id >= 0), not slots: key j has rank r_j = #filled
    slots before it, and the query at slot index + t (rank r_q) sees keys with
    r_q - left <= r_j <= r_q + right (``window = (left, right)``,
    ``lcjax.attention.core.window_mask``). Ranks are positions when a row's tokens fill
    its slots in order, with padding (segment -1) between them, as a right-padded
    ragged prompt followed by generated tokens."""
    left, right = window
    rank = jnp.cumsum(segment_ids >= 0, axis=1) - 1  # [B, S]
    q_rank = lax.dynamic_slice_in_dim(rank, index, q_len, axis=1)  # [B, t]
    diff = rank[:, None, :] - q_rank[:, :, None]  # [B, t, S]
    return ((diff >= -left) & (diff <= right))[:, None]


def kv_cache_gap(fn: Callable, *, causal: bool) -> str | None:
    """Why variant ``fn`` cannot attend over a KV cache, or None if it can.

    The cache path (``Attention`` with a ``cache``) hides the cache's empty slots with
    segment ids (folded into a ``mask`` when the spec does not take them) and, for a causal
    layer, adds the causal mask of the new queries' slots. A spec whose ``features`` have
    neither ``mask`` nor (for a non-causal layer) ``segment_ids`` cannot do that; one without
    ``causal`` cannot serve a causal layer at all. Plain callables are assumed able.
    """
    if not isinstance(fn, AttentionSpec):
        return None
    f = fn.features
    if causal and not f.causal:
        return (f"attention {fn.name!r} is not causal (its spec has Features(causal=False)), "
                "so it cannot serve a decoder")
    if not f.mask and (causal or not f.segment_ids):
        return (f"attention {fn.name!r} cannot decode from a KV cache: the cache path masks the "
                "cache's empty slots and the new tokens' causal order, and its spec supports "
                "no mask" + ("" if causal else " or segment ids") + " (Features(mask=False)); "
                "run it on whole sequences (no cache), or decode with a variant that "
                "supports masks")
    return None


def takes_segment_ids(fn: Callable) -> bool:
    """Whether variant ``fn`` takes ``q_segment_ids`` / ``kv_segment_ids`` natively: its
    spec's ``features.segment_ids``; False for a plain callable (not in the contract)."""
    return isinstance(fn, AttentionSpec) and fn.features.segment_ids


def attend(
    fn: Callable,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    mask=None,
    scale: float | None = None,
    q_segment_ids=None,
    kv_segment_ids=None,
    options: Mapping[str, Any] | None = None,
) -> jax.Array:
    """Call variant ``fn`` on q [B, T, H, D], k, v [B, S, Hkv, D] -> [B, T, H, D].

    Segment ids (int [B, T], [B, S]) go to ``fn`` natively if its spec supports them
    (:func:`takes_segment_ids`), else they are folded into ``mask`` (bool,
    broadcastable to [B, H, T, S]).
    """
    options = dict(options or {})
    if q_segment_ids is not None:
        if takes_segment_ids(fn):
            options.update(q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
        else:
            mask = build_mask(q.shape[1], k.shape[1], mask=mask,
                              q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
    return fn(q, k, v, causal=causal, mask=mask, scale=scale, **options)


def _learn_names(learn: Sequence[str], learn_alpha: bool) -> tuple[str, ...]:
    """``learn`` as a tuple of names, with the deprecated ``learn_alpha`` folded in."""
    if isinstance(learn, str):
        raise ValueError(f"Attention: `learn` must be a sequence of names, e.g. "
                         f"({learn!r},), got the string {learn!r}")
    learn = tuple(learn)
    if learn_alpha:
        warnings.warn("Attention(learn_alpha=True) is deprecated; use learn=('alpha',)",
                      DeprecationWarning, stacklevel=3)
        learn = learn if "alpha" in learn else (*learn, "alpha")
    return learn


TAPS = ("weights", "inputs")
# lcjax.parallel strategies an Attention layer can run over the mesh of jax.set_mesh
CONTEXT_PARALLEL = (None, "ulysses", "ring", "upipe", "usp")


class AttentionTap(nnx.Module):
    """An identity module that records what it is given (gemma's ``attention_weights``).

    :class:`Attention` holds two: ``attention_weights`` (``name="weights"``) and
    ``attention_inputs`` (``name="inputs"``). Only when ``enabled`` does the layer compute
    the tapped value — weights: its variant's dense weights w [B, H, T, S] (float32; each
    row sums to 1 over the keys the query sees, or is 0) on the same q, k; inputs:
    ``{"q": [B, T, H, D], "k", "v": [B, S, Hkv, D], "scale": float}`` as the variant gets
    them — and call this module, which sows it as ``nnx.Intermediate`` ``name`` (one entry
    per call) and returns it unchanged. Read with :func:`capture_attention` or
    ``nnx.capture(model, nnx.Intermediate)``; toggle on a whole model with
    ``model.set_attributes(AttentionTap, enabled=True)``.
    """

    def __init__(self, name: str, *, enabled: bool = False):
        if name not in TAPS:
            raise ValueError(f"AttentionTap: `name` must be one of {TAPS}, got {name!r}")
        self.name, self.enabled = name, bool(enabled)

    def __call__(self, value):
        self.sow(nnx.Intermediate, self.name, value)
        return value


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """The configuration of an :class:`Attention` layer (its Args documents each field).

    ``Attention(AttentionConfig(d_model, num_heads, num_kv_heads, head_dim, ...),
    rngs=rngs)``; the keyword form ``Attention(d_model, num_heads, num_kv_heads, head_dim,
    ..., rngs=rngs)`` builds this config from the same arguments.
    """

    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    _: dataclasses.KW_ONLY
    attention: str | Callable = "softmax"
    attention_options: Mapping[str, Any] | None = None
    causal: bool = True
    scale: float | None = None
    rope_base: float = 10000.0
    rope_layout: str = "half"
    use_rope: bool = True
    position: str | None = None
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    learn: Sequence[str] = ()
    capture_weights: bool = False
    capture_inputs: bool = False
    context_parallel: str | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    qk_norm: bool = False
    norm_eps: float = 1e-6
    rope_scaling: Mapping[str, Any] | None = None
    local_window_size: int | tuple[int, int] | None = None


def _as_config(config: Any, args: tuple, kwargs: dict) -> AttentionConfig:
    """``config`` itself (with no other arguments), or the config of the keyword form
    ``Attention(d_model, num_heads, num_kv_heads, head_dim, **kwargs)``."""
    if isinstance(config, AttentionConfig):
        if args or kwargs:
            raise TypeError(f"Attention: give an AttentionConfig or its fields, not both "
                            f"(got also {len(args)} positional and {sorted(kwargs)})")
        return config
    return AttentionConfig(*(() if config is None else (config,)), *args, **kwargs)


def _check_shape_and_position(c: AttentionConfig) -> str:
    """Checks ``context_parallel``, the heads, the position scheme and the RoPE layout;
    returns the position ("rope" | "nape" | "none")."""
    if c.context_parallel not in CONTEXT_PARALLEL:
        raise ValueError(f"Attention: `context_parallel` must be one of "
                         f"{CONTEXT_PARALLEL}, got {c.context_parallel!r}")
    if c.num_kv_heads <= 0 or c.num_heads % c.num_kv_heads:
        raise ValueError(
            f"Attention: num_heads ({c.num_heads}) must be a positive multiple of "
            f"num_kv_heads ({c.num_kv_heads})"
        )
    position = c.position
    if position is None:
        position = "rope" if c.use_rope else "none"
    if position not in POSITIONS:
        raise ValueError(f"Attention: `position` must be one of {POSITIONS}, got {position!r}")
    if position == "rope" and not c.use_rope:
        raise ValueError("Attention: position='rope' contradicts use_rope=False")
    if position == "rope" and c.head_dim % 2:
        raise ValueError(f"Attention: RoPE needs an even head_dim, got {c.head_dim}")
    if c.rope_layout not in ("half", "interleaved"):
        raise ValueError(
            f"Attention: rope_layout must be 'half' or 'interleaved', got {c.rope_layout!r}"
        )
    return position


def _check_window(fn: Any, window: tuple[int, int] | None, given: Any) -> None:
    """A sliding window needs a spec declaring ``Features.window`` (a plain callable gets
    it in its mask)."""
    if window is not None and isinstance(fn, AttentionSpec) and not fn.features.window:
        raise ValueError(f"Attention: local_window_size={given!r} needs a "
                         f"variant whose spec supports a sliding window "
                         f"(Features.window); {fn.name!r} does not")


def _variant_name(fn: Any) -> str:
    return getattr(fn, "name", getattr(fn, "__name__", repr(fn)))


def _static_options(fn: Any, attention_options: Mapping | None, position: str,
                    num_heads: int) -> FrozenDict:
    """The variant's static options: ``attention_options``, plus NAPE's ``alibi_slopes``
    [H] (:func:`nape_slopes`) with ``position="nape"``."""
    options = FrozenDict(attention_options or {})
    if position == "nape":
        if "alibi_slopes" in options:
            raise ValueError("Attention: position='nape' sets `alibi_slopes`; do not pass "
                             "them in attention_options too")
        if not _takes_alibi(fn):
            raise ValueError(f"Attention: position='nape' needs a variant that takes "
                             f"`alibi_slopes`; {_variant_name(fn)!r} does not")
        options = FrozenDict({**options, "alibi_slopes": nape_slopes(num_heads)})
    return options


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE and a pluggable attention variant.

    ``Attention(config, rngs=rngs)`` with an :class:`AttentionConfig`, or the keyword form
    ``Attention(d_model, num_heads, num_kv_heads, head_dim, **fields, rngs=rngs)`` that
    builds one from the same arguments.

    Args (the config's fields; ``learn_alpha`` and ``rngs`` are the constructor's):
      d_model: model width D_model.
      num_heads, num_kv_heads: H and Hkv, with H % Hkv == 0.
      head_dim: D (even, for RoPE).
      attention: registry name ("softmax", "blockwise", "jax", ...) or a callable
        ``fn(q, k, v, *, causal, mask, scale, **options)``.
      attention_options: extra keywords passed to the variant on every call.
      causal: causal self-attention (decoder) or bidirectional.
      scale: softmax scale, default 1/sqrt(D).
      rope_base, rope_layout: RoPE frequency base and layout ("half" | "interleaved");
        ``use_rope=False`` disables RoPE.
      position: "rope" | "nape" | "none" (module docstring); None = "rope" if ``use_rope``
        else "none". "nape" needs a variant taking ``alibi_slopes`` (softmax, blockwise,
        entmax, sparsemax, asentmax, ssmax).
      learn: names of variant quantities to learn, built by the spec's ``params``
        factory (``lcjax.nn.variant_params``); e.g. ``("alpha",)`` for "entmax": a raw
        ``nnx.Param`` [num_heads] with ``alpha =
        lcjax.attention.entmax.mapping.alpha_from_param(raw)``
        (α ∈ [1.01, 2] per head) passed on every call, ``attention_options["alpha"]`` (a
        number in [1.01, 2), default 1.5) being the initial α. A spec whose variant
        always has parameters (a toy temperature, prototypes, gates) builds them with
        ``learn=()``. The module is ``self.variant_params`` (None when there is none).
      capture_weights, capture_inputs: enable the taps ``self.attention_weights`` /
        ``self.attention_inputs`` (:class:`AttentionTap`); see :func:`capture_attention`.
      learn_alpha: deprecated alias of ``learn=("alpha",)``.
      context_parallel: None, "ulysses", "ring", "upipe" or "usp": without a cache, the layer runs
        by that :mod:`lcjax.parallel` strategy over the mesh set with
        ``jax.set_mesh(mesh)`` (x sharded ``P("data", "context", None)``); no mask,
        segment ids, NAPE, interleaved RoPE, variant parameters or taps there.
      qkv_bias, out_bias: learnable biases of the q, k, v projections ([H, D], [Hkv, D],
        [Hkv, D], init 0) and of the output projection ([D_model], init 0).
      qk_norm: RMSNorm over the head dimension of q and of k before RoPE (scales [D],
        init 1), with ``norm_eps``.
      local_window_size: None, an int w or (left, right): sliding-window attention as in
        ``jax.nn.dot_product_attention`` (query i sees keys i - left ... i + right, and
        none after i when causal; HF's ``sliding_window`` W is (W - 1, 0)). Passed to a
        spec (which must declare ``Features.window``); folded into the mask of a plain
        callable and, with a KV cache, into the cache's step mask
        (:func:`cache_window_mask`).
      rope_scaling: None or a mapping ``{"rope_type": "linear" | "llama3", ...}``
        (``lcjax.rope.check_rope_scaling``): RoPE uses ``scaled_inv_freq(D, rope_base,
        rope_scaling)``.
    """

    def __init__(self, config: AttentionConfig | int | None = None, *args: Any,
                 rngs: nnx.Rngs, learn_alpha: bool = False, **kwargs: Any):
        config = _as_config(config, args, kwargs)
        c = config
        self.context_parallel = c.context_parallel
        position = _check_shape_and_position(c)
        use_rope = position == "rope"
        self.attention_fn = get(c.attention)  # ValueError for an unknown name
        self.local_window_size = window_size(c.local_window_size, name="Attention")
        _check_window(self.attention_fn, self.local_window_size, c.local_window_size)
        options = _static_options(self.attention_fn, c.attention_options, position,
                                  c.num_heads)
        self.position = position
        learn = _learn_names(c.learn, learn_alpha)
        if c.capture_weights:
            self._weights_fn()  # ValueError now if the variant's weights are unknown
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.causal, self.scale, self.use_rope = c.causal, c.scale, use_rope
        self.rope_base, self.rope_layout = c.rope_base, c.rope_layout
        self.dtype = c.dtype
        self._init_projections(c, rngs)
        scaling = check_rope_scaling(c.rope_scaling)
        # static (hashable) RoPE frequencies when scaled; None = apply_rope's default
        self.rope_frequencies = None if scaling is None or not use_rope else tuple(
            float(f) for f in scaled_inv_freq(c.head_dim, c.rope_base, scaling))
        vcfg = VariantConfig(c.d_model, c.num_heads, c.num_kv_heads, c.head_dim,
                             options=options, learn=learn, dtype=c.dtype,
                             param_dtype=c.param_dtype)
        try:
            self.variant_params = build_variant_params(self.attention_fn, vcfg, rngs=rngs)
        except ValueError as e:
            raise ValueError(f"{e} (learn_alpha=True)" if learn_alpha else str(e)) from None
        drop = getattr(self.variant_params, "init_options", ())
        self.attention_options = FrozenDict({k: v for k, v in options.items()
                                             if k not in drop})  # hashable: static
        self.attention_weights = AttentionTap("weights", enabled=c.capture_weights)
        self.attention_inputs = AttentionTap("inputs", enabled=c.capture_inputs)

    def _init_projections(self, c: AttentionConfig, rngs: nnx.Rngs) -> None:
        """Wq [d, H, D], Wk, Wv [d, Hkv, D], Wo [H, D, d] (keys drawn in that order), the
        optional biases (init 0) and q/k RMSNorms."""
        d_model, num_heads, num_kv_heads, head_dim = (c.d_model, c.num_heads, c.num_kv_heads,
                                                      c.head_dim)
        param_dtype = c.param_dtype
        key = rngs.params
        in_proj = dense_init(in_axis=0, out_axis=(1, 2))
        self.q_proj = nnx.Param(in_proj(key(), (d_model, num_heads, head_dim), param_dtype))
        self.k_proj = nnx.Param(in_proj(key(), (d_model, num_kv_heads, head_dim), param_dtype))
        self.v_proj = nnx.Param(in_proj(key(), (d_model, num_kv_heads, head_dim), param_dtype))
        out_proj = dense_init(in_axis=(0, 1), out_axis=2)
        self.o_proj = nnx.Param(out_proj(key(), (num_heads, head_dim, d_model), param_dtype))
        zeros = lambda *shape: nnx.Param(jnp.zeros(shape, param_dtype))
        self.q_bias = zeros(num_heads, head_dim) if c.qkv_bias else None
        self.k_bias = zeros(num_kv_heads, head_dim) if c.qkv_bias else None
        self.v_bias = zeros(num_kv_heads, head_dim) if c.qkv_bias else None
        self.o_bias = zeros(d_model) if c.out_bias else None
        norm = lambda: RMSNorm(head_dim, eps=c.norm_eps, param_dtype=param_dtype)
        self.q_norm = norm() if c.qk_norm else None
        self.k_norm = norm() if c.qk_norm else None

    def _weights_fn(self) -> Callable:
        """The dense weights function of this layer's variant (``ValueError`` if unknown)."""
        fn = variant_weights(self.attention_fn)
        if fn is None:
            name = getattr(self.attention_fn, "name", getattr(self.attention_fn, "__name__",
                                                              repr(self.attention_fn)))
            raise ValueError(f"Attention: the attention-weights tap needs the dense weights "
                             f"of variant {name!r}: a registered spec with a `weights` "
                             f"function or a softmax reference")
        return fn

    def variant_options(self, **inputs) -> dict[str, Any]:
        """Keyword options for the variant: the static ``attention_options`` overridden
        by what ``variant_params(**inputs)`` returns (inputs: x, q, k, v, positions)."""
        if self.variant_params is None:
            return dict(self.attention_options)
        return {**self.attention_options, **self.variant_params(**inputs)}

    def init_cache(self, batch: int, max_len: int, *, dtype=None) -> KVCache:
        """Empty :class:`KVCache` for this layer (dtype defaults to the compute dtype)."""
        return init_kv_cache(batch, max_len, self.num_kv_heads, self.head_dim,
                             self.dtype if dtype is None else dtype)

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        *,
        segment_ids: jax.Array | None = None,
        mask: jax.Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Self-attention over x, optionally appending to a KV cache.

        Args:
          x: [B, T, D_model].
          positions: int [B, T] or [T], RoPE position ids.
          segment_ids: int [B, T]; tokens attend within their segment, negative = padding.
          mask: bool broadcastable to [B, H, T, S] (S = T, or S_max with a cache).
          cache: :class:`KVCache` with buffers [B, S_max, Hkv, D]; the T new tokens are
            written at ``cache.index`` (segment 0 unless ``segment_ids`` says otherwise)
            and queries see the cache's non-negative segments only (causally, if causal).

        Returns:
          (y [B, T, D_model] in the compute dtype, updated cache or None).
        """
        dt = self.dtype
        x = x.astype(dt)
        if self.context_parallel is not None and cache is None:
            return self._context_parallel(x, positions, segment_ids, mask), None
        q, k, v = self._qkv(x, positions)
        causal, kv_segment_ids = self.causal, segment_ids
        alibi_offset = None
        if cache is not None:
            alibi_offset = cache.index  # the new queries sit at slots index, index + 1, ...
            k, v, segment_ids, kv_segment_ids, mask, cache = self._through_cache(
                x, k, v, cache, segment_ids, mask)
            causal = False
        k, v = k.astype(dt), v.astype(dt)
        options = self.variant_options(x=x, q=q, k=k, v=v, positions=positions)
        mask, tap_mask = self._window(q, k, mask, options, cached=cache is not None)
        if "alibi_slopes" in options and alibi_offset is not None:
            options["alibi_offset"] = alibi_offset
        self._sow_taps(q, k, v, causal=causal, tap_mask=tap_mask, segment_ids=segment_ids,
                       kv_segment_ids=kv_segment_ids, options=options)
        o = attend(self.attention_fn, q, k, v, causal=causal, mask=mask,
                   scale=self.scale, q_segment_ids=segment_ids, kv_segment_ids=kv_segment_ids,
                   options=options)
        y = jnp.einsum("BTNH,NHD->BTD", o.astype(dt), self.o_proj[...].astype(dt))
        if self.o_bias is not None:
            y = y + self.o_bias[...].astype(dt)
        return y, cache

    def _qkv(self, x, positions):
        """q [B, T, H, D], k, v [B, T, Hkv, D] of x (compute dtype): projections, biases,
        q/k norms and RoPE (scaled frequencies when configured)."""
        dt = self.dtype
        q = jnp.einsum("BTD,DNH->BTNH", x, self.q_proj[...].astype(dt))
        k = jnp.einsum("BTD,DKH->BTKH", x, self.k_proj[...].astype(dt))
        v = jnp.einsum("BTD,DKH->BTKH", x, self.v_proj[...].astype(dt))
        if self.q_bias is not None:
            q = q + self.q_bias[...].astype(dt)
            k = k + self.k_bias[...].astype(dt)
            v = v + self.v_bias[...].astype(dt)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            freqs = self.rope_frequencies
            freqs = None if freqs is None else jnp.asarray(freqs, jnp.float32)
            q = apply_rope(q, positions, base=self.rope_base, layout=self.rope_layout,
                           frequencies=freqs)
            k = apply_rope(k, positions, base=self.rope_base, layout=self.rope_layout,
                           frequencies=freqs)
        return q, k, v

    def _through_cache(self, x, k, v, cache: KVCache, segment_ids, mask):
        """Writes the new k, v at ``cache.index`` and attends over the whole cache.

        Returns ``(k, v, segment_ids, kv_segment_ids, mask, cache)``: the cache's keys,
        values and segment ids, the new tokens' segment ids (default 0), and ``mask``
        with the step's causal mask (:func:`cache_mask`) and window
        (:func:`cache_window_mask`) folded in.
        """
        if (gap := kv_cache_gap(self.attention_fn, causal=self.causal)) is not None:
            raise ValueError(f"Attention: {gap}")
        b, t = x.shape[:2]
        if cache.k.shape[0] != b or cache.k.shape[2:] != k.shape[2:]:
            raise ValueError(f"Attention: cache k {cache.k.shape} does not fit keys "
                             f"{k.shape} ([B, S_max, Hkv, D])")
        if t > cache.k.shape[1]:
            raise ValueError(f"Attention: {t} new tokens exceed cache length "
                             f"{cache.k.shape[1]}")
        if segment_ids is None:
            segment_ids = jnp.zeros((b, t), jnp.int32)
        step_mask = cache_mask(cache.index, t, cache.k.shape[1], causal=self.causal)
        if step_mask is not None:
            mask = step_mask if mask is None else jnp.logical_and(step_mask, mask)
        index = cache.index
        cache = update_kv_cache(cache, k, v, segment_ids)
        if self.local_window_size is not None:
            win = cache_window_mask(cache.segment_ids, index, t, self.local_window_size)
            mask = win if mask is None else jnp.logical_and(win, mask)
        return cache.k, cache.v, segment_ids, cache.segment_ids, mask, cache

    def _window(self, q, k, mask, options: dict, *, cached: bool):
        """``(mask, tap_mask)`` with the sliding window (without a cache): a spec gets it
        as ``options["local_window_size"]`` (set here), a plain callable in its mask;
        ``tap_mask`` has it folded in for the weights tap."""
        tap_mask = mask  # the window folded in, for the weights tap
        if self.local_window_size is not None and not cached:
            native = isinstance(self.attention_fn, AttentionSpec)
            if not native or self.attention_weights.enabled:
                tap_mask = build_mask(q.shape[1], k.shape[1], mask=mask,
                                      window=self.local_window_size)
            if native:  # the spec skips key blocks outside the window
                options["local_window_size"] = self.local_window_size
            else:  # a plain callable: in its mask
                mask = tap_mask
        return mask, tap_mask

    def _sow_taps(self, q, k, v, *, causal, tap_mask, segment_ids, kv_segment_ids,
                  options: dict) -> None:
        """Sows the enabled taps: the variant's inputs and its dense weights."""
        if self.attention_inputs.enabled:
            self.attention_inputs({"q": q, "k": k, "v": v,
                                   "scale": default_scale(q.shape[-1], self.scale)})
        if self.attention_weights.enabled:
            if "alibi_slopes" in options:
                raise ValueError("Attention: the attention-weights tap does not include the "
                                 "ALiBi bias of position='nape' yet (lcjax.attention.weights "
                                 "takes no alibi_slopes)")
            self.attention_weights(self._weights_fn()(
                q, k, causal=causal, mask=tap_mask, scale=self.scale, q_segment_ids=segment_ids,
                kv_segment_ids=kv_segment_ids,
                **{key: val for key, val in options.items() if key != "local_window_size"}))

    def _context_parallel(self, x, positions, segment_ids, mask):
        """The layer by ``lcjax.parallel.layer_apply(self.context_parallel, ...)`` over the
        mesh set with ``jax.set_mesh`` (decoding with a cache runs on one device)."""
        cp = self.context_parallel
        unsupported = [what for what, used in (
            ("segment_ids", segment_ids is not None), ("mask", mask is not None),
            ("position='nape'", self.position == "nape"),
            ("rope_layout='interleaved'", self.use_rope and self.rope_layout != "half"),
            ("variant parameters (learn=...)", self.variant_params is not None),
            ("attention taps", self.attention_weights.enabled or self.attention_inputs.enabled),
            ("qkv_bias/out_bias", self.q_bias is not None or self.o_bias is not None),
            ("qk_norm", self.q_norm is not None),
            ("rope_scaling", self.rope_frequencies is not None),
            ("local_window_size", self.local_window_size is not None),
        ) if used]
        if unsupported:
            raise ValueError(f"Attention: context_parallel={cp!r} does not support "
                             f"{', '.join(unsupported)}")
        b, t = x.shape[:2]
        positions = jnp.broadcast_to(positions, (b, t))
        params = {n: getattr(self, n)[...] for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
        return layer_apply(cp, params, x, positions, causal=self.causal,
                           variant=self.attention_fn, scale=self.scale,
                           rope_base=self.rope_base if self.use_rope else None,
                           **self.attention_options).astype(self.dtype)


def capture_attention(model: nnx.Module, *args, tap: str = "weights",
                      **kwargs) -> tuple[Any, list]:
    """Run ``model(*args, **kwargs)`` with every :class:`AttentionTap` called ``tap``
    enabled and return ``(output, values)``.

    ``tap="weights"``: one float32 [B, H, T, S] array of attention weights per
    (:class:`Attention` layer, call); ``tap="inputs"``: one ``{"q", "k", "v", "scale"}``
    dict per (layer, call), what the variant received. Layers come in module order
    (``model.blocks[0]`` first), calls in order. The taps are restored afterwards; the
    output is what the model returns without them. Works eagerly and inside ``jax.jit``
    / ``nnx.jit`` (wrap the whole call).
    """
    if tap not in TAPS:
        raise ValueError(f"capture_attention: `tap` must be one of {TAPS}, got {tap!r}")
    taps = [t for _, t in nnx.iter_modules(model) if isinstance(t, AttentionTap)
            and t.name == tap]
    if not taps:
        raise ValueError(f"capture_attention: {type(model).__name__} has no Attention layer "
                         f"(no AttentionTap {tap!r})")
    before = [t.enabled for t in taps]
    for t in taps:
        t.enabled = True
    try:
        out, sown = nnx.capture(lambda m: m(*args, **kwargs), nnx.Intermediate)(model)
    finally:
        for t, was in zip(taps, before):
            t.enabled = was
    values = []
    for path, t in nnx.iter_modules(model):
        if isinstance(t, AttentionTap) and t.name == tap:
            node = sown
            try:
                for key in (*path, tap):
                    node = node[key]
            except (KeyError, IndexError, TypeError):
                continue  # a layer the call did not run
            values.extend(node.get_value() if isinstance(node, nnx.Variable) else node)
    return out, values
