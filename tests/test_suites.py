"""Suites over three tokenizers: every item is solved by independent readers of the prompt
(regexes and counting, written without the generators' code), lengths are within 2%, and
the grain training sources are deterministic per index."""

import re
from collections import Counter

import grain
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lcjax.data import load_shakespeare, ruler, suites
from lcjax.data.sources import TaskSource, task_batches
from lcjax.data.tokenizer import EOS


def _bpe() -> Tokenizer:
    """A byte-level BPE (vocab 500) trained here on a few Shakespeare plays."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([d.text for d in load_shakespeare()[:6]], trainer)
    return tok


def words(text: str) -> list[str]:
    """A whitespace-word tokenizer."""
    return text.split()


TOKENIZERS = {"bytes": None, "bpe": _bpe(), "words": words}


# --- independent solvers ---------------------------------------------------------------------


def solve_niah(text: str) -> list[str]:
    query = re.search(r"special magic \w+ for (.+?) mentioned in the provided text\?",
                      text).group(1)
    kind = re.search(r"Some special magic (\w+) are hidden", text).group(1)
    out = []
    for key in re.split(r", and |, ", query):
        out += re.findall(rf"One of the special magic {kind} for {re.escape(key)} is: "
                          rf"([0-9a-f-]+)\.", text)
    return out


def solve_vt(text: str) -> list[str]:
    value = re.search(r"assigned the value (\d+) in the text", text).group(1)
    chain = [re.search(rf"VAR ([A-Z]+) = {value}\.", text).group(1)]
    while m := re.search(rf"VAR ([A-Z]+) = VAR {chain[-1]}\.", text):
        chain.append(m.group(1))
    return chain


def solve_cwe(text: str) -> list[str]:
    num = int(re.search(r"What are the (\d+) most common words", text).group(1))
    body = text[:text.index("\nQuestion:")]
    items = re.findall(r"(?:^|\s)\d+\. ([a-z]+)", body)
    counts = Counter(items).most_common()
    assert len(counts) == num or counts[num - 1][1] > counts[num][1]  # strict at rank num
    top = {w for w, _ in counts[:num]}
    return sorted(top, key=items.index)


def solve_fwe(text: str) -> list[str]:
    num = int(re.search(r"What are the (\d+) most frequently appeared words", text).group(1))
    body = text[text.index("coded words.\n") + 13:text.index("\nQuestion:")]
    counts = [(w, c) for w, c in Counter(body.split()).most_common() if w != "...."]
    assert all(counts[i][1] > counts[i + 1][1] for i in range(num))  # no ties
    return [w for w, _ in counts[:num]]


def solve_qa(text: str) -> list[str]:
    quote = re.search(r'the line "(.+?)"(?:\?| a character\?)', text).group(1)
    docs = [d for d in re.findall(r"^\[([^\]]+)\] (.*)$", text, re.M) if quote in d[1]]
    assert len(docs) == 1
    speaker = docs[0][0]
    if "a character? Answer" not in text:
        return [speaker]
    return re.findall(rf"^{re.escape(speaker)} is a character in (.+)\.$", text, re.M)


def solve_nolima(text: str) -> list[str]:
    place = re.search(r"Which character has been to (\w+)\?", text).group(1)
    facts = text[:text.index("\nStory:\n")]
    story = text[text.index("\nStory:\n"):text.rindex("\nQuestion:")]
    direct = re.findall(rf"Actually, ([A-Z][a-z]+) has been to {place}\.", story)
    if direct:  # a literal-match control item
        return direct
    targets = re.findall(rf"^The ([A-Za-z ]+?) is in {place}\.$", facts, re.M)
    for district in re.findall(rf"^The (\w+) Quarter lies within {place}\.$", facts, re.M):
        targets += re.findall(rf"^The ([A-Za-z ]+?) is in the {district} Quarter\.$", facts,
                              re.M)
    assert len(targets) == 1
    return re.findall(rf"(?:Actually, |Yesterday )?([A-Z][a-z]+) (?:lives|spent|painted)"
                      rf"[^.\n]* the {targets[0]}\b", story)


def solve(sample) -> list[str]:
    text = sample.prompt.decode("utf-8")
    if sample.task.startswith("nolima"):
        return solve_nolima(text)
    return {"niah": solve_niah, "vt": solve_vt, "cwe": solve_cwe, "fwe": solve_fwe,
            "qa_1": solve_qa, "qa_2": solve_qa}[sample.task](text)


# --- the suites ----------------------------------------------------------------------------

LENGTHS = {"bytes": (1200, 2048), "bpe": (768, 1536), "words": (512, 768)}


def _items(tok_name, suite_name, per_task):
    suite = suites.get_suite(suite_name)
    tok = TOKENIZERS[tok_name]
    for t in suite.tasks:
        for i in range(per_task):
            length = LENGTHS[tok_name][i % 2]
            kw = dict(t.overrides)
            if t.uses_depth and i % 3 == 0:
                kw["depth"] = (0.0, 0.5, 1.0)[(i // 3) % 3]
            yield t, length, suite.generate(t.task, np.random.default_rng([7, i]), length,
                                            tokenizer=tok, **kw)


# items per task (RULER, NoLiMa): the BPE tokenizer's encode is ~90% of this test's time,
# so it gets fewer seeds (still both lengths and every depth of every task)
PER_TASK = {"bytes": (70, 30), "words": (70, 30), "bpe": (24, 12)}


@pytest.mark.parametrize("tok_name", sorted(TOKENIZERS))
def test_every_item_solved_and_sized(tok_name):
    """13 RULER tasks x 70 + 4 NoLiMa tasks x 30 = 1030 items for bytes and words, 13 x 24 +
    4 x 12 = 360 for the BPE tokenizer."""
    n = 0
    ruler_n, nolima_n = PER_TASK[tok_name]
    for suite_name, per_task in (("ruler", ruler_n), ("nolima", nolima_n)):
        for t, length, s in _items(tok_name, suite_name, per_task):
            got = solve(s)
            assert [g.encode() for g in got] == list(s.references), (t.name, s.info)
            assert s.answer == (b" " if t.task == "vt" else b", ").join(s.references)
            assert s.question and s.question in s.prompt[-len(s.question) - 60:]
            assert s.tokenizer == suites.as_tokenizer(TOKENIZERS[tok_name]).name
            assert length * 0.98 <= s.length <= length, (t.name, s.length, length)
            if tok_name == "bytes":
                assert s.length == len(s.prompt) + len(s.answer) == length
            n += 1
    assert n == 13 * ruler_n + 4 * nolima_n


def test_suite_lists_rulers_13_tasks():
    suite = suites.get_suite("ruler")
    assert [t.name for t in suite.tasks] == [
        "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
        "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1",
        "qa_2"]
    assert {t.name for t in suite.tasks if not t.uses_depth} == {"cwe", "fwe"}
    assert suite.generate is ruler.generate and "nolima" in suites.suites()


def test_tokenizer_specs():
    assert suites.as_tokenizer(None).count("héllo") == 6
    assert suites.as_tokenizer(words).name == "words"
    bpe = suites.as_tokenizer(TOKENIZERS["bpe"])
    assert bpe.name == "hf-bpe-500" and 0 < bpe.count("To be, or not to be") < 19
    with pytest.raises(ValueError, match="tokenizer"):
        suites.as_tokenizer(3)


def test_generators_deterministic_per_seed():
    for suite_name in ("ruler", "nolima"):
        suite = suites.get_suite(suite_name)
        for t in suite.tasks:
            a = suite.generate(t.task, 5, 1500, **t.overrides)
            assert a == suite.generate(t.task, 5, 1500, **t.overrides)
            assert a.prompt != suite.generate(t.task, 6, 1500, **t.overrides).prompt


# --- training sources ------------------------------------------------------------------------


def test_task_source_deterministic_per_index_and_batches():
    src = TaskSource("ruler", ["niah_single_1", "vt", "fwe"], length=1024, num_records=12,
                     seed=3)
    again = TaskSource("ruler", ["niah_single_1", "vt", "fwe"], length=1024, num_records=12,
                       seed=3)
    assert len(src) == 12
    for i in (0, 5, 11):
        a, b = src[i], again[i]
        assert a.keys() >= {"inputs", "targets", "loss_mask"}
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
        assert a["inputs"].shape == (1024,) and a["loss_mask"].dtype == bool
        s = src.sample(i)
        assert bytes(a["targets"][a["loss_mask"]].astype(np.uint8)) == s.answer
    assert not np.array_equal(src[0]["inputs"], src[3]["inputs"])
    assert src.sample(1).task == "vt" and src.sample(2).task == "fwe"
    ds = grain.MapDataset.source(src).batch(4)
    first = ds[0]
    assert first["inputs"].shape == (4, 1024) and first["loss_mask"].shape == (4, 1024)
    for j in range(4):
        np.testing.assert_array_equal(first["targets"][j], src[j]["targets"])
    nl = TaskSource("nolima", None, length=1024, num_records=4, depth=0.5)
    assert nl.sample(0).depths[0] == pytest.approx(0.5, abs=0.15)
    with pytest.raises(IndexError):
        src[12]


def test_task_batches_are_eos_rows_of_the_source():
    ds = task_batches("ruler", ["niah_single_1", "vt"], length=1024, steps=3, batch=2, seed=5)
    src = TaskSource("ruler", ["niah_single_1", "vt"], length=1024, num_records=6, seed=5,
                     eos=True, seq_len=1025)
    assert len(ds) == 3
    for step in range(3):
        b = ds[step]
        assert set(b) == {"inputs", "targets", "loss_mask"}
        assert b["inputs"].shape == (2, 1025)
        for j in range(2):
            row = src[2 * step + j]
            for k in b:
                np.testing.assert_array_equal(b[k][j], row[k])
            assert row["targets"][row["loss_mask"]][-1] == EOS
