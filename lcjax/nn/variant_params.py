"""Learnable parameters of attention variants, built by ``lcjax.nn.Attention`` from the spec.

A variant that needs parameters (a learnable α, PLASH prototypes [H, P, D], per-head
length-scaling β/γ, TRSP gates, ...) declares a factory in its spec,
``AttentionSpec(..., params=factory)``; the generic module knows nothing about any one
variant. The protocol:

    module = factory(config: VariantConfig, *, rngs: nnx.Rngs) -> nnx.Module | None
    extra = module(x=x, q=q, k=k, v=v, positions=positions) -> dict[str, Array]
    out = variant(q, k, v, causal=..., mask=..., scale=..., **{**options, **extra})

- ``config`` (:class:`VariantConfig`) holds the layer's sizes, dtypes, the static
  ``attention_options`` and ``learn``, the names of the quantities the user asked to
  learn (``Attention(learn=("alpha",))``, ``DecoderConfig(attention_learn=("alpha",))``).
  The factory raises ``ValueError`` naming any entry of ``learn`` it does not know, and
  returns ``None`` when the variant needs no parameters for this configuration (e.g.
  entmax with a fixed α).
- The module is an attribute of the ``Attention`` layer (``attn.variant_params``), so its
  ``nnx.Param``s are part of ``nnx.state(model, nnx.Param)``, trained, checkpointed.
- On every call it gets, as keywords, the layer input ``x`` [B, T, D_model], the rotated
  ``q`` [B, T, H, D], ``k``, ``v`` [B, S, Hkv, D] (S = the cache length when decoding)
  and ``positions``; it takes the ones it needs and ``**_`` for the rest, and returns
  keyword options for the variant, which override the static ones of the same name
  (so an initial value may live in ``attention_options`` under the same name, as
  ``alpha`` does for entmax).
- A module may name, in a class attribute ``init_options: tuple[str, ...]``, options
  that only configure its initialisation; they are not passed to the variant.

The built-in specs declare their parameters as data, ``params=LearnedParams(kind)``
(``lcjax.attention`` sits below ``lcjax.nn`` and never names anything here); this module
maps each ``kind`` to its factory (:data:`FACTORIES`): :func:`learnable_alpha` (entmax),
:func:`asentmax_params` (ASEntmax's β, γ per head or from the input, and α),
:func:`ssmax_params` (SSMax's s per head) and ``lcjax.nn.plash.plash_prototypes``. A
user's spec may instead give a factory callable, or a string ``"package.module:attr"``
naming one, imported on first use.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import FrozenDict

from lcjax.attention import AttentionSpec, LearnedParams
from lcjax.attention.entmax.mapping import alpha_from_param
from lcjax.nn.plash import plash_prototypes

__all__ = ["FACTORIES", "LearnableAlpha", "LengthScaling", "SSMaxScale", "VariantConfig",
           "asentmax_params", "build_variant_params", "learnable_alpha",
           "resolve_params_factory", "ssmax_params", "variant_rngs"]


@dataclasses.dataclass(frozen=True)
class VariantConfig:
    """What a variant's parameter factory may read (see the module docstring)."""

    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    options: Mapping[str, Any] = dataclasses.field(default_factory=FrozenDict)
    learn: tuple[str, ...] = ()
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        object.__setattr__(self, "options", FrozenDict(self.options))
        object.__setattr__(self, "learn", tuple(self.learn))

    def unknown_learn(self, known: tuple[str, ...], variant: str) -> None:
        """``ValueError`` if ``learn`` names something outside ``known``."""
        bad = [name for name in self.learn if name not in known]
        if bad:
            raise ValueError(f"{variant}: cannot learn {bad}; learnable: {list(known)} "
                             f"(got learn={self.learn})")


