"""Basic NNX layers: RMSNorm (Zhang & Sennrich, 2019) and the SwiGLU MLP (Shazeer, 2020).

RMSNorm:  y = x / sqrt(mean(x^2) + eps) * scale      (statistics in float32)
SwiGLU:   y = (silu(x W_gate) * (x W_up)) W_down

Parameters live in ``param_dtype`` and are cast to the compute ``dtype`` at use.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lcjax.parallel.common import dense_init

__all__ = ["RMSNorm", "SwiGLU", "rms_norm", "dense_init"]


def rms_norm(x: jax.Array, scale: jax.Array, *, eps: float = 1e-6) -> jax.Array:
    """x [..., D] / sqrt(mean(x^2, -1) + eps) * scale [D], computed in float32,
    returned in x's dtype."""
    xf = x.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
    return (xf * inv * scale.astype(jnp.float32)).astype(x.dtype)


class RMSNorm(nnx.Module):
    """Root-mean-square norm over the last axis with a learnable scale (init 1)."""

    def __init__(self, dim: int, *, eps: float = 1e-6, param_dtype=jnp.float32):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        """x [..., D] -> [..., D] in x's dtype."""
        return rms_norm(x, self.scale[...], eps=self.eps)


class SwiGLU(nnx.Module):
    """Gated MLP: (silu(x W_gate) * x W_up) W_down, hidden width F."""

    def __init__(
        self,
        d_model: int,
        hidden: int,
        *,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.dtype = dtype
        init = dense_init()
        self.w_gate = nnx.Param(init(rngs.params(), (d_model, hidden), param_dtype))
        self.w_up = nnx.Param(init(rngs.params(), (d_model, hidden), param_dtype))
        self.w_down = nnx.Param(init(rngs.params(), (hidden, d_model), param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        """x [B, T, D] -> [B, T, D] in the compute dtype."""
        dt = self.dtype
        x = x.astype(dt)
        gate = jnp.einsum("BTD,DF->BTF", x, self.w_gate[...].astype(dt))
        up = jnp.einsum("BTD,DF->BTF", x, self.w_up[...].astype(dt))
        return jnp.einsum("BTF,FD->BTD", jax.nn.silu(gate) * up, self.w_down[...].astype(dt))
