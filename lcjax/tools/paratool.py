"""ParaTool's soft tool selection: a gating network over the query embedding that weighs
K tool modules (LoRA adapters, one per tool) and adds their weighted updates to the base
(parameterized tools; BUPT-GAMMA, arXiv 2605.29561, stage 2: ``GatingNetwork`` in its
``soft_tool_selection_train``).

With tool modules ΔW_k = (α/r)(B_k A_k)ᵀ on the same kernels and gate weights g ∈ Δ^K
(softmax of the gate's logits over the query embedding, optionally kept to the top k and
renormalised), each kernel of row b runs as::

    W_b = W + Σ_k g_bk ΔW_k

so the model is linear in g through the weight update, and a one-hot g = e_k is tool
k's module alone. The load-balancing term is the Switch Transformer's (Fedus et al.,
2021): ``K · Σ_k f_k P_k`` with f_k the fraction of rows whose top-1 tool is k and P_k the
mean gate weight of k (1 when balanced, K when one tool takes every row).

    lora = LoRAModel(base)                       # one adapter per tool (stage 1)
    gate = ToolGate(d_model, K, rngs=nnx.Rngs(0), top_k=2)
    g = gate(query_embedding(base, prompts, prompt_mask))     # [B, K]
    logits = mixed_call(lora, tool_names, g, tokens)          # [B, T, V]

What is here: the gate, the aggregation, the query embedding, the balance term, and
:class:`ParaToolModel` with its loss hook and the trained-variable filters of the stages,
all trained through ``lcjax.train.train``: stage 1 trains tool k's adapter alone
(``wrt=lcjax.nn.lora.adapter_filter(k)``, adapter k active), stage 2 the gate
(``wrt=gate_filter``), stage 3 gate and adapters together (``wrt=joint_filter``). The
experiment (the stages run on a pre-trained base, against the in-context-docs baseline)
is not built yet (``docs/tools.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lcjax.data import tokenizer as tok
from lcjax.eval.runners import bucket_length, model_runner
from lcjax.nn.lora import LoRAModel, LoRAParam, with_deltas
from lcjax.train import TrainConfig, TrainResult, train
from lcjax.train.losses import answer_weights
from lcjax.train.metrics import LOSS_WEIGHT, weighted_nll

__all__ = ["ToolGate", "query_embedding", "mixed_deltas", "mixture_model", "mixed_call",
           "load_balancing_loss",
           "top_k_weights", "ParaToolModel", "paratool_loss", "gate_filter", "joint_filter",
           "routed_loss", "tool_index", "train_tool_modules", "train_gate", "train_joint",
           "call_model", "generate_calls"]


def top_k_weights(logits: jax.Array, k: int | None) -> jax.Array:
    """softmax(logits) [B, K] restricted to each row's ``k`` largest and renormalised
    (``k=None`` or ``k >= K``: the full softmax)."""
    if k is None or k >= logits.shape[-1]:
        return jax.nn.softmax(logits, axis=-1)
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {k}")
    kth = jax.lax.top_k(logits, k)[0][..., -1:]
    return jax.nn.softmax(jnp.where(logits >= kth, logits, -jnp.inf), axis=-1)


class ToolGate(nnx.Module):
    """Gate logits = MLP(e) over a query embedding e [B, D] (one hidden SiLU layer of
    width ``hidden``, or linear when ``hidden=None``); the call returns the weights
    [B, K] (:func:`top_k_weights` with ``top_k``)."""

    def __init__(self, d_model: int, num_tools: int, *, rngs: nnx.Rngs,
                 hidden: int | None = None, top_k: int | None = None):
        if num_tools < 1 or (top_k is not None and top_k < 1):
            raise ValueError(f"ToolGate: need num_tools >= 1 and top_k >= 1 or None, got "
                             f"{num_tools}, {top_k}")
        self.top_k = top_k
        self.hidden = nnx.Linear(d_model, hidden, rngs=rngs) if hidden else None
        self.out = nnx.Linear(hidden or d_model, num_tools, rngs=rngs)

    def logits(self, embedding: jax.Array) -> jax.Array:
        """[B, D] -> [B, K]."""
        h = embedding.astype(jnp.float32)
        if self.hidden is not None:
            h = jax.nn.silu(self.hidden(h))
        return self.out(h)

    def __call__(self, embedding: jax.Array) -> jax.Array:
        """[B, D] -> gate weights [B, K], rows summing to 1."""
        return top_k_weights(self.logits(embedding), self.top_k)


def query_embedding(model: nnx.Module, tokens: jax.Array,
                    mask: jax.Array | None = None) -> jax.Array:
    """Mean of the base's final normed hidden states over the query tokens: tokens
    [B, T], mask bool [B, T] (default all) -> float32 [B, D]. ``model`` is a DecoderLM (or
    anything with ``hidden_states`` and ``final_norm``)."""
    h = model.final_norm(model.hidden_states(tokens)[-1]).astype(jnp.float32)
    m = jnp.ones(tokens.shape, bool) if mask is None else mask
    if m.shape != tokens.shape:
        raise ValueError(f"query_embedding: mask {m.shape} must have the tokens' shape "
                         f"{tokens.shape}")
    w = m.astype(jnp.float32)[..., None]
    return (h * w).sum(1) / jnp.maximum(w.sum(1), 1.0)


def mixed_deltas(lora: LoRAModel, names: Sequence[str]) -> dict[tuple, jax.Array]:
    """``{kernel path: [K, *W.shape]}``: each tool's ΔW stacked (zeros where tool k has no
    module on that kernel)."""
    if not names:
        raise ValueError("mixed_deltas: no tool names")
    missing = [n for n in names if n not in lora.adapters]
    if missing:
        raise ValueError(f"mixed_deltas: no adapters {missing}; adapters: "
                         f"{sorted(lora.adapters)}")
    per_tool = [lora.adapters[n].deltas() for n in names]
    paths = sorted({p for d in per_tool for p in d}, key=str)
    out = {}
    for p in paths:
        like = next(d[p] for d in per_tool if p in d)
        out[p] = jnp.stack([d.get(p, jnp.zeros_like(like)) for d in per_tool])
    return out


def mixture_model(lora: LoRAModel, stacked: dict, gates: jax.Array) -> nnx.Module:
    """The base with ``W + Σ_k g_k ΔW_k`` on every path of ``stacked`` (the [K, ...] deltas
    of :func:`mixed_deltas`), gates [K]: a plain model with the base's graph."""
    g = jnp.asarray(gates, jnp.float32)
    return with_deltas(lora.base, {p: jnp.tensordot(g, d, axes=1) for p, d in stacked.items()})


