"""Synthetic length-extrapolation tasks of ASEntmax, as byte text of any length.

Our own code after the task definitions of ASEntmax (Vasylenko, Pitorro, Martins, Treviso,
"Long-Context Generalization with Sparse Attention", ICLR 2026; deep-spin/asentmax,
``scripts/generate_data.py``), written for lcjax's byte models: every item is printable
ASCII text of exactly ``length`` bytes (= tokens), so the same generator gives the
training rows at L and the test rows at 2×, 4×, ... 16× L.

* **Multi-query multi-token associative recall** (:func:`mqmtar`). The context holds
  ``n`` key-value pairs ``kk:vv`` (keys and values of ``key_len`` / ``value_len`` letters
  of ``alphabet``, keys distinct, values distinct) separated by runs of spaces at random
  places; then a newline and ``num_queries`` queries ``?kk:vv`` for distinct context keys.
  The answers are the value bytes of the queries (each query's key is given, its value
  must be recalled)::

      " ab:xq   cd:rt  ef:zz ... \\n?cd:rt?ab:xq"      answers: "rt", "xq"

  ``n = floor(kv_fraction * C / (key_len + value_len + 2))`` with ``C`` the context bytes
  (at most the number of distinct keys), so the number of distractor pairs grows with the
  length as in ASEntmax (``num_kv`` there is the same fraction of the sequence). ASEntmax
  asks all queries first and answers them after; here each query is answered right after
  its key (the multi-query recall layout of Zoology's MQAR), so every answer is one
  induction-style lookup and a small causal model can learn it.
* **Flip-flop** (:func:`flip_flop`): ``length // 2`` instruction-bit pairs, ``w`` (write,
  probability ``write_prob``) or ``i`` (ignore) followed by a random bit, the first a
  write and the last ``r`` (read); the answer is the bit of the last write::

      "w1i0i1w0i1i1r0"                                 answer: "0"

  An odd length starts with one space.
* **Copy** (:func:`copy`): ``n`` random letters, ``=``, the same letters again; the answer is
  the copy (an even length starts with one space).

Each generator takes a seed (int or ``np.random.Generator``), is deterministic under it and
returns a :class:`lcjax.data.ruler.Sample`: ``prompt`` is the text up to the first answer
byte, ``answer`` the rest, ``references`` the individual answers, ``info["spans"]`` the
``(start, end)`` byte ranges of the answers in ``prompt + answer`` (for MQMTAR the answer
part also holds the later queries' keys, which are given, not predicted), ``depths`` /
``offsets`` / ``needles`` the context items the answers come from. :func:`make_batch`
turns samples into the byte-token rows of :func:`lcjax.data.ruler.make_batch` (``inputs``,
``targets``, ``loss_mask``, ``answer_start``, ``answer_len``) with ``loss_mask`` True
exactly on the answer bytes; :class:`SyntheticSource` is the grain ``RandomAccessDataSource``
of training rows, record ``i`` from seed ``(seed, i)`` as in :class:`lcjax.data.sources.TaskSource`.
Scoring is :func:`lcjax.data.ruler.answer_accuracy` (teacher-forced argmax = greedy answer).
"""

from __future__ import annotations

import dataclasses
import itertools
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from lcjax.data import ruler
from lcjax.data.ruler import Sample

__all__ = ["GENERATORS", "SyntheticSource", "answer_positions", "copy", "flip_flop",
           "generate", "make_batch", "mqmtar", "min_length"]

LETTERS = string.ascii_lowercase


