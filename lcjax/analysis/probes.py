"""Generic interpretability tools for lcjax models: linear probes, head ablation, attribution.

Made for the temporal-order study (the ICML 2026 temporal-order memory paper: a linear probe
of passage index from the hidden states — the 1-D temporal code —; the attention mass from the
question to the original passages per head; ablating the top head against random heads), and
usable on any model whose attention layers are :class:`lcjax.nn.Attention`
(``lcjax.nn.DecoderLM`` and the models built from it).

Linear probe (closed-form ridge with an unpenalised intercept, fitted on a training split,
scored on held-out rows)::

    W = (Xc^T Xc + λ I)^{-1} Xc^T yc,   b = ȳ - x̄ W     (Xc, yc centred on the training rows)
    R² = 1 - Σ (y - ŷ)² / Σ (y - ȳ_test)²               (held out; averaged over targets)

Head ablation zeroes head h's contribution y_h = o_h W_o[h] to layer l's attention output
y = Σ_h o_h W_o[h] (W_o: ``o_proj`` [H, D, D_model]) by zeroing ``W_o[h]`` — the query
heads' rows, so it works unchanged under GQA (several query heads sharing one key/value
head). Layers are the model's Attention modules in module order (as in
:func:`lcjax.nn.capture_attention`).

Attention mass: per (layer, head), the mean over chosen query positions of the attention
weights summed over chosen key positions, from the layers' attention-weights taps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lcjax.nn import Attention, capture_attention

__all__ = ["ProbeResult", "ridge_fit", "r2_score", "linear_probe", "hidden_features",
           "attention_layers", "ablate_heads", "attention_mass"]


# --- linear probes ---------------------------------------------------------------------------


def _as_2d(targets: np.ndarray, n: int) -> np.ndarray:
    y = np.asarray(targets, np.float64)
    if y.ndim == 1:
        y = y[:, None]
    if y.ndim != 2 or y.shape[0] != n:
        raise ValueError(f"probe: targets must be [N] or [N, K] with N = {n}, got {y.shape}")
    return y


def ridge_fit(features, targets, *, ridge: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    """Ridge regression with an unpenalised intercept: features [N, D], targets [N] or
    [N, K] -> (W [D, K], b [K]) minimising ``|y - X W - b|² + ridge |W|²``. ``ridge = 0``
    gives the minimum-norm least-squares solution."""
    x = np.asarray(features, np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"ridge_fit: features must be [N, D] with N >= 1, got {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("ridge_fit: features contain NaN or inf")
    if not ridge >= 0:
        raise ValueError(f"ridge_fit: `ridge` must be >= 0, got {ridge!r}")
    y = _as_2d(targets, x.shape[0])
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    if ridge == 0:
        w = np.linalg.lstsq(xc, yc, rcond=None)[0]
    else:
        w = np.linalg.solve(xc.T @ xc + ridge * np.eye(x.shape[1]), xc.T @ yc)
    return w, my - mx @ w


def r2_score(targets, predictions) -> float:
    """Coefficient of determination ``1 - SS_res / SS_tot`` (about each target's mean),
    averaged over targets ([N] or [N, K]); nan when a target is constant."""
    y = _as_2d(targets, np.shape(targets)[0])
    p = _as_2d(predictions, y.shape[0])
    if p.shape != y.shape:
        raise ValueError(f"r2_score: targets {y.shape} and predictions {p.shape} differ")
    ss_tot = ((y - y.mean(0)) ** 2).sum(0)
    ss_res = ((y - p) ** 2).sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = np.where(ss_tot > 0, 1.0 - ss_res / np.where(ss_tot > 0, ss_tot, 1.0), np.nan)
    return float(r2.mean())


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """A fitted probe: held-out ``r2``, ``train_r2``, the weights [D, K] and intercept [K]
    of the last fit, and how many rows were trained on / held out (per fold: summed)."""

    r2: float
    train_r2: float
    weights: np.ndarray
    bias: np.ndarray
    n_train: int
    n_test: int


def _splits(n: int, groups, test_fraction: float, folds: int | None, seed: int):
    """(train index, test index) pairs: one random split or ``folds`` folds, over rows or,
    with ``groups``, over distinct group values (a group is never on both sides)."""
    rng = np.random.default_rng(seed)
    if groups is None:
        keys = np.arange(n)
    else:
        keys = np.asarray(groups)
        if keys.shape != (n,):
            raise ValueError(f"linear_probe: groups must be [N] = [{n}], got {keys.shape}")
    units = rng.permutation(np.unique(keys))
    if folds is None:
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"linear_probe: `test_fraction` must be in (0, 1), "
                             f"got {test_fraction!r}")
        n_test = int(round(test_fraction * len(units)))
        if not 1 <= n_test < len(units):
            raise ValueError(f"linear_probe: {len(units)} rows/groups cannot be split with "
                             f"test_fraction={test_fraction}")
        chunks = [units[:n_test]]
    else:
        if not isinstance(folds, int) or not 2 <= folds <= len(units):
            raise ValueError(f"linear_probe: `folds` must be an int in [2, {len(units)}], "
                             f"got {folds!r}")
        chunks = np.array_split(units, folds)
    for chunk in chunks:
        test = np.isin(keys, chunk)
        yield np.flatnonzero(~test), np.flatnonzero(test)


def linear_probe(features, targets, *, ridge: float = 1e-3, test_fraction: float = 0.25,
                 folds: int | None = None, groups=None, seed: int = 0) -> ProbeResult:
    """Held-out R² of a ridge probe from features [N, D] to targets [N] or [N, K].

    One random split (``test_fraction`` of the rows held out) or, with ``folds``, k-fold
    cross-validation whose R² is that of the pooled out-of-fold predictions. ``groups``
    [N] (e.g. the passage or book of each row) splits by group, so the held-out rows come
    from groups never trained on. Shuffled targets give R² ≈ 0 (slightly below: about
    -D/N_train); a linear target with small noise gives R² ≈ 1.
    """
    x = np.asarray(features, np.float64)
    if x.ndim != 2:
        raise ValueError(f"linear_probe: features must be [N, D], got {x.shape}")
    y = _as_2d(targets, x.shape[0])
    pred = np.full_like(y, np.nan)
    n_train = n_test = 0
    train_r2 = []
    for tr, te in _splits(x.shape[0], groups, test_fraction, folds, seed):
        w, b = ridge_fit(x[tr], y[tr], ridge=ridge)
        pred[te] = x[te] @ w + b
        train_r2.append(r2_score(y[tr], x[tr] @ w + b))
        n_train, n_test = n_train + len(tr), n_test + len(te)
    held = ~np.isnan(pred[:, 0])
    return ProbeResult(r2=r2_score(y[held], pred[held]), train_r2=float(np.mean(train_r2)),
                       weights=w, bias=b, n_train=n_train, n_test=n_test)


def hidden_features(model, tokens, positions, layer: int) -> np.ndarray:
    """Residual-stream vectors ``model.hidden_states(tokens)[layer]`` at ``positions``:
    tokens int [B, T], positions int [B, P] (or [P], the same for every row) ->
    float32 [B, P, D]. ``layer`` 0 is the embeddings, L the last block's output."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"hidden_features: tokens must be int [B, T], got {tokens.shape}")
    pos = np.asarray(positions)
    pos = np.broadcast_to(pos, (tokens.shape[0], pos.shape[-1])) if pos.ndim == 1 else pos
    if pos.ndim != 2 or pos.shape[0] != tokens.shape[0]:
        raise ValueError(f"hidden_features: positions must be [P] or [B, P] with B = "
                         f"{tokens.shape[0]}, got {np.shape(positions)}")
    if pos.size and (pos.min() < 0 or pos.max() >= tokens.shape[1]):
        raise ValueError(f"hidden_features: positions must lie in [0, {tokens.shape[1]})")
    states = _hidden_states(model, jnp.asarray(tokens, jnp.int32))
    if not isinstance(layer, int | np.integer) or not 0 <= layer < len(states):
        raise ValueError(f"hidden_features: `layer` must be in [0, {len(states) - 1}], "
                         f"got {layer!r}")
    h = states[int(layer)]
    return np.asarray(jnp.take_along_axis(h, jnp.asarray(pos)[..., None], axis=1), np.float32)


@nnx.jit
def _hidden_states(model, tokens):
    """``model.hidden_states(tokens)`` compiled (once per model structure and shape)."""
    return model.hidden_states(tokens)


# --- heads ------------------------------------------------------------------------------------


def attention_layers(model) -> list:
    """The model's :class:`lcjax.nn.Attention` modules in module order (layer 0 first)."""
    return [m for _, m in nnx.iter_modules(model) if isinstance(m, Attention)]


def ablate_heads(model, heads: Sequence[tuple[int, int]]):
    """A copy of ``model`` with each (layer, head)'s contribution to its layer's attention
    output removed: ``o_proj[head] = 0`` in that layer (query heads, so GQA too); the model
    passed in is unchanged."""
    layers = attention_layers(model)
    if not layers:
        raise ValueError(f"ablate_heads: {type(model).__name__} has no Attention layer")
    heads = [tuple(int(v) for v in lh) for lh in heads]
    for lh in heads:
        if len(lh) != 2 or not 0 <= lh[0] < len(layers) or not 0 <= lh[1] < layers[
                lh[0]].num_heads:
            raise ValueError(f"ablate_heads: (layer, head) {lh} outside [0, {len(layers)}) x "
                             f"[0, {layers[0].num_heads})")
    copy = nnx.clone(model)
    copy_layers = attention_layers(copy)
    for layer, head in heads:
        w = copy_layers[layer].o_proj
        w[...] = w[...].at[head].set(0)
    return copy


def attention_mass(model, tokens, query_mask, key_mask) -> np.ndarray:
    """Attention mass per head: tokens int [B, T], query_mask and key_mask bool [B, T] ->
    float64 [B, L, H], ``mean_{q in Q_b} sum_{k in K_b} w_{l,h}[b, q, k]`` with w the layer's
    dense attention weights (its attention-weights tap, :func:`lcjax.nn.capture_attention`;
    variants with dense weights: softmax, blockwise, entmax, ...)."""
    tokens = np.asarray(tokens)
    qm, km = np.asarray(query_mask, bool), np.asarray(key_mask, bool)
    if tokens.ndim != 2 or qm.shape != tokens.shape or km.shape != tokens.shape:
        raise ValueError(f"attention_mass: tokens, query_mask, key_mask must all be [B, T]; "
                         f"got {tokens.shape}, {qm.shape}, {km.shape}")
    if not qm.any(-1).all():
        raise ValueError("attention_mass: every row needs at least one query position")
    weights = np.asarray(_stacked_weights(model, jnp.asarray(tokens, jnp.int32)), np.float64)
    per_query = (weights * km[:, None, None, None, :]).sum(-1)  # [B, L, H, T]
    return (per_query * qm[:, None, None, :]).sum(-1) / qm.sum(-1)[:, None, None]


@nnx.jit
def _stacked_weights(model, tokens):
    """[B, L, H, T, S] attention weights of a full pass (compiled once per shape)."""
    _, weights = capture_attention(model, tokens)
    return jnp.stack(weights, axis=1)
