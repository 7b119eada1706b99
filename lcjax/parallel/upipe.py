"""UPipe: head-chunked Ulysses for a whole attention layer (the untied-Ulysses paper;
``../shared/PAPERS.md`` §4; public code ghadiaravi13/untied-ulysses, PyTorch).

Ulysses (:mod:`lcjax.parallel.ulysses`) projects all H query heads, all-to-alls them
and attends with H/C heads per device at once, so its attention intermediates (q, k, v
in the head layout, the output, their cotangents) are ∝ H/C heads over the full length
T. UPipe runs the layer in P = H/C stages of C heads (one head per device per stage):

    stage (c, j):  q_s = RoPE(x Wq[:, heads_s])            [B, T/C, C, D]  (local)
                   q_s -> all_to_all -> [B, T, 1, D];  o_s = attn(q_s, K_c, V_c)
                   o_s -> all_to_all -> [B, T/C, C, D];  y += o_s Wo[heads_s]

K/V chunk c (C kv heads, one per device) is projected and all-to-all'd once and reused
by the G' = H / max(Hkv, C) query stages j of its group (the paper's "K/V when
s mod g = 0"). Each stage is rematerialised in the backward (``jax.checkpoint``; the
stage loop is a ``lax.scan`` so XLA cannot keep all stages alive); what a stage keeps
for the backward is its inputs (x, the weights, the K/V chunk of its group), so peak
attention intermediates are ∝ one head per device instead of H/C. The all-to-all volume
equals Ulysses', in P pieces. (The paper also keeps each stage's output and LSE to skip
re-running the attention forward; with ``jax.checkpoint`` around a variant's own
``custom_vjp`` we recompute it — one more attention forward per stage.)

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

import functools
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from lcjax.attention.core import match_varying
from lcjax.parallel.common import project_kv, project_q, resolve_mesh, resolve_variant
from lcjax.parallel.mesh import CONTEXT, DATA
from lcjax.parallel.ulysses import heads_to_seq, seq_to_heads
from lcjax.parallel.validation import axis_size, check_batch, check_heads, check_length

__all__ = ["stage_heads", "upipe_layer", "upipe_local"]


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


def upipe_local(params: Mapping[str, jax.Array], x, positions, *, axis: str, size: int,
                attn: Callable, causal: bool, scale=None, rope_base: float | None = 10000.0,
                **options):
    """The UPipe layer inside ``shard_map`` over ``axis`` (``size`` = C devices): local x
    [B, L, d] (sequence slice, device order), positions [B, L] -> y [B, L, d]."""
    wq, wk, wv, wo = (params[n] for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
    q_heads, kv_heads = stage_heads(wq.shape[1], wk.shape[1], size)
    # the loops carry head indices, not weight copies: each stage gathers its C heads
    # (and the backward scatter-adds their gradients into the one dW accumulator)
    q_heads, kv_heads = jnp.asarray(q_heads, jnp.int32), jnp.asarray(kv_heads, jnp.int32)

    def q_stage(x, positions, k, v, wq, wo, heads):
        wq_s, wo_s = jnp.take(wq, heads, axis=1), jnp.take(wo, heads, axis=0)
        q = seq_to_heads(project_q(x, wq_s, positions, rope_base=rope_base), axis)
        o = attn(q, k, v, causal=causal, scale=scale, **options)  # [B, T, 1, D]
        o = heads_to_seq(o, axis)  # [B, L, C, D]
        return jnp.einsum("BTNH,NHD->BTD", o.astype(x.dtype), wo_s.astype(x.dtype))

    def kv_group(x, positions, wq, wk, wv, wo, kv_c, q_c):
        wk_c, wv_c = jnp.take(wk, kv_c, axis=1), jnp.take(wv, kv_c, axis=1)
        k, v = project_kv(x, wk_c, wv_c, positions, rope_base=rope_base)
        k, v = seq_to_heads(k, axis), seq_to_heads(v, axis)  # [B, T, 1, D], reused G' times
        stage = jax.checkpoint(q_stage)

        def body(y, heads):
            return y + stage(x, positions, k, v, wq, wo, heads), None

        y, _ = lax.scan(body, match_varying(jnp.zeros_like(x), x, k), q_c)
        return y

    if kv_heads.shape[0] == 1:  # one kv chunk (Hkv <= C): no outer loop to carry y
        return kv_group(x, positions, wq, wk, wv, wo, kv_heads[0], q_heads[0])
    group = jax.checkpoint(kv_group)

    def outer(y, idx):
        return y + group(x, positions, wq, wk, wv, wo, *idx), None

    y, _ = lax.scan(outer, match_varying(jnp.zeros_like(x), x), (kv_heads, q_heads))
    return y


def upipe_layer(params: Mapping[str, jax.Array], x, positions=None, *, mesh=None,
                causal: bool = True, variant: str | Callable = "softmax",
                scale: float | None = None, rope_base: float | None = 10000.0,
                data_axis: str | None = DATA, context_axis: str = CONTEXT, **options):
    """The attention layer by UPipe: x [B, T, d_model] sharded ``P(data, context, None)``,
    positions [B, T] (default ``arange(T)``), params as :class:`lcjax.nn.Attention`'s
    (``q_proj [d, H, D]``, ``k_proj``/``v_proj [d, Hkv, D]``, ``o_proj [H, D, d]``) ->
    y [B, T, d_model], same sharding. ``variant`` and ``options`` as in Ulysses;
    ``mesh`` default the one of ``jax.set_mesh``."""
    name = "upipe"
    axes = (context_axis,) if data_axis is None else (data_axis, context_axis)
    mesh = resolve_mesh(name, mesh, *axes)
    c = axis_size(mesh, context_axis)
    check_length(name, x.shape[1], c)
    check_batch(name, x.shape[0], axis_size(mesh, data_axis))
    check_heads(name, params["q_proj"].shape[1], params["k_proj"].shape[1], c)
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32), x.shape[:2])
    attn, check_vma = resolve_variant(variant, options)
    local = functools.partial(upipe_local, axis=context_axis, size=c, attn=attn,
                              causal=causal, scale=scale, rope_base=rope_base, **options)
    spec = P(data_axis, context_axis, None)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(), spec, P(data_axis, context_axis)),
                       out_specs=spec, check_vma=check_vma)
    params = {n: params[n] for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    return fn(params, x, positions)
