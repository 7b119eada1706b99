"""lcjax.eval: items, the callable and lcjax-model paths, results files, metrics, reports,
checkpoint loading and ``lcjax eval --model`` (the endpoint path: test_eval_endpoint.py)."""

import json
import random

import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import pytest
from flax import nnx

from lcjax.data import ruler
from lcjax.data import tokenizer as tok
from lcjax.data.suites import Suite, SuiteTask, register_suite
from lcjax.eval import (
    bucket_length,
    build_items,
    evaluate,
    length_buckets,
    load_model,
    parse_depths,
    parse_lengths,
    with_attention,
    write_report,
)
from lcjax.eval.results import read_results
from lcjax.nn import DecoderConfig, DecoderLM, generate

TASKS = (SuiteTask("single", "niah_single_1"),
         SuiteTask("multi", "niah_single_1", {"num_values": 4}),
         SuiteTask("vt", "vt", uses_depth=False))


def mini_suite() -> Suite:
    return Suite("mini", ruler.generate, TASKS)


ARGS = dict(lengths=(700, 900), depths=(0.0, 0.5, 1.0), n_per_cell=2)  # 28 items


def oracle(items):
    answers = {it.prompt.decode(): ", ".join(r.decode() for r in it.references) for it in items}
    return lambda prompts: [answers[p] for p in prompts]


# --- items -------------------------------------------------------------------------------


def test_items_cells_are_stable_and_follow_the_request():
    items = build_items(mini_suite(), seed=1, **ARGS)
    assert len(items) == 2 * (2 * 3 * 2) + 2 * 2
    assert {(it.task, it.depth) for it in items if it.task == "vt"} == {("vt", None)}
    for it in items:
        assert len(it.prompt) + len(it.answer) == it.length
        assert it.references == it.sample.references
        if it.depth is not None:
            assert abs(it.sample.depths[0] - it.depth) < 0.1
    assert len({it.prompt for it in items}) == len(items)
    # an item does not depend on the other cells asked for
    small = build_items(mini_suite(), (900,), (0.5,), 1, seed=1, tasks=["multi"])
    assert small[0].prompt == next(it.prompt for it in items if it.key == small[0].key)
    other = build_items(mini_suite(), (900,), (0.5,), 1, seed=2, tasks=["multi"])
    assert other[0].prompt != small[0].prompt
    with pytest.raises(ValueError, match="unknown task"):
        build_items(mini_suite(), (500,), tasks=["nope"])
    for bad, name in (({"lengths": ()}, "lengths"), ({"depths": (1.5,)}, "depths"),
                      ({"n_per_cell": 0}, "n_per_cell")):
        with pytest.raises(ValueError, match=name):
            build_items(mini_suite(), **{**ARGS, **bad})


def test_tokenizer_is_passed_to_the_generator_only_when_given():
    seen = []

    def gen(task, seed, length, **kw):
        seen.append(kw)
        return ruler.generate(task, seed, length, **{k: v for k, v in kw.items()
                                                     if k != "tokenizer"})

    suite = Suite("spy", gen, (SuiteTask("s", "niah_single_1", {"value_digits": 5}),))
    build_items(suite, (500,), (0.25,), 1)
    build_items(suite, (500,), (0.25,), 1, tokenizer="T")
    assert seen == [{"value_digits": 5, "depth": 0.25},
                    {"value_digits": 5, "depth": 0.25, "tokenizer": "T"}]


def test_parse_lengths_depths_and_buckets():
    assert parse_lengths("1k,2k, 4k,512,1.5k") == (1024, 2048, 4096, 512, 1536)
    assert parse_lengths("1m") == (1024**2,)
    for bad in ("", "1x", "0", "1.0001k"):
        with pytest.raises(ValueError, match="lengths"):
            parse_lengths(bad)
    assert parse_depths("0,0.5,1") == (0.0, 0.5, 1.0)
    with pytest.raises(ValueError, match="depths"):
        parse_depths("0,2")
    rng = np.random.default_rng(0)
    for n in rng.integers(1, 100_000, 300):
        b = bucket_length(int(n))
        assert n <= b < n + max(64, n / 4 + 1) and b % 64 == 0
    for k in (9, 12, 15):  # at most 8 padded lengths per octave
        assert len({bucket_length(n) for n in range(2**k + 1, 2**(k + 1) + 1)}) <= 8
    lens = [int(x) for x in rng.integers(1, 3000, 50)]
    batches = length_buckets(lens, 4)
    assert sorted(i for _, idx in batches for i in idx) == list(range(50))
    for p, idx in batches:
        assert 1 <= len(idx) <= 4 and all(bucket_length(lens[i]) == p for i in idx)


