"""TableLong: Python and SQLite agree on every answer, serialisations parse back, lengths are
controlled, items are deterministic per (seed, index), the CLI does not depend on workers."""

import collections
import itertools
import json

import pytest

from lcjax.data.tablelong import (
    FORMATS,
    LANGUAGES,
    TASKS,
    ShardSource,
    TableLongSource,
    answers_agree,
    generate_item,
    item_sample,
    load_sqlite,
    parse_context,
    serialize,
    sql_answer,
    verify_item,
    write_shards,
)
from lcjax.data.tablelong.items import dumps

N_ITEMS = 5000


@pytest.fixture(scope="module")
def many():
    """5,000 small items over every task, language and format, with the generator's stats."""
    stats = collections.Counter()
    items = [generate_item(11, i, min_len=200, max_len=1200, stats=stats) for i in range(N_ITEMS)]
    return items, stats


def _types(item):
    return {name: t["types"] for name, t in item["tables"].items()}


def test_no_python_sqlite_disagreement_over_5000_items(many):
    items, stats = many
    assert len(items) == N_ITEMS and stats["bugs"] == 0
    cover = collections.Counter((it["task"], it["language"], it["format"]) for it in items)
    assert set(cover) == set(itertools.product(TASKS, LANGUAGES, FORMATS))
    # an independent re-check from the JSON line alone: a fresh SQLite run of `sql`
    for it in items:
        assert verify_item(json.loads(dumps(it))), it["id"]


def test_every_serialisation_parses_back(many):
    items, _ = many
    for it in items:
        assert parse_context(it["context"], it["format"], _types(it)) == it["tables"], it["id"]
    # the other three formats of the same tables too
    for it in items[:200]:
        for fmt in FORMATS:
            assert parse_context(serialize(it["tables"], fmt), fmt, _types(it)) == it["tables"]


def test_item_schema_types_and_keys(many):
    items, _ = many
    sql_type = {"text": "TEXT", "integer": "INTEGER", "real": "REAL", "date": "TEXT",
                "id": "INTEGER"}
    for it in items[:300]:
        assert {"tables", "format", "context", "question", "answer", "sql", "task",
                "language"} <= set(it)
        assert len(it["tables"]) >= 2
        con = load_sqlite(it["tables"])
        for name, t in it["tables"].items():
            declared = [r[2] for r in con.execute(f'PRAGMA table_info("{name}")')]
            assert declared == [sql_type[ty] for ty in t["types"]]
            assert t["types"][0] == "id"
            keys = [r[0] for r in t["rows"]]
            assert len(set(keys)) == len(keys)
            for row in t["rows"]:
                for v, ty in zip(row, t["types"], strict=True):
                    assert isinstance(v, {"text": str, "date": str, "real": float,
                                          "integer": int, "id": int}[ty])
        # every foreign key value is a key of the table before it
        names = list(it["tables"])
        for parent, child in itertools.pairwise(names):
            parent_keys = {r[0] for r in it["tables"][parent]["rows"]}
            fk = it["tables"][child]["columns"].index(it["tables"][parent]["columns"][0])
            assert {r[fk] for r in it["tables"][child]["rows"]} <= parent_keys
        con.close()
        # answers: lists only when the SQL returns several rows; ordered iff ORDER BY
        assert it["ordered"] == ("ORDER BY" in it["sql"] and isinstance(it["answer"], list))
    levels = collections.defaultdict(set)
    for it in items:
        levels[it["task"]].add(it["difficulty"])
    assert levels["lookup"] == {1} and levels["count"] == {2, 3}
    assert levels["multi_hop"] == {5, 6} and levels["join"] == {4}


def test_verifier_rejects_wrong_answers(many):
    items, _ = many
    checked = collections.Counter()
    for it in items[:400]:
        bad = dict(it)
        a = it["answer"]
        if isinstance(a, list) and it["ordered"] and len(set(a)) > 1:
            bad["answer"] = a[::-1] if a[::-1] != a else a[1:] + a[:1]
        elif isinstance(a, bool) or a is None:
            continue
        elif isinstance(a, int | float):
            bad["answer"] = a + 1
        elif isinstance(a, str):
            bad["answer"] = a + "x"
        else:
            bad["answer"] = a + ["extra"]
        assert not verify_item(bad), it["id"]
        checked[type(a).__name__] += 1
    assert checked["int"] and checked["str"] and checked["list"] and checked["float"]


