"""Learned PLASH prototypes: the parameter module of the ``"plash"`` attention spec.

``DecoderConfig(attention="plash", attention_options={"num_prototypes": 32})`` builds one
:class:`PlashAttention` per layer (through the spec's ``params`` factory,
:func:`plash_prototypes`); it holds the prototypes [kv_heads, M, head_dim] as an
``nnx.Param`` (trained and checkpointed with the model) and hands them to
:func:`lcjax.attention.plash.plash_attention` on every call. Prototypes are data
independent, so causal PLASH stays causal (``docs/plash.md`` §4).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["PlashAttention", "plash_prototypes"]

DEFAULT_NUM_PROTOTYPES = 32


class PlashAttention(nnx.Module):
    """Learned prototypes of PLASH attention, per KV head.

    prototypes: ``nnx.Param`` [num_kv_heads, num_prototypes, head_dim], initialised
    N(0, init_scale²) (unit-variance entries match keys of unit-variance components).
    Calling it returns ``{"prototypes": prototypes}`` for the variant.
    """

    init_options = ("num_prototypes", "init_scale")

    def __init__(self, num_kv_heads: int, head_dim: int,
                 num_prototypes: int = DEFAULT_NUM_PROTOTYPES, *, init_scale: float = 1.0,
                 rngs: nnx.Rngs, param_dtype=jnp.float32):
        for name, value in (("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                            ("num_prototypes", num_prototypes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PlashAttention: `{name}` must be a positive int, got {value!r}")
        init = jax.random.normal(rngs.params(), (num_kv_heads, num_prototypes, head_dim))
        self.prototypes = nnx.Param((init * float(init_scale)).astype(param_dtype))

    def __call__(self, **_) -> dict[str, jax.Array]:
        """``{"prototypes": [num_kv_heads, M, head_dim]}``."""
        return {"prototypes": self.prototypes[...]}


def plash_prototypes(config: Any, *, rngs: nnx.Rngs) -> PlashAttention:
    """Parameter factory of the ``"plash"`` spec (``config``: a
    :class:`lcjax.nn.variant_params.VariantConfig`, which maps ``LearnedParams("plash_prototypes")``
    here): learned prototypes (``learn`` may be empty
    or ``("prototypes",)``; they are learned either way), M = ``options["num_prototypes"]``
    (default 32), initial scale ``options["init_scale"]`` (default 1)."""
    config.unknown_learn(("prototypes",), "plash")
    return PlashAttention(config.num_kv_heads, config.head_dim,
                          int(config.options.get("num_prototypes", DEFAULT_NUM_PROTOTYPES)),
                          init_scale=float(config.options.get("init_scale", 1.0)), rngs=rngs,
                          param_dtype=config.param_dtype)
