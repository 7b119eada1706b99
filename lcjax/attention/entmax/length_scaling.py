r"""Length scaling of attention queries: ASEntmax and the scalable-softmax (SSMax) baseline.

ASEntmax (Vasylenko, Pitorro, Martins & Treviso, "Long-Context Generalization with Sparse
Attention", ICLR 2026; code deep-spin/asentmax) multiplies each query of a scaled head by a
factor that grows with the number of keys it can see, before the α-entmax mapping, so that
attention can stay sharp as contexts grow:

    q_i ← q_i · (δ + β_h · (log n_i)^{γ_h})             ("asentmax", α-entmax after it)

with β, γ learned per head (or input-dependent, β = softplus(W_β h_i), γ = r·tanh(W_γ h_i);
``lcjax.nn.variant_params``). Scalable-softmax (Nakanishi, "Scalable-Softmax Is Superior for
Attention", 2025; the "nakanishi" variant of the ASEntmax code) is the softmax baseline:

    q_i ← q_i · s_h · log n_i                           ("ssmax", blockwise softmax after it)

**Our n.** n_i = 1 + c_i, where c_i is the number of keys query i may see (causal, the mask
and the segment ids together), floored so that n_i ≥ 2 (a row that sees nothing returns
zeros anyway; the floor keeps its gradient finite). For one causal document c_i = i + 1, so
log n_i = log(i + 2): exactly the paper's ``log(pos + 2)``. Counting visible keys instead of
reading positions makes KV-cache decoding (a causal mask over the cache's slots) equal the
full pass, and makes packed documents count only their own keys. The counts are computed
without the [T, S] matrix when no explicit mask is given (closed form for causal/none; a
stable sort of the key segment ids and binary searches for segment ids,
:func:`visible_key_counts`); an explicit mask is counted densely (it is dense already).

The scaling is a pre-multiply of q, so every implementation of the underlying method gets it
unchanged — the XLA path and the Pallas kernel of entmax, blockwise softmax — and the
gradients w.r.t. β, γ, δ and s come from autodiff through q' = q · factor (each
implementation's own backward gives dq'). ``length_heads`` (bool [H]) limits the scaling to
some heads (the others get factor 1): with NAPE positions the paper scales only the NoPE
heads.

Specs declared here: ``"asentmax"`` (implementations ``"pallas"`` and ``"xla"`` of
``"entmax"``, options ``alpha`` — default 1.5, a number or [H] —, ``length_beta``,
``length_gamma``, ``length_delta``, ``length_heads``, ALiBi as entmax) and ``"ssmax"``
(blockwise softmax, options ``length_s``, ``length_heads``). ``docs/entmax.md`` has the
section on both.
"""

from __future__ import annotations

import functools
import inspect
import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from lcjax.attention.base import AttentionSpec, Implementation, LearnedParams
from lcjax.attention.core import (
    build_mask,
    dot_product_attention,
    stat_dtype,
    validate_qkv,
    window_size,
)
from lcjax.attention.entmax.method import ENTMAX
from lcjax.attention.entmax.reference import entmax_attention_reference
from lcjax.attention.softmax import BLOCKWISE

__all__ = ["ASENTMAX", "ASENTMAX_DEFAULTS", "SSMAX", "SSMAX_DEFAULTS", "asentmax_factor",
           "asentmax_reference", "length_factor", "log_length", "scale_queries",
           "ssmax_factor", "ssmax_reference", "visible_key_counts"]

# Defaults of a call that does not learn them (the params factories learn them per head).
ASENTMAX_DEFAULTS = {"length_beta": 0.5, "length_gamma": 1.0, "length_delta": 1.0,
                     "length_heads": None}
SSMAX_DEFAULTS = {"length_s": 1.0, "length_heads": None}