def resolve_params_factory(params: LearnedParams | Callable | str | None) -> Callable | None:
    """A spec's ``params``: a :class:`~lcjax.attention.LearnedParams` (its factory in
    :data:`FACTORIES`), a callable, None, or ``"package.module:attr"`` (imported now)."""
    if params is None or callable(params):
        return params
    if isinstance(params, LearnedParams):
        if params.kind not in FACTORIES:
            raise ValueError(f"AttentionSpec.params: no parameter factory of kind "
                             f"{params.kind!r}; known: {sorted(FACTORIES)}")
        return FACTORIES[params.kind]
    if not isinstance(params, str) or params.count(":") != 1:
        raise ValueError(f"AttentionSpec.params must be a LearnedParams, a callable or "
                         f"'package.module:attr', got {params!r}")
    module, attr = params.split(":")
    factory = getattr(importlib.import_module(module), attr)
    if not callable(factory):
        raise ValueError(f"AttentionSpec.params {params!r} is not callable")
    return factory


_SALT = 0x76617261  # "vara": separates the variant stream from the stream it comes from


def variant_rngs(rngs: nnx.Rngs) -> nnx.Rngs:
    """Fresh ``nnx.Rngs`` for a variant's factory, derived from ``rngs.params`` *without*
    advancing it: the model's other parameters are the same with or without variant
    parameters (a learned-α model and a fixed-α one share their projections), while
    every layer's factory still gets a different key (the stream's count differs)."""
    stream = rngs.params
    return nnx.Rngs(jax.random.fold_in(jax.random.fold_in(stream.key[...], stream.count[...]),
                                       _SALT))


def build_variant_params(fn: Callable, config: VariantConfig, *,
                         rngs: nnx.Rngs) -> nnx.Module | None:
    """The parameter module of variant ``fn`` (a spec or a plain callable) for ``config``;
    the factory draws from :func:`variant_rngs` of ``rngs``.

    A plain callable or a spec without ``params`` has none; asking it to ``learn``
    anything is then a ``ValueError``. So is a factory returning None for a non-empty
    ``learn``.
    """
    name = fn.name if isinstance(fn, AttentionSpec) else getattr(fn, "__name__", repr(fn))
    factory = resolve_params_factory(fn.params) if isinstance(fn, AttentionSpec) else None
    if factory is None:
        if config.learn:
            raise ValueError(f"Attention: learn={config.learn} needs a variant whose spec "
                             f"declares a parameter factory (`params`); {name!r} has none")
        return None
    module = factory(config, rngs=variant_rngs(rngs))
    if module is None and config.learn:
        raise ValueError(f"Attention: the parameter factory of {name!r} built nothing for "
                         f"learn={config.learn}")
    if module is not None and not isinstance(module, nnx.Module):
        raise TypeError(f"Attention: the parameter factory of {name!r} must return an "
                        f"nnx.Module or None, got {type(module).__name__}")
    return module


# ----------------------------------------------------------------------------
# Entmax: a learnable α per head
# ----------------------------------------------------------------------------
def _alpha_param_inverse(alpha: float) -> float:
    """raw with ``alpha_from_param(raw) = alpha``: logit(alpha - 1), for alpha in [1.01, 2)."""
    return math.log(alpha - 1.0) - math.log(2.0 - alpha)  # Python floats: works under eval_shape


class LearnableAlpha(nnx.Module):
    """Per-head α of entmax attention: ``alpha =
    lcjax.attention.entmax.mapping.alpha_from_param(alpha_raw)``.

    alpha_raw: ``nnx.Param`` [num_heads], initialised so that every head starts at
    ``alpha0`` ∈ [1.01, 2) (raw = logit(alpha0 - 1); raw = 0 is α = 1.5).
    """

    def __init__(self, num_heads: int, alpha0: float = 1.5, *, param_dtype=jnp.float32):
        if isinstance(alpha0, bool) or not isinstance(alpha0, numbers.Real) or not (
                1.01 <= alpha0 < 2.0):
            raise ValueError(f"LearnableAlpha: the initial alpha must be a number in "
                             f"[1.01, 2), got {alpha0!r}")
        raw0 = _alpha_param_inverse(float(alpha0))
        self.alpha_raw = nnx.Param(jnp.full((num_heads,), raw0, param_dtype))

    def __call__(self, **_) -> dict[str, jax.Array]:
        """``{"alpha": α [num_heads] float32}`` (overrides a static ``alpha`` option)."""
        return {"alpha": alpha_from_param(self.alpha_raw[...])}


