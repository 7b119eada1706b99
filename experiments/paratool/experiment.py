"""ParaTool (parameterized tools; BUPT-GAMMA, arXiv 2605.29561): one LoRA module per tool
and a gate over the query instead of tool documents in the context, against the same base
fine-tuned with the documents in the prompt.

Protocol. The base is the Shakespeare-pretrained byte LM of
``experiments.common.shakespeare_base`` (4 layers, d = 128). The tool world
(``lcjax.tools.world``) has K tools (full: K = 16); training queries use the ``seen``
paraphrase templates and phrasings, evaluation both ``seen`` (new queries, same wordings)
and ``heldout`` (templates and phrasings never trained on). Every example lists
``candidates`` tools (the gold one and the most confusable others).

- **ParaTool** (``lcjax.tools.paratool``), prompt ``"Query: <q>\\nCall: "`` — no documents:
  stage 1 trains each tool's rank-r LoRA module (q, v, o, w_up, w_down of every layer) on
  that tool's calls (one ``train(wrt=LoRAParam)`` run, each row routed to its gold tool's
  module), stage 2 the gate (a linear map of the base's mean final hidden state over the
  query, softmax over the K tools, Switch balance term) with base and modules frozen,
  stage 3 gate and modules jointly. At inference each query decodes greedily with
  W + Σ_k g_k ΔW_k, g from its own gate.
- **In-context docs** (the baseline): the same base, every parameter fine-tuned (a full
  fine-tune, not LoRA) on prompts ``"Tools:\\n<candidates' OpenAI schemas>\\nQuery: ...``
  for S1 + S2 + S3 steps at the same batch size — the same number of optimizer steps and
  training rows as ParaTool's three stages together (its rows are ~10x longer, so it costs
  more compute; both wall times are reported).

Metrics, on the decoded text after ``Call: ``: call accuracy = ``ast_check`` (BFCL's AST
rules: name, required, types, enums, values) accepts it; tool selection = the parsed
call's name is the gold tool's (a parse error counts as wrong); for ParaTool also the
gate's top-1 tool; context tokens per query = the prompt's byte tokens + BOS. Both
methods' numbers and the token saving are reported whatever they are.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np

from experiments.common import (
    Claim,
    Experiment,
    Result,
    copy_model,
    machine_info,
    shakespeare_base,
)

TARGETS = ("q_proj", "v_proj", "o_proj", "w_up", "w_down")
SETTINGS = {
    # quick: a smoke run (118 s quiet with 4 tools, 2 candidates, steps (4, 2, 2): cut to fit)
    True: dict(tools=2, args=(2, 3), candidates=1, train=8, eval=2, batch=4, rank=2,
               steps=(2, 1, 1), targets=TARGETS),
    # full: most steps go to stage 1, where each module must learn the call format from its
    # own tool's rows (240 * 4 / 16 = 60 each). Not yet run to the end: on 2026-12-04 (load
    # ~15) it was stopped after 926 CPU-s (57 min) inside the docs baseline's training
    # (ParaTool's stages done); the baseline's 1,024-token rows dominate the cost
    False: dict(tools=16, args=(2, 3), candidates=2, train=800, eval=32, batch=4, rank=8,
                steps=(240, 40, 40), targets=TARGETS),
}
SPLITS = ("seen", "heldout")


def _seq_len(batch_rows: int) -> int:
    return int(-(-batch_rows // 64) * 64)


def _batches(examples, names, steps: int, batch: int, tools=None, seed: int = 0) -> list:
    """``steps`` batches of ``batch`` rows (epochs reshuffled), all padded to one length
    (one compile) — the rows :func:`lcjax.tools.world.make_tool_batch` makes, plus
    ``tool_index``."""
    from lcjax.tools.paratool import tool_index
    from lcjax.tools.world import make_tool_batch

    full = make_tool_batch(examples, tools=tools)
    t = _seq_len(full["inputs"].shape[1])
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(len(examples))
                            for _ in range(-(-steps * batch // len(examples)))])
    out = []
    for s in range(steps):
        rows = [examples[i] for i in order[s * batch:(s + 1) * batch]]
        b = make_tool_batch(rows, t, tools=tools)
        b.pop("context_tokens")
        b["tool_index"] = tool_index(rows, names)
        out.append(b)
    return out


def _cfg(steps: int, lr: float):
    from lcjax.train import TrainConfig

    return TrainConfig(steps=steps, warmup_steps=steps // 10, lr=lr,
                       weight_decay=0.0, progress=False, eval_batches=0,
                       log_every=max(1, steps // 4))


def train_paratool(base, tools, train_ex, s: dict) -> tuple:
    """Stages 1 -> 3 on a copy of ``base``; (model, per-stage first/last loss, seconds)."""
    from flax import nnx

    from lcjax.nn.lora import LoRAConfig, LoRAModel
    from lcjax.tools import paratool as pt

    names = [t.name for t in tools]
    lora = LoRAModel(copy_model(base))
    for i, n in enumerate(names):
        lora.add_adapter(n, LoRAConfig(rank=s["rank"], alpha=2.0 * s["rank"],
                                       target_modules=s["targets"]), rngs=nnx.Rngs(100 + i))
    model = pt.ParaToolModel(lora, names, rngs=nnx.Rngs(7))
    s1, s2, s3 = s["steps"]
    log, t0 = {}, time.perf_counter()
    stages = ((pt.train_tool_modules, s1, 3e-3, {}),
              (pt.train_gate, s2, 1e-2, {"balance_weight": 0.01}),
              (pt.train_joint, s3, 1e-3, {"balance_weight": 0.01}))
    for k, (fn, steps, lr, kw) in enumerate(stages, 1):
        data = _batches(train_ex, names, steps, s["batch"], seed=k)
        result = fn(model, _cfg(steps, lr), data, **kw)
        model = result.model
        log[f"stage{k}"] = {"steps": steps, "lr": lr, "first_loss": result.history[0]["loss"],
                            "last_loss": result.history[-1]["loss"]}
    return model, log, time.perf_counter() - t0


def train_docs_baseline(base, tools, train_ex, s: dict) -> tuple:
    """The base fully fine-tuned with the candidates' docs in every prompt."""
    from lcjax.train import train
    from lcjax.train.losses import answer_weighted_nll

    names = [t.name for t in tools]
    steps = sum(s["steps"])
    t0 = time.perf_counter()
    model = copy_model(base)
    result = train(model.config, _cfg(steps, 1e-3),
                   dataset=_batches(train_ex, names, steps, s["batch"], tools=tools, seed=9),
                   model_fn=lambda *_: model,
                   loss_fn=functools.partial(answer_weighted_nll, other_weight=0.0))
    log = {"steps": steps, "lr": 1e-3, "first_loss": result.history[0]["loss"],
           "last_loss": result.history[-1]["loss"]}
    return result.model, log, time.perf_counter() - t0


