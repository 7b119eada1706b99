"""The tokenizers a model is served and evaluated with: the byte tokenizer
(:class:`ByteTokenizer`, ``[BOS] + bytes``) of ``lcjax train`` runs and a Hugging Face
checkpoint's ``tokenizer.json`` (:class:`HFTokenizer`, the ``tokenizers`` package, with
its stop ids and chat template). Both have ``encode(text) -> ids`` (special tokens
included), ``encode_chat``, ``decode(ids) -> text``, ``eos_ids``, ``pad_id``,
``vocab_size``. :func:`load_tokenizer` picks the one of a folder."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from lcjax.data import tokenizer as byte_tok
from lcjax.data.suites import load_tokenizer_file
from lcjax.optional import require

__all__ = ["ByteTokenizer", "HFTokenizer", "escape_chat_content", "load_tokenizer",
           "read_json", "render_byte_chat"]

ROLES = ("system", "user", "assistant", "tool", "developer")


_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r"})


def escape_chat_content(text: str) -> str:
    """``text`` on one line: backslash, newline and carriage return written as ``\\\\``,
    ``\\n`` and ``\\r`` (reversible, and no line break is left to start a forged turn)."""
    return text.translate(_ESCAPES)


def render_byte_chat(messages: Sequence[dict]) -> str:
    """The byte models' chat prompt: ``"{role}: {escaped content}\\n"`` per message, then
    ``"assistant:"`` (the BOS comes from the tokenizer); :func:`escape_chat_content`."""
    return "".join(f"{m['role']}: {escape_chat_content(m['content'])}\n"
                   for m in messages) + "assistant:"


class ByteTokenizer:
    """The byte tokenizer as the server uses it: ``[BOS] + bytes`` in, bytes < 256 out."""

    eos_ids = (byte_tok.EOS,)
    pad_id = byte_tok.PAD
    vocab_size = byte_tok.VOCAB_SIZE
    has_chat_template = False

    def encode(self, text: str) -> np.ndarray:
        """int32 [1 + len(UTF-8 bytes)]: BOS then the bytes."""
        return byte_tok.encode(text, bos=True)

    def encode_chat(self, messages: Sequence[dict]) -> np.ndarray:
        """The ids of :func:`render_byte_chat` (with BOS)."""
        return self.encode(render_byte_chat(messages))

    def decode(self, ids) -> str:
        """UTF-8 text of the byte ids (specials and ids >= 256 dropped)."""
        ids = np.asarray(ids).reshape(-1)
        return byte_tok.decode(ids[ids < 256])


def read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def _token_text(value) -> str | None:
    """``tokenizer_config.json`` writes special tokens as a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class HFTokenizer:
    """A Hugging Face checkpoint's ``tokenizer.json`` (the ``tokenizers`` package), its stop
    ids and chat template."""

    def __init__(self, path: str | os.PathLike):
        path = os.fspath(path)
        file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise ValueError(f"HFTokenizer: {path!r} has no tokenizer.json")
        self.tokenizer = load_tokenizer_file(file)  # names the file if it does not load
        self.vocab_size = self.tokenizer.get_vocab_size()
        cfg = read_json(os.path.join(path, "tokenizer_config.json"))
        model_cfg = read_json(os.path.join(path, "config.json"))
        gen_cfg = read_json(os.path.join(path, "generation_config.json"))
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        eos = _ids(model_cfg.get("eos_token_id")) + _ids(gen_cfg.get("eos_token_id"))
        if self.eos_token is not None and self.tokenizer.token_to_id(self.eos_token) is not None:
            eos.append(self.tokenizer.token_to_id(self.eos_token))
        self.eos_ids = tuple(dict.fromkeys(eos))
        pad = _ids(model_cfg.get("pad_token_id")) or list(self.eos_ids[:1]) or [0]
        self.pad_id = pad[0]
        template = cfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default", next(iter(named.values()), None))
        self.chat_template = template
        self.has_chat_template = bool(template)

    def encode(self, text: str) -> np.ndarray:
        """int32 ids of ``text`` with the tokenizer's special tokens (e.g. a BOS)."""
        return np.asarray(self.tokenizer.encode(text).ids, np.int32)

    def render_chat(self, messages: Sequence[dict]) -> str:
        """The chat template rendered with ``add_generation_prompt=True`` (jinja2 sandbox)."""
        with require("hf", "lcjax.data.model_tokenizers (chat templates)"):
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=list(messages), add_generation_prompt=True,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def special_tokens(self) -> list[str]:
        """The text of every special added token (e.g. ``<|im_start|>``, ``</s>``)."""
        return [t.content for t in self.tokenizer.get_added_tokens_decoder().values()
                if t.special]

    def encode_chat(self, messages: Sequence[dict]) -> np.ndarray:
        """Ids of the rendered chat template (its own special tokens, none added), or of
        :func:`render_byte_chat`'s layout when the checkpoint has no template.

        Raises:
          ValueError: a message's content holds a special token's text (it would be
            tokenized as that token, e.g. a forged turn boundary).
        """
        specials = self.special_tokens()
        for i, m in enumerate(messages):
            found = [t for t in specials if t and t in (m.get("content") or "")]
            if found:
                raise ValueError(f"message {i}'s content holds the special token "
                                 f"{found[0]!r}; content may not contain special tokens")
        if not self.has_chat_template:
            return self.encode(render_byte_chat(messages))
        text = self.render_chat(messages)
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

    def decode(self, ids) -> str:
        """Text of ``ids`` without special tokens."""
        return self.tokenizer.decode([int(i) for i in np.asarray(ids).reshape(-1)],
                                     skip_special_tokens=True)


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer of a model folder: :class:`HFTokenizer` when it has a
    ``tokenizer.json``, else :class:`ByteTokenizer` (``lcjax train`` runs)."""
    path = os.fspath(path)
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        return HFTokenizer(path)
    return ByteTokenizer()
