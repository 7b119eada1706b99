"""Dense attention scores and weights, for taps, analysis and probing (not for speed).

    scores[b,h,i,j] = scale · q[b,i,h] · k[b,j,h//G]       (-inf where masked)
    weights[b,h,i,:] = softmax_j(scores[b,h,i,:])          (a row with no key: zeros)

q: [B, T, H, D]; k: [B, S, Hkv, D] (G = H / Hkv); both results are float32
[B, H, T, S] whatever the input dtype. Masking is the one of every variant: ``causal``
(query i sees keys j <= i + q_offset), ``mask`` (bool, broadcastable to [B, H, T, S])
and segment ids (int [B, T], [B, S]; negative = padding), combined by
:func:`lcjax.attention.core.build_mask`.

``variant_weights(fn)`` is the weights function of a variant: a spec's ``weights``
field where it declares one, softmax weights for a spec whose reference is the
softmax reference (``softmax``, ``blockwise``, ``jax``), and ``None`` otherwise (the
weights of an arbitrary callable are not known). ``lcjax.nn.Attention`` uses it for its
attention-weights tap.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from lcjax.attention.base import AttentionSpec
from lcjax.attention.core import dot_product_attention, grouped_scores, softmax_rows

__all__ = ["attention_scores", "attention_weights", "softmax_weights", "variant_weights"]


def _check_qk(q, k, name: str) -> None:
    for arg, x in (("q", q), ("k", k)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name}: `{arg}` must have rank 4 [batch, len, heads, head_dim], "
                             f"got shape {getattr(x, 'shape', None)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"{name}: q {q.shape} and k {k.shape} must agree on batch and "
                         f"head_dim ([B, T, H, D] and [B, S, Hkv, D])")
    if k.shape[2] <= 0 or q.shape[2] % k.shape[2]:
        raise ValueError(f"{name}: q heads ({q.shape[2]}) must be a multiple of kv_heads "
                         f"({k.shape[2]}); q {q.shape}, k {k.shape}")


def attention_scores(q, k, *, causal: bool = False, mask=None, scale: float | None = None,
                     q_segment_ids=None, kv_segment_ids=None, q_offset=0) -> jax.Array:
    """float32 scores [B, H, T, S] = scale · q·kᵀ (key head h // G), ``-inf`` where masked.

    Args: q [B, T, H, D]; k [B, S, Hkv, D]; the masking arguments of every variant
    (module docstring); ``scale`` defaults to 1/sqrt(D).
    """
    _check_qk(q, k, "attention_scores")
    b, t, h, _ = q.shape
    scores = grouped_scores(q.astype(jnp.float32), k.astype(jnp.float32), causal=causal,
                            mask=mask, scale=scale, q_segment_ids=q_segment_ids,
                            kv_segment_ids=kv_segment_ids, q_offset=q_offset)
    return scores.reshape(b, h, t, k.shape[1])


def attention_weights(q, k, *, causal: bool = False, mask=None, scale: float | None = None,
                      q_segment_ids=None, kv_segment_ids=None, q_offset=0) -> jax.Array:
    """float32 softmax attention weights [B, H, T, S] (rows sum to 1; a row that sees no
    key is all zeros). Arguments as :func:`attention_scores`; ``out = Σ_j w[..., j] v_j``
    is :func:`lcjax.attention.core.dot_product_attention`."""
    scores = attention_scores(q, k, causal=causal, mask=mask, scale=scale,
                              q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                              q_offset=q_offset)
    return softmax_rows(scores)[0]


def softmax_weights(q, k, *, causal: bool = False, mask=None, scale: float | None = None,
                    q_segment_ids=None, kv_segment_ids=None, **options) -> jax.Array:
    """:func:`attention_weights` under the weights signature of a variant (its options —
    block sizes, ``implementation``, ... — do not change softmax weights and are ignored)."""
    del options
    return attention_weights(q, k, causal=causal, mask=mask, scale=scale,
                             q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)


def variant_weights(fn: Callable) -> Callable | None:
    """The weights function ``w(q, k, *, causal, mask, scale, q_segment_ids,
    kv_segment_ids, **options) -> [B, H, T, S]`` of variant ``fn``, or None if unknown.

    A spec's own ``weights`` (when the spec declares one) wins; a spec whose reference
    is the softmax reference gets :func:`softmax_weights`; a plain callable gets None.
    """
    if not isinstance(fn, AttentionSpec):
        return None
    own = getattr(fn, "weights", None)
    if own is not None:
        return own
    return softmax_weights if fn.reference is dot_product_attention else None
