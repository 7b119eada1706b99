"""MGAL generator and metrics on a synthetic parallel corpus (tests/mgal_synthetic.py); the
generator's run on the real Debian Reference is in tests/test_parallel_corpus.py."""

from __future__ import annotations

import collections
import re

import pytest
from mgal_synthetic import LANGS, Synthetic

from lcjax.data import mgal, mgal_suite
from lcjax.data import mgal_metrics as mm
from lcjax.data.suites import as_tokenizer

LENGTHS = (6000, 12000)
N_PER_CELL = 9  # 9 = every task x format of the three-task granularity


@pytest.fixture(scope="module")
def syn():
    return Synthetic(seed=0)


@pytest.fixture(scope="module")
def corpus(syn):
    return syn.corpus()


@pytest.fixture(scope="module")
def items(corpus):
    return mgal.generate(corpus, langs=LANGS, lengths=LENGTHS, n_per_cell=N_PER_CELL, seed=0)


# --- an independent solver: reads only the context, the question and the options ----------


def _trailing_quote(q: str, marker: str) -> str:
    return q.split(marker, 1)[1][:-1]


def _first_sentence(paragraph: str, lang: str) -> str:
    if lang == "ja":
        return paragraph.split("。")[0] + "。"
    return paragraph.split(". ")[0].rstrip(".") + "."


def _blocks(context: str):
    """(start, end, is_heading) of the context's paragraphs and heading lines (text after '## ')."""
    out, pos = [], 0
    for block in context.split("\n\n"):
        head = block.startswith("## ")
        out.append((pos + 3 * head, pos + len(block), head))
        pos += len(block) + 2
    return out


def _section_of(context: str, offset: int) -> tuple[str, list[tuple[int, int]]]:
    """Heading and paragraph blocks of the section holding ``offset``."""
    heading, paras, found = None, [], None
    for s, e, head in _blocks(context):
        if head:
            if found is not None:
                break
            heading, paras = context[s:e], []
        else:
            paras.append((s, e))
            if s <= offset < e:
                found = True
    return heading, paras


def solve(item: mgal.MgalItem, syn: Synthetic):
    c, q, lang = item.context, item.question, item.language
    if item.task == "cloze":
        pre, suf = _trailing_quote(q, 'document: "').split("____")
        hits = list(re.finditer(re.escape(pre) + r"([^\n]+?)" + re.escape(suf), c))
        assert len(hits) == 1
        ans = hits[0].group(1)
    elif item.task == "gap":
        prev, nxt = _trailing_quote(q, 'document? "').split(" [GAP] ")
        i = c.index(prev) + len(prev)
        ans = c[i:c.index(nxt, i)].strip()
    elif item.task == "order":
        parts = re.findall(r'([ABC]): "(.*?)"', q)
        ans = ", ".join(label for label, s in sorted(parts, key=lambda p: c.index(p[1])))
    elif item.task == "role":
        sent = _trailing_quote(q, 'last paragraph)? "')
        at = c.index(sent)
        _, paras = _section_of(c, at)
        k = next(j for j, (s, e) in enumerate(paras) if s <= at < e)
        ans = "background" if k == 0 else "outcome" if k == len(paras) - 1 else "method"
    elif item.task in ("probe", "summary"):
        paras = [c[s:e] for s, e, head in _blocks(c) if not head]
        if item.task == "probe":
            src = re.search(r'\(language "([^"]+)"\)', q).group(1)
            target = syn.translate(_trailing_quote(q, 'that paragraph. "'), src, lang)
            hits = [p for p in paras if p == target]
        else:
            kws = re.findall(r'"([^"]+)"', q.split("words:", 1)[1])
            hits = [p for p in paras if all(k in p for k in kws)]
        assert len(hits) == 1
        ans = _first_sentence(hits[0], lang)
    elif item.task == "next_heading":
        prev = re.search(r'after the section "(.*)" in the document\?$', q).group(1)
        heads = re.findall(r"^## (.*)$", c, re.M)
        ans = heads[heads.index(prev) + 1]
    elif item.task == "which_section":
        term = re.search(r'discusses "(.*)"\? Answer', q).group(1)
        owners = {_section_of(c, m.start())[0] for m in re.finditer(re.escape(term), c)}
        assert len(owners) == 1
        ans = owners.pop()
    else:
        raise AssertionError(item.task)
    if item.options is None:
        return ans
    hits = [i for i, o in enumerate(item.options) if o == ans]
    assert len(hits) == 1, (ans, item.options)
    return hits[0]


# --- generator -----------------------------------------------------------------------------


