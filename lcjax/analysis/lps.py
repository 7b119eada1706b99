"""LPS — the Long-context Potential Score of attention heads, from the weights alone.

Method of the LPS paper (ICML 2026 set; public code OpenDFM/long-context-heads, read for
the method, not copied). For query head h of a layer with H query and H_kv key heads the
key head is g = h // (H / H_kv) (grouped-query attention). RoPE rotates the pair of head
dimensions (a_m, b_m) — (m, m + d/2) in the half-rotation layout (HF / Llama / Qwen),
(2m, 2m + 1) interleaved — by n θ_m, so the bilinear form between a query at i and a key
at j = i + n is xᵀ M(n) y with

    M(n) = Σ_m M_m(n),   M_m(n) = A_mᵀ R_m(n) B_m,   R_m(n) = s [[cos nθ_m, −sin nθ_m],
                                                                [sin nθ_m,  cos nθ_m]],

A_m, B_m [2, D_model] the rows (a_m, b_m) of W_Q (head h) and W_K (head g), s the RoPE
attention scaling (1 but for YaRN). The kernel energy of pair m is computed in closed
form from 2×2 Gram blocks, never forming the D_model × D_model matrices:

    e_m = ‖A_mᵀ R B_m‖_F² = tr(Rᵀ (A_m A_mᵀ) R (B_m B_mᵀ)).

With p = e / Σ e over the d/2 pairs (pair 0 the highest frequency):

    s_eRank = 1 − exp(−Σ p log p) / (d/2)      (1 − effective rank fraction; 0 log 0 = 0)
    s_dist  = Σ_m p_m · linspace(0, 1, d/2)[m]  (energy on the low frequencies)
    LPS     = s_dist^0.4 · s_eRank^0.6

and the symmetry penalty of the whole kernel M = W_qᵀ R W_k (W_q, W_k [d, D_model] the
head's rows, R the block rotation [d, d]):

    sym = | ‖(M + Mᵀ)/2‖_F² / ‖M‖_F² − 1/2 | = | tr((R C)²) | / (2 tr(Rᵀ G_q R G_k)),
    G_q = W_q W_qᵀ,  G_k = W_k W_kᵀ,  C = W_k W_qᵀ   (all d × d),

ranking score = LPS − 0.5 · sym. The distance n defaults to −32768, as the paper's
notebooks pass (the public functions default to −65536: a parameter here); angles are
float64. The only heavy work is the three Gram products G_q, G_k, C per layer (contractions
over D_model, ~3·H·d²·D_model multiply-adds), one single-threaded OpenBLAS call per head on
strided [D_model, d] views of the weights' own [D_model, heads, d] layout, in ``gram_dtype``
(float32 default, float64 for exactness); everything after them is O(H·d²) float64 numpy
(rotations applied pairwise, never as d × d matmuls). Layers run in parallel threads
(``workers``, default the CPU count), so memory holds the given layers plus ``workers``
layers' products. Frequencies come
from ``lcjax.rope.scaled_inv_freq`` (RoPE scaling included).

Enhancement (:func:`enhance_heads`): scale both W_Q rows of pair m by mult[m] for the
selected heads (W_K untouched), so e_m -> mult[m]² e_m exactly. Presets (64 pairs, as the
paper's notebooks apply them): :data:`LLAMA_MULTIPLIER` =
linspace(0.8, 1, 40) ‖ linspace(1, 1.2, 8) ‖ linspace(1.2, 1, 8) ‖ ones(8), each segment
without its end point; :data:`QWEN3_MULTIPLIER` = ones(8) ‖ linspace(1, 0.2, 24) ‖
linspace(0.2, 1, 16) ‖ linspace(1, 1.4, 8) ‖ linspace(1.4, 1, 8), with end points.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from lcjax.optional import require
from lcjax.rope import scaled_inv_freq

with require("eval", "lcjax.analysis.lps"):
    from threadpoolctl import threadpool_limits

__all__ = ["LPSResult", "kernel_energies", "scores_from_energies", "lps_scores", "model_lps",
           "enhance_heads", "enhance_model", "multiplier_schedule", "LLAMA_MULTIPLIER",
           "QWEN3_MULTIPLIER", "MULTIPLIER_PRESETS", "pair_indices", "rotation_matrix",
           "resample_multiplier"]

DEFAULT_DISTANCE = -32768


def multiplier_schedule(segments: Sequence[tuple[float, float, int]], *,
                        endpoint: bool = False) -> np.ndarray:
    """Concatenated ``linspace(start, stop, num, endpoint=endpoint)`` segments: a
    per-pair multiplier [Σ num] (pair 0 = highest frequency)."""
    parts = []
    for seg in segments:
        if len(seg) != 3 or int(seg[2]) < 1:
            raise ValueError(f"multiplier_schedule: segments are (start, stop, num >= 1), "
                             f"got {seg!r}")
        parts.append(np.linspace(float(seg[0]), float(seg[1]), int(seg[2]), endpoint=endpoint))
    return np.concatenate(parts)


LLAMA_MULTIPLIER = multiplier_schedule([(0.8, 1.0, 40), (1.0, 1.2, 8), (1.2, 1.0, 8),
                                        (1.0, 1.0, 8)])
QWEN3_MULTIPLIER = multiplier_schedule([(1.0, 1.0, 8), (1.0, 0.2, 24), (0.2, 1.0, 16),
                                        (1.0, 1.4, 8), (1.4, 1.0, 8)], endpoint=True)
MULTIPLIER_PRESETS = {"llama": LLAMA_MULTIPLIER, "qwen3": QWEN3_MULTIPLIER}


def _preset(multiplier, caller: str):
    """``MULTIPLIER_PRESETS[multiplier]`` for a preset name (ValueError naming ``caller``
    for an unknown one); any other value unchanged."""
    if not isinstance(multiplier, str):
        return multiplier
    if multiplier not in MULTIPLIER_PRESETS:
        raise ValueError(f"{caller}: preset must be one of {sorted(MULTIPLIER_PRESETS)}, "
                         f"got {multiplier!r}")
    return MULTIPLIER_PRESETS[multiplier]


def resample_multiplier(multiplier, pairs: int) -> np.ndarray:
    """A per-pair schedule (pair 0 = highest frequency) carried to a head with ``pairs``
    RoPE pairs by linear interpolation over the frequency index (pair m of the result sits at
    fraction m / (pairs − 1) of the source's index range); a preset name is accepted."""
    src = np.asarray(_preset(multiplier, "resample_multiplier"), np.float64)
    if src.ndim != 1 or src.size < 2 or pairs < 1:
        raise ValueError(f"resample_multiplier: need a 1-D schedule of >= 2 pairs and "
                         f"pairs >= 1, got shape {src.shape} and pairs={pairs}")
    if pairs == 1:
        return src[-1:].copy()
    return np.interp(np.linspace(0, src.size - 1, pairs), np.arange(src.size), src)


def pair_indices(head_dim: int, layout: str = "half") -> tuple[np.ndarray, np.ndarray]:
    """The RoPE pairs (a_m, b_m), m = 0 .. d/2 − 1: (m, m + d/2) for ``"half"``,
    (2m, 2m + 1) for ``"interleaved"``."""
    if head_dim % 2:
        raise ValueError(f"pair_indices: head_dim must be even, got {head_dim}")
    m = np.arange(head_dim // 2)
    if layout == "half":
        return m, m + head_dim // 2
    if layout == "interleaved":
        return 2 * m, 2 * m + 1
    raise ValueError(f"pair_indices: layout must be 'half' or 'interleaved', got {layout!r}")


def rotation_matrix(frequencies: np.ndarray, distance: float, *, layout: str = "half",
                    attention_scaling: float = 1.0) -> np.ndarray:
    """R(n) [d, d] float64: s [[cos nθ_m, −sin nθ_m], [sin nθ_m, cos nθ_m]] on each pair."""
    theta = np.asarray(frequencies, np.float64)
    d = 2 * theta.shape[0]
    a, b = pair_indices(d, layout)
    ang = float(distance) * theta
    c, s = attention_scaling * np.cos(ang), attention_scaling * np.sin(ang)
    r = np.zeros((d, d))
    r[a, a], r[a, b], r[b, a], r[b, b] = c, -s, s, c
    return r


def _layers(w, name: str) -> list[np.ndarray]:
    """Per-layer [D_model, heads, d] arrays (views, no copies) from [L, D_model, heads, d],
    [D_model, heads, d] or a sequence of per-layer arrays."""
    if isinstance(w, (list, tuple)):
        layers = [np.asarray(x) for x in w]
    else:
        w = np.asarray(w)
        layers = [w] if w.ndim == 3 else list(w) if w.ndim == 4 else [w]
    for x in layers:
        if x.ndim != 3:
            raise ValueError(f"lps: `{name}` must be [layers, d_model, heads, head_dim], "
                             f"[d_model, heads, head_dim] or a list of the latter, got a "
                             f"layer of shape {x.shape}")
    return layers


@dataclasses.dataclass(frozen=True)
class LPSResult:
    """Per (layer, query head) scores, arrays [L, H] (``energies`` [L, H, d/2])."""

    energies: np.ndarray
    s_dist: np.ndarray
    s_erank: np.ndarray
    lps: np.ndarray
    sym: np.ndarray
    score: np.ndarray
    distance: float

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.score.shape)

    def records(self) -> list[dict[str, Any]]:
        """One dict per (layer, head), 0-based, with lps, s_dist, s_erank, sym, score."""
        num_layers, num_heads = self.shape
        return [{"layer": int(i), "head": int(h), "lps": float(self.lps[i, h]),
                 "s_dist": float(self.s_dist[i, h]), "s_erank": float(self.s_erank[i, h]),
                 "sym": float(self.sym[i, h]), "score": float(self.score[i, h])}
                for i in range(num_layers) for h in range(num_heads)]

    def top(self, k: int = 20, by: str = "score") -> list[dict[str, Any]]:
        """The ``k`` records with the highest ``by`` (score, lps, s_dist, s_erank)."""
        if by not in ("score", "lps", "s_dist", "s_erank", "sym"):
            raise ValueError(f"LPSResult.top: `by` must be a score name, got {by!r}")
        return sorted(self.records(), key=lambda r: -r[by])[:k]

    def top_heads(self, k: int = 20) -> list[tuple[int, int]]:
        """(layer, head) of the ``k`` best ranking scores."""
        return [(r["layer"], r["head"]) for r in self.top(k)]

    def to_json(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.records(), f, indent=1)

    def heatmap(self, path: str | os.PathLike, *, what: str = "score", top: int = 0,
                title: str | None = None) -> None:
        """Layer × head heat-map PNG of ``what`` (the ``top`` best heads boxed)."""
        with require("eval", "lcjax.analysis.lps (plots)"):
            import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        values = getattr(self, what)
        num_layers, num_heads = self.shape
        fig, ax = plt.subplots(figsize=(min(2 + 0.3 * num_heads, 16),
                                        min(1.5 + 0.25 * num_layers, 12)))
        im = ax.imshow(values, aspect="auto", cmap="viridis", origin="lower")
        fig.colorbar(im, ax=ax, label=what)
        for layer, head in self.top_heads(top) if top else ():
            ax.add_patch(plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False,
                                       edgecolor="red", linewidth=1.5))
        ax.set_xlabel("query head")
        ax.set_ylabel("layer")
        ax.set_title(title or f"{what} (distance n = {self.distance:g})")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


