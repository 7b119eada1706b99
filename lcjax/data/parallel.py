"""Document-aligned parallel corpora: one long document per language, aligned by structure.

Built for MGAL-style benchmarks (multilingual, granularity- and position-aware long-document
tasks; the ICML 2026 MGAL paper), whose data is not public: any corpus that gives one structured
document per language works. The real one shipped here is Debian Reference (Osamu Aoki,
GPL-2+), packaged per language as ``debian-reference-<lang>`` and installed by
``make corpora``; each package holds the guide as plain text (``debian-reference.<lang>.txt.gz``,
a w3m rendering whose lines are re-wrapped) and as DocBook-generated XHTML
(``pr01``, ``ch01``…``ch12``, ``apa`` ``.<lang>.html``). We read the XHTML: paragraphs are
``<p>`` elements and every section heading carries the *same* anchor id in every language
(``<h3 class="title"><a id="_the_shell_prompt"/>1.1.1. …</h3>``), so structure aligns
languages exactly where the translation kept it.

Pipeline (all pure functions):

1. :func:`parse_docbook_html` → sections ``(id, heading, paragraphs)`` of one chapter file,
   skipping tables of contents, navigation, literal ``<pre>`` blocks and data tables.
2. :func:`segment_sentences` → sentences of a paragraph with the maintained ``sentencex``
   splitter (rule sets per language, incl. ja / zh full stops); the sentences concatenate
   back to the paragraph exactly, so character offsets survive.
3. :func:`align_documents` → paragraph keys ``(section id, index in section)`` kept for a
   language only when that section has the pivot's paragraph count, and the paragraph's
   length ratio to the pivot ``r = len(p_lang) / len(p_pivot)`` lies within
   ``[m / ratio_tolerance, m * ratio_tolerance]`` around the language's median ratio ``m``
   (a paragraph left untranslated, or merged / split, falls out). A key is *aligned* when
   every language kept it.
4. :class:`AlignmentReport` per language: sections matched, paragraphs kept / rejected,
   median ratio, and how often the sentence count equals the pivot's.
"""

from __future__ import annotations

import dataclasses
import html.parser
import os
import re
import statistics
from collections.abc import Mapping, Sequence

from lcjax.optional import require

with require("data", "lcjax.data.parallel"):
    from sentencex import segment as _sentencex_segment

__all__ = [
    "DEBIAN_LANGS",
    "DEBIAN_REFERENCE_DIR",
    "AlignmentReport",
    "CorpusMissingError",
    "Paragraph",
    "ParallelCorpus",
    "Section",
    "align_documents",
    "debian_reference_files",
    "load_debian_reference",
    "parse_docbook_html",
    "segment_sentences",
]

DEBIAN_REFERENCE_DIR = "/usr/share/debian-reference"
DEBIAN_LANGS = ("en", "de", "es", "fr", "it", "ja", "pt", "pt-br", "zh-cn", "zh-tw", "id")
# document order of the guide's files: preface, 12 chapters, appendix
DEBIAN_PARTS = ("pr01", *(f"ch{i:02d}" for i in range(1, 13)), "apa")
# sentencex language codes for the Debian names (sentencex falls back along its own chains)
_SEGMENTER_LANG = {"pt-br": "pt", "zh-cn": "zh", "zh-tw": "zh"}


class CorpusMissingError(FileNotFoundError):
    """The corpus files are not installed (the message names the command that installs them)."""


@dataclasses.dataclass(frozen=True)
class Paragraph:
    """One paragraph: ``text`` (whitespace collapsed) and its ``sentences`` (which
    concatenate back to ``text`` exactly)."""

    text: str
    sentences: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Section:
    """One section of a document: its anchor ``id`` (shared across languages), ``heading``
    (the title without its number), ``level`` (1 = chapter) and paragraphs."""

    id: str
    heading: str
    level: int
    paragraphs: tuple[Paragraph, ...]


