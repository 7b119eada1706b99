"""Byte-level tokenizer: ids 0..255 are the bytes of the UTF-8 text, then three specials.

    id  0..255  the byte itself
    id  256     BOS (begin of document)
    id  257     EOS (end of document)
    id  258     PAD (padding; never a training target)

There is nothing to download or fit, and ``decode(encode(b)) == b`` for every
byte string ``b``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

BOS = 256
EOS = 257
PAD = 258
VOCAB_SIZE = 259
SPECIALS = {"<bos>": BOS, "<eos>": EOS, "<pad>": PAD}


def encode(text: str | bytes, *, bos: bool = False, eos: bool = False) -> np.ndarray:
    """Encodes text (UTF-8 for ``str``) to token ids.

    Args:
      text: a ``str`` (encoded as UTF-8) or raw ``bytes``.
      bos, eos: prepend BOS / append EOS.

    Returns:
      int32 ids, shape ``[len(bytes) + bos + eos]``.
    """
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    body = np.frombuffer(data, dtype=np.uint8).astype(np.int32)
    parts = [np.array([BOS], np.int32)] * bos + [body] + [np.array([EOS], np.int32)] * eos
    return np.concatenate(parts) if len(parts) > 1 else body


def decode_bytes(ids: Iterable[int] | np.ndarray) -> bytes:
    """Bytes of the byte ids in ``ids`` (shape ``[L]``); BOS, EOS and PAD are dropped."""
    arr = np.asarray(ids).reshape(-1)
    if arr.size and (arr.min() < 0 or arr.max() >= VOCAB_SIZE):
        raise ValueError(f"ids must lie in [0, {VOCAB_SIZE}); got range [{arr.min()}, {arr.max()}]")
    return arr[arr < 256].astype(np.uint8).tobytes()


def decode(ids: Iterable[int] | np.ndarray, *, errors: str = "replace") -> str:
    """Text of ``ids`` (shape ``[L]``), UTF-8 decoded with ``errors``; specials dropped."""
    return decode_bytes(ids).decode("utf-8", errors=errors)
