"""Data: byte tokenizer, embedded corpora, grain pipelines."""

from lcjax.data.corpus import (
    Document,
    load_shakespeare,
    shakespeare_dir,
    shakespeare_split,
    shakespeare_works,
    split_works,
    work_id,
)
from lcjax.data.markov import MarkovSource, sample_chains
from lcjax.data.parallel import ParallelCorpus, load_debian_reference
from lcjax.data.pipeline import (
    gather_windows,
    make_dataset,
    make_iterator,
    num_windows,
    pack_stream,
)
from lcjax.data.synthetic import SyntheticSource
from lcjax.data.tablelong import TableLongSource  # also registers the "tablelong" suite
from lcjax.data.temporal_order import (  # also registers the "temporal_order" suite
    TemporalOrderSource,
    order_eval_items,
    order_item,
)
from lcjax.data.tfds import FeatureSource, tfds_source
from lcjax.data.tokenizer import BOS, EOS, PAD, VOCAB_SIZE, decode, decode_bytes, encode

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "VOCAB_SIZE",
    "Document",
    "FeatureSource",
    "ParallelCorpus",
    "MarkovSource",
    "SyntheticSource",
    "TableLongSource",
    "TemporalOrderSource",
    "decode",
    "decode_bytes",
    "encode",
    "gather_windows",
    "load_debian_reference",
    "load_shakespeare",
    "make_dataset",
    "make_iterator",
    "num_windows",
    "order_eval_items",
    "order_item",
    "pack_stream",
    "sample_chains",
    "shakespeare_dir",
    "shakespeare_split",
    "shakespeare_works",
    "split_works",
    "tfds_source",
    "work_id",
]
