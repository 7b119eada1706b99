"""LoRA adapters in PEFT's layout: ``adapter_model.safetensors`` with
``base_model.model.<hf module>.lora_A.weight`` [r, in] and ``lora_B.weight`` [out, r], and
``adapter_config.json``, the modules named as in :func:`lcjax.interop.hf.hf_tensor_paths`.
Our flattened [in, out] kernel is HF's ``weight.T`` for every projection, so ``A`` and ``B``
are PEFT's without conversion (adapters themselves: :mod:`lcjax.nn.lora`)."""

from __future__ import annotations

import json
import os
import re

import numpy as np

from lcjax.interop.hf import hf_tensor_paths
from lcjax.nn.lora import LoRAConfig, LoRAModel, get_adapter, install_adapter, path_name
from lcjax.optional import require

__all__ = ["PEFT_CONFIG", "PEFT_WEIGHTS", "load_peft", "save_peft"]

PEFT_WEIGHTS, PEFT_CONFIG = "adapter_model.safetensors", "adapter_config.json"
_PEFT_PREFIX = "base_model.model."


def _hf_modules(model: LoRAModel) -> dict[str, str]:
    """Our path name -> HF module name (``model.layers.0.self_attn.q_proj``)."""
    config = getattr(model.base, "config", None)
    if config is None:
        raise ValueError("LoRA: the PEFT layout needs a DecoderLM base (with a config)")
    return {path_name(p): t.removesuffix(".weight") for t, p in hf_tensor_paths(config).items()
            if t.endswith(".weight")}


def save_peft(model: LoRAModel, directory: str | os.PathLike, name: str | None = None, *,
              base_model_name_or_path: str | None = None) -> None:
    """Adapter ``name`` (default the active one) in PEFT's layout: ``adapter_model.safetensors``
    (float32 A, B under ``base_model.model.<hf module>.lora_{A,B}.weight``) and
    ``adapter_config.json`` (LORA, r, lora_alpha, lora_dropout, target_modules as HF
    module names).

    Raises:
      ValueError: a target without a Hugging Face name (e.g. a TRSP or ContextLM kernel).
    """
    with require("hf", "lcjax.interop.peft"):
        from safetensors.numpy import save_file

    name, adapter = get_adapter(model, name)
    hf = _hf_modules(model)
    tensors, leaves = {}, set()
    for key, layer in adapter.layers.items():
        if key not in hf:
            raise ValueError(f"LoRA: {key} has no Hugging Face name; the PEFT layout covers "
                             f"{sorted(set(hf))}")
        prefix = _PEFT_PREFIX + hf[key]
        tensors[prefix + ".lora_A.weight"] = np.asarray(layer.a[...], np.float32)
        tensors[prefix + ".lora_B.weight"] = np.asarray(layer.b[...], np.float32)
        leaves.add(hf[key].rsplit(".", 1)[-1])
    c = adapter.config
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": c.rank,
              "lora_alpha": c.alpha, "lora_dropout": c.dropout, "bias": "none",
              "target_modules": sorted(leaves), "fan_in_fan_out": False, "use_rslora": False,
              "use_dora": False, "init_lora_weights": True, "inference_mode": True,
              "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None,
              "base_model_name_or_path": base_model_name_or_path}
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, PEFT_WEIGHTS))
    with open(os.path.join(directory, PEFT_CONFIG), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)


def load_peft(model: LoRAModel, directory: str | os.PathLike, name: str = "default", *,
              activate: bool = True) -> str:
    """Adds the PEFT LoRA adapter in ``directory`` as ``name``; returns the name.

    Raises:
      ValueError: not a LoRA adapter, options we do not compute (use_rslora, use_dora,
        per-module rank/alpha patterns, fan_in_fan_out, biases), a tensor whose module is
        not in the model, or shapes that differ.
    """
    with require("hf", "lcjax.interop.peft"):
        from safetensors.numpy import load_file

    with open(os.path.join(directory, PEFT_CONFIG), encoding="utf-8") as f:
        cfg = json.load(f)
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"load_peft: peft_type {cfg.get('peft_type')!r} is not LORA")
    for key in ("use_rslora", "use_dora", "fan_in_fan_out", "rank_pattern", "alpha_pattern"):
        if cfg.get(key):
            raise ValueError(f"load_peft: {key}={cfg[key]!r} is not supported")
    if cfg.get("bias", "none") != "none":
        raise ValueError(f"load_peft: bias={cfg['bias']!r} is not supported ('none')")
    tensors = load_file(os.path.join(directory, PEFT_WEIGHTS))
    ours = {v: k for k, v in _hf_modules(model).items()}
    weights: dict[str, list] = {}
    for key, value in tensors.items():
        m = re.fullmatch(re.escape(_PEFT_PREFIX) + r"(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", key)
        if m is None or m.group(1) not in ours:
            raise ValueError(f"load_peft: tensor {key!r} names no linear layer of the model")
        weights.setdefault(ours[m.group(1)], [None, None])["AB".index(m.group(2))] = value
    incomplete = [k for k, (a, b) in weights.items() if a is None or b is None]
    if incomplete:
        raise ValueError(f"load_peft: {incomplete} lack lora_A or lora_B")
    config = LoRAConfig(rank=int(cfg["r"]), alpha=float(cfg["lora_alpha"]),
                        dropout=float(cfg.get("lora_dropout") or 0.0),
                        target_modules=tuple(f"re:{re.escape(k)}" for k in sorted(weights)))
    install_adapter(model, name, config, {k: tuple(v) for k, v in weights.items()}, activate)
    return name