# --- callable path -----------------------------------------------------------------------


def test_callable_oracle_scores_100_and_random_near_chance():
    items = build_items(mini_suite(), seed=0, **ARGS)
    res = evaluate(oracle(items), mini_suite(), seed=0, progress=False, **ARGS)
    assert res.summary["overall"] == {"n": 28, "errors": 0, "string_match_all": 100.0,
                                      "string_match_part": 100.0}
    rng = random.Random(0)
    words = [w for it in items for w in it.prompt.decode().split()]
    res = evaluate(lambda ps: [" ".join(rng.choices(words, k=8)) + f" {rng.randrange(10**7)}"
                               for _ in ps], mini_suite(), seed=0, progress=False, **ARGS)
    s = res.summary["overall"]
    assert s["errors"] == 0 and s["string_match_all"] <= 5 and s["string_match_part"] <= 5


def test_metrics_per_cell_match_a_direct_computation():
    items = build_items(mini_suite(), seed=0, tasks=["multi"], **ARGS)
    rng = np.random.default_rng(0)
    keep = {it.prompt.decode(): rng.random(4) < 0.5 for it in items}
    answers = {it.prompt.decode(): it.references for it in items}

    def partial(prompts):  # each reference kept with probability 1/2, shuffled, with noise
        return [" and ".join(r.decode().upper() for r, k in zip(answers[p], keep[p]) if k)
                + " 12" for p in prompts]

    res = evaluate(partial, mini_suite(), seed=0, tasks=["multi"], progress=False, **ARGS)
    cells = res.summary["tasks"]["multi"]["cells"]
    assert len(cells) == 6
    for c in cells:
        ks = [keep[it.prompt.decode()] for it in items
              if (it.length, it.depth) == (c["length"], c["depth"])]
        assert c["n"] == len(ks) == 2
        assert c["string_match_all"] == pytest.approx(100 * np.mean([k.mean() for k in ks]))
        assert c["string_match_part"] == pytest.approx(100 * np.mean([k.any() for k in ks]))
    per_len = res.summary["tasks"]["multi"]["lengths"]["700"]
    ks = [keep[it.prompt.decode()] for it in items if it.length == 700]
    assert per_len["string_match_all"] == pytest.approx(100 * np.mean([k.mean() for k in ks]))


def test_callable_failures_are_recorded_per_chunk(tmp_path):
    items = build_items(mini_suite(), seed=0, **ARGS)
    answer = oracle(items)
    calls = []

    def flaky(prompts):
        calls.append(len(prompts))
        if len(calls) == 2:
            raise RuntimeError("boom")
        if len(calls) == 3:
            return answer(prompts)[:-1]
        if len(calls) == 4:
            return [None] + answer(prompts)[1:]
        return answer(prompts)

    res = evaluate(flaky, mini_suite(), seed=0, batch_size=5, progress=False, **ARGS)
    assert calls == [5, 5, 5, 5, 5, 3]
    errs = [r["error"] for r in res.records]
    assert all("RuntimeError: boom" in e for e in errs[5:10])
    assert all("4 texts for 5" in e for e in errs[10:15])
    assert "NoneType" in errs[15] and not any(errs[16:]) and not any(errs[:5])
    s = res.summary["overall"]
    assert s["errors"] == 11 and s["string_match_all"] == pytest.approx(100 * 17 / 28)