@dataclasses.dataclass(frozen=True)
class AlignmentReport:
    """How one language aligns to the pivot.

    ``sentence_agreement`` is the fraction of aligned paragraphs whose sentence count equals
    the pivot's, ``sentence_within_1`` the fraction within one sentence.
    """

    language: str
    sections: int
    sections_matched: int
    paragraphs: int
    kept: int
    rejected_structure: int
    rejected_ratio: int
    median_ratio: float
    sentence_agreement: float
    sentence_within_1: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ParallelCorpus:
    """Aligned documents: ``documents[lang]`` is that language's sections in document order,
    restricted to the aligned paragraphs; ``keys`` are the aligned ``(section id, index)``
    pairs in document order, the same for every language (``paragraph(lang, key)``)."""

    langs: tuple[str, ...]
    pivot: str
    documents: Mapping[str, tuple[Section, ...]]
    keys: tuple[tuple[str, int], ...]
    reports: Mapping[str, AlignmentReport]
    paragraphs: Mapping[str, Mapping[tuple[str, int], Paragraph]]

    def paragraph(self, lang: str, key: tuple[str, int]) -> Paragraph:
        """The paragraph of ``lang`` aligned at ``key``."""
        return self.paragraphs[lang][key]

    def translations(self, key: tuple[str, int]) -> dict[str, Paragraph]:
        """``{lang: paragraph}`` at one aligned key."""
        return {lang: self.paragraphs[lang][key] for lang in self.langs}

    def section_keys(self, lang: str) -> list[tuple[Section, list[tuple[str, int]]]]:
        """``[(section, keys of its paragraphs)]`` of ``lang`` in document order."""
        by_id = {}
        for k in self.keys:
            by_id.setdefault(k[0], []).append(k)
        return [(s, by_id[s.id]) for s in self.documents[lang]]

    def report_markdown(self) -> str:
        """The per-language alignment report as a Markdown table."""
        rows = ["| lang | sections matched | paragraphs kept / total | rejected (structure, "
                "ratio) | median len ratio | same #sentences | within ±1 |",
                "|---|---|---|---|---|---|---|"]
        for lang in self.langs:
            r = self.reports[lang]
            rows.append(f"| {lang} | {r.sections_matched}/{r.sections} | {r.kept}/{r.paragraphs}"
                        f" | {r.rejected_structure}, {r.rejected_ratio} | {r.median_ratio:.2f}"
                        f" | {r.sentence_agreement:.1%} | {r.sentence_within_1:.1%} |")
        return "\n".join(rows)


# --- segmentation --------------------------------------------------------------------------

_WS = re.compile(r"\s+")


def segment_sentences(text: str, lang: str) -> tuple[str, ...]:
    """Sentences of ``text`` in language ``lang`` (Debian code), by ``sentencex``.

    Each sentence keeps its trailing whitespace, so ``"".join(result) == text``; empty
    pieces are dropped. Raises ValueError for an empty ``lang``.
    """
    if not lang:
        raise ValueError("segment_sentences: lang must be a language code such as 'en'")
    if not text:
        return ()
    code = _SEGMENTER_LANG.get(lang, lang)
    pieces = [s for s in _sentencex_segment(code, text) if s]
    if "".join(pieces) != text:  # keep offsets exact whatever the splitter does to spaces
        pieces = _realign(text, pieces)
    return tuple(pieces)


def _realign(text: str, pieces: Sequence[str]) -> list[str]:
    """Cut ``text`` at the ends of ``pieces`` located in order (whitespace may differ)."""
    out, pos = [], 0
    for piece in pieces:
        core = piece.strip()
        at = text.find(core, pos) if core else -1
        if at < 0:
            continue
        end = at + len(core)
        while end < len(text) and text[end].isspace():
            end += 1
        out.append(text[pos:end])
        pos = end
    if pos < len(text):
        if out:
            out[-1] += text[pos:]
        else:
            out.append(text[pos:])
    return out


# --- DocBook XHTML -------------------------------------------------------------------------

_SKIP_DIV = {"toc", "navheader", "navfooter", "table", "table-contents", "footnotes",
             "informaltable", "list-of-tables"}
_HEADING_NUMBER = re.compile(r"^\s*(?:Chapter\s+|Appendix\s+|Kapitel\s+|Capítulo\s+|"
                             r"Chapitre\s+|Capitolo\s+|Bab\s+|Annexe\s+|Anhang\s+|"
                             r"Apéndice\s+|Apêndice\s+|Appendice\s+|Lampiran\s+|第)?"
                             r"[0-9A-Z]+(?:\.[0-9]+)*\.?\s*(?:章|節)?[.:：]?\s*")


