"""Tests of lcjax.data.ruler: RULER-style needle-in-a-haystack and variable tracking."""

import re

import numpy as np
import pytest

from lcjax.data import BOS, EOS, PAD, ruler


def _post(s: ruler.Sample) -> bytes:
    """The question at the end of a NIAH prompt (default templates)."""
    query = ruler.join_query(s.info["queries"])
    return ruler.NIAH_QUESTION.format(type="numbers", query=query).encode()


_SEP = {"noise": b" ", "essay": b"\n", "needle": b" "}


def _candidate_starts(hay: bytes, kind: str) -> np.ndarray:
    """Sentence starts (noise, needle) or line starts (essay) of a haystack, 0 and end too."""
    if kind == "essay":
        inner = [m.end() for m in re.finditer(rb"\n", hay)]
    else:
        inner = [m.end() for m in re.finditer(rb"\. ", hay)]
    return np.unique(np.r_[0, inner, len(hay)])


@pytest.mark.parametrize("kind", ["noise", "essay", "needle"])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.37, 0.5, 0.9, 1.0])
def test_needle_at_requested_depth(kind, depth):
    s = ruler.niah(7, 1500, depth=depth, haystack_kind=kind)
    needle, off = s.needles[0], s.offsets[0]
    assert s.prompt[off:off + len(needle)] == needle
    assert s.prompt.count(needle) == 1
    pre = ruler.NIAH_PREFIX.format(type="numbers", query=s.info["queries"][0]).encode()
    post = _post(s)
    assert s.prompt.startswith(pre) and s.prompt.endswith(post)
    before = off - len(pre)  # haystack bytes before the needle (only one needle)
    end = off + len(needle) + 1
    assert s.prompt[off + len(needle):end] == _SEP[kind]
    hay = s.prompt[len(pre):off] + s.prompt[end:len(s.prompt) - len(post)]
    assert len(hay) == s.haystack_bytes
    assert s.depths[0] == pytest.approx(before / s.haystack_bytes)
    # the needle sits at a sentence (line) start, at most one candidate boundary from the
    # requested point (essay passages span up to three lines: two line starts)
    starts = _candidate_starts(hay.rstrip(b" "), kind)
    starts = np.r_[starts, len(hay)]
    assert before in starts
    target = depth * s.haystack_bytes
    between = np.sum((starts > min(target, before)) & (starts < max(target, before)))
    assert between <= (2 if kind == "essay" else 1), (between, before, target)
    if depth == 0.0:
        assert before == 0
    if depth == 1.0:
        assert s.prompt.endswith(needle + _SEP[kind] + post)


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_noise_haystack_is_whole_noise_sentences(depth):
    for seed in range(5):
        s = ruler.niah(seed, 1000 + 37 * seed, depth=depth)
        pre = ruler.NIAH_PREFIX.format(type="numbers", query=s.info["queries"][0]).encode()
        off, needle = s.offsets[0], s.needles[0] + b" "
        rebuilt = s.prompt[:off] + s.prompt[off + len(needle):]
        hay = rebuilt[len(pre):len(rebuilt) - len(_post(s))]
        # whole sentences of the noise, then only padding spaces: never cut mid-sentence
        assert re.fullmatch(rb"((The grass is green|The sky is blue|The sun is yellow|"
                            rb"Here we go|There and back again)\. )+ *", hay), hay[-60:]
        assert hay.rstrip(b" ") == (ruler.NOISE * 100)[:len(hay.rstrip(b" "))]
        assert s.prompt[off - 2:off] == b". " or off == len(pre) or s.prompt[off - 1:off] == b" "


def test_several_needles_each_at_its_depth():
    depths = [0.8, 0.1, 0.5, 0.3]
    s = ruler.niah(11, 3000, num_keys=4, depth=depths, haystack_kind="essay")
    for needle, off in zip(s.needles, s.offsets):
        assert s.prompt[off:off + len(needle)] == needle
    for want, got in zip(depths, s.depths):
        assert abs(want - got) * s.haystack_bytes < 130  # half a passage (<= 3 lines)
    order = np.argsort(s.offsets)
    np.testing.assert_array_equal(order, np.argsort(depths))


