"""LoRA: low-rank adapters on the linear layers of any lcjax LM (Hu et al., 2021,
"LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685).

A linear kernel ``W`` (our layout: input axes first, e.g. q_proj [D, N, H], o_proj
[N, H, D], w_up [D, F]; flattened to [in, out]) gets a rank-``r`` update::

    y = x W + (α / r) · x Aᵀ Bᵀ          A [r, in] (Kaiming-uniform),  B [out, r] = 0

so an adapter starts as the identity edit and only ``A``, ``B`` train (the base stays
frozen: ``lcjax.train.train(..., wrt=LoRAParam)``). The base modules read their kernels
directly, so the adapted call runs the base model on ``W + (α/r) (B A)ᵀ`` (reshaped to
``W``'s shape) — the same function. Dropout (training only) drops input features of the
adapter path, ``A ← A · diag(m) / (1 - p)`` with ``m ~ Bernoulli(1 - p)`` over the ``in``
features, one mask per call shared by every token (PEFT drops each element of ``x``; a
per-token mask is not expressible in weight space).

Targets are chosen by pattern over the parameter paths (``"blocks.0.attn.q_proj"``): a
glob matches the whole path or its last component (``"q_proj"``, ``"w_*"``,
``"blocks.1.*"``), ``"re:<regex>"`` is a full-match regex over the whole path. Several named
adapters live in one :class:`LoRAModel`; ``active`` picks the one applied; :meth:`merge`
folds an adapter into the base weights and :meth:`unmerge` takes it out again.

Adapters save alone: :func:`save_adapter` / :func:`load_adapter` (orbax), and
:func:`lcjax.interop.peft.save_peft` / :func:`~lcjax.interop.peft.load_peft` in PEFT's
layout (``adapter_model.safetensors`` with
``base_model.model.<hf module>.lora_A.weight`` [r, in] and ``lora_B.weight`` [out, r],
``adapter_config.json``), named as in :func:`lcjax.interop.hf_tensor_paths`. Our flattened
[in, out] kernel is HF's ``weight.T`` for every projection, so ``A`` and ``B`` are PEFT's
without conversion.

    model = apply_lora(DecoderLM(cfg, rngs=nnx.Rngs(0)), LoRAConfig(rank=8, alpha=16,
                       target_modules=("q_proj", "v_proj")), rngs=nnx.Rngs(1))
    logits = model(tokens)                           # base + (α/r) B A
    result = train(cfg, tcfg, dataset=ds, model_fn=lambda *_: model, wrt=LoRAParam)
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = ["LoRAConfig", "LoRAParam", "LoRALayer", "LoRAAdapter", "LoRAModel", "apply_lora",
           "adapter_filter", "with_deltas",
           "lora_targets", "kernel_in_axes", "save_adapter", "load_adapter",
           "get_adapter", "install_adapter", "lora_param_count", "path_name"]

# input axes of the kernels whose layout is not [in, out]
_IN_AXES = {"o_proj": 2}
_NOT_LINEAR = ("embed",)  # looked up by index, not multiplied


class LoRAParam(nnx.Param):
    """An adapter parameter (A or B): ``nnx.Param`` subclass, so a plain ``nnx.Param``
    filter still sees it and ``LoRAParam`` alone selects the adapters."""


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Rank ``rank``, scale ``alpha / rank``, input dropout ``dropout`` (training only),
    ``target_modules`` patterns (module docstring), ``in_axes`` = {pattern: number of
    leading input axes} for kernels whose layout is not known (default 1; o_proj 2)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    in_axes: Mapping[str, int] | tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        pairs = self.in_axes.items() if isinstance(self.in_axes, Mapping) else self.in_axes
        object.__setattr__(self, "in_axes", tuple((str(k), int(v)) for k, v in pairs))
        if isinstance(self.target_modules, str):
            object.__setattr__(self, "target_modules", (self.target_modules,))
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoRAConfig: `rank` must be a positive int, got {self.rank!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRAConfig: `dropout` must be in [0, 1), got {self.dropout!r}")
        if not self.target_modules:
            raise ValueError("LoRAConfig: `target_modules` is empty")

    @property
    def scale(self) -> float:
        """α / r."""
        return self.alpha / self.rank


def path_name(path: Sequence[Any]) -> str:
    """("blocks", 0, "attn", "q_proj") -> "blocks.0.attn.q_proj"."""
    return ".".join(str(p) for p in path)


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    leaf = name.rsplit(".", 1)[-1]
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(leaf, pattern)


def kernel_in_axes(path: Sequence[Any], shape: Sequence[int],
                   overrides: Mapping[str, int] | Sequence[tuple[str, int]] | None = None
                   ) -> int:
    """Number of leading input axes of the kernel at ``path`` (its [in, out] split).

    Raises:
      ValueError: a parameter that is not a linear kernel (fewer than 2 dims, the
        embedding table) or a kernel of more than 2 dims whose layout is unknown.
    """
    name = path_name(path)
    leaf = str(path[-1])
    pairs = overrides.items() if isinstance(overrides, Mapping) else (overrides or ())
    for pattern, n in pairs:
        if _matches(name, pattern):
            if not 1 <= n < len(shape):
                raise ValueError(f"LoRA: in_axes {n} for {name} of shape {tuple(shape)}")
            return n
    if len(shape) < 2 or leaf in _NOT_LINEAR:
        raise ValueError(f"LoRA: {name} (shape {tuple(shape)}) is not a linear kernel")
    if leaf in _IN_AXES:
        return _IN_AXES[leaf]
    if len(shape) == 2 or leaf in ("q_proj", "k_proj", "v_proj"):
        return 1
    raise ValueError(f"LoRA: unknown layout of {name} (shape {tuple(shape)}); give "
                     f"LoRAConfig(in_axes={{{leaf!r}: n}})")


def lora_targets(model: nnx.Module, config: LoRAConfig) -> dict[str, tuple[tuple, int]]:
    """The model's parameters the config targets: ``{path name: (path, in_axes)}`` in
    path order.

    Raises:
      ValueError: a pattern that matches no parameter, or one that matches a parameter
        that is not a linear kernel.
    """
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    out, used = {}, set()
    for path, var in flat:
        if issubclass(type(var), LoRAParam):
            continue
        name = path_name(path)
        hits = [p for p in config.target_modules if _matches(name, p)]
        if hits:
            used.update(hits)
            out[name] = (tuple(path), kernel_in_axes(path, var.shape, config.in_axes))
    missing = [p for p in config.target_modules if p not in used]
    if missing:
        raise ValueError(f"LoRA: target_modules {missing} match no parameter of the model")
    return out


class LoRALayer(nnx.Module):
    """The adapter of one kernel of shape ``in_shape + out_shape``: A [r, in], B [out, r]."""

    def __init__(self, in_shape: Sequence[int], out_shape: Sequence[int], rank: int, *,
                 rngs: nnx.Rngs, param_dtype=jnp.float32):
        self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
        n_in, n_out = math.prod(self.in_shape), math.prod(self.out_shape)
        bound = 1.0 / math.sqrt(n_in)  # PEFT's kaiming_uniform(a=√5) on an [r, in] matrix
        self.a = LoRAParam(jax.random.uniform(rngs.params(), (rank, n_in), param_dtype,
                                              -bound, bound))
        self.b = LoRAParam(jnp.zeros((n_out, rank), param_dtype))

    def delta(self, scale: float, keep: jax.Array | None = None) -> jax.Array:
        """ΔW = scale · (B A)ᵀ reshaped to ``in_shape + out_shape``, float32; ``keep``
        [in] multiplies A's columns (the dropout mask, already divided by 1 - p)."""
        a = self.a[...].astype(jnp.float32)
        if keep is not None:
            a = a * keep[None, :]
        d = scale * jnp.einsum("or,ri->io", self.b[...].astype(jnp.float32), a)
        return d.reshape(self.in_shape + self.out_shape)


