"""MGAL-style items: multilingual, granularity- and position-aware long-document tasks.

Our own generator after the task design of MGAL (the ICML 2026 MGAL paper: long documents in several
languages, tasks at word / sentence / paragraph / document granularity, each item tagged
with its position at document and at paragraph level; "local semantic crowding" and
fluency-versus-consistency findings). MGAL's data is not public, so items are built from any
:class:`lcjax.data.parallel.ParallelCorpus` (the real one: Debian Reference,
``parallel.load_debian_reference``).

**Context.** For a language and a token budget ``L`` (tokens of ``tokenizer``, UTF-8 bytes
when None) the context is a run of whole sections of that language's document, rendered
``"## heading\\n\\n" + paragraphs joined by "\\n\\n"``, starting at a seeded section and
continuing cyclically (the document is concatenated with its own beginning, no section
twice) while it fits; the section that does not fit is cut after its last fitting paragraph.
A document shorter than ``L`` gives its whole text.

**Tasks** (``item.task``), every one solvable from the context alone; the generator rejects a
draw whose evidence is not unique in the context:

* word — ``cloze``: a sentence of the context quoted with one word masked (``____``); the
  answer is the word (an ASCII term or a CJK character pair in ja / zh).
* sentence — ``gap``: ``prev [GAP] next`` quoted (consecutive sentences of one section,
  possibly across a paragraph break); the answer is the sentence between them.
  ``order``: three sentences of one paragraph, shuffled as A/B/C; the answer is their
  document order (``"B, A, C"``). ``role``: the discourse role of a sentence derived from
  structure — ``background`` (its section's first paragraph), ``method`` (a middle one),
  ``outcome`` (the last one).
* paragraph — ``probe``: the aligned paragraph in another language (the pivot, or for the
  pivot the next language) is given; the answer is the first sentence of its translation
  in the context. The entities the probe shares with its translation (technical terms,
  names, numbers) occur together in no other paragraph of the context. ``summary``: a
  keyword summary (the rarest words of the paragraph, which
  no other paragraph of the context contains together); the answer is its first sentence.
* document — ``next_heading``: which heading follows a given one; ``which_section``: which
  section discusses a term that occurs in that section only.

**Tags.** ``position_doc`` is the third of the context (begin / middle / end) holding the
start ``s`` of ``answer_span = (s, e)``: ``begin`` if ``s < |context| / 3``, ``middle`` if
``s < 2 |context| / 3``, else ``end``; ``position_para`` is the same rule inside the paragraph
(or heading line) holding ``s``. Every cell (language × length × granularity × position_doc)
gets exactly ``n_per_cell`` items; within a cell item ``i`` takes task ``i mod #tasks`` and
format ``(i // #tasks) mod 3`` of (open, multiple choice, crowded multiple choice), so
``n_per_cell = 9`` covers every task × format of every granularity.

**Crowding.** A crowded item's distractor options are sentences of neighbouring paragraphs
(at most ``CROWD_WINDOW`` paragraphs away) that share at least one entity (:func:`entities`)
with the gold option; plain ones from any other paragraph of the context. Crowding
applies to the tasks whose options are sentences (gap, probe, summary); the others' crowded
format is plain multiple choice (``crowded`` False).

``answer_span`` is the gold evidence: the answer text itself for cloze, gap, probe, summary,
next_heading (``context[s:e] == answer``, or the gold option); the quoted sentence for role;
the three sentences (first start to last end) for order; the term's first occurrence for
which_section. A multiple-choice ``answer`` is the 0-based index into ``options``.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import zlib
from collections.abc import Sequence

import numpy as np

from lcjax.data.parallel import ParallelCorpus
from lcjax.data.ruler import Sample
from lcjax.data.suites import TokenCounter, as_tokenizer

__all__ = [
    "CJK_LANGS",
    "CROWD_WINDOW",
    "FORMATS",
    "GRANULARITIES",
    "POSITIONS",
    "ROLES",
    "TASKS",
    "MgalItem",
    "depth_position",
    "entities",
    "format_prompt",
    "generate",
    "position_of",
    "sample",
]

GRANULARITIES = ("word", "sentence", "paragraph", "document")
POSITIONS = ("begin", "middle", "end")
TASKS = {"word": ("cloze",), "sentence": ("gap", "order", "role"),
         "paragraph": ("probe", "summary"), "document": ("next_heading", "which_section")}
FORMATS = ("open", "mc", "mc_crowded")
ROLES = ("background", "method", "outcome")
CJK_LANGS = ("ja", "zh-cn", "zh-tw")
CROWD_WINDOW = 4
NUM_OPTIONS = 4
MAX_TRIES = 200
NEW_CONTEXT_EVERY = 10


@dataclasses.dataclass(frozen=True)
class MgalItem:
    """One item. ``options`` is None for an open question; then ``answer`` is the answer
    text, else the 0-based index of the gold option. ``answer_span`` is ``(start, end)``
    character offsets of the gold evidence in ``context``; ``length_bucket`` the token
    budget of the context; ``task`` one of :data:`TASKS`' names."""

    language: str
    granularity: str
    position_doc: str
    position_para: str
    length_bucket: int
    context: str
    question: str
    options: tuple[str, ...] | None
    answer: int | str
    answer_span: tuple[int, int]
    crowded: bool
    task: str


