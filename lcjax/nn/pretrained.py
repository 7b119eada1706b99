"""A method's own parameters on pretrained weights.

A checkpoint (Hugging Face, or an lcjax run trained with another variant) holds the
projections, norms and embeddings; a variant with parameters of its own (PLASH
prototypes, SSMax's s, ASEntmax's β and γ, a learnable entmax α) needs them initialised.
:func:`init_variant_params` builds them concretely in a model whose other parameters are
already loaded, and says how each was set:

* ``"plash"``: the prototypes of layer l, kv head h are the k-means centroids (Lloyd,
  :data:`KMEANS_STEPS` steps from M keys spread over the batch) of that head's keys
  (RoPE applied) on a calibration batch, computed with the checkpoint's own softmax
  attention in every layer (data dependent, as PLASH's prototypes summarise the keys);
* ``"asentmax"`` (per-head mode): β = 0, γ = 0, so q·(δ + β (log n)^γ) = q (δ = 1):
  the length scaling is neutral at init (the mapping is still α-entmax, not softmax);
  the input mode has no neutral value: its standard init;
* ``"ssmax"``: s at its standard init (``attention_options["length_s"]``, default 1):
  no value of s gives q·s·log n = q at every length n, so SSMax cannot start equal to
  the checkpoint;
* a learnable α (``learn=("alpha",)``): ``attention_options["alpha"]`` (default 1.5).

``variant_param_paths(model)`` lists the parameters that belong to variants (e.g. to
train only them: ``lcjax train --init DIR --attention plash``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lcjax.nn.attention import capture_attention, nape_slopes
from lcjax.nn.decoder import DecoderLM
from lcjax.nn.plash import PlashAttention
from lcjax.nn.variant_params import (
    LearnableAlpha,
    LengthScaling,
    SSMaxScale,
    VariantConfig,
    build_variant_params,
)

__all__ = ["KMEANS_STEPS", "init_variant_params", "kmeans_centroids", "variant_param_paths"]

KMEANS_STEPS = 8
CALIBRATION_SHAPE = (2, 128)


def variant_param_paths(model) -> list[str]:
    """Dotted paths (``blocks.3.attn.variant_params.prototypes``) of every variant
    parameter of a :class:`~lcjax.nn.DecoderLM`."""
    return [f"blocks.{i}.attn.variant_params.{p}" for i, block in enumerate(model.blocks)
            if block.attn.variant_params is not None
            for p in _leaf_paths(block.attn.variant_params)]


def kmeans_centroids(x: jax.Array, m: int, steps: int = KMEANS_STEPS) -> jax.Array:
    """M centroids [m, D] of points x [N, D] (N >= 1): Lloyd's algorithm from the points
    at evenly spaced indices; an empty cluster keeps its centroid."""
    n = x.shape[0]
    c = x[jnp.linspace(0, n - 1, m).round().astype(jnp.int32)].astype(jnp.float32)
    xf = x.astype(jnp.float32)
    for _ in range(steps):
        d = jnp.sum(xf ** 2, -1)[:, None] - 2 * xf @ c.T + jnp.sum(c ** 2, -1)[None, :]
        onehot = jax.nn.one_hot(jnp.argmin(d, axis=-1), m, dtype=jnp.float32)  # [N, m]
        count = jnp.sum(onehot, axis=0)
        c = jnp.where(count[:, None] > 0, onehot.T @ xf / jnp.maximum(count, 1)[:, None], c)
    return c


def _variant_config(model, i: int) -> VariantConfig:
    c = model.config
    options = dict(c.layer_attention(i)[1] or {})
    if model.blocks[i].attn.position == "nape":
        options["alibi_slopes"] = nape_slopes(c.num_heads)
    return VariantConfig(c.d_model, c.num_heads, c.num_kv_heads, c.head_dim, options=options,
                         learn=c.attention_learn, dtype=c.dtype, param_dtype=c.param_dtype)


def _calibration_keys(model, calibration) -> list[jax.Array]:
    """Per layer, the keys [N, Hkv, D] of the calibration batch when every layer runs the
    checkpoint's softmax attention (the model's parameters without the variants')."""
    cfg = dataclasses.replace(model.config, attention="softmax", attention_options={},
                              attention_learn=())
    graphdef, state = nnx.split(nnx.eval_shape(lambda: DecoderLM(cfg, rngs=nnx.Rngs(0))))
    pure = nnx.to_pure_dict(nnx.state(model))
    for block in pure["blocks"].values():
        block["attn"].pop("variant_params", None)
    nnx.replace_by_pure_dict(state, pure)
    dense = nnx.merge(graphdef, state)
    _, inputs = capture_attention(dense, jnp.asarray(calibration, jnp.int32), tap="inputs")
    return [x["k"].reshape(-1, *x["k"].shape[2:]) for x in inputs]


