"""Data: byte tokenizer, embedded corpora, grain pipelines."""

from lcjax.lazy import lazy_exports

# public name -> the module that defines it, imported on first access (lcjax.lazy)
_EXPORTS = {
    "Document": "lcjax.data.corpus",
    "load_shakespeare": "lcjax.data.corpus",
    "shakespeare_dir": "lcjax.data.corpus",
    "shakespeare_split": "lcjax.data.corpus",
    "shakespeare_works": "lcjax.data.corpus",
    "split_works": "lcjax.data.corpus",
    "work_id": "lcjax.data.corpus",
    "MarkovSource": "lcjax.data.markov",
    "sample_chains": "lcjax.data.markov",
    "ParallelCorpus": "lcjax.data.parallel",
    "load_debian_reference": "lcjax.data.parallel",
    "gather_windows": "lcjax.data.pipeline",
    "make_dataset": "lcjax.data.pipeline",
    "make_iterator": "lcjax.data.pipeline",
    "num_windows": "lcjax.data.pipeline",
    "pack_stream": "lcjax.data.pipeline",
    "SyntheticSource": "lcjax.data.synthetic",
    "TableLongSource": "lcjax.data.tablelong",
    "TemporalOrderSource": "lcjax.data.temporal_order",
    "order_eval_items": "lcjax.data.temporal_order",
    "order_item": "lcjax.data.temporal_order",
    "FeatureSource": "lcjax.data.tfds",
    "tfds_source": "lcjax.data.tfds",
    "BOS": "lcjax.data.tokenizer",
    "EOS": "lcjax.data.tokenizer",
    "PAD": "lcjax.data.tokenizer",
    "VOCAB_SIZE": "lcjax.data.tokenizer",
    "decode": "lcjax.data.tokenizer",
    "decode_bytes": "lcjax.data.tokenizer",
    "encode": "lcjax.data.tokenizer",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