def score(texts, examples, tools) -> dict:
    """Call accuracy (ast_check), tool selection (parsed name = gold) and the failure
    categories of ``texts`` against the examples' gold calls."""
    from lcjax.tools import CallParseError, ast_check, parse_call

    by_name = {t.name: t for t in tools}
    ok, picked, reasons = [], [], {}
    for text, e in zip(texts, examples, strict=True):
        good, reason = ast_check(text, e.call, by_name[e.tool].schema)
        ok.append(good)
        try:
            picked.append(parse_call(text)["name"] == e.tool)
        except CallParseError:
            picked.append(False)
        if not good:
            cat = reason.split(":", 1)[0]
            reasons[cat] = reasons.get(cat, 0) + 1
    return {"call_acc": float(np.mean(ok)), "select_acc": float(np.mean(picked)),
            "failures": reasons, "n": len(texts), "example": texts[0]}


def evaluate_methods(paratool, baseline, tools, evals: dict, max_new: int) -> dict:
    """Both methods on each split: decoded calls scored, context tokens per query."""
    from lcjax.eval.runners import model_runner
    from lcjax.tools import paratool as pt
    from lcjax.tools.world import prompt_text

    names = [t.name for t in tools]
    run_docs = model_runner(baseline, max_new_tokens=max_new, batch_size=8)
    out = {}
    for split, exs in evals.items():
        gold = pt.tool_index(exs, names)
        t0 = time.perf_counter()
        prompts = [prompt_text(e) for e in exs]
        texts, gates = pt.generate_calls(paratool, prompts, max_new)
        para = score(texts, exs, tools)
        para.update(gate_top1=float(np.mean(gates.argmax(1) == gold)),
                    gate_gold_weight=float(np.mean(gates[np.arange(len(exs)), gold])),
                    context_tokens=float(np.mean([len(p.encode()) + 1 for p in prompts])),
                    decode_s=time.perf_counter() - t0)
        t0 = time.perf_counter()
        docs_prompts = [prompt_text(e, tools) for e in exs]
        got = dict((i, txt) for i, txt, _ in run_docs([p.encode() for p in docs_prompts]))
        docs = score([got[i] for i in range(len(exs))], exs, tools)
        docs.update(context_tokens=float(np.mean([len(p.encode()) + 1 for p in docs_prompts])),
                    decode_s=time.perf_counter() - t0)
        out[split] = {"paratool": para, "docs": docs,
                      "token_saving": 1 - para["context_tokens"] / docs["context_tokens"]}
    return out