def init_variant_params(model, *, calibration=None, seed: int = 0) -> dict[str, str]:
    """Build every layer's variant parameters concretely (module docstring) in ``model``
    (a :class:`~lcjax.nn.DecoderLM` whose other parameters are loaded; its variant
    parameters may be abstract, as after ``nnx.eval_shape``).

    Args:
      calibration: int tokens [B, T] for PLASH's data-dependent prototypes; None: random
        token ids of shape :data:`CALIBRATION_SHAPE` (seeded; real text is better).
      seed: for the calibration ids and any random standard init.

    Returns:
      ``{parameter path: how it was initialised}`` (empty without variant parameters).
    """
    report: dict[str, str] = {}
    keys = None
    for i, block in enumerate(model.blocks):
        attn = block.attn
        if getattr(attn.attention_fn, "params", None) is None:
            continue
        vp = build_variant_params(attn.attention_fn, _variant_config(model, i),
                                  rngs=nnx.Rngs(seed + i))
        if vp is None:
            continue
        where = f"blocks.{i}.attn.variant_params"
        if isinstance(vp, PlashAttention):
            if keys is None:
                if calibration is None:
                    rng = np.random.default_rng(seed)
                    calibration = rng.integers(0, model.config.vocab_size, CALIBRATION_SHAPE)
                keys = _calibration_keys(model, calibration)
            proto = vp.prototypes[...]
            m = proto.shape[1]
            cents = jnp.stack([kmeans_centroids(keys[i][:, h], m) for h in range(proto.shape[0])])
            vp.prototypes[...] = cents.astype(proto.dtype)
            report[f"{where}.prototypes"] = (
                f"k-means ({KMEANS_STEPS} Lloyd steps) of the checkpoint's keys per kv head "
                f"on a calibration batch of {tuple(np.shape(calibration))} tokens")
        elif isinstance(vp, LengthScaling):
            if vp.mode == "head":
                vp.beta[...] = jnp.zeros_like(vp.beta[...])
                vp.gamma[...] = jnp.zeros_like(vp.gamma[...])
                report[f"{where}.beta"] = "0 (neutral: q·(1 + 0·(log n)^γ) = q)"
                report[f"{where}.gamma"] = "0"
            else:
                report[f"{where}.beta_proj"] = "standard init (input mode: no neutral value)"
                report[f"{where}.gamma_proj"] = "standard init (input mode: no neutral value)"
        elif isinstance(vp, SSMaxScale):
            report[f"{where}.s"] = (f"{float(vp.s[...][0]):g}, SSMax's standard init (no s "
                                    f"gives q·s·log n = q at every length)")
        alpha = vp if isinstance(vp, LearnableAlpha) else getattr(vp, "alpha", None)
        if isinstance(alpha, LearnableAlpha):
            report[f"{where}{'' if alpha is vp else '.alpha'}.alpha_raw"] = (
                "attention_options['alpha'] (default 1.5)")
        for path in _leaf_paths(vp):
            report.setdefault(f"{where}.{path}", "the variant's standard init")
        attn.variant_params = vp
    return report


def _leaf_paths(module) -> list[str]:
    flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(module, nnx.Param)))
    return [".".join(str(getattr(k, "key", k)) for k in p) for p, _ in flat[0]]


def describe(report: Mapping[str, str]) -> str:
    """One line per initialised parameter."""
    return "\n".join(f"{k}: {v}" for k, v in report.items())
