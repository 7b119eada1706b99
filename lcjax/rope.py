"""Rotary position embedding (RoPE; Su et al., 2021, "RoFormer").

For a pair (x_{2m}, x_{2m+1}) (interleaved layout, GPT-J / RoFormer) or
(x_m, x_{m+d/2}) (half-rotation layout, GPT-NeoX / Llama / HF) at position n,

    [x'_a, x'_b] = [x_a cos(n θ_m) - x_b sin(n θ_m),  x_a sin(n θ_m) + x_b cos(n θ_m)],
    θ_m = base^{-2m/d},  m = 0 .. d/2 - 1,

so q(n)·k(n') depends on n - n' only. Position ids are arbitrary (offsets for a
KV cache, perturbed positions for self-distillation); ``inv_freq`` is exposed for
head analysis (LPS).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

Layout = Literal["half", "interleaved"]

__all__ = ["inv_freq", "rope_angles", "apply_rope", "Layout"]


def inv_freq(head_dim: int, base: float = 10000.0) -> jax.Array:
    """θ_m = base^{-2m/d} for m = 0 .. d/2 - 1; float32 [head_dim // 2]."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    return base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)


def rope_angles(positions: jax.Array, frequencies: jax.Array) -> jax.Array:
    """n θ_m: positions [..., T] x frequencies [d/2] -> float32 [..., T, d/2]."""
    return positions.astype(jnp.float32)[..., None] * frequencies


def apply_rope(
    x: jax.Array,
    positions: jax.Array,
    *,
    base: float = 10000.0,
    layout: Layout = "half",
    frequencies: jax.Array | None = None,
) -> jax.Array:
    """Rotate x [B, T, H, D] by its positions ([T] or [B, T], any numeric dtype).

    ``frequencies`` overrides ``inv_freq(D, base)`` (e.g. scaled RoPE). The rotation is
    computed in float32 and returned in x's dtype.
    """
    if x.ndim != 4:
        raise ValueError(f"apply_rope: x must be [batch, len, heads, head_dim], got {x.shape}")
    d = x.shape[-1]
    freqs = inv_freq(d, base) if frequencies is None else jnp.asarray(frequencies, jnp.float32)
    if freqs.shape != (d // 2,):
        raise ValueError(f"apply_rope: frequencies must have shape ({d // 2},), got {freqs.shape}")
    positions = jnp.asarray(positions)
    if positions.shape[-1] != x.shape[1] or positions.ndim not in (1, 2):
        raise ValueError(
            f"apply_rope: positions must be [len] or [batch, len] with len={x.shape[1]}, "
            f"got {positions.shape}"
        )
    angles = rope_angles(positions, freqs)  # [T, d/2] or [B, T, d/2]
    if angles.ndim == 2:
        angles = angles[None]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    xf = x.astype(jnp.float32)
    if layout == "half":
        a, b = xf[..., : d // 2], xf[..., d // 2 :]
        out = jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    elif layout == "interleaved":
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(xf.shape)
    else:
        raise ValueError(f"apply_rope: layout must be 'half' or 'interleaved', got {layout!r}")
    return out.astype(x.dtype)
