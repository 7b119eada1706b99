"""RULER-style synthetic long-context tasks, sized in tokens of any tokenizer.

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
* **Common words extraction** (:func:`common_words`): a numbered list of words in which
  ``num_words`` common words appear ``freq_common`` times and every other word
  ``freq_rare < freq_common`` times; the answer is the common words.
* **Frequent words extraction** (:func:`frequent_words`): "coded text" of made-up words
  with Zipf(``alpha``) frequencies, the most frequent being the noise word ``....`` that
  the question says to ignore; the answer is the next ``num_words`` words, most frequent
  first. Counts are strictly decreasing down to rank ``num_words + 1`` (no ties).
* **Question answering** (:func:`qa`), built from the Shakespeare corpus (no download):
  documents are speeches ``[SPEAKER] text`` and cast notes ``SPEAKER is a character in
  Title.``; single-hop (``hops=1``): who speaks a quoted line; multi-hop (``hops=2``):
  in which work appears the speaker of a quoted line (the speech, then its cast note).

**Lengths are in tokens.** ``tokenizer`` is None (UTF-8 bytes), a callable
``encode(str) -> ids`` or a Hugging Face ``tokenizers.Tokenizer``
(:func:`lcjax.data.suites.as_tokenizer`); ``Sample.length`` is the tokens of ``prompt``
plus those of ``answer``, at most ``length`` and, for a length of a few hundred haystack
units, within 2% of it. The haystack is a sequence of whole *units* (noise sentences,
Shakespeare passages that end a sentence or a verse line, distractor needles, list items,
documents): the generator takes the largest number of units that fits (an interpolation
search over full token counts) and pads the end of the haystack with spaces while that
stays within ``length`` — so with bytes ``Sample.length == length`` exactly, and a
haystack is never cut inside a unit.

Needles go only between units, at the boundary nearest the requested depth. Depth is the
fraction of haystack bytes before the needle: 0 = right after the prompt prefix, 1 = right
before the question (after the padding); the realised depth (``Sample.depths``) is within
half a unit of the request.

A :class:`Sample` is ``(prompt bytes, answer bytes)`` plus metadata: the realised depths
and byte offsets of the needles, the haystack size, the references for the metrics.
:func:`make_batch` turns samples into byte-token arrays ``[B, T]``: ``[BOS] + prompt +
answer`` (``+ [EOS]`` with ``eos=True``) as next-token ``inputs``/``targets``, right-padded
with PAD, and a ``loss_mask`` that is True exactly where the target is an answer byte, so
with ``eos=False`` a byte-sized sample of ``length`` is a row of exactly ``T = length``.
:func:`answer_accuracy` scores argmax predictions under teacher forcing: an answer is
exactly matched under teacher forcing iff greedy decoding from the prompt produces it.
:func:`string_match_all` / :func:`string_match_part` are RULER's metrics (percent).
:data:`SUITE` lists RULER's 13-task mix (registered as suite ``"ruler"``).

Every generator takes a seed (int or ``np.random.Generator``) and is deterministic under it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from lcjax.data.corpus import load_shakespeare
from lcjax.data.suites import Suite, SuiteTask, TokenCounter, as_tokenizer
from lcjax.data.tokenizer import BOS, EOS, PAD

__all__ = [
    "CWE_PREFIX",
    "GENERATORS",
    "CWE_QUESTION",
    "FWE_NOISE",
    "FWE_PREFIX",
    "FWE_QUESTION",
    "NEEDLE",
    "NIAH_PREFIX",
    "NIAH_QUESTION",
    "NOISE",
    "QA_PREFIX",
    "QA_QUESTIONS",
    "SUITE",
    "TASKS",
    "VT_PREFIX",
    "VT_QUESTION",
    "Placed",
    "Pool",
    "Sample",
    "answer_accuracy",
    "answer_rows",
    "common_words",
    "find_values",
    "fit_length",
    "frequent_words",
    "generate",
    "generate_many",
    "haystack",
    "haystack_pool",
    "join_query",
    "make_batch",
    "needle_sample",
    "niah",
    "place_needles",
    "qa",
    "speeches",
    "string_match_all",
    "string_match_part",
    "suite",
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
CWE_PREFIX = ("Below is a numbered list of words. In these words, some appear more often than "
              "others. Memorize the ones that appear most often.\n")
CWE_QUESTION = ("\nQuestion: What are the {num} most common words in the above list? Answer: "
                "The top {num} words that appear most often in the list are: ")
FWE_NOISE = "...."
FWE_PREFIX = ("Read the following coded text and track the frequency of each coded word. Find "
              "the {num} most frequently appeared coded words.\n")
FWE_QUESTION = ("\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
                "What are the {num} most frequently appeared words in the above coded text? "
                "Answer: According to the coded text above, the {num} most frequently appeared "
                "words are: ")
QA_PREFIX = ("Answer the question based on the given documents. Only give me the answer and do "
             "not output any other words.\n\nThe following are given documents.\n\n")
QA_QUESTIONS = {
    1: "\nAnswer the question based on the given documents.\n\nQuestion: Who speaks the line "
       "\"{quote}\"? Answer: ",
    2: "\nAnswer the question based on the given documents.\n\nQuestion: In which work is the "
       "speaker of the line \"{quote}\" a character? Answer: ",
}
NOISE_SENTENCES = ("The grass is green. ", "The sky is blue. ", "The sun is yellow. ",
                   "Here we go. ", "There and back again. ")
NOISE = "".join(NOISE_SENTENCES).encode()

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
      answer: the bytes a model must produce after ``prompt`` (references joined by ", ",
        by " " for variable tracking).
      references: the individual answers, for :func:`string_match_all` / ``_part``.
      task: generator name (``"niah"``, ``"vt"``, ``"cwe"``, ``"fwe"``, ``"qa"``, ...).
      length: tokens of ``prompt`` plus tokens of ``answer`` (of ``tokenizer``).
      haystack_bytes: haystack bytes in the context (needles excluded, padding included).
      depths: realised depth of each needle in ``[0, 1]`` (haystack bytes before it over
        ``haystack_bytes``), in needle order: the targets first (see ``num_targets``).
      offsets: byte offset of each needle in ``prompt``, same order.
      needles: the needle texts, same order (``prompt[o:o + len(n)] == n``).
      num_targets: how many leading needles carry the answer.
      info: task details (keys, values, variables, requested depths, units, padding).
      tokenizer: name of the tokenizer ``length`` counts (``"bytes"`` by default).
      question: the question at the end of the prompt (bytes; ``prompt.endswith``).
      needle: the one context sentence that holds the answer (NoLiMa-style tasks), else b"".
      control: True for a literal-match control item (NoLiMa-style tasks).
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
    tokenizer: str = "bytes"
    question: bytes = b""
    needle: bytes = b""
    control: bool = False

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
    if kind == "coded":  # a made-up lowercase word of 3-6 letters (frequent words)
        return "".join(chr(97 + c) for c in rng.integers(0, 26, int(rng.integers(3, 7))))
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


def _fresh_words(seed: int, kind: str, taken: set[str]) -> Iterator[str]:
    """An endless stream of distinct strings of ``kind``, none in ``taken``."""
    rng, taken = np.random.default_rng(seed), set(taken)
    while True:
        yield _unique(rng, kind, 1, 0, taken)[0]


def _subseed(rng: np.random.Generator) -> int:
    """An integer seed for a sub-stream (lazy pools, per-size shuffles)."""
    return int(rng.integers(0, 2**62))


# --- haystack units -------------------------------------------------------------------------


class Pool:
    """A lazily extended, deterministic sequence of haystack units (strings).

    ``take(k)`` returns the first ``k`` units, drawing more from ``source`` as needed; the
    units do not depend on how far the pool was extended before.
    """

    def __init__(self, source: Iterator[str]):
        self._source = source
        self._units: list[str] = []

    def take(self, k: int) -> list[str]:
        while len(self._units) < k:
            self._units.append(next(self._source))
        return self._units[:k]


@functools.cache
def _essay_units() -> tuple[str, ...]:
    """Shakespeare (every text, in corpus order) split into passages at real boundaries.

    A passage is a run of lines ending with a line that ends a sentence or clause
    (``. ! ? : ; ] )``), a blank line, or the third line of a longer sentence (a verse line
    end); each keeps its newline.
    """
    blob = "\n\n".join(d.text.strip("\n") for d in load_shakespeare())
    units, cur = [], []
    for line in blob.split("\n"):
        cur.append(line)
        tail = line.rstrip()
        if not tail or tail[-1] in ".!?:;])" or len(cur) >= 3:
            units.append("\n".join(cur) + "\n")
            cur = []
    if cur:
        units.append("\n".join(cur) + "\n")
    return tuple(units)


def _cycle(units: Sequence[str], start: int) -> Iterator[str]:
    i = start
    while True:
        yield units[i % len(units)]
        i += 1


def _distractor_needles(seed: int, exclude: Sequence[str], key_type: str, value_type: str,
                        value_digits: int, type_name: str, needle: str) -> Iterator[str]:
    rng = np.random.default_rng(seed)
    taken = set(exclude)
    while True:
        key = _unique(rng, key_type, 1, 7, taken)[0]
        value = _unique(rng, value_type, 1, value_digits, taken)[0]
        yield needle.format(type=type_name, key=key, value=value) + " "


def haystack_pool(kind: str, seed=0, *, exclude_keys: Sequence[str] = (),
                  key_type: str = "words", value_type: str = "numbers", value_digits: int = 7,
                  type_name: str = "numbers", needle: str = NEEDLE) -> tuple[Pool, str]:
    """The unit pool of a haystack kind and the separator a needle gets after it.

    ``"noise"``: :data:`NOISE_SENTENCES` cycled from the first (separator ``" "``);
    ``"essay"``: Shakespeare passages from a random one, wrapping around (``"\\n"``);
    ``"needle"``: distractor needles with fresh keys, never one of ``exclude_keys`` (``" "``).
    """
    if kind == "noise":
        return Pool(_cycle(NOISE_SENTENCES, 0)), " "
    if kind == "essay":
        units = _essay_units()
        return Pool(_cycle(units, int(_rng(seed).integers(len(units))))), "\n"
    if kind == "needle":
        return Pool(_distractor_needles(_subseed(_rng(seed)), exclude_keys, key_type,
                                        value_type, value_digits, type_name, needle)), " "
    raise ValueError(f"haystack: `kind` must be one of {HAYSTACKS}, got {kind!r}")


def haystack(kind: str, n_bytes: int, seed=0, **pool_kwargs) -> tuple[bytes, np.ndarray]:
    """The longest run of whole units of a haystack (:func:`haystack_pool`) within
    ``n_bytes`` bytes, and the offsets of its unit boundaries (0 and the end included)."""
    if n_bytes < 0:
        raise ValueError(f"haystack: `n_bytes` must be >= 0, got {n_bytes}")
    pool, _ = haystack_pool(kind, seed, **pool_kwargs)
    parts, size, k = [], 0, 0
    while True:
        unit = pool.take(k + 1)[k].encode()
        if size + len(unit) > n_bytes:
            break
        parts.append(unit)
        size += len(unit)
        k += 1
    return b"".join(parts), np.cumsum([0] + [len(p) for p in parts])


# --- placing needles and fitting the length -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Placed:
    """A context built by :func:`place_needles`: ``text`` (prefix + context), the byte
    ``offsets`` of the needles in it, their realised ``depths`` and the haystack bytes."""

    text: str
    offsets: tuple[int, ...]
    depths: tuple[float, ...]
    haystack_bytes: int


def place_needles(prefix: str, units: Sequence[str], needles: Sequence[str],
                  depths: Sequence[float], sep: str = " ", pad: int = 0) -> Placed:
    """``prefix`` + the units with each needle (+ ``sep``) at the unit boundary nearest its
    depth (ties: the earlier boundary; needles at one boundary keep their order).

    ``pad`` spaces extend the last unit (before its closing newlines, so a needle after it
    still starts a line).
    Depth is measured in haystack bytes (units and padding, needles excluded).
    """
    units = list(units)
    if pad and units:  # spaces before the last unit's closing newlines
        last = units[-1].rstrip("\n")
        units[-1] = last + " " * pad + units[-1][len(last):]
    elif pad:
        units = [" " * pad]
    sizes = [len(u.encode()) for u in units]
    bounds = np.cumsum([0] + sizes)
    total = int(bounds[-1])
    where = [int(np.argmin(np.abs(bounds - d * total))) for d in depths]
    order = sorted(range(len(needles)), key=lambda j: (where[j], j))
    parts, offsets, size, upto = [prefix], [0] * len(needles), len(prefix.encode()), 0
    for j in order:
        chunk = "".join(units[upto:where[j]])
        parts.append(chunk)
        size += int(bounds[where[j]] - bounds[upto])
        upto = where[j]
        offsets[j] = size
        parts.append(needles[j] + sep)
        size += len((needles[j] + sep).encode())
    parts.append("".join(units[upto:]))
    realised = tuple(float(bounds[w]) / total if total else 0.0 for w in where)
    return Placed("".join(parts), tuple(offsets), realised, total)


def _tokens(tok: TokenCounter, prompt: str, answer: str) -> int:
    return tok.count(prompt) + tok.count(answer)


def fit_length(render: Callable[[int, int], tuple[str, str, Any]], length: int,
               tokenizer=None, *, name: str = "generate", probe: int = 16
               ) -> tuple[int, int, tuple[str, str, Any]]:
    """The largest unit count ``k`` (then the most padding) whose render fits ``length``.

    ``render(k, pad) -> (prompt, answer, extra)`` builds a sample from ``k`` haystack units
    and ``pad`` padding spaces; its size is ``tokens(prompt) + tokens(answer)``, assumed
    nondecreasing in ``k``. The search interpolates on full token counts (a bisection step
    every other step), so it needs a handful of encodings.

    Returns ``(k, pad, render(k, pad))``. Raises ``ValueError`` when even ``k = 0`` is over.
    """
    tok = as_tokenizer(tokenizer)
    memo: dict[int, int] = {}

    def size(k: int) -> int:
        if k not in memo:
            memo[k] = _tokens(tok, *render(k, 0)[:2])
        return memo[k]

    base = size(0)
    if base > length:
        raise ValueError(f"{name}: length {length} is too short: the template, needles and "
                         f"answer take {base} tokens of {tok.name}")
    lo, hi = 0, None  # size(lo) <= length < size(hi)
    k, step = probe, 0
    while hi is None or hi - lo > 1:
        if hi is not None:
            k = min(max(k, lo + 1), hi - 1)
            if step % 2:
                k = (lo + hi) // 2
        if size(k) <= length:
            lo = k
        else:
            hi = k
        rate = max((size(k) - base) / max(k, 1), 1e-3)
        k = lo + max(1, int((length - size(lo)) / rate))
        if hi is None:
            k = max(k, 2 * lo)
        step += 1
    pad, best = 0, size(lo)
    for _ in range(6):  # pad with spaces: exact for bytes, a few tries otherwise
        if best >= length:
            break
        trial = pad + (length - best)
        n = _tokens(tok, *render(lo, trial)[:2])
        if n <= length and n > best:
            pad, best = trial, n
        elif n == best:
            break  # spaces cost no tokens
        else:
            trial = pad + max(1, (length - best) // 2)
            n = _tokens(tok, *render(lo, trial)[:2])
            if n > length or n <= best:
                break
            pad, best = trial, n
    return lo, pad, render(lo, pad)


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


def join_query(keys: Sequence[str]) -> str:
    """``"a"``, ``"a, and b"``, ``"a, b, and c"``: how a question lists its keys."""
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]


def _top_up(units: list[str], pool: Pool, k: int, render_units, length: int,
            tok: TokenCounter, tries: int = 48):
    """Append later pool units (after unit ``k``, which did not fit) while the sample stays
    within ``length``: for tokenizers where padding spaces cost nothing. Returns (units,
    how many were skipped, the render)."""
    units, best = list(units), render_units(units, 0)
    size, skipped = _tokens(tok, *best[:2]), 1
    for j in range(k + 1, k + 1 + tries):
        if size >= length:
            break
        trial = render_units(units + [pool.take(j + 1)[j]], 0)
        n = _tokens(tok, *trial[:2])
        if n <= length:
            units, best, size = units + [pool.take(j + 1)[j]], trial, n
        else:
            skipped += 1
    return units, (skipped if len(units) > k else 0), best


def needle_sample(task: str, length: int, tokenizer, *, prefix: str, question: str,
                   answer_of: Callable[[Placed], tuple[tuple[bytes, ...], bytes]],
                   pool: Pool, sep: str, needles: Sequence[str], depths: Sequence[float],
                   num_targets: int, info: dict) -> Sample:
    """A :class:`Sample` of ``prefix`` + haystack units of ``pool`` with ``needles`` (+ ``sep``)
    at ``depths`` + ``question``, fitted to ``length`` tokens (:func:`fit_length`, then
    padding or later units); ``answer_of(placed) -> (references, answer bytes)``."""
    tok = as_tokenizer(tokenizer)

    def render_units(units, pad):
        placed = place_needles(prefix, units, needles, depths, sep, pad)
        refs, answer = answer_of(placed)
        return placed.text + question, answer.decode(), (placed, refs)

    k, pad, best = fit_length(lambda k, pad: render_units(pool.take(k), pad), length, tok,
                              name=task)
    units, skipped = pool.take(k), 0
    if _tokens(tok, *best[:2]) < length and pad == 0:
        units, skipped, best = _top_up(units, pool, k, render_units, length, tok)
    prompt, answer, (placed, refs) = best
    return Sample(prompt.encode(), answer.encode(), refs, task, _tokens(tok, prompt, answer),
                  placed.haystack_bytes, placed.depths, placed.offsets,
                  tuple(n.encode() for n in needles), num_targets,
                  {**info, "requested_depths": tuple(depths), "units": len(units),
                   "skipped_units": skipped, "padding": pad},
                  tok.name, question.encode())


# --- tasks: needle in a haystack, variable tracking -----------------------------------------


def niah(seed, length: int, *, num_keys: int = 1, num_values: int = 1, num_queries: int = 1,
         key_type: str = "words", value_type: str = "numbers", value_digits: int = 7,
         haystack_kind: str = "noise", depth: float | Sequence[float] | None = None,
         needle: str = NEEDLE, prefix: str = NIAH_PREFIX, question: str = NIAH_QUESTION,
         type_name: str | None = None, tokenizer=None) -> Sample:
    """A needle-in-a-haystack sample of ``length`` tokens (prompt + answer; see the module
    docstring: exact for bytes, within a unit otherwise).

    Args:
      seed: int or ``np.random.Generator``.
      length: tokens of prompt + answer.
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
      tokenizer: what ``length`` counts (:func:`lcjax.data.suites.as_tokenizer`).

    Returns:
      a :class:`Sample`; ``answer`` is the asked values joined by ", ": key by key in query
      order, each key's values in their order of appearance in the prompt.
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
    needles = [needle.format(type=type_name, key=k, value=v) for k, v in pairs]
    query = join_query(queried)
    depths = _needle_depths(rng, depth, len(needles), name)
    pool, sep = haystack_pool(haystack_kind, rng, exclude_keys=keys, key_type=key_type,
                              value_type=value_type, value_digits=value_digits,
                              type_name=type_name, needle=needle)
    n_targets = len(queried) * num_values

    def answer_of(placed: Placed):
        refs = []
        for i in range(len(queried)):
            js = range(i * num_values, (i + 1) * num_values)
            refs += [pairs[j][1].encode() for j in sorted(js, key=lambda j: placed.offsets[j])]
        return tuple(refs), b", ".join(refs)

    return needle_sample(
        name, length, tokenizer, prefix=prefix.format(type=type_name, query=query),
        question=question.format(type=type_name, query=query), answer_of=answer_of,
        pool=pool, sep=sep, needles=needles, depths=depths, num_targets=n_targets,
        info={"keys": tuple(keys), "queries": tuple(queried),
              "values": {k: tuple(v) for k, v in values.items()}, "haystack": haystack_kind})


