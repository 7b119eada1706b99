"""Context parallelism in ``jax.shard_map``: meshes (:mod:`lcjax.parallel.mesh`), and one
strategy per module (Ulysses, Ring, UPipe) as they land."""

from lcjax.parallel.mesh import (
    ACTIVATION_SPEC,
    CONTEXT,
    DATA,
    TOKEN_SPEC,
    activation_sharding,
    make_mesh,
    mesh_size,
    parse_mesh,
    token_sharding,
)

__all__ = ["ACTIVATION_SPEC", "CONTEXT", "DATA", "TOKEN_SPEC", "activation_sharding",
           "make_mesh", "mesh_size", "parse_mesh", "token_sharding"]