def format_prompt(item: MgalItem, *, reply: str = "letter") -> str:
    """Context, question and lettered options (``A. …``) as one prompt. The expected reply is
    the answer text, and for multiple choice the option's letter (``reply="letter"``) or
    the option's text (``reply="text"``, what the ``mgal`` suite's string match checks)."""
    if reply not in ("letter", "text"):
        raise ValueError(f"format_prompt: reply must be 'letter' or 'text', got {reply!r}")
    parts = [item.context, "", item.question]
    if item.options is not None:
        parts += [f"{chr(65 + i)}. {o}" for i, o in enumerate(item.options)]
        parts.append("Answer with the letter of the correct option." if reply == "letter"
                     else "Answer by copying the text of the correct option.")
    return "\n".join(parts) + "\nAnswer:"


def position_of(offset: int, start: int, end: int) -> str:
    """``begin`` / ``middle`` / ``end``: the third of ``[start, end)`` holding ``offset``."""
    if not start <= offset < max(end, start + 1):
        raise ValueError(f"position_of: offset {offset} outside [{start}, {end})")
    frac = (offset - start) / max(end - start, 1)
    return POSITIONS[0] if frac < 1 / 3 else POSITIONS[1] if frac < 2 / 3 else POSITIONS[2]


# --- entities and words ---------------------------------------------------------------------

_ASCII_TOKEN = re.compile(
    r"(?<![A-Za-z0-9_])[A-Za-z0-9][A-Za-z0-9_+/-]*[A-Za-z0-9](?![A-Za-z0-9_])")
_SENT_START = re.compile(r"(?:^|[.!?:;。！？]\s*)$")
_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_PAIR = re.compile(f"(?=([{_CJK}]{{2}}))")
_WORD = re.compile(r"(?<!\w)[^\W\d_]{4,}(?!\w)")


def entities(text: str) -> set[str]:
    """Named things of a text in any language: ASCII tokens with a digit, one of ``_+/-``,
    an inner capital or two capitals (``apt-get``, ``IPv6``, ``GNU``), and capitalised ASCII
    words (3+ letters) not at a sentence start. Technical terms survive translation, so the
    sets of aligned paragraphs overlap across languages."""
    out = set()
    for m in _ASCII_TOKEN.finditer(text):
        tok = m.group()
        technical = (any(c.isdigit() or c in "_+/-" for c in tok)
                     or any(c.isupper() for c in tok[1:]))
        capitalised = (tok[0].isupper() and len(tok) >= 3
                       and not _SENT_START.search(text[:m.start()]))
        if technical or capitalised:
            out.add(tok)
    return out


def _cloze_words(sentence: str, lang: str) -> list[tuple[int, int]]:
    """Spans of maskable words: ASCII terms (3+ chars) and, for ja / zh, CJK character
    pairs; other languages' words of 4+ letters."""
    spans = [m.span() for m in _ASCII_TOKEN.finditer(sentence) if len(m.group()) >= 3]
    if lang in CJK_LANGS:
        spans += [(m.start(1), m.end(1)) for m in _CJK_PAIR.finditer(sentence)]
    else:
        spans += [m.span() for m in _WORD.finditer(sentence)]
    return sorted(set(spans))


