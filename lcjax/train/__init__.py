"""Training: the train loop, losses and metrics, orbax checkpoints, ``lcjax train``."""

from lcjax.train.checkpoint import checkpoint_manager, restore_checkpoint, save_checkpoint
from lcjax.train.loop import (
    TrainConfig,
    TrainResult,
    config_dict,
    evaluate,
    lr_schedule,
    make_eval_step,
    make_optimizer,
    make_train_step,
    train,
)
from lcjax.train.metrics import append_jsonl, bits_per_byte, mean_loss, read_jsonl, token_nll

__all__ = [
    "TrainConfig",
    "TrainResult",
    "append_jsonl",
    "bits_per_byte",
    "checkpoint_manager",
    "config_dict",
    "evaluate",
    "lr_schedule",
    "make_eval_step",
    "make_optimizer",
    "make_train_step",
    "mean_loss",
    "read_jsonl",
    "restore_checkpoint",
    "save_checkpoint",
    "token_nll",
    "train",
]
