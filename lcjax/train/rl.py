"""GRPO with verifiable rewards for lcjax language models. See ``docs/grpo.md``.

Group Relative Policy Optimization (Shao et al., 2024, "DeepSeekMath", §4.1), the RL stage
TableLong trains with (exact-match reward on programmatically verified answers). Per step:

1. take ``P = prompts_per_step`` prompts and sample a group of ``G = group_size``
   completions o_1..o_G for each through :func:`lcjax.nn.generate` (temperature
   sampling, with the sampler's log-probabilities log π_old(o_i,t | q, o_i,<t));
2. score each completion with a verifier, r_i = reward_fn(text_i, item) in [0, 1]
   (:mod:`lcjax.train.rewards`: exact match, numeric tolerance);
3. group-relative advantages, the same for every token of o_i::

       A_i = (r_i - mean_g r) / (std_g r + eps)

   with the *sample* standard deviation (ddof = 1, ``torch.std``'s default, which
   PyTorch implementations such as TRL's use) and ``eps = adv_eps`` (default 1e-4): a
   group whose rewards are all equal (all right or all wrong) has A = 0 and teaches
   nothing;
4. ``updates_per_batch = μ`` optimizer steps on the batch, each on::

       ρ_i,t = exp(log π_θ(o_i,t | ·) - log π_old(o_i,t | ·))
       s_i,t = min(ρ_i,t A_i, clip(ρ_i,t, 1 - ε, 1 + ε) A_i)               (PPO's clip)
       k_i,t = exp(l^ref_i,t - l_i,t) - (l^ref_i,t - l_i,t) - 1            (k3, ≥ 0)
       loss  = -mean(s) + β mean(k)

   where log π_θ comes from a teacher-forced forward pass over prompt + completion, l and
   l^ref are the policy's and the frozen reference's log-probs of the sampled tokens (k3
   is Schulman's unbiased, non-negative estimator of KL(π_θ ‖ π_ref)), and only
   completion tokens count (prompt and padding are masked; a stop token counts). The
   means are ``averaging="sequence"`` (the paper's (1/G) Σ_i (1/|o_i|) Σ_t, i.e. each
   completion weighs the same) or ``"token"`` (Σ_i,t / Σ_i |o_i|, every token the same).

log π_old is the model's own log-softmax at temperature 1 (what :func:`generate` returns,
``old_logprobs="sampler"``) or the same teacher-forced pass before the first update
(``"recompute"``); both equal the policy's at the first update, so ρ = 1 there up to
float rounding. With temperature T != 1 the samples come from softmax(z / T) while ρ is
taken against the T = 1 policy, which is what π_θ is (dividing the logits by T in the
ratio instead would train the tempered policy). The reference is
the policy at the start of the run (the model handed in), frozen.

The update is :func:`lcjax.train.make_train_step` (one jitted AdamW step, the training
loop's) with :func:`grpo_loss_fn` as its loss hook; with ``grad_accum = n`` it scans over n
micro-batches of consecutive rows, combined by the objective's ``loss_weight`` (rows for
"sequence", tokens for "token"), so the update is that of the whole batch. A run with
``out_dir`` checkpoints parameters, optimizer state and the number of prompts consumed through
:mod:`lcjax.train.checkpoint`; every random draw is a function of ``seed`` and the step,
so a resumed run reproduces the uninterrupted one bit for bit. Metrics per step
(``metrics.jsonl``): ``reward_mean``, ``reward_std``, ``kl`` (token mean of k3),
``clip_frac`` (tokens whose clipped branch is active: A > 0 and ρ > 1 + ε, or A < 0 and
ρ < 1 - ε), ``completion_len`` (generated tokens per completion), ``loss``,
``grad_norm``, ``lr``, ``skipped``.

``skip_flat_steps=True`` makes no update on a step in which every group's rewards are
equal (all advantages 0), as DAPO's dynamic sampling drops such groups (Yu et al., 2025).
The surrogate's gradient is then exactly 0 and the KL term's is 0 at policy = reference, so
the update would be AdamW normalising float rounding into a step of up to ``lr`` per
parameter. A skipped step logs ``skipped`` 1 and NaN for ``loss``, ``kl``, ``clip_frac`` and
``grad_norm``; the optimizer's own step count (hence a warm-up or cosine schedule) does not
advance on it.

    cfg = GRPOConfig(steps=200, group_size=8, prompts_per_step=4, max_new_tokens=16)
    result = train_grpo(model, cfg, items)          # items: dicts with "prompt", "answer"
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from lcjax.data import tokenizer
from lcjax.data.tablelong import item_prompt
from lcjax.nn import generate  # here: lcjax.nn imports lcjax.train pieces
from lcjax.train import checkpoint, metrics
from lcjax.train.loop import (
    OPT_FIELDS,
    TrainConfig,
    cached_train_step,
    config_dict,
    lr_schedule,
    make_optimizer,
    optimizer_hparams,
)
from lcjax.train.rewards import answer_reward

__all__ = ["GRPOConfig", "GRPOResult", "align_logprobs", "clipped_surrogate",
           "compiled_logprobs", "completion_batch", "default_prompt", "grpo_loss_fn",
           "grpo_objective", "group_advantages", "k3_kl", "prompt_indices", "sample_group_batch",
           "token_logprobs", "train_grpo"]

AVERAGING = ("sequence", "token")
OLD_LOGPROBS = ("sampler", "recompute")
_SAMPLE_RNG, _UPDATE_RNG = 0x7361, 0x7570  # fold_in salts of the two random streams
# fields that only steer the run (not its result): not compared on resume
# (grad_accum too, as in lcjax.train.RESUME_FIELDS: it changes only the float rounding)
_RUN_FIELDS = ("log_every", "ckpt_every", "keep_checkpoints", "out_dir", "resume", "progress",
               "grad_accum")


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Hyper-parameters of a GRPO run (module docstring for the equations).

    ``steps`` sampling rounds of ``prompts_per_step`` prompts x ``group_size`` samples,
    each followed by ``updates_per_batch`` optimizer updates (so the learning-rate
    schedule of :func:`lcjax.train.cosine_lr` runs over ``steps * updates_per_batch``
    updates). The optimizer fields are those of :class:`lcjax.train.TrainConfig`.
    ``max_prompt_len`` (None: the longest prompt of the items) is the padded prompt width;
    a longer prompt is an error.
    """

    steps: int = 100
    prompts_per_step: int = 4
    group_size: int = 8
    updates_per_batch: int = 1  # μ
    grad_accum: int = 1  # micro-batches per update (rows split in order; the same update)
    clip_eps: float = 0.2  # ε
    kl_beta: float = 0.04  # β
    adv_eps: float = 1e-4
    skip_flat_steps: bool = False  # no update on a step whose advantages are all 0
    averaging: str = "sequence"
    old_logprobs: str = "sampler"
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int = 32
    max_prompt_len: int | None = None
    stop_tokens: tuple[int, ...] = (tokenizer.EOS,)
    pad_id: int = tokenizer.PAD
    lr: float = 1e-5
    warmup_steps: int = 0
    min_lr_ratio: float = 1.0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.99
    eps: float = 1e-8
    grad_clip: float = 1.0
    seed: int = 0  # sampling and update random streams
    data_seed: int = 0  # order of the prompts
    log_every: int = 1
    ckpt_every: int = 0  # 0: checkpoint only at the end (or where the run stops)
    keep_checkpoints: int = 3
    out_dir: str | None = None
    resume: bool = False
    progress: bool = True

    def __post_init__(self):
        object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))
        for name in ("steps", "prompts_per_step", "updates_per_batch", "grad_accum",
                     "max_new_tokens", "log_every", "keep_checkpoints"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"GRPOConfig.{name} must be an int >= 1; got "
                                 f"{getattr(self, name)!r}")
        if not isinstance(self.group_size, int) or self.group_size < 2:
            raise ValueError("GRPOConfig.group_size must be an int >= 2 (the advantages "
                             f"compare samples within a group); got {self.group_size!r}")
        if self.batch_rows % self.grad_accum:
            raise ValueError(f"GRPOConfig: prompts_per_step * group_size = {self.batch_rows} "
                             f"rows do not split into grad_accum={self.grad_accum} "
                             "micro-batches")
        check_clip_eps(self.clip_eps)
        check_kl_beta(self.kl_beta)
        if not (math.isfinite(self.adv_eps) and self.adv_eps > 0):
            raise ValueError(f"GRPOConfig.adv_eps must be finite and > 0; got {self.adv_eps}")
        check_averaging(self.averaging)
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"GRPOConfig.old_logprobs must be one of {OLD_LOGPROBS}; got "
                             f"{self.old_logprobs!r}")
        if not self.temperature > 0:
            raise ValueError(f"GRPOConfig.temperature must be > 0 (GRPO samples); got "
                             f"{self.temperature}")
        if self.max_prompt_len is not None and self.max_prompt_len < 1:
            raise ValueError(f"GRPOConfig.max_prompt_len must be >= 1 or None; got "
                             f"{self.max_prompt_len}")
        self.train_config()  # ValueError for bad optimizer settings

    def train_config(self) -> TrainConfig:
        """The :class:`TrainConfig` holding the optimizer and its schedule (over
        ``steps * updates_per_batch`` updates)."""
        fields = {k: getattr(self, k) for k in OPT_FIELDS if k != "steps"}
        return TrainConfig(steps=self.steps * self.updates_per_batch, seed=self.seed,
                           **fields)

    @property
    def batch_rows(self) -> int:
        """Completions per step, ``prompts_per_step * group_size``."""
        return self.prompts_per_step * self.group_size