class _DocBookParser(html.parser.HTMLParser):
    """Collects headings (with their anchor ids) and top-level-flow ``<p>`` texts."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.events: list[tuple] = []  # ("h", level, id, text) | ("p", text)
        self._stack: list[tuple[str, bool]] = []  # (tag, skipping)
        self._skip_depth = 0
        self._heading: list | None = None  # [level, id, parts]
        self._para: list[str] | None = None
        self._pre = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        skip = tag == "div" and bool(_SKIP_DIV & set((a.get("class") or "").split()))
        if tag in ("table",) and self._para is None:
            skip = skip or "summary" not in a  # admonition boxes are tables with a summary
        if tag not in _VOID:
            self._stack.append((tag, skip))
            self._skip_depth += skip
        if self._skip_depth:
            return
        if tag == "pre":
            self._pre += 1
        elif re.fullmatch(r"h[1-5]", tag) and "title" in (a.get("class") or ""):
            self._heading = [int(tag[1]), None, []]
        elif tag == "a" and self._heading is not None and a.get("id") and not self._heading[1]:
            self._heading[1] = a["id"]
        elif tag == "p" and self._para is None and not self._pre:
            self._para = []

    def handle_startendtag(self, tag, attrs):
        a = dict(attrs)
        if not self._skip_depth and tag == "a" and self._heading is not None \
                and a.get("id") and not self._heading[1]:
            self._heading[1] = a["id"]

    def handle_endtag(self, tag):
        if tag in _VOID:
            return
        while self._stack:
            open_tag, skip = self._stack.pop()
            self._skip_depth -= skip
            if open_tag == tag:
                break
        if self._skip_depth:
            return
        if tag == "pre":
            self._pre = max(0, self._pre - 1)
        elif self._heading is not None and re.fullmatch(r"h[1-5]", tag):
            level, hid, parts = self._heading
            self._heading = None
            if hid:
                self.events.append(("h", level, hid, _WS.sub(" ", "".join(parts)).strip()))
        elif tag == "p" and self._para is not None:
            text = _WS.sub(" ", "".join(self._para)).strip()
            self._para = None
            if text:
                self.events.append(("p", text))

    def handle_data(self, data):
        if self._skip_depth:
            return
        if self._heading is not None:
            self._heading[2].append(data)
        elif self._para is not None:
            self._para.append(data)


_VOID = {"img", "br", "hr", "meta", "link", "col", "input", "area", "base", "wbr"}


def _strip_number(heading: str) -> str:
    stripped = _HEADING_NUMBER.sub("", heading, count=1).strip()
    return stripped or heading


def parse_docbook_html(markup: str, lang: str) -> list[Section]:
    """Sections of one DocBook XHTML file, in order, with segmented paragraphs.

    A section runs from one titled heading (``<hN class="title"><a id=…/>``) to the next;
    paragraphs before the first heading are dropped. ``lang`` picks the sentence rules.
    """
    parser = _DocBookParser()
    parser.feed(markup)
    parser.close()
    sections: list[Section] = []
    current: list | None = None
    for ev in parser.events:
        if ev[0] == "h":
            if current is not None:
                sections.append(_section(current, lang))
            current = [ev[2], _strip_number(ev[3]), ev[1], []]
        elif current is not None:
            current[3].append(ev[1])
    if current is not None:
        sections.append(_section(current, lang))
    return sections


def _section(cur: list, lang: str) -> Section:
    sid, heading, level, texts = cur
    paras = tuple(Paragraph(t, segment_sentences(t, lang)) for t in texts)
    return Section(sid, heading, level, paras)


# --- alignment -----------------------------------------------------------------------------


def align_documents(documents: Mapping[str, Sequence[Section]], *, pivot: str = "en",
                    ratio_tolerance: float = 2.0) -> ParallelCorpus:
    """Align documents (``{lang: sections}``) paragraph by paragraph through section ids.

    A paragraph key ``(section id, i)`` of the pivot is kept for ``lang`` when ``lang`` has
    that section with the same paragraph count (structure) and the length ratio
    ``r = len(p_lang) / len(p_pivot)`` satisfies ``m / t <= r <= m * t`` with ``m`` the
    median ratio of the structurally matched paragraphs and ``t = ratio_tolerance``. The
    corpus keeps the keys every language kept. Raises ValueError for an unknown pivot, a
    tolerance <= 1 or no aligned paragraph.
    """
    if pivot not in documents:
        raise ValueError(f"align_documents: pivot {pivot!r} not among {sorted(documents)}")
    if not ratio_tolerance > 1.0:
        raise ValueError(f"align_documents: ratio_tolerance must be > 1, got {ratio_tolerance}")
    langs = tuple(documents)
    piv = {s.id: s for s in documents[pivot]}
    order = [(s.id, i) for s in documents[pivot] for i in range(len(s.paragraphs))]
    kept: dict[str, set] = {}
    stats: dict[str, dict] = {}
    for lang in langs:
        secs = {s.id: s for s in documents[lang]}
        matched = [sid for sid, s in piv.items()
                   if sid in secs and len(secs[sid].paragraphs) == len(s.paragraphs)]
        ratios = {(sid, i): len(secs[sid].paragraphs[i].text) / len(p.text)
                  for sid in matched for i, p in enumerate(piv[sid].paragraphs)}
        med = statistics.median(ratios.values()) if ratios else float("nan")
        good = {k for k, r in ratios.items() if med / ratio_tolerance <= r <= med * ratio_tolerance}
        kept[lang] = good
        stats[lang] = dict(sections=len(piv), sections_matched=len(matched), paragraphs=len(order),
                           kept=len(good), rejected_structure=len(order) - len(ratios),
                           rejected_ratio=len(ratios) - len(good), median_ratio=med)
    keys = tuple(k for k in order if all(k in kept[lang] for lang in langs))
    if not keys:
        raise ValueError("align_documents: no paragraph aligns across all languages")
    keyset = set(keys)
    docs = {}
    for lang in langs:
        secs = []
        for s in documents[lang]:
            paras = tuple(p for i, p in enumerate(s.paragraphs) if (s.id, i) in keyset)
            if paras:
                secs.append(Section(s.id, s.heading, s.level, paras))
        docs[lang] = tuple(secs)
    index = {lang: {(s.id, i): p for s in documents[lang] for i, p in enumerate(s.paragraphs)}
             for lang in langs}
    reports = {}
    for lang in langs:
        diffs = [abs(len(index[lang][k].sentences) - len(index[pivot][k].sentences)) for k in keys]
        reports[lang] = AlignmentReport(
            language=lang, **stats[lang],
            sentence_agreement=sum(d == 0 for d in diffs) / len(diffs),
            sentence_within_1=sum(d <= 1 for d in diffs) / len(diffs))
    paragraphs = {lang: {k: index[lang][k] for k in keys} for lang in langs}
    return ParallelCorpus(langs, pivot, docs, keys, reports, paragraphs)


# --- the Debian Reference ------------------------------------------------------------------


def debian_reference_files(lang: str, root: str = DEBIAN_REFERENCE_DIR) -> list[str]:
    """The XHTML files of one language's guide in document order.

    Raises :class:`CorpusMissingError` naming ``make corpora`` when they are not installed,
    ValueError for a language Debian does not ship.
    """
    if lang not in DEBIAN_LANGS:
        raise ValueError(f"debian-reference: unknown language {lang!r}; Debian ships "
                         f"{', '.join(DEBIAN_LANGS)}")
    paths = [os.path.join(root, f"{part}.{lang}.html") for part in DEBIAN_PARTS]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise CorpusMissingError(
            f"debian-reference-{lang} is not installed ({missing[0]} missing). Run `make corpora`"
            f" (as root: apt-get install debian-reference-{lang}); without root, unpack the .deb"
            f" with `apt-get download debian-reference-{lang} && dpkg -x <deb> <dir>` and pass"
            f" root=<dir>/usr/share/debian-reference")
    return paths


def load_debian_reference(langs: Sequence[str] = DEBIAN_LANGS, *, pivot: str = "en",
                          root: str = DEBIAN_REFERENCE_DIR,
                          ratio_tolerance: float = 2.0) -> ParallelCorpus:
    """Debian Reference in ``langs``, segmented and aligned (see :func:`align_documents`).

    The pivot (default English, the original) is loaded even when not in ``langs`` and is
    then dropped from the result's languages. Raises :class:`CorpusMissingError` (run
    ``make corpora``) when a package is missing.
    """
    langs = tuple(dict.fromkeys(langs))
    if not langs:
        raise ValueError("load_debian_reference: langs is empty")
    todo = tuple(dict.fromkeys((pivot, *langs)))
    documents = {}
    for lang in todo:
        secs: list[Section] = []
        for path in debian_reference_files(lang, root):
            with open(path, encoding="utf-8") as f:
                secs.extend(parse_docbook_html(f.read(), lang))
        documents[lang] = secs
    corpus = align_documents(documents, pivot=pivot, ratio_tolerance=ratio_tolerance)
    if pivot in langs:
        return corpus
    keep = langs
    return dataclasses.replace(
        corpus, langs=keep, documents={k: corpus.documents[k] for k in keep},
        reports={k: corpus.reports[k] for k in keep},
        paragraphs={k: corpus.paragraphs[k] for k in keep})