def test_counts_balanced_per_cell(items):
    cells = collections.Counter((it.language, it.length_bucket, it.granularity, it.position_doc)
                                for it in items)
    assert len(cells) == len(LANGS) * len(LENGTHS) * len(mgal.GRANULARITIES) * len(mgal.POSITIONS)
    assert set(cells.values()) == {N_PER_CELL}
    # every task x format appears in every granularity
    combos = collections.Counter((it.task, it.options is None, it.crowded) for it in items)
    for task in ("gap", "probe", "summary"):
        assert combos[(task, False, True)] > 0 and combos[(task, True, False)] > 0


def test_every_answer_recoverable_by_independent_solver(items, syn):
    wrong = [(it.task, it.question[:80]) for it in items if solve(it, syn) != it.answer]
    assert not wrong, wrong[:5]


def test_answer_span_indexes_the_gold_evidence(items):
    for it in items:
        s, e = it.answer_span
        assert 0 <= s < e <= len(it.context)
        ev = it.context[s:e]
        gold = it.answer if it.options is None else it.options[it.answer]
        if it.task in ("cloze", "gap", "probe", "summary", "next_heading"):
            assert ev == gold
        elif it.task == "role":
            assert it.question.endswith(f'"{ev}"')
        elif it.task == "which_section":
            assert f'"{ev}"' in it.question and it.context.find(ev) == s
        else:  # order: the three quoted sentences, first start to last end
            quoted = re.findall(r'[ABC]: "(.*?)"', it.question)
            assert {it.context.index(x) for x in quoted} >= {s}
            assert max(it.context.index(x) + len(x) for x in quoted) == e


def _third(x: float) -> str:
    return "begin" if x < 1 / 3 else "middle" if x < 2 / 3 else "end"


def test_position_tags_match_the_span_offsets(items):
    seen = collections.Counter()
    for it in items:
        s = it.answer_span[0]
        assert it.position_doc == _third(s / len(it.context))
        block = next((b0, b1) for b0, b1, _ in _blocks(it.context) if b0 <= s < b1)
        assert it.position_para == _third((s - block[0]) / (block[1] - block[0]))
        seen[it.position_para] += 1
    assert len(seen) == 3  # the paragraph-level tag varies too


def test_crowding_distractors_share_an_entity_and_are_neighbours(items, syn):
    ent = re.compile("|".join(re.escape(e) for e in sorted(syn.entities, key=len, reverse=True)))
    crowded = [it for it in items if it.crowded]
    assert crowded and {it.task for it in crowded} == {"gap", "probe", "summary"}
    for it in crowded:
        gold = it.options[it.answer]
        gold_ents = set(ent.findall(gold))
        blocks = [(s, e) for s, e, head in _blocks(it.context) if not head]
        gold_block = next(i for i, (s, e) in enumerate(blocks) if s <= it.answer_span[0] < e)
        for j, opt in enumerate(it.options):
            if j == it.answer:
                continue
            assert gold_ents & set(ent.findall(opt)), (gold, opt)
            at = it.context.index(opt)
            block = next(i for i, (s, e) in enumerate(blocks) if s <= at < e)
            assert abs(block - gold_block) <= mgal.CROWD_WINDOW


def test_contexts_fit_the_token_budget(items, corpus):
    for it in items:
        assert len(it.context.encode()) <= it.length_bucket
        assert len(it.context.encode()) > 0.8 * it.length_bucket  # filled, not tiny
    # another tokenizer: whitespace words as tokens
    words = mgal.generate(corpus, langs=("en",), lengths=(900,), n_per_cell=1, seed=3,
                          tokenizer=lambda s: s.split(), granularities=("word",))
    for it in words:
        assert 0.8 * 900 < len(it.context.split()) <= 900


def test_cells_do_not_depend_on_other_cells(items, corpus):
    small = mgal.generate(corpus, langs=("de",), lengths=(12000,), n_per_cell=2, seed=0,
                          granularities=("paragraph",))
    big = [it for it in items if it.language == "de" and it.length_bucket == 12000
           and it.granularity == "paragraph"]
    for pos in mgal.POSITIONS:
        assert [it for it in small if it.position_doc == pos] == \
               [it for it in big if it.position_doc == pos][:2]


def test_generate_rejects_bad_arguments(corpus):
    with pytest.raises(ValueError, match="not in the corpus"):
        mgal.generate(corpus, langs=("fr",), lengths=(6000,), n_per_cell=1, seed=0)
    with pytest.raises(ValueError, match="lengths"):
        mgal.generate(corpus, langs=("en",), lengths=(10,), n_per_cell=1, seed=0)
    with pytest.raises(ValueError, match="n_per_cell"):
        mgal.generate(corpus, langs=("en",), lengths=(6000,), n_per_cell=0, seed=0)
    with pytest.raises(ValueError, match="ParallelCorpus"):
        mgal.generate({"en": []}, langs=("en",), lengths=(6000,), n_per_cell=1, seed=0)
    with pytest.raises(RuntimeError, match="too small"):
        mgal.generate(corpus, langs=("en",), lengths=(200,), n_per_cell=1, seed=0,
                      granularities=("document",))


