"""Spectral diagnostics of representation collapse, per layer, for any lcjax model.

The diagnostics of TRSP (ICML 2026; the public code's
``examples/eval_spectral_metrics.py``, read for the definitions) and two classics. For
one sequence, X ∈ ℝ^{N×D} holds its N valid tokens' hidden states (padding dropped) and
σ_1 ≥ σ_2 ≥ … ≥ σ_K (K = min(N, D)) its singular values:

- stable rank           Σ σ_i² / σ_1² = ‖X‖_F² / ‖X‖_2²       (1 … K)
- effective rank        exp(H(p)), p_i = σ_i / Σ σ_j          (Roy & Vetterli, 2007; 1 … K)
- spectral flatness     (Π σ_i)^{1/K} / ((1/K) Σ σ_i)          (geometric / arithmetic mean; 0 … 1;
                        σ_i < 1e-5·σ_1 count as 0: the numerical rank)
- anisotropy            mean_{i≠j} cos(x_i, x_j) = (‖Σ u_i‖² − N) / (N(N−1)), u_i = x_i/‖x_i‖
                        (O(N·D), no N×N matrix; 1 = all tokens point one way)
- attention spectral gap  1 − |λ_2| of a row-stochastic attention matrix W [T, T] (λ_1 = 1);
                        causal W is lower triangular, so its eigenvalues are its diagonal
                        (exact, any length, jit-able); a general W goes to LAPACK on the host
- perturbation-sensitivity ratio (the public code's SPR) of block l:
                        mean_t ‖δ_l(t)‖ / ‖δ_{l−1}(t)‖, δ_l = h_l(E + εZ) − h_l(E),
                        the embeddings E perturbed by Gaussian noise Z of scale ε

Everything is vectorised: one batched SVD over (layers × rows). Long sequences: exact
σ need an SVD of [N, D]; with ``rank=k`` the top k come from a randomised SVD (Halko,
Martinsson & Tropp, 2011: a Gaussian sketch, ``power_iters`` subspace iterations, QR),
and then the stable rank uses the exact ‖X‖_F², while effective rank and flatness are
those of the top-k spectrum. :func:`spectral_report` runs a model (anything with
``hidden_states(tokens | embeddings=...)``, as :class:`lcjax.nn.DecoderLM`; attention
weights through :func:`lcjax.nn.capture_attention`) and :func:`plot_spectral` draws the
per-layer curves.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lcjax.nn import capture_attention
from lcjax.optional import require

__all__ = ["FLATNESS_RTOL", "METRICS", "anisotropy", "effective_rank", "hidden_state_metrics",
           "perturbation_ratio", "plot_spectral", "randomized_singular_values",
           "singular_values", "spectral_flatness", "spectral_gap", "spectral_report",
           "stable_rank"]

FLATNESS_RTOL = 1e-5  # singular values below this fraction of σ_1 count as 0 in the flatness
METRICS = ("stable_rank", "effective_rank", "spectral_flatness", "anisotropy",
           "spectral_gap", "perturbation_ratio")


def _check_matrix(x, name: str) -> jax.Array:
    x = jnp.asarray(x)
    if x.ndim < 2 or not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name}: `x` must be a float array [..., N, D], got "
                         f"{x.dtype} {x.shape}")
    return x.astype(jnp.float32)


def _masked(x, mask, name: str):
    """x with the rows outside ``mask`` [..., N] zeroed, and the kept-row count [...]."""
    if mask is None:
        return x, jnp.full(x.shape[:-2], x.shape[-2], jnp.int32)
    mask = jnp.asarray(mask)
    if mask.shape != x.shape[:-1] or mask.dtype != jnp.bool_:
        raise ValueError(f"{name}: `mask` must be bool {x.shape[:-1]} (rows of x {x.shape}), "
                         f"got {mask.dtype} {mask.shape}")
    return jnp.where(mask[..., None], x, 0.0), jnp.sum(mask, axis=-1, dtype=jnp.int32)


def singular_values(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Exact singular values, descending: x [..., N, D] -> float32 [..., min(N, D)]
    (rows outside ``mask`` [..., N] are dropped: they become zero rows)."""
    x, _ = _masked(_check_matrix(x, "singular_values"), mask, "singular_values")
    return jnp.linalg.svd(x, compute_uv=False)


