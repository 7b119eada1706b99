"""TRSP — the Topologically Regularized Side-Path (SBA·Tri) of a pre-norm decoder block.

Paper: "TRSP: Topologically Regularized Side-Path" (ICML 2026;
public code Eziotao-tyd/TRSP, ``trsp/sba_tri.py``, read for the method, not copied).
Layer ℓ (0-based) adds a parameter-free causal low-pass filter of its input to the
attention residual, scaled by a length-aware gate::

    X_mid = X_in + Attn(LN(X_in)) + γ_ℓ · Tri_ℓ(X_in),      then X_mid + MLP(LN(X_mid))

- Causal box filter of window L (by cumulative sums, always divided by L, zeros before
  the sequence start)::

      box_L(x)_t = (1/L) · Σ_{j = max(s, t-L+1)}^{t} x_j          (s: the segment start)

- Triangle filter: Tri_ℓ = box_L ∘ box_L with L = b_ℓ + 1, b_ℓ = min(2^ℓ, L_ctx): the
  causal kernel h[k] = (L - |k - (L-1)|) / L², k = 0 … 2L-2 (peak 1/L at lag b_ℓ).
- Gate: r = max(b_ℓ / L_ctx, 1e-6), φ = softplus(κ),
  γ_ℓ = sigmoid(MLP(log₂ r)) · r^φ, with ONE MLP 1→16→tanh→1 and ONE κ (κ₀ = 0) shared
  by all layers: 1·16 + 16 + 16·1 + 1 + 1 = 50 parameters (:class:`TRSPGate`).

**L_ctx.** In the public code L_ctx is the whole sequence's (the batch's longest) valid
length while training and ``cache_position[-1] + 1`` while decoding, so γ — and hence
every earlier output — changes as the sequence grows, and the cached decoder filters only
the new token (its outputs differ from the full pass). Here ``context="causal"`` (the
default) uses a per-position L_ctx(t) = the number of valid tokens of t's segment up to and
including t: the layer is causal, padding changes nothing, and KV-cache decoding equals
the full pass. ``context="sequence"`` is the paper's whole-sequence choice, per segment
(the number of valid tokens in t's segment): NOT causal — a later token changes earlier
outputs — so it has no cached decoding.

Since L_ctx varies with t, so do b_ℓ and L. Where L(t) is smaller than the largest window
L_max = min(2^ℓ, T) + 1, L_ctx(t) < 2^ℓ, so the window reaches past the segment start and
only the rising edge of the kernel, h[k] = (k+1)/L², sees tokens: the filter is the fixed
L_max filter times (L_max / L(t))². :func:`triangle_filter` computes it that way (two
first-order cumulative sums: second-order prefix sums lose precision on long sequences).

**Padding and packing.** ``lengths`` [B] (valid leading tokens) or ``segment_ids`` [B, T]
(negative = padding). Padding tokens are skipped: the filters run over each row's valid
tokens in order, and a segment is a maximal run of equal ids among them (a packer's
layout); padding outputs are 0. So inserting padding anywhere changes no real token.

**Decoding** (:func:`trsp_side_path` with a :class:`TRSPState`): the state holds, per row,
the last L_max prefix sums of x and of box(x) (float32 [B, L_max, D] each) and the valid
count, so a decoding step costs O(L_max · D) and equals the full pass. The decoder's cache
is :class:`TRSPCache` (a :class:`~lcjax.nn.KVCache` plus the state), built by
``DecoderLM.init_cache`` when ``DecoderConfig(trsp=True)``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from lcjax.nn.attention import KVCache

__all__ = ["CONTEXTS", "TRSPCache", "TRSPGate", "TRSPState", "box_filter", "context_lengths",
           "init_trsp_state", "max_window", "triangle_filter", "triangle_kernel",
           "trsp_side_path"]

CONTEXTS = ("causal", "sequence")
MIN_RATIO = 1e-6  # r = b / L_ctx is clamped below, as in the paper's gate


# ----------------------------------------------------------------------------
# Validation and the valid-token layout
# ----------------------------------------------------------------------------
def _check_x(x, name: str) -> None:
    if getattr(x, "ndim", None) != 3 or not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name}: `x` must be a float array [batch, len, dim], got "
                         f"{getattr(x, 'dtype', type(x))} {getattr(x, 'shape', None)}")


def _check_int(value, arg: str, name: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name}: `{arg}` must be a static int >= {lo}, got {value!r}")
    return value


def _valid(x_shape, lengths, segment_ids, name: str):
    """(valid [B, T] bool or None, segment ids [B, T] or None, needs compaction)."""
    b, t = x_shape[:2]
    if lengths is not None and segment_ids is not None:
        raise ValueError(f"{name}: pass `lengths` or `segment_ids`, not both")
    if lengths is not None:
        lengths = jnp.asarray(lengths)
        if lengths.shape != (b,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
            raise ValueError(f"{name}: `lengths` must be int [batch={b}], got "
                             f"{lengths.dtype} {lengths.shape}")
        return jnp.arange(t)[None, :] < lengths[:, None], None, False
    if segment_ids is not None:
        segment_ids = jnp.asarray(segment_ids)
        if segment_ids.shape != (b, t) or not jnp.issubdtype(segment_ids.dtype, jnp.integer):
            raise ValueError(f"{name}: `segment_ids` must be int [batch={b}, len={t}], got "
                             f"{segment_ids.dtype} {segment_ids.shape}")
        return segment_ids >= 0, segment_ids, True
    return None, None, False


def _compact(x, valid):
    """Move each row's valid tokens to the front, in order: (x_c [B, T, ...], slot [B, T])
    with ``x_c[b, slot[b, t]] = x[b, t]`` for valid t (zeros after the valid ones)."""
    b, t = valid.shape
    slot = jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1
    target = jnp.where(valid, slot, t)  # out of range: dropped
    rows = jnp.arange(b)[:, None]
    return jnp.zeros_like(x).at[rows, target].set(x, mode="drop"), slot


def _expand(y_c, valid, slot):
    """Inverse of :func:`_compact`: y [B, T, ...] with y[b, t] = y_c[b, slot[b, t]] for
    valid t and 0 for padding."""
    idx = jnp.clip(slot, 0)
    y = jnp.take_along_axis(y_c, idx.reshape(idx.shape + (1,) * (y_c.ndim - 2)), axis=1)
    return jnp.where(valid.reshape(valid.shape + (1,) * (y_c.ndim - 2)), y, 0)


def _layout(t: int, valid_c=None, seg_c=None):
    """Segment starts, causal counts and segment lengths on the compacted layout
    (valid tokens first): three int32 [B, T] (or [1, T] without padding information)."""
    pos = jnp.arange(t, dtype=jnp.int32)[None, :]
    if seg_c is None:  # one segment per row, starting at 0
        start = jnp.zeros_like(pos)
        n_valid = (jnp.full((1, 1), t, jnp.int32) if valid_c is None
                   else jnp.sum(valid_c, axis=1, keepdims=True, dtype=jnp.int32))
        seg_len = jnp.maximum(n_valid, 1) + 0 * pos  # [B or 1, T]
        return start, pos + 1, seg_len
    prev = jnp.pad(seg_c[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    nxt_valid = jnp.pad(valid_c[:, 1:], ((0, 0), (0, 1)), constant_values=False)
    nxt = jnp.pad(seg_c[:, 1:], ((0, 0), (0, 1)), constant_values=-1)
    is_start = valid_c & (seg_c != prev)
    is_end = valid_c & (~nxt_valid | (nxt != seg_c))
    start = lax.cummax(jnp.where(is_start, pos, 0), axis=1)
    end = lax.cummin(jnp.where(is_end, pos, t - 1), axis=1, reverse=True)
    return start, pos - start + 1, end - start + 1


def _prepare(x, lengths, segment_ids, name):
    """Shared front of the filters: compacted x (float32), layout and the way back."""
    valid, seg, compact = _valid(x.shape, lengths, segment_ids, name)
    xf = x.astype(jnp.float32)
    if compact:
        xf, slot = _compact(xf, valid)
        seg_c, _ = _compact(seg, valid)
        valid_c = jnp.arange(x.shape[1])[None, :] < jnp.sum(valid, 1, keepdims=True)
        layout = _layout(x.shape[1], valid_c, seg_c)
        back = lambda y: _expand(y, valid, slot)
    else:
        layout = _layout(x.shape[1], valid)
        back = (lambda y: y) if valid is None else (lambda y: jnp.where(valid[..., None], y, 0))
    return xf, layout, back


# ----------------------------------------------------------------------------
# The filters
# ----------------------------------------------------------------------------
def _box_scan(x, window: int, start, history=None):
    """Causal box filter on a compacted float32 x [B, T, D] by cumulative sums.

    ``history`` [B, W, D] (W = ``window``): the prefix sums S[n-W+1 … n] of the tokens
    before x (zeros where n < 0), or None (none). ``start`` [B or 1, T]: each token's
    segment start (index into x; ``-n`` when the segment began n tokens before x).
    Returns (y [B, T, D], A [B, W + T, D]) with A = history ++ prefix sums of x.
    """
    b, t, d = x.shape
    if history is None:
        history = jnp.zeros((b, window, d), jnp.float32)
    sums = history[:, -1:] + jnp.cumsum(x, axis=1)
    a = jnp.concatenate([history, sums], axis=1)
    # S before the window: S[max(t - W, start - 1)], at index W + that in A
    lo = jnp.maximum(jnp.arange(t, dtype=jnp.int32)[None, :], window + start - 1)
    left = jnp.take_along_axis(a, jnp.broadcast_to(lo, (b, t))[..., None], axis=1)
    return (sums - left) / window, a


def max_window(level: int, length: int) -> int:
    """L_max = min(2^level, length) + 1: the triangle's widest box window for a sequence
    (or cache) of ``length`` tokens."""
    return min(2 ** level, length) + 1


def box_filter(x: jax.Array, L: int, lengths: jax.Array | None = None, *,
               segment_ids: jax.Array | None = None) -> jax.Array:
    """Causal box filter, always divided by L (module docstring).

        y[b, t] = (1/L) · Σ_{j = max(s_t, t-L+1)}^{t} x[b, j]

    Args:
      x: float [B, T, D].
      L: static window length >= 1 (L = 1 is the identity).
      lengths: int [B], valid leading tokens per row (or None: all valid).
      segment_ids: int [B, T], negative = padding (instead of ``lengths``); padding is
        skipped and each run of equal ids is filtered on its own.

    Returns:
      y [B, T, D] in x's dtype (computed in float32; 0 at padding).
    """
    _check_x(x, "box_filter")
    _check_int(L, "L", "box_filter", 1)
    xf, (start, _, _), back = _prepare(x, lengths, segment_ids, "box_filter")
    return back(_box_scan(xf, L, start)[0]).astype(x.dtype)


def triangle_kernel(L: int) -> jax.Array:
    """h [2L - 1] float32, h[k] = (L - |k - (L-1)|) / L²: the kernel of box_L ∘ box_L
    (y_t = Σ_k h[k] x_{t-k}); it sums to 1."""
    _check_int(L, "L", "triangle_kernel", 1)
    k = jnp.arange(2 * L - 1, dtype=jnp.float32)
    return (L - jnp.abs(k - (L - 1))) / L**2


def _triangle_scan(x, level, start, lctx, history1=None, history2=None, window=None):
    """Tri_ℓ on compacted x: (y [B, T, D], b_ℓ [B, T], A1, A2)."""
    window = max_window(level, x.shape[1]) if window is None else window
    z, a1 = _box_scan(x, window, start, history1)
    y, a2 = _box_scan(z, window, start, history2)
    bandwidth = jnp.minimum(lctx, window - 1)  # min(2^ℓ, L_ctx), as L_ctx <= length
    rescale = (window / (bandwidth + 1).astype(jnp.float32)) ** 2
    return y * rescale[..., None], bandwidth, a1, a2


def _check_context(context, name):
    if context not in CONTEXTS:
        raise ValueError(f"{name}: `context` must be one of {CONTEXTS}, got {context!r}")


def triangle_filter(x: jax.Array, level: int, lengths: jax.Array | None = None, *,
                    segment_ids: jax.Array | None = None,
                    context: str = "causal") -> jax.Array:
    """Tri_ℓ(x) = box_L ∘ box_L (x) with L = b_ℓ + 1, b_ℓ = min(2^ℓ, L_ctx), per position.

    Args:
      x: float [B, T, D].
      level: ℓ >= 0 (the 0-based layer index in TRSP).
      lengths, segment_ids: padding / packing, as :func:`box_filter`.
      context: "causal" (L_ctx(t) = valid tokens of t's segment up to t; default) or
        "sequence" (L_ctx = valid tokens of t's whole segment; not causal).

    Returns:
      y [B, T, D] in x's dtype: y_t = Σ_k h_{L(t)}[k] x_{t-k} over t's segment
      (:func:`triangle_kernel`), 0 at padding.
    """
    _check_x(x, "triangle_filter")
    _check_int(level, "level", "triangle_filter", 0)
    _check_context(context, "triangle_filter")
    xf, (start, count, seg_len), back = _prepare(x, lengths, segment_ids, "triangle_filter")
    lctx = count if context == "causal" else seg_len
    return back(_triangle_scan(xf, level, start, lctx)[0]).astype(x.dtype)


def context_lengths(shape: tuple[int, int], lengths: jax.Array | None = None, *,
                    segment_ids: jax.Array | None = None,
                    context: str = "causal") -> jax.Array:
    """L_ctx int32 [B, T] for inputs of ``shape`` (B, T): the number of valid tokens of t's
    segment up to and including t ("causal") or in the whole segment ("sequence"); 0 at
    padding."""
    _check_context(context, "context_lengths")
    b, t = shape
    valid, seg, compact = _valid((b, t), lengths, segment_ids, "context_lengths")
    if compact:
        seg_c, slot = _compact(seg, valid)
        valid_c = jnp.arange(t)[None, :] < jnp.sum(valid, 1, keepdims=True)
        _, count, seg_len = _layout(t, valid_c, seg_c)
        out = _expand(count if context == "causal" else seg_len, valid, slot)
    else:
        _, count, seg_len = _layout(t, valid)
        out = jnp.broadcast_to(count if context == "causal" else seg_len, (b, t))
        out = out if valid is None else jnp.where(valid, out, 0)
    return out.astype(jnp.int32)


# ----------------------------------------------------------------------------
# The shared gate
# ----------------------------------------------------------------------------
class TRSPGate(nnx.Module):
    """The length-aware gate shared by all layers: γ = sigmoid(MLP(log₂ r)) · r^softplus(κ).

    MLP: 1 → ``hidden`` (16) → tanh → 1; weights and biases initialised U(-1/√fan_in,
    1/√fan_in) (PyTorch's ``nn.Linear`` default, as the public code), κ = 0.
    With hidden = 16: 50 parameters. Call ``gate(bandwidth, lctx)`` with int arrays of one
    shape (b_ℓ and L_ctx) -> float32 γ of that shape.
    """

    def __init__(self, hidden: int = 16, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        _check_int(hidden, "hidden", "TRSPGate", 1)
        k1, k2, k3, k4 = jax.random.split(rngs.params(), 4)
        u = lambda key, shape, fan_in: jax.random.uniform(
            key, shape, param_dtype, -1.0 / fan_in**0.5, 1.0 / fan_in**0.5)
        self.w1 = nnx.Param(u(k1, (1, hidden), 1))
        self.b1 = nnx.Param(u(k2, (hidden,), 1))
        self.w2 = nnx.Param(u(k3, (hidden, 1), hidden))
        self.b2 = nnx.Param(u(k4, (1,), hidden))
        self.kappa = nnx.Param(jnp.zeros((), param_dtype))

    def __call__(self, bandwidth: jax.Array, lctx: jax.Array) -> jax.Array:
        """γ float32, shape of ``bandwidth`` (b_ℓ) and ``lctx`` (L_ctx >= 1)."""
        r = jnp.maximum(bandwidth.astype(jnp.float32) / jnp.maximum(lctx, 1), MIN_RATIO)
        f32 = lambda p: p[...].astype(jnp.float32)
        h = jnp.tanh(jnp.log2(r)[..., None] * f32(self.w1)[0] + f32(self.b1))
        logit = h @ f32(self.w2)[:, 0] + f32(self.b2)[0]
        phi = jax.nn.softplus(f32(self.kappa))
        return jax.nn.sigmoid(logit) * jnp.exp(phi * jnp.log(r))


# ----------------------------------------------------------------------------
# The side path, with decoding state
# ----------------------------------------------------------------------------
class TRSPState(NamedTuple):
    """Per-layer decoding state of the side path (float32; W = L_max of the layer).

    box1: [B, W, D] the last W prefix sums of the layer input x (oldest first; zeros
      before the sequence start); box2: [B, W, D] the same for box_W(x);
      count: int32 [B], valid tokens seen (L_ctx of the last one).
    """

    box1: jax.Array
    box2: jax.Array
    count: jax.Array


def init_trsp_state(batch: int, d_model: int, level: int, max_len: int) -> TRSPState:
    """Empty :class:`TRSPState` for layer ``level`` of a cache of ``max_len`` tokens
    (W = :func:`max_window` (level, max_len))."""
    w = max_window(_check_int(level, "level", "init_trsp_state", 0),
                   _check_int(max_len, "max_len", "init_trsp_state", 1))
    zeros = jnp.zeros((batch, w, d_model), jnp.float32)
    return TRSPState(zeros, zeros, jnp.zeros((batch,), jnp.int32))


class TRSPCache(NamedTuple):
    """A decoder layer's cache with TRSP: the :class:`~lcjax.nn.KVCache` fields
    (``k, v, segment_ids, index``) and the side path's :class:`TRSPState` ``trsp``."""

    k: jax.Array
    v: jax.Array
    segment_ids: jax.Array
    index: jax.Array
    trsp: TRSPState

    @property
    def kv(self) -> KVCache:
        return KVCache(self.k, self.v, self.segment_ids, self.index)

    @classmethod
    def of(cls, kv: KVCache, trsp: TRSPState) -> TRSPCache:
        return cls(kv.k, kv.v, kv.segment_ids, kv.index, trsp)


def trsp_side_path(x: jax.Array, level: int, gate: TRSPGate, *,
                   segment_ids: jax.Array | None = None, lengths: jax.Array | None = None,
                   context: str = "causal",
                   state: TRSPState | None = None) -> tuple[jax.Array, TRSPState | None]:
    """γ_ℓ · Tri_ℓ(x): the side path of layer ``level`` (added to x + Attn(LN(x))).

    Args:
      x: float [B, T, D], the block's input X_in.
      level: ℓ, the 0-based layer index.
      gate: the shared :class:`TRSPGate`.
      segment_ids / lengths: padding and packing (:func:`box_filter`).
      context: "causal" or "sequence" (:func:`triangle_filter`; no ``state`` with it).
      state: None for a full pass; a :class:`TRSPState` to continue a row's sequence
        (decoding): every valid token (segment id >= 0; all, without ``segment_ids``) of
        the T new ones follows the row's earlier valid tokens, in one segment.

    Returns:
      (side [B, T, D] in x's dtype, 0 at padding; the new state, or None without one).
    """
    _check_x(x, "trsp_side_path")
    _check_int(level, "level", "trsp_side_path", 0)
    _check_context(context, "trsp_side_path")
    if state is None:
        xf, (start, count, seg_len), back = _prepare(x, lengths, segment_ids,
                                                     "trsp_side_path")
        lctx = count if context == "causal" else seg_len
        y, bandwidth, _, _ = _triangle_scan(xf, level, start, lctx)
        return back(gate(bandwidth, lctx)[..., None] * y).astype(x.dtype), None
    if context != "causal":
        raise ValueError("trsp_side_path: context='sequence' is not causal (L_ctx is the "
                         "whole segment's length), so it has no decoding state; use "
                         "context='causal'")
    b, t, d = x.shape
    w = state.box1.shape[1]
    if state.box1.shape != (b, w, d) or state.box2.shape != (b, w, d):
        raise ValueError(f"trsp_side_path: state box1 {state.box1.shape} / box2 "
                         f"{state.box2.shape} do not fit x {x.shape} ([B, W, D])")
    valid, _, _ = _valid(x.shape, lengths, segment_ids, "trsp_side_path")
    xf = x.astype(jnp.float32)
    if valid is None:
        n_new = jnp.full((b,), t, jnp.int32)
        back = lambda y: y
    else:
        xf, slot = _compact(xf, valid)
        n_new = jnp.sum(valid, axis=1, dtype=jnp.int32)
        back = lambda y: _expand(y, valid, slot)
    count0 = state.count[:, None]
    pos = jnp.arange(t, dtype=jnp.int32)[None, :]
    y, bandwidth, a1, a2 = _triangle_scan(xf, level, -count0, count0 + pos + 1,
                                          state.box1, state.box2, window=w)
    keep = (n_new[:, None] + jnp.arange(w)[None, :])[..., None]  # the last W prefix sums
    new = TRSPState(jnp.take_along_axis(a1, keep, axis=1),
                    jnp.take_along_axis(a2, keep, axis=1), state.count + n_new)
    side = back(gate(bandwidth, count0 + pos + 1)[..., None] * y)
    return side.astype(x.dtype), new