# --- metrics -------------------------------------------------------------------------------


def test_token_f1_and_exact_match_by_hand():
    # "the cat sat" vs "the cat ran away": overlap 2, P = 2/3, R = 2/4 -> F1 = 4/7
    assert mm.token_f1("The cat sat.", "the cat ran away") == pytest.approx(4 / 7)
    # CJK: one token per character; 猫が座った vs 猫が走った: overlap 猫,が,っ,た = 4 of 5 each
    assert mm.token_f1("猫が座った", "猫が走った") == pytest.approx(0.8)
    assert mm.tokens("apt-get 更新") == ["apt", "get", "更", "新"]
    assert mm.exact_match(" «Apt-Get». ".replace("«", '"').replace("»", '"'), "apt-get")
    assert not mm.exact_match("apt", "apt-get")
    assert mm.parse_choice("B. second", ["x", "y", "z"]) == 1
    assert mm.parse_choice("(c)", ["x", "y", "z"]) == 2
    assert mm.parse_choice("0", ["x", "y"]) == 0
    assert mm.parse_choice("Y", ["x", "y"]) == 1  # a letter first: 'Y' is not a valid letter
    assert mm.parse_choice("none of them", ["x", "y"]) is None


def test_scores_separate_fluency_from_consistency(items, syn):
    opened = [it for it in items if it.options is None and it.task == "gap" and it.language == "en"]
    it = opened[0]
    other = next(s for s in it.context.split(". ") if s and s not in it.answer and "\n" not in s)
    oracle = mm.score_item(it, it.answer)
    drift = mm.score_item(it, other + ".")  # a fluent English sentence of the same document
    foreign = mm.score_item(it, syn.sentence(list(range(8)), "ja"))
    assert oracle["exact"] and oracle["consistency"] == 1.0 and oracle["fluent"]
    assert not oracle["drifting"]
    assert not drift["exact"] and drift["fluent"] and drift["drifting"]
    assert drift["consistency"] < mm.DRIFT_THRESHOLD
    assert foreign["fluent"] is False
    summary = mm.summarize([oracle, drift, foreign], by=("language",))[("en",)]
    assert summary["n_open"] == 3 and summary["exact_match"] == pytest.approx(1 / 3)
    assert summary["fluent"] == pytest.approx(2 / 3)
    assert summary["fluent_but_drifting"] == pytest.approx(1 / 3)
    assert summary["consistency_f1"] == pytest.approx(
        (1.0 + drift["consistency"] + foreign["consistency"]) / 3)


def test_oracle_scores_perfectly(items, syn):
    preds = []
    for it in items:
        a = solve(it, syn)
        preds.append(a if it.options is None else "ABCD"[a])
    table = mm.summarize(mm.score_items(items, preds), by=("granularity",))
    for row in table.values():
        assert row["mc_accuracy"] == 1.0 and row["exact_match"] == 1.0
        assert row["consistency_f1"] in (None, 1.0)
    with pytest.raises(ValueError, match="predictions"):
        mm.score_items(items, preds[:-1])


# --- the evaluator suite ---------------------------------------------------------------------


def test_suite_through_the_evaluator_and_heatmaps(corpus, tmp_path):
    from lcjax.data.items import build_items
    from lcjax.eval.evaluate import evaluate

    suite = mgal_suite.make_suite(corpus)
    tasks = ["en/word", "ja/sentence", "de/paragraph", "ja/document"]
    kw = dict(tasks=tasks)
    items = build_items(suite, (6000,), (0.0, 0.5, 1.0), 1, 0, **kw)
    gold = {it.prompt.decode(): it.answer.decode() for it in items}
    for it in items:  # the sample's tags: depth picks position_doc, prompt holds the item
        item = it.sample.info["item"]
        assert item.position_doc == mgal.depth_position(it.depth)
        assert f"{item.language}/{item.granularity}" == it.task
        assert it.prompt.decode() == mgal.format_prompt(item, reply="text")

    ja_doc = {it.prompt.decode() for it in items if it.task == "ja/document"}

    def reader(prompts):  # right everywhere except ja/document, wrong there on purpose
        return ["nothing" if p in ja_doc else gold[p] for p in prompts]

    res = evaluate(reader, suite, (6000,), (0.0, 0.5, 1.0), 1, 0, progress=False, **kw)
    by_task = {t: v["overall"]["string_match_all"] for t, v in res.summary["tasks"].items()}
    assert by_task == {"en/word": 100.0, "ja/sentence": 100.0, "de/paragraph": 100.0,
                       "ja/document": 0.0}
    grids = mm.eval_grids(res.records)
    langs, grans, values = grids["language_x_granularity"]
    assert langs == ["en", "ja", "de"] and grans == list(mgal.GRANULARITIES)
    assert values[1] == [None, 100.0, None, 0.0]
    poss, _, pvalues = grids["position_x_granularity"]
    assert poss == list(mgal.POSITIONS) and all(row[3] == 0.0 for row in pvalues)
    paths = mm.write_heatmaps(res.records, str(tmp_path))
    assert all(open(p, "rb").read(8).startswith(b"\x89PNG") for p in paths.values())


