"""The second regime of the induction-smoothing paper (issue 39, item 6): chains whose
order-k rows are drawn *around their lower-order rows*, so that lower-order contexts carry
evidence and interpolation across orders beats additive smoothing; and a standard 2-layer
attention-only transformer trained beside the disentangled one.

Hierarchical Dirichlet tables (per chain; V tokens, order k; the lower-order context of
``c = (x_{i-m}, …, x_{i-1})`` is ``c`` without its oldest token, code ``c mod V^{m-1}``):

    p⁰ ~ Dir(α₀ 1_V),    pᵐ(· | c) ~ Dir(κ · pᵐ⁻¹(· | c without its oldest token)),  m = 1..k

(κ: the concentration around the parent row; κ → ∞ makes every order-k row its order-0
row, κ → 0 makes them unrelated). The first k tokens are uniform, token i ≥ k is drawn
from pᵏ(· | x_{i-k..i-1}), as in ``lcjax.data.sample_chains``.

The reference of the losses is the **oracle**: the chain's own transition row (known
here), so ``excess = CE − CE_oracle`` on the same held-out targets (the Bayes predictor of
this prior has no closed form; the oracle is a lower bound on it).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def hierarchical_tables(rng: np.random.Generator, n: int, *, order: int, vocab: int,
                        alpha0: float, kappa: float) -> np.ndarray:
    """``[n, V**k, V]`` order-k tables (module docstring), rows indexed by
    ``lcjax.data.context_code``."""
    p = rng.dirichlet(np.full(vocab, float(alpha0)), size=n)[:, None, :]  # [n, 1, V]
    for m in range(1, order + 1):
        parent = p[:, np.arange(vocab**m) % vocab ** (m - 1)]  # [n, V^m, V]
        g = np.maximum(rng.gamma(kappa * parent), 1e-300)  # Dirichlet by normalised Gammas
        p = g / g.sum(-1, keepdims=True)
    return p


def hierarchical_chains(rng, n: int, length: int, *, order: int, vocab: int, alpha0: float,
                        kappa: float, bos: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens [n, L] int32 ([n, L + 1] with BOS = V), tables [n, V**k, V])``."""
    rng = np.random.default_rng(rng)
    tables = hierarchical_tables(rng, n, order=order, vocab=vocab, alpha0=alpha0, kappa=kappa)
    cdf = np.cumsum(tables, -1)
    tokens = np.empty((n, length), np.int64)
    tokens[:, :order] = rng.integers(0, vocab, size=(n, order))
    u = rng.random((n, length))
    rows = np.arange(n)
    weights = vocab ** np.arange(order - 1, -1, -1)
    code = (tokens[:, :order] * weights).sum(-1)
    mod = vocab ** (order - 1)
    for i in range(order, length):
        nxt = np.minimum((u[:, i, None] >= cdf[rows, code]).sum(-1), vocab - 1)
        tokens[:, i] = nxt
        code = (code % mod) * vocab + nxt
    tokens = tokens.astype(np.int32)
    if bos:
        tokens = np.concatenate([np.full((n, 1), vocab, np.int32), tokens], axis=1)
    return tokens, tables


def oracle_ce(chains: np.ndarray, tables: np.ndarray, order: int, vocab: int) -> np.ndarray:
    """``[n, L - k]`` ``−log p(x_i | x_{i-k..i-1})`` under each chain's own table."""
    n, length = chains.shape
    weights = vocab ** np.arange(order - 1, -1, -1)
    ctx = np.stack([chains[:, i - order:i] for i in range(order, length)], 1)  # [n, L-k, k]
    code = (ctx * weights).sum(-1)
    p = np.take_along_axis(tables, code[..., None], 1)  # [n, L-k, V]
    return -np.log(np.take_along_axis(p, chains[:, order:, None], -1)[..., 0])


class HierarchicalSource:
    """grain data source: record i = one BOS chain of ``length + 1`` tokens from
    ``default_rng([seed, i])`` as ``inputs`` / ``targets`` ``[length]`` and ``loss_mask``
    (targets ``x_i, i >= k``), as ``lcjax.data.MarkovSource``."""

    def __init__(self, num_records: int, length: int, *, order: int, vocab: int,
                 alpha0: float, kappa: float, seed: int):
        self.n, self.length, self.order, self.vocab = num_records, length, order, vocab
        self.alpha0, self.kappa, self.seed = alpha0, kappa, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        tokens, _ = hierarchical_chains(np.random.default_rng([self.seed, int(index)]), 1,
                                        self.length, order=self.order, vocab=self.vocab,
                                        alpha0=self.alpha0, kappa=self.kappa, bos=True)
        row = tokens[0]
        return {"inputs": row[:-1], "targets": row[1:],
                "loss_mask": np.arange(self.length) >= self.order}


@dataclasses.dataclass(frozen=True)
class AttnOnlyConfig:
    """A standard attention-only transformer: ``layers`` × (causal multi-head attention,
    residual), no MLP, no normalisation; token (V + 1 with BOS) and learned absolute
    position embeddings of width ``d_model``; a linear readout to V logits."""

    vocab: int
    max_len: int
    d_model: int = 32
    num_heads: int = 2
    layers: int = 2


class AttnOnlyTransformer(nnx.Module):
    """``model(tokens [B, T]) -> logits [B, T, V]`` (:class:`AttnOnlyConfig`)."""

    def __init__(self, cfg: AttnOnlyConfig, *, rngs: nnx.Rngs):
        if cfg.d_model % cfg.num_heads:
            raise ValueError(f"AttnOnlyConfig: d_model={cfg.d_model} is not a multiple of "
                             f"num_heads={cfg.num_heads}")
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab + 1, cfg.d_model, rngs=rngs)
        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (cfg.max_len, cfg.d_model)))
        self.qkv = nnx.List([nnx.Linear(cfg.d_model, 3 * cfg.d_model, use_bias=False, rngs=rngs)
                             for _ in range(cfg.layers)])
        self.out = nnx.List([nnx.Linear(cfg.d_model, cfg.d_model, use_bias=False, rngs=rngs)
                             for _ in range(cfg.layers)])
        self.readout = nnx.Linear(cfg.d_model, cfg.vocab, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        from lcjax.attention.core import dot_product_attention

        b, t = tokens.shape
        h_, dh = self.cfg.num_heads, self.cfg.d_model // self.cfg.num_heads
        x = self.embed(tokens) + self.pos[...][:t]
        for qkv, out in zip(self.qkv, self.out, strict=True):
            q, k, v = jnp.split(qkv(x).reshape(b, t, 3 * h_, dh), 3, axis=2)
            x = x + out(dot_product_attention(q, k, v, causal=True).reshape(b, t, -1))
        return self.readout(x)