def _regex_answer(s: ruler.Sample) -> list[bytes]:
    """Answer a sample by reading its prompt with regexes only (proves it is solvable)."""
    text = s.prompt.decode("utf-8", "replace")
    if s.task == "vt":
        value = re.search(r"assigned the value (\d+) in the text", text).group(1)
        chain = [re.search(rf"VAR ([A-Z]+) = {value}\.", text).group(1)]
        while m := re.search(rf"VAR ([A-Z]+) = VAR {chain[-1]}\.", text):
            chain.append(m.group(1))
        return [c.encode() for c in chain]
    query = re.search(r"special magic \w+ for (.+?) mentioned in the provided text\?",
                      text).group(1)
    keys = re.split(r", and |, ", query)
    type_name = "uuids" if "uuids" in text[:60] else "numbers"
    out = []
    for k in keys:
        pat = rf"One of the special magic {type_name} for {re.escape(k)} is: ([0-9a-f-]+)\."
        out += [m.encode() for m in re.findall(pat, text)]
    return out


@pytest.mark.parametrize("task", [t for t in sorted(ruler.TASKS) if t[:4] in ("niah", "vt")])
def test_answer_is_recoverable_from_the_prompt(task):
    for seed in range(4):
        s = ruler.generate(task, seed, 3000)
        got = _regex_answer(s)
        assert got == list(s.references), (task, seed)  # multivalue: order of appearance
        assert s.answer == (b" " if task == "vt" else b", ").join(s.references)
        if task.startswith("niah"):  # each value is stated once, in its needle, and nowhere else
            assert all(s.prompt.count(r) == 1 for r in s.references)


def test_task_shapes():
    assert len(ruler.generate("niah_multivalue", 0, 3000).references) == 4
    mq = ruler.generate("niah_multiquery", 0, 3000)
    assert len(mq.references) == 4 and len(mq.info["queries"]) == 4
    mk = ruler.generate("niah_multikey_1", 0, 3000)
    assert len(mk.needles) == 4 and mk.num_targets == 1 and len(mk.references) == 1
    mk2 = ruler.generate("niah_multikey_2", 0, 3000)  # haystack of distractor needles
    assert mk2.prompt.count(b"One of the special magic numbers for") > 20
    key = mk2.info["queries"][0].encode()
    assert mk2.prompt.count(b"for " + key + b" is:") == 1
    uu = ruler.generate("niah_multikey_3", 0, 3000)
    assert re.fullmatch(rb"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
                        uu.answer)
    vt = ruler.generate("vt", 0, 3000, num_chains=3, num_hops=2)
    assert len(vt.needles) == 9 and vt.num_targets == 3 and len(vt.references) == 3


def test_variable_tracking_chain_in_order():
    for depth in (None, 0.0, 0.6, [0.1, 0.2, 0.2, 0.7, 0.9]):
        s = ruler.variable_tracking(5, 1500, depth=depth)
        assert list(s.offsets) == sorted(s.offsets)
        for needle, off in zip(s.needles, s.offsets):
            assert s.prompt[off:off + len(needle)] == needle
        if depth is not None and not isinstance(depth, list):
            assert abs(s.depths[0] - depth) * s.haystack_bytes < 25
    with pytest.raises(ValueError, match="nondecreasing"):
        ruler.variable_tracking(5, 1500, depth=[0.5, 0.2, 0.3, 0.7, 0.9])


