r"""Linear self-attention (no softmax) and its causal-masked form, as registered attention
variants, and the in-context regression predictor built on them.

The predictor is the one analysed in Li, Ding & Hu, "Understanding Generalization and
Forgetting in In-Context Continual Learning" (ICML 2026, arXiv:2605.28705): a prompt of
(x_i, y_i) pairs from T linear-regression tasks, one after the other, and a query x_q,

    ŷ(x_q) = x_qᵀ Γ (1/|P|) Σ_{i∈P} y_i x_i,

with P all pairs (unmasked linear self-attention, LSA) or only the pairs before the query
(causal-masked linear attention). Its expected error is in :mod:`lcjax.analysis.icl_theory`;
the derivation in ``docs/continual_icl.md``.

The attention variant ``"linear"`` (under the contract of ``docs/attention.md``), with s the
scale (default 1/√D) and V(i) the keys query i may see (causal: j ≤ i; the explicit mask;
same segment, non-negative ids)::

    out_i = s Σ_{j∈V(i)} (q_i·k_j) v_j / c_i,   c_i = |V(i)|  (normalize="count")
                                               c_i = 1       (normalize="none")

A row with no visible key is exactly 0. The XLA implementation picks the cheapest exact
form: non-causal without masks, one Kᵀ V [D, Dv] per head, O((T + S)·D·Dv); causal without
masks, a ``lax.scan`` over chunks of ``chunk`` keys carrying Σ k_j v_jᵀ of earlier chunks,
O(T·(C + D)·Dv); with a mask or segment ids, the dense [T, S] score matrix.
``linear_reference`` is the dense definition, the conformance suite's reference.
"""

from __future__ import annotations

import functools
import numbers

import jax
import jax.numpy as jnp

from lcjax.attention.base import AttentionSpec, Features, Implementation, with_empty_aux
from lcjax.attention.core import (
    build_mask,
    causal_linear_sums,
    default_scale,
    stat_dtype,
    validate_qkv,
)

__all__ = ["LINEAR", "NORMALIZATIONS", "icl_predict", "linear_attention", "linear_reference"]

NORMALIZATIONS = ("count", "none")


def _check_normalize(normalize, name):
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"{name}: `normalize` must be one of {NORMALIZATIONS}, "
                         f"got {normalize!r}")


def _heads_first(q, k, v, groups, acc):
    """q [B, T, H, D] -> [B, H, T, D]; k, v repeated over the GQA groups, in ``acc``."""
    qh = jnp.swapaxes(q.astype(acc), 1, 2)
    kh = jnp.repeat(jnp.swapaxes(k.astype(acc), 1, 2), groups, axis=1)
    vh = jnp.repeat(jnp.swapaxes(v.astype(acc), 1, 2), groups, axis=1)
    return qh, kh, vh


def _divide(num, count):
    """num [..., T, Dv] / count [..., T] with 0 where count is 0 (finite gradients)."""
    safe = jnp.where(count > 0, count, 1.0)
    return jnp.where((count > 0)[..., None], num / safe[..., None], 0.0)


def _dense(qh, kh, vh, visible, s, normalize):
    """Dense form: A = s Q Kᵀ ⊙ visible [B, H, T, S]; out = A V / c."""
    a = jnp.einsum("bhtd,bhsd->bhts", qh, kh) * s
    t, n = qh.shape[2], kh.shape[2]
    vis = jnp.ones((1, 1, t, n), bool) if visible is None else jnp.broadcast_to(
        visible, (qh.shape[0], qh.shape[1], t, n))
    a = jnp.where(vis, a, 0.0)
    num = jnp.einsum("bhts,bhsv->bhtv", a, vh)
    if normalize == "none":
        return jnp.where(vis.any(-1)[..., None], num, 0.0)
    return _divide(num, jnp.sum(vis, -1).astype(num.dtype))


@functools.partial(jax.jit, static_argnames=("chunk",))
def _causal_scan(qh, kh, vh, s, *, chunk):
    """Causal (top-left: query i sees keys j ≤ i) unnormalised sums s Σ_{j≤i} (q_i·k_j) v_j
    (the shared chunked scan, :func:`lcjax.attention.core.causal_linear_sums`)."""
    return causal_linear_sums(qh, kh, vh, chunk=chunk) * s


