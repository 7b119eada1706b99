"""One attention layer under a context-parallel strategy: ``layer(strategy, ...)`` ->
``(init, apply)``, the same parameters for every strategy.

    init(rng) -> params = {"q_proj": [d, H, D], "k_proj": [d, Hkv, D],
                           "v_proj": [d, Hkv, D], "o_proj": [H, D, d]}
    apply(params, x [B, T, d], positions=None) -> y [B, T, d]
    y = attn(RoPE(x Wq), RoPE(x Wk), x Wv) Wo

(the layout and initialisation of :class:`lcjax.nn.Attention`). x is sharded
``P("data", "context", None)`` (:data:`lcjax.parallel.ACTIVATION_SPEC`) and y comes back
the same way. Strategies: ``"ulysses"`` (:mod:`lcjax.parallel.ulysses`), ``"ring"``
(:mod:`lcjax.parallel.ring`, zigzag-balanced when causal: x and positions are moved to
the zigzag layout before the projections, y back after), ``"upipe"``
(:mod:`lcjax.parallel.upipe`), ``"usp"`` (:mod:`lcjax.parallel.usp`: Ulysses over
``"context"`` and zigzag ring attention over ``"ring"`` on a ``make_mesh(data=, ring=,
context=)`` mesh; x sharded ``P("data", ("ring", "context"), None)``), ``"none"`` (one
device, no mesh needed: the reference).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from lcjax.attention import AttentionSpec
from lcjax.parallel.common import (
    attention_layer_reference,
    dense_init,
    layer_attention,
    local_positions,
    resolve_mesh,
    resolve_variant,
)
from lcjax.parallel.mesh import CONTEXT, DATA, RING
from lcjax.parallel.ring import from_zigzag, ring_local, to_zigzag
from lcjax.parallel.ulysses import ulysses_local
from lcjax.parallel.upipe import upipe_layer
from lcjax.parallel.usp import check_usp, usp_local
from lcjax.parallel.validation import (
    axis_size,
    check_batch,
    check_heads,
    check_length,
    check_positive,
)

__all__ = ["STRATEGIES", "init_layer_params", "layer", "layer_apply"]

STRATEGIES = ("ulysses", "ring", "upipe", "usp", "none")


def init_layer_params(rng, *, d_model: int, num_heads: int, num_kv_heads: int,
                      head_dim: int, dtype=jnp.float32) -> dict[str, jax.Array]:
    """Fan-in scaled normal projections, as :class:`lcjax.nn.Attention` makes them."""
    kq, kk, kv, ko = jax.random.split(rng, 4)
    in_proj = dense_init(in_axis=0, out_axis=(1, 2))
    out_proj = dense_init(in_axis=(0, 1), out_axis=2)
    return {"q_proj": in_proj(kq, (d_model, num_heads, head_dim), dtype),
            "k_proj": in_proj(kk, (d_model, num_kv_heads, head_dim), dtype),
            "v_proj": in_proj(kv, (d_model, num_kv_heads, head_dim), dtype),
            "o_proj": out_proj(ko, (num_heads, head_dim, d_model), dtype)}


def layer_apply(strategy: str, params: Mapping[str, jax.Array], x, positions=None, *,
                mesh=None, causal: bool = True, variant: str | Callable = "softmax",
                scale: float | None = None, rope_base: float | None = 10000.0,
                balance: str | None = "zigzag", data_axis: str | None = DATA,
                context_axis: str = CONTEXT, ring_axis: str = RING, **options):
    """The layer by ``strategy`` on x [B, T, d] (positions [B, T]; default arange(T),
    built per device inside ``shard_map`` from the axis index, so it is sharded like x);
    ``ring_axis``: the ring axis of ``"usp"`` (``context_axis`` is its Ulysses axis)."""
    name = f"layer({strategy!r})"
    if strategy not in STRATEGIES:
        raise ValueError(f"layer: `strategy` must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "none":
        return attention_layer_reference(params, x, positions, causal=causal,
                                         variant=variant, scale=scale, rope_base=rope_base,
                                         **options)
    common = dict(causal=causal, variant=variant, scale=scale, rope_base=rope_base,
                  data_axis=data_axis, context_axis=context_axis)
    if strategy == "upipe":
        return upipe_layer(params, x, positions, mesh=mesh, **common, **options)
    axes = (context_axis,) if data_axis is None else (data_axis, context_axis)
    if strategy == "usp":
        axes = (*axes, ring_axis)
    mesh = resolve_mesh(name, mesh, *axes)
    c = axis_size(mesh, context_axis)
    check_batch(name, x.shape[0], axis_size(mesh, data_axis))
    attn, check_vma = resolve_variant(variant, options)
    seq_axes = context_axis
    if strategy == "usp":
        _, r, repeats, zigzag_ring = check_usp(
            name, x.shape[1], x.shape[0], params["q_proj"].shape[1],
            params["k_proj"].shape[1], mesh, ulysses_axis=context_axis, ring_axis=ring_axis,
            data_axis=data_axis, causal=causal, balance=balance, attn=attn)
        attend = functools.partial(usp_local, ulysses_axis=context_axis, ring_axis=ring_axis,
                                   ring_size=r, attn=attn, causal=causal, zigzag=zigzag_ring,
                                   kv_repeats=repeats, scale=scale, **options)
        zigzag, seq_axes = False, (ring_axis, context_axis)  # usp_local does its own zigzag
    elif strategy == "ulysses":
        check_length(name, x.shape[1], c)
        repeats = check_heads(name, params["q_proj"].shape[1], params["k_proj"].shape[1], c)
        attend = functools.partial(ulysses_local, axis=context_axis, attn=attn,
                                   causal=causal, scale=scale, kv_repeats=repeats, **options)
        zigzag = False
    else:
        if isinstance(attn, AttentionSpec) and not attn.features.lse:
            raise ValueError(f"{name}: variant {attn.name!r} gives no log-sum-exp "
                             "(features.lse=False); ring attention merges partials with it")
        zigzag = causal and balance == "zigzag" and c > 1
        check_length(name, x.shape[1], c, multiple=2 if zigzag else 1)
        attend = functools.partial(ring_local, axis=context_axis, size=c, attn=attn,
                                   causal=causal, balance="zigzag" if zigzag else None,
                                   scale=scale, **options)

    def local(params, x, *given):
        # positions: given [B, L], else this slice of arange(T) built from the axis index
        positions = given[0] if given else local_positions(*x.shape[:2], seq_axes)
        if zigzag:
            x, positions = to_zigzag(x, context_axis, c), to_zigzag(positions, context_axis, c)
        y = layer_attention(params, x, positions, attend, rope_base=rope_base)
        return from_zigzag(y, context_axis, c) if zigzag else y

    spec = P(data_axis, seq_axes, None)
    params = {n: params[n] for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    args, in_specs = (params, x), (P(), spec)
    if positions is not None:
        args, in_specs = (*args, positions), (*in_specs, P(data_axis, seq_axes))
    fn = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=spec,
                       check_vma=check_vma)
    return fn(*args)


def layer(strategy: str, *, mesh=None, d_model: int, num_heads: int, num_kv_heads: int,
          head_dim: int, causal: bool = True, variant: str | Callable = "softmax",
          **options) -> tuple[Callable, Callable]:
    """``(init(rng) -> params, apply(params, x, positions=None) -> y)`` for one attention
    layer by ``strategy`` ("ulysses" | "ring" | "upipe" | "usp" | "none"); see the module
    docstring. ``options``: ``scale``, ``rope_base`` (None: no RoPE), ``balance`` (ring,
    usp), ``ring_axis`` (usp), and the variant's own options. Configuration errors
    (heads, length, batch, axes) are ``ValueError``s at ``apply`` before tracing; head and
    axis rules already here."""
    check_positive("layer", d_model=d_model, num_heads=num_heads, num_kv_heads=num_kv_heads,
                   head_dim=head_dim)
    if strategy not in STRATEGIES:
        raise ValueError(f"layer: `strategy` must be one of {STRATEGIES}, got {strategy!r}")
    if num_heads % num_kv_heads:
        raise ValueError(f"layer: num_heads H={num_heads} must be a multiple of "
                         f"num_kv_heads Hkv={num_kv_heads}")
    if strategy != "none" and mesh is not None:
        name = f"layer({strategy!r})"
        resolve_mesh(name, mesh, options.get("context_axis", CONTEXT),
                     *((options.get("ring_axis", RING),) if strategy == "usp" else ()))
        if strategy in ("ulysses", "upipe", "usp"):
            check_heads(name, num_heads, num_kv_heads,
                        axis_size(mesh, options.get("context_axis", CONTEXT)))

    def init(rng):
        return init_layer_params(rng, d_model=d_model, num_heads=num_heads,
                                 num_kv_heads=num_kv_heads, head_dim=head_dim)

    def apply(params, x, positions=None):
        return layer_apply(strategy, params, x, positions, mesh=mesh, causal=causal,
                           variant=variant, **options)

    return init, apply