# ----------------------------------------------------------------------------
# n_i: the number of keys each query may see
# ----------------------------------------------------------------------------
def _segment_counts(q_seg: Int[Array, "B T"], kv_seg: Int[Array, "B S"], q_pos, causal: bool):
    """#{j : kv_seg[j] = q_seg[i] (and j ≤ q_pos[i] if causal)} per row, by one stable sort
    of the key segment ids and binary searches (O((T + S) log S), no [T, S] matrix)."""
    s = kv_seg.shape[1]
    order = jnp.argsort(kv_seg, axis=-1, stable=True)  # within a segment, keys stay in order
    sorted_seg = jnp.take_along_axis(kv_seg, order, axis=-1)
    lo = jax.vmap(lambda a, x: jnp.searchsorted(a, x, side="left"))(sorted_seg, q_seg)
    hi = jax.vmap(lambda a, x: jnp.searchsorted(a, x, side="right"))(sorted_seg, q_seg)
    if causal:  # first index in [lo, hi) whose key position exceeds q_pos (positions ascend)
        a, b = lo, hi
        for _ in range(max(1, math.ceil(math.log2(s + 1)))):
            mid = (a + b) // 2
            pos = jnp.take_along_axis(order, jnp.clip(mid, 0, s - 1), axis=-1)
            right = (a < b) & (pos <= q_pos)
            a, b = jnp.where(right, mid + 1, a), jnp.where(right | (a >= b), b, mid)
        hi = a
    return jnp.where(q_seg >= 0, hi - lo, 0).astype(jnp.int32)


def visible_key_counts(q_len: int, kv_len: int, *, causal: bool = False, mask=None,
                       q_segment_ids=None, kv_segment_ids=None,
                       q_offset=0, window: tuple[int, int] | None = None
                       ) -> Int[Array, "b T h"]:
    """c_i: how many keys query i may see, int32 [b, T, h] (b ∈ {1, B}, h ∈ {1, H}).

    The visibility is the attention contract's: causal (j ≤ i + q_offset), ``mask`` (bool,
    broadcastable to [B, H, T, S]) and segment ids (int [B, T], [B, S]; negative = padding,
    sees nothing). Without ``mask`` the [T, S] matrix is never built: causal alone is
    min(i + q_offset + 1, S) clipped at 0, segment ids are counted by a sort and binary
    searches. With a ``mask`` the combined mask is summed (the mask is dense already).
    A sliding ``window`` (left, right) (``lcjax.attention.core.window_mask``) alone or with
    causal is counted in closed form, with segment ids densely.
    """
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("visible_key_counts: pass both `q_segment_ids` and `kv_segment_ids`, "
                         "or neither")
    if mask is not None or (window is not None and q_segment_ids is not None):
        full = build_mask(q_len, kv_len, causal=causal, mask=mask, q_segment_ids=q_segment_ids,
                          kv_segment_ids=kv_segment_ids, q_offset=q_offset, window=window)
        full = jnp.broadcast_to(full, full.shape[:2] + (q_len, kv_len))
        return jnp.moveaxis(jnp.sum(full, axis=-1, dtype=jnp.int32), 1, 2)
    q_pos = jnp.arange(q_len, dtype=jnp.int32) + q_offset
    if window is not None:  # keys max(0, p - left) .. min(S - 1, p + right, p if causal)
        hi = q_pos if causal else q_pos + window[1]
        hi = jnp.minimum(hi, kv_len - 1)
        lo = jnp.maximum(q_pos - window[0], 0)
        return jnp.maximum(hi - lo + 1, 0).astype(jnp.int32)[None, :, None]
    if q_segment_ids is None:
        if causal:
            return jnp.clip(q_pos + 1, 0, kv_len).astype(jnp.int32)[None, :, None]
        return jnp.full((1, q_len, 1), kv_len, jnp.int32)
    q_seg = jnp.asarray(q_segment_ids, jnp.int32)
    kv_seg = jnp.asarray(kv_segment_ids, jnp.int32)
    q_pos = jnp.broadcast_to(q_pos, q_seg.shape)
    return _segment_counts(q_seg, kv_seg, q_pos, causal)[..., None]


def log_length(counts: Int[Array, "b T h"], dtype=jnp.float32) -> Float[Array, "b T h"]:
    """log n_i with n_i = 1 + max(c_i, 1): log(pos + 2) for one causal document."""
    return jnp.log(1.0 + jnp.maximum(counts, 1).astype(dtype))


# ----------------------------------------------------------------------------
# The factors
# ----------------------------------------------------------------------------
def asentmax_factor(log_n: Float[Array, "b T h"], beta, gamma, delta=1.0) -> Array:
    """δ + β · (log n)^γ (ASEntmax), broadcast over [b, T, H]; log n ≥ log 2 > 0."""
    return delta + beta * jnp.power(log_n, gamma)


def ssmax_factor(log_n: Float[Array, "b T h"], s) -> Array:
    """s · log n (scalable softmax), broadcast over [b, T, H]."""
    return s * log_n


