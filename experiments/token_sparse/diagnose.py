"""Why does token-sparse prefill lose accuracy on the experiment's model? A diagnosis.

Token Sparse Attention (ICML 2026; public code dongwonjo/Token-Sparse-Attention) drops,
per layer and head, the prefix tokens the last ``window`` queries attend to least, and a
dropped token gets **zero** output from that head (its query is dropped too), while kept
queries see only kept keys. On the experiment's 3-layer byte LM
(``experiments/token_sparse/experiment.py``) that costs far more than dropping ~15% of
tokens suggests. This module separates the two effects of the method and checks the
selection against the positions the task needs:

* **selection** — per sparse layer and head, how often the needle's key bytes, its value
  bytes and the question's key bytes are among the selected tokens, and the share of the
  (pooled, per-head normalised) score mass on each region of the prompt;
* **ablations** — the same weights, the same selection rule, with the mask of the
  restricted attention changed (:func:`ablation_attention`):

  ``"method"``   the library's ``"token_sparse"`` itself (gather, inner, scatter);
  ``"paper"``    query and key both selected (the method as a mask: equals ``"method"``);
  ``"keys"``     every query computed, only the selected keys visible (dropped keys only);
  ``"queries"``  dropped queries get zero, every key visible (zeroed outputs only);
  ``"oracle"``   the method with the needle sentence's tokens added to every head's
                 selection (does keeping the needle suffice?).

Run: ``python -m experiments.token_sparse.diagnose`` (trains the quick model through the
experiment's ``train_dense``, or loads it from ``--model``), prints both tables and writes
``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import functools
import json
import pickle
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

MODES = ("method", "paper", "keys", "queries", "oracle")
REGIONS = ("bos", "needle_key", "needle_value", "needle_rest", "question_key",
           "question_rest", "haystack")


def keep_mask(q, k, *, coverage: float, min_tokens: int, window: int, pool: int):
    """bool [B, H, L]: the tokens the method keeps per head (``token_scores`` →
    ``select_tokens``; all True where the call would be dense)."""
    import jax.numpy as jnp

    from lcjax.attention.token_sparse import select_tokens, token_scores

    b, length, h = q.shape[:3]
    if length <= min_tokens + window or coverage == 0:
        return jnp.ones((b, h, length), bool)
    sel = select_tokens(token_scores(q, k, window=window, pool=pool), coverage=coverage,
                        min_tokens=min_tokens, window=window)
    bi, hi = jnp.arange(b)[:, None, None], jnp.arange(h)[None, :, None]
    keep = jnp.zeros((b, h, length + 1), bool).at[bi, hi, sel.indices].set(True)[..., :length]
    return keep | sel.dense[:, None, None]


def ablation_attention(q, k, v, *, causal=True, mask=None, scale=None, mode="paper",
                       coverage=0.005, min_tokens=1024, window=128, pool=7, force=(),
                       **kwargs):
    """Softmax attention restricted by the token-sparse selection (module docstring);
    ``force``: per batch row, positions added to every head's selection (``"oracle"``).
    Dense where the method is (a cache step, a mask, segment ids)."""
    import jax.numpy as jnp

    from lcjax.attention import get

    softmax = get("softmax")
    if k.shape[1] != q.shape[1] or mask is not None or kwargs:
        return softmax(q, k, v, causal=causal, mask=mask, scale=scale, **kwargs)
    keep = keep_mask(q, k, coverage=coverage, min_tokens=min_tokens, window=window, pool=pool)
    if force:
        extra = np.zeros((q.shape[0], q.shape[1]), bool)
        for row, positions in enumerate(force):
            extra[row, list(positions)] = True
        keep = keep | jnp.asarray(extra)[:, None, :]
    kq, kk = keep[..., :, None], keep[..., None, :]
    full = jnp.ones_like(kq & kk)
    restrict = {"paper": kq & kk, "oracle": kq & kk, "keys": full & kk, "queries": full & kq}
    return softmax(q, k, v, causal=causal, mask=restrict[mode], scale=scale)


def regions(prompt: bytes, *, bos: int = 1) -> dict[str, np.ndarray]:
    """Token positions (``bos`` = 1 for the BOS in front) of each region of a niah prompt:
    the needle ``The magic number for {key} is {value}.`` with the question's key (its key,
    value and other bytes; a distractor needle is haystack), the question
    ``The magic number for {key} is `` at the end (its key and other
    bytes), the BOS, and the haystack (everything else)."""
    text = prompt.decode("latin-1")
    question = list(re.finditer(r"The magic number for (\S+) is $", text))[-1]
    key = re.escape(question[1])
    needle = re.search(rf"The magic number for ({key}) is (\d+)\.", text)
    n = len(prompt) + bos
    label = np.full(n, "haystack", object)
    label[:bos] = "bos"
    label[bos + needle.start():bos + needle.end()] = "needle_rest"
    label[bos + needle.start(1):bos + needle.end(1)] = "needle_key"
    label[bos + needle.start(2):bos + needle.end(2)] = "needle_value"
    label[bos + question.start():bos + question.end()] = "question_rest"
    label[bos + question.start(1):bos + question.end(1)] = "question_key"
    return {r: np.nonzero(label == r)[0] for r in REGIONS}


def _sparse_model(dense_model, layers, opts: Mapping, mode: str, force=()):
    from experiments.token_sparse.experiment import with_layer_attention
    from lcjax.attention.token_sparse import layer_attention

    options = {k: opts[k] for k in ("coverage", "min_tokens", "window", "pool")}
    if mode == "method":  # the library's token_sparse itself: the ablations' cross-check
        names, options = layer_attention(dense_model.config.num_layers, layers,
                                         sparse_options=dict(opts))
        return with_layer_attention(dense_model, names, options)
    names, options = layer_attention(dense_model.config.num_layers, layers,
                                     sparse_variant=ablation_attention,
                                     sparse_options={**options, "mode": mode,
                                                     "force": tuple(force)})
    return with_layer_attention(dense_model, names, options)


def answers_with(dense_model, layers, opts, mode, prompts: Sequence[bytes],
                 new_tokens: int, batch: int) -> list[str]:
    """Greedy answers through the experiment's ``SparsePrefillGenerator`` (sparse prefill
    of ``mode`` in ``layers``, dense decoding); ``"oracle"`` builds one model per batch
    (the needle positions are options)."""
    from experiments.token_sparse.experiment import SparsePrefillGenerator

    out = []
    for a in range(0, len(prompts), batch):
        chunk = list(prompts[a:a + batch])
        force = ()
        if mode == "oracle":
            force = tuple(tuple(int(i) for r in ("needle_key", "needle_value", "needle_rest")
                                for i in regions(p)[r]) for p in chunk)
            force += force[-1:] * (batch - len(chunk))  # the generator's repeated last row
        model = _sparse_model(dense_model, layers, opts, mode, force)
        gen = SparsePrefillGenerator(model, dense_model, max_new_tokens=new_tokens,
                                     batch_size=batch)
        out += gen([p.decode("latin-1") for p in chunk])
    return out


def selection_stats(dense_model, layers, opts, prompts: Sequence[bytes], batch: int) -> dict:
    """Per sparse layer and head, over the prompts (one length): the fraction of prompts
    whose needle key / needle value / question key bytes are all selected, the mean kept
    fraction, and the mean share of the pooled per-head normalised score mass per region
    (``REGIONS``). The layer inputs are those of the method's own run (``"paper"``: a
    layer's input already shaped by the sparse layers before it)."""
    import jax.numpy as jnp
    from flax import nnx

    from lcjax.attention.token_sparse import token_scores
    from lcjax.data import tokenizer as tok
    from lcjax.nn import capture_attention

    model = _sparse_model(dense_model, layers, opts, "paper")
    capture = nnx.jit(lambda m, tokens: capture_attention(m, tokens, tap="inputs")[1])
    w, p = opts["window"], opts["pool"]
    stats = {layer: {"all_kept": {r: [] for r in ("needle_key", "needle_value",
                                                  "question_key")},
                     "kept": [], "mass": {r: [] for r in REGIONS}} for layer in layers}
    for a in range(0, len(prompts), batch):
        chunk = list(prompts[a:a + batch])
        inputs = capture(model, jnp.asarray(np.stack([tok.encode(x.decode("latin-1"), bos=True)
                                               for x in chunk])))
        for layer in layers:
            q, k = inputs[layer]["q"], inputs[layer]["k"]
            keep = np.asarray(keep_mask(q, k, **{n: opts[n] for n in (
                "coverage", "min_tokens", "window")}, pool=p))  # [B, H, L]
            sc = np.asarray(token_scores(q, k, window=w, pool=p))
            sc = sc / sc.sum(-1, keepdims=True)  # [B, H, P]
            st = stats[layer]
            for row, prompt in enumerate(chunk):
                reg = regions(prompt)
                for r in st["all_kept"]:
                    st["all_kept"][r].append(keep[row][:, reg[r]].all(-1))
                st["kept"].append(keep[row].mean(-1))
                for r in REGIONS:
                    pos = reg[r][reg[r] < sc.shape[-1]]
                    st["mass"][r].append(sc[row][:, pos].sum(-1))
    mean = lambda xs: np.mean(np.stack(xs), axis=0).round(3).tolist()  # per head
    return {str(layer): {"all_kept": {r: mean(v) for r, v in st["all_kept"].items()},
                         "kept": mean(st["kept"]),
                         "mass": {r: mean(v) for r, v in st["mass"].items()}}
            for layer, st in stats.items()}


