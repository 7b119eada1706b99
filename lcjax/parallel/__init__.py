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

from lcjax.lazy import lazy_exports

# public name -> the module that defines it, imported on first access (lcjax.lazy)
_EXPORTS = {
    "attention_layer_reference": "lcjax.parallel.common",
    "resolve_mesh": "lcjax.parallel.common",
    "resolve_variant": "lcjax.parallel.common",
    "STRATEGIES": "lcjax.parallel.layer",
    "init_layer_params": "lcjax.parallel.layer",
    "layer": "lcjax.parallel.layer",
    "layer_apply": "lcjax.parallel.layer",
    "ACTIVATION_SPEC": "lcjax.parallel.mesh",
    "CONTEXT": "lcjax.parallel.mesh",
    "DATA": "lcjax.parallel.mesh",
    "RING": "lcjax.parallel.mesh",
    "TOKEN_SPEC": "lcjax.parallel.mesh",
    "activation_sharding": "lcjax.parallel.mesh",
    "make_mesh": "lcjax.parallel.mesh",
    "mesh_size": "lcjax.parallel.mesh",
    "parse_mesh": "lcjax.parallel.mesh",
    "sequence_axes": "lcjax.parallel.mesh",
    "token_sharding": "lcjax.parallel.mesh",
    "from_zigzag": "lcjax.parallel.ring",
    "ring_attention": "lcjax.parallel.ring",
    "ring_local": "lcjax.parallel.ring",
    "ring_shift": "lcjax.parallel.ring",
    "to_zigzag": "lcjax.parallel.ring",
    "heads_to_seq": "lcjax.parallel.ulysses",
    "replicate_kv": "lcjax.parallel.ulysses",
    "seq_to_heads": "lcjax.parallel.ulysses",
    "ulysses_attention": "lcjax.parallel.ulysses",
    "ulysses_local": "lcjax.parallel.ulysses",
    "accumulate_matmul": "lcjax.parallel.upipe",
    "stage_heads": "lcjax.parallel.upipe",
    "upipe_layer": "lcjax.parallel.upipe",
    "upipe_local": "lcjax.parallel.upipe",
    "usp_attention": "lcjax.parallel.usp",
    "usp_local": "lcjax.parallel.usp",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