def randomized_singular_values(x: jax.Array, rank: int, *, key: jax.Array,
                               mask: jax.Array | None = None, oversample: int = 10,
                               power_iters: int = 2) -> jax.Array:
    """The top ``rank`` singular values by a randomised SVD (Halko et al., 2011).

    Y = X Ω (Ω Gaussian [D, rank + oversample]); ``power_iters`` times Y ← X (Xᵀ Q(Y))
    with Q the QR orthonormal basis; σ = svd(Q(Y)ᵀ X)[:rank]. x [..., N, D] ->
    float32 [..., rank]. Cost O(N·D·(rank + oversample)·(1 + 2·power_iters)).
    """
    x, _ = _masked(_check_matrix(x, "randomized_singular_values"), mask,
                   "randomized_singular_values")
    n, d = x.shape[-2:]
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(n, d):
        raise ValueError(f"randomized_singular_values: `rank` must be an int in "
                         f"[1, min(N, D) = {min(n, d)}], got {rank!r}")
    width = min(rank + oversample, n, d)
    omega = jax.random.normal(key, (d, width), jnp.float32)
    q, _ = jnp.linalg.qr(x @ omega)
    for _ in range(power_iters):
        q, _ = jnp.linalg.qr(x @ (jnp.swapaxes(x, -1, -2) @ q))
    return jnp.linalg.svd(jnp.swapaxes(q, -1, -2) @ x, compute_uv=False)[..., :rank]


def _count_mask(sigma, count):
    k = sigma.shape[-1]
    if count is None:
        return jnp.ones(sigma.shape, bool)
    return jnp.arange(k) < jnp.minimum(jnp.asarray(count), k)[..., None]


def stable_rank(sigma: jax.Array, frobenius2: jax.Array | None = None) -> jax.Array:
    """Σ σ² / σ_1² for σ [..., K] descending (``frobenius2`` = ‖X‖_F² replaces Σ σ² when σ
    is a truncated spectrum) -> [...]; 0 for a zero matrix."""
    sigma = jnp.asarray(sigma, jnp.float32)
    total = jnp.sum(sigma**2, -1) if frobenius2 is None else jnp.asarray(frobenius2)
    top = sigma[..., 0] ** 2
    return jnp.where(top > 0, total / jnp.where(top > 0, top, 1.0), 0.0)


def effective_rank(sigma: jax.Array, count: jax.Array | None = None) -> jax.Array:
    """exp(−Σ p log p), p = σ / Σ σ over the first ``count`` values (default all) of
    σ [..., K] -> [...] (Roy & Vetterli, 2007); 0 for a zero matrix."""
    sigma = jnp.where(_count_mask(sigma, count), jnp.asarray(sigma, jnp.float32), 0.0)
    total = jnp.sum(sigma, -1, keepdims=True)
    p = sigma / jnp.where(total > 0, total, 1.0)
    entropy = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), -1)
    return jnp.where(total[..., 0] > 0, jnp.exp(entropy), 0.0)


def spectral_flatness(sigma: jax.Array, count: jax.Array | None = None, *,
                      rtol: float = FLATNESS_RTOL) -> jax.Array:
    """Geometric over arithmetic mean of the first ``count`` values (default all) of
    σ [..., K] -> [...] in [0, 1]; 1 iff they are all equal, 0 if one is 0.

    Values below ``rtol``·σ_1 count as 0 (the numerical rank: a float32 SVD resolves σ to
    about 1e-6·σ_1, so a rank-deficient X — e.g. repeated tokens — would otherwise get a
    flatness set by rounding noise)."""
    keep = _count_mask(sigma, count)
    sigma = jnp.asarray(sigma, jnp.float32)
    sigma = jnp.where(sigma > rtol * sigma[..., :1], sigma, 0.0)
    k = jnp.maximum(jnp.sum(keep, -1), 1)
    logs = jnp.where(keep, jnp.log(jnp.where(keep & (sigma > 0), sigma, 1.0)), 0.0)
    has_zero = jnp.any(keep & (sigma <= 0), -1)
    mean = jnp.sum(jnp.where(keep, sigma, 0.0), -1) / k
    geo = jnp.exp(jnp.sum(logs, -1) / k)
    return jnp.where(has_zero | (mean <= 0), 0.0, geo / jnp.where(mean > 0, mean, 1.0))