def diagnose(dense_model, *, length: int, tasks, depths, n_per_cell: int,
             coverages: Sequence[float], layers: Sequence[int], modes=MODES,
             overrides: Mapping | None = None, log=None) -> dict:
    """Accuracy (string_match_all: the reference in the answer) of each ablation mode at
    each coverage, and the selection statistics, on the experiment's evaluation items;
    ``overrides`` replace options of the experiment's ``sparse_options`` (e.g. ``window``,
    ``pool``: a sensitivity check, not the experiment's setting)."""
    from experiments.token_sparse.experiment import EVAL_BATCH, EVAL_SEED, SUITE, sparse_options
    from lcjax.eval import build_items, max_answer_tokens

    log = log or functools.partial(print, flush=True)
    items = build_items(SUITE, (length,), depths, n_per_cell, EVAL_SEED, tasks=list(tasks))
    prompts = [it.prompt for it in items]
    refs = [it.answer.decode("latin-1") for it in items]
    new_tokens = max_answer_tokens(items, margin=1)
    score = lambda answers: 100.0 * np.mean([r in a for r, a in zip(refs, answers)])
    dense = answers_with(dense_model, layers, sparse_options(length, 0.0), "paper", prompts,
                         new_tokens, EVAL_BATCH)
    out = {"dense": score(dense), "layers": list(layers), "points": []}
    log(f"dense {out['dense']:.1f}%")
    for c in coverages:
        opts = {**sparse_options(length, c), **dict(overrides or {})}
        row = {"coverage": c, "options": opts, "accuracy": {},
               "selection": selection_stats(dense_model, layers, opts, prompts, EVAL_BATCH)}
        for mode in modes:
            start = time.perf_counter()
            row["accuracy"][mode] = score(answers_with(dense_model, layers, opts, mode,
                                                       prompts, new_tokens, EVAL_BATCH))
            log(f"coverage {c:g} {mode}: {row['accuracy'][mode]:.1f}% "
                f"({time.perf_counter() - start:.0f} s)")
        for layer, st in row["selection"].items():
            log(f"   layer {layer}: kept/head {st['kept']}, all kept (needle key, value, "
                f"question key) {st['all_kept']}, score mass {st['mass']}")
        out["points"].append(row)
    return out


