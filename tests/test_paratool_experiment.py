"""experiments/paratool on a tiny random base: the scorer against hand-made texts, the
training batches, and one pass of both methods whose reported context tokens are the
prompts' byte counts (recomputed here) and whose accuracies are what ``score`` gives for
the decoded texts."""

import numpy as np
import pytest
from flax import nnx

from experiments.paratool import experiment as ex
from lcjax.data import tokenizer as tok
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.tools import make_examples, make_tools
from lcjax.tools.world import call_text, prompt_text

CFG = DecoderConfig(vocab_size=tok.VOCAB_SIZE, d_model=16, num_layers=1, num_heads=2,
                    num_kv_heads=2, head_dim=8, mlp_hidden=32)


@pytest.fixture(scope="module")
def world():
    tools = make_tools(3, seed=0, min_args=2, max_args=3)
    return tools, make_examples(tools, 6, seed=1, candidates=2)


def test_score_counts_ast_and_selection(world):
    tools, exs = world
    e0, e1, e2 = exs[:3]

    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    with_int = next(e for e in exs if any(is_int(v) for v in e.call["arguments"].values()))
    wrong_value = dict(with_int.call, arguments={k: v + 1 if is_int(v) else v
                                                 for k, v in with_int.call["arguments"].items()})
    texts = [call_text(e0.call),                             # right
             call_text({"name": e2.tool, "arguments": {}}),  # wrong tool (and arguments)
             "not a call"]                                   # parse error
    got = ex.score(texts, [e0, e1, e2], tools)
    assert got["call_acc"] == pytest.approx(1 / 3) and got["select_acc"] == pytest.approx(1 / 3)
    assert got["failures"] == {"wrong_name": 1, "parse_error": 1}
    one = ex.score([call_text(wrong_value)], [with_int], tools)  # same tool, another value
    assert one["call_acc"] == 0 and one["select_acc"] == 1


def test_batches_cover_the_rows_with_one_length(world):
    tools, exs = world
    names = [t.name for t in tools]
    batches = ex._batches(exs, names, 4, 3, seed=0)
    assert len(batches) == 4 and {b["inputs"].shape for b in batches} == {(3, batches[0]
                                                                            ["inputs"].shape[1])}
    assert batches[0]["inputs"].shape[1] % 64 == 0
    first_epoch = np.concatenate([b["tool_index"] for b in batches[:2]])
    assert sorted(first_epoch) == sorted(names.index(e.tool) for e in exs)
    docs = ex._batches(exs, names, 1, 3, tools=tools)
    assert docs[0]["inputs"].shape[1] > 3 * batches[0]["inputs"].shape[1]


def test_both_methods_run_and_report_their_tokens(world):
    tools, exs = world
    base = DecoderLM(CFG, rngs=nnx.Rngs(0))
    # one target kernel: the driver is the same, the compiles smaller
    s = dict(ex.SETTINGS[True], steps=(2, 1, 1), batch=3, rank=2, targets=("q_proj",))
    para, log, _ = ex.train_paratool(base, tools, exs, s)
    docs, dlog, _ = ex.train_docs_baseline(base, tools, exs, s)
    assert set(log) == {"stage1", "stage2", "stage3"} and dlog["steps"] == 4
    evals = {"seen": exs[:2], "heldout": make_examples(tools, 2, seed=5, split="heldout",
                                                       candidates=2)}
    res = ex.evaluate_methods(para, docs, tools, evals, max_new=6)
    for split, rows in evals.items():
        r = res[split]
        bare = np.mean([len(prompt_text(e).encode()) + 1 for e in rows])
        with_docs = np.mean([len(prompt_text(e, tools).encode()) + 1 for e in rows])
        assert r["paratool"]["context_tokens"] == bare
        assert r["docs"]["context_tokens"] == with_docs
        assert r["token_saving"] == pytest.approx(1 - bare / with_docs)
        for m in ("paratool", "docs"):
            assert 0 <= r[m]["call_acc"] <= r[m]["select_acc"] <= 1 and r[m]["n"] == 2
    assert 0 <= res["seen"]["paratool"]["gate_top1"] <= 1


def test_a_tie_at_zero_is_not_matching_the_baseline():
    def split(ours, base):
        return {"paratool": {"call_acc": ours}, "docs": {"call_acc": base}}

    assert ex.matches_or_beats(split(0.0, 0.0), "call_acc") is None  # neither answers
    assert ex.matches_or_beats(split(0.0, 0.03), "call_acc") is None  # 0.00 vs 0.03
    assert ex.matches_or_beats(split(0.0, 0.2), "call_acc") is False
    assert ex.matches_or_beats(split(0.5, 0.5), "call_acc")
    assert ex.matches_or_beats(split(0.6, 0.5), "call_acc")
    assert not ex.matches_or_beats(split(0.4, 0.5), "call_acc")