def test_a_score_hook_that_raises_fails_only_that_item():
    def score(sample, prediction):
        if prediction.startswith("BAD"):
            raise KeyError("unparseable")
        return {"chars": len(prediction)}

    suite = Suite("mini_scored", ruler.generate, TASKS, score=score)
    items = build_items(suite, seed=0, **ARGS)
    answer = oracle(items)
    res = evaluate(lambda ps: ["BAD" if i == 3 else a for i, a in enumerate(answer(ps))],
                   suite, seed=0, batch_size=7, progress=False, **ARGS)
    bad = [i for i, r in enumerate(res.records) if r["error"]]
    assert bad == [3, 10, 17, 24]
    for i, r in enumerate(res.records):
        if i in bad:
            assert "suite score hook failed: KeyError" in r["error"]
            assert r["string_match_all"] == 0 and r["suite_metrics"] == {"chars": 0}
        else:
            assert r["suite_metrics"] == {"chars": len(r["prediction"])}
    broken = Suite("mini_broken", ruler.generate, TASKS, score=lambda s, p: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        evaluate(answer, broken, seed=0, progress=False, **ARGS)


def test_results_file_resume_after_a_partial_write(tmp_path):
    items = build_items(mini_suite(), seed=0, **ARGS)
    answer, asked = oracle(items), []

    def counting(prompts):
        asked.extend(prompts)
        return answer(prompts)

    path = tmp_path / "r" / "results.jsonl"
    first = evaluate(counting, mini_suite(), seed=0, results_file=path, progress=False, **ARGS)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["header"]["suite"] == "mini" and len(lines) == 29
    assert evaluate(counting, mini_suite(), seed=0, results_file=path, resume=True,
                    progress=False, **ARGS).records == first.records
    assert len(asked) == 28
    # a killed run: 10 records, then half a line
    path.write_text("\n".join(lines[:11]) + "\n" + lines[11][:30])
    asked.clear()
    with pytest.warns(UserWarning, match="skipping"):
        again = evaluate(counting, mini_suite(), seed=0, results_file=path, resume=True,
                         progress=False, **ARGS)
    assert sorted(asked) == sorted(it.prompt.decode() for it in items[10:])
    assert again.records == first.records and again.config["resumed"] == 10
    with pytest.warns(UserWarning):
        _, saved = read_results(path)
    assert len(saved) == 28
    # a larger run in the same file asks only the new items
    asked.clear()
    with pytest.warns(UserWarning):
        evaluate(counting, mini_suite(), seed=0, results_file=path, resume=True,
                 progress=False, **{**ARGS, "lengths": (700, 900, 1000)})
    assert len(asked) == 14 and all(900 < len(p) < 1000 for p in asked)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="resume=True"):
        evaluate(counting, mini_suite(), seed=0, results_file=path, progress=False, **ARGS)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="backend"):
        evaluate(lambda ps: ps, mini_suite(), seed=0, results_file=path, resume=True,
                 progress=False, **ARGS)


def test_report_files(tmp_path):
    items = build_items(mini_suite(), seed=0, **ARGS)
    answer = oracle(items)
    res = evaluate(lambda ps: [a if i % 3 else "no" for i, a in enumerate(answer(ps))],
                   mini_suite(), seed=0, batch_size=6, progress=False, **ARGS)
    files = write_report(res, str(tmp_path), command="lcjax eval ...")
    assert set(files) == {"json", "md", "single_heatmap", "multi_heatmap", "vt_heatmap"}
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["summary"] == json.loads(json.dumps(res.summary))
    assert len(data["records"]) == 28
    md = (tmp_path / "results.md").read_text()
    for name in ("## single", "## multi", "## vt", "lcjax eval ..."):
        assert name in md
    c = res.summary["tasks"]["single"]["cells"][0]
    assert f"{c['string_match_all']:.1f} / {c['string_match_part']:.1f} (n=2)" in md
    for name in ("single", "vt"):
        img = matplotlib.image.imread(tmp_path / f"{name}_heatmap.png")
        assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50


def test_target_errors():
    with pytest.raises(ValueError, match="not a directory"):
        evaluate("/nonexistent/run", mini_suite(), (900,), progress=False)
    with pytest.raises(ValueError, match="cannot evaluate"):
        evaluate(42, mini_suite(), (900,), progress=False)
    with pytest.raises(ValueError, match="lcjax models only"):
        evaluate(lambda ps: ps, mini_suite(), (900,), attention="blockwise", progress=False)
    with pytest.raises(ValueError, match="vocab_size"):
        evaluate(DecoderLM(DecoderConfig(vocab_size=256, d_model=16, num_layers=1,
                                         num_heads=2, num_kv_heads=2, head_dim=8,
                                         mlp_hidden=16), rngs=nnx.Rngs(0)),
                 mini_suite(), (900,), progress=False)