def check_clip_eps(clip_eps: float) -> None:
    """ValueError unless 0 < ε < 1."""
    if not (isinstance(clip_eps, int | float) and 0 < clip_eps < 1):
        raise ValueError(f"GRPO clip_eps must lie in (0, 1); got {clip_eps!r}")


def check_kl_beta(kl_beta: float) -> None:
    """ValueError unless β is finite and >= 0."""
    if not (isinstance(kl_beta, int | float) and math.isfinite(kl_beta) and kl_beta >= 0):
        raise ValueError(f"GRPO kl_beta must be finite and >= 0; got {kl_beta!r}")


def check_averaging(averaging: str) -> None:
    if averaging not in AVERAGING:
        raise ValueError(f"GRPO averaging must be one of {AVERAGING}; got {averaging!r}")


@dataclasses.dataclass
class GRPOResult:
    """What :func:`train_grpo` returns: ``history`` (one record per step run in this call,
    module docstring), ``step`` (the last completed step), ``model`` (the trained policy)."""

    history: list[dict]
    step: int
    model: nnx.Module

    @property
    def rewards(self) -> list[float]:
        """Mean reward per step, in step order."""
        return [r["reward_mean"] for r in self.history]


# ---------------------------------------------------------------------------- the objective


def group_advantages(rewards: Any, eps: float = 1e-4) -> np.ndarray:
    """A = (r - mean_g r) / (std_g r + eps) over each group; float32 ``[P, G]``.

    Args:
      rewards: ``[P, G]``, group p's G rewards in row p (G >= 2).
      eps: added to the sample standard deviation (ddof = 1).

    Raises:
      ValueError: not 2-D, G < 2, non-finite rewards or eps <= 0.
    """
    r = np.asarray(rewards, np.float64)
    if r.ndim != 2 or r.shape[1] < 2:
        raise ValueError(f"group_advantages: rewards must be [groups, G >= 2]; got shape "
                         f"{r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError("group_advantages: rewards must be finite")
    if not eps > 0:
        raise ValueError(f"group_advantages: eps must be > 0; got {eps}")
    mean = r.mean(axis=1, keepdims=True)
    std = r.std(axis=1, ddof=1, keepdims=True)
    return ((r - mean) / (std + eps)).astype(np.float32)


def k3_kl(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """Per-token k3 estimate of KL(π_θ ‖ π_ref) at tokens sampled from π_θ:
    ``exp(d) - d - 1`` with ``d = ref_logp - logp`` (elementwise, >= 0)."""
    d = ref_logp - logp
    return jnp.exp(d) - d - 1.0


def clipped_surrogate(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array,
                      clip_eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """PPO's clipped surrogate per token.

    Args:
      logp, old_logp: ``[B, T]`` log-probs of the sampled tokens under π_θ and π_old.
      advantages: ``[B]``, one per completion (broadcast over its tokens).
      clip_eps: ε in (0, 1).

    Returns:
      ``(s, ratio, clipped)``: ``s = min(ρ A, clip(ρ, 1 - ε, 1 + ε) A)`` ``[B, T]``,
      ``ρ = exp(logp - old_logp)``, and bool ``clipped``: the clipped branch is the
      smaller one strictly (its gradient is 0).
    """
    a = advantages[:, None]
    ratio = jnp.exp(logp - old_logp)
    unclipped = ratio * a
    clipped_term = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * a
    return (jnp.minimum(unclipped, clipped_term), ratio, clipped_term < unclipped)


def grpo_objective(logp: jax.Array, old_logp: jax.Array, ref_logp: jax.Array,
                   advantages: jax.Array, mask: jax.Array, *, clip_eps: float,
                   kl_beta: float, averaging: str = "sequence"
                   ) -> tuple[jax.Array, dict[str, Any]]:
    """The GRPO loss ``-mean(s) + β mean(k3)`` over the completion tokens (``mask``).

    Args:
      logp, old_logp, ref_logp: float ``[B, T]``, log-probs of the sampled tokens under
        the policy (differentiated), the sampler and the frozen reference.
      advantages: float ``[B]``.
      mask: ``[B, T]``, 1 on completion tokens, 0 on prompt and padding.
      clip_eps, kl_beta: ε and β.
      averaging: "sequence" (mean over rows of each row's token mean; rows without
        tokens count as 0) or "token" (mean over all completion tokens).

    Returns:
      ``(loss, metrics)``: metrics ``kl`` and ``clip_frac`` (token means, as ``(value,
      weight)`` pairs) and ``loss_weight`` (rows, or tokens for "token"), the loss hook
      metrics of :func:`lcjax.train.make_train_step`.
    """
    check_clip_eps(clip_eps)
    check_kl_beta(kl_beta)
    check_averaging(averaging)
    shape = jnp.shape(logp)
    if len(shape) != 2 or any(jnp.shape(x) != shape for x in (old_logp, ref_logp, mask)):
        raise ValueError(f"grpo_objective: logp, old_logp, ref_logp and mask must share one "
                         f"[B, T] shape; got {shape}, {jnp.shape(old_logp)}, "
                         f"{jnp.shape(ref_logp)}, {jnp.shape(mask)}")
    if jnp.shape(advantages) != shape[:1]:
        raise ValueError(f"grpo_objective: advantages must be [B={shape[0]}]; got "
                         f"{jnp.shape(advantages)}")
    m = mask.astype(jnp.float32)
    surr, _, clipped = clipped_surrogate(logp, old_logp, advantages.astype(logp.dtype),
                                         clip_eps)
    kl = k3_kl(logp, ref_logp)
    per_token = (surr - kl_beta * kl) * m
    tokens = m.sum()
    if averaging == "sequence":
        per_row = per_token.sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0)
        loss, weight = -per_row.mean(), jnp.float32(shape[0])
    else:
        loss, weight = -per_token.sum() / jnp.maximum(tokens, 1.0), tokens
    den = jnp.maximum(tokens, 1.0)
    return loss, {"kl": ((kl * m).sum() / den, tokens),
                  "clip_frac": ((clipped * m).sum() / den, tokens),
                  metrics.LOSS_WEIGHT: weight}


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log softmax(logits) at the targets: ``[B, T]`` from ``[B, T, V]`` and int ``[B, T]``
    (float32, or float64 for float64 logits; no masking: every id is a real token here)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)),
                              axis=-1)
    return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


