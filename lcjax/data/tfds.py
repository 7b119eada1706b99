"""TensorFlow Datasets corpora as grain sources: ArrayRecord files, no TensorFlow.

``tfds.data_source`` reads a dataset prepared in the ArrayRecord file format with random
access and without importing TensorFlow; :func:`tfds_source` wraps it so that each element
is one feature of a record (a book's text, say), which is what ``lcjax.data.make_dataset``
and ``lcjax.train.train(train_docs=...)`` take as documents, and what
``grain.MapDataset.source(...)`` takes as a source. This is how a PG-19-style corpus is fed
on a pod: prepare it once where TensorFlow is installed, e.g.
``tfds build pg19 --file_format=array_record --data_dir=gs://BUCKET/tfds``, then on every
host::

    train_docs = tfds_source("pg19", "train", data_dir="gs://BUCKET/tfds",
                             feature="book_text")
    eval_docs = tfds_source("pg19", "validation", data_dir="gs://BUCKET/tfds",
                            feature="book_text")
    train(model_cfg, cfg, train_docs=train_docs, eval_docs=eval_docs)

Nothing is downloaded at run time (``download=False``): a dataset missing from
``data_dir`` is an error. ``make_dataset`` already splits windows across processes, so
pass the whole split here, not ``tfds.split_for_jax_process(...)``.

tensorflow-datasets is the optional ``tfds`` extra (``pip install 'lcjax[tfds]'``); this
module imports without it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = ["FeatureSource", "tfds_source"]

EXTRA_HINT = "pip install 'lcjax[tfds]'  (or: pip install tensorflow-datasets)"


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError(
            f"lcjax.data.tfds_source needs tensorflow-datasets, the optional 'tfds' extra: "
            f"{EXTRA_HINT}"
        ) from e
    return tfds


class FeatureSource:
    """A random-access source whose elements are one feature of ``source``'s records.

    ``source`` is any grain ``RandomAccessDataSource`` (``__len__``, ``__getitem__``)
    of mappings, e.g. what ``tfds.data_source`` returns; ``feature=None`` keeps whole
    records. Elements are returned as stored (tfds ``Text`` features are ``bytes``,
    sequences are numpy arrays). Itself a grain source and a sequence of documents.
    """

    def __init__(self, source: Sequence[Mapping[str, Any]], feature: str | None = "text",
                 features: Sequence[str] | None = None):
        if features is not None and feature is not None and feature not in features:
            raise ValueError(f"`feature` must be one of the dataset's features "
                             f"{sorted(features)}, got {feature!r}")
        self.source, self.feature = source, feature

    def _pick(self, record):
        if self.feature is None:
            return record
        try:
            return record[self.feature]
        except KeyError:
            raise ValueError(f"`feature` {self.feature!r} is not in the record's keys "
                             f"{sorted(record)}") from None

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        n = len(self)
        i = index.__index__()
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for a source of {n} records")
        return self._pick(self.source[i % n])

    def __getitems__(self, indices: Sequence[int]) -> list:
        getitems = getattr(self.source, "__getitems__", None)
        if getitems is None:
            return [self[i] for i in indices]
        return [self._pick(r) for r in getitems(list(indices))]

    def __iter__(self) -> Iterator:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        return f"FeatureSource({self.source!r}, feature={self.feature!r})"


def tfds_source(
    name: str,
    split: str,
    *,
    data_dir: str | None = None,
    feature: str | None = "text",
    decoders: Any = None,
    builder_kwargs: dict | None = None,
    download: bool = False,
) -> FeatureSource:
    """A prepared TFDS dataset split as a grain source of documents (no TensorFlow).

    Args:
      name: the TFDS name, optionally with config and version (``"pg19"``,
        ``"wiki40b/en:1.3.0"``).
      split: a TFDS split, slices included (``"train"``, ``"validation[:10%]"``).
      data_dir: where the dataset was prepared (a local path or ``gs://...``); default
        TFDS's own (``~/tensorflow_datasets`` or ``$TFDS_DATA_DIR``).
      feature: the record field to return (``"book_text"`` for PG-19); None returns whole
        records (dicts).
      decoders, builder_kwargs: passed to ``tfds.data_source``.
      download: let TFDS download and prepare a missing dataset (off: no downloads at
        run time).

    Returns:
      A :class:`FeatureSource`: ``len`` records, ``src[i]`` the feature of record i.

    Raises:
      ImportError: tensorflow-datasets is not installed (the ``tfds`` extra).
      ValueError: ``name``/``split`` not strings, or ``feature`` not in the dataset.
    """
    for arg, value in (("name", name), ("split", split)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"tfds_source: `{arg}` must be a non-empty string, got {value!r}")
    tfds = _import_tfds()
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=download,
                              decoders=decoders, builder_kwargs=builder_kwargs)
    info = getattr(source, "dataset_info", None)
    features = getattr(info, "features", None)
    keys = list(features.keys()) if hasattr(features, "keys") else None
    return FeatureSource(source, feature, features=keys)