class LoRAAdapter(nnx.Module):
    """One named adapter: its config and a :class:`LoRALayer` per target path name."""

    def __init__(self, model: nnx.Module, config: LoRAConfig, *, rngs: nnx.Rngs,
                 param_dtype=jnp.float32):
        self.config = config
        shapes = {path_name(p): v.shape
                  for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
        targets = lora_targets(model, config)
        layers = {}
        for name, (_, n_in) in targets.items():
            shape = shapes[name]
            layers[name] = LoRALayer(shape[:n_in], shape[n_in:], config.rank, rngs=rngs,
                                     param_dtype=param_dtype)
        self.paths = tuple((name, path) for name, (path, _) in targets.items())
        self.layers = nnx.Dict(layers)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs) if config.dropout else None

    def deltas(self) -> dict[tuple, jax.Array]:
        """``{parameter path: ΔW}``; with dropout in training mode a fresh mask per layer."""
        out, paths = {}, dict(self.paths)
        for name, layer in self.layers.items():
            keep = None
            if self.dropout is not None:
                keep = self.dropout(jnp.ones((math.prod(layer.in_shape),), jnp.float32))
            out[paths[name]] = layer.delta(self.config.scale, keep)
        return out


def with_deltas(model: nnx.Module, deltas: Mapping[tuple, jax.Array]) -> nnx.Module:
    """A functional copy of ``model`` whose parameters at the given paths are W + ΔW (added in
    float32, stored in W's dtype); ``model`` itself is untouched. ``deltas``: {parameter path
    (tuple): ΔW shaped like W}."""
    graphdef, state = nnx.split(model)
    flat = []
    for path, var in nnx.to_flat_state(state):
        d = deltas.get(tuple(path))
        if d is not None:
            w = var.get_value()
            var = var.replace((w.astype(jnp.float32) + d).astype(w.dtype))
        flat.append((path, var))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _base_var(model: nnx.Module, path: Sequence[Any]) -> nnx.Variable:
    node = model
    for key in path[:-1]:
        node = node[key] if isinstance(key, int) else getattr(node, key)
    return getattr(node, path[-1]) if not isinstance(path[-1], int) else node[path[-1]]


