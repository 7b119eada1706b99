"""What ``lcjax serve`` serves: a :class:`~lcjax.nn.DecoderLM`, its tokenizer and its chat
template, loaded from an ``lcjax train`` run folder or a Hugging Face checkpoint folder.

* Run folder (``DIR/config.json`` with a ``"model"`` section and ``DIR/checkpoints/``):
  :func:`lcjax.train.checkpoint.load_model`, the byte tokenizer (``lcjax.data.tokenizer``:
  a prompt is ``[BOS] + UTF-8 bytes``, EOS ends a reply, PAD pads) and
  :func:`render_byte_chat`.
* Hugging Face folder (``config.json`` + ``*.safetensors``, ``tokenizer.json``):
  :func:`lcjax.interop.hf.load_hf` (context: ``max_position_embeddings``), the
  ``tokenizers`` tokenizer, the stop ids of ``eos_token_id`` (``config.json`` and
  ``generation_config.json``) and ``tokenizer_config.json``'s ``eos_token``, and its
  ``chat_template`` (rendered in jinja2's sandbox, as ``transformers`` does) when it has one,
  else :func:`render_byte_chat`'s layout.

The byte chat template (documented in ``docs/serve.md``) is one line per message and an open
assistant turn::

    <bos>system: You are terse.\\nuser: Hi!\\nassistant:

Content is escaped (:func:`escape_chat_content`: ``\\`` → ``\\\\``, newline → ``\\n``,
carriage return → ``\\r``), so a message is always exactly one line and its content cannot
start a new turn. With a Hugging Face template, content holding one of the tokenizer's
special tokens (e.g. ``<|im_start|>``) is refused, for the same reason.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from lcjax.data.model_tokenizers import (  # noqa: F401  (re-exported)
    ROLES,
    ByteTokenizer,
    HFTokenizer,
    escape_chat_content,
    render_byte_chat,
)
from lcjax.data.model_tokenizers import read_json as _read_json
from lcjax.interop.hf import load_hf
from lcjax.train.checkpoint import load_model

__all__ = ["ByteTokenizer", "HFTokenizer", "ServedModel", "escape_chat_content",
           "load_served", "render_byte_chat"]

@dataclasses.dataclass
class ServedModel:
    """A model the server answers with.

    Attributes:
      model: the ``lcjax.nn.DecoderLM``.
      tokenizer: :class:`ByteTokenizer` or :class:`HFTokenizer` (``encode``, ``encode_chat``,
        ``decode``, ``eos_ids``, ``pad_id``).
      name: the ``model`` id clients send (``/v1/models`` lists it).
      max_len: the context: prompt tokens + ``max_tokens`` may not exceed it.
    """

    model: Any
    tokenizer: Any
    name: str
    max_len: int

    def __post_init__(self):
        vocab = self.model.config.vocab_size
        if self.tokenizer.vocab_size > vocab:
            raise ValueError(f"ServedModel: the tokenizer has {self.tokenizer.vocab_size} ids, "
                             f"more than the model's vocab_size={vocab}")
        if not isinstance(self.max_len, int) or self.max_len < 2:
            raise ValueError(f"ServedModel: `max_len` must be an int >= 2, got {self.max_len!r}")


def _is_run_dir(path: str) -> bool:
    return "model" in _read_json(os.path.join(path, "config.json")) and os.path.isdir(
        os.path.join(path, "checkpoints"))


def load_served(path: str | os.PathLike, *, name: str | None = None,
                max_len: int | None = None, dtype=None, attention: str | None = None,
                attention_options=None) -> ServedModel:
    """The :class:`ServedModel` of a run folder or a Hugging Face checkpoint folder.

    Args:
      path: ``lcjax train --out DIR`` or a folder with ``config.json``, ``*.safetensors``
        and ``tokenizer.json``.
      name: the served model id (default: the folder's name).
      max_len: the context (default: the run's ``max_len``, or the HF config's
        ``max_position_embeddings``).
      dtype: a Hugging Face checkpoint's compute dtype (default: the checkpoint's).
      attention, attention_options: the attention variant to serve with and its options
        (default: the run's, or softmax); generation prefills with it (a token-sparse
        prefill, see ``lcjax.nn.sampling.prefill``), the variant's own parameters are
        initialised on the checkpoint (``lcjax.nn.pretrained``).

    Raises:
      ValueError: the folder is neither kind, or lacks a piece.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise ValueError(f"load_served: {path!r} is not a folder")
    name = name or os.path.basename(os.path.normpath(os.path.abspath(path)))
    if _is_run_dir(path):
        model = load_model(path, attention=attention, attention_options=attention_options)
        return ServedModel(model, ByteTokenizer(), name, max_len or model.config.max_len)
    hf = _read_json(os.path.join(path, "config.json"))
    if "model" in hf:
        raise ValueError(f"load_served: {path!r} looks like an `lcjax train` run folder but has "
                         "no checkpoints/ folder")
    if not hf:
        raise ValueError(f"load_served: {path!r} has no config.json (expected an `lcjax train` "
                         "run folder or a Hugging Face checkpoint folder)")

    context = max_len or int(hf.get("max_position_embeddings", 2048))
    model, _ = load_hf(path, dtype=dtype, max_len=context, attention=attention,
                       attention_options=attention_options)
    return ServedModel(model, HFTokenizer(path), name, context)