# --- lcjax model path ----------------------------------------------------------------------

TINY = DecoderConfig(vocab_size=tok.VOCAB_SIZE, d_model=32, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, mlp_hidden=64, max_len=1024)
MODEL_ARGS = dict(lengths=(420, 600), depths=(0.0, 1.0), n_per_cell=2, tasks=["single"])


def direct_predictions(model, items, n: int) -> list[str]:
    """Greedy answers from one lcjax.nn.generate call over all prompts, padded alike."""
    ids = [tok.encode(it.prompt, bos=True) for it in items]
    p = max(map(len, ids))
    rows = np.zeros((len(ids), p), np.int32)
    for r, x in enumerate(ids):
        rows[r, :len(x)] = x
    lens = np.array([len(x) for x in ids], np.int32)
    out = generate(model, jnp.asarray(rows), n, prompt_lengths=jnp.asarray(lens),
                   stop_tokens=(tok.EOS,))
    toks, ends = np.asarray(out.tokens), np.asarray(out.lengths)
    return [tok.decode([t for t in toks[r, lens[r]:ends[r]] if t < 256]).strip()
            for r in range(len(ids))]


@pytest.mark.parametrize("attention", [None, "blockwise"])
def test_model_path_matches_generate_and_random_model_is_near_chance(attention):
    model = DecoderLM(TINY, rngs=nnx.Rngs(1))
    items = build_items(mini_suite(), seed=0, **{k: v for k, v in MODEL_ARGS.items()
                                                  if k != "tasks"}, tasks=["single"])
    res = evaluate(model, mini_suite(), seed=0, batch_size=3, attention=attention,
                   progress=False, **MODEL_ARGS)
    assert res.config["max_new_tokens"] == 7 + 16
    ref_model = model if attention is None else with_attention(model, attention)
    if attention:
        assert ref_model.config.attention == "blockwise"
        assert res.config["backend"].endswith("attention=blockwise")
    want = direct_predictions(ref_model, items, 23)
    assert [r["prediction"] for r in res.records] == want
    assert any(want)  # a random model writes something
    s = res.summary["overall"]
    assert s["n"] == 8 and s["errors"] == 0 and s["string_match_all"] <= 5


def test_checkpoint_folder_and_cli(tmp_path, capsys):
    from lcjax.cli import main
    from lcjax.train import TrainConfig, train

    run = tmp_path / "run"
    text = "The quick brown fox jumps over the lazy dog. " * 40
    trained = train(TINY, TrainConfig(steps=2, batch_size=2, seq_len=32, warmup_steps=0,
                                      eval_batches=0, out_dir=str(run), progress=False),
                    train_docs=[text])
    model = load_model(run)
    want = nnx.state(trained.model, nnx.Param)
    got = nnx.state(model, nnx.Param)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert load_model(run, attention="blockwise").config.attention == "blockwise"
    with pytest.raises(ValueError, match="config.json"):
        load_model(tmp_path)

    args = dict(MODEL_ARGS, lengths=(420,), n_per_cell=1)
    from_dir = evaluate(str(run), mini_suite(), seed=0, batch_size=2, progress=False, **args)
    from_model = evaluate(trained.model, mini_suite(), seed=0, batch_size=2, progress=False,
                          **args)
    assert [r["prediction"] for r in from_dir.records] == \
        [r["prediction"] for r in from_model.records]

    register_suite("eval_model_mini", mini_suite)
    out = tmp_path / "out"
    argv = ["eval", "--suite", "eval_model_mini", "--model", str(run), "--lengths", "420",
            "--depths", "0,1", "--n-per-cell", "1", "--tasks", "single", "--out", str(out),
            "--no-progress", "--batch-size", "2"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["overall"]["n"] == 2
    data = json.loads((out / "results.json").read_text())
    assert [r["prediction"] for r in data["records"]] == \
        [r["prediction"] for r in from_dir.records]
    assert "--model" in data["command"] and data["machine"]["backend"] == "cpu"
    assert (out / "single_heatmap.png").stat().st_size > 0
    with pytest.raises(ValueError, match="resume"):
        main(argv)
    assert main(argv + ["--resume"]) == 0