def _rng(seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _check_int(name: str, value, lo: int, fn: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < lo:
        raise ValueError(f"{fn}: `{name}` must be an int >= {lo}, got {value!r}")
    return int(value)


def _check_alphabet(alphabet: str, fn: str, reserved: str) -> str:
    if len(set(alphabet)) != len(alphabet) or len(alphabet) < 2:
        raise ValueError(f"{fn}: `alphabet` must hold >= 2 distinct characters, got {alphabet!r}")
    if not all(c.isascii() and c.isprintable() for c in alphabet) or set(alphabet) & set(reserved):
        raise ValueError(f"{fn}: `alphabet` must be printable ASCII without {reserved!r}, "
                         f"got {alphabet!r}")
    return alphabet


def _sample(text: str, spans: Sequence[tuple[int, int]], task: str, *, needles=(), offsets=(),
            depths=(), haystack_bytes: int = 0, info: Mapping[str, Any] | None = None) -> Sample:
    data = text.encode("ascii")
    first = spans[0][0]
    refs = tuple(data[a:b] for a, b in spans)
    return Sample(prompt=data[:first], answer=data[first:], references=refs, task=task,
                  length=len(data), haystack_bytes=haystack_bytes, depths=tuple(depths),
                  offsets=tuple(offsets), needles=tuple(n.encode() for n in needles),
                  num_targets=len(spans), info={**(info or {}), "spans": tuple(spans)})


# --- multi-query multi-token associative recall -----------------------------------------------


def _mqmtar_sizes(length: int, num_queries: int, key_len: int, value_len: int) -> tuple[int, int]:
    """(pair bytes ``kk:vv``, context bytes) of an MQMTAR item of ``length`` bytes."""
    pair = key_len + 1 + value_len
    return pair, length - 1 - num_queries * (1 + pair)


def mqmtar(seed, length: int, *, num_queries: int = 4, key_len: int = 2, value_len: int = 2,
           kv_fraction: float = 0.8, alphabet: str = LETTERS) -> Sample:
    """A multi-query multi-token associative recall item of exactly ``length`` bytes.

    Args:
      seed: int or ``np.random.Generator``.
      length: bytes of the text (context + ``"\\n"`` + queries).
      num_queries: queries, each for a distinct context key.
      key_len, value_len: letters per key / value.
      kv_fraction: share of the context bytes the pairs (plus one space each) fill, in (0, 1].
      alphabet: the letters of keys and values (not ``:``, ``?``, space or newline).

    Returns:
      a :class:`~lcjax.data.ruler.Sample` whose ``references`` are the queried values in
      query order; ``offsets``/``depths``/``needles`` are the queried pairs in the context.
    """
    fn = "mqmtar"
    num_queries = _check_int("num_queries", num_queries, 1, fn)
    key_len = _check_int("key_len", key_len, 1, fn)
    value_len = _check_int("value_len", value_len, 1, fn)
    if not 0 < kv_fraction <= 1:
        raise ValueError(f"{fn}: `kv_fraction` must be in (0, 1], got {kv_fraction!r}")
    alphabet = _check_alphabet(alphabet, fn, ":? \n")
    if len(alphabet) ** value_len < num_queries:
        raise ValueError(f"{fn}: {len(alphabet)}^{value_len} distinct values cannot serve "
                         f"num_queries={num_queries}")
    need = min_length("mqmtar", num_queries=num_queries, key_len=key_len, value_len=value_len,
                      kv_fraction=kv_fraction)
    if _check_int("length", length, 1, fn) < need:
        raise ValueError(f"{fn}: `length` {length} is too short: {num_queries} queries of "
                         f"{key_len}+{value_len}-letter pairs at kv_fraction={kv_fraction} "
                         f"need >= {need} bytes")
    rng = _rng(seed)
    pair, ctx = _mqmtar_sizes(length, num_queries, key_len, value_len)
    n_keys = len(alphabet) ** key_len
    n = min(int(kv_fraction * ctx // (pair + 1)), n_keys, len(alphabet) ** value_len)
    keys = _distinct(rng, alphabet, key_len, n)
    values = _distinct(rng, alphabet, value_len, n)
    # gaps: g_0 >= 0 before the first pair, g_1..g_{n-1} >= 1 between pairs, g_n >= 0 after
    gaps = np.zeros(n + 1, np.int64)
    gaps[1:n] = 1
    gaps += rng.multinomial(ctx - n * pair - (n - 1), np.full(n + 1, 1.0 / (n + 1)))
    parts, offsets = [], []
    pos = 0
    for i in range(n):
        parts.append(" " * int(gaps[i]))
        pos += int(gaps[i])
        offsets.append(pos)
        parts.append(f"{keys[i]}:{values[i]}")
        pos += pair
    parts.append(" " * int(gaps[n]))
    context = "".join(parts)
    asked = [int(j) for j in rng.choice(n, num_queries, replace=False)]
    text, spans = context + "\n", []
    for j in asked:
        text += f"?{keys[j]}:"
        spans.append((len(text), len(text) + value_len))
        text += values[j]
    assert len(text) == length and len(context) == ctx
    return _sample(text, spans, fn, needles=[f"{keys[j]}:{values[j]}" for j in asked],
                   offsets=[offsets[j] for j in asked],
                   depths=[offsets[j] / max(ctx - pair, 1) for j in asked], haystack_bytes=ctx,
                   info={"num_pairs": n, "keys": tuple(keys), "values": tuple(values),
                         "queries": tuple(keys[j] for j in asked)})


def _distinct(rng: np.random.Generator, alphabet: str, width: int, n: int) -> list[str]:
    """``n`` distinct strings of ``width`` letters of ``alphabet``, uniformly drawn."""
    total = len(alphabet) ** width
    if n > total:
        raise ValueError(f"cannot draw {n} distinct {width}-letter strings of {len(alphabet)} "
                         "letters")
    if total <= 1 << 20:
        ids = rng.choice(total, n, replace=False)
    else:  # rejection: fine while n is far below total
        seen: set[int] = set()
        while len(seen) < n:
            seen.update(int(x) for x in rng.integers(0, total, n - len(seen)))
        ids = np.array(sorted(seen))
        rng.shuffle(ids)
    base = len(alphabet)
    out = []
    for x in ids:
        x, chars = int(x), []
        for _ in range(width):
            x, r = divmod(x, base)
            chars.append(alphabet[r])
        out.append("".join(chars))
    return out


# --- flip-flop ---------------------------------------------------------------------------------


def flip_flop(seed, length: int, *, write_prob: float = 0.1) -> Sample:
    """A flip-flop item of exactly ``length`` bytes (``length // 2`` instruction-bit pairs).

    Args:
      seed: int or ``np.random.Generator``.
      length: bytes (>= 4); odd lengths start with one space.
      write_prob: probability that an inner instruction is a write, in (0, 1).

    Returns:
      a :class:`~lcjax.data.ruler.Sample` whose answer is the last written bit; ``offsets``
      holds the offset of that write and ``depths`` its position over the sequence.
    """
    fn = "flip_flop"
    length = _check_int("length", length, 4, fn)
    if not 0 < write_prob < 1:
        raise ValueError(f"{fn}: `write_prob` must be in (0, 1), got {write_prob!r}")
    rng = _rng(seed)
    n = length // 2
    bits = rng.integers(0, 2, n)
    cmds = np.where(rng.random(n - 2) < write_prob, "w", "i")
    cmds = ["w", *cmds.tolist(), "r"]
    last = max(i for i, c in enumerate(cmds) if c == "w")
    bits[-1] = bits[last]
    pad = length - 2 * n
    text = " " * pad + "".join(f"{c}{b}" for c, b in zip(cmds, bits))
    at = pad + 2 * last
    return _sample(text, [(length - 1, length)], fn, needles=[text[at:at + 2]], offsets=[at],
                   depths=[last / max(n - 2, 1)], haystack_bytes=length - 2,
                   info={"writes": cmds.count("w"), "last_write": last})


# --- copy --------------------------------------------------------------------------------------


def copy(seed, length: int, *, alphabet: str = LETTERS) -> Sample:
    """A copy item of exactly ``length`` bytes: ``n`` letters, ``=``, the same ``n`` letters.

    ``n = (length - 1) // 2``; an even length starts with one space. The answer is the copy.
    """
    fn = "copy"
    length = _check_int("length", length, 3, fn)
    alphabet = _check_alphabet(alphabet, fn, "= ")
    rng = _rng(seed)
    n = (length - 1) // 2
    src = "".join(alphabet[i] for i in rng.integers(0, len(alphabet), n))
    pad = length - (2 * n + 1)
    text = " " * pad + src + "=" + src
    return _sample(text, [(length - n, length)], fn, needles=[src], offsets=[pad], depths=[0.0],
                   haystack_bytes=n)


# --- dispatch, lengths, batches, sources -------------------------------------------------------

GENERATORS: dict[str, Callable[..., Sample]] = {"mqmtar": mqmtar, "flip_flop": flip_flop,
                                                "copy": copy}


def generate(task: str, seed, length: int, **overrides) -> Sample:
    """One item of ``task`` (a name of :data:`GENERATORS`) of ``length`` bytes."""
    if task not in GENERATORS:
        raise ValueError(f"synthetic.generate: unknown task {task!r}; known: {sorted(GENERATORS)}")
    return GENERATORS[task](seed, length, **overrides)


def min_length(task: str, **overrides) -> int:
    """The shortest ``length`` ``task`` accepts with these keywords."""
    if task == "mqmtar":
        q = overrides.get("num_queries", 4)
        kl, vl = overrides.get("key_len", 2), overrides.get("value_len", 2)
        frac = overrides.get("kv_fraction", 0.8)
        pair = kl + 1 + vl
        for ctx in itertools.count(q * (pair + 1) - 1):  # at least q pairs in the context
            if int(frac * ctx // (pair + 1)) >= q:
                return 1 + q * (1 + pair) + ctx
    if task == "flip_flop":
        return 4
    if task == "copy":
        return 3
    raise ValueError(f"synthetic.min_length: unknown task {task!r}; known: {sorted(GENERATORS)}")


def answer_positions(sample: Sample, *, bos: bool = True) -> np.ndarray:
    """int ``[A]``: the target positions (of :func:`make_batch`'s rows) of the answer bytes."""
    spans = sample.info.get("spans")
    if spans is None:  # a plain ruler Sample: the whole answer
        spans = [(len(sample.prompt), len(sample.prompt) + len(sample.answer))]
    return np.concatenate([np.arange(a, b) for a, b in spans]) + (bos - 1)


def make_batch(samples: Sequence[Sample], seq_len: int | None = None, *,
               bos: bool = True) -> dict[str, np.ndarray]:
    """:func:`lcjax.data.ruler.make_batch` rows with ``loss_mask`` True on the answer bytes only.

    Row b is ``[BOS] + text`` as ``inputs``/``targets`` (int32 ``[B, T]``, ``T = length``
    for ``bos=True``); ``loss_mask`` (bool ``[B, T]``) marks the targets that are answer
    bytes (:func:`answer_positions`), ``answer_start`` the first and ``answer_len`` their
    number. A plain RULER sample keeps its whole answer as the mask.
    """
    batch = ruler.make_batch(samples, seq_len, bos=bos)
    mask = np.zeros_like(batch["loss_mask"])
    for i, s in enumerate(samples):
        mask[i, answer_positions(s, bos=bos)] = True
    batch["loss_mask"] = mask
    batch["answer_start"] = np.argmax(mask, axis=1).astype(np.int32)
    batch["answer_len"] = mask.sum(1).astype(np.int32)
    return batch


@dataclasses.dataclass(frozen=True)
class SyntheticSource:
    """grain ``RandomAccessDataSource`` of training rows of one synthetic task.

    Record ``i`` is ``generate(task, np.random.default_rng([seed, i]), length_i,
    **overrides)`` as a :func:`make_batch` row of width ``seq_len`` (default: the longest
    length), the same in every process and after every resume. ``length`` is an int or an
    inclusive ``(lo, hi)`` range; then ``length_i`` is drawn from the record's generator
    first (ASEntmax trains on varied lengths) and rows are right-padded with PAD.
    """

    task: str
    length: int | tuple[int, int]
    num_records: int
    seed: int = 0
    seq_len: int | None = None
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.task not in GENERATORS:
            raise ValueError(f"SyntheticSource: unknown task {self.task!r}; "
                             f"known: {sorted(GENERATORS)}")
        if self.num_records < 1:
            raise ValueError(f"SyntheticSource: `num_records` must be >= 1, got {self.num_records}")
        lo, hi = (self.length, self.length) if isinstance(self.length, int) else self.length
        need = min_length(self.task, **self.overrides)
        if not need <= lo <= hi:
            raise ValueError(f"SyntheticSource: `length` {self.length!r} must be an int or a "
                             f"(lo, hi) range with {need} <= lo <= hi for {self.task!r}")
        if self.seq_len is not None and self.seq_len < hi:
            raise ValueError(f"SyntheticSource: `seq_len` {self.seq_len} < the longest length {hi}")
        object.__setattr__(self, "overrides", dict(self.overrides))

    def __len__(self) -> int:
        return self.num_records

    def sample(self, index: int) -> Sample:
        """The :class:`~lcjax.data.ruler.Sample` of record ``index``."""
        if not 0 <= index < self.num_records:
            raise IndexError(f"SyntheticSource: index {index} out of range [0, {self.num_records})")
        rng = np.random.default_rng([self.seed, index])
        if isinstance(self.length, int):
            length = self.length
        else:
            length = int(rng.integers(self.length[0], self.length[1] + 1))
        return generate(self.task, rng, length, **self.overrides)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        hi = self.length if isinstance(self.length, int) else self.length[1]
        batch = make_batch([self.sample(int(index))], self.seq_len or hi)
        return {k: v[0] for k, v in batch.items()}