def test_context_trim_recounts_once_per_overshoot(corpus):
    # a tokenizer whose piecewise counts undercount: "\n\n## " (a section boundary, split
    # across two pieces) is one extra token, so the assembled context must be trimmed
    calls = []

    def encode(text):
        calls.append(len(text))
        return [0] * (len(text) + 40 * text.count("\n\n## "))

    counter = as_tokenizer(encode)
    for budget in (3000, 6000):
        calls.clear()
        ctx = mgal.build_context(corpus, "en", budget, 0, counter)
        full = [n for n in calls if n >= len(ctx.text)]  # counts of the whole context
        assert counter.count(ctx.text) <= budget < len(ctx.text) + 40 * ctx.text.count(
            "\n\n## ") + 600  # fits, and not over-trimmed (a paragraph is < 600 bytes)
        assert ctx.text.count("\n\n## ") >= 3 and len(full) <= 3


# --- through lcjax eval: per-suite options and report -----------------------------------------


def test_cli_suite_options_and_mgal_report(corpus, tmp_path, capsys):
    import json

    from test_eval_endpoint import ScriptedServer

    from lcjax.cli import main
    from lcjax.data.items import build_items
    from lcjax.data.suites import SuiteOption, register_suite

    def factory(langs=None):
        return mgal_suite.make_suite(corpus, langs=langs, name="mgal_syn")

    register_suite("mgal_syn", factory, options=(
        SuiteOption("--langs", "languages", lambda t: tuple(t.split(","))),))
    items = build_items(factory(("en", "ja")), (6000,), (0.0, 0.5, 1.0), 1, 0)
    en = {it.prompt.decode(): it.answer.decode() for it in items if it.task.startswith("en/")}
    answers = {it.prompt.decode(): en.get(it.prompt.decode(), "nothing") for it in items}
    argv = ["eval", "--suite", "mgal_syn", "--langs", "en,ja", "--lengths", "6000",
            "--depths", "0,0.5,1", "--n-per-cell", "1", "--out", str(tmp_path),
            "--no-progress", "--retries", "0", "--timeout", "5"]
    with ScriptedServer(answers) as server:
        assert main([*argv, "--endpoint", server.url + "/v1"]) == 0
        asked = set(server.counts)
    assert asked == set(answers)
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    grid = printed["mgal_syn"]["grid"]
    assert json.loads((tmp_path / "mgal_metrics.json").read_text())["grid"] == grid
    # the same grid from the items themselves (mgal_metrics.score_items, no evaluator)
    own = mm.summarize(mm.score_items([it.sample.info["item"] for it in items],
                                      [answers[it.prompt.decode()] for it in items]),
                       by=mm.GRID_BY)
    assert len(grid) == len(own) == 4 * 3 * 2
    for row in grid:
        key = (row["granularity"], row["position_doc"], row["language"])
        assert {k: row[k] for k in own[key]} == own[key]
        assert row["accuracy"] == (1.0 if row["language"] == "en" else 0.0)
    for name in ("mgal_metrics.md", "mgal_accuracy_language_x_granularity.png",
                 "mgal_accuracy_position_x_granularity.png",
                 "mgal_language_x_granularity.png"):
        assert (tmp_path / name).stat().st_size > 0
    records = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()[1:]]
    assert all(r["suite_metrics"]["language"] == r["task"][:2] for r in records)
    with pytest.raises(SystemExit, match="takes no --langs"):  # not a ruler option
        main(["eval", "--suite", "ruler", "--langs", "en", "--endpoint", "http://x",
              "--lengths", "1k", "--out", str(tmp_path / "r")])
    with pytest.raises(SystemExit, match="subset"):
        main([*argv[:4], "fr", *argv[5:], "--endpoint", "http://x"])


def test_mgal_report_needs_suite_metrics(tmp_path):
    with pytest.raises(ValueError, match="suite_metrics"):
        mm.write_report([{"task": "en/word", "depth": 0.0}], str(tmp_path))
