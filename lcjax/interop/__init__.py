"""Checkpoint interop: Hugging Face safetensors checkpoints (Llama, Qwen2, Qwen3) to and from
:class:`lcjax.nn.DecoderLM` (:mod:`lcjax.interop.hf`)."""

from lcjax.lazy import lazy_exports

# public name -> the module that defines it, imported on first access (lcjax.lazy)
_EXPORTS = {
    "ARCHITECTURES": "lcjax.interop.hf",
    "decoder_to_hf_config": "lcjax.interop.hf",
    "hf_tensor_paths": "lcjax.interop.hf",
    "hf_to_decoder_config": "lcjax.interop.hf",
    "load_hf": "lcjax.interop.hf",
    "read_hf_config": "lcjax.interop.hf",
    "read_qk_weights": "lcjax.interop.hf",
    "save_hf": "lcjax.interop.hf",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