class LoRAModel(nnx.Module):
    """A base LM with named LoRA adapters; calls (and its other methods, e.g.
    ``hidden_states``, ``init_cache``) go to the base with the active adapter applied.

    ``base``: the wrapped model (its own parameter paths unchanged, so
    ``lcjax.interop.save_hf(model.base, ...)`` exports it, e.g. after :meth:`merge`);
    ``adapters``: ``nnx.Dict`` name -> :class:`LoRAAdapter`; ``active``: the name applied
    (None: the base alone); ``merged``: names folded into the base weights.
    """

    def __init__(self, base: nnx.Module):
        if isinstance(base, LoRAModel):
            raise ValueError("LoRAModel: the base is already a LoRAModel (add_adapter)")
        self.base = base
        self.adapters = nnx.Dict({})
        self.active: str | None = None
        self.merged: tuple[str, ...] = ()

    def add_adapter(self, name: str, config: LoRAConfig, *, rngs: nnx.Rngs,
                    activate: bool = True) -> LoRAAdapter:
        """Adds adapter ``name`` (B = 0: the model is unchanged) and makes it active."""
        if name in self.adapters:
            raise ValueError(f"LoRAModel: adapter {name!r} exists; adapters: "
                             f"{sorted(self.adapters)}")
        dtype = getattr(getattr(self.base, "config", None), "param_dtype", jnp.float32)
        self.adapters[name] = LoRAAdapter(self.base, config, rngs=rngs, param_dtype=dtype)
        if activate:
            self.active = name
        return self.adapters[name]

    def set_adapter(self, name: str | None) -> None:
        """Makes ``name`` the active adapter (None: the base alone)."""
        if name is not None and name not in self.adapters:
            raise ValueError(f"LoRAModel: no adapter {name!r}; adapters: {sorted(self.adapters)}")
        self.active = name

    def adapted(self) -> nnx.Module:
        """A functional copy of the base with the active adapter added (the base itself
        when none is active or it is merged). What every call runs."""
        if self.active is None or self.active in self.merged:
            return self.base
        return with_deltas(self.base, self.adapters[self.active].deltas())

    def __call__(self, *args, **kwargs):
        """The base's call with the active adapter applied (same arguments and results)."""
        return self.adapted()(*args, **kwargs)

    def __getattr__(self, name: str):
        # only reached for names LoRAModel lacks: the base's attributes, its methods run
        # on the adapted weights
        if name.startswith("_") or name in ("base", "adapters", "active", "merged"):
            raise AttributeError(name)
        value = getattr(self.base, name)
        if callable(value) and getattr(value, "__self__", None) is self.base:
            return lambda *a, **k: getattr(self.adapted(), name)(*a, **k)
        return value

    def _fold(self, name: str | None, sign: float) -> str:
        name = self.active if name is None else name
        if name not in self.adapters:
            raise ValueError(f"LoRAModel: no adapter {name!r}; adapters: {sorted(self.adapters)}")
        adapter = self.adapters[name]
        mode = None if adapter.dropout is None else adapter.dropout.deterministic
        if adapter.dropout is not None:
            adapter.dropout.deterministic = True  # the merged weights carry no dropout
        try:
            deltas = adapter.deltas()
        finally:
            if adapter.dropout is not None:
                adapter.dropout.deterministic = mode
        for path, d in deltas.items():
            var = _base_var(self.base, path)
            w = var.get_value()
            var.set_value((w.astype(jnp.float32) + sign * d).astype(w.dtype))
        return name

    def merge(self, name: str | None = None) -> None:
        """W ← W + (α/r)(B A)ᵀ for adapter ``name`` (default the active one), in place."""
        if (self.active if name is None else name) in self.merged:
            raise ValueError(f"LoRAModel: adapter {name or self.active!r} is already merged")
        self.merged = (*self.merged, self._fold(name, 1.0))

    def unmerge(self, name: str | None = None) -> None:
        """Inverse of :meth:`merge` (W ← W − ΔW; exact up to float rounding)."""
        name = self.active if name is None else name
        if name not in self.merged:
            raise ValueError(f"LoRAModel: adapter {name!r} is not merged (merged: "
                             f"{list(self.merged)})")
        self._fold(name, -1.0)
        self.merged = tuple(m for m in self.merged if m != name)