def mixed_call(lora: LoRAModel, names: Sequence[str], gates: jax.Array, tokens: jax.Array,
               **kwargs) -> jax.Array:
    """The base with W + Σ_k g_k ΔW_k on every tool kernel: gates [K] (one mixture for the
    batch) or [B, K] (one per row, run row by row under ``jax.vmap``); tokens [B, T];
    ``kwargs`` go to the base call (no cache). Returns the base's logits [B, T, V]."""
    stacked = mixed_deltas(lora, names)
    k = len(names)
    if gates.shape[-1] != k or gates.ndim not in (1, 2) or (
            gates.ndim == 2 and gates.shape[0] != tokens.shape[0]):
        raise ValueError(f"mixed_call: gates must be [{k}] or [batch={tokens.shape[0]}, {k}], "
                         f"got {gates.shape}")
    def run(g, x):
        return mixture_model(lora, stacked, g)(x, **kwargs)

    if gates.ndim == 1:
        return run(gates, tokens)
    return jax.vmap(lambda g, x: run(g, x[None])[0])(gates, tokens)


def load_balancing_loss(weights: jax.Array) -> jax.Array:
    """Switch-style balance term of gate weights [B, K]: K · Σ_k f_k P_k (f_k: share of
    rows whose argmax is k; P_k: mean weight of k). 1 when balanced, K when collapsed;
    differentiable through P."""
    if weights.ndim != 2:
        raise ValueError(f"load_balancing_loss: weights must be [batch, K], got "
                         f"{weights.shape}")
    k = weights.shape[-1]
    f = jax.nn.one_hot(jnp.argmax(weights, -1), k).mean(0)
    return k * jnp.sum(jax.lax.stop_gradient(f) * weights.mean(0))


class ParaToolModel(nnx.Module):
    """Tool adapters (a :class:`LoRAModel` with one adapter per name in ``tools``) and a
    :class:`ToolGate` over the base's query embedding: ``model(tokens, query_mask=m)`` runs
    ``mixed_call`` with ``gate(query_embedding(base, tokens, m))`` — no tool documents in
    the context."""

    def __init__(self, lora: LoRAModel, tools: Sequence[str], *, rngs: nnx.Rngs,
                 hidden: int | None = None, top_k: int | None = None):
        missing = [t for t in tools if t not in lora.adapters]
        if missing or not tools:
            raise ValueError(f"ParaToolModel: tools {missing or '[]'} have no adapter; "
                             f"adapters: {sorted(lora.adapters)}")
        self.lora, self.tools = lora, tuple(tools)
        self.gate = ToolGate(lora.base.config.d_model, len(tools), rngs=rngs, hidden=hidden,
                             top_k=top_k)

    def gate_weights(self, tokens: jax.Array, query_mask: jax.Array | None = None
                     ) -> jax.Array:
        """[B, K] gate weights from the query tokens (``query_mask`` True on them)."""
        return self.gate(query_embedding(self.lora.base, tokens, query_mask))

    def __call__(self, tokens: jax.Array, *, query_mask: jax.Array | None = None,
                 gates: jax.Array | None = None, return_gates: bool = False):
        """Logits [B, T, V] of the gated mixture (``gates`` [B, K] overrides the gate);
        with ``return_gates``, ``(logits, gates)``."""
        g = self.gate_weights(tokens, query_mask) if gates is None else gates
        logits = mixed_call(self.lora, self.tools, g, tokens)
        return (logits, g) if return_gates else logits