def _keywords(paragraph: str, lang: str) -> list[str]:
    if lang in CJK_LANGS:
        words = [m.group() for m in _ASCII_TOKEN.finditer(paragraph) if len(m.group()) >= 3]
        words += [m.group(1) for m in _CJK_PAIR.finditer(paragraph)]
    else:
        words = _WORD.findall(paragraph) + [m.group() for m in _ASCII_TOKEN.finditer(paragraph)
                                            if len(m.group()) >= 3]
    return list(dict.fromkeys(words))


# --- context ---------------------------------------------------------------------------------


@dataclasses.dataclass
class _Para:
    start: int
    end: int
    section: int
    key: tuple[str, int]
    sentences: list[tuple[int, int]]  # stripped sentence spans in context


@dataclasses.dataclass
class _Sec:
    heading: str
    start: int  # of the heading text (after "## ")
    end: int
    paras: list[int]
    complete: bool


@dataclasses.dataclass
class _Context:
    text: str
    paras: list[_Para]
    secs: list[_Sec]
    lang: str

    def para_at(self, offset: int) -> tuple[int, int]:
        """(start, end) of the paragraph or heading line holding ``offset``."""
        for p in self.paras:
            if p.start <= offset < p.end:
                return p.start, p.end
        for s in self.secs:
            if s.start <= offset < s.end:
                return s.start, s.end
        raise ValueError(f"offset {offset} is in no paragraph or heading")

    def sentence(self, pi: int, si: int) -> str:
        s, e = self.paras[pi].sentences[si]
        return self.text[s:e]

    def unique(self, s: str) -> bool:
        return bool(s) and self.text.count(s) == 1

    def entities(self, s: str) -> set[str]:
        """:func:`entities` of ``s``, memoised per context."""
        cache = self.__dict__.setdefault("_entities", {})
        if s not in cache:
            cache[s] = entities(s)
        return cache[s]


def _piece_counts(corpus: ParallelCorpus, lang: str, counter: TokenCounter, cache: dict):
    key = (lang, counter.name, id(corpus))
    if key not in cache:
        cache[key] = [(counter.count(f"## {s.heading}"),
                       [counter.count(p.text) for p in s.paragraphs])
                      for s in corpus.documents[lang]]
    return cache[key]


def build_context(corpus: ParallelCorpus, lang: str, budget: int, start_section: int,
                  counter: TokenCounter, cache: dict | None = None) -> _Context:
    """The context of ``lang`` within ``budget`` tokens from section ``start_section`` on
    (cyclic, no section twice); see the module docstring."""
    cache = {} if cache is None else cache
    secs = corpus.documents[lang]
    counts = _piece_counts(corpus, lang, counter, cache)
    sep = counter.count("\n\n")
    keys_by_sec = {s.id: k for s, k in corpus.section_keys(lang)}
    pieces: list[str] = []
    pos, used = 0, 0
    paras, out_secs = [], []
    n = len(secs)
    for j in range(n):
        si = (start_section + j) % n
        sec = secs[si]
        hcount, pcounts = counts[si]
        need = hcount + (sep if pieces else 0)
        if used + need + (sep + pcounts[0] if pcounts else 0) > budget:
            break
        if pieces:
            pieces.append("\n\n")
            pos += 2
        pieces.append("## ")
        pos += 3
        h_start = pos
        pieces.append(sec.heading)
        pos += len(sec.heading)
        used += need
        rec = _Sec(sec.heading, h_start, pos, [], True)
        for k, (para, pc) in enumerate(zip(sec.paragraphs, pcounts)):
            if used + sep + pc > budget:
                rec.complete = False
                break
            pieces.append("\n\n")
            pos += 2
            p_start = pos
            spans, off = [], p_start
            for s in para.sentences:
                core = s.rstrip()
                if core.strip():
                    lead = len(core) - len(core.lstrip())
                    spans.append((off + lead, off + len(core)))
                off += len(s)
            pieces.append(para.text)
            pos += len(para.text)
            used += sep + pc
            rec.paras.append(len(paras))
            paras.append(_Para(p_start, pos, len(out_secs), keys_by_sec[sec.id][k], spans))
        out_secs.append(rec)
        if not rec.complete:
            break
    text = "".join(pieces)
    total = counter.count(text)
    while out_secs and total > budget:  # piecewise counts can undercount (merges across pieces)
        text, paras, out_secs = _trim(text, paras, out_secs, total - budget, counter)
        total = counter.count(text)
    return _Context(text, paras, out_secs, lang)