@functools.cache  # one filter per name: train-step caches hit
def adapter_filter(name: str):
    """An nnx filter of adapter ``name``'s parameters alone (its A and B matrices, wherever
    the LoRAModel sits in the tree), e.g. ``train(..., wrt=adapter_filter("search_hotel"))``
    trains one of several adapters and keeps the others out of the optimizer state."""

    def select(path, value) -> bool:
        if not isinstance(value, LoRAParam):
            return False
        keys = [str(k) for k in path]
        return any(a == "adapters" and b == name for a, b in zip(keys, keys[1:]))

    return select


def apply_lora(model: nnx.Module, config: LoRAConfig, *, rngs: nnx.Rngs,
               name: str = "default") -> LoRAModel:
    """``model`` wrapped in a :class:`LoRAModel` with one active adapter ``name`` (or that
    adapter added, if ``model`` is already a LoRAModel)."""
    wrapped = model if isinstance(model, LoRAModel) else LoRAModel(model)
    wrapped.add_adapter(name, config, rngs=rngs)
    return wrapped


# --------------------------------------------------------------------------- saving

def get_adapter(model: LoRAModel, name: str | None) -> tuple[str, LoRAAdapter]:
    """``(name, adapter)`` of adapter ``name`` (None: the active one); ValueError if absent."""
    name = model.active if name is None else name
    if name not in model.adapters:
        raise ValueError(f"LoRA: no adapter {name!r}; adapters: {sorted(model.adapters)}")
    return name, model.adapters[name]


