"""A small trained model's attention inputs, for benchmarks that need real q, k, v.

:func:`train_model` trains a ``lcjax.nn.DecoderLM`` through ``lcjax.train.train`` (the
documents path: Shakespeare, its default split); :func:`heldout_windows` cuts windows of
the works that split holds out (``lcjax.data.gather_windows``); :func:`capture_qkv` runs
the model and returns the (q, k, v, scale) each layer's attention variant received (after
RoPE), read from the layers' attention-inputs taps (``lcjax.nn.capture_attention``) — the
model's own forward pass, nothing recomputed; :func:`score_rows` turns q, k into the
score rows ``scale·q·kᵀ`` a normaliser (softmax, entmax) sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lcjax.attention import causal_mask
from lcjax.nn import capture_attention

__all__ = ["capture_qkv", "heldout_windows", "score_rows", "train_model"]


def train_model(model_cfg, train_cfg, log: Callable[[str], object] = print):
    """Train ``lcjax.nn.DecoderLM(model_cfg)`` with ``lcjax.train.train(model_cfg,
    train_cfg)``; returns (model, info) where info holds the model and training settings,
    ``train_s``, ``first_loss``, ``final_loss``, ``eval`` (the last held-out evaluation)
    and ``heldout`` (which text was held out)."""
    from lcjax.train import train

    start = time.perf_counter()
    res = train(model_cfg, train_cfg)
    info = {
        "model": {k: getattr(model_cfg, k) for k in (
            "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_hidden",
            "attention")},
        "train": {k: getattr(train_cfg, k) for k in (
            "steps", "batch_size", "seq_len", "lr", "warmup_steps", "seed")},
        "train_s": time.perf_counter() - start,
        "first_loss": res.losses[0] if res.losses else None,
        "final_loss": res.losses[-1] if res.losses else None,
        "eval": res.evals[-1] if res.evals else None,
        "heldout": f"shakespeare_split({train_cfg.heldout_fraction}, "
                   f"{train_cfg.split_seed}): works held out of training",
    }
    log(f"  trained in {info['train_s']:.0f} s: loss {info['first_loss']:.3f} -> "
        f"{info['final_loss']:.3f}" + (f", held-out {info['eval']['eval_bpb']:.3f} bits/byte"
                                       if info["eval"] else ""))
    return res.model, info


def heldout_windows(seq_len: int, count: int, train_cfg=None) -> np.ndarray:
    """``count`` int32 windows [count, seq_len] of the Shakespeare works ``train`` holds out
    under ``train_cfg`` (default ``TrainConfig()``), packed ``BOS doc EOS ...``, evenly
    spaced over the stream."""
    from lcjax.data import gather_windows, pack_stream, shakespeare_split
    from lcjax.train import TrainConfig

    cfg = train_cfg or TrainConfig()
    _, heldout = shakespeare_split(cfg.heldout_fraction, cfg.split_seed)
    stream = pack_stream(heldout, seq_len)
    n = (len(stream) - 1) // seq_len
    if n < 1:
        raise ValueError(f"heldout_windows: held-out text is shorter than one window of "
                         f"`seq_len` {seq_len}")
    idx = np.linspace(0, n - 1, num=min(count, n)).round().astype(int)
    return gather_windows(stream, idx, seq_len)["inputs"]


def capture_qkv(model, tokens) -> list[tuple]:
    """Run ``model`` on ``tokens`` [B, T] and return, per layer, the (q [B, T, H, D],
    k [B, T, Hkv, D], v, scale) its attention variant received (after RoPE; scale
    resolved to 1/sqrt(D) when the model passes None): the ``inputs`` taps of
    ``lcjax.nn.capture_attention``."""
    _, inputs = capture_attention(model, jnp.asarray(tokens), tap="inputs")
    return [(d["q"], d["k"], d["v"], float(d["scale"])) for d in inputs]


def score_rows(q, k, scale: float, *, causal: bool = True, from_row: int = 0) -> np.ndarray:
    """float32 score rows ``scale·q_i·kᵀ`` [B·H·(T - from_row), S] of the queries i >=
    ``from_row`` (GQA: k repeated over its query heads; causal: masked keys -inf)."""
    heads, kv_heads = q.shape[2], k.shape[2]
    k = jnp.repeat(k, heads // kv_heads, axis=2)
    s = scale * jnp.einsum("BTHD,BSHD->BHTS", q.astype(jnp.float32), k.astype(jnp.float32),
                           precision=jax.lax.Precision.HIGHEST)
    if causal:
        s = jnp.where(causal_mask(s.shape[2], s.shape[3])[None, None], s, -jnp.inf)
    return np.asarray(s[:, :, from_row:].reshape(-1, s.shape[-1]))
