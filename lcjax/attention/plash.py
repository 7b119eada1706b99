r"""PLASH: prototype attention with randomized polynomial enrichment and a certificate.

After the PLASH abstract (ICML 2026; no public code): keys and values of
length N are compressed into M ≪ N prototypes, each prototype is enriched with randomized
polynomial features of what its keys lose to compression (and of the values they carry),
and each query attends by exact softmax to the enriched prototypes. The construction, the
sketch's error bound, the certificate and its proof are ours and are written down in
``docs/plash.md``; this docstring is the summary. Per batch element and KV head (scale s,
query q, keys kᵢ, values vᵢ, prototypes p_m [M, d]):

    a(i) = argmin_m ‖kᵢ − p_m‖,  rᵢ = kᵢ − p_{a(i)},  C_m = {i : a(i) = m},  n_m = |C_m|
    φⱼ(x)_t = D^{-1/2} Π_{l≤j} (W_{j,l} x)_t   (Rademacher W, D = sketch_dim: unbiased)
    Ẑ_m = 1 + s q·μ_m + Σ_{j=2}^{degree} sʲ/j! φⱼ(q)·mean_{C_m} φⱼ(rᵢ)       (μ_m = mean rᵢ)
    λ_m = log n_m + s q·p_m + clip(log Ẑ_m, s q·μ_m, s q·μ_m + ū_m)
    ũ_m = u_m + proj_{‖·‖≤r_m}( s [φ₁(q)·mean vᵢ φ₁(rᵢ)ᵀ − u_m (q·μ_m)] )       (u_m = mean vᵢ)
    PLASH(q) = Σ_m softmax(λ)_m ũ_m

ū_m and r_m are the deterministic bounds (Hoeffding / Bennett / Jensen) on the cluster's
log-partition and value shift; clipping onto them never moves an estimate away from the
truth. With M = N and prototypes equal to the keys every residual is 0 and PLASH is exact.

**Certificate** (``return_aux=True`` → ``aux["certificate"]`` [B, T, H] float32): an upper
bound on ‖PLASH(q) − softmax_attention(q)‖₂ per query row that holds for every input and
every sketch draw (probability 1) in exact arithmetic, computed from the per-cluster
statistics in O(M·(d + dv)) per query (``docs/plash.md`` §3, Theorem).

**Causal** (top-left, query t sees keys j ≤ t): positions are cut into chunks of
``chunk`` (default min(256, T)); a ``lax.scan`` over chunks carries the prototype
statistics of the keys of earlier chunks only; each query attends exactly (causal mask) to
its own chunk and by PLASH to the compressed past, merged by
:func:`lcjax.attention.core.merge_attention`. No query sees a later key through any path:
the default prototypes come from the first chunk's keys (seen by every query that uses
the past), learned ones from no key at all.

**Masks.** A key-only mask (broadcastable to [B, 1, 1, S]) removes keys from the clusters.
A mask varying over queries or heads, or segment ids, has no linear-time form: such calls
fall back to exact softmax attention (``core.dot_product_attention``, O(T·S)) and return
certificate 0 (exact up to rounding). The slow reference follows the same rule.

Cost O((N + T)·M·d) for fixed degree, sketch_dim and chunk (the sketch adds M·dv·D per
query); memory O(M·(d + degree·D + dv·D)) for the statistics plus O(N) per-key values.

**Log-sum-exp** (``return_lse=True``): logsumexp_m λ_m, PLASH's estimate of
log Σ_j e^{s q·k_j} (merged with the exact present chunk's when causal), so PLASH outputs
over disjoint key sets combine by :func:`lcjax.attention.core.merge_attention`.

**Implementations** of the registered ``"plash"`` spec: ``"pallas"`` — the compressed-past
attention (queries to the enriched prototypes, the T·M·(d + dv·D) part) by the kernel
``pallas_kernels.prototype_attention`` (backward: its pure-jnp reference's VJP), the rest
(prototype build, exact present chunk, merge, certificate) as the XLA path; float32 /
16-bit inputs; on CPU only in the Pallas interpreter when named — and ``"xla"``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from lcjax.attention.base import (
    AttentionSpec,
    Features,
    Implementation,
    LearnedParams,
    pallas_skip_on_cpu,
    resolve_kernel,
)
from lcjax.attention.core import (
    default_scale,
    dot_product_attention,
    match_varying,
    merge_attention,
    softmax_rows,
    stat_dtype,
    validate_qkv,
)

__all__ = ["AUX", "PLASH", "PlashKernelConfig", "plash_attention", "plash_reference",
           "plash_sketch", "default_prototypes", "key_mask_or_none", "polynomial_features",
           "prototype_table"]

AUX = {"certificate": "[B, T, H] float32: upper bound on ||PLASH(q) - softmax(q)||_2 per row"}
_DEFAULT_KEY_SEED = 0
_MAX_DEGREE = 4
_EXP_CAP = 60.0  # e^{a} in the bounds is only used beyond this through min(·, trivial bound)


# ----------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------
def _positive_int(name, value, lo=1, hi=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo or (
            hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"plash_attention: `{name}` must be an int {rng}, got {value!r}")
    return int(value)


def _sketch_key(key):
    if key is None:
        return jax.random.key(_DEFAULT_KEY_SEED)
    if isinstance(key, numbers.Integral) and not isinstance(key, bool):
        return jax.random.key(int(key))
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"plash_attention: `key` must be one PRNG key, got shape {key.shape}")
        return key
    if key.dtype == jnp.uint32 and key.shape == (2,):
        return jax.random.wrap_key_data(key)
    raise ValueError(f"plash_attention: `key` must be a PRNG key, an int seed or None, got "
                     f"{getattr(key, 'dtype', type(key))} {getattr(key, 'shape', '')}")


def plash_sketch(key, degree: int, sketch_dim: int, head_dim: int, dtype=jnp.float32):
    """The Rademacher matrices of the sketch: [degree·(degree+1)/2, D, d], ±1.

    Degree j uses rows j(j-1)/2 … j(j+1)/2 - 1 (j independent matrices), so
    φⱼ(x)_t = D^{-1/2} Π_l (W_{j,l} x)_t is unbiased for (x·y)ʲ."""
    count = max(degree, 1) * (max(degree, 1) + 1) // 2  # degree 0 keeps φ₁'s matrix (unused)
    w = jax.random.rademacher(_sketch_key(key), (count, sketch_dim, head_dim), dtype=jnp.int8)
    return w.astype(dtype)


def polynomial_features(x, w, degree):
    """x [..., d] -> [φ₁(x), …, φ_degree(x)], each [..., D]."""
    d_sketch = w.shape[1]
    proj = jnp.einsum("...d,nDd->...nD", x, w.astype(x.dtype))
    out, start = [], 0
    for j in range(1, degree + 1):
        f = proj[..., start, :]
        for l in range(1, j):
            f = f * proj[..., start + l, :]
        out.append(f / math.sqrt(d_sketch))
        start += j
    return out


def _norm(x, axis=-1):
    """‖x‖ with a finite gradient at 0."""
    sq = jnp.sum(x * x, axis=axis)
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)


def _sqrt(x):
    """sqrt with a finite gradient at 0."""
    pos = x > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


def _lse(m_safe, l):
    """m + log l with -inf (and a finite gradient) for an empty row (l = 0)."""
    pos = l > 0
    return jnp.where(pos, m_safe + jnp.log(jnp.where(pos, l, 1.0)), -jnp.inf)


def key_mask_or_none(mask, batch: int, kv_len: int):
    """A key-only mask (broadcastable to [B, 1, 1, S]) as [B, S] bool; None if there is no
    mask; ``False`` if the mask varies over queries or heads (the fallback case)."""
    if mask is None:
        return None
    m = jnp.asarray(mask)
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)
    if m.shape[1] != 1 or m.shape[2] != 1:
        return False
    return jnp.broadcast_to(m[:, 0, 0, :], (batch, kv_len))


def default_prototypes(k, num_prototypes: int, *, causal: bool, chunk: int):
    """Default prototypes [B, Hkv, M, d]: keys at M evenly spaced positions of the whole
    sequence (non-causal) or of the first chunk (causal: every query that uses the
    compressed past already sees those keys)."""
    s = k.shape[1]
    span = min(chunk, s) if causal else s
    idx = jnp.asarray([round(i * (span - 1) / max(num_prototypes - 1, 1))
                       for i in range(num_prototypes)], jnp.int32)
    return jnp.moveaxis(k[:, idx], 1, 2)


def _check_prototypes(prototypes, shapes, name):
    p = prototypes
    if getattr(p, "ndim", None) not in (3, 4):
        raise ValueError(f"{name}: `prototypes` must be [kv_heads, M, head_dim] or "
                         f"[batch, kv_heads, M, head_dim], got shape {getattr(p, 'shape', None)}")
    if not jnp.issubdtype(p.dtype, jnp.floating):
        raise ValueError(f"{name}: `prototypes` must be floating point, got {p.dtype}")
    kvh, m, d = p.shape[-3:]
    if kvh != shapes.kv_heads or d != shapes.head_dim or m < 1 or (
            p.ndim == 4 and p.shape[0] not in (1, shapes.batch)):
        raise ValueError(f"{name}: `prototypes` of shape {p.shape} must be [kv_heads="
                         f"{shapes.kv_heads}, M, head_dim={shapes.head_dim}] (or with a leading "
                         f"batch {shapes.batch}) and M >= 1")
    return p if p.ndim == 4 else p[None]


# ----------------------------------------------------------------------------
# Per-cluster statistics (sums over keys; accumulated chunk by chunk)
# ----------------------------------------------------------------------------
class ClusterStats(NamedTuple):
    """Sums over the keys of each cluster, [B, Hkv, M, ...] (or with extra per-query axes
    in the reference). ``e``: Σ φⱼ(r) for j = 2…degree, [..., degree-1, M, D]
    (leading-axis layout [B, Hkv, degree-1, M, D])."""

    n: jax.Array        # [.., M] count
    s1: jax.Array       # [.., M, d] Σ r
    s2: jax.Array       # [.., M] Σ ‖r‖²
    e: jax.Array        # [.., J, M, D] Σ φⱼ(r), j ≥ 2 (J = max(degree - 1, 1))
    sv: jax.Array       # [.., M, dv] Σ v
    g: jax.Array        # [.., M, dv, D] Σ v φ₁(r)ᵀ
    ka: jax.Array       # [.., M, d] key anchor (first chunk's key mean)
    va: jax.Array       # [.., M, dv] value anchor
    has: jax.Array      # [.., M] bool: anchor set
    rk: jax.Array       # [.., M] max ‖k − ka‖
    rv: jax.Array       # [.., M] max ‖v − va‖


def _empty_stats(lead, m, d, dv, dsk, degree, dtype):
    z = lambda *s: jnp.zeros(lead + s, dtype)
    return ClusterStats(z(m), z(m, d), z(m), jnp.zeros(lead + (max(degree - 1, 1), m, dsk), dtype),
                        z(m, dv), z(m, dv, dsk), z(m, d), z(m, dv),
                        jnp.zeros(lead + (m,), bool), z(m), z(m))


def _assign(k, protos):
    """Nearest prototype of each key: k [B, K, C, d], protos [B|1, K, M, d] -> [B, K, C] int."""
    half_sq = 0.5 * jnp.sum(protos * protos, -1)[:, :, None]
    score = jnp.einsum("bkcd,bkmd->bkcm", k, protos) - half_sq
    return jnp.argmax(score, axis=-1)


def _update(stats: ClusterStats, k, v, valid, protos, w, degree) -> ClusterStats:
    """Add the keys k [B, K, C, d], values v [B, K, C, dv] with ``valid`` [B, 1|K, C] (float
    0/1) to the statistics."""
    m = protos.shape[2]
    a = _assign(k, protos)
    onehot = jax.nn.one_hot(a, m, dtype=k.dtype)                 # [B, K, C, M]
    p_a = jnp.einsum("bkcm,bkmd->bkcd", onehot, protos)
    r = k - p_a
    o = onehot * valid[..., None]
    feats = polynomial_features(r, w, max(degree, 1))
    n_c = jnp.sum(o, axis=2)
    e_c = (jnp.stack([jnp.einsum("bkcm,bkcD->bkmD", o, f) for f in feats[1:]], axis=2)
           if degree > 1 else jnp.zeros_like(stats.e))
    sk_c = jnp.einsum("bkcm,bkcd->bkmd", o, k)
    sv_c = jnp.einsum("bkcm,bkcv->bkmv", o, v)
    g_c = jnp.einsum("bkcm,bkcv,bkcD->bkmvD", o, v, feats[0])
    # anchors: the cluster's means in the first chunk where it has keys
    present = n_c > 0
    new = present & ~stats.has
    denom = jnp.where(present, n_c, 1.0)[..., None]
    ka = jnp.where(new[..., None], sk_c / denom, stats.ka)
    va = jnp.where(new[..., None], sv_c / denom, stats.va)
    dk = _norm(k - jnp.einsum("bkcm,bkmd->bkcd", onehot, ka))  # [B, K, C]
    dvv = _norm(v - jnp.einsum("bkcm,bkmv->bkcv", onehot, va))
    rk = jnp.maximum(stats.rk, jnp.max(o * dk[..., None], axis=2))
    rv = jnp.maximum(stats.rv, jnp.max(o * dvv[..., None], axis=2))
    return ClusterStats(
        stats.n + n_c, stats.s1 + jnp.einsum("bkcm,bkcd->bkmd", o, r),
        stats.s2 + jnp.einsum("bkcm,bkc->bkm", o, jnp.sum(r * r, -1)), stats.e + e_c,
        stats.sv + sv_c, stats.g + g_c, ka, va, stats.has | present, rk, rv)


# ----------------------------------------------------------------------------
# Query side: enriched prototypes, output and certificate pieces
# ----------------------------------------------------------------------------
class Enriched(NamedTuple):
    """Per query and prototype [..., T, M] (values [..., T, M, dv])."""

    lam: jax.Array      # logits λ_m (−inf for empty clusters)
    ut: jax.Array       # enriched values ũ_m
    u: jax.Array        # value means u_m
    eps_lo: jax.Array   # ε⁻_m ≤ 0
    eps_hi: jax.Array   # ε⁺_m ≥ 0
    e: jax.Array        # bound on ‖ō_m − ũ_m‖
    r: jax.Array        # bound on ‖ō_m − u_m‖
    rho: jax.Array      # value radius ρ_m
    live: jax.Array     # n_m > 0


def _bennett_log(a, var):
    """log(1 + g(a)·var), g(a) = (eᵃ − 1 − a)/a² (increasing; g(0) = 1/2)."""
    small = a < 1e-3
    a_s = jnp.where(small, 1.0, jnp.minimum(a, _EXP_CAP))
    g = jnp.where(small, 0.5 + a / 6.0, (jnp.expm1(a_s) - a_s) / (a_s * a_s))
    return jnp.log1p(g * var)


def _moments(stats: ClusterStats, protos, per_query: bool):
    """Per-cluster means and radii from the sums: (live n > 0, n (1 where empty), μ, τ, u,
    R, ρ) — docs/plash.md §1 and §3."""
    live = stats.n > 0
    nn = jnp.where(live, stats.n, 1.0)
    mu = stats.s1 / nn[..., None]
    tau = jnp.maximum(stats.s2 / nn - jnp.sum(mu * mu, -1), 0.0)
    u = stats.sv / nn[..., None]
    pr = protos[:, :, None] if per_query else protos
    big_r = stats.rk + jnp.where(stats.has, _norm(stats.ka - (pr + mu)), 0.0)
    rho = stats.rv + jnp.where(stats.has, _norm(stats.va - u), 0.0)
    return live, nn, mu, tau, u, big_r, rho


def prototype_table(stats: ClusterStats, protos):
    """The per-cluster table the Pallas kernel reads
    (``pallas_kernels.prototype_attention.Table``), [B, K, M, ...], from the statistics."""
    from pallas_kernels.prototype_attention import Table

    live, nn, mu, tau, u, big_r, rho = _moments(stats, protos, per_query=False)
    return Table(live=live, logn=jnp.log(nn), protos=protos, mu=mu,
                 e=stats.e / nn[:, :, None, :, None], u=u, g=stats.g / nn[..., None, None],
                 radius=big_r, tau=tau, rho=rho)


def _enrich(q, stats: ClusterStats, protos, w, degree, scale, per_query: bool) -> Enriched:
    """q [B, K, G, T, d]; protos [B, K, M, d]; stats [B, K, M, …] with ``e`` [B, K, J, M, D]
    (``per_query``: [B, K, T, M, …], ``e`` [B, K, J, T, M, D]) -> :class:`Enriched`
    [B, K, G, T, M, …]."""
    x = "t" if per_query else ""
    ins = (lambda a: a[:, :, None]) if per_query else (lambda a: a[:, :, None, None])
    s = scale
    live_raw, nn_raw, mu_raw, tau, u_raw, big_r, rho = _moments(stats, protos, per_query)
    tau, big_r, rho = ins(tau), ins(big_r), ins(rho)
    live, nn, u = ins(live_raw), ins(nn_raw), ins(u_raw)

    qn = _norm(q)[..., None]                                     # [B, K, G, T, 1]
    y0 = s * jnp.einsum("bkgtd,bkmd->bkgtm", q, protos)
    qmu = jnp.einsum(f"bkgtd,bk{x}md->bkgtm", q, mu_raw)
    ybar = s * qmu
    a = s * qn * big_r
    var = (s * qn) ** 2 * tau
    ubar = jnp.minimum(jnp.minimum(a, 0.5 * a * a), _bennett_log(a, var))
    ubar = jnp.where(a > _EXP_CAP, a, ubar)
    feats = polynomial_features(q, w, max(degree, 1))
    zhat = 1.0 + ybar
    for j in range(2, degree + 1):
        ej = stats.e[:, :, j - 2] / nn_raw[..., None]
        zhat = zhat + (s ** j / math.factorial(j)) * jnp.einsum(
            f"bkgtD,bk{x}mD->bkgtm", feats[j - 1], ej)
    pos = zhat > 0
    logz = jnp.log(jnp.where(pos, zhat, 1.0))
    zeta = jnp.where(pos, jnp.clip(logz, ybar, ybar + ubar), ybar)
    if degree == 0:  # no enrichment: the logit at the prototype, the value mean
        zeta = jnp.zeros_like(ybar)
    lam = jnp.where(live, jnp.log(nn) + y0 + zeta, -jnp.inf)
    corr = jnp.einsum(f"bkgtD,bk{x}mvD->bkgtmv", feats[0], stats.g / nn_raw[..., None, None])
    delta = s * (corr - u * qmu[..., None])
    if degree == 0:
        delta = jnp.zeros_like(delta)
    sig = s * qn * _sqrt(tau)
    ea = jnp.exp(jnp.minimum(a, _EXP_CAP))
    beta1 = jnp.maximum(ea - 1.0, -jnp.expm1(-a - ubar))
    beta2 = jnp.where(sig > 0, ea * sig, 0.0) + jnp.expm1(jnp.minimum(ubar, _EXP_CAP))
    beta = jnp.minimum(beta1, beta2)
    r = rho * jnp.minimum(1.0, beta)
    dn = _norm(delta)
    shrink = jnp.where(dn > r, r / jnp.where(dn > r, dn, 1.0), 1.0)
    ut = u + delta * shrink[..., None]
    e = r + _norm(ut - u)
    zero = jnp.zeros_like(lam)
    live = jnp.broadcast_to(live, lam.shape)
    return Enriched(lam, ut, jnp.broadcast_to(u, ut.shape),
                    # true log Ẑ − ζ ∈ [ybar − ζ, ybar + ubar − ζ]; with degree ≥ 1 ζ lies in
                    # [ybar, ybar + ubar], with degree 0 (ζ = 0) the interval is widened to 0
                    jnp.where(live, jnp.minimum(ybar - zeta, 0.0), zero),
                    jnp.where(live, jnp.maximum(ybar + ubar - zeta, 0.0), zero),
                    jnp.where(live, e, zero), jnp.where(live, r, zero), jnp.where(live, rho, zero),
                    live)


def _softmax_past(en: Enriched):
    """Attention to the enriched prototypes: (out [..., T, dv], lse [..., T])."""
    probs, m_safe, l = softmax_rows(en.lam)
    out = jnp.einsum("...m,...mv->...v", probs, en.ut)
    lse = _lse(m_safe, l)[..., 0]
    return out, lse


def _certificate(en: Enriched, lse_past, out, lse, exact=None):
    """Theorem of docs/plash.md §3 for queries [..., T]. ``exact``: (o_cur, lse_cur,
    cap_cur) of the exact present part (causal), or None."""
    en = jax.tree.map(lax.stop_gradient, en)
    out, lse, lse_past = (lax.stop_gradient(x) for x in (out, lse, lse_past))
    del lse_past
    lse_safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    # log P̃ in the log domain: a weight that underflows to 0 is still a live cluster
    # whose true weight may be large (its ε⁺ can be thousands of nats)
    live = en.live
    logp = jnp.where(live, en.lam - lse_safe[..., None], -jnp.inf)
    probs = jnp.exp(logp)
    d_ut = _norm(en.ut - out[..., None, :])
    d_u = _norm(en.u - out[..., None, :])
    h = jnp.minimum(en.e + d_ut, en.r + d_u)
    cap = jnp.max(jnp.where(en.live, d_u + en.rho, 0.0), axis=-1)
    eps_lo, eps_hi = en.eps_lo, en.eps_hi
    if exact is not None:
        o_cur, lse_cur, cap_cur = (lax.stop_gradient(x) for x in exact)
        live_cur = jnp.isfinite(lse_cur)
        log_cur = jnp.where(live_cur, lse_cur - lse_safe, -jnp.inf)
        zero = jnp.zeros_like(log_cur)[..., None]
        probs = jnp.concatenate([probs, jnp.exp(log_cur)[..., None]], -1)
        logp = jnp.concatenate([logp, log_cur[..., None]], -1)
        live = jnp.concatenate([live, live_cur[..., None]], -1)
        h = jnp.concatenate([h, _norm(o_cur - out)[..., None]], -1)
        e_all = jnp.concatenate([en.e, zero], -1)
        eps_lo = jnp.concatenate([eps_lo, zero], -1)
        eps_hi = jnp.concatenate([eps_hi, zero], -1)
        cap = jnp.maximum(cap, cap_cur)
    else:
        e_all = en.e
    neg = jnp.asarray(-jnp.inf, probs.dtype)
    log_zlo = jax.nn.logsumexp(jnp.where(live, logp + eps_lo, neg), axis=-1)
    log_zhi = jax.nn.logsumexp(jnp.where(live, logp + eps_hi, neg), axis=-1)
    # |P_m − P̃_m| ≤ max(min(P̃ e^{ε⁺}/Z⁻, 1) − P̃, P̃ − P̃ e^{ε⁻}/Z⁺)
    up = jnp.exp(jnp.minimum(logp + eps_hi - log_zlo[..., None], 0.0)) - probs
    down = probs - jnp.exp(logp + eps_lo - log_zhi[..., None])
    dp = jnp.where(live, jnp.maximum(jnp.maximum(up, down), 0.0), 0.0)
    width = (jnp.max(jnp.where(live, eps_hi, neg), -1) - jnp.min(jnp.where(live, eps_lo, -neg), -1))
    any_live = jnp.any(live, -1)
    width = jnp.where(any_live, width, 0.0)
    hmax = jnp.max(jnp.where(live, h, 0.0), -1)
    t1 = jnp.minimum(jnp.sum(dp * h, -1), 2.0 * jnp.tanh(width / 4.0) * hmax)
    t2 = jnp.sum(jnp.where(live, probs * e_all, 0.0), -1)
    cert = jnp.minimum(t1 + t2, cap)
    return jnp.where(any_live, cert, 0.0)


# ----------------------------------------------------------------------------
# The XLA path
# ----------------------------------------------------------------------------
def _head_major(x):
    return jnp.swapaxes(x, 1, 2)  # [B, S, K, d] -> [B, K, S, d]


def _group_q(q, kv_heads):
    b, t, h, d = q.shape
    return q.reshape(b, t, kv_heads, h // kv_heads, d).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, d]


def _ungroup(x):
    b, k, g, t = x.shape[:4]
    return jnp.moveaxis(x, 3, 1).reshape((b, t, k * g) + x.shape[4:])


def _prepare(q, k, v, *, mask, scale, q_segment_ids, kv_segment_ids, prototypes,
             num_prototypes, degree, sketch_dim, key, chunk, causal, name):
    shapes = validate_qkv(q, k, v, mask=mask, name=name)
    degree = _positive_int("degree", degree, 0, _MAX_DEGREE)
    sketch_dim = _positive_int("sketch_dim", sketch_dim)
    chunk = min(256, shapes.q_len) if chunk is None else _positive_int("chunk", chunk)
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError(f"{name}: pass both `q_segment_ids` and `kv_segment_ids`, or neither")
    if num_prototypes is not None:
        num_prototypes = _positive_int("num_prototypes", num_prototypes)
    acc = stat_dtype(q, k, v)
    if prototypes is None:
        if num_prototypes is None:
            raise ValueError(f"{name}: pass `prototypes` [kv_heads, M, head_dim] or "
                             f"`num_prototypes`")
        protos = default_prototypes(k, num_prototypes, causal=causal, chunk=chunk)
    else:
        protos = _check_prototypes(prototypes, shapes, name)
        if num_prototypes is not None and num_prototypes != protos.shape[2]:
            raise ValueError(f"{name}: `num_prototypes`={num_prototypes} disagrees with "
                             f"`prototypes` of shape {prototypes.shape}")
    keymask = key_mask_or_none(mask, shapes.batch, shapes.kv_len)
    fallback = q_segment_ids is not None or keymask is False
    w = plash_sketch(key, degree, sketch_dim, shapes.head_dim, acc)
    protos = jnp.broadcast_to(protos.astype(acc), (shapes.batch,) + protos.shape[1:])
    return (shapes, degree, chunk, protos, keymask, fallback, w, acc,
            default_scale(shapes.head_dim, scale))


def _fallback(q, k, v, causal, mask, scale, q_segment_ids, kv_segment_ids, return_aux,
              return_lse=False):
    out = dot_product_attention(q, k, v, causal=causal, mask=mask, scale=scale,
                                q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                                return_lse=return_lse)
    if not return_aux:
        return out
    return out, {"certificate": jnp.zeros(q.shape[:3], jnp.float32)}


def _pad_axis(x, length, axis):
    pad = length - x.shape[axis]
    if pad <= 0:
        return lax.slice_in_dim(x, 0, length, axis=axis)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _to_chunks(x, chunk, axis=3):
    """Pad axis ``axis`` to a multiple of ``chunk`` and split it: [..., n, chunk, ...]."""
    n = -(-x.shape[axis] // chunk)
    x = _pad_axis(x, n * chunk, axis)
    return x.reshape(x.shape[:axis] + (n, chunk) + x.shape[axis + 1:])


def _kernel_past(kernel, qc, stats, protos, w, degree, scale):
    """The compressed-past attention by the Pallas kernel
    (``pallas_kernels.prototype_attention``): qc [B, K, G, T, d] -> (out [B, K, G, T, dv],
    lse [B, K, G, T]); ``kernel`` = (BlockSizes, interpret)."""
    from pallas_kernels.prototype_attention import prototype_attention_pallas

    b, kk, g, t, d = qc.shape
    block_sizes, interpret = kernel
    out, lse = prototype_attention_pallas(
        qc.reshape(b, kk, g * t, d), prototype_table(stats, protos), w, scale=scale,
        degree=degree, block_sizes=block_sizes, interpret=interpret)
    return out.astype(qc.dtype).reshape(b, kk, g, t, -1), lse.reshape(b, kk, g, t)


def _key_chunks(kh, vh, valid, chunk):
    """Keys, values, validity split into ``chunk``-long pieces on a leading scan axis
    (zero-padded; padding is invalid): [n, B, K, C, ·] and [n, B, 1|K, C]."""
    return tuple(jnp.moveaxis(_to_chunks(x, chunk, axis=2), 2, 0) for x in (kh, vh, valid))


def _fold(step, carry, xs):
    """``lax.scan(step, carry, xs)``'s final carry; one chunk is applied directly (no loop
    to compile or differentiate through)."""
    if jax.tree.leaves(xs)[0].shape[0] == 1:
        return step(carry, jax.tree.map(lambda x: x[0], xs))[0]
    return lax.scan(step, carry, xs)[0]


def _build_stats(kh, vh, valid, protos, w, degree, chunk) -> ClusterStats:
    """Non-causal statistics of all keys, folded ``chunk`` keys at a time so every
    intermediate is O(chunk·(M + d + dv·D)) whatever N (one pass over everything at once
    made N·dv·D-sized temporaries that left the cache: time grew faster than N). Two
    passes: the anchors are the clusters' key/value means over all keys (pass 1), so
    :func:`_update` (pass 2) keeps them and only measures the radii around them — the
    same statistics as a single :func:`_update` of every key."""
    b, kk, _, d = kh.shape
    m, dv = protos.shape[2], vh.shape[-1]
    xs = _key_chunks(kh, vh, valid, chunk)

    def sums(carry, x):
        kc, vc, valc = x
        o = jax.nn.one_hot(_assign(kc, protos), m, dtype=kc.dtype) * valc[..., None]
        n, sk, sv = carry
        return (n + o.sum(2), sk + jnp.einsum("bkcm,bkcd->bkmd", o, kc),
                sv + jnp.einsum("bkcm,bkcv->bkmv", o, vc)), None

    zeros = lambda *shape: jnp.zeros((b, kk) + shape, kh.dtype)
    carry0 = match_varying((zeros(m), zeros(m, d), zeros(m, dv)), kh, vh, valid, protos)
    n, sk, sv = _fold(sums, carry0, xs)
    denom = jnp.where(n > 0, n, 1.0)[..., None]
    stats = _empty_stats((b, kk), m, d, dv, w.shape[1], degree, kh.dtype)._replace(
        ka=sk / denom, va=sv / denom, has=n > 0)
    stats = match_varying(stats, kh, vh, valid, protos)
    return _fold(lambda st, x: (_update(st, *x, protos, w, degree), None), stats, xs)


def _non_causal(qg, kh, vh, valid, protos, w, degree, scale, chunk, kernel=None,
                want_cert=True):
    """qg [B, K, G, T, d]; kh, vh [B, K, S, ·]; valid [B, 1, S] -> out, lse, cert.
    ``kernel``: None (XLA) or the Pallas kernel's (BlockSizes, interpret); the certificate
    (``want_cert``) is the XLA computation either way."""
    b, kk, g, t, d = qg.shape
    qg, kh, vh = (x.astype(protos.dtype) for x in (qg, kh, vh))
    stats = _build_stats(kh, vh, valid, protos, w, degree, chunk)
    qp = jnp.moveaxis(_to_chunks(qg, chunk), 3, 0)                # [n, B, K, G, C, d]
    nq = qp.shape[0]
    unchunk = lambda x: jnp.moveaxis(x, 0, 3).reshape((b, kk, g, nq * chunk)
                                                      + x.shape[5:])[:, :, :, :t]
    if kernel is not None:
        out, lse = _kernel_past(kernel, qg, stats, protos, w, degree, scale)
        if not want_cert:
            return out, lse, jnp.zeros(lse.shape, qg.dtype)

        def cert_of(xs):
            qc, oc, lc = xs
            en = _enrich(qc, stats, protos, w, degree, scale, per_query=False)
            return _certificate(en, lc, oc, lc)

        certs = lax.map(cert_of, (qp, jnp.moveaxis(_to_chunks(out, chunk), 3, 0),
                                  jnp.moveaxis(_to_chunks(lse, chunk), 3, 0)))
        return out, lse, unchunk(certs)

    def one(qc):
        en = _enrich(qc, stats, protos, w, degree, scale, per_query=False)
        out, lse = _softmax_past(en)
        cert = _certificate(en, lse, out, lse) if want_cert else jnp.zeros_like(lse)
        return out, lse, cert

    outs, lses, certs = lax.map(one, qp)
    return unchunk(outs), unchunk(lses), unchunk(certs)


def _exact_chunk(qc, kc, vc, valid_c, scale):
    """Exact causal attention inside one chunk: qc [B, K, G, C, d], kc, vc [B, K, C, ·],
    valid_c [B, 1, C] -> (out, lse, visible [B, K|1, G|1, C, C])."""
    c = qc.shape[3]
    s = jnp.einsum("bkgtd,bksd->bkgts", qc, kc) * scale
    vis = (jnp.arange(c)[:, None] >= jnp.arange(c)[None, :])[None, None, None] & (
        valid_c[:, :, None, None, :] > 0)
    s = jnp.where(vis, s, -jnp.inf)
    probs, m_safe, l = softmax_rows(s)
    out = jnp.einsum("bkgts,bksv->bkgtv", probs, vc)
    return out, _lse(m_safe, l)[..., 0], vis


def _causal(qg, kh, vh, valid, protos, w, degree, scale, chunk, kernel=None, want_cert=True):
    """Chunked causal PLASH (docs/plash.md §4) -> out (in q's dtype), lse, cert; ``kernel``
    as in :func:`_non_causal` (the compressed past by the Pallas kernel). q, k, v keep
    their dtype outside the step (each chunk is cast to the statistics' dtype, that of
    ``protos``, inside it), so a 16-bit call holds no float32 copy of the whole sequence."""
    b, kk, g, t, d = qg.shape
    m, dv = protos.shape[2], vh.shape[-1]
    acc, out_dtype = protos.dtype, qg.dtype
    nc = -(-t // chunk)
    length = nc * chunk
    qp = _pad_axis(qg, length, 3).reshape(b, kk, g, nc, chunk, d)
    kp = _pad_axis(kh, length, 2).reshape(b, kk, nc, chunk, d)
    vp = _pad_axis(vh, length, 2).reshape(b, kk, nc, chunk, dv)
    validp = _pad_axis(valid, length, 2).reshape(b, valid.shape[1], nc, chunk)
    stats = _empty_stats((b, kk), m, d, dv, w.shape[1], degree, acc)
    stats = match_varying(stats, qg, kh, vh, valid, protos)

    def step(stats, xs):
        qc, kc, vc, valc = xs
        qc, kc, vc = (x.astype(acc) for x in (qc, kc, vc))
        en = None
        if kernel is None:
            en = _enrich(qc, stats, protos, w, degree, scale, per_query=False)
            out_p, lse_p = _softmax_past(en)
        else:
            out_p, lse_p = _kernel_past(kernel, qc, stats, protos, w, degree, scale)
        out_c, lse_c, vis = _exact_chunk(qc, kc, vc, valc, scale)
        out, lse = merge_attention(out_p, lse_p, out_c, lse_c)
        if want_cert:
            if en is None:
                en = _enrich(qc, stats, protos, w, degree, scale, per_query=False)
            dist = _norm(vc[:, :, None, None, :, :] - lax.stop_gradient(out)[..., None, :])
            cap_c = jnp.max(jnp.where(vis, dist, 0.0), -1)
            cert = _certificate(en, lse_p, out, lse, exact=(out_c, lse_c, cap_c))
        else:
            cert = jnp.zeros(lse.shape, qc.dtype)
        stats = _update(stats, kc, vc, valc, protos, w, degree)
        return stats, (out.astype(out_dtype), lse, cert)

    xs = (jnp.moveaxis(qp, 3, 0), jnp.moveaxis(kp, 2, 0), jnp.moveaxis(vp, 2, 0),
          jnp.moveaxis(validp, 2, 0))
    _, (outs, lses, certs) = _remat_scan(step, stats, xs)
    out = jnp.moveaxis(outs, 0, 3).reshape(b, kk, g, length, dv)[:, :, :, :t]
    lse = jnp.moveaxis(lses, 0, 3).reshape(b, kk, g, length)[:, :, :, :t]
    cert = jnp.moveaxis(certs, 0, 3).reshape(b, kk, g, length)[:, :, :, :t]
    return out, lse, cert


def _group_size(n: int) -> int:
    """Chunks per group of :func:`_remat_scan`: the largest divisor of n at most √n (1 for
    a prime n: then one level only)."""
    return max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)


def _remat_scan(step, carry, xs):
    """``lax.scan(step, carry, xs)`` with two-level rematerialisation, for the backward's
    memory: the n steps run in groups of g = :func:`_group_size` (n) under
    ``jax.checkpoint``, each step checkpointed too, so the backward keeps the carry (the
    cluster statistics, M·dv·D per KV head) at the n/g group starts and, while it
    differentiates one group, at its g steps — O(√n) carries instead of n, and none of a
    step's own temporaries (the kernel's table, the chunk's [C, C] probabilities). Costs
    about two extra forward passes of the steps in the backward. Without it, 128K causal
    tokens (512 chunks) saved 8.5 GiB of residuals per chip at fwd+bwd; one level: 3.9 GiB."""
    n = jax.tree.leaves(xs)[0].shape[0]
    g = _group_size(n)
    inner = jax.checkpoint(step)
    if g == 1:
        return lax.scan(inner, carry, xs)
    grouped = jax.tree.map(lambda x: x.reshape((n // g, g) + x.shape[1:]), xs)
    carry, ys = lax.scan(jax.checkpoint(lambda c, x: lax.scan(inner, c, x)), carry, grouped)
    return carry, jax.tree.map(lambda y: y.reshape((n,) + y.shape[2:]), ys)


@functools.partial(jax.jit, static_argnames=("degree", "scale", "chunk", "causal", "kernel",
                                             "want_cert"))
def _run(qg, kh, vh, valid, protos, w, *, degree, scale, chunk, causal, kernel=None,
         want_cert=True):
    """Compiled once per shape and static option set (also inlined under an outer jit)."""
    return (_causal if causal else _non_causal)(qg, kh, vh, valid, protos, w, degree, scale,
                                                chunk, kernel, want_cert)


def plash_attention(
    q: Float[Array, "B T H D"],
    k: Float[Array, "B S Hkv D"],
    v: Float[Array, "B S Hkv Dv"],
    prototypes: Float[Array, "Hkv M D"] | None = None,
    *,
    degree: int = 2,
    sketch_dim: int = 64,
    key=None,
    causal: bool = False,
    mask: Bool[Array, "..."] | None = None,
    scale: float | None = None,
    chunk: int | None = None,
    implementation: str | None = None,
    return_aux: bool = False,
    return_lse: bool = False,
    q_segment_ids: Int[Array, "B T"] | None = None,
    kv_segment_ids: Int[Array, "B S"] | None = None,
    num_prototypes: int | None = None,
    **implementation_options,
):
    """PLASH attention (module docstring; ``docs/plash.md``).

    Args:
      q: [B, T, H, D]; k: [B, S, Hkv, D]; v: [B, S, Hkv, Dv].
      prototypes: [Hkv, M, D] (or [B, Hkv, M, D]); None: ``num_prototypes`` default ones
        (evenly spaced keys; of the first chunk when causal).
      degree: highest degree p of the logit enrichment (0…4); values are enriched to
        first order. ``degree=0``: no enrichment (λ_m = log n_m + s q·p_m, ũ_m = u_m, the
        ablation of plain prototype attention; XLA path only). sketch_dim: D, features
        per degree. key: the sketch's PRNG key (default ``jax.random.key(0)``; an int
        seed is accepted).
      causal: top-left causal; chunked (``chunk``, default min(256, T)) with exact
        attention inside the current chunk and PLASH to the earlier chunks.
      mask: key-only ([B|1, 1, 1, S]) masks are native; any other mask, or segment ids,
        falls back to exact softmax attention with certificate 0.
      scale: defaults to 1/sqrt(D).
      implementation: ``None`` / ``"xla"`` (this function), or a name of the
        ``"plash"`` spec's implementations (dispatched through the spec; ``"pallas"``:
        the compressed-past attention by ``pallas_kernels.prototype_attention``, with
        its ``block_q``, ``block_m``, ``interpret`` in ``implementation_options``).
      return_aux: also return ``{"certificate": [B, T, H] float32}``.
      return_lse: also return the log-sum-exp [B, T, H] float32 of the attention PLASH
        computes: logsumexp_m λ_m (an estimate of log Σ_j e^{s q·k_j}, so PLASH outputs
        over disjoint key sets merge by ``core.merge_attention``); causal, merged with
        the exact present chunk's; −inf for a row that sees no key.

    Returns:
      [B, T, H, Dv] in q's dtype, or (out, lse) with ``return_lse``; with ``return_aux``
      ``(that, aux)``.
    """
    if implementation not in (None, "xla") or implementation_options:
        return PLASH(q, k, v, causal=causal, mask=mask, scale=scale,
                     implementation=implementation, q_segment_ids=q_segment_ids,
                     kv_segment_ids=kv_segment_ids, return_aux=return_aux,
                     return_lse=return_lse, prototypes=prototypes, degree=degree,
                     sketch_dim=sketch_dim, key=key, chunk=chunk,
                     num_prototypes=num_prototypes, **implementation_options)
    return _plash(q, k, v, prototypes, degree=degree, sketch_dim=sketch_dim, key=key,
                  causal=causal, mask=mask, scale=scale, chunk=chunk, return_aux=return_aux,
                  return_lse=return_lse, q_segment_ids=q_segment_ids,
                  kv_segment_ids=kv_segment_ids, num_prototypes=num_prototypes)


def _plash(q, k, v, prototypes, *, degree, sketch_dim, key, causal, mask, scale, chunk,
           return_aux, return_lse, q_segment_ids, kv_segment_ids, num_prototypes,
           kernel=None, name="plash_attention"):
    """The XLA path (``kernel=None``) or the Pallas one (``kernel`` = (BlockSizes,
    interpret) for the compressed-past attention)."""
    (shapes, degree, chunk, protos, keymask, fallback, w, acc, s) = _prepare(
        q, k, v, mask=mask, scale=scale, q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids, prototypes=prototypes, num_prototypes=num_prototypes,
        degree=degree, sketch_dim=sketch_dim, key=key, chunk=chunk, causal=causal, name=name)
    if kernel is not None and degree == 0:
        raise ValueError(f"{name}: `degree`=0 (no enrichment) has no Pallas kernel; use "
                         f"implementation='xla'")
    if fallback:
        return _fallback(q, k, v, causal, mask, scale, q_segment_ids, kv_segment_ids,
                         return_aux, return_lse)
    qg = _group_q(q, shapes.kv_heads)  # cast to `acc` chunk by chunk inside _run
    kh, vh = _head_major(k), _head_major(v)
    valid = (jnp.ones((shapes.batch, 1, shapes.kv_len), acc) if keymask is None
             else keymask[:, None, :].astype(acc))
    out, lse, cert = _run(qg, kh, vh, valid, protos, w, degree=degree, scale=s, chunk=chunk,
                          causal=causal, kernel=kernel, want_cert=bool(return_aux))
    out = _ungroup(out).astype(q.dtype)
    result = (out, _ungroup(lse).astype(jnp.float32)) if return_lse else out
    if not return_aux:
        return result
    return result, {"certificate": _ungroup(cert).astype(jnp.float32)}


# ----------------------------------------------------------------------------
# The slow exact reference: per-query statistics from dense [T, S] visibility
# ----------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("degree", "scale", "chunk", "causal"))
def _reference_core(q, k, v, valid, protos, w, *, degree, scale, chunk, causal):
    """Body of :func:`plash_reference` on prepared inputs (stat dtype, valid [B, S] bool,
    protos [B, Hkv, M, d]) -> grouped (out, lse, certificate)."""
    b, t, s_len, hk = q.shape[0], q.shape[1], k.shape[1], k.shape[2]
    m, acc, s = protos.shape[2], q.dtype, scale
    qg = _group_q(q, hk)                                       # [B, K, G, T, d]
    kh, vh = _head_major(k), _head_major(v)
    a = _assign(kh, protos)                                    # [B, K, S]
    onehot = jax.nn.one_hot(a, m, dtype=acc)                   # [B, K, S, M]
    p_a = jnp.take_along_axis(protos, a[..., None], axis=2)
    r = kh - p_a
    feats = polynomial_features(r, w, max(degree, 1))
    ti, si = jnp.arange(t), jnp.arange(s_len)
    q_chunk = ti // chunk if causal else jnp.zeros_like(ti)
    k_chunk = si // chunk if causal else jnp.zeros_like(si)
    past = valid[:, None, :] & ((si[None, :] < q_chunk[:, None] * chunk) if causal
                                else jnp.ones((t, s_len), bool))[None]   # [B, T, S]
    o = onehot[:, :, None] * past[:, None, :, :, None].astype(acc)        # [B, K, T, S, M]
    n = o.sum(3)
    sums = lambda x: jnp.einsum("bktsm,bks...->bktm...", o, x)
    e = (jnp.stack([sums(f) for f in feats[1:]], axis=2) if degree > 1
         else jnp.zeros((b, hk, 1, t, m, w.shape[1]), acc))
    # anchors: mean of the cluster's keys in the first chunk where it has (valid) keys
    member = onehot * valid[:, None, :, None]                             # [B, K, S, M]
    big = jnp.iinfo(jnp.int32).max
    first = jnp.min(jnp.where(member > 0, k_chunk[None, None, :, None], big), axis=2)  # [B,K,M]
    in_first = member * (k_chunk[None, None, :, None] == first[:, :, None, :])
    cnt = jnp.maximum(in_first.sum(2), 1.0)
    ka = jnp.einsum("bksm,bksd->bkmd", in_first, kh) / cnt[..., None]
    va = jnp.einsum("bksm,bksv->bkmv", in_first, vh) / cnt[..., None]
    has = first[:, :, None, :] < q_chunk[None, None, :, None] if causal else (
        jnp.broadcast_to((first < big)[:, :, None, :], (b, hk, t, m)))
    dk = _norm(kh[:, :, :, None] - ka[:, :, None])                        # [B, K, S, M]
    dvv = _norm(vh[:, :, :, None] - va[:, :, None])
    rk = jnp.max(o * dk[:, :, None], axis=3)
    rv = jnp.max(o * dvv[:, :, None], axis=3)
    ka_t = jnp.broadcast_to(ka[:, :, None], (b, hk, t, m, ka.shape[-1]))
    va_t = jnp.broadcast_to(va[:, :, None], (b, hk, t, m, va.shape[-1]))
    stats = ClusterStats(n, sums(r), sums(jnp.sum(r * r, -1)), e, sums(vh),
                         jnp.einsum("bktsm,bksv,bksD->bktmvD", o, vh, feats[0]),
                         ka_t, va_t, has, rk, rv)
    en = _enrich(qg, stats, protos, w, degree, s, per_query=True)
    out_p, lse_p = _softmax_past(en)
    if causal:
        sc = jnp.einsum("bkgtd,bksd->bkgts", qg, kh) * s
        vis = (si[None, :] <= ti[:, None]) & (k_chunk[None, :] == q_chunk[:, None])
        vis = vis[None, None, None]
        vis = vis & valid[:, None, None, None, :]
        sc = jnp.where(vis, sc, -jnp.inf)
        probs, m_safe, l = softmax_rows(sc)
        out_c = jnp.einsum("bkgts,bksv->bkgtv", probs, vh)
        lse_c = _lse(m_safe, l)[..., 0]
        out, lse = merge_attention(out_p, lse_p, out_c, lse_c)
        dist = _norm(vh[:, :, None, None] - out[..., None, :])
        cert = _certificate(en, lse_p, out, lse,
                            exact=(out_c, lse_c, jnp.max(jnp.where(vis, dist, 0.0), -1)))
    else:
        out, lse, cert = out_p, lse_p, _certificate(en, lse_p, out_p, lse_p)
    return out, lse, cert


def plash_reference(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
                    kv_segment_ids=None, prototypes=None, num_prototypes=None, degree=2,
                    sketch_dim=64, key=None, chunk=None, return_certificate=False,
                    return_lse=False):
    """The same function as :func:`plash_attention`, computed the slow way: for every query
    its own statistics are summed from a dense [T, S] visibility matrix (keys of earlier
    chunks when causal) and its own anchors, so the chunk scan, the carry, padding and the
    merge are checked independently. O(T·S·M·dv·D) memory: tiny shapes only.
    ``return_lse``: (out, lse) as :func:`plash_attention`; ``return_certificate``: that and
    ``{"certificate": ...}``."""
    name = "plash_reference"
    (shapes, degree, chunk, protos, keymask, fallback, w, acc, s) = _prepare(
        q, k, v, mask=mask, scale=scale, q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids, prototypes=prototypes, num_prototypes=num_prototypes,
        degree=degree, sketch_dim=sketch_dim, key=key, chunk=chunk, causal=causal, name=name)
    if fallback:
        out = _fallback(q, k, v, causal, mask, scale, q_segment_ids, kv_segment_ids, True,
                        return_lse)
        return out if return_certificate else out[0]
    valid = (jnp.ones((shapes.batch, shapes.kv_len), bool) if keymask is None
             else keymask)
    out, lse, cert = _reference_core(q.astype(acc), k.astype(acc), v.astype(acc), valid,
                                     protos, w, degree=degree, scale=s, chunk=chunk,
                                     causal=causal)
    out = _ungroup(out).astype(q.dtype)
    result = (out, _ungroup(lse).astype(jnp.float32)) if return_lse else out
    if return_certificate:
        return result, {"certificate": _ungroup(cert).astype(jnp.float32)}
    return result


# ----------------------------------------------------------------------------
# The spec
# ----------------------------------------------------------------------------
def _xla(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
         kv_segment_ids=None, return_aux=False, return_lse=False, prototypes=None,
         num_prototypes=None, degree=2, sketch_dim=64, key=None, chunk=None):
    return _plash(q, k, v, prototypes, degree=degree, sketch_dim=sketch_dim, key=key,
                  causal=causal, mask=mask, scale=scale, chunk=chunk, return_aux=return_aux,
                  return_lse=return_lse, q_segment_ids=q_segment_ids,
                  kv_segment_ids=kv_segment_ids, num_prototypes=num_prototypes)


@dataclasses.dataclass(frozen=True)
class PlashKernelConfig:
    """Tiles of the ``"pallas"`` implementation
    (``pallas_kernels.prototype_attention.BlockSizes``): ``block_q`` query rows per
    program, ``block_m`` prototypes per step of its loop; powers of two ≥ 8 (≥ 16 when
    compiled for a GPU/TPU; clamped to the rounded sizes)."""

    block_q: int = 128
    block_m: int = 16

    def __post_init__(self):
        for name in ("block_q", "block_m"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, numbers.Integral) or val < 8 or (
                    val & (val - 1)):
                raise ValueError(f"PlashKernelConfig: `{name}` must be a power of two >= 8, "
                                 f"got {val!r}")


def _pallas(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
            kv_segment_ids=None, return_aux=False, return_lse=False, prototypes=None,
            num_prototypes=None, degree=2, sketch_dim=64, key=None, chunk=None,
            block_q=PlashKernelConfig.block_q, block_m=PlashKernelConfig.block_m,
            interpret=None):
    """The XLA path with the compressed-past attention (queries to enriched prototypes) by
    the Pallas kernel ``pallas_kernels.prototype_attention``; the prototype build, the
    exact present chunk, the merge and the certificate stay in XLA. ``interpret``: None =
    on CPU. ``NotImplementedError`` (before any computation) where it cannot serve."""
    PlashKernelConfig(block_q, block_m)
    kernel, interpret = resolve_kernel(_KERNEL_MODULE, interpret)
    if stat_dtype(q, k, v) == jnp.float64:
        raise NotImplementedError("does not support float64 (the kernel computes in float32)")
    sizes = kernel.BlockSizes(block_q=block_q, block_m=block_m)
    reason = kernel.unsupported_block_sizes(sizes, interpret=interpret)
    if reason:
        raise NotImplementedError(reason)
    return _plash(q, k, v, prototypes, degree=degree, sketch_dim=sketch_dim, key=key,
                  causal=causal, mask=mask, scale=scale, chunk=chunk, return_aux=return_aux,
                  return_lse=return_lse, q_segment_ids=q_segment_ids,
                  kv_segment_ids=kv_segment_ids, num_prototypes=num_prototypes,
                  kernel=(sizes, interpret), name="plash_attention(pallas)")


_KERNEL_MODULE = "pallas_kernels.prototype_attention"
_TEST_OPTIONS = {"num_prototypes": 4, "degree": 2, "sketch_dim": 8, "chunk": 8}
_PALLAS_FEATURES = Features(lse=True, dtypes=("float32", "bfloat16", "float16"))

PLASH = AttentionSpec(
    "plash", reference=plash_reference,
    implementations=(Implementation("pallas", _pallas, features=_PALLAS_FEATURES,
                                    config=PlashKernelConfig,
                                    skip_unless_named=pallas_skip_on_cpu),
                     Implementation("xla", _xla)),
    features=Features(lse=True), aux=AUX, params=LearnedParams("plash_prototypes"),
    test_options=_TEST_OPTIONS,
    benchmark_options={"num_prototypes": 64, "degree": 2, "sketch_dim": 64},
    description="PLASH: prototype attention with randomized polynomial enrichment and a "
                "per-input certificate")
