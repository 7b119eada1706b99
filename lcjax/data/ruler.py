"""RULER-style synthetic long-context tasks, sized in bytes for byte-level models.

Our own code after the task definitions of RULER (Hsieh et al., 2024, "RULER: What's the
Real Context Size of Your Long-Context Language Models?", NVIDIA/RULER, Apache-2.0):

* **Needle in a haystack** (:func:`niah`). Needles ``"One of the special magic {type} for
  {key} is: {value}."`` are inserted into a haystack — ``"noise"`` (RULER's repeated
  "The grass is green. ..."), ``"essay"`` (Shakespeare from :func:`lcjax.data.load_shakespeare`,
  our stand-in for RULER's Paul Graham essays) or ``"needle"`` (a haystack made only of
  distractor needles). ``num_keys`` keys have needles in the context, the first
  ``num_queries`` are asked for and each of those has ``num_values`` values: single
  (1, 1, 1), multikey (k, 1, 1), multivalue (1, v, 1), multiquery (k, 1, k).
* **Variable tracking** (:func:`variable_tracking`). Chains ``VAR ABCDE = 12345.``,
  ``VAR FGHIJ = VAR ABCDE.``, ... (``num_hops`` hops, ``num_chains`` chains, the first is
  asked for) hidden in order in a haystack; the answer is every variable of the chain.

A :class:`Sample` is ``(prompt bytes, answer bytes)`` plus metadata: the realised depth and
the byte offset of every needle, the haystack size, the references for the metrics.
``len(prompt) + len(answer) == length`` exactly: the haystack gets whatever bytes the
template, the needles and the answer leave, cut at a byte (the last haystack sentence may
be partial). Needles go only at *boundaries* of the haystack (sentence starts for
``"noise"`` and ``"needle"``, word starts for ``"essay"``), the one nearest to the requested
depth. Depth is the fraction of haystack bytes before the needle: 0 = right after the
prompt prefix, 1 = right before the question; the realised depth is within half a
boundary gap of the request (``Sample.depths``).

:func:`make_batch` turns samples into byte-token arrays ``[B, T]``: ``[BOS] + prompt +
answer`` (``+ [EOS]`` with ``eos=True``) as next-token ``inputs``/``targets``, right-padded
with PAD, and a ``loss_mask`` that is True exactly where the target is an answer byte, so
with ``eos=False`` a sample of ``length`` bytes is a row of exactly ``T = length`` tokens.
:func:`answer_accuracy` scores argmax predictions under teacher forcing: an answer is
exactly matched under teacher forcing iff greedy decoding from the prompt produces it.
:func:`string_match_all` / :func:`string_match_part` are RULER's metrics (percent).

Every generator takes a seed (int or ``np.random.Generator``) and is deterministic under it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lcjax.data.tokenizer import BOS, EOS, PAD

__all__ = [
    "NEEDLE",
    "NIAH_PREFIX",
    "NIAH_QUESTION",
    "NOISE",
    "TASKS",
    "VT_PREFIX",
    "VT_QUESTION",
    "Sample",
    "answer_accuracy",
    "find_values",
    "generate",
    "generate_many",
    "haystack",
    "make_batch",
    "niah",
    "string_match_all",
    "string_match_part",
    "variable_tracking",
]

# --- templates (RULER's wording; ``{type}`` is "numbers" or "uuids") ------------------------

NEEDLE = "One of the special magic {type} for {key} is: {value}."
NIAH_PREFIX = ("Some special magic {type} are hidden within the following text. Make sure to "
               "memorize it. I will quiz you about the {type} afterwards.\n")
NIAH_QUESTION = ("\nWhat are all the special magic {type} for {query} mentioned in the provided "
                 "text? The special magic {type} for {query} mentioned in the provided text are: ")
VT_PREFIX = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
VT_QUESTION = ("\nQuestion: Find all variables that are assigned the value {value} in the text "
               "above. Answer: According to the chain(s) of variable assignment in the text "
               "above, {num} variables are assigned the value {value}, they are: ")
NOISE = (b"The grass is green. The sky is blue. The sun is yellow. Here we go. "
         b"There and back again. ")

HAYSTACKS = ("noise", "essay", "needle")
KEY_TYPES = ("words", "numbers", "uuids")
VALUE_TYPES = ("numbers", "uuids")

_ADJECTIVES = (
    "able", "bitter", "brave", "calm", "clever", "cold", "crisp", "curious", "damp", "dark",
    "eager", "early", "empty", "fair", "fancy", "fierce", "fresh", "gentle", "glad", "grand",
    "green", "happy", "hollow", "honest", "humble", "icy", "jolly", "kind", "lazy", "little",
    "lively", "loud", "lucky", "merry", "mighty", "misty", "narrow", "noble", "odd", "pale",
    "plain", "polite", "proud", "quick", "quiet", "rapid", "rare", "rich", "rough", "royal",
    "rusty", "shy", "silent", "silly", "sleepy", "slow", "smooth", "soft", "sour", "steady",
    "swift", "tall", "tender", "tidy", "tiny", "vast", "warm", "wild", "wise", "young",
)
_NOUNS = (
    "anchor", "apple", "arrow", "badger", "basket", "beacon", "bell", "bison", "bridge",
    "candle", "canyon", "castle", "cedar", "cherry", "cloud", "comet", "crane", "crow",
    "desert", "dragon", "drum", "eagle", "falcon", "feather", "forest", "fox", "garden",
    "glacier", "harbor", "hawk", "island", "jungle", "kettle", "ladder", "lantern", "lemon",
    "lion", "marble", "meadow", "mirror", "monkey", "needle", "ocean", "otter", "owl",
    "panther", "pebble", "pepper", "pillow", "planet", "pond", "rabbit", "raven", "river",
    "rocket", "saddle", "salmon", "shadow", "spider", "squirrel", "stone", "thunder", "tiger",
    "tower", "tulip", "valley", "violin", "walrus", "whale", "window", "wolf", "zebra",
)


@dataclasses.dataclass(frozen=True)
class Sample:
    """One task instance.

    Attributes:
      prompt: the input bytes (prefix, context with the needles, question).
      answer: the bytes a model must produce after ``prompt`` (references joined by ", "
        for NIAH, by " " for variable tracking).
      references: the individual answers, for :func:`string_match_all` / ``_part``.
      task: generator name (``"niah"`` or ``"vt"``).
      length: ``len(prompt) + len(answer)``.
      haystack_bytes: haystack bytes in the context (needles excluded).
      depths: realised depth of each needle in ``[0, 1]`` (haystack bytes before it over
        ``haystack_bytes``), in needle order: the targets first (see ``num_targets``).
      offsets: byte offset of each needle in ``prompt``, same order.
      needles: the needle sentences, same order (``prompt[o:o + len(n)] == n``).
      num_targets: how many leading needles carry the answer.
      info: task details (keys, values, variables, requested depths).
    """

    prompt: bytes
    answer: bytes
    references: tuple[bytes, ...]
    task: str
    length: int
    haystack_bytes: int
    depths: tuple[float, ...]
    offsets: tuple[int, ...]
    needles: tuple[bytes, ...]
    num_targets: int
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def text(self) -> bytes:
        """``prompt + answer``."""
        return self.prompt + self.answer


# --- randomness, keys and values ------------------------------------------------------------


def _rng(seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


def _number(rng: np.random.Generator, digits: int) -> str:
    if digits < 1:
        raise ValueError(f"number of digits must be >= 1, got {digits}")
    first = str(rng.integers(1, 10)) if digits > 1 else str(rng.integers(0, 10))
    return first + "".join(str(d) for d in rng.integers(0, 10, digits - 1))


def _uuid(rng: np.random.Generator) -> str:
    h = rng.integers(0, 16, 32)
    h[12] = 4  # version 4
    h[16] = 8 + h[16] % 4  # RFC 4122 variant
    s = "".join("0123456789abcdef"[d] for d in h)
    return f"{s[:8]}-{s[8:12]}-{s[12:16]}-{s[16:20]}-{s[20:]}"


def _draw(rng, kind: str, digits: int) -> str:
    if kind == "words":
        return f"{_ADJECTIVES[rng.integers(len(_ADJECTIVES))]}-{_NOUNS[rng.integers(len(_NOUNS))]}"
    if kind == "numbers":
        return _number(rng, digits)
    if kind == "uuids":
        return _uuid(rng)
    if kind == "letters":
        return "".join(chr(65 + c) for c in rng.integers(0, 26, digits))
    raise ValueError(f"unknown kind {kind!r}")


def _unique(rng, kind: str, count: int, digits: int, taken: set[str]) -> list[str]:
    """``count`` fresh strings of ``kind``, none in ``taken`` (which is updated)."""
    out = []
    for _ in range(1000 * count + 1000):
        if len(out) == count:
            return out
        s = _draw(rng, kind, digits)
        if s not in taken:
            taken.add(s)
            out.append(s)
    raise ValueError(f"cannot draw {count} distinct {kind} of size {digits}")


# --- haystacks ------------------------------------------------------------------------------


@functools.cache
def _essay() -> bytes:
    from lcjax.data.corpus import load_shakespeare

    return b"\n\n".join(d.text.encode("utf-8") for d in load_shakespeare())


def _repeat_to(unit: bytes, n: int) -> bytes:
    return (unit * (n // len(unit) + 1))[:n]


def _boundaries(hay: bytes, kind: str) -> np.ndarray:
    """Sorted offsets in [0, len(hay)] where a needle may go (0 and len(hay) always)."""
    a = np.frombuffer(hay, np.uint8)
    if kind == "essay":
        inner = np.flatnonzero((a == 32) | (a == 10)) + 1
    else:  # sentence starts: after ". "
        inner = np.flatnonzero((a[:-1] == ord(".")) & (a[1:] == ord(" "))) + 2
    return np.unique(np.r_[0, inner, len(hay)])


def haystack(kind: str, n_bytes: int, seed=0, *, exclude_keys: Sequence[str] = (),
             key_type: str = "words", value_type: str = "numbers", value_digits: int = 7,
             type_name: str = "numbers", needle: str = NEEDLE) -> tuple[bytes, np.ndarray]:
    """``n_bytes`` of haystack and the offsets where a needle may be inserted.

    ``"noise"``: :data:`NOISE` repeated; ``"essay"``: Shakespeare from a random offset;
    ``"needle"``: distractor needles with fresh keys (never one of ``exclude_keys``).
    Returns ``(bytes of length n_bytes, sorted int offsets in [0, n_bytes])``.
    """
    if n_bytes < 0:
        raise ValueError(f"haystack: `n_bytes` must be >= 0, got {n_bytes}")
    rng = _rng(seed)
    if kind == "noise":
        hay = _repeat_to(NOISE, n_bytes)
    elif kind == "essay":
        blob = _essay()
        if n_bytes > len(blob):
            blob = _repeat_to(blob + b"\n\n", n_bytes)
        start = int(rng.integers(0, len(blob) - n_bytes + 1))
        hay = blob[start:start + n_bytes]
    elif kind == "needle":
        taken = set(exclude_keys)
        parts, size = [], 0
        while size < n_bytes:
            key = _unique(rng, key_type, 1, 7, taken)[0]
            value = _unique(rng, value_type, 1, value_digits, taken)[0]
            s = needle.format(type=type_name, key=key, value=value).encode() + b" "
            parts.append(s)
            size += len(s)
        hay = b"".join(parts)[:n_bytes]
    else:
        raise ValueError(f"haystack: `kind` must be one of {HAYSTACKS}, got {kind!r}")
    return hay, _boundaries(hay, kind)


def _insert(prefix: bytes, hay: bytes, bounds: np.ndarray, needles: list[bytes],
            depths: list[float]) -> tuple[bytes, tuple[int, ...], tuple[float, ...]]:
    """Context = prefix + hay with each needle (+ " ") at the boundary nearest its depth.

    Needles at the same boundary keep their list order. Returns (prefix + context, prompt
    offsets and realised depths of the needles in list order).
    """
    n = len(hay)
    where = []
    for d in depths:
        i = int(np.argmin(np.abs(bounds - d * n)))  # first of equally near boundaries
        where.append(int(bounds[i]))
    order = sorted(range(len(needles)), key=lambda j: (where[j], j))
    parts, offsets, pos, out_len = [prefix], [0] * len(needles), 0, len(prefix)
    for j in order:
        parts.append(hay[pos:where[j]])
        out_len += where[j] - pos
        pos = where[j]
        offsets[j] = out_len
        parts.append(needles[j] + b" ")
        out_len += len(needles[j]) + 1
    parts.append(hay[pos:])
    realised = tuple(w / n if n else 0.0 for w in where)
    return b"".join(parts), tuple(offsets), realised


def _check_depth(d, name: str) -> float:
    d = float(d)
    if not 0.0 <= d <= 1.0:
        raise ValueError(f"{name}: depth must lie in [0, 1], got {d}")
    return d


def _needle_depths(rng, depth, count: int, name: str) -> list[float]:
    """None: uniform; a number: the first needle there, others uniform; a sequence: each."""
    if depth is None:
        return [float(x) for x in rng.random(count)]
    if isinstance(depth, Sequence | np.ndarray):
        if len(depth) != count:
            raise ValueError(f"{name}: got {len(depth)} depths for {count} needles")
        return [_check_depth(d, name) for d in depth]
    return [_check_depth(depth, name)] + [float(x) for x in rng.random(count - 1)]


def _fill(name: str, length: int, fixed: int) -> int:
    hay = length - fixed
    if hay < 0:
        raise ValueError(f"{name}: length {length} is too short: template, needles and answer "
                         f"take {fixed} bytes")
    return hay


def _join_query(keys: Sequence[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]


# --- tasks ----------------------------------------------------------------------------------


def niah(seed, length: int, *, num_keys: int = 1, num_values: int = 1, num_queries: int = 1,
         key_type: str = "words", value_type: str = "numbers", value_digits: int = 7,
         haystack_kind: str = "noise", depth: float | Sequence[float] | None = None,
         needle: str = NEEDLE, prefix: str = NIAH_PREFIX, question: str = NIAH_QUESTION,
         type_name: str | None = None) -> Sample:
    """A needle-in-a-haystack sample of exactly ``length`` bytes (prompt + answer).

    Args:
      seed: int or ``np.random.Generator``.
      length: bytes of prompt + answer.
      num_keys: keys with needles in the context (the first ``num_queries`` are asked).
      num_values: values (needles) per asked key; other keys get one needle each.
      num_queries: keys asked for.
      key_type: ``"words"`` (adjective-noun), ``"numbers"`` (7 digits) or ``"uuids"``.
      value_type: ``"numbers"`` (``value_digits`` digits) or ``"uuids"``.
      haystack_kind: ``"noise"``, ``"essay"`` or ``"needle"``.
      depth: None (each needle uniform), a number in [0, 1] (the first target needle there,
        the others uniform) or one depth per needle (targets first, then distractors).
      needle, prefix, question: templates with ``{type}``, ``{key}``, ``{value}`` (needle)
        and ``{type}``, ``{query}`` (prefix, question); the prompt ends with the question.
      type_name: the ``{type}`` word; default "numbers" or "uuids" after ``value_type``.

    Returns:
      a :class:`Sample`; ``answer`` is the asked values joined by ", " (query order).
    """
    name = "niah"
    if not 1 <= num_queries <= num_keys or num_values < 1:
        raise ValueError(f"{name}: need 1 <= num_queries <= num_keys and num_values >= 1, got "
                         f"num_queries={num_queries}, num_keys={num_keys}, "
                         f"num_values={num_values}")
    if key_type not in KEY_TYPES or value_type not in VALUE_TYPES:
        raise ValueError(f"{name}: key_type must be one of {KEY_TYPES} and value_type one of "
                         f"{VALUE_TYPES}; got {key_type!r}, {value_type!r}")
    if haystack_kind not in HAYSTACKS:
        raise ValueError(f"{name}: haystack_kind must be one of {HAYSTACKS}, "
                         f"got {haystack_kind!r}")
    rng = _rng(seed)
    type_name = type_name or value_type
    taken: set[str] = set()
    keys = _unique(rng, key_type, num_keys, 7, taken)
    queried = keys[:num_queries]
    values = {k: _unique(rng, value_type, num_values if i < num_queries else 1, value_digits,
                         taken) for i, k in enumerate(keys)}
    pairs = [(k, v) for k in queried for v in values[k]]
    pairs += [(k, values[k][0]) for k in keys[num_queries:]]
    needles = [needle.format(type=type_name, key=k, value=v).encode() for k, v in pairs]
    refs = tuple(v.encode() for k in queried for v in values[k])
    answer = b", ".join(refs)
    query = _join_query(queried)
    pre = prefix.format(type=type_name, query=query).encode()
    post = question.format(type=type_name, query=query).encode()
    depths = _needle_depths(rng, depth, len(needles), name)
    n_hay = _fill(name, length, len(pre) + len(post) + len(answer)
                  + sum(len(s) + 1 for s in needles))
    hay, bounds = haystack(haystack_kind, n_hay, rng, exclude_keys=keys, key_type=key_type,
                           value_type=value_type, value_digits=value_digits,
                           type_name=type_name, needle=needle)
    body, offsets, realised = _insert(pre, hay, bounds, needles, depths)
    prompt = body + post
    return Sample(prompt, answer, refs, name, len(prompt) + len(answer), n_hay, realised,
                  offsets, tuple(needles), len(refs),
                  {"keys": tuple(keys), "queries": tuple(queried),
                   "values": {k: tuple(v) for k, v in values.items()},
                   "requested_depths": tuple(depths), "haystack": haystack_kind})


def variable_tracking(seed, length: int, *, num_chains: int = 1, num_hops: int = 4,
                      var_len: int = 5, value_digits: int = 5, haystack_kind: str = "noise",
                      depth: float | Sequence[float] | None = None, prefix: str = VT_PREFIX,
                      question: str = VT_QUESTION) -> Sample:
    """A variable-tracking sample of exactly ``length`` bytes (prompt + answer).

    Chain c: ``VAR X0 = <value>.``, ``VAR X1 = VAR X0.``, ..., ``VAR X{hops} = VAR X{hops-1}.``
    (names of ``var_len`` capital letters, values of ``value_digits`` digits, all distinct),
    each chain's statements in order in the haystack; chain 0 is asked for and the answer is
    its ``num_hops + 1`` names joined by " ".

    Args:
      depth: None (each chain at sorted uniform depths), a number (chain 0's first statement
        there, its later statements at sorted uniform depths after it) or one depth per
        statement, chain by chain (chain 0 first), nondecreasing within each chain.
      prefix, question: templates; ``question`` takes ``{value}`` and ``{num}``.
    """
    name = "variable_tracking"
    if num_chains < 1 or num_hops < 0 or var_len < 1:
        raise ValueError(f"{name}: need num_chains >= 1, num_hops >= 0, var_len >= 1; got "
                         f"{num_chains}, {num_hops}, {var_len}")
    if haystack_kind not in ("noise", "essay"):
        raise ValueError(f"{name}: haystack_kind must be 'noise' or 'essay', "
                         f"got {haystack_kind!r}")
    rng = _rng(seed)
    per = num_hops + 1
    taken: set[str] = set()
    names = _unique(rng, "letters", num_chains * per, var_len, taken)
    chains = [names[c * per:(c + 1) * per] for c in range(num_chains)]
    vals = _unique(rng, "numbers", num_chains, value_digits, taken)
    needles = []
    for chain, val in zip(chains, vals):
        needles.append(f"VAR {chain[0]} = {val}.".encode())
        needles += [f"VAR {b} = VAR {a}.".encode() for a, b in zip(chain, chain[1:])]
    if depth is None:
        depths = [float(x) for _ in chains for x in np.sort(rng.random(per))]
    elif isinstance(depth, Sequence | np.ndarray):
        depths = _needle_depths(rng, depth, len(needles), name)
        for c in range(num_chains):
            if np.any(np.diff(depths[c * per:(c + 1) * per]) < 0):
                raise ValueError(f"{name}: depths of chain {c} must be nondecreasing")
    else:
        d0 = _check_depth(depth, name)
        depths = [d0] + [float(x) for x in np.sort(d0 + (1 - d0) * rng.random(per - 1))]
        depths += [float(x) for _ in chains[1:] for x in np.sort(rng.random(per))]
    refs = tuple(v.encode() for v in chains[0])
    answer = b" ".join(refs)
    pre = prefix.encode()
    post = question.format(value=vals[0], num=per).encode()
    n_hay = _fill(name, length, len(pre) + len(post) + len(answer)
                  + sum(len(s) + 1 for s in needles))
    hay, bounds = haystack(haystack_kind, n_hay, rng)
    body, offsets, realised = _insert(pre, hay, bounds, needles, depths)
    prompt = body + post
    return Sample(prompt, answer, refs, "vt", len(prompt) + len(answer), n_hay, realised,
                  offsets, tuple(needles), per,
                  {"chains": tuple(tuple(c) for c in chains), "values": tuple(vals),
                   "requested_depths": tuple(depths), "haystack": haystack_kind})


# RULER's task set (names as in NVIDIA/RULER's synthetic.yaml), with our haystacks.
TASKS: dict[str, tuple[Any, dict]] = {
    "niah_single_1": (niah, dict(haystack_kind="noise")),
    "niah_single_2": (niah, dict(haystack_kind="essay")),
    "niah_single_3": (niah, dict(haystack_kind="essay", value_type="uuids")),
    "niah_multikey_1": (niah, dict(haystack_kind="essay", num_keys=4)),
    "niah_multikey_2": (niah, dict(haystack_kind="needle")),
    "niah_multikey_3": (niah, dict(haystack_kind="needle", key_type="uuids",
                                   value_type="uuids")),
    "niah_multivalue": (niah, dict(haystack_kind="essay", num_values=4)),
    "niah_multiquery": (niah, dict(haystack_kind="essay", num_keys=4, num_queries=4)),
    "vt": (variable_tracking, dict(num_chains=1, num_hops=4)),
}


def generate(task: str, seed, length: int, **overrides) -> Sample:
    """One sample of a task of :data:`TASKS` (``overrides`` replace its keywords)."""
    if task not in TASKS:
        raise ValueError(f"generate: unknown task {task!r}; known: {sorted(TASKS)}")
    fn, kwargs = TASKS[task]
    return fn(seed, length, **{**kwargs, **overrides})


def generate_many(task: str, seed: int, length: int, n: int, **overrides) -> list[Sample]:
    """``n`` samples; sample i uses seed ``(seed, i)`` so any prefix of the list is stable."""
    return [generate(task, np.random.default_rng([seed, i]), length, **overrides)
            for i in range(n)]


# --- batches and metrics --------------------------------------------------------------------


def make_batch(samples: Sequence[Sample], seq_len: int | None = None, *, bos: bool = True,
               eos: bool = False) -> dict[str, np.ndarray]:
    """Byte-token arrays for next-token training/evaluation on ``samples``.

    Row b is ``[BOS]? + prompt + answer + [EOS]?`` split into ``inputs = seq[:-1]``,
    ``targets = seq[1:]``, right-padded with PAD to ``seq_len`` (default: the longest row).

    Returns:
      ``inputs``, ``targets``: int32 ``[B, T]``; ``loss_mask``: bool ``[B, T]``, True where
      the target is an answer byte (or the EOS after it); ``answer_start``: int32 ``[B]``,
      the first such position; ``answer_len``: int32 ``[B]``, the number of such positions.
    """
    if not samples:
        raise ValueError("make_batch: `samples` is empty")
    rows = []
    for s in samples:
        ids = np.frombuffer(s.prompt + s.answer, np.uint8).astype(np.int32)
        seq = np.concatenate([[BOS]] * bos + [ids] + [[EOS]] * eos).astype(np.int32)
        rows.append((seq, len(s.prompt) + bos - 1, len(s.answer) + eos))
    longest = max(len(seq) - 1 for seq, _, _ in rows)
    t = longest if seq_len is None else seq_len
    if t < longest:
        raise ValueError(f"make_batch: a sample needs {longest} positions, seq_len is {seq_len}")
    b = len(rows)
    inputs = np.full((b, t), PAD, np.int32)
    targets = np.full((b, t), PAD, np.int32)
    mask = np.zeros((b, t), bool)
    start = np.zeros(b, np.int32)
    count = np.zeros(b, np.int32)
    for i, (seq, a0, na) in enumerate(rows):
        inputs[i, :len(seq) - 1] = seq[:-1]
        targets[i, :len(seq) - 1] = seq[1:]
        mask[i, a0:a0 + na] = True
        start[i], count[i] = a0, na
    return {"inputs": inputs, "targets": targets, "loss_mask": mask, "answer_start": start,
            "answer_len": count}


def answer_accuracy(predictions, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-sample answer scores of teacher-forced argmax ``predictions`` (int ``[B, T]``).

    Returns float ``token_acc`` ``[B]`` (fraction of answer positions predicted right) and
    bool ``exact`` ``[B]`` (all of them right — the same as greedy decoding producing the
    answer exactly, since each greedy step then sees the true prefix).
    """
    pred = np.asarray(predictions)
    mask = np.asarray(batch["loss_mask"])
    if pred.shape != mask.shape:
        raise ValueError(f"answer_accuracy: predictions {pred.shape} vs loss_mask {mask.shape}")
    right = (pred == np.asarray(batch["targets"])) & mask
    n = mask.sum(1)
    return {"token_acc": right.sum(1) / np.maximum(n, 1), "exact": right.sum(1) == n}


