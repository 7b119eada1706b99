r"""Performer FAVOR+ attention (Choromanski et al., "Rethinking Attention with Performers",
ICLR 2021): softmax attention with positive random features, a baseline for PLASH.

With s the scale and W ∈ ℝ^{m×d} Gaussian rows (orthogonalised in blocks of d, as FAVOR+
does; m = ``num_features``, from the PRNG ``key``, fixed default),

    φ(x) = m^{-1/2} exp(W x' − ‖x'‖²/2),  x' = √s x,   E φ(q)·φ(k) = exp(s q·k),
    out_i = Σ_j a_ij v_j / Σ_j a_ij,   a_ij = φ(q_i)·φ(k_j) > 0

(j ≤ i when causal). Equivalently out_i is softmax attention over the visible keys with the
logits ℓ_ij = log a_ij = logsumexp_m(log φ_m(q_i) + log φ_m(k_j)): every row is a convex
combination of the visible values. The exponents grow like s‖x‖², so the features are never
exponentiated unshifted (at q, k ~ 8·N(0, 1) they reach hundreds: exp overflows float32 and
a fixed shift underflows whole rows). Instead, in log space:

- non-causal: per feature m the key shift c_m = max_j log φ_m(k_j) gives
  Σ_j φ_m(k_j)[v_j, 1] = e^{c_m} Σ_j e^{log φ_m(k_j) − c_m}[v_j, 1] (terms ≤ 1, sum ≥ 1);
  e^{c_m} joins the query side, which subtracts its row maximum r_i = max_m(log φ_m(q_i) +
  c_m). Both shifts cancel in the ratio; the denominator is ≥ 1. O((T + S)·m·dv).
- causal: a ``lax.scan`` over chunks of ``chunk`` positions carries the same per-feature sums
  of the earlier chunks under a *running* maximum c_m (rescaled by e^{c_old − c_new} when it
  grows, as an online softmax does); the chunk's own lower triangle uses the logits ℓ_ij
  ([C, C, m] log-sum-exp), and each row subtracts the maximum over both parts. The step is
  rematerialised in the backward pass (``jax.checkpoint``): memory O(T·m + C²·m).

The shifts are ``stop_gradient``-ed maxima (the function does not depend on them).
Statistics are float32 for 16/32-bit inputs (float64 for float64).

Features: causal and not, GQA, cross; no mask or segment ids (``ValueError`` through the
spec) — hence no KV-cache decoding (the cache masks its empty slots). ``performer_reference``
is the same approximation computed densely (the [T, S] logits ℓ, the causal mask applied,
a softmax), the conformance suite's reference.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
from jax import lax

from lcjax.attention.base import AttentionSpec, Features, Implementation, with_empty_aux
from lcjax.attention.blocks import match_varying
from lcjax.attention.core import default_scale, stat_dtype, validate_qkv

__all__ = ["PERFORMER", "performer_attention", "performer_features", "performer_log_features",
           "performer_logits", "performer_projection", "performer_reference"]

# log-feature of padded keys (and the running maximum before any key): exp() of it, or of it
# minus any real exponent, is exactly 0, and it stays finite (no inf - inf)
_NEG = -1e30


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


def performer_log_features(x, w, scale):
    """log φ(x) [..., m] of x [..., d]: W x' − ‖x'‖²/2 − ½ log m with x' = √s x."""
    xs = x * math.sqrt(scale)
    return (jnp.einsum("...d,md->...m", xs, w) - 0.5 * jnp.sum(xs * xs, -1, keepdims=True)
            - 0.5 * math.log(w.shape[0]))


def performer_features(x, w, scale, *, is_query: bool = False):
    """φ(x) [..., m] of x [..., d] (positive random features of exp(scale·q·k)), computed
    as written (it overflows for large ``scale·‖x‖²``; the attention works in log space).
    Queries subtract their own max exponent (which cancels in the attention ratio)."""
    z = performer_log_features(x, w, scale)
    if is_query:
        z = z - lax.stop_gradient(jnp.max(z, -1, keepdims=True))
    return jnp.exp(z)


def performer_logits(lq, lk):
    """ℓ [..., T, S] = logsumexp_m(lq [..., T, m] + lk [..., S, m]) = log φ(q_i)·φ(k_j)."""
    return jax.nn.logsumexp(lq[..., :, None, :] + lk[..., None, :, :], axis=-1)


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
    return shapes, performer_log_features(qh, w, s), performer_log_features(kh, w, s), vh


def _max(x, axis):
    return lax.stop_gradient(jnp.max(x, axis))


def _favor_full(lq, lk, vh):
    """Non-causal: lq [B, H, T, m], lk [B, H, S, m], vh [B, H, S, Dv] -> [B, H, T, Dv]."""
    c = _max(lk, 2)                                                   # [B, H, m]
    ek = jnp.exp(lk - c[:, :, None])                                  # <= 1
    kv = jnp.einsum("bhsm,bhsv->bhmv", ek, vh)
    ks = jnp.sum(ek, 2)                                               # >= 1 at argmax
    zq = lq + c[:, :, None]
    eq = jnp.exp(zq - _max(zq, 3)[..., None])                         # <= 1, one entry 1
    num = jnp.einsum("bhtm,bhmv->bhtv", eq, kv)
    den = jnp.einsum("bhtm,bhm->bht", eq, ks)                         # >= 1
    return num / den[..., None]


