"""A small synthetic parallel corpus for the MGAL tests, rendered as DocBook XHTML.

Three languages: ``en`` and ``de`` (made-up Latin words, spaces, ``.``) and ``ja`` (made-up
three-kana words, no spaces, ``。``). Every language word translates one base word, so the
translation of a text is known exactly (:func:`translate`); entities (``apt-7``, ``Zorbix``,
``lib_q3`` …) are shared by all languages, as technical terms are in real translations.
"""

from __future__ import annotations

import numpy as np

from lcjax.data import parallel

LANGS = ("en", "de", "ja")
N_BASE = 400
_KANA = [chr(c) for c in range(0x3042, 0x3093)]


def _vocab(lang: str, rng) -> list[str]:
    words, seen = [], set()
    while len(words) < N_BASE:
        if lang == "ja":
            w = "".join(rng.choice(_KANA, 3))
        else:
            letters = "aeioukmnprstlvz" if lang == "en" else "aeioubdfghjkrsw"
            w = "".join(rng.choice(list(letters), int(rng.integers(4, 9))))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def _entities(rng, n=15) -> list[str]:
    ents = set()
    while len(ents) < n:
        kind = int(rng.integers(3))
        stem = "".join(rng.choice(list("bcdfgklmnprstvxz"), 3)) + "".join(
            rng.choice(list("aeiou"), 2))
        forms = ["Z" + stem, f"{stem}-{rng.integers(2, 99)}", f"lib_{stem}{rng.integers(9)}"]
        ents.add(forms[kind])
    return sorted(ents)


class Synthetic:
    """The corpus: base sentences (lists of base-word ids and entity strings) per paragraph,
    sections of paragraphs, and the per-language vocabularies."""

    def __init__(self, seed: int = 0, n_sections: int = 40):
        rng = np.random.default_rng(seed)
        self.vocab = {lang: _vocab(lang, rng) for lang in LANGS}
        self.entities = _entities(rng)
        self.sections = []
        for s in range(n_sections):
            heading = [int(x) for x in rng.choice(N_BASE, 2, replace=False)] + [f"Sec{s}x"]
            paras = []
            for _ in range(int(rng.integers(3, 5))):
                sents = []
                for _ in range(int(rng.integers(3, 5))):
                    toks: list = [int(x) for x in rng.choice(N_BASE, int(rng.integers(4, 7)))]
                    for _ in range(int(rng.integers(1, 3))):
                        toks.insert(int(rng.integers(1, len(toks))),
                                    self.entities[int(rng.integers(len(self.entities)))])
                    sents.append(toks)
                paras.append(sents)
            self.sections.append((f"_sec_{s}", heading, paras))

    def render_tokens(self, toks, lang) -> str:
        words = [t if isinstance(t, str) else self.vocab[lang][t] for t in toks]
        if lang == "ja":
            return "".join(words)
        text = " ".join(words)
        return text[0].upper() + text[1:]

    def sentence(self, toks, lang) -> str:
        return self.render_tokens(toks, lang) + ("。" if lang == "ja" else ".")

    def paragraph(self, sents, lang) -> str:
        sep = "" if lang == "ja" else " "
        return sep.join(self.sentence(t, lang) for t in sents)

    def xhtml(self, lang: str) -> str:
        out = ['<html><body><div class="toc"><p>Table of contents (skipped)</p></div>']
        for i, (sid, heading, paras) in enumerate(self.sections):
            head = self.render_tokens(heading, lang)
            out.append(f'<div class="section"><h2 class="title"><a id="{sid}"/>{i + 1}. '
                       f'{head}</h2>')
            for j, sents in enumerate(paras):
                out.append(f"<p>{self.paragraph(sents, lang)}</p>")
                if j == 0:
                    out.append("<pre class=\"screen\">$ literal block (skipped)</pre>")
            out.append("</div>")
        out.append("</body></html>")
        return "\n".join(out)

    def corpus(self) -> parallel.ParallelCorpus:
        docs = {lang: parallel.parse_docbook_html(self.xhtml(lang), lang) for lang in LANGS}
        return parallel.align_documents(docs, pivot="en")

    def translate(self, text: str, src: str, dst: str) -> str:
        """Word-by-word translation of a paragraph rendered by :meth:`paragraph`."""
        rev = {w: i for i, w in enumerate(self.vocab[src])}
        ents = sorted(self.entities, key=len, reverse=True)
        sents = []
        cuts = text.split("。") if src == "ja" else text.split(". ")
        for raw in cuts:
            raw = raw.strip().rstrip(".")
            if not raw:
                continue
            toks: list = []
            if src == "ja":
                i = 0
                while i < len(raw):
                    ent = next((e for e in ents if raw.startswith(e, i)), None)
                    if ent:
                        toks.append(ent)
                        i += len(ent)
                    else:
                        toks.append(rev[raw[i:i + 3]])
                        i += 3
            else:
                for w in raw.split(" "):
                    toks.append(w if w in self.entities else rev[w.lower()])
            sents.append(toks)
        return self.paragraph(sents, dst)