def _text(x) -> str:
    return x.decode("utf-8", "replace") if isinstance(x, bytes | bytearray) else str(x)


def _check_metric_args(preds, refs, name):
    if len(preds) != len(refs) or not preds:
        raise ValueError(f"{name}: need as many predictions as reference lists (and at least "
                         f"one); got {len(preds)} and {len(refs)}")


def string_match_all(preds: Sequence[str | bytes], refs: Sequence[Sequence[str | bytes]]) -> float:
    """RULER's ``string_match_all``: the mean over samples of the fraction of a sample's
    references found (case-insensitive substring) in its prediction, in percent."""
    _check_metric_args(preds, refs, "string_match_all")
    score = 0.0
    for p, rs in zip(preds, refs):
        p = _text(p).lower()
        score += sum(_text(r).lower() in p for r in rs) / max(len(rs), 1)
    return 100.0 * score / len(preds)


def string_match_part(preds: Sequence[str | bytes],
                      refs: Sequence[Sequence[str | bytes]]) -> float:
    """RULER's ``string_match_part``: the fraction of samples whose prediction contains at
    least one of its references (case-insensitive substring), in percent."""
    _check_metric_args(preds, refs, "string_match_part")
    score = sum(max((_text(r).lower() in _text(p).lower() for r in rs), default=False)
                for p, rs in zip(preds, refs))
    return 100.0 * score / len(preds)


def find_values(prompt: bytes, key: str, *, type_name: str = "numbers",
                needle: str = NEEDLE) -> list[bytes]:
    """Every value the prompt states for ``key`` (regex on the needle template): what a
    perfect reader of the context answers."""
    pattern = re.escape(needle.format(type=type_name, key=key, value="\0")).replace(
        re.escape("\0"), r"(.+?)")
    return [m.encode() for m in re.findall(pattern, prompt.decode("utf-8", "replace"))]