def _favor_causal(lq, lk, vh, chunk):
    """Causal (top-left: query i sees keys j <= i): the chunked scan of the module
    docstring. Shapes as :func:`_favor_full`."""
    b, h, t, m = lq.shape
    dv = vh.shape[-1]
    nc = -(-t // chunk)
    length = nc * chunk

    def pad(x, value):  # keys beyond the last query are never seen: cut, then pad
        x = lax.slice_in_dim(x, 0, min(x.shape[2], length), axis=2)
        x = jnp.pad(x, [(0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)],
                    constant_values=value)
        return jnp.moveaxis(x.reshape(b, h, nc, chunk, -1), 2, 0)

    xs = (pad(lq, 0.0), pad(lk, _NEG), pad(vh, 0.0))
    tri = jnp.tril(jnp.ones((chunk, chunk), bool))

    @jax.checkpoint
    def step(carry, x):
        c, kv, ks = carry                            # [B, H, m], [B, H, m, Dv], [B, H, m]
        lqc, lkc, vc = x
        ell = jnp.where(tri, performer_logits(lqc, lkc), _NEG)       # [B, H, C, C]
        zq = lqc + c[:, :, None]                                      # earlier chunks
        r = jnp.maximum(_max(ell, 3), _max(zq, 3))[..., None]         # row maximum
        wi, eq = jnp.exp(ell - r), jnp.exp(zq - r)
        num = jnp.einsum("bhtm,bhmv->bhtv", eq, kv) + jnp.einsum("bhts,bhsv->bhtv", wi, vc)
        den = jnp.einsum("bhtm,bhm->bht", eq, ks) + jnp.sum(wi, -1)  # >= 1
        c_new = jnp.maximum(c, _max(lkc, 2))
        decay, ek = jnp.exp(c - c_new), jnp.exp(lkc - c_new[:, :, None])
        kv = kv * decay[..., None] + jnp.einsum("bhsm,bhsv->bhmv", ek, vc)
        ks = ks * decay + jnp.sum(ek, 2)
        return (c_new, kv, ks), num / den[..., None]

    init = match_varying((jnp.full((b, h, m), _NEG, lq.dtype),
                          jnp.zeros((b, h, m, dv), lq.dtype),
                          jnp.zeros((b, h, m), lq.dtype)), lq, lk, vh)
    _, outs = lax.scan(step, init, xs)
    return jnp.moveaxis(outs, 0, 2).reshape(b, h, length, dv)[:, :, :t]


@functools.partial(jax.jit, static_argnames=("causal", "chunk"))
def _favor(lq, lk, vh, *, causal, chunk):
    return _favor_causal(lq, lk, vh, chunk) if causal else _favor_full(lq, lk, vh)


def performer_attention(q, k, v, *, causal=False, scale=None, num_features=64, key=None,
                        chunk=128):
    """FAVOR+ attention (module docstring). q [B, T, H, D]; k, v [B, S, Hkv, ·] ->
    [B, T, H, Dv] in q's dtype. ``num_features`` m random features (key: their PRNG key,
    default ``jax.random.key(0)``); ``chunk``: causal scan chunk."""
    shapes, lq, lk, vh = _prep(q, k, v, scale, num_features, key, "performer_attention")
    chunk = _int_option("chunk", chunk)
    out = _favor(lq, lk, vh, causal=causal, chunk=min(chunk, shapes.q_len))
    return jnp.swapaxes(out, 1, 2).astype(q.dtype)


def performer_reference(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
                        kv_segment_ids=None, num_features=64, key=None):
    """The same approximation, densely: ℓ = logsumexp_m(log φ(Q)_m + log φ(K)_m) [T, S]
    (causal: ℓ_ij = −∞ for j > i), out = softmax(ℓ) V = A V / A 1 with A = e^ℓ."""
    del mask, q_segment_ids, kv_segment_ids  # not supported (the spec says so)
    shapes, lq, lk, vh = _prep(q, k, v, scale, num_features, key, "performer_reference")
    ell = performer_logits(lq, lk)
    if causal:
        visible = jnp.arange(shapes.kv_len)[None, :] <= jnp.arange(shapes.q_len)[:, None]
        ell = jnp.where(visible, ell, -jnp.inf)
    out = jnp.einsum("bhts,bhsv->bhtv", jax.nn.softmax(ell, axis=-1), vh)
    return jnp.swapaxes(out, 1, 2).astype(q.dtype)


def _xla(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
         kv_segment_ids=None, num_features=64, key=None, chunk=128):
    del mask, q_segment_ids, kv_segment_ids
    return performer_attention(q, k, v, causal=causal, scale=scale, num_features=num_features,
                               key=key, chunk=chunk)


PERFORMER = AttentionSpec(
    "performer", reference=performer_reference,
    implementations=(Implementation("xla", with_empty_aux(_xla)),),
    features=Features(mask=False, segment_ids=False, lse=False),
    test_options={"num_features": 8, "chunk": 8},
    tolerance={"float64": 1e-10, "float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2},
    grad_tolerance={"float64": 1e-9, "float32": 5e-4, "bfloat16": 2e-1, "float16": 5e-2},
    description="Performer FAVOR+ positive random-feature attention (baseline)")