def _trim(text, paras, secs, excess, counter):
    """Drops trailing paragraphs (and then empty trailing sections) until their own token
    counts add up to at least ``excess``: one re-count of the context per call instead of
    one per dropped paragraph."""
    dropped = 0
    while secs and dropped < excess:
        if secs[-1].paras:
            last = paras.pop()
            secs[-1].paras.pop()
            secs[-1].complete = False
            cut = last.start - 2
        else:
            cut = max(secs[-1].start - 5, 0)
            secs.pop()
        dropped += max(counter.count(text[cut:]), 1)
        text = text[:cut]
    return text, paras, secs


# --- tasks -----------------------------------------------------------------------------------


@dataclasses.dataclass
class _Draw:
    question: str
    gold: str
    span: tuple[int, int]
    distractors: list[str] | None = None  # None: the task has no option pool of its own
    labels: tuple[str, ...] | None = None  # fixed option set (role)
    crowd_ok: bool = False


def _in_position(ctx: _Context, offset: int, position: str) -> bool:
    return position_of(offset, 0, len(ctx.text)) == position


def _sentence_pool(ctx: _Context, exclude: set[str], near: int | None, gold: str,
                   rng, crowded: bool, k: int) -> list[str] | None:
    """k distractor sentences: crowded ones from paragraphs within ``CROWD_WINDOW`` of
    paragraph ``near`` sharing an entity with ``gold``; plain ones from elsewhere."""
    gold_ents = ctx.entities(gold)
    cands = []
    for pi, p in enumerate(ctx.paras):
        close = near is not None and abs(pi - near) <= CROWD_WINDOW
        if (crowded and not close) or pi == near and not crowded:
            continue
        for s, e in p.sentences:
            sent = ctx.text[s:e]
            if sent in exclude or sent == gold:
                continue
            if crowded and not (ctx.entities(sent) & gold_ents):
                continue
            cands.append(sent)
    cands = list(dict.fromkeys(cands))
    if len(cands) < k:
        return None
    return [cands[i] for i in rng.choice(len(cands), size=k, replace=False)]


def _pick_sentence(ctx: _Context, rng, position: str):
    """(para index, sentence index) of a random sentence starting in ``position``."""
    cands = [(pi, si) for pi, p in enumerate(ctx.paras)
             for si, (s, _) in enumerate(p.sentences) if _in_position(ctx, s, position)]
    if not cands:
        return None
    return cands[rng.integers(len(cands))]


def _task_cloze(ctx, corpus, rng, position, crowded):
    pick = _pick_sentence(ctx, rng, position)
    if pick is None:
        return None
    pi, si = pick
    s0, e0 = ctx.paras[pi].sentences[si]
    sent = ctx.text[s0:e0]
    words = [(a, b) for a, b in _cloze_words(sent, ctx.lang) if a >= 3 and len(sent) - b >= 3
             and _in_position(ctx, s0 + a, position)]
    if not words or not ctx.unique(sent):
        return None
    a, b = words[rng.integers(len(words))]
    prefix, word, suffix = sent[:a], sent[a:b], sent[b:]
    pattern = re.compile(re.escape(prefix) + r"[^\n]+?" + re.escape(suffix))
    first = pattern.search(ctx.text)  # the quote must match only at the masked sentence
    if first is None or first.start() != s0 or len(pattern.findall(ctx.text)) != 1:
        return None
    pool = [ctx.text[s:e][x:y] for p in ctx.paras for s, e in p.sentences
            for x, y in _cloze_words(ctx.text[s:e], ctx.lang)]
    pool = [w for w in dict.fromkeys(pool) if w != word]
    if len(pool) < NUM_OPTIONS - 1:
        return None
    distract = [pool[i] for i in rng.choice(len(pool), NUM_OPTIONS - 1, replace=False)]
    q = ('Fill in the blank "____" of this sentence quoted from the document: '
         f'"{prefix}____{suffix}"')
    return _Draw(q, word, (s0 + a, s0 + b), distract)