def scores_from_energies(energies: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(s_dist, s_erank, LPS) from kernel energies [..., d/2] (module docstring); a head
    with no energy scores 0."""
    e = np.asarray(energies, np.float64)
    total = e.sum(-1, keepdims=True)
    ok = total[..., 0] > 0
    p = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    erank = np.exp(-plogp.sum(-1))
    num = e.shape[-1]
    s_erank = np.where(ok, 1.0 - erank / num, 0.0)
    s_dist = np.where(ok, (p * np.linspace(0.0, 1.0, num)).sum(-1), 0.0)
    s_erank = np.clip(s_erank, 0.0, None)  # rounding can give −1e-16 at uniform energy
    return s_dist, s_erank, s_dist ** 0.4 * s_erank ** 0.6


def _gram_products(wq, wk, dtype):
    """One layer's Gram products, one BLAS call per head on strided [D_model, d] views of the
    weights' own layout (no transposed copies): wq [Dm, H, d], wk [Dm, Hkv, d] ->
    G_q [H, d, d] = W_q W_qᵀ, G_k [Hkv, d, d] = W_k W_kᵀ, C [H, d, d] = W_k W_qᵀ (key head
    h // (H/Hkv); one product per key head against its group's query heads side by side)."""
    dm, heads, d = wq.shape
    kv_heads = wk.shape[1]
    rep = heads // kv_heads
    q2 = np.ascontiguousarray(wq, dtype).reshape(dm, heads * d)
    k2 = np.ascontiguousarray(wk, dtype).reshape(dm, kv_heads * d)
    gq = np.empty((heads, d, d), dtype)
    gk = np.empty((kv_heads, d, d), dtype)
    cross = np.empty((kv_heads, d, rep * d), dtype)
    for h in range(heads):
        qh = q2[:, h * d:(h + 1) * d]
        np.matmul(qh.T, qh, out=gq[h])
    for g in range(kv_heads):
        kg = k2[:, g * d:(g + 1) * d]
        np.matmul(kg.T, kg, out=gk[g])
        np.matmul(kg.T, q2[:, g * rep * d:(g + 1) * rep * d], out=cross[g])
    cross = cross.reshape(kv_heads, d, rep, d).transpose(0, 2, 1, 3).reshape(heads, d, d)
    return gq, gk, cross


def _pairs_view(x, layout: str):
    """Axis −2 of ``x`` [..., d, n] as [..., 2, d/2, n]: [..., 0, m] = a_m, [..., 1, m] = b_m
    (a view, no copy)."""
    *lead, d, n = x.shape
    if layout == "half":
        return x.reshape(*lead, 2, d // 2, n)
    return np.swapaxes(x.reshape(*lead, d // 2, 2, n), -3, -2)


def _rotate_rows(x, c, s, layout: str):
    """R x along axis −2 for the block rotation R = [[c, −s], [s, c]] on each pair (a_m, b_m);
    O(d²) elementwise per matrix instead of a d × d matmul."""
    xv = _pairs_view(x, layout)
    y = np.empty_like(x)
    yv = _pairs_view(y, layout)
    c, s = c[:, None], s[:, None]
    yv[..., 0, :, :] = c * xv[..., 0, :, :] - s * xv[..., 1, :, :]
    yv[..., 1, :, :] = s * xv[..., 0, :, :] + c * xv[..., 1, :, :]
    return y


def _layer_terms(wq, wk, c, s, layout, gram_dtype):
    """One layer: wq [Dm, H, d], wk [Dm, Hkv, d] -> (energies [H, d/2], sym [H]); the Gram
    products in ``gram_dtype``, the rest in float64 from d × d matrices."""
    heads, kv_heads, d = wq.shape[1], wk.shape[1], wq.shape[2]
    gq, gk, cross = (x.astype(np.float64, copy=False)
                     for x in _gram_products(wq, wk, np.dtype(gram_dtype)))
    group = np.arange(heads) // (heads // kv_heads)
    a, b = pair_indices(d, layout)
    # 2×2 blocks of the pairs: G[m] = [[G_aa, G_ab], [G_ba, G_bb]]
    idx = np.stack([a, b], -1)                                            # [P, 2]
    bq = gq[:, idx[:, :, None], idx[:, None, :]]                          # [H, P, 2, 2]
    bk = gk[:, idx[:, :, None], idx[:, None, :]][group]
    rm = np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)      # [P, 2, 2]
    energies = np.einsum("pji,hpjk,pkl,hpli->hp", rm, bq, rm, bk)
    # ‖M‖_F² = tr(G_q R G_k Rᵀ) = Σ G_q ⊙ (R G_k Rᵀ) (both symmetric), R G_k Rᵀ once per
    # key head; R G_k Rᵀ = R (R G_k)ᵀ for symmetric G_k
    rgr = _rotate_rows(np.swapaxes(_rotate_rows(gk, c, s, layout), -1, -2), c, s, layout)
    norm2 = np.einsum("hij,hij->h", gq, rgr[group])
    rc = _rotate_rows(cross, c, s, layout)
    trace_m2 = np.einsum("hij,hji->h", rc, rc)                            # tr((R C)²)
    sym = np.abs(trace_m2) / (2 * np.where(norm2 > 0, norm2, 1.0))
    return energies, np.where(norm2 > 0, sym, 0.0)


def kernel_energies(wq, wk, frequencies, *, distance: float = DEFAULT_DISTANCE,
                    layout: str = "half", attention_scaling: float = 1.0,
                    gram_dtype=np.float32,
                    workers: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Kernel energies e [L, H, d/2] and symmetry penalties sym [L, H].

    Args:
      wq: W_Q as [L, D_model, H, d] (``DecoderLM``'s ``q_proj`` stacked; [D_model, H, d]
        for one layer), or a sequence of per-layer arrays (read one at a time).
      wk: W_K as [L, D_model, H_kv, d] (or a sequence); H % H_kv == 0.
      frequencies: θ [d/2] (``lcjax.rope.scaled_inv_freq``).
      distance: n = j − i (negative: a key n tokens before the query).
      layout: "half" | "interleaved" RoPE pairs.
      gram_dtype: dtype of the Gram products (float64 for exact comparisons).
      workers: layers scored at once (threads, each with a single-threaded BLAS; default
        the CPU count).
    """
    theta = np.asarray(frequencies, np.float64)
    layers_q, layers_k = _layers(wq, "wq"), _layers(wk, "wk")
    if len(layers_q) != len(layers_k):
        raise ValueError(f"lps: wq has {len(layers_q)} layers, wk {len(layers_k)}")
    ang = float(distance) * theta                      # float64 angles
    c, s = attention_scaling * np.cos(ang), attention_scaling * np.sin(ang)
    for lq, lk in zip(layers_q, layers_k):
        dm, heads, d = lq.shape
        if lk.shape[0] != dm or lk.shape[2] != d or heads % lk.shape[1]:
            raise ValueError(f"lps: W_K heads {lk.shape} ([D_model, H_kv, d]) do not fit W_Q "
                             f"heads {lq.shape} ([D_model, H, d]; H % H_kv == 0, same d_model "
                             f"and head_dim)")
        if theta.shape != (d // 2,):
            raise ValueError(f"lps: frequencies must have shape ({d // 2},), got {theta.shape}")
        pair_indices(d, layout)  # validates the layout
    workers = max(1, min(workers or os.cpu_count() or 1, len(layers_q)))
    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(workers) as pool:
        terms = list(pool.map(lambda lq, lk: _layer_terms(lq, lk, c, s, layout, gram_dtype),
                              layers_q, layers_k))
    energies, syms = zip(*terms)
    return np.stack(energies), np.stack(syms)


def lps_scores(wq, wk, *, frequencies=None, head_dim: int | None = None,
               rope_base: float = 10000.0, rope_scaling: Mapping | None = None,
               distance: float = DEFAULT_DISTANCE, layout: str = "half",
               attention_scaling: float = 1.0, sym_weight: float = 0.5,
               gram_dtype=np.float32, workers: int | None = None) -> LPSResult:
    """LPS, s_dist, s_eRank, sym and the ranking score LPS − ``sym_weight``·sym for every
    (layer, query head); W_Q, W_K as in :func:`kernel_energies`. Frequencies default to
    ``scaled_inv_freq(head_dim, rope_base, rope_scaling)`` (head_dim read from ``wq``)."""
    if frequencies is None:
        if head_dim is None:
            first = wq[0] if isinstance(wq, (list, tuple)) else np.asarray(wq)
            head_dim = int(np.shape(first)[-1])
        frequencies = scaled_inv_freq(head_dim, rope_base, rope_scaling)
    energies, sym = kernel_energies(wq, wk, frequencies, distance=distance, layout=layout,
                                    attention_scaling=attention_scaling, gram_dtype=gram_dtype,
                                    workers=workers)
    s_dist, s_erank, lps = scores_from_energies(energies)
    return LPSResult(energies=energies, s_dist=s_dist, s_erank=s_erank, lps=lps, sym=sym,
                     score=lps - sym_weight * sym, distance=float(distance))


def model_lps(model, **kwargs) -> LPSResult:
    """:func:`lps_scores` of a :class:`lcjax.nn.DecoderLM` (its q_proj / k_proj, RoPE base,
    scaling and layout); ``kwargs`` as :func:`lps_scores` (e.g. ``distance``)."""
    c = model.config
    if c.position != "rope":
        raise ValueError(f"model_lps: needs a RoPE model, got position={c.position!r}")
    wq = [np.asarray(block.attn.q_proj[...], np.float32) for block in model.blocks]
    wk = [np.asarray(block.attn.k_proj[...], np.float32) for block in model.blocks]
    kwargs.setdefault("frequencies", scaled_inv_freq(c.head_dim, c.rope_base, c.rope_scaling))
    kwargs.setdefault("layout", c.rope_layout)
    return lps_scores(wq, wk, **kwargs)


def _multipliers(multipliers, num_heads: int, pairs: int) -> np.ndarray:
    mult = np.asarray(_preset(multipliers, "enhance_heads"), np.float64)
    if mult.ndim == 1:
        mult = np.broadcast_to(mult, (num_heads, mult.shape[0]))
    if mult.shape != (num_heads, pairs):
        raise ValueError(f"enhance_heads: multipliers must be [{pairs}] or "
                         f"[{num_heads} heads, {pairs}] (one per RoPE pair), got "
                         f"{np.shape(multipliers)}")
    return mult


def enhance_heads(params, heads: Sequence[tuple[int, int]], multipliers, *,
                  layout: str = "half"):
    """Scale the two W_Q rows of each RoPE pair m by mult[m] for the selected heads.

    Args:
      params: a ``DecoderLM``'s parameters as a nested mapping with
        ``params["blocks"][layer]["attn"]["q_proj"]`` [D_model, H, d] (e.g.
        ``nnx.to_pure_dict(nnx.state(model))``); a ``q_bias`` there is scaled alike.
      heads: (layer, query head) pairs, 0-based.
      multipliers: [d/2], [len(heads), d/2], or a preset name ("llama", "qwen3").
      layout: RoPE layout of the model ("half" | "interleaved").

    Returns:
      New params (same nesting, other arrays shared; W_K untouched).
    """
    heads = [(int(layer), int(head)) for layer, head in heads]
    if len(set(heads)) != len(heads):
        raise ValueError(f"enhance_heads: `heads` lists a (layer, head) twice: {heads}")
    blocks = params["blocks"]
    edited: dict[int, dict[str, np.ndarray]] = {}
    mult = None
    for i, (layer, head) in enumerate(heads):
        if layer not in blocks and str(layer) not in blocks:
            raise ValueError(f"enhance_heads: layer {layer} not in params (blocks "
                             f"{sorted(blocks)})")
        attn = blocks[layer if layer in blocks else str(layer)]["attn"]
        if layer not in edited:
            edited[layer] = {k: np.array(attn[k], copy=True) for k in ("q_proj", "q_bias")
                             if k in attn}
        wq = edited[layer]["q_proj"]
        num_heads, d = wq.shape[1], wq.shape[2]
        if not 0 <= head < num_heads:
            raise ValueError(f"enhance_heads: head {head} of layer {layer} out of range "
                             f"[0, {num_heads})")
        if mult is None:
            mult = _multipliers(multipliers, len(heads), d // 2)
        a, b = pair_indices(d, layout)
        for arr, rows in ((wq, np.s_[:, head]), (edited[layer].get("q_bias"), np.s_[head])):
            if arr is None:
                continue
            sub = arr[rows]  # [..., d]: scaled in float64, stored back in arr's dtype
            for idx in (a, b):
                sub[..., idx] = (sub[..., idx].astype(np.float64) * mult[i]).astype(arr.dtype)
            arr[rows] = sub
    new_blocks = dict(blocks)
    for layer, arrays in edited.items():
        key = layer if layer in blocks else str(layer)
        new_blocks[key] = {**blocks[key], "attn": {**blocks[key]["attn"], **arrays}}
    return {**params, "blocks": new_blocks}


def enhance_model(model, heads: Sequence[tuple[int, int]], multipliers):
    """A new :class:`lcjax.nn.DecoderLM` with :func:`enhance_heads` applied (the input
    model is unchanged)."""
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)
    pure = nnx.to_pure_dict(state)
    new = enhance_heads(pure, heads, multipliers, layout=model.config.rope_layout)
    dtype = model.config.param_dtype
    new = _map_arrays(new, pure, lambda x: jnp.asarray(x, dtype))
    nnx.replace_by_pure_dict(state, new)  # swaps in new Variables; the model keeps its own
    return nnx.merge(graphdef, state)


def _map_arrays(new, old, fn):
    """Apply ``fn`` to the leaves of ``new`` that are not the same object as in ``old``."""
    if isinstance(new, Mapping):
        return {k: _map_arrays(v, old.get(k) if isinstance(old, Mapping) else None, fn)
                for k, v in new.items()}
    return new if new is old else fn(new)


def _time_8b(layers: int = 32, gram_dtype=np.float32, workers: int | None = None
             ) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) :func:`lps_scores` takes on random weights of a
    Llama-3-8B shape (32 layers, D_model 4096, 32 query / 8 key heads, d 128, rope_theta
    500000 with llama3 scaling); ``layers`` < 32 times fewer layers (4 distinct random
    layers, cycled: the same work per layer)."""
    import time

    rng = np.random.default_rng(0)
    dm, heads, kv_heads, d = 4096, 32, 8, 128
    wq = [rng.standard_normal((dm, heads, d), dtype=np.float32) * 0.02 for _ in range(4)]
    wk = [rng.standard_normal((dm, kv_heads, d), dtype=np.float32) * 0.02 for _ in range(4)]
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    wall, cpu = time.perf_counter(), time.process_time()
    lps_scores([wq[i % 4] for i in range(layers)], [wk[i % 4] for i in range(layers)],
               frequencies=scaled_inv_freq(d, 500000.0, scaling), gram_dtype=gram_dtype,
               workers=workers)
    return time.perf_counter() - wall, time.process_time() - cpu


def _main(argv=None) -> None:
    """``python -m lcjax.analysis.lps [--layers 32] [--workers N] [--repeat 3]``: time
    :func:`lps_scores` on random weights of the Llama-3-8B shape (wall and CPU seconds, with
    the load average, since a loaded machine stretches the wall time)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lcjax.analysis.lps",
                                     description=_main.__doc__)
    parser.add_argument("--layers", type=int, default=32, help="layers of 32 to score")
    parser.add_argument("--workers", type=int, default=None, help="threads (default: CPUs)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs")
    args = parser.parse_args(argv)
    for i in range(args.repeat):
        wall, cpu = _time_8b(args.layers, workers=args.workers)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"lps_scores, Llama-3-8B shape, {args.layers} of 32 layers, run {i + 1}: "
              f"{wall:.2f} s wall, {cpu:.2f} s CPU ({os.cpu_count()} CPUs, load average "
              f"{load:.1f})", flush=True)


if __name__ == "__main__":
    _main()
