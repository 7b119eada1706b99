r"""Nyström attention (Xiong et al., "Nyströmformer: A Nyström-Based Algorithm for
Approximating Self-Attention", AAAI 2021), a baseline for PLASH.

Landmarks Q̃ [m, d], K̃ [m, d] are the means of m contiguous segments of the queries and
keys (segment j: rows ⌊j·T/m⌋ … ⌊(j+1)·T/m⌋ − 1; m = min(``num_landmarks``, T, S)); with
row softmax σ and s the scale,

    out = σ(s Q K̃ᵀ) · pinv(σ(s Q̃ K̃ᵀ)) · (σ(s Q̃ Kᵀ) V),

O((T + S)·m·d + m³) time, O((T + S)·m) memory. The Moore–Penrose inverse is the exact
one (``jnp.linalg.pinv``, SVD; the paper iterates Newton–Schulz). Non-causal only: the
landmarks are means over the whole sequence, so every output row depends on every key, future
ones included (``Features(causal=False)``: ``causal=True`` is a ``ValueError``). It therefore
cannot serve a decoder: a causal ``lcjax.nn.Attention`` layer, and so ``generate``, refuses it
before computing anything. GQA and cross-attention; no mask or segment ids.
``nystrom_reference`` is the same approximation with the landmarks formed by an explicit
[m, T] averaging matrix and the three factors as dense products, the suite's reference.
"""

from __future__ import annotations

import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from lcjax.attention.base import AttentionSpec, Features, Implementation, with_empty_aux
from lcjax.attention.core import default_scale, stat_dtype, validate_qkv

__all__ = ["NYSTROM", "nystrom_attention", "nystrom_reference", "segment_bounds"]


def segment_bounds(length: int, m: int) -> np.ndarray:
    """[m + 1] segment edges ⌊j·length/m⌋."""
    return (np.arange(m + 1) * length) // m


def _prep(q, k, v, num_landmarks, scale, name):
    shapes = validate_qkv(q, k, v, name=name)
    if isinstance(num_landmarks, bool) or not isinstance(num_landmarks, numbers.Integral) or (
            num_landmarks < 1):
        raise ValueError(f"{name}: `num_landmarks` must be a positive int, got "
                         f"{num_landmarks!r}")
    m = min(int(num_landmarks), shapes.q_len, shapes.kv_len)
    acc = stat_dtype(q, k, v)
    g = shapes.groups
    qh = jnp.swapaxes(q.astype(acc), 1, 2)
    kh = jnp.repeat(jnp.swapaxes(k.astype(acc), 1, 2), g, axis=1)
    vh = jnp.repeat(jnp.swapaxes(v.astype(acc), 1, 2), g, axis=1)
    return shapes, m, default_scale(shapes.head_dim, scale), qh, kh, vh


def _segment_means(x, m):
    """x [B, H, L, d] -> [B, H, m, d] means of the m segments (a cumulative-sum difference)."""
    edges = segment_bounds(x.shape[2], m)
    csum = jnp.concatenate([jnp.zeros_like(x[:, :, :1]), jnp.cumsum(x, axis=2)], axis=2)
    sums = csum[:, :, edges[1:]] - csum[:, :, edges[:-1]]
    return sums / jnp.asarray(np.diff(edges), x.dtype)[:, None]


@functools.partial(jax.jit, static_argnames=("m", "scale"))
def _nystrom(qh, kh, vh, *, m, scale):
    ql, kl = _segment_means(qh, m), _segment_means(kh, m)
    f1 = jax.nn.softmax(scale * jnp.einsum("bhtd,bhmd->bhtm", qh, kl), -1)
    f2 = jax.nn.softmax(scale * jnp.einsum("bhnd,bhmd->bhnm", ql, kl), -1)
    f3 = jax.nn.softmax(scale * jnp.einsum("bhmd,bhsd->bhms", ql, kh), -1)
    return jnp.einsum("bhtm,bhmn,bhnv->bhtv", f1, jnp.linalg.pinv(f2),
                      jnp.einsum("bhms,bhsv->bhmv", f3, vh))


def nystrom_attention(q, k, v, *, scale=None, num_landmarks=64):
    """Nyström attention (module docstring): q [B, T, H, D]; k, v [B, S, Hkv, ·] ->
    [B, T, H, Dv] in q's dtype."""
    shapes, m, s, qh, kh, vh = _prep(q, k, v, num_landmarks, scale, "nystrom_attention")
    return jnp.swapaxes(_nystrom(qh, kh, vh, m=m, scale=s), 1, 2).astype(q.dtype)


def nystrom_reference(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
                      kv_segment_ids=None, num_landmarks=64):
    """The same approximation with an explicit [m, L] averaging matrix for the landmarks
    and each factor as a dense softmax."""
    del causal, mask, q_segment_ids, kv_segment_ids  # not supported (the spec says so)
    shapes, m, s, qh, kh, vh = _prep(q, k, v, num_landmarks, scale, "nystrom_reference")

    def averaging(length):
        e = segment_bounds(length, m)
        rows = np.zeros((m, length))
        for j in range(m):
            rows[j, e[j]:e[j + 1]] = 1.0 / (e[j + 1] - e[j])
        return jnp.asarray(rows, qh.dtype)

    ql = jnp.einsum("ml,bhld->bhmd", averaging(shapes.q_len), qh)
    kl = jnp.einsum("ml,bhld->bhmd", averaging(shapes.kv_len), kh)
    soft = lambda a, b: jax.nn.softmax(s * a @ jnp.swapaxes(b, -1, -2), axis=-1)
    out = soft(qh, kl) @ jnp.linalg.pinv(soft(ql, kl)) @ (soft(ql, kh) @ vh)
    return jnp.swapaxes(out, 1, 2).astype(q.dtype)


def _xla(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
         kv_segment_ids=None, num_landmarks=64):
    del causal, mask, q_segment_ids, kv_segment_ids
    return nystrom_attention(q, k, v, scale=scale, num_landmarks=num_landmarks)


NYSTROM = AttentionSpec(
    "nystrom", reference=nystrom_reference,
    implementations=(Implementation("xla", with_empty_aux(_xla)),),
    features=Features(causal=False, mask=False, segment_ids=False, lse=False),
    test_options={"num_landmarks": 4},
    tolerance={"float64": 1e-8, "float32": 1e-3, "bfloat16": 1e-1, "float16": 3e-2},
    grad_tolerance={"float64": 1e-7, "float32": 5e-3, "bfloat16": 5e-1, "float16": 1e-1},
    description="Nystromformer landmark attention (baseline)")
