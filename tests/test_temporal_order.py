"""lcjax.data.temporal_order: an independent solver answers every item; balance; determinism;
grain rows; the registered suite; ValueErrors."""

import collections

import numpy as np
import pytest

from lcjax.data.temporal_order import (
    TemporalOrderSource,
    make_book,
    order_eval_items,
    order_item,
)

KW = dict(num_passages=6, passage_bytes=40, snippet_bytes=12)


def _solve(prompt: bytes) -> bytes:
    """Answer from the prompt text alone: split off the book, read the two quotes, find
    each in the book and say which occurs earlier."""
    book, _, question = prompt.partition(b"\nQuestion:")
    a = question.split(b'A: "', 1)[1].split(b'"\nB: "', 1)[0]
    b = question.split(b'"\nB: "', 1)[1].rsplit(b'"\nAnswer: ', 1)[0]
    ia, ib = book.find(a), book.find(b)
    assert ia >= 0 and ib >= 0 and book.find(a, ia + 1) < 0 and book.find(b, ib + 1) < 0
    return b"A" if ia < ib else b"B"


@pytest.fixture(scope="module", params=["shakespeare", "random"])
def items(request):
    return [order_item(i, source=request.param, seed=5, **KW) for i in range(20)]


def test_independent_solver_answers_all(items):
    assert all(_solve(it.prompt) == it.answer for it in items)


def test_item_fields_agree_with_text(items):
    for it in items:
        lines = it.context.split(b"\n")[1:-1]  # the passages, in order
        assert len(lines) == 6 and len(set(lines)) == 6
        assert all(len(p) == 40 for p in lines)
        for snip, idx, off in zip(it.snippets, it.passages, it.snippet_offsets):
            assert snip in lines[idx] and len(snip) == 12
            assert it.prompt[off:off + 12] == snip
            start = it.passage_offsets[idx]
            assert start <= off < start + 40
        assert it.distance == abs(it.passages[0] - it.passages[1]) >= 1
        assert it.prompt.startswith(it.context)
        question = it.prompt.rindex(b"Question:")
        for snip, off, label in zip(it.snippets, it.quote_offsets, b"AB"):
            assert off > question and it.prompt[off:off + 12] == snip
            assert it.prompt[off - 4:off] == bytes([label]) + b': "'


def test_balance_of_answers_and_distances(items):
    # 20 items, 5 distances: each (distance, answer) pair exactly twice
    counts = collections.Counter((it.distance, it.answer) for it in items)
    assert set(counts) == {(d, a) for d in range(1, 6) for a in (b"A", b"B")}
    assert set(counts.values()) == {2}


def test_deterministic_per_seed():
    a = order_item(3, seed=1, source="random", **KW)
    assert a == order_item(3, seed=1, source="random", **KW)
    assert a.prompt != order_item(3, seed=2, source="random", **KW).prompt
    assert a.prompt != order_item(4, seed=1, source="random", **KW).prompt


def test_books_differ_by_source():
    rng = np.random.default_rng(0)
    shake = make_book(rng, "shakespeare", 4, 50)
    rand = make_book(rng, "random", 4, 50)
    # a Shakespeare book is one contiguous stretch of a text; random passages are not
    from lcjax.data.temporal_order import _shakespeare_texts
    assert any(b"".join(shake) in t for t in _shakespeare_texts())
    assert not any(b"".join(rand) in t for t in _shakespeare_texts())


def test_grain_rows_and_eval_items():
    src = TemporalOrderSource(8, source="random", seed=2, **KW)
    row = src[3]
    it = order_item(3, source="random", seed=2, **KW)
    t = len(it.prompt) + 1
    assert row["inputs"].shape == (src.seq_len,) and src.seq_len == t
    assert row["loss_mask"].sum() == 1 and row["label"] == it.label
    assert row["targets"][row["answer_start"]] == it.answer[0]
    assert bytes(row["inputs"][1:t].astype(np.uint8)) == it.prompt  # BOS first
    evs = order_eval_items(4, source="random", seed=2, **KW)
    assert [e.prompt for e in evs] == [order_item(i, source="random", seed=2, **KW).prompt
                                       for i in range(4)]
    assert evs[3].answer == it.answer and evs[3].task == "order_random"


def test_suite_items():
    from lcjax.data.items import build_items

    got = build_items("temporal_order", [500], n_per_cell=3, seed=0)
    assert {e.task for e in got} == {"order_shakespeare", "order_random"}
    for e in got:
        assert len(e.prompt) + len(e.answer) <= 500 and e.depth is None
        assert _solve(e.prompt) == e.answer
    again = build_items("temporal_order", [500], n_per_cell=3, seed=0)
    assert [e.prompt for e in again] == [e.prompt for e in got]


@pytest.mark.parametrize("kwargs, match", [
    (dict(source="poems"), "source"),
    (dict(num_passages=1), "num_passages"),
    (dict(snippet_bytes=41), "snippet_bytes"),
    (dict(distances=[6]), "distances"),
    (dict(index=-1), "index"),
])
def test_value_errors(kwargs, match):
    args = {**KW, **kwargs}
    index = args.pop("index", 0)
    with pytest.raises(ValueError, match=match):
        order_item(index, **args)


def test_source_value_errors():
    with pytest.raises(ValueError, match="num_records"):
        TemporalOrderSource(0, **KW)
    with pytest.raises(ValueError, match="seq_len"):
        TemporalOrderSource(2, seq_len=10, **KW)
    from lcjax.data.temporal_order import generate
    with pytest.raises(ValueError, match="fewer than 2"):
        generate("random", 0, 100)