def _section_flow(ctx: _Context) -> list[list[tuple[int, int]]]:
    """Per section, its sentences ``(para index, sentence index)`` in document order."""
    return [[(pi, si) for pi in sec.paras for si in range(len(ctx.paras[pi].sentences))]
            for sec in ctx.secs]


def _task_gap(ctx, corpus, rng, position, crowded):
    cands = [(flow[j - 1], flow[j], flow[j + 1]) for flow in _section_flow(ctx)
             for j in range(1, len(flow) - 1)
             if _in_position(ctx, ctx.paras[flow[j][0]].sentences[flow[j][1]][0], position)]
    if crowded:
        cands = [c for c in cands if ctx.entities(ctx.sentence(*c[1]))]
    if not cands:
        return None
    before, (pi, si), after = cands[rng.integers(len(cands))]
    prev, gold, nxt = ctx.sentence(*before), ctx.sentence(pi, si), ctx.sentence(*after)
    if not (ctx.unique(prev) and ctx.unique(gold)):
        return None
    pool = _sentence_pool(ctx, {prev, nxt}, pi, gold, rng, crowded, NUM_OPTIONS - 1)
    if pool is None:
        return None
    q = f'Which sentence fills [GAP] in this passage of the document? "{prev} [GAP] {nxt}"'
    return _Draw(q, gold, ctx.paras[pi].sentences[si], pool, crowd_ok=True)


def _task_order(ctx, corpus, rng, position, crowded):
    cands = [pi for pi, p in enumerate(ctx.paras) if len(p.sentences) >= 3
             and _in_position(ctx, p.sentences[0][0], position)]
    if not cands:
        return None
    pi = cands[rng.integers(len(cands))]
    idx = sorted(rng.choice(len(ctx.paras[pi].sentences), 3, replace=False).tolist())
    if not _in_position(ctx, ctx.paras[pi].sentences[idx[0]][0], position):
        return None
    sents = [ctx.sentence(pi, i) for i in idx]
    if not all(ctx.unique(s) for s in sents):
        return None
    perm = rng.permutation(3).tolist()  # shown[j] = sents[perm[j]]
    labels = "ABC"
    shown = " ".join(f'{labels[j]}: "{sents[perm[j]]}"' for j in range(3))
    gold = ", ".join(labels[perm.index(i)] for i in range(3))
    others = [", ".join(p) for p in itertools.permutations(labels) if ", ".join(p) != gold]
    distract = [others[i] for i in rng.choice(len(others), NUM_OPTIONS - 1, replace=False)]
    q = ("In which order do these sentences appear in the document? " + shown
         + ' Answer with the letters in document order, e.g. "B, A, C".')
    span = (ctx.paras[pi].sentences[idx[0]][0], ctx.paras[pi].sentences[idx[2]][1])
    return _Draw(q, gold, span, distract)


def _task_role(ctx, corpus, rng, position, crowded):
    cands = [(pi, si) for sec in ctx.secs if sec.complete and len(sec.paras) >= 3
             for pi in sec.paras for si, (s, _) in enumerate(ctx.paras[pi].sentences)
             if _in_position(ctx, s, position)]
    if not cands:
        return None
    pi, si = cands[rng.integers(len(cands))]
    sec = ctx.secs[ctx.paras[pi].section]
    k = sec.paras.index(pi)
    role = ROLES[0] if k == 0 else ROLES[2] if k == len(sec.paras) - 1 else ROLES[1]
    sent = ctx.sentence(pi, si)
    if not ctx.unique(sent):
        return None
    q = ('The document is divided into sections, each starting with a "## " heading. What '
         'role does this sentence play in its section: "background" (it is in the '
         'section\'s first paragraph), "method" (in a middle paragraph) or "outcome" (in the '
         f'last paragraph)? "{sent}"')
    return _Draw(q, role, ctx.paras[pi].sentences[si], labels=ROLES)