def learnable_alpha(config: VariantConfig, *, rngs: nnx.Rngs) -> LearnableAlpha | None:
    """Parameter factory of entmax attention: with ``"alpha"`` in ``config.learn``, a
    :class:`LearnableAlpha` whose initial α is ``options["alpha"]`` (default 1.5);
    otherwise None (α stays the static option)."""
    del rngs  # deterministic initialisation
    config.unknown_learn(("alpha",), "entmax")
    if "alpha" not in config.learn:
        return None
    return LearnableAlpha(config.num_heads, config.options.get("alpha", 1.5),
                          param_dtype=config.param_dtype)


# ----------------------------------------------------------------------------
# ASEntmax / SSMax: length scaling of the queries (lcjax.attention.entmax.length_scaling)
# ----------------------------------------------------------------------------
def _scaled_heads(options, num_heads: int) -> tuple[bool, ...] | None:
    """Heads whose queries are length-scaled: ``options["length_heads"]`` if given, else,
    with ALiBi slopes in the options (NAPE positions), the heads without a slope — the
    paper scales only the NoPE heads —, else all (None)."""
    if options.get("length_heads") is not None:
        return tuple(bool(x) for x in jnp.asarray(options["length_heads"]).reshape(-1))
    slopes = options.get("alibi_slopes")
    if slopes is None:
        return None
    heads = tuple(float(s) == 0.0 for s in jnp.asarray(slopes).reshape(-1))
    if len(heads) != num_heads:
        raise ValueError(f"length scaling: `alibi_slopes` has {len(heads)} entries for "
                         f"{num_heads} heads")
    return heads