def test_hand_made_database_and_comparisons():
    tables = {"t": {"columns": ["id", "name", "x"], "types": ["id", "text", "real"],
                    "rows": [[1, "O'Hara", 1.5], [2, "b|c", 2.25], [3, "<d&e>", 2.25],
                             [4, 'q"uote, comma', 0.1]]}}
    assert sql_answer(tables, "SELECT COUNT(*) FROM t WHERE x > 1") == 3
    assert sql_answer(tables, "SELECT name FROM t WHERE name = 'O''Hara'") == "O'Hara"
    assert sql_answer(tables, "SELECT id FROM t WHERE x = (SELECT MAX(x) FROM t)") == [2, 3]
    assert sql_answer(tables, "SELECT id FROM t ORDER BY x DESC, id ASC LIMIT 3") == [2, 3, 1]
    assert answers_agree([2, 3], [3, 2]) and not answers_agree([2, 3], [3, 2], ordered=True)
    assert answers_agree(0.1 + 0.2, 0.3, real=True) and not answers_agree(0.1 + 0.2, 0.3)
    assert not answers_agree([1], 1) and not answers_agree("1", 1)
    # unordered lists compare as multisets: repeated values count (a set would equate these)
    assert answers_agree(["a", "b", "a"], ["a", "a", "b"])
    assert not answers_agree(["a", "a", "b"], ["a", "b", "b"])
    for fmt in FORMATS:  # pipes, quotes, commas and HTML specials survive every format
        text = serialize(tables, fmt)
        assert parse_context(text, fmt, {"t": tables["t"]["types"]}) == tables
        if fmt != "json":
            assert "0.1" in text and "2.25" in text


def test_length_control_bytes_and_another_tokenizer():
    for i in range(30):
        it = generate_item(5, i, min_len=3000, max_len=4096)
        assert 3000 <= len(it["context"].encode()) == it["length"] <= 4096
        assert it["tokenizer"] == "bytes"

    def words(text):  # a whitespace "tokenizer": lengths count its tokens, not bytes
        return text.split()

    for i in range(10):
        it = generate_item(5, i, min_len=300, max_len=500, tokenizer=words)
        assert 300 <= len(it["context"].split()) == it["length"] <= 500
        assert it["tokenizer"] == "words"

    from tokenizers import Tokenizer, models, pre_tokenizers  # a Hugging Face tokenizer

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "|": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    for i in range(5):
        it = generate_item(6, i, min_len=400, max_len=700, tokenizer=tok)
        n = len(tok.encode(it["context"], add_special_tokens=False).ids)
        assert 400 <= n == it["length"] <= 700 and n != len(it["context"].encode())
        assert it["tokenizer"].startswith("hf-wordlevel")


def test_deterministic_per_seed_and_index():
    a = [generate_item(3, i, min_len=500, max_len=900) for i in (0, 7, 7)]
    assert a[1] == a[2] and a[0] != a[1]
    assert generate_item(4, 7, min_len=500, max_len=900)["context"] != a[1]["context"]
    src = TableLongSource(10, min_len=500, max_len=900, seed=3)
    assert len(src) == 10 and src[7] == a[1]
    with pytest.raises(IndexError):
        src[10]


def test_bad_options_raise():
    with pytest.raises(ValueError, match="min_len"):
        generate_item(0, 0, min_len=900, max_len=500)
    with pytest.raises(ValueError, match="format"):
        generate_item(0, 0, min_len=500, max_len=900, formats=("yaml",))
    with pytest.raises(ValueError, match="task"):
        generate_item(0, 0, min_len=500, max_len=900, tasks=("sql_golf",))
    with pytest.raises(ValueError, match="language"):
        generate_item(0, 0, min_len=500, max_len=900, languages=("xx",))
    with pytest.raises(ValueError, match="format"):
        serialize({}, "yaml")
    with pytest.raises(ValueError, match="types"):
        parse_context("### t\na\n1", "csv", {"t": ["id", "real"]})


