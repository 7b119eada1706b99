"""Pieces every context-parallel strategy shares: which mesh, which variant (and the
``check_vma`` its implementation needs under ``jax.shard_map``), the attention layer's
projections, and the single-device reference layer.

The mesh: an explicit ``mesh=`` argument, else the one set with ``jax.set_mesh(mesh)``
(read inside ``jit`` as ``jax.sharding.get_abstract_mesh()``), so a model can run a
strategy without threading the mesh through every call.

Projection layout (the one of :class:`lcjax.nn.Attention`, so its parameters load here):
``q_proj [d_model, H, D]``, ``k_proj``/``v_proj [d_model, Hkv, D]``,
``o_proj [H, D, d_model]``; query head h uses key/value head h // (H / Hkv).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from lcjax.attention import AttentionSpec, get
from lcjax.parallel.validation import check_axes
from lcjax.rope import apply_rope

__all__ = ["attention_layer_reference", "dense_init", "layer_attention", "local_positions",
           "project_kv",
           "project_q", "resolve_mesh", "resolve_variant"]


def dense_init(in_axis=-2, out_axis=-1):
    """Fan-in scaled normal (LeCun) for an einsum kernel with the given axes (the projections'
    initializer here and in :mod:`lcjax.nn`)."""
    return jax.nn.initializers.variance_scaling(
        1.0, "fan_in", "normal", in_axis=in_axis, out_axis=out_axis
    )


def resolve_mesh(name: str, mesh, *axes: str):
    """``mesh`` or the context mesh (``jax.set_mesh``), checked to have ``axes``."""
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
    check_axes(name, mesh, *axes)
    return mesh


def resolve_variant(variant: str | Callable, options: Mapping[str, Any]
                    ) -> tuple[Callable, bool]:
    """(the attention function, ``check_vma`` for the ``shard_map`` around it).

    ``check_vma`` is False when the implementation that will run is one that needs it
    off (a Pallas kernel: ``Implementation.shard_map_check_vma``): the one named by
    ``options["implementation"]``, else any implementation dispatch could choose — one whose
    ``skip_unless_named`` gives no reason here, or one chosen per lowering target
    (``target_dependent``: compiling for a TPU topology from a CPU host picks the kernel
    though this host would not). A plain callable: True.
    """
    fn = get(variant)
    if not isinstance(fn, AttentionSpec):
        return fn, True
    named = options.get("implementation")
    if named is not None:
        return fn, fn.implementation(named).shard_map_check_vma
    usable = [i for i in fn.implementations if i.target_dependent
              or i.skip_unless_named is None or not i.skip_unless_named()]
    return fn, all(i.shard_map_check_vma for i in usable)


def local_positions(batch: int, length: int, seq_axes: str | tuple[str, ...]) -> jax.Array:
    """Inside ``jax.shard_map``: the default positions [batch, length] (int32) of this
    device's sequence slice, ``arange(T)`` sharded over ``seq_axes`` in device order —
    ``axis_index(seq_axes) * length + arange(length)`` (several axes: major first, as
    ``P(..., ("ring", "context"))`` shards). Built here from the axis index, so no
    global ``arange(T)`` (unsharded, which ``shard_map`` rejects under an explicit mesh)
    is ever made."""
    start = jax.lax.axis_index(seq_axes) * length
    return jnp.broadcast_to(start + jnp.arange(length, dtype=jnp.int32), (batch, length))


def project_q(x: jax.Array, wq: jax.Array, positions, *, rope_base: float | None):
    """x [B, L, d] @ wq [d, h, D] -> q [B, L, h, D], rotated (RoPE) at ``positions``
    [B, L] unless ``rope_base`` is None."""
    q = jnp.einsum("BTD,DNH->BTNH", x, wq.astype(x.dtype))
    return q if rope_base is None else apply_rope(q, positions, base=rope_base)


def project_kv(x: jax.Array, wk: jax.Array, wv: jax.Array, positions, *,
               rope_base: float | None):
    """x [B, L, d] -> (k [B, L, hk, D] rotated, v [B, L, hk, D])."""
    k = project_q(x, wk, positions, rope_base=rope_base)
    v = jnp.einsum("BTD,DKH->BTKH", x, wv.astype(x.dtype))
    return k, v


def layer_attention(params: Mapping[str, jax.Array], x: jax.Array, positions,
                    attend: Callable, *, rope_base: float | None) -> jax.Array:
    """One attention layer around ``attend(q, k, v) -> o``:
    y = attend(RoPE(x Wq), RoPE(x Wk), x Wv) Wo; x [B, L, d] -> y [B, L, d]."""
    q = project_q(x, params["q_proj"], positions, rope_base=rope_base)
    k, v = project_kv(x, params["k_proj"], params["v_proj"], positions, rope_base=rope_base)
    o = attend(q, k, v)
    return jnp.einsum("BTNH,NHD->BTD", o.astype(x.dtype), params["o_proj"].astype(x.dtype))


def attention_layer_reference(params: Mapping[str, jax.Array], x: jax.Array, positions=None,
                              *, causal: bool = True, variant: str | Callable = "softmax",
                              scale: float | None = None, rope_base: float | None = 10000.0,
                              **options) -> jax.Array:
    """The layer on one device (strategy ``"none"``): x [B, T, d] -> y [B, T, d], with
    ``positions`` [B, T] (default ``arange(T)``)."""
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32), x.shape[:2])
    fn = get(variant)
    return layer_attention(
        params, x, positions,
        lambda q, k, v: fn(q, k, v, causal=causal, scale=scale, **options),
        rope_base=rope_base)
