"""lcjax.data.tfds_source: TFDS ArrayRecord datasets as grain sources of documents.

The real test builds a tiny dataset offline with a ``tfds.core.GeneratorBasedBuilder``
(file_format="array_record") and skips when tensorflow-datasets is not installed; the
adapter itself is also tested on a stand-in with the same interface (grain's
ArrayRecordDataSource over records this test writes), which always runs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import grain
import numpy as np
import pytest

from lcjax.data import FeatureSource, make_dataset, pack_stream, tfds_source

TEXTS = [f"book {i}: " + "lorem ipsum " * (3 + 2 * i) for i in range(7)]


class _JsonRecords:
    """Stand-in for ``tfds.data_source``: ArrayRecord files of JSON-encoded dicts."""

    def __init__(self, path):
        self.records = grain.sources.ArrayRecordDataSource([str(path)])

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        return json.loads(self.records[i])


@pytest.fixture
def standin(tmp_path):
    from array_record.python.array_record_module import ArrayRecordWriter

    path = tmp_path / "docs.array_record"
    writer = ArrayRecordWriter(str(path), "group_size:1")
    for i, text in enumerate(TEXTS):
        writer.write(json.dumps({"id": i, "text": text}).encode())
    writer.close()
    return _JsonRecords(path)


def test_feature_source_on_a_standin(standin):
    src = FeatureSource(standin, "text")
    assert len(src) == len(TEXTS)
    assert [src[i] for i in range(len(src))] == TEXTS
    assert list(src) == TEXTS and src[-1] == TEXTS[-1]
    assert src.__getitems__([3, 1]) == [TEXTS[3], TEXTS[1]]
    assert FeatureSource(standin, None)[2] == {"id": 2, "text": TEXTS[2]}
    with pytest.raises(IndexError):
        src[len(TEXTS)]
    with pytest.raises(ValueError, match="'book_text' is not in the record's keys"):
        FeatureSource(standin, "book_text")[0]
    with pytest.raises(ValueError, match=r"one of the dataset's features \['id', 'text'\]"):
        FeatureSource(standin, "book_text", features=["text", "id"])
    # a grain source, and documents for the training pipeline
    assert grain.MapDataset.source(src)[4] == TEXTS[4]
    np.testing.assert_array_equal(pack_stream(src, 16), pack_stream(TEXTS, 16))


def test_module_imports_without_tfds_and_names_the_extra():
    code = ("import sys; sys.modules['tensorflow_datasets'] = None\n"
            "from lcjax.data import tfds_source\n"
            "try:\n    tfds_source('pg19', 'train')\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'tfds' extra" in out.stdout and "lcjax[tfds]" in out.stdout


def test_bad_arguments():
    with pytest.raises(ValueError, match="`split` must be a non-empty string"):
        tfds_source("pg19", None)
    with pytest.raises(ValueError, match="`name` must be a non-empty string"):
        tfds_source("", "train")


# ----------------------------------------------------------------------------
# The real thing: a dataset tfds prepares offline, read without TensorFlow
# ----------------------------------------------------------------------------
BUILD_AND_READ = r"""
import json, sys
import numpy as np
import tensorflow_datasets as tfds
from lcjax.data import make_dataset, pack_stream, tfds_source

texts = json.loads(sys.argv[2])

class TinyBooks(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"book_text": tfds.features.Text(), "id": np.int64}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(texts[:5]),
                "validation": self._generate_examples(texts[5:])}

    def _generate_examples(self, docs):
        for i, text in enumerate(docs):
            yield i, {"book_text": text, "id": i}

TinyBooks(data_dir=sys.argv[1], file_format="array_record").download_and_prepare()
train = tfds_source("tiny_books", "train", data_dir=sys.argv[1], feature="book_text")
val = tfds_source("tiny_books", "validation", data_dir=sys.argv[1], feature="book_text")
whole = tfds_source("tiny_books", "train[:2]", data_dir=sys.argv[1], feature=None)
order = [bytes(d).decode() for d in train]
assert np.array_equal(pack_stream(train, 16), pack_stream(order, 16))
batch = next(iter(make_dataset(train, seq_len=16, batch_size=2, shuffle=False)))
errors = {}
for what, call in (("feature", lambda: tfds_source("tiny_books", "train",
                                                    data_dir=sys.argv[1], feature="text")),
                   ("missing", lambda: tfds_source("no_such_books", "train",
                                                    data_dir=sys.argv[1]))):
    try:
        call()
    except Exception as e:
        errors[what] = f"{type(e).__name__}: {e}"
print(json.dumps({
    "train": order, "val": [bytes(d).decode() for d in val],
    "whole": [sorted(r) for r in whole], "len_whole": len(whole),
    "batch_shape": list(batch["inputs"].shape), "first_window": batch["inputs"][0].tolist(),
    "stream_start": pack_stream(train, 16)[:16].tolist(),
    "errors": errors, "tensorflow_imported": "tensorflow" in sys.modules,
}))
"""


@pytest.mark.slow
def test_tfds_source_reads_a_prepared_dataset_without_tensorflow(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    # a subprocess: tfds registers builder classes globally, and we check sys.modules
    proc = subprocess.run([sys.executable, "-c", BUILD_AND_READ, str(tmp_path / "tfds"),
                           json.dumps(TEXTS)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(got["train"]) == sorted(TEXTS[:5])  # tfds shuffles records when writing
    assert sorted(got["val"]) == sorted(TEXTS[5:])
    assert got["len_whole"] == 2 and got["whole"] == [["book_text", "id"]] * 2
    assert got["batch_shape"] == [2, 16] and got["first_window"] == got["stream_start"]
    assert "ValueError" in got["errors"]["feature"] and "['book_text', 'id']" in (
        got["errors"]["feature"])
    assert "no_such_books" in got["errors"]["missing"]
    assert not got["tensorflow_imported"]


def test_make_dataset_batches_from_a_feature_source(standin):
    ds = make_dataset(FeatureSource(standin, "text"), seq_len=8, batch_size=2, shuffle=False,
                      num_epochs=1)
    ref = make_dataset(TEXTS, seq_len=8, batch_size=2, shuffle=False, num_epochs=1)
    for a, b in zip(ds, ref, strict=True):
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
        np.testing.assert_array_equal(a["targets"], b["targets"])