def _paragraph_draw(ctx, rng, pi, question, crowded):
    first = ctx.sentence(pi, 0)
    if not ctx.unique(first) or crowded and not ctx.entities(first):
        return None
    if crowded:
        pool = _sentence_pool(ctx, set(), pi, first, rng, True, NUM_OPTIONS - 1)
    else:
        firsts = [ctx.sentence(j, 0) for j in range(len(ctx.paras))
                  if j != pi and ctx.paras[j].sentences]
        firsts = [f for f in dict.fromkeys(firsts) if f != first]
        pool = (None if len(firsts) < NUM_OPTIONS - 1 else
                [firsts[i] for i in rng.choice(len(firsts), NUM_OPTIONS - 1, replace=False)])
    if pool is None:
        return None
    return _Draw(question, first, ctx.paras[pi].sentences[0], pool, crowd_ok=True)


def _pick_paragraph(ctx, rng, position, with_entities=False):
    cands = [pi for pi, p in enumerate(ctx.paras)
             if p.sentences and _in_position(ctx, p.sentences[0][0], position)
             and (not with_entities or ctx.entities(ctx.sentence(pi, 0)))]
    return None if not cands else cands[rng.integers(len(cands))]


def _task_probe(ctx, corpus, rng, position, crowded):
    others = [lang for lang in corpus.langs if lang != ctx.lang]
    if not others:
        return None
    src = corpus.pivot if corpus.pivot in others else others[0]
    pi = _pick_paragraph(ctx, rng, position, with_entities=crowded)
    if pi is None:
        return None
    probe = corpus.paragraph(src, ctx.paras[pi].key).text
    text = ctx.text
    gold_text = text[ctx.paras[pi].start:ctx.paras[pi].end]
    ents = {e for e in entities(probe) if e in gold_text}  # the terms the translation kept
    if not ents:
        return None
    if sum(all(e in text[p.start:p.end] for e in ents) for p in ctx.paras) != 1:
        return None
    q = (f'Which paragraph of the document is the translation of this paragraph (language '
         f'"{src}")? Answer with the first sentence of that paragraph. "{probe}"')
    return _paragraph_draw(ctx, rng, pi, q, crowded)


def _task_summary(ctx, corpus, rng, position, crowded):
    pi = _pick_paragraph(ctx, rng, position, with_entities=crowded)
    if pi is None:
        return None
    text = ctx.text
    para = text[ctx.paras[pi].start:ctx.paras[pi].end]
    words = _keywords(para, ctx.lang)
    if len(words) < 3:
        return None
    freq = {w: text.count(w) for w in words}
    order = sorted(words, key=lambda w: (freq[w], rng.random()))
    for k in range(3, min(6, len(order)) + 1):
        kw = order[:k]
        hits = sum(all(w in text[p.start:p.end] for w in kw) for p in ctx.paras)
        if hits == 1:
            shown = ", ".join(f'"{w}"' for w in kw)
            q = ("Which paragraph of the document mentions all of these words: "
                 f"{shown}? Answer with the first sentence of that paragraph.")
            return _paragraph_draw(ctx, rng, pi, q, crowded)
    return None


def _heading_pool(ctx, gold, rng, exclude=()):
    pool = [s.heading for s in ctx.secs if s.heading != gold and s.heading not in exclude]
    pool = list(dict.fromkeys(pool))
    if len(pool) < NUM_OPTIONS - 1:
        return None
    return [pool[i] for i in rng.choice(len(pool), NUM_OPTIONS - 1, replace=False)]


def _heading_unique(ctx, heading):
    return ctx.text.count(f"## {heading}\n") + ctx.text.endswith(f"## {heading}") == 1 \
        and sum(s.heading == heading for s in ctx.secs) == 1


def _task_next_heading(ctx, corpus, rng, position, crowded):
    cands = [i for i in range(1, len(ctx.secs)) if _in_position(ctx, ctx.secs[i].start, position)]
    if not cands:
        return None
    i = cands[rng.integers(len(cands))]
    prev, gold = ctx.secs[i - 1].heading, ctx.secs[i].heading
    if not (_heading_unique(ctx, prev) and _heading_unique(ctx, gold)):
        return None
    pool = _heading_pool(ctx, gold, rng, exclude=(prev,))
    if pool is None:
        return None
    q = f'Which section heading comes right after the section "{prev}" in the document?'
    return _Draw(q, gold, (ctx.secs[i].start, ctx.secs[i].end), pool)


