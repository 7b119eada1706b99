"""Training: the one train loop (datasets of batch dicts, loss and eval hooks, gradient
accumulation), losses and metrics, orbax checkpoints, ``lcjax train``. See docs/training.md.
GRPO with verifiable rewards: ``train_grpo`` (docs/grpo.md)."""

from lcjax.lazy import lazy_exports

# public name -> the module that defines it, imported on first access (lcjax.lazy)
_EXPORTS = {
    "checkpoint_manager": "lcjax.train.checkpoint",
    "restore_checkpoint": "lcjax.train.checkpoint",
    "save_checkpoint": "lcjax.train.checkpoint",
    "TrainConfig": "lcjax.train.loop",
    "TrainResult": "lcjax.train.loop",
    "as_batch": "lcjax.train.loop",
    "config_dict": "lcjax.train.loop",
    "evaluate": "lcjax.train.loop",
    "lr_schedule": "lcjax.train.loop",
    "make_eval_step": "lcjax.train.loop",
    "make_optimizer": "lcjax.train.loop",
    "make_train_step": "lcjax.train.loop",
    "train": "lcjax.train.loop",
    "answer_weighted_loss": "lcjax.train.losses",
    "answer_weighted_nll": "lcjax.train.losses",
    "answer_weights": "lcjax.train.losses",
    "context_lm_loss": "lcjax.train.losses",
    "MaskedDiffusionLoss": "lcjax.train.diffusion",
    "diffusion_dataset": "lcjax.train.diffusion",
    "append_jsonl": "lcjax.train.metrics",
    "bits_per_byte": "lcjax.train.metrics",
    "mean_loss": "lcjax.train.metrics",
    "model_logits": "lcjax.train.metrics",
    "nll_loss": "lcjax.train.metrics",
    "read_jsonl": "lcjax.train.metrics",
    "target_weights": "lcjax.train.metrics",
    "token_nll": "lcjax.train.metrics",
    "weighted_nll": "lcjax.train.metrics",
    "answer_reward": "lcjax.train.rewards",
    "exact_match": "lcjax.train.rewards",
    "make_verifier": "lcjax.train.rewards",
    "numeric_match": "lcjax.train.rewards",
    "GRPOConfig": "lcjax.train.rl",
    "GRPOResult": "lcjax.train.rl",
    "group_advantages": "lcjax.train.rl",
    "grpo_loss_fn": "lcjax.train.rl",
    "train_grpo": "lcjax.train.rl",
    "distill_loss": "lcjax.train.rope_distill",
    "distill_loss_fn": "lcjax.train.rope_distill",
    "kl_divergence": "lcjax.train.rope_distill",
    "perturb_positions": "lcjax.train.rope_distill",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