def anisotropy(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean cosine over ordered pairs i ≠ j of the rows of x [..., N, D] kept by ``mask``
    [..., N] (and non-zero) -> [...]: (‖Σ_i u_i‖² − n) / (n(n−1)); NaN when n < 2."""
    x, _ = _masked(_check_matrix(x, "anisotropy"), mask, "anisotropy")
    norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
    u = x / jnp.where(norm > 0, norm, 1.0)
    n = jnp.sum(norm[..., 0] > 0, -1).astype(jnp.float32)
    s = jnp.sum(u, axis=-2)
    return jnp.where(n >= 2, (jnp.sum(s * s, -1) - n) / jnp.maximum(n * (n - 1), 1.0), jnp.nan)


def spectral_gap(weights, *, triangular: bool | None = None) -> jax.Array:
    """1 − |λ_2| of row-stochastic matrices ``weights`` [..., T, T] -> [...] float32.

    |λ_2| is the second largest eigenvalue modulus (λ_1 = 1 for a stochastic matrix).
    ``triangular=True`` (causal attention): the eigenvalues are the diagonal — exact for
    any T and traceable under jit. False: ``numpy.linalg.eigvals`` on the host (the
    matrices must be concrete). None: True when every entry above the diagonal is 0
    (checked on the host; under jit pass it explicitly).
    """
    if isinstance(weights, jax.core.Tracer) and triangular is None:
        raise ValueError("spectral_gap: under jit pass `triangular` (True for causal "
                         "attention; the general eigenvalue path runs on the host)")
    w = weights if isinstance(weights, jax.core.Tracer) else jnp.asarray(weights)
    if w.ndim < 2 or w.shape[-1] != w.shape[-2] or w.shape[-1] < 2:
        raise ValueError(f"spectral_gap: `weights` must be square [..., T, T] with T >= 2, "
                         f"got {w.shape}")
    if triangular is None:
        triangular = not bool(np.any(np.triu(np.asarray(w), 1)))
    if triangular:
        lam = jnp.abs(jnp.diagonal(w, axis1=-2, axis2=-1).astype(jnp.float32))
    else:
        lam = jnp.asarray(np.abs(np.linalg.eigvals(np.asarray(w, np.float64))), jnp.float32)
    second = -jnp.sort(-lam, axis=-1)[..., 1]
    return 1.0 - second


def perturbation_ratio(prev: jax.Array, cur: jax.Array, prev_perturbed: jax.Array,
                       cur_perturbed: jax.Array, mask: jax.Array | None = None, *,
                       min_delta: float = 1e-6) -> jax.Array:
    """mean_t ‖δ_cur(t)‖ / ‖δ_prev(t)‖ over the tokens kept by ``mask`` with
    ‖δ_prev(t)‖ > ``min_delta``; δ = perturbed − clean; arrays [..., N, D] -> [...]
    (NaN when no token qualifies). > 1: the block amplifies a perturbation."""
    d_in = jnp.linalg.norm((prev_perturbed - prev).astype(jnp.float32), axis=-1)
    d_out = jnp.linalg.norm((cur_perturbed - cur).astype(jnp.float32), axis=-1)
    keep = d_in > min_delta
    if mask is not None:
        keep = keep & mask
    ratio = jnp.where(keep, d_out / jnp.where(keep, d_in, 1.0), 0.0)
    n = jnp.sum(keep, -1)
    return jnp.where(n > 0, jnp.sum(ratio, -1) / jnp.maximum(n, 1), jnp.nan)


def hidden_state_metrics(h: jax.Array, mask: jax.Array | None = None, *,
                         rank: int | None = None,
                         key: jax.Array | None = None) -> dict[str, jax.Array]:
    """Stable rank, effective rank, spectral flatness and anisotropy of h [..., N, D]
    (one matrix per leading index, e.g. [layers, batch, T, D]) -> dict of [...] arrays.
    ``rank``: None for exact σ, or k for the randomised top-k (``key`` required)."""
    h = _check_matrix(h, "hidden_state_metrics")
    x, count = _masked(h, mask, "hidden_state_metrics")
    count = jnp.minimum(count, min(h.shape[-2:]))
    if rank is None:
        sigma, frob2 = jnp.linalg.svd(x, compute_uv=False), None
    else:
        if key is None:
            raise ValueError("hidden_state_metrics: a randomised SVD (`rank` given) needs `key`")
        sigma = randomized_singular_values(x, rank, key=key)
        frob2 = jnp.sum(x * x, axis=(-2, -1))
        count = jnp.minimum(count, rank)
    return {"stable_rank": stable_rank(sigma, frob2),
            "effective_rank": effective_rank(sigma, count),
            "spectral_flatness": spectral_flatness(sigma, count),
            "anisotropy": anisotropy(x, mask)}


def spectral_report(model, tokens: jax.Array, *, segment_ids: jax.Array | None = None,
                    noise: float = 1e-3, key: jax.Array | None = None,
                    rank: int | None = None, attention: bool = True) -> dict[str, np.ndarray]:
    """Every metric, per layer, for ``model`` on a batch ``tokens`` [B, T].

    ``model.hidden_states(tokens)`` gives h_0 (embeddings) … h_L; the perturbation ratio
    reruns it from h_0 + ``noise``·Z. ``segment_ids`` [B, T] (negative = padding) drops
    padding from every metric. ``rank``: randomised SVD of that rank (long sequences).
    ``attention``: the spectral gap of each layer's attention weights
    (:func:`lcjax.nn.capture_attention`; causal, so exact from the diagonal).

    Returns numpy arrays, index 0 = the embeddings: ``layer`` [L+1]; ``stable_rank``,
    ``effective_rank``, ``spectral_flatness``, ``anisotropy``, ``perturbation_ratio``
    [L+1, B] (the ratio of layer 0 is NaN); ``spectral_gap`` [L+1, B, H] (NaN at 0;
    absent without ``attention``).
    """
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"spectral_report: `tokens` must be int [batch, len], got "
                         f"{tokens.dtype} {tokens.shape}")
    if not noise > 0:
        raise ValueError(f"spectral_report: `noise` must be > 0, got {noise}")
    key = jax.random.key(0) if key is None else key
    if segment_ids is not None:
        segment_ids = jnp.asarray(segment_ids)
        if segment_ids.shape != tokens.shape:
            raise ValueError(f"spectral_report: `segment_ids` must be int {tokens.shape}, got "
                             f"{segment_ids.shape}")
    from flax import nnx  # lazy: the metrics above need no Flax

    out = nnx.jit(_report, static_argnames=("noise", "rank", "attention"))(
        model, tokens, segment_ids, key, noise=float(noise), rank=rank, attention=attention)
    out = {k: np.asarray(v) for k, v in out.items()}
    out["layer"] = np.arange(out["stable_rank"].shape[0])
    return out


def _report(model, tokens, segment_ids, key, *, noise, rank, attention):
    """The traced body of :func:`spectral_report` (one compiled program)."""
    k_noise, k_svd = jax.random.split(key)
    mask = None if segment_ids is None else segment_ids >= 0
    states = model.hidden_states(tokens, segment_ids=segment_ids)
    h = jnp.stack([s.astype(jnp.float32) for s in states])  # [L+1, B, T, D]
    z = jax.random.normal(k_noise, states[0].shape, jnp.float32)
    perturbed = model.hidden_states(embeddings=states[0] + noise * z.astype(states[0].dtype),
                                    segment_ids=segment_ids)
    hp = jnp.stack([s.astype(jnp.float32) for s in perturbed])
    lmask = None if mask is None else jnp.broadcast_to(mask, h.shape[:-1])
    out = hidden_state_metrics(h, lmask, rank=rank, key=k_svd)
    ratio = perturbation_ratio(h[:-1], h[1:], hp[:-1], hp[1:],
                               None if lmask is None else lmask[1:])
    out["perturbation_ratio"] = jnp.concatenate([jnp.full_like(ratio[:1], jnp.nan), ratio])
    if attention:
        _, weights = capture_attention(model, tokens, segment_ids=segment_ids)
        gaps = jnp.stack([spectral_gap(w, triangular=True) for w in weights])
        out["spectral_gap"] = jnp.concatenate([jnp.full_like(gaps[:1], jnp.nan), gaps])
    return out


def plot_spectral(reports: dict[str, dict] | dict, path: str | Path, *,
                  title: str | None = None) -> Path:
    """Per-layer curves (mean over the batch, ± one standard deviation) of every metric
    in ``reports`` — one :func:`spectral_report` or ``{name: report}`` to compare models —
    saved to ``path`` (PNG)."""
    with require("eval", "lcjax.analysis.spectral (plots)"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "layer" in reports:
        reports = {"model": reports}
    metrics = [m for m in METRICS if any(m in r for r in reports.values())]
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.0),
                             squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for name, rep in reports.items():
            if metric not in rep:
                continue
            v = np.asarray(rep[metric], np.float64).reshape(len(rep["layer"]), -1)
            ok = ~np.all(np.isnan(v), axis=1)
            mean = np.nanmean(v[ok], axis=1)
            std = np.nanstd(v[ok], axis=1)
            layers = np.asarray(rep["layer"])[ok]
            ax.plot(layers, mean, marker="o", label=name)
            ax.fill_between(layers, mean - std, mean + std, alpha=0.2)
        ax.set_title(metric.replace("_", " "))
        ax.set_xlabel("layer (0 = embeddings)")
    axes[0][0].legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
