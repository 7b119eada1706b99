"""Checkpoint interop: Hugging Face safetensors checkpoints (Llama, Qwen2, Qwen3) to and from
:class:`lcjax.nn.DecoderLM` (:mod:`lcjax.interop.hf`)."""

from lcjax.interop.hf import (
    ARCHITECTURES,
    decoder_to_hf_config,
    hf_tensor_paths,
    hf_to_decoder_config,
    load_hf,
    read_hf_config,
    read_qk_weights,
    save_hf,
)

__all__ = ["ARCHITECTURES", "decoder_to_hf_config", "hf_tensor_paths",
           "hf_to_decoder_config", "load_hf", "read_hf_config", "read_qk_weights", "save_hf"]
