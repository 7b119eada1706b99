"""lcjax.data.parallel: DocBook parsing, sentence segmentation, structural alignment — on a
synthetic corpus (tests/mgal_synthetic.py) and, when installed, on Debian Reference."""

from __future__ import annotations

import collections
import dataclasses

import pytest
from mgal_synthetic import LANGS, Synthetic

from lcjax.data import mgal, parallel

# stated before measuring: on the real corpus, for every language, at least 75% of the
# aligned paragraphs have exactly the pivot's sentence count and 90% are within one sentence
SAME_COUNT_MIN = 0.75
WITHIN_ONE_MIN = 0.90


@pytest.fixture(scope="module")
def syn():
    return Synthetic(seed=1, n_sections=12)


@pytest.fixture(scope="module")
def docs(syn):
    return {lang: parallel.parse_docbook_html(syn.xhtml(lang), lang) for lang in LANGS}


def test_docbook_sections_paragraphs_and_sentences(syn, docs):
    for lang in LANGS:
        secs = docs[lang]
        assert [s.id for s in secs] == [sid for sid, _, _ in syn.sections]
        for sec, (_, heading, paras) in zip(secs, syn.sections):
            assert sec.heading == syn.render_tokens(heading, lang)  # "3. " number stripped
            assert sec.level == 2
            assert [p.text for p in sec.paragraphs] == [syn.paragraph(p, lang) for p in paras]
            for p, base in zip(sec.paragraphs, paras):
                assert "".join(p.sentences) == p.text
                assert [s.strip() for s in p.sentences] == [syn.sentence(t, lang) for t in base]
        text = " ".join(p.text for s in secs for p in s.paragraphs)
        assert "Table of contents" not in text and "literal block" not in text


@pytest.mark.parametrize("lang,text,n", [
    ("en", "Run apt-get update, e.g. as root. Then reboot! Done?", 3),
    ("de", "Das Paket ist z.B. hier. Es ist gut. Fertig.", 3),
    ("ja", "これはパッケージです。インストールしますか？はい！", 3),
    ("zh-cn", "这是一个软件包。请安装它！完成了吗？", 3),
    ("zh-tw", "這是一個軟體包。請安裝它！", 2),
    ("id", "Ini adalah paket. Instal dengan apt. Selesai.", 3),
    ("pt-br", "O Sr. Silva instalou o pacote. Depois reiniciou.", 2),
])
def test_segment_sentences_per_language(lang, text, n):
    sents = parallel.segment_sentences(text, lang)
    assert len(sents) == n, sents
    assert "".join(sents) == text


def test_segment_sentences_rejects_missing_language():
    with pytest.raises(ValueError, match="lang"):
        parallel.segment_sentences("Hello.", "")


def test_alignment_rejects_broken_structure_and_odd_length_ratios(docs):
    de = list(docs["de"])
    dropped = de[2]
    de[2] = dataclasses.replace(dropped, paragraphs=dropped.paragraphs[1:])  # a lost paragraph
    ja = list(docs["ja"])
    long = ja[5].paragraphs[0]
    blown = parallel.Paragraph(long.text * 4, long.sentences * 4)  # 4x long: no translation
    ja[5] = dataclasses.replace(ja[5], paragraphs=(blown, *ja[5].paragraphs[1:]))
    corpus = parallel.align_documents({"en": docs["en"], "de": de, "ja": ja}, pivot="en")
    total = sum(len(s.paragraphs) for s in docs["en"])
    n2 = len(docs["en"][2].paragraphs)
    rep = corpus.reports
    assert rep["de"].rejected_structure == n2 and rep["de"].rejected_ratio == 0
    assert rep["de"].sections_matched == len(docs["en"]) - 1
    assert rep["ja"].rejected_structure == 0 and rep["ja"].rejected_ratio == 1
    assert len(corpus.keys) == total - n2 - 1
    assert (docs["en"][5].id, 0) not in corpus.keys
    assert all(k[0] != docs["en"][2].id for k in corpus.keys)
    # the aligned paragraphs are translations of each other: same key, same base sentences
    key = corpus.keys[7]
    tr = corpus.translations(key)
    assert tr["en"] is corpus.paragraph("en", key)
    assert len(tr["de"].sentences) == len(tr["ja"].sentences) == len(tr["en"].sentences)
    assert "| ja |" in corpus.report_markdown()


