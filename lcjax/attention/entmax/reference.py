"""The dense reference of α-entmax attention: the one exact function every implementation
of the ``"entmax"`` spec (and ASEntmax's, through ``length_scaling``) is compared with."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from lcjax.attention.blocks import alibi_slopes_array
from lcjax.attention.core import alibi_bias, build_mask, stat_dtype, validate_qkv, window_size
from lcjax.attention.entmax.config import NAME, parse_alpha
from lcjax.attention.entmax.mapping import entmax

__all__ = ["entmax_attention_reference"]


def entmax_attention_reference(
    q: Float[Array, "B T H D"], k: Float[Array, "B S Hkv D"], v: Float[Array, "B S Hkv Dv"],
    *, alpha=1.5, causal: bool = False, mask: Bool[Array, "..."] | None = None,
    scale: float | None = None, q_segment_ids: Int[Array, "B T"] | None = None,
    kv_segment_ids: Int[Array, "B S"] | None = None, alibi_slopes=None, alibi_offset=0,
    local_window_size=None,
) -> Float[Array, "B T H Dv"]:
    """Dense exact α-entmax attention under the full contract (mask, segment ids, GQA,
    array α, ALiBi ``alibi_slopes`` [H] / ``alibi_offset``, the sliding window
    ``local_window_size`` of ``lcjax.attention.core.window_mask``): the [B, H, T, S]
    scores (plus ``lcjax.attention.core.alibi_bias``), ``lcjax.attention.entmax.mapping.
    entmax`` over keys (the exact sort for α ∈ {1.5, 2}, bisection to rounding otherwise)
    and p·V."""
    shapes = validate_qkv(q, k, v, mask=mask, name="entmax_attention_reference")
    a_static, a_arr = parse_alpha(alpha, shapes.heads)
    acc = stat_dtype(q, k, v)
    g = shapes.groups
    scale = 1.0 / np.sqrt(shapes.head_dim) if scale is None else scale
    kk = jnp.repeat(k, g, axis=2).astype(acc)
    x = scale * jnp.einsum("bthd,bshd->bhts", q.astype(acc), kk)
    if alibi_slopes is not None:
        slopes = alibi_slopes_array(alibi_slopes, shapes.heads, dtype=acc, name=NAME)
        x = x + alibi_bias(shapes.q_len, shapes.kv_len, slopes, q_offset=alibi_offset,
                           dtype=acc)[None]
    full = build_mask(shapes.q_len, shapes.kv_len, causal=causal, mask=mask,
                      q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                      window=window_size(local_window_size, name=NAME))
    if full is not None:
        x = jnp.where(full, x, -jnp.inf)
    if a_static in (1.5, 2.0):
        p = entmax(x, a_static, axis=-1, method="sort")
    else:
        a = a_static if a_arr is None else a_arr.astype(acc)[None, :, None, None]
        p = entmax(x, a, axis=-1, method="bisect", n_iter=200, tol=1e-30)
    vv = jnp.repeat(v, g, axis=2).astype(acc)
    return jnp.einsum("bhts,bshd->bthd", p, vv).astype(q.dtype)
