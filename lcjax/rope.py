"""Rotary position embedding (RoPE; Su et al., 2021, "RoFormer").

For a pair (x_{2m}, x_{2m+1}) (interleaved layout, GPT-J / RoFormer) or
(x_m, x_{m+d/2}) (half-rotation layout, GPT-NeoX / Llama / HF) at position n,

    [x'_a, x'_b] = [x_a cos(n θ_m) - x_b sin(n θ_m),  x_a sin(n θ_m) + x_b cos(n θ_m)],
    θ_m = base^{-2m/d},  m = 0 .. d/2 - 1,

so q(n)·k(n') depends on n - n' only. Position ids are arbitrary (offsets for a
KV cache, perturbed positions for self-distillation); ``inv_freq`` is exposed for
head analysis (LPS).

Frequency scaling (:func:`scaled_inv_freq`, the Hugging Face ``rope_scaling`` /
``rope_parameters`` types): ``"default"``; ``"linear"`` (position interpolation, Chen et
al. 2023: θ_m / factor); ``"llama3"`` (Llama 3.1: wavelengths λ_m = 2π/θ_m longer than
L/low_freq_factor are divided by ``factor``, shorter than L/high_freq_factor kept, and in
between interpolated with s = (L/λ_m − low_freq_factor)/(high_freq_factor −
low_freq_factor): θ'_m = (1 − s) θ_m/factor + s θ_m, L = original_max_position_embeddings).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

Layout = Literal["half", "interleaved"]

__all__ = ["inv_freq", "rope_angles", "apply_rope", "Layout", "scaled_inv_freq",
           "check_rope_scaling", "ROPE_SCALING_TYPES", "sinusoidal_embedding"]

# scaling types scaled_inv_freq implements -> the keys each one needs
ROPE_SCALING_TYPES = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
}


def inv_freq(head_dim: int, base: float = 10000.0) -> jax.Array:
    """θ_m = base^{-2m/d} for m = 0 .. d/2 - 1; float32 [head_dim // 2]."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    return base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)


def check_rope_scaling(scaling: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Validate a RoPE scaling mapping (``{"rope_type": "llama3", "factor": 8.0, ...}``; the
    older key ``"type"`` is accepted) and return it as a plain dict with ``rope_type``, or
    None for None / the default type. ``ValueError`` for an unknown type or missing keys."""
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise ValueError(f"rope scaling must be a mapping or None, got {type(scaling).__name__}")
    out = {k: v for k, v in scaling.items() if k != "type"}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    out["rope_type"] = kind
    if kind not in ROPE_SCALING_TYPES:
        raise ValueError(f"rope scaling: rope_type {kind!r} is not supported; supported: "
                         f"{sorted(ROPE_SCALING_TYPES)}")
    missing = [k for k in ROPE_SCALING_TYPES[kind] if out.get(k) is None]
    if missing:
        raise ValueError(f"rope scaling {kind!r} needs {missing}, got keys {sorted(out)}")
    if kind != "default" and not float(out["factor"]) > 0:
        raise ValueError(f"rope scaling: `factor` must be > 0, got {out['factor']}")
    if kind == "llama3" and not float(out["high_freq_factor"]) > float(out["low_freq_factor"]):
        raise ValueError(f"rope scaling llama3: high_freq_factor ({out['high_freq_factor']}) "
                         f"must exceed low_freq_factor ({out['low_freq_factor']})")
    return None if kind == "default" else out


def scaled_inv_freq(head_dim: int, base: float = 10000.0,
                    scaling: Mapping[str, Any] | None = None) -> np.ndarray:
    """RoPE frequencies θ_m (m = 0 .. d/2 − 1) after ``scaling`` (module docstring), as
    float64 numpy [head_dim // 2] (a trace-time constant; ``apply_rope(frequencies=...)``
    casts it to float32). ``scaling=None`` gives base^{−2m/d}."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    theta = float(base) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = check_rope_scaling(scaling)
    if scaling is None:
        return theta
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return theta / factor
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * np.pi / theta
    smooth = (old_len / wavelen - low) / (high - low)
    mid = (1 - smooth) * theta / factor + smooth * theta
    return np.where(wavelen > old_len / low, theta / factor,
                    np.where(wavelen < old_len / high, theta, mid))


def rope_angles(positions: jax.Array, frequencies: jax.Array) -> jax.Array:
    """n θ_m: positions [..., T] x frequencies [d/2] -> float32 [..., T, d/2]."""
    return positions.astype(jnp.float32)[..., None] * frequencies


def sinusoidal_embedding(positions: jax.Array, dim: int, base: float = 10000.0) -> jax.Array:
    """The absolute sinusoidal position embedding of Vaswani et al. (2017), added to the
    token embeddings (``DecoderConfig(position="absolute")``): positions [..., T] ->
    float32 [..., T, dim] with e[n, m] = sin(n θ_m), e[n, m + dim/2] = cos(n θ_m),
    θ_m = base^{-2m/dim} (the half layout of the RoPE angles; ``dim`` even)."""
    if dim % 2:
        raise ValueError(f"sinusoidal_embedding: `dim` must be even, got {dim}")
    angles = rope_angles(positions, inv_freq(dim, base))
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


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