def _task_which_section(ctx, corpus, rng, position, crowded):
    text = ctx.text
    order = rng.permutation(len(ctx.secs)).tolist()
    for si in order:
        sec = ctx.secs[si]
        if not sec.paras or not _heading_unique(ctx, sec.heading):
            continue
        lo, hi = ctx.paras[sec.paras[0]].start, ctx.paras[sec.paras[-1]].end
        body = text[lo:hi]
        terms = sorted(entities(body) | set(_keywords(body, ctx.lang)), key=lambda t: rng.random())
        for term in terms:
            first = text.find(term)
            if (first < lo or text.rfind(term) + len(term) > hi
                    or not _in_position(ctx, first, position)):
                continue
            if any(term in s.heading for s in ctx.secs):
                continue
            pool = _heading_pool(ctx, sec.heading, rng)
            if pool is None:
                return None
            q = (f'Which section of the document discusses "{term}"? Answer with the '
                 "section's heading.")
            return _Draw(q, sec.heading, (first, first + len(term)), pool)
    return None


_TASK_FNS = {"cloze": _task_cloze, "gap": _task_gap, "order": _task_order, "role": _task_role,
             "probe": _task_probe, "summary": _task_summary, "next_heading": _task_next_heading,
             "which_section": _task_which_section}


# --- the generator ---------------------------------------------------------------------------


def _item(ctx: _Context, draw: _Draw, *, granularity, task, budget, fmt, rng) -> MgalItem:
    s, e = draw.span
    p_lo, p_hi = ctx.para_at(s)
    crowded = fmt == "mc_crowded" and draw.crowd_ok
    if fmt == "open":
        options, answer = None, draw.gold
    elif draw.labels is not None:
        options, answer = tuple(draw.labels), draw.labels.index(draw.gold)
    else:
        opts = [draw.gold, *draw.distractors[:NUM_OPTIONS - 1]]
        perm = rng.permutation(len(opts)).tolist()
        options = tuple(opts[j] for j in perm)
        answer = perm.index(0)
    return MgalItem(language=ctx.lang, granularity=granularity,
                    position_doc=position_of(s, 0, len(ctx.text)),
                    position_para=position_of(s, p_lo, p_hi), length_bucket=budget,
                    context=ctx.text, question=draw.question, options=options, answer=answer,
                    answer_span=(s, e), crowded=crowded, task=task)


def _check(langs, lengths, n_per_cell, corpus):
    if not isinstance(corpus, ParallelCorpus):
        raise ValueError(f"generate: corpus must be a ParallelCorpus, got {type(corpus).__name__}")
    if not langs:
        raise ValueError("generate: langs is empty")
    unknown = [lang for lang in langs if lang not in corpus.langs]
    if unknown:
        raise ValueError(f"generate: languages {unknown} not in the corpus ({corpus.langs})")
    if not lengths or any(not isinstance(n, (int, np.integer)) or n < 64 for n in lengths):
        raise ValueError(f"generate: lengths must be token budgets >= 64, got {lengths}")
    if not isinstance(n_per_cell, (int, np.integer)) or n_per_cell < 1:
        raise ValueError(f"generate: n_per_cell must be a positive int, got {n_per_cell}")