def _per_head(value, name: str, batch: int, q_len: int, heads: int, dtype, method: str):
    """``value`` (a number, [H], or anything broadcastable to [B, T, H]) as an array of
    ``dtype``; ``ValueError`` naming ``name`` for another shape."""
    arr = jnp.asarray(value)
    want = (batch, q_len, heads)
    try:
        ok = arr.ndim <= 3 and jnp.broadcast_shapes(arr.shape, want) == want
    except ValueError:
        ok = False
    if not ok or not (jnp.issubdtype(arr.dtype, jnp.floating)
                      or jnp.issubdtype(arr.dtype, jnp.integer)):
        raise ValueError(f"{method}: `{name}` must be a real number, an array [heads] = "
                         f"({heads},) or one broadcastable to [batch, q_len, heads] = "
                         f"{list(want)}, got shape {arr.shape} and dtype {arr.dtype}")
    return arr.astype(dtype)


def _heads_mask(length_heads, heads: int, method: str):
    if length_heads is None:
        return None
    arr = jnp.asarray(length_heads)
    if arr.shape != (heads,) or arr.dtype != jnp.bool_:
        raise ValueError(f"{method}: `length_heads` must be None or bool [heads] = ({heads},), "
                         f"got shape {arr.shape} and dtype {arr.dtype}")
    return arr


def length_factor(kind: str, q, k, *, causal=False, mask=None, q_segment_ids=None,
                  kv_segment_ids=None, q_offset=0, counts=None, window=None,
                  **params) -> Array:
    """The per-query factor [b, T, H] (statistics dtype) of ``kind`` ("asentmax": params
    ``length_beta``, ``length_gamma``, ``length_delta``; "ssmax": ``length_s``; both
    ``length_heads``), n_i from :func:`visible_key_counts` unless ``counts`` are given."""
    method = {"asentmax": "asentmax_attention", "ssmax": "ssmax_attention"}[kind]
    b, t, h = q.shape[:3]
    acc = stat_dtype(q, k)
    if counts is None:
        counts = visible_key_counts(t, k.shape[1], causal=causal, mask=mask,
                                    q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                                    q_offset=q_offset, window=window)
    log_n = log_length(counts, acc)
    arg = functools.partial(_per_head, batch=b, q_len=t, heads=h, dtype=acc, method=method)
    if kind == "asentmax":
        factor = asentmax_factor(log_n, arg(params["length_beta"], "length_beta"),
                                 arg(params["length_gamma"], "length_gamma"),
                                 arg(params["length_delta"], "length_delta"))
    else:
        factor = ssmax_factor(log_n, arg(params["length_s"], "length_s"))
    factor = jnp.broadcast_to(factor, jnp.broadcast_shapes(factor.shape, (1, t, h)))
    heads = _heads_mask(params.get("length_heads"), h, method)
    if heads is not None:
        factor = jnp.where(heads, factor, jnp.ones((), acc))
    return factor


def scale_queries(q: Float[Array, "B T H D"], factor: Float[Array, "b T H"]) -> Array:
    """q_i · factor_i, computed in the factor's dtype and returned in q's dtype."""
    return (q.astype(factor.dtype) * factor[..., None]).astype(q.dtype)


# ----------------------------------------------------------------------------
# References (dense counts, independent of the sort-based ones)
# ----------------------------------------------------------------------------
def _dense_counts(q, k, causal, mask, q_segment_ids, kv_segment_ids, window=None, q_offset=0):
    full = build_mask(q.shape[1], k.shape[1], causal=causal, mask=mask,
                      q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                      window=window, q_offset=q_offset)
    if full is None:
        return jnp.full((1, q.shape[1], 1), k.shape[1], jnp.int32)
    full = jnp.broadcast_to(full, full.shape[:2] + (q.shape[1], k.shape[1]))
    return jnp.moveaxis(full.sum(-1, dtype=jnp.int32), 1, 2)


def asentmax_reference(q: Float[Array, "B T H D"], k: Float[Array, "B S Hkv D"],
                       v: Float[Array, "B S Hkv Dv"], *, causal=False, mask=None, scale=None,
                       q_segment_ids=None, kv_segment_ids=None, alpha=1.5,
                       length_beta=ASENTMAX_DEFAULTS["length_beta"],
                       length_gamma=ASENTMAX_DEFAULTS["length_gamma"],
                       length_delta=ASENTMAX_DEFAULTS["length_delta"], length_heads=None,
                       alibi_slopes=None, alibi_offset=0,
                       local_window_size=None) -> Float[Array, "B T H Dv"]:
    """Dense ASEntmax: q_i · (δ + β (log n_i)^γ), n_i from the dense mask, then
    :func:`lcjax.attention.entmax.reference.entmax_attention_reference`."""
    validate_qkv(q, k, v, mask=mask, name="asentmax_reference")
    window = window_size(local_window_size, name="asentmax_reference")
    counts = _dense_counts(q, k, causal, mask, q_segment_ids, kv_segment_ids, window)
    factor = length_factor("asentmax", q, k, counts=counts, length_beta=length_beta,
                           length_gamma=length_gamma, length_delta=length_delta,
                           length_heads=length_heads)
    return entmax_attention_reference(
        scale_queries(q, factor), k, v, alpha=alpha, causal=causal, mask=mask, scale=scale,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, alibi_slopes=alibi_slopes,
        alibi_offset=alibi_offset, local_window_size=window)