def gate_filter(path, value) -> bool:
    """nnx filter of a root :class:`ParaToolModel`'s gate parameters (stage 2)."""
    return isinstance(value, nnx.Param) and len(path) > 0 and path[0] == "gate"


def joint_filter(path, value) -> bool:
    """nnx filter of the gate and every tool adapter (stage 3)."""
    return gate_filter(path, value) or isinstance(value, LoRAParam)


def _selection_nll(gates: jax.Array, index: jax.Array) -> jax.Array:
    """Mean −log g_b[gold_b] (clipped at 1e-9, so a top-k gate that drops gold is finite)."""
    picked = jnp.take_along_axis(gates, index[:, None].astype(jnp.int32), axis=-1)[:, 0]
    return -jnp.mean(jnp.log(jnp.maximum(picked, 1e-9)))


def paratool_loss(balance_weight: float = 0.01, other_weight: float = 0.0,
                  selection_weight: float = 0.0):
    """Loss hook for ``lcjax.train.train`` on :func:`lcjax.tools.world.make_tool_batch`
    batches: answer-weighted NLL of the call bytes (``other_weight`` on the prompt bytes)
    plus ``balance_weight`` · :func:`load_balancing_loss` plus ``selection_weight`` · the
    mean −log g[gold] (needs the batch's ``tool_index`` [B], :func:`tool_index`; 0 = the
    gate learns from the call NLL alone); the query is each row's BOS and prompt
    (positions ``<= answer_start``). Metrics: ``balance``, ``selection_nll`` (when the
    batch has ``tool_index``), ``loss_weight``."""
    for name, w in (("balance_weight", balance_weight), ("selection_weight", selection_weight)):
        if w < 0:
            raise ValueError(f"paratool_loss: {name} must be >= 0, got {w}")

    def loss_fn(model, batch, rng):
        del rng
        t = batch["inputs"].shape[1]
        query = jnp.arange(t)[None, :] <= batch["answer_start"][:, None]
        logits, g = model(batch["inputs"], query_mask=query, return_gates=True)
        nll, total = weighted_nll(logits, batch["targets"], answer_weights(batch, other_weight))
        balance = load_balancing_loss(g)
        loss = nll + balance_weight * balance
        mets = {LOSS_WEIGHT: total, "balance": balance}
        if "tool_index" in batch:
            sel = _selection_nll(g, batch["tool_index"])
            mets["selection_nll"] = sel
            loss = loss + selection_weight * sel
        elif selection_weight:
            raise ValueError("paratool_loss: selection_weight > 0 needs the batch's "
                             "`tool_index` (lcjax.tools.paratool.tool_index)")
        return loss, mets

    return loss_fn


def tool_index(examples: Sequence, names: Sequence[str]) -> np.ndarray:
    """int32 [B]: the position of each example's gold tool (``example.tool``) in ``names``
    (the batch key ``tool_index`` that :func:`routed_loss` routes by)."""
    pos = {n: i for i, n in enumerate(names)}
    missing = sorted({e.tool for e in examples} - set(pos))
    if missing:
        raise ValueError(f"tool_index: tools {missing} are not in names {list(names)}")
    return np.asarray([pos[e.tool] for e in examples], np.int32)


def routed_loss(other_weight: float = 0.0):
    """Stage 1's loss hook: row b runs with the one-hot gate of its gold tool
    (``batch["tool_index"]`` [B]), so tool k's module is trained on tool k's calls alone
    (its gradient is zero on every other row); answer-weighted NLL of the call bytes."""

    def loss_fn(model, batch, rng):
        del rng
        if "tool_index" not in batch:
            raise ValueError("routed_loss: the batch has no `tool_index` [B] "
                             "(lcjax.tools.paratool.tool_index)")
        g = jax.nn.one_hot(batch["tool_index"], len(model.tools), dtype=jnp.float32)
        logits = model(batch["inputs"], gates=g)
        nll, total = weighted_nll(logits, batch["targets"], answer_weights(batch, other_weight))
        return nll, {LOSS_WEIGHT: total}

    return loss_fn