def generate(corpus: ParallelCorpus, *, langs: Sequence[str], lengths: Sequence[int],
             n_per_cell: int, seed: int, tokenizer=None,
             granularities: Sequence[str] = GRANULARITIES) -> list[MgalItem]:
    """Items for every cell language × length × granularity × position_doc, ``n_per_cell``
    each (see the module docstring for tasks, formats and tags).

    Item ``i`` of a cell draws from the seed sequence ``[seed, crc32(lang), length,
    granularity, position, i, attempt]``, so a cell's items do not depend on the other
    cells. Raises ValueError for bad arguments and RuntimeError when a cell cannot be
    filled (a corpus too small for the budget or the position).
    """
    _check(langs, lengths, n_per_cell, corpus)
    bad = [g for g in granularities if g not in GRANULARITIES]
    if bad:
        raise ValueError(f"generate: unknown granularities {bad}; known {GRANULARITIES}")
    counter = as_tokenizer(tokenizer)
    cache: dict = {}
    items = []
    for lang in langs:
        n_secs = len(corpus.documents[lang])
        for length in lengths:
            for gran in granularities:
                tasks = TASKS[gran]
                for pos_i, position in enumerate(POSITIONS):
                    for i in range(n_per_cell):
                        task = tasks[i % len(tasks)]
                        fmt = FORMATS[(i // len(tasks)) % len(FORMATS)]
                        items.append(_one(corpus, lang, int(length), gran, task, position,
                                          fmt, [seed, zlib.crc32(lang.encode()), int(length),
                                                GRANULARITIES.index(gran), pos_i, i],
                                          counter, cache, n_secs))
    return items


def _one(corpus, lang, length, gran, task, position, fmt, seq, counter, cache, n_secs):
    ctx = None
    for attempt in range(MAX_TRIES):
        rng = np.random.default_rng([*seq, attempt])
        if ctx is None or attempt % NEW_CONTEXT_EVERY == 0:
            ctx = build_context(corpus, lang, length, int(rng.integers(n_secs)), counter, cache)
        if not ctx.paras:
            continue
        draw = _TASK_FNS[task](ctx, corpus, rng, position, fmt == "mc_crowded")
        if draw is not None and _in_position(ctx, draw.span[0], position):
            return _item(ctx, draw, granularity=gran, task=task, budget=length, fmt=fmt, rng=rng)
    raise RuntimeError(f"mgal: could not draw a {task!r} item ({fmt}) at position {position!r} "
                       f"for {lang!r} within {length} tokens after {MAX_TRIES} tries; the "
                       f"corpus may be too small for this budget")


# --- the evaluator suite ("mgal") ---------------------------------------------------------


def depth_position(depth: float) -> str:
    """The position a suite depth asks for: ``[0, 1/3)`` begin, ``[1/3, 2/3)`` middle,
    ``[2/3, 1]`` end (use depths 0, 0.5, 1)."""
    if not 0.0 <= float(depth) <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth}")
    return POSITIONS[min(int(float(depth) * 3), 2)]


def sample(corpus: ParallelCorpus, task: str, seed, length: int, *, depth: float = 0.5,
           tokenizer=None, cache: dict | None = None):
    """One item of suite task ``"<lang>/<granularity>"`` as an ``lcjax.data.ruler.Sample``.

    The item's task and format are drawn from ``seed``; ``depth`` picks ``position_doc``
    (:func:`depth_position`). The prompt is :func:`format_prompt` with ``reply="text"``;
    ``answer`` and the one reference are the answer text (the gold option's text for
    multiple choice); ``info["item"]`` is the :class:`MgalItem`. ``length`` budgets the
    context; ``Sample.length`` counts the whole prompt plus answer.
    """
    lang, _, gran = task.partition("/")
    if gran not in TASKS or lang not in corpus.langs:
        raise ValueError(f"mgal suite: task must be '<lang>/<granularity>' with lang in "
                         f"{corpus.langs} and granularity in {GRANULARITIES}; got {task!r}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    seq = [int(x) for x in rng.integers(0, 2**31 - 1, size=3)]
    kind = TASKS[gran][seq[0] % len(TASKS[gran])]
    fmt = FORMATS[seq[1] % len(FORMATS)]
    counter = as_tokenizer(tokenizer)
    item = _one(corpus, lang, int(length), gran, kind, depth_position(depth), fmt, seq,
                counter, {} if cache is None else cache, len(corpus.documents[lang]))
    prompt = format_prompt(item, reply="text")
    gold = str(item.answer) if item.options is None else item.options[item.answer]
    evidence = item.context[item.answer_span[0]:item.answer_span[1]]
    offset = len(item.context[:item.answer_span[0]].encode())
    return Sample(prompt=prompt.encode(), answer=gold.encode(), references=(gold.encode(),),
                  task=f"mgal_{kind}", length=counter.count(prompt) + counter.count(gold),
                  haystack_bytes=len(item.context.encode()),
                  depths=(item.answer_span[0] / len(item.context),), offsets=(offset,),
                  needles=(evidence.encode(),), num_targets=1,
                  info={"item": item, "task": kind, "format": fmt},
                  tokenizer=counter.name, question=item.question.encode())