def test_alignment_argument_errors(docs):
    with pytest.raises(ValueError, match="pivot"):
        parallel.align_documents(docs, pivot="fr")
    with pytest.raises(ValueError, match="ratio_tolerance"):
        parallel.align_documents(docs, pivot="en", ratio_tolerance=1.0)


def test_missing_packages_name_make_corpora(tmp_path):
    with pytest.raises(parallel.CorpusMissingError, match="make corpora"):
        parallel.load_debian_reference(["en", "ja"], root=str(tmp_path))
    with pytest.raises(ValueError, match="unknown language"):
        parallel.debian_reference_files("xx")


# --- the real corpus -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def debian():
    try:
        return parallel.load_debian_reference(parallel.DEBIAN_LANGS)
    except parallel.CorpusMissingError as err:
        pytest.skip(f"Debian Reference not installed: {err}")


def test_debian_reference_sentence_counts_agree_across_languages(debian):
    assert debian.langs == parallel.DEBIAN_LANGS
    assert len(debian.keys) >= 2000  # of ~2,700 English paragraphs
    print("\n" + debian.report_markdown())
    checked = 0
    for lang in debian.langs:
        if lang == debian.pivot:
            continue
        diffs = [abs(len(debian.paragraph(lang, k).sentences)
                     - len(debian.paragraph("en", k).sentences)) for k in debian.keys]
        same = sum(d == 0 for d in diffs) / len(diffs)
        within = sum(d <= 1 for d in diffs) / len(diffs)
        assert same == pytest.approx(debian.reports[lang].sentence_agreement)
        assert same >= SAME_COUNT_MIN and within >= WITHIN_ONE_MIN, (lang, same, within)
        checked += 1
    assert checked >= 6


REAL_LANGS = ("en", "de", "fr", "ja", "zh-cn", "id")


def test_generator_on_debian_reference(debian):
    got = mgal.generate(debian, langs=REAL_LANGS, lengths=(8192,), n_per_cell=1, seed=0)
    cells = collections.Counter((it.language, it.granularity, it.position_doc) for it in got)
    assert len(cells) == len(REAL_LANGS) * 4 * 3 and set(cells.values()) == {1}
    for it in got:
        assert len(it.context.encode()) <= 8192
        s, e = it.answer_span
        third = s / len(it.context)
        assert it.position_doc == ("begin" if third < 1 / 3 else "middle" if third < 2 / 3
                                   else "end")
        lo = it.context.rfind("\n\n", 0, s + 1)
        lo = 0 if lo < 0 else lo + 2
        hi = it.context.find("\n\n", s)
        hi = len(it.context) if hi < 0 else hi
        lo += 3 * it.context.startswith("## ", lo)
        frac = (s - lo) / (hi - lo)
        assert it.position_para == ("begin" if frac < 1 / 3 else "middle" if frac < 2 / 3
                                    else "end")
        if it.task in ("cloze", "gap", "probe", "summary", "next_heading"):
            assert it.context[s:e] == (it.answer if it.options is None else it.options[it.answer])
    # crowded items (items 4 and 5 of a paragraph cell): every distractor shares an entity
    crowd = mgal.generate(debian, langs=("de", "ja", "zh-cn"), lengths=(8192,), n_per_cell=6,
                          seed=0, granularities=("paragraph",))
    crowded = [it for it in crowd if it.crowded]
    assert len(crowded) == 3 * 3 * 2
    for it in crowded:
        gold = mgal.entities(it.options[it.answer])
        assert all(gold & mgal.entities(o) for o in it.options)
