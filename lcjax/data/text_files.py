"""Training documents from the user's own files (``lcjax train --data FILE|DIR``).

A ``.jsonl`` file holds one JSON object a line with a ``"text"`` string: one document per
line. Any other file is plain text: one document, its bytes as they are (the byte tokenizer
needs no decoding). A folder: every file below it (sorted, hidden files skipped), each
read by those rules.
"""

from __future__ import annotations

import json
import os

__all__ = ["read_documents"]


def _jsonl(path: str) -> list[str]:
    docs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{n}: need an object with a \"text\" string")
            docs.append(record["text"])
    return docs


def _files(folder: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")]
    return out


def read_documents(path: str | os.PathLike) -> list[str | bytes]:
    """The documents of a file or folder (module docstring): ``str`` from JSONL, ``bytes``
    from plain text.

    Raises:
      FileNotFoundError: ``path`` does not exist.
      ValueError: a malformed JSONL line (file and line number), or no document at all.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file or folder: {path!r}")
    files = _files(path) if os.path.isdir(path) else [path]
    docs: list[str | bytes] = []
    for name in files:
        if name.endswith(".jsonl"):
            docs += _jsonl(name)
        else:
            with open(name, "rb") as f:
                docs.append(f.read())
    if not any(len(d) for d in docs):
        raise ValueError(f"{path!r} holds no text")
    return docs