@functools.lru_cache(maxsize=32)
def grpo_loss_fn(clip_eps: float, kl_beta: float, averaging: str = "sequence"
                 ) -> Callable[[nnx.Module, dict, jax.Array], tuple[jax.Array, dict]]:
    """The loss hook ``(model, batch, rng) -> (loss, metrics)`` of :func:`grpo_objective`.

    ``batch`` (:func:`completion_batch` plus the log-probs and advantages): int
    ``inputs``/``targets`` ``[B, T]``, ``loss_mask`` ``[B, T]``, float ``old_logprobs``
    and ``ref_logprobs`` ``[B, T]`` aligned with ``targets``, float ``advantages``
    ``[B]``. One function per setting (cached), so a jitted step compiles once.
    """
    check_clip_eps(clip_eps)
    check_kl_beta(kl_beta)
    check_averaging(averaging)

    def loss_fn(model, batch, rng):
        del rng
        logp = token_logprobs(metrics.model_logits(model, batch), batch["targets"])
        return grpo_objective(logp, batch["old_logprobs"], batch["ref_logprobs"],
                              batch["advantages"], batch["loss_mask"], clip_eps=clip_eps,
                              kl_beta=kl_beta, averaging=averaging)

    return loss_fn


# ------------------------------------------------------------------------- batches and data