def main(argv=None):
    from flax import nnx

    from experiments.token_sparse.experiment import SETTINGS, train_dense

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="pickled {'state', 'config'} (else train "
                        "the quick model and pickle it here if given --save)")
    parser.add_argument("--save", type=Path)
    parser.add_argument("--coverages", type=float, nargs="+", default=[0.05, 0.2, 0.5])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    parser.add_argument("--window", type=int, help="override the experiment's L/16")
    parser.add_argument("--pool", type=int, help="override the experiment's 7")
    parser.add_argument("--out", type=Path, default=Path("/tmp/token_sparse_diagnosis.json"))
    args = parser.parse_args(argv)
    s = SETTINGS[True]
    if args.model:
        from lcjax.nn import DecoderLM

        saved = pickle.loads(args.model.read_bytes())
        model = nnx.eval_shape(lambda: DecoderLM(saved["config"], rngs=nnx.Rngs(0)))
        nnx.replace_by_pure_dict(state := nnx.state(model), saved["state"])
        model = nnx.merge(nnx.graphdef(model), state)
    else:
        model = train_dense(s["tasks"], s["length"], s["steps"], batch=s["batch"])["model"]
        if args.save:
            import jax

            state = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model)))
            args.save.write_bytes(pickle.dumps({"state": state, "config": model.config}))
    res = diagnose(model, length=s["length"], tasks=s["tasks"], depths=s["depths"],
                   n_per_cell=s["n_per_cell"], coverages=args.coverages, layers=args.layers,
                   modes=args.modes, overrides={k: v for k, v in (("window", args.window),
                                                                  ("pool", args.pool)) if v})
    args.out.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