def ssmax_reference(q: Float[Array, "B T H D"], k: Float[Array, "B S Hkv D"],
                    v: Float[Array, "B S Hkv Dv"], *, causal=False, mask=None, scale=None,
                    q_segment_ids=None, kv_segment_ids=None,
                    length_s=SSMAX_DEFAULTS["length_s"], length_heads=None, q_offset=0,
                    return_lse=False, alibi_slopes=None, alibi_offset=0,
                    local_window_size=None):
    """Dense SSMax: q_i · s (log n_i), n_i from the dense mask, then
    :func:`lcjax.attention.core.dot_product_attention`."""
    validate_qkv(q, k, v, mask=mask, name="ssmax_reference")
    window = window_size(local_window_size, name="ssmax_reference")
    counts = _dense_counts(q, k, causal, mask, q_segment_ids, kv_segment_ids, window, q_offset)
    factor = length_factor("ssmax", q, k, counts=counts, length_s=length_s,
                           length_heads=length_heads)
    return dot_product_attention(
        scale_queries(q, factor), k, v, causal=causal, mask=mask, scale=scale,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, q_offset=q_offset,
        return_lse=return_lse, alibi_slopes=alibi_slopes, alibi_offset=alibi_offset,
        local_window_size=window)


# ----------------------------------------------------------------------------
# Implementations: the underlying method's, with q pre-multiplied
# ----------------------------------------------------------------------------
def _scaled(base: Implementation, kind: str, defaults: dict) -> Implementation:
    """``base`` with the length-scaling options of ``kind`` added to its signature: the
    factor is computed here and q pre-multiplied, then ``base.fn`` runs unchanged."""
    base_fn = base.fn

    def fn(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
           kv_segment_ids=None, return_aux=False, **options):
        params = {name: options.pop(name, default) for name, default in defaults.items()}
        validate_qkv(q, k, v, mask=mask, name=f"{kind}_attention")
        factor = length_factor(kind, q, k, causal=causal, mask=mask,
                               q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                               q_offset=options.get("q_offset", 0),
                               window=options.get("local_window_size"), **params)
        return base_fn(scale_queries(q, factor), k, v, causal=causal, mask=mask, scale=scale,
                       q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                       return_aux=return_aux, **options)

    sig = inspect.signature(base_fn)
    params = [p for p in sig.parameters.values() if p.name not in defaults]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
             for name, default in defaults.items()]
    tail = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
    params = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
    fn.__signature__ = sig.replace(parameters=params + extra + tail)
    fn.__name__ = f"{kind}_{base.name}"
    fn.__doc__ = f"{base.name} implementation of {kind}: q pre-multiplied by the length factor."
    return Implementation(base.name, fn, features=base.features, config=base.config,
                          check_vma=base.check_vma, skip_unless_named=base.skip_unless_named)


ASENTMAX = AttentionSpec(
    "asentmax", reference=asentmax_reference,
    implementations=tuple(_scaled(impl, "asentmax", ASENTMAX_DEFAULTS)
                          for impl in ENTMAX.implementations),
    features=ENTMAX.features, aux=ENTMAX.aux,
    params=LearnedParams("asentmax_params"),
    test_options={**ENTMAX.test_options, "length_beta": 0.6, "length_gamma": 0.7,
                  "length_delta": 0.9},
    description="ASEntmax: alpha-entmax with learned length scaling of the queries")

SSMAX = AttentionSpec(
    "ssmax", reference=ssmax_reference,
    implementations=tuple(_scaled(impl, "ssmax", SSMAX_DEFAULTS)
                          for impl in BLOCKWISE.implementations),
    features=BLOCKWISE.features, aux=BLOCKWISE.aux,
    params=LearnedParams("ssmax_params"),
    test_options={**BLOCKWISE.test_options, "length_s": 0.8},
    description="scalable softmax (SSMax): blockwise softmax of s·log(n)-scaled queries")