def test_suite_items_for_the_evaluator():
    from lcjax.data.items import build_items
    from lcjax.eval.results import make_record

    items = build_items("tablelong", [2048], n_per_cell=1, seed=0)
    assert [it.task for it in items] == [f"tablelong_{t}" for t in TASKS]
    for it in items:
        info = it.sample.info
        assert it.sample.length <= 2048 and it.prompt.decode().endswith(": ")
        assert info["question"].encode() in it.prompt
        ok = make_record(it, it.answer.decode(), None)
        assert ok["string_match_all"] == 100.0
        assert make_record(it, "no idea", None)["string_match_all"] == 0.0
    sample = item_sample(generate_item(0, 1, min_len=500, max_len=900))
    assert sample.references and sample.answer == b", ".join(sample.references)


def _read_dir(path):
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.jsonl"))}


def test_cli_deterministic_whatever_the_worker_count(tmp_path, capsys):
    from lcjax.cli import main

    common = ["data", "tablelong", "--n", "10", "--min-len", "1k", "--max-len", "2k",
              "--shard-size", "3", "--seed", "9", "--no-progress"]
    assert main(common + ["--out", str(tmp_path / "w1"), "--workers", "1"]) == 0
    assert main(common + ["--out", str(tmp_path / "w2"), "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "items/s" in out and "disagreements (not emitted): 0" in out
    one, two = _read_dir(tmp_path / "w1"), _read_dir(tmp_path / "w2")
    assert len(one) == 4 and one == two
    src = ShardSource(tmp_path / "w2")
    assert len(src) == 10
    import grain

    ds = grain.MapDataset.source(src).shuffle(seed=0)
    assert sorted(it["index"] for it in ds) == list(range(10))
    assert src[8] == generate_item(9, 8, min_len=1024, max_len=2048)
    summary = json.loads((tmp_path / "w1" / "summary.json").read_text())
    assert summary["items"] == 10 and sum(summary["tasks"].values()) == 10
    assert 1024 <= summary["length"]["min"] <= summary["length"]["max"] <= 2048
    # shards hold items only: one JSON object a line
    for blob in one.values():
        assert all(json.loads(line)["sql"] for line in blob.decode().splitlines())


def test_write_shards_rejects_bad_counts(tmp_path):
    with pytest.raises(ValueError, match="workers"):
        write_shards(tmp_path, 5, min_len=500, max_len=900, workers=0)



def test_translations_complete_and_unambiguous():
    from lcjax.data.tablelong import DOMAINS, vocab

    for table in (vocab.WORDS, vocab.TEMPLATES):
        assert all(len(v) == len(LANGUAGES) for v in table.values())
    for lang in LANGUAGES:
        for values in vocab.CATEGORIES.values():
            assert len(values) == len(set(v[LANGUAGES.index(lang)] for v in values))
        for chain in DOMAINS.values():
            names = [vocab.word(concept, lang) for concept, _ in chain]
            assert len(set(names)) == len(names)
            for _, columns in chain:
                headers = [vocab.word(c.concept, lang) for c in columns]
                assert len(set(headers)) == len(headers), (lang, headers)


def test_a_disagreement_is_counted_and_never_emitted(monkeypatch):
    from lcjax.data.tablelong import items as items_module

    real, calls = items_module.sql_answer, []

    def flaky(tables, sql, con=None):  # SQLite "disagrees" on the first two questions
        calls.append(sql)
        return "not the answer" if len(calls) <= 2 else real(tables, sql, con)

    monkeypatch.setattr(items_module, "sql_answer", flaky)
    stats = collections.Counter()
    it = generate_item(2, 3, min_len=500, max_len=900, stats=stats)
    monkeypatch.undo()
    assert stats["bugs"] == 2 and len(calls) == 3
    assert it["sql"] == calls[2] and it["answer"] != "not the answer" and verify_item(it)


def test_sql_the_engine_rejects_counts_as_a_bug(monkeypatch):
    from lcjax.data.tablelong import items as items_module

    real, calls = items_module.sql_answer, []

    def broken(tables, sql, con=None):
        calls.append(sql)
        return real(tables, "SELECT no_such_column FROM nowhere" if len(calls) == 1 else sql,
                    con)

    monkeypatch.setattr(items_module, "sql_answer", broken)
    stats = collections.Counter()
    it = generate_item(2, 4, min_len=500, max_len=900, stats=stats)
    monkeypatch.undo()
    assert stats["bugs"] == 1 and it["sql"] == calls[1] and verify_item(it)