def completion_batch(tokens: Any, prompt_lengths: Any, lengths: Any) -> dict[str, np.ndarray]:
    """Teacher-forcing arrays of sampled rows (``generate``'s ``tokens``/``lengths``).

    Row b is ``prompt (prompt_lengths[b] tokens) ++ completion ++ padding`` in ``tokens``
    ``[B, L]``; ``lengths[b]`` counts prompt + completion. Returns ``inputs =
    tokens[:, :-1]``, ``targets = tokens[:, 1:]`` and ``loss_mask`` ``[B, L - 1]``, true
    where the target is a completion token: ``prompt_lengths[b] - 1 <= j < lengths[b] - 1``.
    """
    tokens = np.asarray(tokens)
    plen, length = np.asarray(prompt_lengths), np.asarray(lengths)
    if tokens.ndim != 2 or plen.shape != tokens.shape[:1] or length.shape != plen.shape:
        raise ValueError(f"completion_batch: tokens [B, L], prompt_lengths and lengths [B]; "
                         f"got {tokens.shape}, {plen.shape}, {length.shape}")
    if np.any(plen < 1) or np.any(length < plen) or np.any(length > tokens.shape[1]):
        raise ValueError("completion_batch: need 1 <= prompt_lengths <= lengths <= L")
    j = np.arange(tokens.shape[1] - 1)[None, :]
    mask = (j >= plen[:, None] - 1) & (j < length[:, None] - 1)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "loss_mask": mask}