@pytest.mark.parametrize("task", sorted(ruler.TASKS))
@pytest.mark.parametrize("length", [1200, 4096])
def test_lengths_as_requested(task, length):
    s = ruler.generate(task, 1, length)
    assert s.length == len(s.prompt) + len(s.answer) == length
    batch = ruler.make_batch([s])
    assert batch["inputs"].shape == (1, length)  # BOS + prompt + answer[:-1]


def test_too_short_raises():
    with pytest.raises(ValueError, match="too short"):
        ruler.niah(0, 100)
    with pytest.raises(ValueError, match="depth must lie"):
        ruler.niah(0, 1000, depth=1.5)
    with pytest.raises(ValueError, match="num_queries"):
        ruler.niah(0, 1000, num_keys=1, num_queries=2)


def test_deterministic_under_seed():
    for task in ruler.TASKS:
        a, b = ruler.generate(task, 42, 2000), ruler.generate(task, 42, 2000)
        assert a == b
        assert ruler.generate(task, 43, 2000).prompt != a.prompt
    many = ruler.generate_many("niah_single_2", 9, 1000, 5)
    assert ruler.generate_many("niah_single_2", 9, 1000, 3) == many[:3]
    assert len({s.prompt for s in many}) == 5
    rng = np.random.default_rng(0)
    assert ruler.niah(rng, 800) != ruler.niah(rng, 800)  # a Generator advances


def test_make_batch_layout():
    samples = [ruler.niah(i, 400 + 50 * i, value_digits=4) for i in range(3)]
    batch = ruler.make_batch(samples, 512, eos=True)
    x, y, m = batch["inputs"], batch["targets"], batch["loss_mask"]
    assert x.shape == y.shape == m.shape == (3, 512) and x.dtype == np.int32 and m.dtype == bool
    for i, s in enumerate(samples):
        n = s.length + 1  # BOS + text + EOS, shifted
        seq = np.r_[BOS, np.frombuffer(s.text, np.uint8).astype(np.int32), EOS]
        np.testing.assert_array_equal(x[i, :n], seq[:-1])
        np.testing.assert_array_equal(y[i, :n], seq[1:])
        assert (x[i, n:] == PAD).all() and (y[i, n:] == PAD).all()
        assert bytes(y[i][m[i]][:-1].astype(np.uint8)) == s.answer and y[i][m[i]][-1] == EOS
        assert batch["answer_start"][i] == len(s.prompt) and batch["answer_len"][i] == 5
        assert m[i].sum() == 5
    with pytest.raises(ValueError, match="seq_len"):
        ruler.make_batch(samples, 100)


def test_answer_accuracy_teacher_forced():
    samples = [ruler.niah(i, 500) for i in range(4)]
    batch = ruler.make_batch(samples)
    pred = batch["targets"].copy()
    acc = ruler.answer_accuracy(pred, batch)
    assert acc["exact"].all() and np.allclose(acc["token_acc"], 1.0)
    pred[0, batch["answer_start"][0] + 2] += 1  # one answer byte wrong
    pred[1, 3] += 1  # a prompt byte wrong: not scored
    acc = ruler.answer_accuracy(pred, batch)
    np.testing.assert_array_equal(acc["exact"], [False, True, True, True])
    assert acc["token_acc"][0] == pytest.approx(6 / 7)


def test_string_match_metrics_known_cases():
    preds = ["The numbers are 123 and 456.", "nothing here", "ABC", b"x 123"]
    refs = [["123", "456"], ["789"], ["abc", "def"], [b"123"]]
    # all: (2/2 + 0 + 1/2 + 1) / 4 ; part: (1 + 0 + 1 + 1) / 4
    assert ruler.string_match_all(preds, refs) == pytest.approx(62.5)
    assert ruler.string_match_part(preds, refs) == pytest.approx(75.0)
    assert ruler.string_match_all(["a"], [["a"]]) == 100.0
    assert ruler.string_match_part(["a"], [["b"]]) == 0.0
    with pytest.raises(ValueError, match="as many"):
        ruler.string_match_all(["a"], [["a"], ["b"]])