def linear_attention(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
                     kv_segment_ids=None, normalize="count", chunk=64):
    """Linear attention (module docstring). q [B, T, H, D]; k [B, S, Hkv, D];
    v [B, S, Hkv, Dv] -> [B, T, H, Dv] in q's dtype (accumulated in float32, or float64).

    ``normalize``: "count" divides row i by its number of visible keys, "none" does not.
    ``chunk``: keys per step of the causal scan (used only without mask and segment ids).
    """
    shapes = validate_qkv(q, k, v, mask=mask, name="linear_attention")
    _check_normalize(normalize, "linear_attention")
    if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or chunk < 1:
        raise ValueError(f"linear_attention: `chunk` must be a positive int, got {chunk!r}")
    acc = stat_dtype(q, k, v)
    s = default_scale(shapes.head_dim, scale)
    qh, kh, vh = _heads_first(q, k, v, shapes.groups, acc)
    t, n = shapes.q_len, shapes.kv_len
    if mask is not None or q_segment_ids is not None:
        visible = build_mask(t, n, causal=causal, mask=mask, q_segment_ids=q_segment_ids,
                             kv_segment_ids=kv_segment_ids)
        out = _dense(qh, kh, vh, visible, s, normalize)
    elif causal:
        num = _causal_scan(qh, kh, vh, jnp.asarray(s, acc), chunk=min(int(chunk), t))
        count = jnp.minimum(jnp.arange(1, t + 1), n).astype(acc)  # keys j <= i that exist
        out = num if normalize == "none" else num / count[:, None]
    else:
        kv = jnp.einsum("bhsd,bhsv->bhdv", kh, vh)
        out = jnp.einsum("bhtd,bhdv->bhtv", qh, kv) * s
        out = out if normalize == "none" else out / n
    return jnp.swapaxes(out, 1, 2).astype(q.dtype)


def linear_reference(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
                     kv_segment_ids=None, normalize="count"):
    """The definition, densely: out_i = s Σ_j [j ∈ V(i)] (q_i·k_j) v_j / c_i (0 when V(i)
    is empty); same shapes as :func:`linear_attention`."""
    shapes = validate_qkv(q, k, v, mask=mask, name="linear_reference")
    _check_normalize(normalize, "linear_reference")
    acc = stat_dtype(q, k, v)
    qh, kh, vh = _heads_first(q, k, v, shapes.groups, acc)
    visible = build_mask(shapes.q_len, shapes.kv_len, causal=causal, mask=mask,
                         q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
    out = _dense(qh, kh, vh, visible, default_scale(shapes.head_dim, scale), normalize)
    return jnp.swapaxes(out, 1, 2).astype(q.dtype)


def _xla(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
         kv_segment_ids=None, normalize="count", chunk=64):
    return linear_attention(q, k, v, causal=causal, mask=mask, scale=scale,
                            q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                            normalize=normalize, chunk=chunk)


LINEAR = AttentionSpec(
    "linear", reference=linear_reference,
    implementations=(Implementation("xla", with_empty_aux(_xla)),),
    features=Features(lse=False),
    test_options={"chunk": 8},
    description="linear self-attention without softmax (causal: masked linear attention)")


def icl_predict(xs, ys, xq, gamma, *, visible=None):
    """The in-context regression predictor ŷ = x_qᵀ Γ (1/|P|) Σ_{i∈P} y_i x_i, computed by
    the ``"linear"`` variant (query Γᵀx_q, keys x_i, values y_i, scale 1, count-normalised).

    Args:
      xs: [B, N, d] prompt inputs; ys: [B, N] their labels.
      xq: [B, Q, d] queries.
      gamma: [d, d] Γ, or a scalar γ (Γ = γ I).
      visible: None (unmasked LSA: every query sees all N pairs) or int [Q] / [B, Q], the
        number of leading pairs each query sees (masked: the query after pair p sees
        pairs 0..p-1, i.e. ``visible = p``).

    Returns:
      ŷ [B, Q] (0 for a query that sees no pair).
    """
    xs, ys, xq = jnp.asarray(xs), jnp.asarray(ys), jnp.asarray(xq)
    if xs.ndim != 3 or ys.shape != xs.shape[:2] or xq.ndim != 3 or xq.shape[::2] != \
            xs.shape[::2]:
        raise ValueError(f"icl_predict: need xs [B, N, d], ys [B, N], xq [B, Q, d]; got xs "
                         f"{xs.shape}, ys {ys.shape}, xq {xq.shape}")
    d = xs.shape[-1]
    gamma = jnp.asarray(gamma, xs.dtype)
    if gamma.ndim == 0:
        gamma = gamma * jnp.eye(d, dtype=xs.dtype)
    if gamma.shape != (d, d):
        raise ValueError(f"icl_predict: `gamma` must be a scalar or [{d}, {d}], got "
                         f"{gamma.shape}")
    q = jnp.einsum("bqd,de->bqe", xq, gamma)[:, :, None, :]       # (Γᵀ x_q)ᵀ x_i = x_qᵀ Γ x_i
    k = xs[:, :, None, :]
    v = ys[:, :, None, None].astype(xs.dtype)
    mask = None
    if visible is not None:
        visible = jnp.asarray(visible)
        if visible.shape not in ((xq.shape[1],), xq.shape[:2]):
            raise ValueError(f"icl_predict: `visible` must be [Q] or [B, Q] = "
                             f"{list(xq.shape[:2])}, got {visible.shape}")
        mask = jnp.arange(xs.shape[1]) < visible[..., None]            # [(B,) Q, N]
        mask = mask[:, None] if mask.ndim == 3 else mask
    out = LINEAR(q, k, v, mask=mask, scale=1.0)
    return out[:, :, 0, 0]
