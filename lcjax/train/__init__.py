"""Training: the one train loop (datasets of batch dicts, loss and eval hooks, gradient
accumulation), losses and metrics, orbax checkpoints, ``lcjax train``. See docs/training.md.
GRPO with verifiable rewards: ``train_grpo`` (docs/grpo.md)."""

from lcjax.train.checkpoint import checkpoint_manager, restore_checkpoint, save_checkpoint
from lcjax.train.loop import (
    TrainConfig,
    TrainResult,
    as_batch,
    config_dict,
    evaluate,
    lr_schedule,
    make_eval_step,
    make_optimizer,
    make_train_step,
    train,
)
from lcjax.train.losses import answer_weighted_loss, answer_weighted_nll, answer_weights
from lcjax.train.metrics import (
    append_jsonl,
    bits_per_byte,
    mean_loss,
    model_logits,
    nll_loss,
    read_jsonl,
    target_weights,
    token_nll,
    weighted_nll,
)
from lcjax.train.rewards import answer_reward, exact_match, make_verifier, numeric_match
from lcjax.train.rl import GRPOConfig, GRPOResult, group_advantages, grpo_loss_fn, train_grpo
from lcjax.train.rope_distill import (
    distill_loss,
    distill_loss_fn,
    kl_divergence,
    perturb_positions,
)

__all__ = [
    "GRPOConfig",
    "GRPOResult",
    "TrainConfig",
    "TrainResult",
    "answer_weighted_loss",
    "answer_weighted_nll",
    "answer_weights",
    "append_jsonl",
    "as_batch",
    "bits_per_byte",
    "checkpoint_manager",
    "config_dict",
    "distill_loss",
    "distill_loss_fn",
    "evaluate",
    "kl_divergence",
    "lr_schedule",
    "make_eval_step",
    "make_optimizer",
    "make_train_step",
    "mean_loss",
    "model_logits",
    "nll_loss",
    "perturb_positions",
    "read_jsonl",
    "restore_checkpoint",
    "save_checkpoint",
    "target_weights",
    "token_nll",
    "train",
    "weighted_nll",
    "answer_reward",
    "exact_match",
    "group_advantages",
    "grpo_loss_fn",
    "make_verifier",
    "numeric_match",
    "train_grpo",
]