def _config_json(c: LoRAConfig) -> dict:
    return {"rank": c.rank, "alpha": c.alpha, "dropout": c.dropout,
            "target_modules": list(c.target_modules), "in_axes": dict(c.in_axes)}


def install_adapter(model: LoRAModel, name: str, config: LoRAConfig,
             weights: Mapping[str, tuple[np.ndarray, np.ndarray]], activate: bool) -> None:
    """Adds adapter ``name`` built from ``config`` and sets its A, B from ``weights``
    (path name -> (A, B)); ValueError when the paths or shapes differ from the model's."""
    adapter = model.add_adapter(name, config, rngs=nnx.Rngs(0), activate=activate)
    try:
        if set(weights) != set(adapter.layers):
            raise ValueError(f"LoRA: the saved adapter has layers {sorted(weights)}, the "
                             f"model's targets are {sorted(adapter.layers)}")
        for key, (a, b) in weights.items():
            layer = adapter.layers[key]
            for var, value, what in ((layer.a, a, "A"), (layer.b, b, "B")):
                if tuple(value.shape) != tuple(var.shape):
                    raise ValueError(f"LoRA: {key} {what} has shape {tuple(value.shape)}, "
                                     f"the model needs {tuple(var.shape)}")
                var.set_value(jnp.asarray(value, var.get_value().dtype))
    except ValueError:
        del model.adapters[name]
        if activate:
            model.active = None
        raise


def save_adapter(model: LoRAModel, directory: str | os.PathLike,
                 name: str | None = None) -> None:
    """Adapter ``name`` (default the active one) alone, with orbax: ``directory/state``
    (layer ``i``'s A and B) and ``directory/meta`` (config, path names). The directory
    must not exist."""
    import orbax.checkpoint as ocp

    name, adapter = get_adapter(model, name)
    keys = list(adapter.layers)
    state = {str(i): {"a": np.asarray(adapter.layers[k].a[...]),
                      "b": np.asarray(adapter.layers[k].b[...])} for i, k in enumerate(keys)}
    meta = {"name": name, "config": _config_json(adapter.config), "layers": keys}
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckpt:
        ckpt.save(os.path.abspath(directory), ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))


def load_adapter(model: LoRAModel, directory: str | os.PathLike, name: str | None = None,
                 *, activate: bool = True) -> str:
    """Adds the adapter :func:`save_adapter` wrote (as ``name``, default its saved name);
    returns the name."""
    import orbax.checkpoint as ocp

    path = os.path.abspath(directory)
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckpt:
        meta = ckpt.restore(path, ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        state = ckpt.restore(path, ocp.args.Composite(
            state=ocp.args.StandardRestore()))["state"]
    c = meta["config"]
    config = LoRAConfig(rank=c["rank"], alpha=c["alpha"], dropout=c["dropout"],
                        target_modules=tuple(c["target_modules"]), in_axes=c["in_axes"])
    weights = {k: (np.asarray(state[str(i)]["a"]), np.asarray(state[str(i)]["b"]))
               for i, k in enumerate(meta["layers"])}
    name = meta["name"] if name is None else name
    install_adapter(model, name, config, weights, activate)
    return name


def lora_param_count(model: LoRAModel, name: str | None = None) -> int:
    """Number of adapter parameters of ``name`` (default the active adapter)."""
    _, adapter = get_adapter(model, name)
    return sum(v.size for _, v in nnx.to_flat_state(nnx.state(adapter, LoRAParam)))

