"""experiments/flashblock: per-step KL to the exact sampler under teacher forcing is zero for
a sampler that computes exactly and positive for stale reuse; the KL claims follow their
intervals and are not tested on an unlearned model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.flashblock import experiment as ex
from lcjax.attention import flashblock as F
from lcjax.nn import DecoderLM
from lcjax.nn import diffusion as D


def test_teacher_forced_kl_zero_for_exact_positive_for_reuse():
    cfg = D.diffusion_config(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                             head_dim=8, mlp_hidden=64, max_len=32)
    model = DecoderLM(cfg, rngs=nnx.Rngs(2))
    prompts = jax.random.randint(jax.random.key(5), (3, 8), 0, 256, jnp.int32)
    exact = D.generate_blocks(model, prompts, 2, ex.STEPS_PER_BLOCK, block_size=ex.BLOCK)
    every = F.FlashBlockConfig(recompute_heads=((True,) * 4,) * 2)
    same = ex.teacher_forced_kl(model, prompts, exact, every)
    assert same.shape == (3,) and np.all(np.abs(same) < 1e-5)
    stale = ex.teacher_forced_kl(model, prompts, exact, F.FlashBlockConfig())
    assert np.all(stale > 1e-6)


def _qual(reuse, sparse, residual):
    return {"reuse": {"kl_per_row": reuse}, "sparse (keep 4)": {"kl_per_row": sparse},
            "sparse (keep 4) + residual reuse": {"kl_per_row": residual}}


def test_kl_claims_follow_intervals():
    rng = np.random.default_rng(0)
    small = (0.01 + 0.002 * rng.random(16)).tolist()
    big = (0.5 + 0.1 * rng.random(16)).tolist()
    b, c = ex.kl_claims(_qual(small, big, small), 4, 2.5)
    assert b.holds is True and c.holds is True
    b, c = ex.kl_claims(_qual(big, small, big), 4, 2.5)
    assert b.holds is False and c.holds is False
    b, c = ex.kl_claims(_qual(small, big, small), 4, 4.5)
    assert b.verdict == c.verdict == "not tested"
