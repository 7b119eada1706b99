"""Tests of lcjax.data: byte tokenizer, Shakespeare split by play, grain packing pipeline."""

import json

import numpy as np
import pytest

from lcjax import data
from lcjax.data import BOS, EOS, PAD


def _random_docs(n=7, seed=0, lo=1, hi=200):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, rng.integers(lo, hi), dtype=np.uint8).tobytes() for _ in range(n)]


def _stream(docs):
    parts = [[BOS, *np.frombuffer(d, np.uint8).tolist(), EOS] for d in docs]
    return np.array([t for p in parts for t in p], np.int64)


def _all_batches(ds):
    return list(data.make_iterator(ds))


# --- tokenizer ---------------------------------------------------------------


def test_tokenizer_round_trip_random_bytes():
    rng = np.random.default_rng(0)
    for n in (0, 1, 17, 1000):
        raw = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        ids = data.encode(raw, bos=True, eos=True)
        assert ids.dtype == np.int32 and ids.shape == (n + 2,)
        assert ids[0] == BOS and ids[-1] == EOS
        assert data.decode_bytes(ids) == raw
    text = "Ô Roméo, 你好 — to be or not"
    assert data.decode(data.encode(text)) == text
    assert data.VOCAB_SIZE == 259 and (BOS, EOS, PAD) == (256, 257, 258)
    with pytest.raises(ValueError, match="ids must lie"):
        data.decode([300])


# --- corpus ------------------------------------------------------------------


def test_shakespeare_corpus_and_work_ids():
    docs = data.load_shakespeare()
    assert len(docs) == 77 and len(data.shakespeare_works()) == 42
    by_name = {d.name: d for d in docs}
    assert by_name["hamlet_gut"].work == by_name["hamlet_gut_f"].work == "hamlet"
    assert by_name["hamlet_gut_f"].folio and not by_name["hamlet_gut"].folio
    assert by_name["twelfe-night_gut_f"].work == by_name["twelfth_night_gut"].work
    assert by_name["lear_gut"].title == "King Lear"
    works = {}
    for d in docs:
        works.setdefault(d.work, []).append(d)
    for group in works.values():  # one modern text per work, plus at most one Folio
        assert sorted(d.folio for d in group) in ([False], [False, True])
    assert sum(len(g) == 2 for g in works.values()) == 35
    assert data.decode(data.encode(by_name["sonnets_gut"].text)) == by_name["sonnets_gut"].text


def test_heldout_plays_never_in_train():
    for seed in range(5):
        train, held = data.shakespeare_split(heldout_fraction=0.1, seed=seed)
        assert len(train) + len(held) == 77
        train_works, held_works = {d.work for d in train}, {d.work for d in held}
        assert len(held_works) == round(0.1 * 42) and not train_works & held_works
        all_docs = data.load_shakespeare()
        for d in all_docs:  # both editions of a held-out play are held out
            assert (d in held) == (d.work in held_works)
    a = data.shakespeare_split(0.1, seed=0)[1]
    assert [d.name for d in a] == [d.name for d in data.shakespeare_split(0.1, seed=0)[1]]
    seeds = {tuple(d.work for d in data.shakespeare_split(0.25, seed=s)[1]) for s in range(4)}
    assert len(seeds) > 1
    assert data.shakespeare_split(0.0)[1] == []


# --- pipeline ----------------------------------------------------------------


@pytest.mark.parametrize("seq_len,batch", [(16, 3), (7, 1), (50, 4)])
def test_packing_preserves_token_stream(seq_len, batch):
    docs = _random_docs()
    ds = data.make_dataset(docs, seq_len=seq_len, batch_size=batch, shuffle=False, num_epochs=1,
                           drop_remainder=False, shard_index=0, shard_count=1)
    batches = _all_batches(ds)
    x = np.concatenate([b["inputs"] for b in batches])
    y = np.concatenate([b["targets"] for b in batches])
    assert x.shape[1] == y.shape[1] == seq_len and x.dtype == np.int32
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # targets are inputs shifted by one
    expected = _stream(docs)
    # inputs of consecutive windows, then the very last target, rebuild the stream
    rebuilt = np.r_[x.reshape(-1), y[-1, -1]]
    np.testing.assert_array_equal(y.reshape(-1), rebuilt[1:])
    np.testing.assert_array_equal(rebuilt[: len(expected)], expected)
    assert (rebuilt[len(expected):] == PAD).all() and len(rebuilt) - len(expected) < seq_len


def test_shuffle_is_seeded_and_a_permutation_per_epoch():
    docs = _random_docs(20, seed=1)
    kw = dict(seq_len=8, batch_size=1, shard_index=0, shard_count=1)
    n = data.num_windows(len(_stream(docs)), 8)

    def order(seed, k):
        it = data.make_iterator(data.make_dataset(docs, seed=seed, **kw))
        return [next(it)["inputs"][0].tobytes() for _ in range(k)]

    plain = _all_batches(data.make_dataset(docs, shuffle=False, num_epochs=1, **kw))
    plain = [b["inputs"][0].tobytes() for b in plain]
    assert len(plain) == n and len(set(plain)) == n
    a, b = order(0, 2 * n), order(1, 2 * n)
    assert a == order(0, 2 * n)
    assert a != b and a[:n] != plain
    for epoch in (a[:n], a[n:], b[:n]):  # each epoch sees every window once
        assert sorted(epoch) == sorted(plain)
    assert a[:n] != a[n:]  # reshuffled each epoch


def test_process_sharding_partitions_windows():
    docs = _random_docs(20, seed=2)
    kw = dict(seq_len=8, batch_size=3, num_epochs=1, drop_remainder=False, seed=5)
    full = _all_batches(data.make_dataset(docs, shard_index=0, shard_count=1, **kw))
    full = {r.tobytes() for b in full for r in b["inputs"]}
    shards = []
    for i in range(3):
        rows = _all_batches(data.make_dataset(docs, shard_index=i, shard_count=3, **kw))
        assert all(b["inputs"].shape[0] <= 1 for b in rows)  # global batch 3 over 3 processes
        shards.append({r.tobytes() for b in rows for r in b["inputs"]})
    assert sum(len(s) for s in shards) == len(full) and set.union(*shards) == full
    assert not (shards[0] & shards[1] or shards[0] & shards[2] or shards[1] & shards[2])
    with pytest.raises(ValueError, match="not divisible"):
        data.make_dataset(docs, seq_len=8, batch_size=4, shard_index=0, shard_count=3)


def test_iterator_state_restores_exact_sequence():
    docs = _random_docs(20, seed=3)
    ds = data.make_dataset(docs, seq_len=8, batch_size=2, seed=7, shard_index=0, shard_count=1)
    it = data.make_iterator(ds)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # JSON-serialisable
    expected = [next(it)["targets"] for _ in range(30)]  # crosses an epoch boundary
    it2 = data.make_iterator(ds, state)
    for e in expected:
        np.testing.assert_array_equal(next(it2)["targets"], e)
