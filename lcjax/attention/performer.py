r"""Performer FAVOR+ attention (Choromanski et al., "Rethinking Attention with Performers",
ICLR 2021): softmax attention with positive random features, a baseline for PLASH.

With s the scale and W ∈ ℝ^{m×d} Gaussian rows (orthogonalised in blocks of d, as FAVOR+
does; m = ``num_features``, from the PRNG ``key``, fixed default),

    φ(x) = m^{-1/2} exp(W x' − ‖x'‖²/2),  x' = √s x,   E φ(q)·φ(k) = exp(s q·k),
    out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j)

(j ≤ i when causal). Non-causal: φ(K)ᵀV [m, dv] once, O((T + S)·m·dv). Causal: a
``lax.scan`` over chunks of ``chunk`` positions carries Σ φ(k)vᵀ and Σ φ(k) of earlier
chunks and adds the chunk's own masked [C, C] part. A per-query constant is subtracted
inside the query feature's exponent for stability (it cancels in the ratio); keys use none
(a key-dependent constant would reweight keys).

Features: causal and not, GQA, cross; no mask or segment ids (``ValueError`` through the
spec). ``performer_reference`` is the same approximation computed densely ([T, S] kernel
matrix, the causal mask applied to it), the conformance suite's reference.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
from jax import lax

from lcjax.attention.core import (
    causal_linear_sums,
    default_scale,
    stat_dtype,
    validate_qkv,
)
from lcjax.attention.registry import register
from lcjax.attention.spec import AttentionSpec, Features, Implementation, with_empty_aux

__all__ = ["PERFORMER", "performer_attention", "performer_features", "performer_projection",
           "performer_reference"]


def _int_option(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"performer_attention: `{name}` must be a positive int, got {value!r}")
    return int(value)


def performer_projection(key, num_features: int, head_dim: int, dtype=jnp.float32):
    """W [num_features, head_dim]: Gaussian rows, orthogonalised in blocks of head_dim and
    rescaled to chi-distributed norms (FAVOR+'s orthogonal random features)."""
    key = jax.random.key(0) if key is None else (
        jax.random.key(int(key)) if isinstance(key, numbers.Integral) else key)
    blocks = -(-num_features // head_dim)
    kg, kn = jax.random.split(key)
    g = jax.random.normal(kg, (blocks, head_dim, head_dim), jnp.float32)
    qmat, rmat = jnp.linalg.qr(g)
    # sign fix: Q·sign(diag R) is Haar-distributed (Householder QR alone favours one sign,
    # which biases the features)
    qmat = qmat * jnp.sign(jnp.diagonal(rmat, axis1=-2, axis2=-1))[:, None, :]
    rows = jnp.swapaxes(qmat, 1, 2).reshape(blocks * head_dim, head_dim)[:num_features]
    norms = jnp.linalg.norm(jax.random.normal(kn, (num_features, head_dim)), axis=-1)
    return (rows * norms[:, None]).astype(dtype)


def performer_features(x, w, scale, *, is_query: bool):
    """φ(x) [..., m] of x [..., d] (positive random features of exp(scale·q·k)). Queries
    subtract their own max exponent (cancels in the attention ratio)."""
    xs = x * math.sqrt(scale)
    z = jnp.einsum("...d,md->...m", xs, w) - 0.5 * jnp.sum(xs * xs, -1, keepdims=True)
    if is_query:
        z = z - lax.stop_gradient(jnp.max(z, -1, keepdims=True))
    return jnp.exp(z) / math.sqrt(w.shape[0])


def _prep(q, k, v, scale, num_features, key, name):
    shapes = validate_qkv(q, k, v, name=name)
    num_features = _int_option("num_features", num_features)
    acc = stat_dtype(q, k, v)
    s = default_scale(shapes.head_dim, scale)
    w = performer_projection(key, num_features, shapes.head_dim, acc)
    g = shapes.groups
    up = lambda x: x.astype(acc)
    qh = jnp.swapaxes(up(q), 1, 2)                                    # [B, H, T, d]
    kh = jnp.repeat(jnp.swapaxes(up(k), 1, 2), g, axis=1)            # [B, H, S, d]
    vh = jnp.repeat(jnp.swapaxes(up(v), 1, 2), g, axis=1)
    return shapes, s, w, performer_features(qh, w, s, is_query=True), \
        performer_features(kh, w, s, is_query=False), vh


@functools.partial(jax.jit, static_argnames=("causal", "chunk"))
def _favor(fq, fk, vh, *, causal, chunk):
    if not causal:
        kv = jnp.einsum("bhsm,bhsv->bhmv", fk, vh)
        num = jnp.einsum("bhtm,bhmv->bhtv", fq, kv)
        den = jnp.einsum("bhtm,bhm->bht", fq, jnp.sum(fk, 2))
        return num / den[..., None]
    # numerator and normaliser from one scan: a column of ones appended to V gives Σ φq·φk
    ones = jnp.ones(vh.shape[:-1] + (1,), vh.dtype)
    sums = causal_linear_sums(fq, fk, jnp.concatenate([vh, ones], -1), chunk=chunk)
    num, den = sums[..., :-1], sums[..., -1]
    # padded query rows (zero features) have den = 0: keep them finite for the gradient
    return num / jnp.where(den > 0, den, 1.0)[..., None]


def performer_attention(q, k, v, *, causal=False, scale=None, num_features=64, key=None,
                        chunk=128):
    """FAVOR+ attention (module docstring). q [B, T, H, D]; k, v [B, S, Hkv, ·] ->
    [B, T, H, Dv] in q's dtype. ``num_features`` m random features (key: their PRNG key,
    default ``jax.random.key(0)``); ``chunk``: causal scan chunk."""
    shapes, s, w, fq, fk, vh = _prep(q, k, v, scale, num_features, key, "performer_attention")
    chunk = _int_option("chunk", chunk)
    out = _favor(fq, fk, vh, causal=causal, chunk=min(chunk, shapes.q_len))
    return jnp.swapaxes(out, 1, 2).astype(q.dtype)


def performer_reference(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
                        kv_segment_ids=None, num_features=64, key=None):
    """The same approximation, densely: A = φ(Q)φ(K)ᵀ [T, S] (causal: A ⊙ [j ≤ i]),
    out = A V / A 1."""
    del mask, q_segment_ids, kv_segment_ids  # not supported (the spec says so)
    shapes, s, w, fq, fk, vh = _prep(q, k, v, scale, num_features, key, "performer_reference")
    a = jnp.einsum("bhtm,bhsm->bhts", fq, fk)
    if causal:
        a = a * (jnp.arange(shapes.kv_len)[None, :] <= jnp.arange(shapes.q_len)[:, None])
    out = jnp.einsum("bhts,bhsv->bhtv", a, vh) / jnp.sum(a, -1, keepdims=True)
    return jnp.swapaxes(out, 1, 2).astype(q.dtype)


def _xla(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
         kv_segment_ids=None, num_features=64, key=None, chunk=128):
    del mask, q_segment_ids, kv_segment_ids
    return performer_attention(q, k, v, causal=causal, scale=scale, num_features=num_features,
                               key=key, chunk=chunk)


PERFORMER = register(AttentionSpec(
    "performer", reference=performer_reference,
    implementations=(Implementation("xla", with_empty_aux(_xla)),),
    features=Features(mask=False, segment_ids=False, lse=False),
    test_options={"num_features": 8, "chunk": 8},
    tolerance={"float64": 1e-10, "float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2},
    grad_tolerance={"float64": 1e-9, "float32": 5e-4, "bfloat16": 2e-1, "float16": 5e-2},
    description="Performer FAVOR+ positive random-feature attention (baseline)"))