class LengthScaling(nnx.Module):
    """ASEntmax's β, γ: q_i ← q_i · (δ + β (log n_i)^γ) (``lcjax.attention.entmax.length_scaling``).

    ``mode="head"``: ``beta``, ``gamma`` are ``nnx.Param`` [num_heads], initialised to
    ``beta0``/``gamma0`` when given, else as in the paper's code, β ~ U(0.1, 1), γ ~ N(0, 0.1).
    ``mode="input"``: β_i = softplus(x_i W_β), γ_i = ``gamma_range`` · tanh(x_i W_γ) per
    token, W_β, W_γ ``nnx.Param`` [d_model, num_heads] (no bias, as the paper's default),
    LeCun-normal. δ stays the static option ``length_delta`` (default 1). ``alpha``: an
    optional :class:`LearnableAlpha` (``learn=("alpha",)``). ``length_heads``: the scaled
    heads (None = all), passed on as the variant option of the same name.
    """

    init_options = ("length_mode", "length_gamma_range")

    def __init__(self, d_model: int, num_heads: int, *, mode: str = "head", beta0=None,
                 gamma0=None, gamma_range: float = 2.0, length_heads=None,
                 alpha: LearnableAlpha | None = None, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        if mode not in ("head", "input"):
            raise ValueError(f"asentmax: `length_mode` must be 'head' or 'input', got {mode!r}")
        self.mode, self.gamma_range = mode, float(gamma_range)
        self.length_heads = length_heads
        self.alpha = alpha
        key = rngs.params
        if mode == "head":
            beta = (jnp.full((num_heads,), float(beta0)) if beta0 is not None else
                    jax.random.uniform(key(), (num_heads,), minval=0.1, maxval=1.0))
            gamma = (jnp.full((num_heads,), float(gamma0)) if gamma0 is not None else
                     0.1 * jax.random.normal(key(), (num_heads,)))
            self.beta = nnx.Param(beta.astype(param_dtype))
            self.gamma = nnx.Param(gamma.astype(param_dtype))
        else:
            init = nnx.initializers.lecun_normal()
            self.beta_proj = nnx.Param(init(key(), (d_model, num_heads), param_dtype))
            self.gamma_proj = nnx.Param(init(key(), (d_model, num_heads), param_dtype))

    def __call__(self, *, x=None, **_) -> dict[str, jax.Array]:
        """``{"length_beta", "length_gamma"}``: [H], or [B, T, H] from x [B, T, D_model]
        (float32); plus ``alpha`` and ``length_heads`` when set."""
        if self.mode == "head":
            out = {"length_beta": self.beta[...].astype(jnp.float32),
                   "length_gamma": self.gamma[...].astype(jnp.float32)}
        else:
            xf = x.astype(jnp.float32)
            out = {"length_beta": jax.nn.softplus(
                       jnp.einsum("BTD,DH->BTH", xf, self.beta_proj[...].astype(jnp.float32))),
                   "length_gamma": self.gamma_range * jnp.tanh(
                       jnp.einsum("BTD,DH->BTH", xf, self.gamma_proj[...].astype(jnp.float32)))}
        if self.length_heads is not None:
            out["length_heads"] = jnp.asarray(self.length_heads, bool)
        if self.alpha is not None:
            out.update(self.alpha())
        return out


def asentmax_params(config: VariantConfig, *, rngs: nnx.Rngs) -> LengthScaling:
    """Parameter factory of ``"asentmax"``: always a :class:`LengthScaling` (β, γ per head,
    or input-dependent with ``attention_options["length_mode"] = "input"``; initial values
    ``length_beta`` / ``length_gamma`` when given as numbers), plus a learnable α with
    ``learn=("alpha",)`` (initial ``alpha``, default 1.5). With ALiBi slopes in the options
    (NAPE), only the heads without a slope are scaled."""
    config.unknown_learn(("alpha",), "asentmax")
    opts = config.options
    alpha = (LearnableAlpha(config.num_heads, opts.get("alpha", 1.5),
                            param_dtype=config.param_dtype)
             if "alpha" in config.learn else None)
    return LengthScaling(config.d_model, config.num_heads, mode=opts.get("length_mode", "head"),
                         beta0=opts.get("length_beta"), gamma0=opts.get("length_gamma"),
                         gamma_range=opts.get("length_gamma_range", 2.0),
                         length_heads=_scaled_heads(opts, config.num_heads), alpha=alpha,
                         param_dtype=config.param_dtype, rngs=rngs)


class SSMaxScale(nnx.Module):
    """SSMax's s: q_i ← q_i · s_h log n_i; ``s`` is an ``nnx.Param`` [num_heads] starting at
    ``s0`` (default 1). ``length_heads``: the scaled heads (None = all)."""

    def __init__(self, num_heads: int, s0: float = 1.0, *, length_heads=None,
                 param_dtype=jnp.float32):
        self.s = nnx.Param(jnp.full((num_heads,), float(s0), param_dtype))
        self.length_heads = length_heads

    def __call__(self, **_) -> dict[str, jax.Array]:
        out = {"length_s": self.s[...].astype(jnp.float32)}
        if self.length_heads is not None:
            out["length_heads"] = jnp.asarray(self.length_heads, bool)
        return out


def ssmax_params(config: VariantConfig, *, rngs: nnx.Rngs) -> SSMaxScale:
    """Parameter factory of ``"ssmax"``: a learned s per head (initial
    ``attention_options["length_s"]``, default 1); with ALiBi slopes (NAPE) only the heads
    without a slope are scaled."""
    del rngs
    config.unknown_learn((), "ssmax")
    return SSMaxScale(config.num_heads, config.options.get("length_s", 1.0),
                      length_heads=_scaled_heads(config.options, config.num_heads),
                      param_dtype=config.param_dtype)


# LearnedParams(kind) of the built-in specs -> the factory that builds it
FACTORIES: dict[str, Callable[..., nnx.Module | None]] = {
    "learnable_alpha": learnable_alpha,
    "asentmax_params": asentmax_params,
    "ssmax_params": ssmax_params,
    "plash_prototypes": plash_prototypes,
}