def plot(res: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    x = np.arange(len(SPLITS))
    for ax, key, title in ((axes[0], "call_acc", "call accuracy (AST)"),
                           (axes[1], "select_acc", "tool-selection accuracy")):
        for j, (m, label) in enumerate((("paratool", "ParaTool (no docs)"),
                                        ("docs", "in-context docs"))):
            vals = [res[s][m][key] for s in SPLITS]
            ax.bar(x + (j - 0.5) * 0.38, vals, 0.38, label=label)
        ax.set_xticks(x, SPLITS)
        ax.set_ylim(0, 1.05)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    for j, m in enumerate(("paratool", "docs")):
        axes[2].bar(x + (j - 0.5) * 0.38, [res[s][m]["context_tokens"] for s in SPLITS], 0.38)
    axes[2].set_xticks(x, SPLITS)
    axes[2].set_yscale("log")
    saving = np.mean([res[s]["token_saving"] for s in SPLITS])
    axes[2].set_title(f"context tokens / query ({100 * saving:.0f}% saved)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


ANSWERS = 0.10  # precondition of the accuracy claims: one method reaches this accuracy


def matches_or_beats(split: dict, metric: str) -> bool | None:
    """ParaTool's ``metric`` is at least the in-context baseline's: None (not tested) when
    neither method reaches ANSWERS — two models that never answer cannot be compared."""
    ours, base = split["paratool"][metric], split["docs"][metric]
    if max(ours, base) < ANSWERS:
        return None
    return bool(ours >= base)


def run(quick: bool, out_dir: Path) -> Result:
    from lcjax.tools import make_examples, make_tools
    from lcjax.tools.world import call_text

    t0 = time.perf_counter()
    s = SETTINGS[quick]
    base, base_info = shakespeare_base(quick)
    tools = make_tools(s["tools"], seed=0, min_args=s["args"][0], max_args=s["args"][1])
    train_ex = make_examples(tools, s["train"], seed=1, split="seen",
                             candidates=s["candidates"])
    evals = {sp: make_examples(tools, s["eval"], seed=2 + i, split=sp,
                               candidates=s["candidates"]) for i, sp in enumerate(SPLITS)}
    max_new = max(len(call_text(e.call).encode()) for v in evals.values() for e in v) + 16
    paratool, para_log, para_s = train_paratool(base, tools, train_ex, s)
    docs, docs_log, docs_s = train_docs_baseline(base, tools, train_ex, s)
    res = evaluate_methods(paratool, docs, tools, evals, max_new)
    fig = plot(res, out_dir / "paratool.png")
    h, se = res["heldout"], res["seen"]
    answers = f"a method answers: accuracy ≥ {ANSWERS} for ParaTool or in-context docs"
    claims = [
        Claim("ParaTool puts no tool documents in the context: fewer context tokens per "
              "query", "ParaTool < in-context docs",
              f"{se['paratool']['context_tokens']:.0f} vs {se['docs']['context_tokens']:.0f} "
              f"({100 * se['token_saving']:.1f}% saved, seen)",
              bool(se["token_saving"] > 0)),
        Claim("held-out templates: ParaTool's AST call accuracy >= in-context docs' "
              "(paper: parameterized tools match or beat documents in context)",
              ">= baseline",
              f"{h['paratool']['call_acc']:.3f} vs {h['docs']['call_acc']:.3f}",
              matches_or_beats(h, "call_acc"), answers),
        Claim("seen templates: ParaTool's AST call accuracy >= in-context docs'",
              ">= baseline",
              f"{se['paratool']['call_acc']:.3f} vs {se['docs']['call_acc']:.3f}",
              matches_or_beats(se, "call_acc"), answers),
        Claim("held-out templates: ParaTool's tool selection >= in-context docs'",
              ">= baseline",
              f"{h['paratool']['select_acc']:.3f} vs {h['docs']['select_acc']:.3f} (gate "
              f"top-1 {h['paratool']['gate_top1']:.3f})",
              matches_or_beats(h, "select_acc"), answers),
    ]
    numbers = {"settings": s, "base": base_info,
               "paratool_train": para_log, "paratool_train_s": para_s,
               "docs_train": docs_log, "docs_train_s": docs_s, "results": res,
               "max_new_tokens": max_new, "wall_s": time.perf_counter() - t0,
               "machine": machine_info()}
    notes = "; ".join(
        f"{sp}: ParaTool call {res[sp]['paratool']['call_acc']:.2f} select "
        f"{res[sp]['paratool']['select_acc']:.2f} ({res[sp]['paratool']['context_tokens']:.0f} "
        f"tokens) vs docs call {res[sp]['docs']['call_acc']:.2f} select "
        f"{res[sp]['docs']['select_acc']:.2f} ({res[sp]['docs']['context_tokens']:.0f} tokens)"
        for sp in SPLITS) + f"; train {para_s:.0f} s vs {docs_s:.0f} s"
    return Result(claims=claims, numbers=numbers, figures=[fig], notes=notes)


EXPERIMENT = Experiment(
    name="paratool",
    paper="ParaTool: parameterized tools with soft selection (BUPT-GAMMA, arXiv 2605.29561)",
    summary="per-tool LoRA modules + query gate (no docs in context) vs in-context tool "
            "docs: AST call accuracy, tool selection, context tokens, seen/held-out templates",
    run=run,
    quick_budget_s=80,  # 63 s in the 2026-12-02 afternoon make reproduce (1,207 s in all)
)

if __name__ == "__main__":
    from experiments.common import main

    main(EXPERIMENT)
