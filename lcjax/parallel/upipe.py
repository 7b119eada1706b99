"""UPipe: head-chunked Ulysses for a whole attention layer (the untied-Ulysses paper,
ICML 2026; public code ghadiaravi13/untied-ulysses, PyTorch).

Ulysses (:mod:`lcjax.parallel.ulysses`) projects all H query heads, all-to-alls them
and attends with H/C heads per device at once, so its attention intermediates (q, k, v
in the head layout, the output, their cotangents) are ∝ H/C heads over the full length
T. UPipe runs the layer in P = H/C stages of C heads (one head per device per stage):

    stage (c, j):  q_s = RoPE(x Wq[:, heads_s])            [B, T/C, C, D]  (local)
                   q_s -> all_to_all -> [B, T, 1, D];  o_s = attn(q_s, K_c, V_c)
                   o_s -> all_to_all -> [B, T/C, C, D];  y += o_s Wo[heads_s]

K/V chunk c (C kv heads, one per device) is projected and all-to-all'd once and reused
by the G' = H / max(Hkv, C) query stages j of its group (the paper's "K/V when
s mod g = 0"). The layer is a ``custom_vjp`` whose forward keeps its inputs (x,
positions, the weights) and, when there is one K/V chunk (Hkv <= C, ``save_kv``), that
chunk's k, v in the head layout (two one-head [B, T, 1, D] tensors, live through the
backward anyway); the backward runs the stage loops again (``lax.scan``, so XLA cannot
keep all stages alive), recomputing each stage's query projection, RoPE and all-to-alls
(and the K/V chunks not kept) and the attention forward, and summing the kv cotangents
over the G' stages of a group. For exact softmax by its XLA path (``"softmax"``,
``"blockwise"``) the stage's forward is run with its LSE, its output moved to the
sequence layout at once, and the FlashAttention-2 backward
(:func:`lcjax.attention.core.blockwise_attention_bwd`, delta = Σ_D dO·O formed in the
sequence layout where dO = dy Wo_sᵀ and O both are) adds the stage's dk, dv into the
chunk's accumulators block by block, so no stage-sized dk, dv (nor a head-layout O) sits
beside them; other variants (entmax, ...) go through their own VJP and the sums. Peak
attention intermediates are therefore ∝ one head per device instead of H/C. The
all-to-all volume equals Ulysses', in P pieces.

``save_attention_output=True`` is the paper's residual choice: the forward also keeps
each stage's output (sequence layout, all stages together [B, T/C, H, D], the size of x)
and its LSE, and the backward starts from them — no attention forward, no output
all-to-all in the backward (exact softmax only; other variants re-run their forward).
It is off by default: it costs about an x-sized buffer (H = 32, C = 8, GQA: 125.5 against
97.3 MiB at T = 32K, 40.1% of Ulysses' temp bytes instead of 31.1%; 470 against 369 MiB,
36.9% instead of 29.0%, at 128K) for the attention forward's share of a step, which is
small at the lengths timed on CPU (``docs/context_parallel.md``).

What the layer does not keep (measured: ``docs/context_parallel.md``): the stages' shares
of the output projection (forward) and of dx (backward, dq_s Wq_sᵀ, dk Wkᵀ, dv Wvᵀ) are
added into the one [B, L, d] accumulator (:func:`accumulate_matmul`; optionally one
sequence slice at a time), and the weight gradients are contracted as dpᵀ x, not xᵀ dp
(for which XLA's CPU dot copied x transposed) — with autodiff of a scan of
``jax.checkpoint``ed stages XLA kept an x-sized per-stage product beside the accumulator.
The forward's residuals pass through a ``lax.optimization_barrier`` with y, so the
backward cannot start beside the forward.

Head order — standard GQA exactly, no permutation of weights. With virtual kv heads
Hv = max(Hkv, C) (each kv head repeated R = Hv / Hkv times when Hkv < C; the gather's
transpose sums the copies' gradients) and G' = H / Hv, stage (c, j) takes query heads

    h(c, j, i) = (c C + i) G' + j,   i = 0 .. C-1  (device i after the all-to-all),

paired with virtual kv head c C + i = kv head (c C + i) // R, which is h // G (G = H/Hkv):
exactly the kv head standard GQA gives query head h. Wq's columns and Wo's rows are
gathered in that order, so a checkpoint of :class:`lcjax.nn.Attention` loads unchanged
(the public code instead permutes the output heads before Wo).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from lcjax.attention import blockwise_attention, dot_product_attention, get
from lcjax.attention.blocks import match_varying, varying_axes
from lcjax.attention.core import blockwise_attention_bwd
from lcjax.parallel.common import local_positions, resolve_mesh, resolve_variant
from lcjax.parallel.mesh import CONTEXT, DATA
from lcjax.parallel.ulysses import heads_to_seq, seq_to_heads
from lcjax.parallel.validation import axis_size, check_batch, check_heads, check_length
from lcjax.rope import apply_rope

__all__ = ["accumulate_matmul", "stage_heads", "upipe_layer", "upipe_local"]


def stage_heads(heads: int, kv_heads: int, context: int) -> tuple[np.ndarray, np.ndarray]:
    """The head plan: (q_heads [n_c, G', C], kv_heads [n_c, C]) with q_heads[c, j, i] the
    query head device i attends at stage (c, j) and kv_heads[c, i] the (original) kv head
    of chunk c on device i; n_c = Hv / C kv chunks, G' = H / Hv query stages per chunk."""
    repeats = check_heads("upipe", heads, kv_heads, context)
    virtual = kv_heads * repeats
    n_c, g = virtual // context, heads // virtual
    c, j, i = np.meshgrid(np.arange(n_c), np.arange(g), np.arange(context), indexing="ij")
    q_heads = (c * context + i) * g + j
    kv = (np.arange(n_c)[:, None] * context + np.arange(context)[None, :]) // repeats
    return q_heads, kv


def accumulate_matmul(acc: jax.Array, a: jax.Array, w: jax.Array, equation: str,
                      chunks: int = 1) -> jax.Array:
    """``acc + einsum(equation, a, w)`` with acc, a [B, L, ...], computed in ``chunks``
    sequence slices of L / chunks, each added into ``acc`` in place
    (``dynamic_update_slice`` in a ``fori_loop``): the full-size product is never a
    buffer of its own, only one slice of it (what accumulating the output projection,
    and in the backward dx, over the P stages needs)."""
    w = w.astype(acc.dtype)
    if chunks <= 1:
        return acc + jnp.einsum(equation, a.astype(acc.dtype), w)
    size = acc.shape[1] // chunks

    def body(i, acc):
        a_i = lax.dynamic_slice_in_dim(a, i * size, size, axis=1).astype(acc.dtype)
        acc_i = lax.dynamic_slice_in_dim(acc, i * size, size, axis=1)
        return lax.dynamic_update_slice_in_dim(acc, acc_i + jnp.einsum(equation, a_i, w),
                                               i * size, axis=1)

    return lax.fori_loop(0, chunks, body, acc)


def _chunks(length: int, d_model: int, heads_width: int) -> int:
    """Slices of the sequence for :func:`accumulate_matmul`: the fewest that make one
    slice of the [B, L, d_model] product no larger than a stage's [B, L, C, D] tensors
    (a divisor of L)."""
    want = max(1, -(-d_model // max(1, heads_width)))
    return next((n for n in range(want, length + 1) if length % n == 0), length)


def _weight_grad(dp: jax.Array, x: jax.Array) -> jax.Array:
    """dW [d, n, D] of a projection p = x W from dp [B, L, n, D]: contracted as
    dpᵀ x -> [n, D, d] and transposed (a small copy), not as xᵀ dp, for which XLA's CPU
    dot copies x transposed — a full [d, L] buffer (measured)."""
    return jnp.transpose(jnp.einsum("BTNH,BTD->NHD", dp, x.astype(dp.dtype)), (2, 0, 1))


def upipe_local(params: Mapping[str, jax.Array], x, positions, *, axis: str, size: int,
                attn: Callable, causal: bool, scale=None, rope_base: float | None = 10000.0,
                accumulate_slices: int | None = 1, save_attention_output: bool = False,
                save_kv: bool = True, **options):
    """The UPipe layer inside ``shard_map`` over ``axis`` (``size`` = C devices): local x
    [B, L, d] (sequence slice, device order), positions [B, L] -> y [B, L, d].

    A ``custom_vjp``: the forward keeps its inputs (x, positions, weights), with
    ``save_kv`` the K/V chunk when there is one (n_c = 1), with ``save_attention_output``
    each stage's output and LSE (exact softmax variants only; the module docstring); the
    backward loops over the stages again, recomputes what was not kept (projections,
    RoPE, all-to-alls, the attention forward through the variant's own VJP), and
    accumulates dx and the stage's output-projection share (:func:`accumulate_matmul`).
    ``accumulate_slices``:
    sequence slices of those additions (1, the default: one add per stage; None: slices
    no larger than a stage's [B, L, C, D] tensors; docs/context_parallel.md has the
    measurements).

    Weight gradients: each stage writes its heads' slice of dWq, dWo (and each kv chunk
    its slice of dWk, dWv) in place (``dynamic_update_slice`` into a layout where a
    stage's heads are one slice; no scatter, no gathered weight copies). Under
    ``check_vma=True`` (x varies over the mesh axes, the weights do not) each slice is
    ``psum``'d where it is made, so the loops carry the final, replicated gradients (which
    XLA can keep in the output buffers) instead of per-device partials; with
    ``check_vma=False`` the loops carry partials and ``shard_map``'s transpose sums them.
    """
    wq, wk, wv, wo = (params[n] for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
    plan = _plan(wq, wk, x, axis=axis, size=size, attn=attn, causal=causal, scale=scale,
                 rope_base=rope_base, accumulate_slices=accumulate_slices,
                 save_attention_output=save_attention_output, save_kv=save_kv,
                 options=options)

    @jax.custom_vjp
    def layer(wq, wk, wv, wo, x, positions):
        return _forward(plan, wq, wk, wv, wo, x, positions, False, False)[0]

    layer.defvjp(functools.partial(_layer_fwd, plan), functools.partial(_layer_bwd, plan))
    if not plan.reduce_axes:
        # weights varying like x: the custom_vjp returns this device's partial dW and the
        # cast's transpose (or shard_map's, without check_vma) sums them outside it
        wq, wk, wv, wo = match_varying((wq, wk, wv, wo), x)
    return layer(wq, wk, wv, wo, x, positions)


@dataclasses.dataclass(frozen=True, eq=False)
class _Plan:
    """What every stage of one UPipe layer shares (static under the trace).

    ``d``, ``hd``: model and head widths; ``n_c`` kv chunks of ``g`` query stages each
    (:func:`stage_heads`); ``repeats`` = R copies of each kv head (> 1 only when n_c = 1,
    Hkv < C); ``chunks``: sequence slices of :func:`accumulate_matmul`; ``reduce_axes``:
    mesh axes x varies over and the weights do not (dW slices are ``psum``'d there);
    ``bwd_options``: :func:`_softmax_backward_options` (None: the variant's own VJP);
    ``save``/``keep_kv``: the forward keeps each stage's output and LSE / the K/V chunk.
    """

    axis: str
    size: int
    d: int
    hd: int
    kv_heads: int
    n_c: int
    g: int
    repeats: int
    chunks: int
    reduce_axes: tuple
    attn: Callable
    causal: bool
    scale: float | None
    rope_base: float | None
    options: Mapping
    bwd_options: dict | None
    save: bool
    keep_kv: bool


def _plan(wq, wk, x, *, axis, size, attn, causal, scale, rope_base, accumulate_slices,
          save_attention_output, save_kv, options) -> _Plan:
    """The :class:`_Plan` of :func:`upipe_local`'s arguments (wq [d, H, D], wk
    [d, Hkv, D], local x [B, L, d])."""
    d, heads, hd = wq.shape
    kv_heads_n = wk.shape[1]
    q_np, _ = stage_heads(heads, kv_heads_n, size)
    n_c, g = q_np.shape[0], q_np.shape[1]
    chunks = (_chunks(x.shape[1], x.shape[2], size * hd)
              if accumulate_slices is None else accumulate_slices)
    bwd_options = _softmax_backward_options(attn, options)
    return _Plan(
        axis=axis, size=size, d=d, hd=hd, kv_heads=kv_heads_n, n_c=n_c, g=g,
        repeats=n_c * size // kv_heads_n, chunks=chunks,
        # mesh axes x varies over; the weights do not (check_vma=True): reduce dW slices there
        reduce_axes=tuple(a for a in varying_axes(x) if a not in varying_axes(wq)),
        attn=attn, causal=causal, scale=scale, rope_base=rope_base, options=options,
        bwd_options=bwd_options, save=save_attention_output and bwd_options is not None,
        keep_kv=save_kv and n_c == 1)


def _attend(plan: _Plan, q, k, v):
    """The variant's attention of one stage: q, k, v [B, T, 1, D] -> [B, T, 1, D]."""
    return plan.attn(q, k, v, causal=plan.causal, scale=plan.scale, **plan.options)


def _attend_lse(plan: _Plan, q, k, v):
    """:func:`_attend` with its LSE: ([B, T, 1, D], lse [B, T, 1])."""
    return plan.attn(q, k, v, causal=plan.causal, scale=plan.scale, return_lse=True,
                     **plan.options)


def _rope(plan: _Plan, t, positions):
    return t if plan.rope_base is None else apply_rope(t, positions, base=plan.rope_base)


def _q_heads(plan: _Plan, qp, positions):
    """A stage's projected queries [B, L, C, D] -> RoPE'd, head layout [B, T, 1, D]."""
    return seq_to_heads(_rope(plan, qp, positions), plan.axis)


def _kv_heads(plan: _Plan, kp, vp, positions):
    """A chunk's projected k, v [B, L, C, D] -> (RoPE'd k, v) in the head layout."""
    return seq_to_heads(_rope(plan, kp, positions), plan.axis), seq_to_heads(vp, plan.axis)


def _proj(x, w):
    """x [B, L, d] @ w [d, n, D] -> [B, L, n, D]."""
    return jnp.einsum("BTD,DNH->BTNH", x, w.astype(x.dtype))


# stage (c, j) takes query heads (c C + i) g + j, i < C: one slice of these views
def _q_view(plan: _Plan, w):
    """Wq [d, H, D] -> [d, n_c, C, g, D]."""
    return w.reshape(plan.d, plan.n_c, plan.size, plan.g, plan.hd)


def _o_view(plan: _Plan, w):
    """Wo [H, D, d] -> [n_c, C, g, D, d]."""
    return w.reshape(plan.n_c, plan.size, plan.g, plan.hd, plan.d)


def _q_weights(plan: _Plan, wq, wo, c, j):
    """Stage (c, j)'s Wq_s [d, C, D] and Wo_s [C, D, d]."""
    d, size, hd = plan.d, plan.size, plan.hd
    wq_s = lax.dynamic_slice(_q_view(plan, wq), (0, c, 0, j, 0), (d, 1, size, 1, hd))
    wo_s = lax.dynamic_slice(_o_view(plan, wo), (c, 0, j, 0, 0), (1, size, 1, hd, d))
    return wq_s.reshape(d, size, hd), wo_s.reshape(size, hd, d)


def _kv_weights(plan: _Plan, w, c):
    """Chunk c's Wk or Wv [d, C, D]: kv heads (c C + i) // R, i < C."""
    if plan.repeats > 1:
        return jnp.repeat(w, plan.repeats, axis=1)
    return lax.dynamic_slice_in_dim(w, c * plan.size, plan.size, axis=1)


def _reduce(plan: _Plan, tree):
    """``psum`` over ``plan.reduce_axes`` (none: unchanged)."""
    return lax.psum(tree, plan.reduce_axes) if plan.reduce_axes else tree


def _stage_fwd(plan: _Plan, wq, wo, x, positions, k, v, c, keep: bool, y, j_xs):
    """Stage (c, j)'s forward, a scan body: y + o_s Wo_s with o_s the attention of its C
    query heads over chunk c's k, v; with ``keep`` its output (sequence layout) and LSE."""
    j, _ = j_xs
    wq_s, wo_s = _q_weights(plan, wq, wo, c, j)
    q = _q_heads(plan, _proj(x, wq_s), positions)
    o, lse = _attend_lse(plan, q, k, v) if keep else (_attend(plan, q, k, v), None)
    o = heads_to_seq(o, plan.axis)  # [B, L, C, D]
    y = accumulate_matmul(y, o, wo_s, "BTNH,NHD->BTD", plan.chunks)
    return y, ((o, lse) if keep else None)


def _group_fwd(plan: _Plan, wq, wk, wv, wo, x, positions, keep: bool, keep_kv: bool, y,
               c_xs):
    """Kv chunk c's forward, a scan body: its k, v projected once, then its g stages."""
    c, _ = c_xs
    k, v = _kv_heads(plan, _proj(x, _kv_weights(plan, wk, c)),
                     _proj(x, _kv_weights(plan, wv, c)), positions)
    stage = functools.partial(_stage_fwd, plan, wq, wo, x, positions, k, v, c, keep)
    y, stages = _loop(stage, y, plan.g)
    return y, (stages, (k, v) if keep_kv else None)


def _forward(plan: _Plan, wq, wk, wv, wo, x, positions, keep: bool, keep_kv: bool):
    """y, and the backward's residuals stacked [n_c, ...]: with ``keep`` each stage's
    output (sequence layout) and LSE (head layout) [n_c, g, ...], with ``keep_kv``
    each chunk's k, v (head layout)."""
    group = functools.partial(_group_fwd, plan, wq, wk, wv, wo, x, positions, keep, keep_kv)
    y = match_varying(jnp.zeros_like(x), x, wq)
    return _loop(group, y, plan.n_c)


def _layer_fwd(plan: _Plan, wq, wk, wv, wo, x, positions):
    """The custom_vjp forward: y and the residuals (inputs, and what ``plan`` keeps)."""
    y, saved = _forward(plan, wq, wk, wv, wo, x, positions, plan.save, plan.keep_kv)
    # x (which every recomputed projection reads) tied to y: XLA runs the backward
    # after the forward, not beside it (which kept both loops' buffers alive at once
    # under value_and_grad: 169 vs 113 MiB, GQA, T = 32K)
    y, x, saved = lax.optimization_barrier((y, x, saved))
    return y, (wq, wk, wv, wo, x, positions, saved)


def _stage_grads(plan: _Plan, dy, q, k, v, wo_s, saved_s, dk, dv):
    """(dq, dk + dk_s, dv + dv_s, dWo_s) of a stage from its recomputed q, k, v and
    the chunk's kv cotangent accumulators dk, dv. Exact softmax: the
    FlashAttention-2 backward from the stage's output and LSE — saved
    (``save``) or from its forward run again, the output moved to the sequence
    layout at once — adding dk_s, dv_s into the accumulators block by block (no
    dk_s, dv_s buffers). Other variants: through their VJP after their forward."""
    axis = plan.axis
    d_o = jnp.einsum("BTD,NHD->BTNH", dy, wo_s.astype(dy.dtype))  # [B, L, C, D]
    if plan.bwd_options is None:
        o, attn_pull = jax.vjp(functools.partial(_attend, plan), q, k, v)
        o = heads_to_seq(o, axis)
        dq, dk_s, dv_s = attn_pull(seq_to_heads(d_o, axis).astype(o.dtype))
        return (dq, dk + dk_s.astype(dk.dtype), dv + dv_s.astype(dv.dtype),
                _out_grad(o, dy))
    if saved_s is None:
        o, lse = _attend_lse(plan, q, k, v)
        o = heads_to_seq(o, axis)
    else:
        o, lse = saved_s
    # delta = Σ_D dO·O per token and head, where both live: the sequence layout
    delta = jnp.sum(d_o * o.astype(d_o.dtype), -1, keepdims=True)  # [B, L, C, 1]
    delta = seq_to_heads(delta, axis)[..., 0]  # [B, T, 1]
    dq, dk, dv = blockwise_attention_bwd(q, k, v, lse, seq_to_heads(d_o, axis),
                                         delta=delta, causal=plan.causal, scale=plan.scale,
                                         dk_acc=dk, dv_acc=dv, **plan.bwd_options)
    return dq, dk, dv, _out_grad(o, dy)


def _stage_bwd(plan: _Plan, wq, wo, x, positions, dy, k, v, c, carry, j_xs):
    """Stage (c, j)'s backward, a scan body over carry (dx, dk, dv, dWq, dWo): recomputes
    its queries, adds its dk, dv into the chunk's, writes its dWq, dWo slices and adds
    dq_s Wq_sᵀ into dx."""
    d, size, hd = plan.d, plan.size, plan.hd
    j, saved_s = j_xs
    dx, dk, dv, dwq, dwo = carry
    wq_s, wo_s = _q_weights(plan, wq, wo, c, j)
    q, q_pull = jax.vjp(lambda qp: _q_heads(plan, qp, positions), _proj(x, wq_s))
    dq, dk, dv, dwo_s = _stage_grads(plan, dy, q, k, v, wo_s, saved_s, dk, dv)
    (dqp,) = q_pull(dq.astype(q.dtype))  # [B, L, C, D]
    dwq_s, dwo_s = _reduce(plan, (_weight_grad(dqp, x).astype(dwq.dtype),
                                  dwo_s.astype(dwo.dtype)))
    dwq = lax.dynamic_update_slice(dwq, dwq_s.reshape(d, 1, size, 1, hd), (0, c, 0, j, 0))
    dwo = lax.dynamic_update_slice(dwo, dwo_s.reshape(1, size, 1, hd, d), (c, 0, j, 0, 0))
    dx = accumulate_matmul(dx, dqp, wq_s, "BTNH,DNH->BTD", plan.chunks)
    return (dx, dk, dv, dwq, dwo), None


def _group_bwd(plan: _Plan, wq, wk, wv, wo, x, positions, dy, carry, c_xs):
    """Kv chunk c's backward, a scan body over carry (dx, dWq, dWk, dWv, dWo): its k, v
    recomputed (or, kept, their linear RoPE/all-to-all transposed), its g stages'
    backward summing dk, dv, then its dWk, dWv slices and dk Wkᵀ + dv Wvᵀ into dx."""
    d, size, hd = plan.d, plan.size, plan.hd
    c, (saved_c, saved_kv) = c_xs
    dx, dwq, dwk, dwv, dwo = carry
    wk_c, wv_c = _kv_weights(plan, wk, c), _kv_weights(plan, wv, c)
    if saved_kv is None:
        (k, v), kv_pull = jax.vjp(lambda kp, vp: _kv_heads(plan, kp, vp, positions),
                                  _proj(x, wk_c), _proj(x, wv_c))
    else:  # RoPE and the all-to-alls are linear: transpose them, no forward
        k, v = saved_kv
        like = match_varying(jnp.zeros((*x.shape[:2], size, hd), x.dtype), x)
        kv_pull = jax.linear_transpose(
            lambda kp, vp: _kv_heads(plan, kp, vp, positions), like, like)
    stage = functools.partial(_stage_bwd, plan, wq, wo, x, positions, dy, k, v, c)
    zeros = match_varying((jnp.zeros_like(k), jnp.zeros_like(v)), k, v, x)
    dx, dk, dv, dwq, dwo = _loop(stage, (dx, *zeros, dwq, dwo), plan.g, saved_c)[0]
    dkp, dvp = kv_pull((dk, dv))
    dwk_c, dwv_c = _reduce(plan, (_weight_grad(dkp, x).astype(dwk.dtype),
                                  _weight_grad(dvp, x).astype(dwv.dtype)))
    if plan.repeats > 1:  # one chunk; copies of a kv head: their gradients summed
        dwk = dwk_c.reshape(d, plan.kv_heads, plan.repeats, hd).sum(2)
        dwv = dwv_c.reshape(d, plan.kv_heads, plan.repeats, hd).sum(2)
    else:
        dwk = lax.dynamic_update_slice_in_dim(dwk, dwk_c, c * size, axis=1)
        dwv = lax.dynamic_update_slice_in_dim(dwv, dwv_c, c * size, axis=1)
    dx = accumulate_matmul(dx, dkp, wk_c, "BTNH,DNH->BTD", plan.chunks)
    dx = accumulate_matmul(dx, dvp, wv_c, "BTNH,DNH->BTD", plan.chunks)
    return (dx, dwq, dwk, dwv, dwo), None


def _layer_bwd(plan: _Plan, res, dy):
    """The custom_vjp backward: the stage loops again, from the residuals ``res``."""
    wq, wk, wv, wo, x, positions, saved = res
    dy = dy.astype(x.dtype)
    group = functools.partial(_group_bwd, plan, wq, wk, wv, wo, x, positions, dy)
    dx = match_varying(jnp.zeros_like(x), x)
    dws = tuple(jnp.zeros_like(w) for w in (_q_view(plan, wq), wk, wv, _o_view(plan, wo)))
    if not plan.reduce_axes:  # partials: varying like x (a no-op without check_vma)
        dws = match_varying(dws, x)
    dx, dwq, dwk, dwv, dwo = _loop(group, (dx, *dws), plan.n_c, saved)[0]
    return dwq.reshape(wq.shape), dwk, dwv, dwo.reshape(wo.shape), dx, None


def _softmax_backward_options(attn, options: Mapping) -> dict | None:
    """The options of :func:`blockwise_attention_bwd` that differentiate ``attn`` from its
    saved output and LSE, or None when it cannot: ``attn`` must be exact softmax attention
    by its XLA path (the ``"softmax"`` or ``"blockwise"`` spec, or their functions;
    ``implementation`` None or ``"xla"``, no ``config=``). Other variants (entmax, ...)
    have no such backward and are differentiated by re-running their forward."""
    exact = (get("softmax"), get("blockwise"), dot_product_attention, blockwise_attention)
    if not any(attn is f for f in exact) or "config" in options:
        return None
    if options.get("implementation") not in (None, "xla"):
        return None
    return {k: v for k, v in options.items() if k != "implementation"}


def _loop(body, carry, n: int, xs=None):
    """``lax.scan(body, carry, (arange(n), xs))`` -> (carry, stacked ys), or one direct
    call when n == 1 (a one-trip loop only adds carry copies; ys get their axis of 1)."""
    index = jnp.arange(n, dtype=jnp.int32)
    if n == 1:
        carry, ys = body(carry, jax.tree.map(lambda a: a[0], (index, xs)))
        return carry, jax.tree.map(lambda a: a[None], ys)
    return lax.scan(body, carry, (index, xs))


def _out_grad(o: jax.Array, dy: jax.Array) -> jax.Array:
    """dWo share [C, D, d] of a stage from its output o [B, L, C, D] and dy [B, L, d]."""
    return jnp.einsum("BTNH,BTD->NHD", o.astype(dy.dtype), dy)


def upipe_layer(params: Mapping[str, jax.Array], x, positions=None, *, mesh=None,
                causal: bool = True, variant: str | Callable = "softmax",
                scale: float | None = None, rope_base: float | None = 10000.0,
                data_axis: str | None = DATA, context_axis: str = CONTEXT,
                accumulate_slices: int | None = 1, save_attention_output: bool = False,
                save_kv: bool = True, **options):
    """The attention layer by UPipe: x [B, T, d_model] sharded ``P(data, context, None)``,
    positions [B, T] (default ``arange(T)``, built per device inside ``shard_map``),
    params as :class:`lcjax.nn.Attention`'s (``q_proj [d, H, D]``, ``k_proj``/``v_proj
    [d, Hkv, D]``, ``o_proj [H, D, d]``) ->
    y [B, T, d_model], same sharding. ``variant`` and ``options`` as in Ulysses;
    ``mesh`` default the one of ``jax.set_mesh``. ``accumulate_slices``,
    ``save_attention_output`` and ``save_kv``: what the backward keeps or recomputes
    (:func:`upipe_local`; measurements in docs/context_parallel.md)."""
    name = "upipe"
    axes = (context_axis,) if data_axis is None else (data_axis, context_axis)
    mesh = resolve_mesh(name, mesh, *axes)
    c = axis_size(mesh, context_axis)
    check_length(name, x.shape[1], c)
    check_batch(name, x.shape[0], axis_size(mesh, data_axis))
    check_heads(name, params["q_proj"].shape[1], params["k_proj"].shape[1], c)
    attn, check_vma = resolve_variant(variant, options)
    stage = functools.partial(upipe_local, axis=context_axis, size=c, attn=attn,
                              causal=causal, scale=scale, rope_base=rope_base,
                              accumulate_slices=accumulate_slices,
                              save_attention_output=save_attention_output, save_kv=save_kv,
                              **options)

    def local(params, x, *given):  # default positions: this slice of arange(T)
        positions = given[0] if given else local_positions(*x.shape[:2], context_axis)
        return stage(params, x, positions)

    spec = P(data_axis, context_axis, None)
    params = {n: params[n] for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    args, in_specs = (params, x), (P(), spec)
    if positions is not None:
        args, in_specs = (*args, positions), (*in_specs, P(data_axis, context_axis))
    fn = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=spec,
                       check_vma=check_vma)
    return fn(*args)
