"""Temporal-order memory items: "which of these two passages came first?" with the book in context.

The episodic-memory probe of long-context models (the ICML 2026 temporal-order memory
paper: a book in context; a model is asked which of two quoted passages came first; accuracy
grows with the distance between them — the distance effect —, the passage index is linearly
decodable from hidden states,
and one "time-reinstatement" head carries the answer). We build the items here.

A *book* is ``num_passages`` distinct passages of ``passage_bytes`` bytes each, one per line:

* ``"shakespeare"``: consecutive stretches of one Shakespeare text (``lcjax.data.corpus``;
  whitespace collapsed to single spaces, ASCII), starting at a random offset of a random
  document — real narrative, so content may hint at the order;
* ``"random"``: the synthetic control, passages of words drawn i.i.d. and uniformly from the
  corpus vocabulary — no narrative, so only the positions in context tell the order.

An item takes two passages i < j at distance ``d = j - i``, quotes a ``snippet_bytes``
substring of each (each occurring exactly once in the book), puts them in random order as
``A`` and ``B`` and asks which came first; the answer is ``b"A"`` or ``b"B"``::

    Text:
    <passage 0>
    <passage 1>
    ...
    Question: which of these two passages comes first in the text?
    A: "<snippet of one passage>"
    B: "<snippet of the other>"
    Answer: A

Item ``index`` is drawn from ``np.random.default_rng([seed, crc32(source), index])``, its
distance is ``distances[index % len(distances)]`` and its answer ``"AB"[(index //
len(distances)) % 2]``: any ``2 * len(distances)`` consecutive items are exactly balanced in
answers and distances. Uses:

    item = order_item(7, source="random", num_passages=8, passage_bytes=48, snippet_bytes=16)
    src = TemporalOrderSource(10_000, source="shakespeare", num_passages=16)   # grain rows
    items = order_eval_items(64, source="shakespeare", num_passages=16)        # EvalItem list
    build_items("temporal_order", lengths=[1024], n_per_cell=8)   # the registered suite

The suite ``"temporal_order"`` (tasks ``order_shakespeare``, ``order_random``) makes them
usable by ``lcjax.eval.evaluate``; there ``length`` (bytes of prompt + answer) sets the number
of passages, and distance and answer are drawn at random per item.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import zlib
from collections.abc import Sequence

import numpy as np

from lcjax.data.corpus import load_shakespeare
from lcjax.data.items import EvalItem
from lcjax.data.ruler import Sample, make_batch
from lcjax.data.suites import Suite, SuiteTask

__all__ = ["SOURCES", "OrderItem", "TemporalOrderSource", "make_book", "order_item",
           "order_eval_items", "make_order_item", "generate", "suite", "QUESTION"]

SOURCES = ("shakespeare", "random")
HEADER = b"Text:\n"
QUESTION = b"\nQuestion: which of these two passages comes first in the text?\n"
ANSWER_CUE = b"Answer: "
_MAX_TRIES = 64


@dataclasses.dataclass(frozen=True)
class OrderItem:
    """One temporal-order question.

    Attributes:
      prompt: ``context + question + A/B quotes + "Answer: "`` (bytes).
      answer: ``b"A"`` or ``b"B"``, the label of the snippet whose passage came first.
      context: the book block ``"Text:\\n" + passages joined by "\\n" + "\\n"`` (a prefix of
        ``prompt``).
      snippets: (snippet A, snippet B), each occurring exactly once in ``context``.
      passages: (passage index of A, passage index of B), 0-based in book order.
      distance: ``|passages[0] - passages[1]|`` >= 1.
      passage_offsets: byte offset in ``prompt`` of each passage's first byte.
      snippet_offsets: byte offset in ``prompt`` of each snippet's occurrence in the book.
      passage_bytes: bytes per passage; source: ``"shakespeare"`` or ``"random"``.
    """

    prompt: bytes
    answer: bytes
    context: bytes
    snippets: tuple[bytes, bytes]
    passages: tuple[int, int]
    distance: int
    passage_offsets: tuple[int, ...]
    snippet_offsets: tuple[int, int]
    passage_bytes: int
    source: str

    @property
    def label(self) -> int:
        """0 when A came first, 1 when B did."""
        return 0 if self.answer == b"A" else 1

    @property
    def quote_offsets(self) -> tuple[int, int]:
        """Byte offset in ``prompt`` of snippet A and of snippet B as quoted in the question
        (``snippet_offsets`` are their occurrences in the book)."""
        a = len(self.context) + len(QUESTION) + len(b'A: "')
        return a, a + len(self.snippets[0]) + len(b'"\nB: "')

    def as_sample(self) -> Sample:
        """The item as a :class:`lcjax.data.ruler.Sample` (needles = the two snippets at
        their places in the book), for ``make_batch``, suites and the evaluator."""
        n = len(self.context)
        return Sample(
            prompt=self.prompt, answer=self.answer, references=(self.answer,),
            task=f"order_{self.source}", length=len(self.prompt) + len(self.answer),
            haystack_bytes=n, depths=tuple(o / n for o in self.snippet_offsets),
            offsets=self.snippet_offsets, needles=self.snippets, num_targets=2,
            info={"distance": self.distance, "passages": self.passages,
                  "passage_offsets": self.passage_offsets, "source": self.source},
            question=self.prompt[n:])


# --- books ----------------------------------------------------------------------------------


@functools.cache
def _shakespeare_texts() -> tuple[bytes, ...]:
    """Every Shakespeare document, whitespace collapsed, as ASCII bytes."""
    return tuple(re.sub(r"\s+", " ", d.text).encode("ascii", "ignore")
                 for d in load_shakespeare())


@functools.cache
def _vocabulary() -> tuple[bytes, ...]:
    """Sorted distinct lowercase alphabetic words (2-10 letters) of the Shakespeare corpus."""
    words = set()
    for text in _shakespeare_texts():
        words.update(re.findall(rb"[a-z]{2,10}", text.lower()))
    return tuple(sorted(words))


def _random_passage(rng: np.random.Generator, nbytes: int) -> bytes:
    vocab = _vocabulary()
    out = b""
    while len(out) < nbytes:
        out += b" ".join(vocab[k] for k in rng.integers(0, len(vocab), nbytes // 3 + 1)) + b" "
    return out[:nbytes]


def make_book(rng: np.random.Generator, source: str, num_passages: int,
              passage_bytes: int) -> list[bytes]:
    """``num_passages`` distinct passages of exactly ``passage_bytes`` bytes (no newline):
    consecutive stretches of a random Shakespeare text, or i.i.d. random-word passages."""
    _check_book(source, num_passages, passage_bytes)
    for _ in range(_MAX_TRIES):
        if source == "random":
            book = [_random_passage(rng, passage_bytes) for _ in range(num_passages)]
        else:
            texts = [t for t in _shakespeare_texts() if len(t) > num_passages * passage_bytes]
            if not texts:
                raise ValueError(f"make_book: no Shakespeare text has {num_passages} x "
                                 f"{passage_bytes} bytes")
            text = texts[int(rng.integers(len(texts)))]
            start = int(rng.integers(0, len(text) - num_passages * passage_bytes + 1))
            book = [text[start + k * passage_bytes:start + (k + 1) * passage_bytes]
                    for k in range(num_passages)]
        if len(set(book)) == num_passages:
            return book
    raise ValueError(f"make_book: could not draw {num_passages} distinct passages")


def _check_book(source, num_passages, passage_bytes):
    if source not in SOURCES:
        raise ValueError(f"temporal_order: `source` must be one of {SOURCES}, got {source!r}")
    if not isinstance(num_passages, int | np.integer) or num_passages < 2:
        raise ValueError(f"temporal_order: `num_passages` must be an int >= 2, "
                         f"got {num_passages!r}")
    if not isinstance(passage_bytes, int | np.integer) or passage_bytes < 4:
        raise ValueError(f"temporal_order: `passage_bytes` must be an int >= 4, "
                         f"got {passage_bytes!r}")


# --- items ----------------------------------------------------------------------------------


def _unique_snippet(rng, book_bytes: bytes, passage_start: int, passage: bytes,
                    snippet_bytes: int) -> tuple[bytes, int] | None:
    """A substring of ``passage`` occurring once in ``book_bytes`` (and its offset there)."""
    for _ in range(_MAX_TRIES):
        k = int(rng.integers(0, len(passage) - snippet_bytes + 1))
        snippet = passage[k:k + snippet_bytes]
        first = book_bytes.find(snippet)
        if first == passage_start + k and book_bytes.find(snippet, first + 1) < 0:
            return snippet, first
    return None


def make_order_item(rng: np.random.Generator, *, source: str = "shakespeare",
                    num_passages: int = 8, passage_bytes: int = 64, snippet_bytes: int = 24,
                    distance: int | None = None, first: str | None = None) -> OrderItem:
    """One item from ``rng``: a fresh book, passages ``i`` and ``i + distance`` (``i``
    uniform; ``distance`` uniform in ``[1, num_passages)`` when None), quoted in the order
    that makes ``first`` (``"A"``/``"B"``; random when None) the answer."""
    _check_book(source, num_passages, passage_bytes)
    if not isinstance(snippet_bytes, int | np.integer) or not 1 <= snippet_bytes <= passage_bytes:
        raise ValueError(f"temporal_order: `snippet_bytes` must be an int in "
                         f"[1, passage_bytes={passage_bytes}], got {snippet_bytes!r}")
    if distance is None:
        distance = int(rng.integers(1, num_passages))
    if not isinstance(distance, int | np.integer) or not 1 <= distance < num_passages:
        raise ValueError(f"temporal_order: `distance` must be an int in [1, {num_passages}), "
                         f"got {distance!r}")
    if first is None:
        first = "AB"[int(rng.integers(2))]
    if first not in ("A", "B"):
        raise ValueError(f"temporal_order: `first` must be 'A' or 'B', got {first!r}")
    for _ in range(_MAX_TRIES):
        book = make_book(rng, source, num_passages, passage_bytes)
        context = HEADER + b"".join(p + b"\n" for p in book)
        starts = [len(HEADER) + k * (passage_bytes + 1) for k in range(num_passages)]
        i = int(rng.integers(0, num_passages - distance))
        j = i + int(distance)
        early = _unique_snippet(rng, context, starts[i], book[i], snippet_bytes)
        late = _unique_snippet(rng, context, starts[j], book[j], snippet_bytes)
        if early is not None and late is not None:
            break
    else:
        raise ValueError(f"temporal_order: no snippets of {snippet_bytes} bytes occur once in "
                         f"the book; use longer snippets")
    (a, a_off, a_idx), (b, b_off, b_idx) = ((*early, i), (*late, j)) if first == "A" else (
        (*late, j), (*early, i))
    prompt = (context + QUESTION + b'A: "' + a + b'"\nB: "' + b + b'"\n' + ANSWER_CUE)
    return OrderItem(prompt=prompt, answer=first.encode(), context=context, snippets=(a, b),
                     passages=(a_idx, b_idx), distance=int(distance),
                     passage_offsets=tuple(starts), snippet_offsets=(a_off, b_off),
                     passage_bytes=int(passage_bytes), source=source)


def _distances(distances, num_passages) -> tuple[int, ...]:
    out = tuple(range(1, num_passages)) if distances is None else tuple(int(d) for d in distances)
    if not out or any(not 1 <= d < num_passages for d in out):
        raise ValueError(f"temporal_order: `distances` must be a non-empty list of ints in "
                         f"[1, {num_passages}), got {distances!r}")
    return out


def order_item(index: int, *, seed: int = 0, source: str = "shakespeare", num_passages: int = 8,
               passage_bytes: int = 64, snippet_bytes: int = 24,
               distances: Sequence[int] | None = None) -> OrderItem:
    """Item ``index`` of the balanced sequence (module docstring): distance
    ``distances[index % n]`` (default ``1 .. num_passages - 1``), answer
    ``"AB"[(index // n) % 2]``, drawn from ``default_rng([seed, crc32(source), index])``."""
    if not isinstance(index, int | np.integer) or index < 0:
        raise ValueError(f"temporal_order: `index` must be an int >= 0, got {index!r}")
    _check_book(source, num_passages, passage_bytes)
    ds = _distances(distances, num_passages)
    rng = np.random.default_rng([int(seed), zlib.crc32(source.encode()), int(index)])
    return make_order_item(rng, source=source, num_passages=num_passages,
                           passage_bytes=passage_bytes, snippet_bytes=snippet_bytes,
                           distance=ds[index % len(ds)], first="AB"[(index // len(ds)) % 2])


def order_eval_items(n: int, *, seed: int = 0, source: str = "shakespeare", **kwargs) -> list:
    """Items ``0 .. n-1`` of :func:`order_item` as :class:`lcjax.data.items.EvalItem`
    (task ``"order_<source>"``, depth None, ``sample`` the :class:`Sample`)."""
    if not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"order_eval_items: `n` must be an int >= 1, got {n!r}")
    out = []
    for i in range(n):
        s = order_item(i, seed=seed, source=source, **kwargs).as_sample()
        out.append(EvalItem(s.task, s.length, None, i, s.prompt, s.answer, s.references, s))
    return out


class TemporalOrderSource:
    """grain ``RandomAccessDataSource``: record ``i`` is :func:`order_item` ``(i, ...)`` as the
    byte row of :func:`lcjax.data.ruler.make_batch` (``inputs``, ``targets``, ``loss_mask``
    on the answer byte, ``answer_start``, ``answer_len``, all ``seq_len`` wide) plus
    ``distance`` and ``label`` (0 = A first) as int32 scalars."""

    def __init__(self, num_records: int, *, seed: int = 0, source: str = "shakespeare",
                 num_passages: int = 8, passage_bytes: int = 64, snippet_bytes: int = 24,
                 distances: Sequence[int] | None = None, seq_len: int | None = None,
                 eos: bool = False):
        if not isinstance(num_records, int | np.integer) or num_records < 1:
            raise ValueError(f"TemporalOrderSource: `num_records` must be >= 1, "
                             f"got {num_records!r}")
        self.kwargs = dict(seed=seed, source=source, num_passages=num_passages,
                           passage_bytes=passage_bytes, snippet_bytes=snippet_bytes,
                           distances=distances)
        self.num_records, self.eos = int(num_records), eos
        probe = order_item(0, **self.kwargs)  # ValueErrors now; every row has this length
        need = len(probe.prompt) + len(probe.answer) + eos
        self.seq_len = need if seq_len is None else int(seq_len)
        if self.seq_len < need:
            raise ValueError(f"TemporalOrderSource: rows need seq_len >= {need}, got {seq_len}")

    def __len__(self) -> int:
        return self.num_records

    def item(self, index: int) -> OrderItem:
        if not 0 <= int(index) < self.num_records:
            raise IndexError(f"TemporalOrderSource: index {index} out of range "
                             f"[0, {self.num_records})")
        return order_item(int(index), **self.kwargs)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        it = self.item(index)
        row = {k: v[0] for k, v in make_batch([it.as_sample()], self.seq_len,
                                              eos=self.eos).items()}
        row["distance"] = np.int32(it.distance)
        row["label"] = np.int32(it.label)
        return row

    def __repr__(self) -> str:
        return f"TemporalOrderSource({self.num_records}, {self.kwargs})"


# --- the evaluation suite --------------------------------------------------------------------


def generate(task: str, seed, length: int, *, tokenizer=None, passage_bytes: int = 64,
             snippet_bytes: int = 24, distance: int | None = None,
             first: str | None = None) -> Sample:
    """Suite generator: task ``"shakespeare"`` or ``"random"``; ``seed`` an int or a numpy
    Generator; ``length`` bytes of prompt + answer (at most), which sets the number of
    passages; distance and answer random unless given. Lengths count bytes only."""
    if tokenizer is not None:
        raise ValueError("temporal_order.generate: lengths count bytes; pass no tokenizer")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    fixed = len(HEADER) + len(QUESTION) + 2 * (snippet_bytes + 6) + len(ANSWER_CUE) + 1
    num_passages = (int(length) - fixed) // (passage_bytes + 1)
    if num_passages < 2:
        raise ValueError(f"temporal_order.generate: length {length} holds fewer than 2 "
                         f"passages of {passage_bytes} bytes (need >= "
                         f"{fixed + 2 * (passage_bytes + 1)})")
    return make_order_item(rng, source=task, num_passages=num_passages,
                           passage_bytes=passage_bytes, snippet_bytes=snippet_bytes,
                           distance=distance, first=first).as_sample()


SUITE = (SuiteTask("order_shakespeare", "shakespeare", uses_depth=False),
         SuiteTask("order_random", "random", uses_depth=False))


def suite() -> Suite:
    """The ``"temporal_order"`` suite over :func:`generate`."""
    return Suite("temporal_order", generate, SUITE)