def variable_tracking(seed, length: int, *, num_chains: int = 1, num_hops: int = 4,
                      var_len: int = 5, value_digits: int = 5, haystack_kind: str = "noise",
                      depth: float | Sequence[float] | None = None, prefix: str = VT_PREFIX,
                      question: str = VT_QUESTION, tokenizer=None) -> Sample:
    """A variable-tracking sample of ``length`` tokens (prompt + answer).

    Chain c: ``VAR X0 = <value>.``, ``VAR X1 = VAR X0.``, ..., ``VAR X{hops} = VAR X{hops-1}.``
    (names of ``var_len`` capital letters, values of ``value_digits`` digits, all distinct),
    each chain's statements in order in the haystack; chain 0 is asked for and the answer is
    its ``num_hops + 1`` names joined by " ".

    Args:
      depth: None (each chain at sorted uniform depths), a number (chain 0's first statement
        there, its later statements at sorted uniform depths after it) or one depth per
        statement, chain by chain (chain 0 first), nondecreasing within each chain.
      prefix, question: templates; ``question`` takes ``{value}`` and ``{num}``.
      tokenizer: what ``length`` counts.
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
        needles.append(f"VAR {chain[0]} = {val}.")
        needles += [f"VAR {b} = VAR {a}." for a, b in zip(chain, chain[1:])]
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
    pool, sep = haystack_pool(haystack_kind, rng)
    return needle_sample(
        "vt", length, tokenizer, prefix=prefix,
        question=question.format(value=vals[0], num=per),
        answer_of=lambda placed: (refs, b" ".join(refs)), pool=pool, sep=sep,
        needles=needles, depths=depths, num_targets=per,
        info={"chains": tuple(tuple(c) for c in chains), "values": tuple(vals),
              "haystack": haystack_kind})


# --- tasks: common and frequent words extraction -------------------------------------------


@functools.cache
def _corpus_words() -> tuple[str, ...]:
    """Distinct lowercase alphabetic words (4-10 letters) of the Shakespeare corpus, sorted."""
    words = set()
    for d in load_shakespeare():
        words.update(re.findall(r"\b[a-z]{4,10}\b", d.text))
    return tuple(sorted(words))


def _numbered(words: Sequence[str], pad: int) -> str:
    body = " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))
    return body + " " * pad


def common_words(seed, length: int, *, num_words: int = 10, freq_common: int | None = None,
                 freq_rare: int = 3, prefix: str = CWE_PREFIX, question: str = CWE_QUESTION,
                 tokenizer=None) -> Sample:
    """RULER's common words extraction at ``length`` tokens.

    A numbered list ``1. word 2. word ...`` (shuffled) holds ``num_words`` common words
    ``freq_common`` times each and as many other words as fit ``freq_rare`` times each
    (all distinct words of the Shakespeare corpus). ``freq_common`` None: RULER's 30, or
    less when the common words would take over half the length (at least
    ``freq_rare + 1``). So rank ``num_words`` beats rank ``num_words + 1`` by
    ``freq_common - freq_rare >= 1`` occurrences. The answer lists the common words in their
    order of first appearance.
    """
    name = "cwe"
    if num_words < 1 or freq_rare < 1:
        raise ValueError(f"{name}: need num_words >= 1 and freq_rare >= 1, got "
                         f"{num_words}, {freq_rare}")
    if freq_common is not None and freq_common <= freq_rare:
        raise ValueError(f"{name}: freq_common ({freq_common}) must exceed freq_rare "
                         f"({freq_rare})")
    tok = as_tokenizer(tokenizer)
    rng = _rng(seed)
    vocab = _corpus_words()
    order = rng.permutation(len(vocab))
    common = [vocab[i] for i in order[:num_words]]
    rare = [vocab[i] for i in order[num_words:]]
    shuffle_seed = _subseed(rng)
    pre, post = prefix, question.format(num=num_words)
    if freq_common is None:
        per_item = tok.count(_numbered(common * 3, 0)) / (3 * num_words)
        fit = int(0.5 * length / (per_item * num_words))
        freq_common = int(np.clip(fit, freq_rare + 1, 30))

    def render(k, pad):
        if k > len(rare):
            raise ValueError(f"{name}: length {length} needs more than {len(rare)} words")
        items = common * freq_common + rare[:k] * freq_rare
        perm = np.random.default_rng([shuffle_seed, k]).permutation(len(items))
        words = [items[i] for i in perm]
        first = sorted(common, key=words.index)
        refs = tuple(w.encode() for w in first)
        return pre + _numbered(words, pad) + post, ", ".join(first), (refs, len(words))

    k, pad, (prompt, answer, (refs, n_items)) = fit_length(render, length, tok, name=name)
    ctx = len(prompt.encode()) - len(pre.encode()) - len(post.encode())
    return Sample(prompt.encode(), answer.encode(), refs, name, _tokens(tok, prompt, answer),
                  ctx, (), (), (), len(refs),
                  {"common": tuple(common), "freq_common": freq_common, "freq_rare": freq_rare,
                   "num_rare": k, "items": n_items, "units": k, "padding": pad},
                  tok.name, post.encode())


def _zipf_counts(n: int, num_words: int, alpha: float) -> list[int] | None:
    """Counts of ``n`` words whose rank r >= 1 has about ``n r^-alpha / zeta`` occurrences,
    strictly decreasing over ranks 1..num_words+2, the rest of ``n`` as singletons; None
    when ``n`` is too small for that."""
    ranks = np.arange(1, n + 1, dtype=float)
    weights = ranks ** -alpha
    expected = np.floor(n * weights / weights.sum()).astype(int)
    top = num_words + 2
    counts = [max(int(c), 2) for c in expected[:top]] + [int(c) for c in expected[top:]
                                                         if c >= 2]
    for r in range(top - 2, -1, -1):  # strict margins down the top ranks
        counts[r] = max(counts[r], counts[r + 1] + 1)
    rest = n - sum(counts)
    return None if rest < 0 else counts + [1] * rest


def _fewest_words(num_words: int, alpha: float) -> int:
    n = (num_words + 2) * (num_words + 5) // 2
    while _zipf_counts(n, num_words, alpha) is None:
        n += 1
    return n


def frequent_words(seed, length: int, *, num_words: int = 3, alpha: float = 2.0,
                   prefix: str = FWE_PREFIX, question: str = FWE_QUESTION,
                   tokenizer=None) -> Sample:
    """RULER's frequent words extraction at ``length`` tokens.

    Coded text: made-up lowercase words with Zipf(``alpha``) counts, shuffled and joined by
    spaces; the most frequent "word" is :data:`FWE_NOISE` (``....``), which the question says
    to ignore. The answer is the next ``num_words`` words, most frequent first; counts are
    strictly decreasing from rank 1 to rank ``num_words + 2``, so there is no tie to break.
    """
    name = "fwe"
    if num_words < 1 or alpha <= 1.0:
        raise ValueError(f"{name}: need num_words >= 1 and alpha > 1, got {num_words}, {alpha}")
    tok = as_tokenizer(tokenizer)
    rng = _rng(seed)
    vocab_seed = _subseed(rng)
    coded = Pool(_fresh_words(vocab_seed, "coded", {FWE_NOISE}))
    pre, post = prefix.format(num=num_words), question.format(num=num_words)
    floor = _fewest_words(num_words, alpha)

    def render(k, pad):
        n = floor + k
        counts = _zipf_counts(n, num_words, alpha)
        words = [FWE_NOISE] + coded.take(len(counts) - 1)
        items = [w for w, c in zip(words, counts) for _ in range(c)]
        text = " ".join(items[i] for i in np.random.default_rng([vocab_seed, n]).permutation(n))
        answers = words[1:num_words + 1]
        return (pre + text + " " * pad + post, ", ".join(answers),
                (tuple(a.encode() for a in answers), counts[:num_words + 2]))

    k, pad, (prompt, answer, (refs, top)) = fit_length(render, length, tok, name=name)
    ctx = len(prompt.encode()) - len(pre.encode()) - len(post.encode())
    return Sample(prompt.encode(), answer.encode(), refs, name, _tokens(tok, prompt, answer),
                  ctx, (), (), (), len(refs),
                  {"words": floor + k, "top_counts": tuple(top), "alpha": alpha, "units": k,
                   "padding": pad}, tok.name, post.encode())


# --- tasks: question answering over the corpus ---------------------------------------------

_SPEECH = re.compile(r"^([A-Z][A-Z' ]{1,30}[A-Z])\.\n((?:[^\n\[]+\n)+)\n", re.M)


@functools.cache
def speeches() -> tuple[tuple[str, str, str], ...]:
    """``(speaker, work title, text)`` of the corpus's speeches by speakers named in one work.

    From the modern editions (``SPEAKER.`` on its own line, then the lines of the speech);
    speakers whose name also speaks in another work, or that are numbered or generic
    (``FIRST LORD``, ``ALL``), are left out, so each name names one work. Speeches keep at
    most their first three lines, joined by spaces.
    """
    found = []
    for d in load_shakespeare():
        if d.folio:
            continue
        for who, body in _SPEECH.findall(d.text):
            lines = [ln.strip() for ln in body.strip("\n").split("\n")][:3]
            found.append((who, d.title, " ".join(ln for ln in lines if ln)))
    works: dict[str, set[str]] = {}
    for who, title, _ in found:
        works.setdefault(who, set()).add(title)
    generic = re.compile(r"\b(FIRST|SECOND|THIRD|FOURTH|FIFTH|ALL|BOTH|LORDS?|SERVANTS?|"
                         r"CITIZENS?|SOLDIERS?|MESSENGER|GENTLEMAN|LADY|BOY|PAGE)\b")
    return tuple((who.title(), title, text) for who, title, text in found
                 if len(works[who]) == 1 and not generic.search(who) and len(text) >= 20)


def _speech_doc(who: str, text: str) -> str:
    return f"[{who}] {text}\n\n"


def _cast_doc(who: str, title: str) -> str:
    return f"{who} is a character in {title}.\n\n"


def _qa_distractors(seed: int, exclude: set[str], hops: int) -> Iterator[str]:
    """Speech documents (and, for two hops, each speaker's cast note) of speakers not in
    ``exclude`` (updated), in random order."""
    rng = np.random.default_rng(seed)
    docs = speeches()
    for i in rng.permutation(len(docs)):
        who, title, text = docs[i]
        if who in exclude:
            continue
        exclude.add(who)
        yield _speech_doc(who, text)
        if hops == 2:
            yield _cast_doc(who, title)


def qa(seed, length: int, *, hops: int = 2, depth: float | Sequence[float] | None = None,
       prefix: str = QA_PREFIX, question: str | None = None, tokenizer=None) -> Sample:
    """A RULER-style QA sample built from the Shakespeare corpus, at ``length`` tokens.

    Documents are speeches ``[Speaker] text`` (:func:`speeches`; distinct speakers) and, for
    ``hops=2``, one cast note ``Speaker is a character in Title.`` per speaker. The question
    quotes the first line of the gold speech (unique in the prompt). ``hops=1``: "Who speaks
    the line ...?" (answer: the speaker). ``hops=2`` (HotpotQA-style bridge): "In which work
    is the speaker of the line ... a character?" — find the speech, then the cast note of
    its speaker (answer: the work's title). Gold documents are the needles (speech first,
    then the cast note) at ``depth`` (None: uniform; a number: the speech there; one per
    gold document); the distractor documents are the haystack units.
    """
    name = "qa"
    if hops not in QA_QUESTIONS:
        raise ValueError(f"{name}: hops must be 1 or 2, got {hops}")
    rng = _rng(seed)
    docs = speeches()
    who, title, text = docs[int(rng.integers(len(docs)))]
    quote = text.split("  ")[0]
    words = quote.split()
    quote = " ".join(words[:12])
    needles = [_speech_doc(who, text).rstrip("\n")]
    if hops == 2:
        needles.append(_cast_doc(who, title).rstrip("\n"))
    depths = _needle_depths(rng, depth, len(needles), name)
    exclude = {who}
    pool = Pool(doc for doc in _qa_distractors(_subseed(rng), exclude, hops)
                if quote not in doc)
    answer = who if hops == 1 else title
    post = (question or QA_QUESTIONS[hops]).format(quote=quote)
    refs = (answer.encode(),)
    return needle_sample(
        f"qa_{hops}", length, tokenizer, prefix=prefix, question=post,
        answer_of=lambda placed: (refs, refs[0]), pool=pool, sep="\n\n", needles=needles,
        depths=depths, num_targets=len(needles),
        info={"speaker": who, "work": title, "quote": quote, "hops": hops})


# --- the task set and the suite -------------------------------------------------------------

GENERATORS: dict[str, Callable[..., Sample]] = {
    "niah": niah, "vt": variable_tracking, "cwe": common_words, "fwe": frequent_words,
    "qa": qa,
}

# RULER's 13 tasks (names as in NVIDIA/RULER's synthetic.yaml): (generator, keywords), with
# our haystacks and our corpus QA in place of SQuAD (qa_1) and HotpotQA (qa_2).
SUITE: tuple[SuiteTask, ...] = (
    SuiteTask("niah_single_1", "niah", dict(haystack_kind="noise")),
    SuiteTask("niah_single_2", "niah", dict(haystack_kind="essay")),
    SuiteTask("niah_single_3", "niah", dict(haystack_kind="essay", value_type="uuids")),
    SuiteTask("niah_multikey_1", "niah", dict(haystack_kind="essay", num_keys=4)),
    SuiteTask("niah_multikey_2", "niah", dict(haystack_kind="needle")),
    SuiteTask("niah_multikey_3", "niah", dict(haystack_kind="needle", key_type="uuids",
                                              value_type="uuids")),
    SuiteTask("niah_multivalue", "niah", dict(haystack_kind="essay", num_values=4)),
    SuiteTask("niah_multiquery", "niah", dict(haystack_kind="essay", num_keys=4,
                                              num_queries=4)),
    SuiteTask("vt", "vt", dict(num_chains=1, num_hops=4)),
    SuiteTask("cwe", "cwe", dict(num_words=10), uses_depth=False),
    SuiteTask("fwe", "fwe", dict(num_words=3, alpha=2.0), uses_depth=False),
    SuiteTask("qa_1", "qa", dict(hops=1)),
    SuiteTask("qa_2", "qa", dict(hops=2)),
)
TASKS: dict[str, tuple[Callable[..., Sample], dict]] = {
    t.name: (GENERATORS[t.task], dict(t.overrides)) for t in SUITE}


def generate(task: str, seed, length: int, *, tokenizer=None, **overrides) -> Sample:
    """One sample of a task: a name of :data:`TASKS` (RULER's) or a generator of
    :data:`GENERATORS` (``overrides`` replace its keywords); ``length`` in tokens of
    ``tokenizer``."""
    if task in TASKS:
        fn, kwargs = TASKS[task]
    elif task in GENERATORS:
        fn, kwargs = GENERATORS[task], {}
    else:
        raise ValueError(f"generate: unknown task {task!r}; known: "
                         f"{sorted(TASKS) + sorted(GENERATORS)}")
    return fn(seed, length, tokenizer=tokenizer, **{**kwargs, **overrides})


def generate_many(task: str, seed: int, length: int, n: int, **overrides) -> list[Sample]:
    """``n`` samples; sample i uses seed ``(seed, i)`` so any prefix of the list is stable."""
    return [generate(task, np.random.default_rng([seed, i]), length, **overrides)
            for i in range(n)]


def suite() -> Suite:
    """The RULER suite: :data:`SUITE` over :func:`generate` (registered as ``"ruler"``)."""
    return Suite("ruler", generate, SUITE)


# --- batches and metrics --------------------------------------------------------------------


def answer_rows(prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]],
                seq_len: int | None = None) -> dict[str, np.ndarray]:
    """Teacher-forcing rows of token sequences: row b is ``prompts[b] + answers[b]`` (token
    ids, specials included as given) split into ``inputs = seq[:-1]``, ``targets = seq[1:]``,
    right-padded with PAD to ``seq_len`` (default: the longest row).

    Returns:
      ``inputs``, ``targets``: int32 ``[B, T]``; ``loss_mask``: bool ``[B, T]``, True exactly
      where the target is an answer token (positions ``len(prompt) - 1`` to
      ``len(prompt) + len(answer) - 2``; none for an empty answer); ``answer_start``: int32
      ``[B]``, the first such position; ``answer_len``: int32 ``[B]``, their number.
    """
    if not len(prompts) or len(prompts) != len(answers):
        raise ValueError(f"answer_rows: need as many prompts as answers (>= 1), got "
                         f"{len(prompts)} and {len(answers)}")
    rows = [(np.asarray(p, np.int32).reshape(-1), np.asarray(a, np.int32).reshape(-1))
            for p, a in zip(prompts, answers)]
    if any(len(p) == 0 for p, _ in rows):
        raise ValueError("answer_rows: every prompt needs at least one token (the first "
                         "target is predicted from it)")
    longest = max(len(p) + len(a) - 1 for p, a in rows)
    t = longest if seq_len is None else seq_len
    if t < longest:
        raise ValueError(f"answer_rows: a row needs {longest} positions, seq_len is {seq_len}")
    b = len(rows)
    inputs = np.full((b, t), PAD, np.int32)
    targets = np.full((b, t), PAD, np.int32)
    mask = np.zeros((b, t), bool)
    start = np.zeros(b, np.int32)
    count = np.zeros(b, np.int32)
    for i, (p, a) in enumerate(rows):
        seq = np.concatenate([p, a])
        inputs[i, :len(seq) - 1] = seq[:-1]
        targets[i, :len(seq) - 1] = seq[1:]
        mask[i, len(p) - 1:len(seq) - 1] = True
        start[i], count[i] = len(p) - 1, len(a)
    return {"inputs": inputs, "targets": targets, "loss_mask": mask, "answer_start": start,
            "answer_len": count}


def make_batch(samples: Sequence[Sample], seq_len: int | None = None, *, bos: bool = True,
               eos: bool = False) -> dict[str, np.ndarray]:
    """Byte-token arrays for next-token training/evaluation on ``samples``.

    Row b is ``[BOS]? + prompt + answer + [EOS]?`` split into ``inputs = seq[:-1]``,
    ``targets = seq[1:]``, right-padded with PAD to ``seq_len`` (default: the longest row):
    :func:`answer_rows` of the byte tokens.

    Returns:
      ``inputs``, ``targets``: int32 ``[B, T]``; ``loss_mask``: bool ``[B, T]``, True where
      the target is an answer byte (or the EOS after it); ``answer_start``: int32 ``[B]``,
      the first such position; ``answer_len``: int32 ``[B]``, the number of such positions.
    """
    if not samples:
        raise ValueError("make_batch: `samples` is empty")
    byte_ids = lambda b: np.frombuffer(b, np.uint8).astype(np.int32)
    prompts = [np.concatenate([[BOS]] * bos + [byte_ids(s.prompt)]) for s in samples]
    answers = [np.concatenate([byte_ids(s.answer)] + [[EOS]] * eos) for s in samples]
    try:
        return answer_rows(prompts, answers, seq_len)
    except ValueError as e:
        raise ValueError(f"make_batch: {str(e).removeprefix('answer_rows: ')}") from None


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
