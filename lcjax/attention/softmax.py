"""Softmax attention: one method, ``"softmax"``, with three implementations — the exact
reference (``xla``), blockwise online softmax (``blockwise``) and the
``jax.nn.dot_product_attention`` anchor (``jax``).

All three compute

    out[b,i,h] = sum_j softmax_j(scale * q[b,i,h] . k[b,j,h//G] + log mask) v[b,j,h//G]

(``G = heads / kv_heads``), with a row that sees no key returning zeros, and are
compared with :func:`lcjax.attention.core.dot_product_attention` by the conformance
suite (``tests/attention/conformance.py``). See ``docs/attention.md``.

- ``xla``: :func:`~lcjax.attention.core.dot_product_attention`, dense [T, S]
  scores — the reference itself; the default.
- ``blockwise``: :func:`~lcjax.attention.core.blockwise_attention`, the online
  softmax of FlashAttention in XLA, configured by :class:`BlockwiseConfig`.
- ``jax``: :func:`jax_dot_product_attention`, ``jax.nn.dot_product_attention`` with
  the XLA implementation, the anchor ``lcjax bench attention`` times against.

The specs ``"blockwise"`` and ``"jax"`` (methods of their own before) stay, for a release,
as aliases of the last two (:meth:`~lcjax.attention.AttentionSpec.alias`): same calls,
same results, their one implementation named ``"xla"`` as before.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from lcjax.attention.base import AttentionSpec, Features, Implementation, with_empty_aux
from lcjax.attention.core import (
    blockwise_attention,
    build_mask,
    dot_product_attention,
    validate_bias,
    validate_qkv,
    window_size,
)

__all__ = ["BLOCKWISE", "JAX", "SOFTMAX", "BlockwiseConfig", "jax_dot_product_attention"]


@dataclasses.dataclass(frozen=True)
class BlockwiseConfig:
    """Tile sizes of blockwise attention (clipped to T and S; lengths need not divide
    them). Memory per (batch, head) is O(block_q * block_kv)."""

    block_q: int = 512
    block_kv: int = 512

    def __post_init__(self):
        for field in ("block_q", "block_kv"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"BlockwiseConfig: `{field}` must be a positive int, "
                                 f"got {value!r}")


def jax_dot_product_attention(
    q: Float[Array, "B T H D"],
    k: Float[Array, "B S Hkv D"],
    v: Float[Array, "B S Hkv D"],
    *,
    causal: bool = False,
    mask: Bool[Array, "..."] | None = None,
    scale: float | None = None,
    q_segment_ids: Int[Array, "B T"] | None = None,
    kv_segment_ids: Int[Array, "B S"] | None = None,
    bias: Float[Array, "..."] | None = None,
    local_window_size: int | tuple[int, int] | None = None,
) -> Float[Array, "B T H D"]:
    """``jax.nn.dot_product_attention`` (XLA) under our contract.

    ``bias`` (broadcastable to [B, H, T, S]) and ``local_window_size`` go to
    ``jax.nn.dot_product_attention`` as they are.

    q: [B, T, H, D]; k, v: [B, S, Hkv, D] -> [B, T, H, D]. Segment ids (int [B, T],
    [B, S], negative = padding) are folded into the mask. ``jax.nn`` gives a row with
    no visible key the mean of ``v`` (a softmax over equal large negative scores); the
    contract wants zeros, so such rows are zeroed. Without a mask or segment ids every
    row sees key 0 (causal alignment is top-left) and the call is exactly
    ``jax.nn.dot_product_attention(..., is_causal=causal)``.

    float16 on CPU: jax's XLA path asks for the ``F16_F16_F32`` dot algorithm, which
    the CPU backend rejects under ``jit`` (jax 0.10.2; its eager fallback does not apply
    inside ``jit``), so there float16 inputs are computed in float32 and the output cast
    back to float16.
    """
    name = "jax_dot_product_attention"
    shapes = validate_qkv(q, k, v, mask=mask, name=name)
    validate_bias(bias, shapes, name=name)
    window = window_size(local_window_size, name=name)
    if q.dtype == jnp.float16 and jax.default_backend() == "cpu":
        up = lambda x: x.astype(jnp.float32)
        out = jax_dot_product_attention(up(q), up(k), up(v), causal=causal, mask=mask,
                                        scale=scale, q_segment_ids=q_segment_ids,
                                        kv_segment_ids=kv_segment_ids,
                                        bias=None if bias is None else up(bias),
                                        local_window_size=window)
        return out.astype(q.dtype)
    full = build_mask(shapes.q_len, shapes.kv_len, mask=mask, q_segment_ids=q_segment_ids,
                      kv_segment_ids=kv_segment_ids)
    if bias is not None:
        bias = jnp.asarray(bias)
        bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
    out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=full, scale=scale,
                                       is_causal=causal, local_window_size=window,
                                       implementation="xla")
    visible = build_mask(shapes.q_len, shapes.kv_len, causal=causal, mask=full, window=window)
    if full is None and window is None:
        return out
    seen = jnp.any(visible, axis=-1)  # [b|1, h|1, T]
    seen = jnp.moveaxis(seen, 1, 2)[..., None]  # [b|1, T, h|1, 1]
    return jnp.where(seen, out, jnp.zeros((), out.dtype))


_BLOCKWISE_FEATURES = Features(lse=True, window=True)
_JAX_FEATURES = Features(bias=True, window=True, dtypes=("float32", "bfloat16", "float16"))

SOFTMAX = AttentionSpec(
    "softmax", reference=dot_product_attention,
    implementations=(
        Implementation("xla", with_empty_aux(dot_product_attention)),
        Implementation("blockwise", with_empty_aux(blockwise_attention),
                       features=_BLOCKWISE_FEATURES, config=BlockwiseConfig),
        Implementation("jax", with_empty_aux(jax_dot_product_attention),
                       features=_JAX_FEATURES)),
    features=Features(lse=True, bias=True, window=True), test_options={"block_q": 8, "block_kv": 8},
    description="exact softmax attention: dense [T, S] scores (xla, the reference), online "
                "softmax (blockwise) or jax.nn.dot_product_attention (jax)")

# the names of the methods merged into "softmax", kept (for a release) as aliases
BLOCKWISE = SOFTMAX.alias("blockwise", "blockwise",
                          description="online-softmax (FlashAttention) attention in XLA")
JAX = SOFTMAX.alias("jax", "jax",
                    description="jax.nn.dot_product_attention (XLA), the anchor we time against")
