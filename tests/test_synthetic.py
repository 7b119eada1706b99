"""lcjax.data.synthetic: ASEntmax's extrapolation tasks as byte text of any length.

Every item is solved by an independent reader of the text (regexes and a scan, written
without the generators' code); the rows' loss mask covers exactly the answer bytes; the
generators and the grain source are deterministic per seed / per index.
"""

import re
from collections import Counter

import grain
import numpy as np
import pytest

from lcjax.data import BOS, PAD, synthetic
from lcjax.data.ruler import answer_accuracy

# --- independent solvers: the text in, the answers out ---------------------------------------


def solve_mqmtar(text: str) -> list[str]:
    context, queries = text.split("\n")
    pairs = re.findall(r"([a-z]+):([a-z]+)", context)
    keys = Counter(k for k, _ in pairs)
    assert max(keys.values()) == 1, "a key appears twice in the context"
    assert len({v for _, v in pairs}) == len(pairs), "a value appears twice"
    assert re.fullmatch(r"( *[a-z]+:[a-z]+)*( )*", context.replace("\n", ""))
    table = dict(pairs)
    asked = re.findall(r"\?([a-z]+):", queries)
    assert len(asked) == len(set(asked)), "a key is queried twice"
    return [table[k] for k in asked]


def solve_flip_flop(text: str) -> list[str]:
    body = text.lstrip(" ")
    assert len(text) - len(body) <= 1 and len(body) % 2 == 0
    ops = [(body[i], body[i + 1]) for i in range(0, len(body), 2)]
    assert ops[0][0] == "w" and ops[-1][0] == "r"
    assert all(op in "wi" and bit in "01" for op, bit in ops[:-1])
    bit = None
    for op, b in ops[:-1]:
        if op == "w":
            bit = b
    return [bit]


def solve_copy(text: str) -> list[str]:
    src, dst = text.lstrip(" ").split("=")
    assert len(src) == len(dst)
    return [src]


SOLVERS = {"mqmtar": solve_mqmtar, "flip_flop": solve_flip_flop, "copy": solve_copy}


def _answers_of_row(batch, b) -> bytes:
    """The target bytes the loss mask selects in row b."""
    return bytes(batch["targets"][b][batch["loss_mask"][b]].astype(np.uint8).tolist())


@pytest.mark.parametrize("task", sorted(SOLVERS))
def test_independent_solver_recovers_every_answer(task):
    rng = np.random.default_rng(2024)
    lo = synthetic.min_length(task)
    lengths = rng.integers(lo, 700, 1000)
    lengths[:5] = [lo, lo + 1, lo + 2, 1023, 1024]  # the shortest and both parities
    for i, length in enumerate(lengths):
        s = synthetic.generate(task, np.random.default_rng([5, i]), int(length))
        text = (s.prompt + s.answer).decode("ascii")
        assert len(text) == length == s.length
        got = SOLVERS[task](text)
        assert [r.decode() for r in s.references] == got, (task, length, text)
        assert len(s.info["spans"]) == len(got)
        batch = synthetic.make_batch([s])
        assert batch["inputs"].shape == (1, length) and batch["inputs"][0, 0] == BOS
        assert _answers_of_row(batch, 0) == "".join(got).encode()
        # a perfect predictor scores exact, one wrong answer byte does not
        assert answer_accuracy(batch["targets"], batch)["exact"].all()
        wrong = batch["targets"].copy()
        wrong[0, batch["answer_start"][0]] += 1
        assert not answer_accuracy(wrong, batch)["exact"].any()


def test_task_statistics():
    """MQMTAR's pair count grows with the length (ASEntmax's kv fraction); flip-flop's bits
    are balanced and writes occur at about write_prob; copy letters are uniform."""
    pairs = {n: np.mean([synthetic.mqmtar(i, n).info["num_pairs"] for i in range(20)])
             for n in (64, 256, 1024)}
    for n, p in pairs.items():  # context = n - 25 bytes, 0.8 of it in 6-byte slots
        assert p == int(0.8 * (n - 25) // 6)
    items = [synthetic.flip_flop(i, 200, write_prob=0.2) for i in range(400)]
    bits = np.array([s.answer == b"1" for s in items])
    assert abs(bits.mean() - 0.5) < 0.08
    inner = np.mean([(s.info["writes"] - 1) / 98 for s in items])
    assert abs(inner - 0.2) < 0.01
    letters = Counter(b"".join(synthetic.copy(i, 201).answer for i in range(200)).decode())
    assert len(letters) == 26 and max(letters.values()) / min(letters.values()) < 1.5


@pytest.mark.parametrize("task", sorted(SOLVERS))
def test_deterministic_per_seed(task):
    a = synthetic.generate(task, 11, 300)
    b = synthetic.generate(task, np.random.default_rng(11), 300)
    c = synthetic.generate(task, 12, 300)
    assert a == b and a.prompt + a.answer != c.prompt + c.answer


def test_source_rows_per_index_and_grain():
    src = synthetic.SyntheticSource("mqmtar", (60, 90), num_records=50, seed=3)
    again = synthetic.SyntheticSource("mqmtar", (60, 90), num_records=50, seed=3)
    lengths = set()
    for i in (0, 7, 49):
        row = src[i]
        assert all(np.array_equal(row[k], again[i][k]) for k in row)
        assert row["inputs"].shape == (90,)
        n = int((row["inputs"] != PAD).sum())
        lengths.add(n)
        assert 60 <= n <= 90 and (row["targets"][n:] == PAD).all()
        assert _answers_of_row({k: v[None] for k, v in row.items()}, 0) == b"".join(
            src.sample(i).references)
    assert len(lengths) > 1
    with pytest.raises(IndexError):
        src[50]
    ds = grain.MapDataset.source(src).batch(4)
    first = ds[0]
    assert first["inputs"].shape == (4, 90)
    assert np.array_equal(first["loss_mask"][2], src[2]["loss_mask"])
    fixed = synthetic.SyntheticSource("flip_flop", 33, num_records=5)
    s = synthetic.flip_flop(np.random.default_rng([0, 4]), 33)
    assert np.array_equal(fixed[4]["targets"], synthetic.make_batch([s])["targets"][0])


@pytest.mark.parametrize("call, match", [
    (lambda: synthetic.mqmtar(0, 40), "too short"),
    (lambda: synthetic.mqmtar(0, 100, kv_fraction=0), "kv_fraction"),
    (lambda: synthetic.mqmtar(0, 100, alphabet="ab:"), "alphabet"),
    (lambda: synthetic.mqmtar(0, 100, num_queries=0), "num_queries"),
    (lambda: synthetic.flip_flop(0, 3), "length"),
    (lambda: synthetic.flip_flop(0, 30, write_prob=1.0), "write_prob"),
    (lambda: synthetic.copy(0, 2), "length"),
    (lambda: synthetic.generate("sort", 0, 30), "unknown task"),
    (lambda: synthetic.SyntheticSource("copy", 10, num_records=0), "num_records"),
    (lambda: synthetic.SyntheticSource("mqmtar", 30, num_records=3), "length"),
    (lambda: synthetic.SyntheticSource("copy", 40, num_records=3, seq_len=20), "seq_len"),
])
def test_bad_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()
