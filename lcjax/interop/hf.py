"""Hugging Face checkpoints (Llama, Mistral, Qwen2, Qwen3) <-> :class:`lcjax.nn.DecoderLM`.

A checkpoint directory holds ``config.json`` and either ``model.safetensors`` or shards
listed in ``model.safetensors.index.json`` (``{"weight_map": {tensor: file}}``). Reading
uses the ``safetensors`` package and numpy only (no torch, no transformers): the model is
built abstractly (``nnx.eval_shape``) and each tensor is read on its own from the
memory-mapped file, transposed and placed, so host memory stays about one checkpoint.

The four architectures are one pre-norm decoder (HF ``LlamaForCausalLM``,
``MistralForCausalLM`` (Llama without biases, with a sliding window), ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM``):

    h = embed_tokens[tokens]
    per layer:  a = RMSNorm_in(h);  q = a W_qᵀ (+ b_q),  k = a W_kᵀ (+ b_k),  v = a W_vᵀ (+ b_v)
                Qwen3: q, k <- RMSNorm over the head dim (q_norm, k_norm)
                q, k <- RoPE (half-rotation layout, θ_m = rope_theta^{-2m/d}, scaled)
                h <- h + softmax(q kᵀ/√d + causal) v W_oᵀ (+ b_o)
                h <- h + W_down (silu(W_gate RMSNorm_post(h)) * W_up RMSNorm_post(h))
    logits = RMSNorm(h) lm_headᵀ   (lm_head = embed_tokens when tie_word_embeddings)

Biases: Qwen2 has q, k, v biases (none on o_proj); Llama and Qwen3 have q, k, v and o
biases when ``attention_bias`` is true. HF stores a linear layer as [out, in]; ours are
[in, heads, head_dim] (q, k, v), [heads, head_dim, out] (o), [in, out] (MLP, lm_head).
HF's rotate_half pairs dims (m, m + d/2): our ``rope_layout="half"``, no permutation.

Config layouts: ``rope_theta`` + ``rope_scaling`` (transformers 4.x) and
``rope_parameters`` (``{"rope_type", "rope_theta", ...}``, transformers 5); the dtype in
``torch_dtype`` or ``dtype``. RoPE scaling types: default, "linear", "llama3"
(``lcjax.rope.scaled_inv_freq``); others (YaRN, dynamic, LongRoPE) and MLP biases raise
``ValueError``.

Sliding windows (``DecoderConfig.sliding_window``; a query sees itself and the W - 1 tokens
before it, transformers' ``sliding_window_overlay``): Mistral's ``sliding_window`` (int or
null) applies to every layer; Qwen2/Qwen3's ``sliding_window`` applies when
``use_sliding_window`` is true, to the layers ``layer_types`` marks "sliding_attention" or,
without ``layer_types``, to layers i >= ``max_window_layers`` (transformers' rule).

    model, config = load_hf("Llama-3.2-1B")             # bf16 stays bf16
    model, config = load_hf("Qwen3-0.6B", dtype=jnp.float32)
    save_hf(model, "out", like="Qwen3-0.6B")            # loads in transformers
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16" dtype, which safetensors asks for)
import numpy as np
from flax import nnx

from lcjax.data import tokenizer as byte_tok
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.nn.pretrained import init_variant_params
from lcjax.optional import require
from lcjax.rope import check_rope_scaling

__all__ = ["byte_tokenizer_files", "load_hf", "save_hf", "read_hf_config", "read_qk_weights",
           "hf_to_decoder_config",
           "decoder_to_hf_config", "hf_tensor_paths", "ARCHITECTURES"]

# HF architecture class -> model_type
ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                 "Qwen3ForCausalLM": "qwen3", "MistralForCausalLM": "mistral"}
_MODEL_TYPES = {v: k for k, v in ARCHITECTURES.items()}
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_INDEX = "model.safetensors.index.json"
_log = logging.getLogger(__name__)
_SINGLE = "model.safetensors"
# the most tensors' bytes in one shard file that save_hf writes (as save_pretrained's 5GB)
DEFAULT_SHARD_BYTES = 5 * 10**9


def _dtype_name(dtype) -> str:
    name = jnp.dtype(dtype).name
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {name}")
    return name


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """``config.json`` of checkpoint directory ``path`` as a dict."""
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise ValueError(f"load_hf: no config.json in {path!r}")
    with open(file) as f:
        return json.load(f)


def _model_type(hf: Mapping[str, Any]) -> str:
    kind = hf.get("model_type")
    if kind is None:
        archs = [a for a in hf.get("architectures") or () if a in ARCHITECTURES]
        kind = ARCHITECTURES[archs[0]] if archs else None
    if kind not in _MODEL_TYPES:
        raise ValueError(f"load_hf: model_type {hf.get('model_type')!r} / architectures "
                         f"{hf.get('architectures')!r} not supported; supported: "
                         f"{sorted(_MODEL_TYPES)}")
    return kind


def _rope(hf: Mapping[str, Any]) -> tuple[float, dict | None]:
    """(rope_theta, scaling or None) from either config layout."""
    params = hf.get("rope_parameters")
    if params is not None:
        if "rope_theta" not in params and all(isinstance(v, Mapping) for v in params.values()):
            raise ValueError(f"load_hf: per-layer-type rope_parameters {sorted(params)} are "
                             f"not supported (one RoPE for every layer expected)")
        theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = hf.get("rope_theta", 10000.0)
        scaling = hf.get("rope_scaling")
    if scaling is not None and scaling.get("attention_factor") not in (None, 1.0):
        raise ValueError(f"load_hf: RoPE attention_factor {scaling['attention_factor']} "
                         f"is not supported")
    try:
        scaling = check_rope_scaling(scaling)
    except ValueError as e:
        raise ValueError(f"load_hf: {e}") from None
    return float(theta), scaling


def _sliding_window(hf: Mapping[str, Any], kind: str) -> int | tuple[int | None, ...] | None:
    """``DecoderConfig.sliding_window`` of a config, by transformers' rules (module
    docstring): None, one W for every layer, or one entry per layer."""
    if kind == "llama":
        return None
    if kind == "mistral":
        window = hf.get("sliding_window", 4096)  # MistralConfig's default
    else:
        window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window") else None
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"load_hf: `sliding_window` must be a positive int or null, "
                         f"got {window!r}")
    if kind == "mistral":
        return window
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:
        first = int(hf.get("max_window_layers", 28))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if len(types) != n or unknown:
        raise ValueError(f"load_hf: `layer_types` must list 'sliding_attention' or "
                         f"'full_attention' for each of the {n} layers, got {types!r}")
    per_layer = tuple(window if t == "sliding_attention" else None for t in types)
    return per_layer if any(w is not None for w in per_layer) else None


def hf_to_decoder_config(hf: Mapping[str, Any], *, dtype=None, max_len: int = 8192,
                         **overrides) -> DecoderConfig:
    """The :class:`DecoderConfig` of a Llama / Qwen2 / Qwen3 ``config.json`` dict.

    ``dtype``: parameter and compute dtype (default the config's ``dtype`` /
    ``torch_dtype``, else float32). ``max_len`` (the default KV-cache length) is
    min(max_position_embeddings, ``max_len``). ``overrides`` replace DecoderConfig fields
    (e.g. ``attention="blockwise"``).
    """
    kind = _model_type(hf)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size"):
        if not isinstance(hf.get(key), int):
            raise ValueError(f"load_hf: config.json needs an int `{key}`, got {hf.get(key)!r}")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"load_hf: hidden_act {hf['hidden_act']!r} not supported ('silu')")
    if hf.get("mlp_bias"):
        raise ValueError("load_hf: mlp_bias=True is not supported")
    if float(hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"load_hf: partial_rotary_factor {hf['partial_rotary_factor']} "
                         f"is not supported")
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    theta, scaling = _rope(hf)
    if dtype is None:
        name = hf.get("dtype") or hf.get("torch_dtype") or "float32"
        dtype = _DTYPES.get(name, jnp.float32)
    _dtype_name(dtype)
    bias = bool(hf.get("attention_bias", False)) and kind != "mistral"  # Mistral: no biases
    fields = dict(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=head_dim,
        mlp_hidden=hf["intermediate_size"],
        max_len=min(int(hf.get("max_position_embeddings", max_len)), max_len),
        rope_base=theta, rope_layout="half", rope_scaling=scaling,
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=True if kind == "qwen2" else bias,
        attention_out_bias=False if kind == "qwen2" else bias,
        qk_norm=kind == "qwen3", dtype=dtype, param_dtype=dtype,
        sliding_window=_sliding_window(hf, kind))
    fields.update(overrides)
    return DecoderConfig(**fields)


def decoder_to_hf_config(config: DecoderConfig, *, like: Mapping[str, Any] | None = None,
                         dtype=None) -> dict[str, Any]:
    """A ``config.json`` dict for ``config`` (legacy layout: ``rope_theta`` +
    ``rope_scaling``, ``torch_dtype``, read by transformers 4 and 5). The architecture:
    Qwen3 if ``qk_norm``, Qwen2 if q/k/v biases without an output bias, else Llama (Mistral
    when every layer has the same sliding window). Sliding windows are written by
    transformers' rules (module docstring): one W for all windowed layers, Qwen's
    ``layer_types``; others raise ``ValueError``.
    ``like``: a source config whose other entries (token ids, max_position_embeddings,
    ...) are kept."""
    c = config
    if c.position != "rope" or c.rope_layout != "half":
        raise ValueError(f"save_hf: needs position='rope', rope_layout='half', got "
                         f"{c.position!r}, {c.rope_layout!r}")
    if c.qk_norm:
        kind = "qwen3"
    elif c.attention_bias and not c.attention_out_bias:
        kind = "qwen2"
    else:
        kind = "llama"
        if c.attention_bias != c.attention_out_bias:
            raise ValueError("save_hf: Llama has q, k, v and o biases together "
                             "(attention_bias) or none; got attention_bias="
                             f"{c.attention_bias}, attention_out_bias={c.attention_out_bias}")
    if kind == "qwen3" and c.attention_bias != c.attention_out_bias:
        raise ValueError("save_hf: Qwen3 has q, k, v and o biases together or none")
    windows = [c.layer_window(i) for i in range(c.num_layers)]
    sizes = sorted({w[0] + 1 for w in windows if w is not None})
    if len(sizes) > 1:
        raise ValueError(f"save_hf: HF configs hold one sliding_window for every windowed "
                         f"layer; got {sizes}")
    if sizes and kind == "llama":
        if None in windows:
            raise ValueError("save_hf: a Llama-shaped model with a sliding window in some "
                             "layers only has no HF architecture (Mistral windows all)")
        kind = "mistral"
    out = {k: v for k, v in (like or {}).items()
           if k not in ("rope_parameters", "dtype", "rope_scaling", "transformers_version",
                        "use_sliding_window", "sliding_window", "max_window_layers",
                        "layer_types")}
    scaling = None if c.rope_scaling is None else dict(c.rope_scaling)
    out.update(
        architectures=[_MODEL_TYPES[kind]], model_type=kind,
        vocab_size=c.vocab_size, hidden_size=c.d_model, num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, intermediate_size=c.mlp_hidden, hidden_act="silu",
        rms_norm_eps=c.norm_eps, rope_theta=c.rope_base, rope_scaling=scaling,
        tie_word_embeddings=c.tie_embeddings,
        torch_dtype=_dtype_name(c.param_dtype if dtype is None else dtype))
    out.setdefault("max_position_embeddings", c.max_len)
    if kind in ("qwen2", "mistral"):
        out.pop("attention_bias", None)  # Qwen2's q, k, v biases are not configurable
    else:
        out["attention_bias"] = c.attention_bias
    if kind == "mistral":
        out["sliding_window"] = sizes[0]
    if kind in ("qwen2", "qwen3"):
        out["use_sliding_window"] = bool(sizes)
        if sizes:  # layer_types rules; max_window_layers as consistent as it can be
            full = [i for i, w in enumerate(windows) if w is None]
            out.update(sliding_window=sizes[0], max_window_layers=full[-1] + 1 if full else 0,
                       layer_types=["full_attention" if w is None else "sliding_attention"
                                    for w in windows])
    return out


def _hf_names(c: DecoderConfig) -> dict[str, tuple]:
    """HF tensor name -> (our module path, how to convert) for config ``c``."""
    names = {"model.embed_tokens.weight": (("embed",), "same"),
             "model.norm.weight": (("final_norm", "scale"), "same")}
    if not c.tie_embeddings:
        names["lm_head.weight"] = (("lm_head",), "t")
    for i in range(c.num_layers):
        p, b = f"model.layers.{i}.", ("blocks", i)
        names[p + "input_layernorm.weight"] = ((*b, "attn_norm", "scale"), "same")
        names[p + "post_attention_layernorm.weight"] = ((*b, "mlp_norm", "scale"), "same")
        for n, heads in (("q", c.num_heads), ("k", c.num_kv_heads), ("v", c.num_kv_heads)):
            names[p + f"self_attn.{n}_proj.weight"] = ((*b, "attn", f"{n}_proj"), ("in", heads))
            if c.attention_bias:
                names[p + f"self_attn.{n}_proj.bias"] = ((*b, "attn", f"{n}_bias"), ("b", heads))
        names[p + "self_attn.o_proj.weight"] = ((*b, "attn", "o_proj"), ("out", c.num_heads))
        if c.attention_out_bias:
            names[p + "self_attn.o_proj.bias"] = ((*b, "attn", "o_bias"), "same")
        if c.qk_norm:
            names[p + "self_attn.q_norm.weight"] = ((*b, "attn", "q_norm", "scale"), "same")
            names[p + "self_attn.k_norm.weight"] = ((*b, "attn", "k_norm", "scale"), "same")
        names[p + "mlp.gate_proj.weight"] = ((*b, "mlp", "w_gate"), "t")
        names[p + "mlp.up_proj.weight"] = ((*b, "mlp", "w_up"), "t")
        names[p + "mlp.down_proj.weight"] = ((*b, "mlp", "w_down"), "t")
    return names


def hf_tensor_paths(config: DecoderConfig) -> dict[str, tuple]:
    """HF tensor name -> our parameter path in :class:`DecoderLM` (e.g.
    ``"model.layers.0.self_attn.q_proj.weight" -> ("blocks", 0, "attn", "q_proj")``), the
    naming :func:`load_hf` and :func:`save_hf` use (for adapters: ``lcjax.nn.lora``)."""
    return {name: where for name, (where, _) in _hf_names(config).items()}


def _to_ours(x: np.ndarray, how, d: int) -> np.ndarray:
    """HF array -> our layout (``d``: head_dim)."""
    if how == "same":
        return x
    if how == "t":
        return x.T
    kind, heads = how
    if kind == "in":      # [heads * d, d_model] -> [d_model, heads, d]
        return x.T.reshape(x.shape[1], heads, d)
    if kind == "b":       # [heads * d] -> [heads, d]
        return x.reshape(heads, d)
    return x.T.reshape(heads, d, x.shape[0])  # "out": [d_model, heads * d] -> [heads, d, d_model]


def _to_hf(x: np.ndarray, how) -> np.ndarray:
    """Our array -> the HF layout (inverse of :func:`_to_ours`)."""
    if how == "same":
        return x
    if how == "t":
        return x.T
    kind, _ = how
    if kind == "in":
        return x.reshape(x.shape[0], -1).T
    if kind == "b":
        return x.reshape(-1)
    return x.reshape(-1, x.shape[-1]).T


def weight_file_in(path: str, name: Any, index: str) -> str:
    """``path/name`` for a file ``name`` listed in ``index``'s ``weight_map``.

    Raises:
      ValueError: ``name`` is not a string, is an absolute path or one that resolves
        (``..``, symbolic links) outside the checkpoint folder ``path``, or is missing.
    """
    if not isinstance(name, str) or not name or os.path.isabs(name):
        raise ValueError(f"load_hf: {index} lists the weight file {name!r}: expected a "
                         "file name inside the checkpoint folder")
    root = os.path.realpath(path)
    full = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, full]) != root:
        raise ValueError(f"load_hf: {index} lists the weight file {name!r}, which is "
                         f"outside the checkpoint folder {path!r}")
    if not os.path.isfile(full):
        raise ValueError(f"load_hf: {index} lists the weight file {name!r}, which does not "
                         "exist")
    return os.path.join(path, name)


def _weight_files(path: str) -> dict[str, str]:
    """Tensor name -> file (absolute) of checkpoint ``path``."""
    with require("hf", "lcjax.interop.hf"):
        from safetensors import safe_open

    index = os.path.join(path, _INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, Mapping):
            raise ValueError(f"load_hf: {index} has no `weight_map`")
        return {k: weight_file_in(path, v, index) for k, v in weight_map.items()}
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"load_hf: no *.safetensors file (and no {_INDEX}) in {path!r}")
    out = {}
    for name in files:
        with safe_open(os.path.join(path, name), framework="numpy") as f:
            out.update({k: os.path.join(path, name) for k in f.keys()})
    return out


def _set(model: nnx.Module, where: tuple, value) -> None:
    node = model
    for key in where[:-1]:
        node = node[key] if isinstance(key, int) else getattr(node, key)
    var = getattr(node, where[-1])
    if tuple(var.shape) != tuple(value.shape):
        raise ValueError(f"load_hf: {'.'.join(map(str, where))} needs shape "
                         f"{tuple(var.shape)}, the checkpoint gives {tuple(value.shape)}")
    var.set_value(value)


def _get(model: nnx.Module, where: tuple):
    node = model
    for key in where:
        node = node[key] if isinstance(key, int) else getattr(node, key)
    return node[...]


def load_hf(path: str | os.PathLike, dtype=None, *, attention=None, attention_options=None,
            calibration=None, return_initialised: bool = False, **overrides):
    """Load a Llama / Qwen2 / Qwen3 checkpoint directory into a :class:`DecoderLM`.

    Args:
      path: directory with ``config.json`` and ``*.safetensors`` (sharded with
        ``model.safetensors.index.json`` or not).
      dtype: parameter and compute dtype; None keeps the checkpoint's (bf16 loads as bf16),
        e.g. ``jnp.float32`` casts on load.
      attention, attention_options: the attention variant (a registry name) and its
        options, as the DecoderConfig fields of the same names. A variant with parameters
        of its own (``"plash"``, ``"ssmax"``, ``"asentmax"``, ``"entmax"`` with
        ``attention_learn``) gets them from :func:`lcjax.nn.pretrained.init_variant_params`
        (PLASH prototypes by k-means of the checkpoint's keys on ``calibration``, the
        length-scaling scalars neutral where the method has a neutral value); each
        initialised parameter is logged (logger ``lcjax.interop.hf``, level INFO).
      calibration: int tokens [B, T] for a data-dependent init (PLASH); None: seeded
        random ids.
      return_initialised: also return ``{parameter path: how it was initialised}``.
      overrides: other DecoderConfig fields to replace (e.g. ``max_len=32768``,
        ``attention_learn=("alpha",)``).

    Returns:
      ``(model, config)``: the model (logits [B, T, V] float32 from int tokens [B, T]) and
      its :class:`DecoderConfig`; with ``return_initialised``, ``(model, config,
      initialised)``.
    """
    with require("hf", "lcjax.interop.hf"):
        from safetensors import safe_open

    path = os.fspath(path)
    hf = read_hf_config(path)
    files = _weight_files(path)
    if dtype is None and not (hf.get("dtype") or hf.get("torch_dtype")):
        with safe_open(next(iter(files.values())), framework="numpy") as f:
            first = f.keys()[0]
            dtype = f.get_slice(first).get_dtype()
        dtype = {"BF16": jnp.bfloat16, "F16": jnp.float16}.get(dtype, jnp.float32)
    if attention is not None:
        overrides["attention"] = attention
    if attention_options is not None:
        overrides["attention_options"] = dict(attention_options)
    config = hf_to_decoder_config(hf, dtype=dtype, **overrides)
    names = _hf_names(config)
    missing = sorted(set(names) - set(files))
    if missing:
        raise ValueError(f"load_hf: the checkpoint lacks {len(missing)} tensors the "
                         f"{_model_type(hf)} config needs, e.g. {missing[:3]}")
    extra = sorted(k for k in set(files) - set(names)
                   if not k.endswith("rotary_emb.inv_freq")
                   and not (k == "lm_head.weight" and config.tie_embeddings))
    if extra:
        raise ValueError(f"load_hf: {len(extra)} checkpoint tensors have no place in the "
                         f"model, e.g. {extra[:3]}")
    model = nnx.eval_shape(lambda: DecoderLM(config, rngs=nnx.Rngs(0)))
    by_file: dict[str, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    for file, tensors in by_file.items():
        with safe_open(file, framework="numpy") as f:
            for name in tensors:
                where, how = names[name]
                x = _to_ours(f.get_tensor(name), how, config.head_dim)
                _set(model, where, jnp.asarray(x, config.param_dtype))
                del x
    initialised = init_variant_params(model, calibration=calibration)
    for name, how in initialised.items():
        _log.info("load_hf: initialised %s: %s", name, how)
    abstract = [jax.tree_util.keystr(p) for p, x in
                jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]
                if isinstance(x, jax.ShapeDtypeStruct)]
    if abstract:
        raise ValueError(f"load_hf: {len(abstract)} model parameters have no checkpoint "
                         f"tensor and no initialisation, e.g. {abstract[:3]}")
    return (model, config, initialised) if return_initialised else (model, config)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the ``ByteLevel`` pre-tokenizer's alphabet):
    printable Latin-1 bytes map to themselves, the others to chr(256 + n)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return {b: chr(b) if b in keep else chr(next(extra)) for b in range(256)}


def byte_tokenizer_files(max_len: int) -> dict[str, dict]:
    """``tokenizer.json`` and ``tokenizer_config.json`` of lcjax's byte tokenizer
    (``lcjax.data.tokenizer``) as a ``tokenizers`` model: ids 0..255 are the UTF-8 bytes
    (a ``ByteLevel`` pre-tokenizer without regex splitting or prefix space, a BPE without
    merges over its 256-character alphabet), then ``<bos>`` 256, ``<eos>`` 257, ``<pad>`` 258
    as special tokens; encoding prepends ``<bos>`` (as ``lcjax serve`` does) and decoding
    maps the bytes back. ``tokenizer_config.json`` names the special tokens for
    ``transformers`` (``PreTrainedTokenizerFast``) and marks the tokenizer
    (``"lcjax_tokenizer": "bytes"``)."""
    with require("hf", "lcjax.interop.hf"):
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    specials = sorted(byte_tok.SPECIALS.items(), key=lambda kv: kv[1])
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False)
                            for name, _ in specials])
    got = {name: tok.token_to_id(name) for name, _ in specials}
    if got != dict(specials):
        raise AssertionError(f"byte tokenizer: special ids {got}, want {dict(specials)}")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", byte_tok.BOS)])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>",
              "eos_token": "<eos>", "pad_token": "<pad>", "model_max_length": max_len,
              "clean_up_tokenization_spaces": False, "lcjax_tokenizer": "bytes"}
    return {"tokenizer.json": json.loads(tok.to_str()), "tokenizer_config.json": config}


def _write_json(path: str, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)


def save_hf(model: DecoderLM, path: str | os.PathLike, *, like: str | os.PathLike | None = None,
            dtype=None, max_shard_bytes: int = DEFAULT_SHARD_BYTES,
            tokenizer: str | None = "auto") -> list[str]:
    """Write ``model`` as a Hugging Face checkpoint directory that ``transformers`` (and
    :func:`load_hf`) loads: ``config.json`` and ``model.safetensors``, or shards of at most
    ``max_shard_bytes`` with ``model.safetensors.index.json``.

    ``like``: the source checkpoint directory; its config entries that are not the
    architecture's (token ids, max_position_embeddings, ...) are kept and its other files
    (tokenizer, generation config) copied. ``dtype``: storage dtype (default the params').
    ``tokenizer``: ``"bytes"`` writes lcjax's byte tokenizer (:func:`byte_tokenizer_files`)
    with ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` in ``config.json`` and a
    ``generation_config.json`` (it needs ``vocab_size >= 259``); ``"auto"`` (default) does
    that without ``like`` (a model trained by lcjax on bytes) and otherwise keeps the
    source's tokenizer — for a model without ``like`` whose vocabulary is too small for the
    byte tokenizer it writes none and warns; None writes none. Returns the written weight
    files.

    Raises:
      ValueError: ``tokenizer="bytes"`` with ``like`` or a vocabulary without the byte
        tokenizer's ids; an unknown ``tokenizer``.
    """
    write_bytes = _writes_byte_tokenizer(model, like, tokenizer)
    c = model.config
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    source = read_hf_config(like) if like is not None else None
    hf = decoder_to_hf_config(c, like=source, dtype=dtype)
    token_ids = _byte_token_ids()
    if write_bytes:
        hf.update(token_ids)
    store = jnp.dtype(_DTYPES[hf["torch_dtype"]])
    names = _hf_names(c)
    sizes = {n: int(np.prod(_get_shape(model, w))) * store.itemsize for n, (w, _) in names.items()}
    shards = _plan_shards(sizes, max_shard_bytes)
    for old in os.listdir(path):  # stale weights of an earlier save would mix in
        if old.endswith(".safetensors") or old == _INDEX:
            os.remove(os.path.join(path, old))
    n = len(shards)
    files = [_SINGLE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors"
                                      for i in range(n)]
    _write_shards(model, path, names, store, files, shards)
    if n > 1:
        index = {"metadata": {"total_size": sum(sizes.values())},
                 "weight_map": {name: file for file, shard in zip(files, shards)
                                for name in shard}}
        with open(os.path.join(path, _INDEX), "w") as f:
            json.dump(index, f, indent=2)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    if write_bytes:
        for name, value in byte_tokenizer_files(c.max_len).items():
            _write_json(os.path.join(path, name), value)
        _write_json(os.path.join(path, "generation_config.json"), token_ids)
    if like is not None and os.path.abspath(like) != os.path.abspath(path):
        _copy_source_files(like, path)
    return [os.path.join(path, f) for f in files]


def _byte_token_ids() -> dict[str, int]:
    """``config.json``'s bos/eos/pad token ids of lcjax's byte tokenizer."""
    return {"bos_token_id": byte_tok.BOS, "eos_token_id": byte_tok.EOS,
            "pad_token_id": byte_tok.PAD}


def _writes_byte_tokenizer(model: DecoderLM, like: Any, tokenizer: str | None) -> bool:
    """Whether :func:`save_hf` writes the byte tokenizer (its ``tokenizer`` argument);
    warns when ``"auto"`` writes none for a vocabulary too small for it."""
    if tokenizer not in ("auto", "bytes", None):
        raise ValueError(f"save_hf: `tokenizer` must be 'auto', 'bytes' or None, got "
                         f"{tokenizer!r}")
    small = model.config.vocab_size < byte_tok.VOCAB_SIZE
    if tokenizer == "auto" and like is None and small:
        warnings.warn(f"save_hf: no tokenizer written: vocab_size {model.config.vocab_size} "
                      f"< {byte_tok.VOCAB_SIZE} has no room for the byte tokenizer's ids",
                      stacklevel=3)
    write_bytes = tokenizer == "bytes" or (tokenizer == "auto" and like is None and not small)
    if tokenizer == "bytes" and like is not None:
        raise ValueError("save_hf: tokenizer='bytes' with `like` (whose tokenizer is copied)")
    if write_bytes and small:
        raise ValueError(f"save_hf: the byte tokenizer needs vocab_size >= "
                         f"{byte_tok.VOCAB_SIZE} (bytes and <bos>/<eos>/<pad>), the model has "
                         f"{model.config.vocab_size}; pass tokenizer=None to write none")
    return write_bytes


def _plan_shards(sizes: Mapping[str, int], max_shard_bytes: int) -> list[list[str]]:
    """The tensor names (in order) per shard: a new shard starts where the next tensor
    would take a non-empty one past ``max_shard_bytes``."""
    shards: list[list[str]] = [[]]
    used = 0
    for name in sizes:
        if shards[-1] and used + sizes[name] > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += sizes[name]
    return shards


def _write_shards(model: DecoderLM, path: str, names: Mapping, store: np.dtype,
                  files: list[str], shards: list[list[str]]) -> None:
    """Writes each shard's tensors (HF layout, dtype ``store``) to its safetensors file."""
    with require("hf", "lcjax.interop.hf"):
        from safetensors.numpy import save_file

    for file, shard in zip(files, shards):
        arrays = {}
        for name in shard:
            where, how = names[name]
            x = np.asarray(_get(model, where)).astype(store)
            arrays[name] = np.ascontiguousarray(_to_hf(x, how))
        save_file(arrays, os.path.join(path, file), metadata={"format": "pt"})
        del arrays


def _copy_source_files(like: str | os.PathLike, path: str) -> None:
    """Copies ``like``'s files other than weights, index and config (tokenizer,
    generation config) into ``path``."""
    for entry in os.listdir(like):
        src = os.path.join(like, entry)
        if (os.path.isfile(src) and not entry.endswith(".safetensors")
                and entry not in ("config.json", _INDEX)):
            shutil.copy2(src, os.path.join(path, entry))


def _get_shape(model, where) -> tuple:
    node = model
    for key in where:
        node = node[key] if isinstance(key, int) else getattr(node, key)
    return tuple(node.shape)



def read_qk_weights(path: str | os.PathLike) -> tuple[DecoderConfig, list[np.ndarray],
                                                      list[np.ndarray]]:
    """Only W_Q and W_K of checkpoint ``path``, for static head analysis (``lcjax.analysis.
    lps``) without building the model: ``(config, wq, wk)`` with one float32 array per layer,
    wq [D_model, H, d], wk [D_model, H_kv, d] (our layout)."""
    with require("hf", "lcjax.interop.hf"):
        from safetensors import safe_open

    path = os.fspath(path)
    config = hf_to_decoder_config(read_hf_config(path), dtype=jnp.float32)
    files = _weight_files(path)
    wq, wk = [], []
    for i in range(config.num_layers):
        pair = []
        for n, heads in (("q", config.num_heads), ("k", config.num_kv_heads)):
            name = f"model.layers.{i}.self_attn.{n}_proj.weight"
            if name not in files:
                raise ValueError(f"read_qk_weights: the checkpoint lacks {name}")
            with safe_open(files[name], framework="numpy") as f:
                x = f.get_tensor(name).astype(np.float32)
            pair.append(_to_ours(x, ("in", heads), config.head_dim))
        wq.append(pair[0])
        wk.append(pair[1])
    return config, wq, wk