def align_logprobs(logprobs: Any, prompt_lengths: Any, mask: np.ndarray) -> np.ndarray:
    """``generate``'s per-generated-token log-probs ``[B, N]`` placed on the target axis of
    :func:`completion_batch` ``[B, L - 1]`` (completion token i is target
    ``prompt_lengths[b] - 1 + i``); 0 off the mask."""
    lp = np.asarray(logprobs, np.float32)
    j = np.arange(mask.shape[1])[None, :] - (np.asarray(prompt_lengths)[:, None] - 1)
    idx = np.clip(j, 0, lp.shape[1] - 1)
    return np.where(mask, np.take_along_axis(lp, idx, axis=1), 0.0).astype(np.float32)


def default_prompt(item: Mapping) -> str | Sequence[int]:
    """``item["prompt"]`` if present; a TableLong item (``tables``, ``context``,
    ``question``, ``language``): :func:`lcjax.data.tablelong.item_prompt` (instruction,
    context, question and answer cue in the item's language, as the evaluator prompts);
    other items with ``context`` and ``question``: ``context + "\\n\\nQuestion: " +
    question + "\\nAnswer: "``."""
    if "prompt" in item:
        return item["prompt"]
    if all(k in item for k in ("tables", "context", "question", "language")):
        return item_prompt(dict(item))
    if "context" in item and "question" in item:
        return f"{item['context']}\n\nQuestion: {item['question']}\nAnswer: "
    raise ValueError(f"an RL item needs 'prompt' or 'context' and 'question'; got keys "
                     f"{sorted(item)}")


def _encode_prompt(prompt: Any, encode: Callable[[str], Any]) -> np.ndarray:
    ids = np.asarray(encode(prompt) if isinstance(prompt, str) else prompt)
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise ValueError(f"a prompt must encode to a non-empty 1-D int array; got "
                         f"{ids.dtype} {ids.shape}")
    return ids.astype(np.int32)


def prompt_indices(num_items: int, step: int, per_step: int, seed: int) -> np.ndarray:
    """Items of 1-based ``step``: prompts ``(step - 1) * per_step ..`` of the stream that
    walks through a fresh permutation of the items each epoch (``default_rng([seed,
    epoch])``). A function of the step alone, so a resume needs no iterator state."""
    k = np.arange((step - 1) * per_step, step * per_step)
    out = np.empty(per_step, np.int64)
    for epoch in np.unique(k // num_items):
        sel = k // num_items == epoch
        perm = np.random.default_rng([seed, int(epoch)]).permutation(num_items)
        out[sel] = perm[k[sel] % num_items]
    return out


def _fingerprint(*arrays: Any) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.asarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:32]


@functools.lru_cache(maxsize=16)
def compiled_logprobs(graphdef: nnx.GraphDef) -> Callable:
    """Jitted ``(params, rest, inputs [B, T], targets [B, T]) -> log-probs [B, T]`` of the
    model ``nnx.merge(graphdef, params, rest)`` (what the update recomputes for log π_old
    and log π_ref); one compiled function per ``graphdef``."""

    def run(params, rest, inputs, targets):
        model = nnx.merge(graphdef, params, rest)
        return token_logprobs(metrics.model_logits(model, {"inputs": inputs}), targets)

    return jax.jit(run)


def _rewards(tokens, prompt_lengths, lengths, rows_items, reward_fn, decode, stops):
    out = np.empty(len(rows_items), np.float64)
    for b, item in enumerate(rows_items):
        ids = tokens[b, prompt_lengths[b]:lengths[b]]
        if ids.size and int(ids[-1]) in stops:
            ids = ids[:-1]
        r = float(reward_fn(decode(ids), item))
        if not math.isfinite(r):
            raise ValueError(f"reward_fn returned {r} for row {b}")
        out[b] = r
    return out


