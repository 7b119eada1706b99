"""Context parallelism in ``jax.shard_map``: meshes (:mod:`lcjax.parallel.mesh`), Ulysses
(:mod:`~lcjax.parallel.ulysses`), Ring (:mod:`~lcjax.parallel.ring`) and UPipe
(:mod:`~lcjax.parallel.upipe`), the hybrid Ulysses x ring :func:`usp_attention`
(:mod:`~lcjax.parallel.usp`), the one-layer builder :func:`layer`, the memory model
(:mod:`lcjax.bench.context_parallel`) and the configuration checks
(:mod:`~lcjax.parallel.validation`). See ``docs/context_parallel.md``.

How the mesh is given — one mechanism for every entry point:

- every function takes ``mesh=`` (a ``jax.sharding.Mesh`` with axes ``"data"`` and
  ``"context"``, e.g. :func:`make_mesh`);
- ``mesh=None`` (the default) uses the mesh set with ``jax.set_mesh(mesh)``
  (a context manager; inside ``jit`` it is ``jax.sharding.get_abstract_mesh()``).

The language model selects a strategy by config and takes the mesh from the context::

    mesh = make_mesh(data=2, context=4)
    model = DecoderLM(DecoderConfig(..., context_parallel="ulysses"), rngs=nnx.Rngs(0))
    with jax.set_mesh(mesh):
        tokens = jax.device_put(tokens, token_sharding(mesh))   # P("data", "context")
        logits = jax.jit(lambda t: model(t))(tokens)             # or a train step

(so ``lcjax train --mesh data=2,context=4`` wraps its step in ``jax.set_mesh``).
Activations [B, T, d] are sharded :data:`ACTIVATION_SPEC` = ``P("data", "context",
None)``, token arrays :data:`TOKEN_SPEC` = ``P("data", "context")``.
"""

from lcjax.parallel.common import attention_layer_reference, resolve_mesh, resolve_variant
from lcjax.parallel.layer import STRATEGIES, init_layer_params, layer, layer_apply
from lcjax.parallel.mesh import (
    ACTIVATION_SPEC,
    CONTEXT,
    DATA,
    RING,
    TOKEN_SPEC,
    activation_sharding,
    make_mesh,
    mesh_size,
    parse_mesh,
    sequence_axes,
    token_sharding,
)
from lcjax.parallel.ring import from_zigzag, ring_attention, ring_local, ring_shift, to_zigzag
from lcjax.parallel.ulysses import (
    heads_to_seq,
    replicate_kv,
    seq_to_heads,
    ulysses_attention,
    ulysses_local,
)
from lcjax.parallel.upipe import accumulate_matmul, stage_heads, upipe_layer, upipe_local
from lcjax.parallel.usp import usp_attention, usp_local

__all__ = ["ACTIVATION_SPEC", "CONTEXT", "DATA", "RING", "STRATEGIES", "TOKEN_SPEC",
           "accumulate_matmul", "activation_sharding", "attention_layer_reference",
           "from_zigzag", "heads_to_seq",
           "init_layer_params", "layer", "layer_apply", "make_mesh", "mesh_size",
           "parse_mesh", "replicate_kv", "resolve_mesh", "resolve_variant", "ring_attention",
           "ring_local", "ring_shift", "seq_to_heads", "sequence_axes", "stage_heads", "to_zigzag",
           "token_sharding", "ulysses_attention", "ulysses_local", "upipe_layer", "upipe_local",
           "usp_attention", "usp_local"]