def _stage(model: ParaToolModel, cfg: TrainConfig, dataset, loss_fn, wrt,
           eval_dataset=None) -> TrainResult:
    if not isinstance(model, ParaToolModel):
        raise ValueError(f"ParaTool stages train a ParaToolModel, got {type(model).__name__}")
    return train(model.lora.base.config, cfg, dataset=dataset, eval_dataset=eval_dataset,
                 model_fn=lambda *_: model, loss_fn=loss_fn, eval_fn=loss_fn, wrt=wrt)


def train_tool_modules(model: ParaToolModel, cfg: TrainConfig, dataset, *,
                       other_weight: float = 0.0, eval_dataset=None) -> TrainResult:
    """Stage 1 (tool pre-training): every tool's LoRA module on its own tool's calls, in
    one ``lcjax.train.train(wrt=LoRAParam)`` run — each row is routed to its gold tool's
    module by a one-hot gate (:func:`routed_loss`; batches need ``tool_index``), so the
    base and the gate stay frozen and module k's gradient comes from tool k's rows only.
    Against K separate runs, the modules share one optimizer step schedule, the global-norm
    clip and the loss normaliser (Adam's update is invariant to a constant rescaling of
    one module's gradient); weight decay (``cfg.weight_decay``) shrinks a module's A even
    in steps without its tool. ``train`` donates the model's buffers: use
    ``result.model``."""
    return _stage(model, cfg, dataset, routed_loss(other_weight), LoRAParam, eval_dataset)


def train_gate(model: ParaToolModel, cfg: TrainConfig, dataset, *,
               balance_weight: float = 0.01, selection_weight: float = 0.0,
               other_weight: float = 0.0, eval_dataset=None) -> TrainResult:
    """Stage 2 (soft tool selection): the gate alone (``wrt=gate_filter``; base and tool
    modules frozen) on :func:`paratool_loss` — the call NLL through the gated mixture plus
    the balance term (and ``selection_weight`` · −log g[gold])."""
    return _stage(model, cfg, dataset, paratool_loss(balance_weight, other_weight,
                                                     selection_weight),
                  gate_filter, eval_dataset)


def train_joint(model: ParaToolModel, cfg: TrainConfig, dataset, *,
                balance_weight: float = 0.01, selection_weight: float = 0.0,
                other_weight: float = 0.0, eval_dataset=None) -> TrainResult:
    """Stage 3 (joint fine-tuning): gate and every tool module together
    (``wrt=joint_filter``; the base frozen) on :func:`paratool_loss`."""
    return _stage(model, cfg, dataset, paratool_loss(balance_weight, other_weight,
                                                     selection_weight),
                  joint_filter, eval_dataset)


def call_model(model: ParaToolModel, gates: jax.Array, stacked: dict | None = None
               ) -> nnx.Module:
    """The base with ``W + Σ_k g_k ΔW_k`` (gates [K], one query's mixture) as a plain
    model (same graph as the base), e.g. for ``lcjax.nn.generate`` or
    ``lcjax.eval.runners.model_runner``; ``stacked``: :func:`mixed_deltas` of the model's
    tools, when the caller already has them (default: computed here)."""
    if gates.shape != (len(model.tools),):
        raise ValueError(f"call_model: gates must be [{len(model.tools)}], got {gates.shape}")
    if stacked is None:
        stacked = mixed_deltas(model.lora, model.tools)
    return mixture_model(model.lora, stacked, gates)


def generate_calls(model: ParaToolModel, prompts: Sequence[str], max_new_tokens: int
                   ) -> tuple[list[str], np.ndarray]:
    """ParaTool inference, no tool documents in context: the gate weighs the modules from
    each prompt's tokens (BOS + prompt bytes, the training query), then row b decodes
    greedily (``model_runner``, one row at a time) with its own mixture
    :func:`call_model`. Returns the generated texts and the gates [B, K].

    All gates come from one forward pass over the prompts right-padded to one length (the
    base is causal and the mask keeps the pads out of the mean, so each row's gate is its
    own prompt's), and every row decodes at that padded length, so the decoder compiles
    once rather than once per prompt length."""
    if not prompts:
        raise ValueError("generate_calls: no prompts")
    ids = [tok.encode(p.encode(), bos=True) for p in prompts]
    width = bucket_length(max(len(x) for x in ids))
    rows = np.full((len(ids), width), tok.PAD, np.int32)
    for r, x in enumerate(ids):
        rows[r, :len(x)] = x
    mask = np.arange(width)[None, :] < np.asarray([len(x) for x in ids])[:, None]
    gates = np.asarray(model.gate_weights(jnp.asarray(rows), jnp.asarray(mask)))
    stacked = mixed_deltas(model.lora, model.tools)  # once, not per prompt
    texts = []
    for p, g in zip(prompts, gates, strict=True):
        run = model_runner(call_model(model, jnp.asarray(g), stacked),
                           max_new_tokens=max_new_tokens, batch_size=1, min_bucket=width)
        texts.append(next(iter(run([p.encode()])))[1])
    return texts, gates
