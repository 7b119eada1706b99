"""grain pipeline: documents -> packed, shuffled, process-sharded batches of next-token pairs.

Packing: every document becomes ``BOS bytes... EOS``; the documents are
concatenated into one stream ``s`` (padded with PAD at the end) and cut into
windows of ``T + 1`` tokens with stride ``T``::

    window i = s[i*T : i*T + T + 1],  inputs = window[:-1],  targets = window[1:]

so every token after the first is a target exactly once and concatenating the
inputs of windows ``0, 1, ...`` gives back the stream. The windows get one seeded
global shuffle (grain reseeds it each epoch) and are cut into GLOBAL batches of
``batch_size`` rows; process ``p`` of ``n`` (``jax.process_index()``,
``jax.process_count()``) takes rows ``[p B/n, (p+1) B/n)`` of every global batch and
builds only those windows, so the batches a multi-process job assembles
(:func:`lcjax.parallel.distributed.global_batch`) are those of one process with the same
seed. The pipeline is a ``grain.MapDataset``
of window indices, so an iterator's state is one integer
(``it.get_state() == {"next_index": k}``) and ``it.set_state(state)`` resumes
the exact same batch sequence. Everything runs in-process (no grain workers).

With ``segments=True`` each window also carries ``segment_ids`` (the index of the
document each input token belongs to, -1 on PAD) and ``positions`` (the token's offset
in its document, BOS at 0): fed to ``lcjax.nn.DecoderLM``, attention stays inside a
document and RoPE positions restart with it, so a document's logits do not depend on
the documents packed before it (``TrainConfig(document_mask=True)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import grain
import jax
import numpy as np

from lcjax.data import tokenizer
from lcjax.data.corpus import Document

DocLike = str | bytes | np.ndarray | Document


def _doc_ids(doc: DocLike) -> np.ndarray:
    """Token ids ``[L]`` of one document, without BOS/EOS."""
    if isinstance(doc, Document):
        doc = doc.text
    if isinstance(doc, str | bytes):
        return tokenizer.encode(doc)
    return np.asarray(doc, dtype=np.int32).reshape(-1)


def pack_stream(docs: Sequence[DocLike], seq_len: int) -> np.ndarray:
    """The packed token stream ``BOS d0 EOS BOS d1 EOS ... PAD...``.

    Args:
      docs: documents (text, bytes, token ids ``[L]`` or :class:`Document`).
      seq_len: ``T``; the stream is padded with PAD to length ``n * T + 1``.

    Returns:
      uint16 stream, shape ``[num_windows(...) * T + 1]``.
    """
    return _pack(docs, seq_len)[0]


def _pack(docs: Sequence[DocLike], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(:func:`pack_stream`, int64 ``[num_docs]`` stream offsets of the documents' BOS)."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1; got {seq_len}")
    parts = []
    for doc in docs:
        parts += [np.array([tokenizer.BOS]), _doc_ids(doc), np.array([tokenizer.EOS])]
    lengths = np.array([len(p) for p in parts[1::3]], np.int64) + 2
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    stream = np.concatenate(parts).astype(np.uint16) if parts else np.zeros(0, np.uint16)
    n = num_windows(len(stream), seq_len)
    out = np.full(n * seq_len + 1, tokenizer.PAD, np.uint16)
    out[: len(stream)] = stream
    return out, starts[: len(lengths)]


def num_windows(stream_len: int, seq_len: int) -> int:
    """Windows of stride ``T`` needed to cover every target of a stream of ``stream_len``."""
    return max(0, -(-(stream_len - 1) // seq_len))


def gather_windows(
    stream: np.ndarray, idx: np.ndarray, seq_len: int, doc_starts: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Windows ``idx`` (``[B]``) of ``stream`` as ``{"inputs", "targets"}``, int32 ``[B, T]``.

    With ``doc_starts`` (the stream offsets of the documents' BOS, increasing) the windows
    also carry int32 ``segment_ids`` (document index, -1 on PAD inputs) and ``positions``
    (offset in the document; 0 on PAD).
    """
    offsets = np.asarray(idx)[:, None] * seq_len + np.arange(seq_len + 1)
    w = stream[offsets].astype(np.int32)
    out = {"inputs": w[:, :-1], "targets": w[:, 1:]}
    if doc_starts is not None:
        offsets, pad = offsets[:, :-1], out["inputs"] == tokenizer.PAD
        doc = np.searchsorted(doc_starts, offsets, side="right") - 1
        out["segment_ids"] = np.where(pad, -1, doc).astype(np.int32)
        out["positions"] = np.where(pad, 0, offsets - doc_starts[doc]).astype(np.int32)
    return out


def make_dataset(
    docs: Sequence[DocLike],
    *,
    seq_len: int,
    batch_size: int,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    drop_remainder: bool = True,
    shard_index: int | None = None,
    shard_count: int | None = None,
    segments: bool = False,
) -> grain.MapDataset:
    """Packed next-token batches of this process's shard, as a ``grain.MapDataset``.

    Args:
      docs: the documents to pack (see :func:`pack_stream`).
      seq_len: ``T``, the length of inputs and targets.
      batch_size: the GLOBAL batch size; each of ``shard_count`` processes gets
        ``batch_size // shard_count`` rows per batch: its block of rows of the global
        batch (the same global batches for every ``shard_count``). A last, smaller
        global batch (``drop_remainder=False``) gives each process its block of the rows
        there are (possibly none): multi-process training uses whole batches.
      seed: shuffle seed (grain reseeds each epoch deterministically from it).
      shuffle: global shuffle of the windows; False keeps stream order.
      num_epochs: passes over the data; None repeats forever.
      drop_remainder: drop a last, smaller batch (only matters for finite epochs).
      shard_index, shard_count: this process's block of rows; default
        ``jax.process_index()`` and ``jax.process_count()``.
      segments: also return ``segment_ids`` and ``positions`` (see :func:`gather_windows`).

    Returns:
      A ``MapDataset`` whose elements are ``{"inputs", "targets"}`` (and with ``segments``
      ``"segment_ids"``, ``"positions"``), int32 ``[batch_size // shard_count, T]``;
      targets equal to PAD are not real tokens.
    """
    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"need 0 <= shard_index < shard_count; got {shard_index}, {shard_count}")
    if batch_size % shard_count:
        raise ValueError(f"batch_size={batch_size} is not divisible by shard_count={shard_count}")
    stream, doc_starts = _pack(docs, seq_len)
    doc_starts = doc_starts if segments else None
    n = num_windows(len(stream), seq_len)
    ds = grain.MapDataset.range(n)
    if n < shard_count:
        raise ValueError(f"no windows for shard {shard_index}/{shard_count}: {n} windows in all")
    if shuffle:
        ds = ds.shuffle(seed=seed)
    if num_epochs != 1:
        ds = ds.repeat(num_epochs)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)  # the global batch
    rows = batch_size // shard_count
    lo = shard_index * rows
    # this process's block of rows of the global batch: only those windows are built
    return ds.map(lambda idx: gather_windows(stream, np.asarray(idx)[lo:lo + rows], seq_len,
                                             doc_starts))


def make_iterator(ds: grain.MapDataset, state: dict | None = None) -> grain.DatasetIterator:
    """In-process iterator over ``ds``; ``state`` from ``it.get_state()`` resumes it."""
    it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))
    if state is not None:
        it.set_state(state)
    return it