def sample_group_batch(model: nnx.Module, cfg: GRPOConfig, prompts: np.ndarray,
                       prompt_lengths: np.ndarray, row_items: Sequence[Mapping],
                       rng: jax.Array, reward_fn: Callable[[str, Mapping], float],
                       decode: Callable[[Any], str]
                       ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Steps 1-3 of a GRPO step: sample, score, advantages.

    Args:
      model: the current policy.
      cfg: sampling settings (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``,
        ``stop_tokens``, ``pad_id``), ``group_size`` and ``adv_eps``.
      prompts: int ``[B, P]`` right-padded, each group's prompt in ``group_size``
        consecutive rows; ``prompt_lengths`` int ``[B]``; ``row_items`` the B items.
      rng: the sampling key.

    Returns:
      ``(batch, rewards [B], generated [B])``: ``batch`` is :func:`completion_batch` plus
      ``advantages`` ``[B]`` and the sampler's ``old_logprobs`` ``[B, L - 1]``;
      ``generated`` counts each row's new tokens (a stop token included).
    """
    out = generate(model, prompts, cfg.max_new_tokens, temperature=cfg.temperature,
                   top_k=cfg.top_k, top_p=cfg.top_p, stop_tokens=cfg.stop_tokens, rng=rng,
                   prompt_lengths=prompt_lengths, return_logprobs=True, pad_id=cfg.pad_id)
    tokens, lengths, sampled = jax.device_get((out.tokens, out.lengths, out.logprobs))
    rewards = _rewards(tokens, prompt_lengths, lengths, row_items, reward_fn, decode,
                       cfg.stop_tokens)
    batch = completion_batch(tokens, prompt_lengths, lengths)
    batch["advantages"] = group_advantages(rewards.reshape(-1, cfg.group_size),
                                           cfg.adv_eps).reshape(-1)
    batch["old_logprobs"] = align_logprobs(sampled, prompt_lengths, batch["loss_mask"])
    return batch, rewards, lengths - prompt_lengths


# ------------------------------------------------------------------------------- the driver


_UPDATE_METRICS = ("loss", "kl", "clip_frac", "grad_norm")


def train_grpo(
    model: nnx.Module,
    cfg: GRPOConfig,
    items: Sequence[Mapping],
    *,
    reward_fn: Callable[[str, Mapping], float] = answer_reward,
    prompt_fn: Callable[[Mapping], str | Sequence[int]] = default_prompt,
    encode: Callable[[str], Any] = tokenizer.encode,
    decode: Callable[[Any], str] = tokenizer.decode,
    stop_at: int | None = None,
    overwrite: bool = False,
) -> GRPOResult:
    """Runs GRPO on ``model`` over prompts from ``items``; resumes from ``cfg.out_dir``.

    Args:
      model: the initial policy (e.g. ``lcjax.train.checkpoint.load_model(run_dir)``), a
        :class:`lcjax.nn.DecoderLM`; it is also the frozen reference and is not modified.
        A resume must be handed the same initial model (checked by a fingerprint of its
        parameters).
      cfg: the run's hyper-parameters.
      items: mappings with an ``answer`` and a prompt (``prompt_fn``).
      reward_fn: ``(completion text, item) -> float``; default
        :data:`lcjax.train.rewards.answer_reward` (numeric or exact match).
      prompt_fn: item -> prompt text (encoded with ``encode``) or token ids.
      encode, decode: text <-> ids; default the byte tokenizer. ``decode`` receives a
        completion's ids without its stop token.
      stop_at: stop (and checkpoint) after this step though the schedule runs to
        ``cfg.steps`` (an interrupted run).
      overwrite: remove ``cfg.out_dir`` first; without it a non-empty ``out_dir`` that is
        not an lcjax run folder is refused (:func:`lcjax.train.checkpoint.prepare_out_dir`).

    Returns:
      A :class:`GRPOResult`.

    Raises:
      ValueError: no items, a prompt longer than ``cfg.max_prompt_len``, a non-finite
        reward, a non-empty ``out_dir`` that is not a run folder (without ``overwrite``), a
        fresh run into an ``out_dir`` with checkpoints, or a resume whose config,
        model, reference or items differ from the checkpoint's.
    """
    if not isinstance(cfg, GRPOConfig):
        raise TypeError(f"cfg must be a GRPOConfig; got {type(cfg).__name__}")
    if not items:
        raise ValueError("train_grpo: no items")
    padded, prompt_len = _padded_prompts(cfg, items, prompt_fn, encode)
    graphdef, ref_params, ref_rest = nnx.split(model, nnx.Param, ...)
    params, rest = jax.tree.map(jnp.copy, (ref_params, ref_rest))  # the step donates them
    tcfg = cfg.train_config()
    hparams = optimizer_hparams(tcfg)
    opt_state = make_optimizer(**hparams).init(params)
    meta, fields = _grpo_meta(cfg, model, params, ref_params, padded, prompt_len, items)
    manager, log_path, (params, rest, opt_state), step = _open_grpo_run(
        cfg, meta, fields, (params, rest, opt_state), overwrite=overwrite)
    step_fn = functools.partial(
        _grpo_step, cfg, graphdef=graphdef, reference=(ref_params, ref_rest),
        update=cached_train_step(graphdef, grpo_loss_fn(
            float(cfg.clip_eps), float(cfg.kl_beta), cfg.averaging), cfg.grad_accum),
        logprob_step=compiled_logprobs(graphdef), hparams=hparams, sched=lr_schedule(tcfg),
        prompts=(padded, prompt_len), items=items, reward_fn=reward_fn, decode=decode)
    last = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
    history, pending = [], []
    bar = tqdm(total=cfg.steps, initial=step, disable=not cfg.progress, desc="grpo")
    while step < last:
        step += 1
        (params, rest, opt_state), record = step_fn((params, rest, opt_state), step)
        pending.append(record)
        if step % cfg.log_every == 0 or step == last:
            _flush_grpo_log(pending, history, log_path, bar)
        if manager is not None and (step == last or (cfg.ckpt_every
                                                     and step % cfg.ckpt_every == 0)):
            _flush_grpo_log(pending, history, log_path, bar)
            checkpoint.save_checkpoint(
                manager, step, params=params, rest=rest, opt_state=opt_state,
                data_state={"prompts_seen": step * cfg.prompts_per_step}, meta=meta)
    _flush_grpo_log(pending, history, log_path, bar)
    bar.close()
    if manager is not None:
        manager.close()
    return GRPOResult(history, step, nnx.merge(graphdef, params, rest))


def _padded_prompts(cfg: GRPOConfig, items: Sequence[Mapping], prompt_fn: Callable,
                    encode: Callable) -> tuple[np.ndarray, np.ndarray]:
    """The items' prompts as ids padded with ``cfg.pad_id`` to ``cfg.max_prompt_len`` (or
    the longest), int32 [N, width], and their lengths [N]."""
    prompts = [_encode_prompt(prompt_fn(it), encode) for it in items]
    prompt_len = np.array([len(p) for p in prompts], np.int32)
    width = int(prompt_len.max()) if cfg.max_prompt_len is None else cfg.max_prompt_len
    if prompt_len.max() > width:
        raise ValueError(f"a prompt has {prompt_len.max()} tokens > max_prompt_len={width}")
    padded = np.full((len(prompts), width), cfg.pad_id, np.int32)
    for i, p in enumerate(prompts):
        padded[i, :len(p)] = p
    return padded, prompt_len


def _grpo_meta(cfg: GRPOConfig, model: nnx.Module, params: Any, ref_params: Any,
               padded: np.ndarray, prompt_len: np.ndarray, items: Sequence[Mapping]
               ) -> tuple[dict, dict]:
    """The checkpoint's metadata (configs, parameter shapes, fingerprints of the reference
    and of the items) and the fields a resume must match (all but :data:`_RUN_FIELDS`)."""
    answers = json.dumps([str(it.get("answer")) for it in items])
    meta = json.loads(json.dumps({
        "grpo_config": config_dict(cfg),
        "model_config": config_dict(getattr(model, "config", None)),
        "params": checkpoint.param_shapes(params),
        "reference": _fingerprint(*jax.tree.leaves(ref_params)),
        "items": _fingerprint(padded, prompt_len, np.frombuffer(answers.encode(), np.uint8)),
    }))
    fields = {"grpo_config": tuple(k for k in meta["grpo_config"] if k not in _RUN_FIELDS),
              "model_config": None, "params": None, "reference": None, "items": None}
    return meta, fields


def _open_grpo_run(cfg: GRPOConfig, meta: dict, fields: dict, state: tuple, *,
                   overwrite: bool):
    """Opens ``cfg.out_dir`` (checkpoints, ``metrics.jsonl`` cut back to the resumed step,
    ``config.json``). Returns ``(manager, log_path, state, step)``: ``state = (params,
    rest, opt_state)`` restored on a resume; ``manager``/``log_path`` None without
    ``out_dir``."""
    if cfg.out_dir is None:
        return None, None, state, 0
    params, rest, opt_state = state
    step = 0
    checkpoint.prepare_out_dir(cfg.out_dir, resume=cfg.resume, overwrite=overwrite)
    manager, restored = checkpoint.open_run(
        os.path.join(cfg.out_dir, "checkpoints"), resume=cfg.resume, meta=meta,
        fields=fields, params=params, rest=rest, opt_state=opt_state,
        max_to_keep=cfg.keep_checkpoints)
    if restored is not None:
        params, rest, opt_state = (restored[k] for k in ("params", "rest", "opt_state"))
        step = restored["step"]
    log_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    metrics.truncate_jsonl(log_path, step)
    with open(os.path.join(cfg.out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"model": meta["model_config"], "grpo": meta["grpo_config"]}, f, indent=2)
    return manager, log_path, (params, rest, opt_state), step


def _grpo_step(cfg: GRPOConfig, state: tuple, step: int, *, graphdef: nnx.GraphDef,
               reference: tuple, update: Callable, logprob_step: Callable, hparams: dict,
               sched: Callable, prompts: tuple[np.ndarray, np.ndarray],
               items: Sequence[Mapping], reward_fn: Callable, decode: Callable
               ) -> tuple[tuple, dict]:
    """GRPO step ``step`` (1-based): sample ``group_size`` completions of this step's
    prompts with the policy ``state = (params, rest, opt_state)``, score them, and make
    ``updates_per_batch`` updates (none when every advantage is 0 and
    ``skip_flat_steps``). Update ``k = (step - 1) mu + u + 1`` gets ``fold_in(update_rng,
    k)``. Returns the new state and the step's record (device values)."""
    params, rest, opt_state = state
    (padded, prompt_len), (ref_params, ref_rest) = prompts, reference
    key = jax.random.key(cfg.seed)
    sample_rng, update_rng = (jax.random.fold_in(key, s) for s in (_SAMPLE_RNG, _UPDATE_RNG))
    g, mu = cfg.group_size, cfg.updates_per_batch
    idx = np.repeat(prompt_indices(len(items), step, cfg.prompts_per_step, cfg.data_seed), g)
    batch, rewards, gen_len = sample_group_batch(
        nnx.merge(graphdef, params, rest), cfg, padded[idx], prompt_len[idx],
        [items[i] for i in idx], jax.random.fold_in(sample_rng, step), reward_fn, decode)
    skip = cfg.skip_flat_steps and not np.any(batch["advantages"])
    if not skip:  # the log-probs only the update reads
        batch["ref_logprobs"] = logprob_step(ref_params, ref_rest, batch["inputs"],
                                             batch["targets"])
        if cfg.old_logprobs == "recompute":
            batch["old_logprobs"] = logprob_step(params, rest, batch["inputs"],
                                                 batch["targets"])
    stats = []
    for u in range(0 if skip else mu):
        k = (step - 1) * mu + u + 1  # 1-based update number
        params, rest, opt_state, s = update(params, rest, opt_state, batch, hparams,
                                            jax.random.fold_in(update_rng, k))
        stats.append(s)
    update_stats = ({m: float("nan") for m in _UPDATE_METRICS} if skip else
                    {"loss": stats[0]["loss"],
                     **{m: sum(s[m] for s in stats) / mu for m in _UPDATE_METRICS[1:]}})
    record = {
        "step": step, "reward_mean": rewards.mean(), "reward_std": rewards.std(),
        "completion_len": float(np.mean(gen_len)), **update_stats,
        "lr": sched(step * mu), "skipped": float(skip),
    }
    return (params, rest, opt_state), record


def _flush_grpo_log(pending: list[dict], history: list[dict], log_path: str | None,
                    bar: Any) -> None:
    """Moves the ``pending`` records (fetched, as floats) to ``history``, ``log_path`` and
    the progress bar."""
    if not pending:
        return
    records = [{k: (v if k == "step" else float(v)) for k, v in r.items()}
               for r in jax.device_get(pending)]
    history.extend(records)
    if log_path:
        metrics.append_jsonl(log_path, records)
    bar.update(len(records))
    bar.set_postfix({k: f"{records[-1][k]:.3g}" for k in ("reward_mean", "kl")})
    pending.clear()
