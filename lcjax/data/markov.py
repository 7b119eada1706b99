"""Order-k Markov chains with Dirichlet transition tables: the in-context learning task of
the induction-heads-as-smoothing-estimators study (ICML 2026; ``docs/induction_smoothing.md``).

Each chain draws its own transition table: for every context ``s`` of ``k`` tokens the row
``P(. | s) ~ Dirichlet(alpha, ..., alpha)`` over the ``V`` tokens, independently. The first
``k`` tokens of a chain are uniform on ``{0, ..., V-1}`` (independent of the table); token
``i >= k`` is drawn from ``P(. | x_{i-k}, ..., x_{i-1})``. A model must estimate the table
in context, from the chain itself.

Context codes: the context ``(x_{i-k}, ..., x_{i-1})`` is row
``sum_m x_{i-k+m} V^{k-1-m}`` of the table (the oldest token most significant), so
``tables[c]`` with ``c = context_code(...)`` is ``P(. | s)``.

With ``bos=True`` every chain is prefixed by one BOS token whose id is ``V`` (one past the
chain's tokens): the rows are ``[BOS, x_0, ..., x_{L-1}]`` of width ``L + 1`` and the chain
part is the same chain the same generator gives without BOS.

:class:`MarkovSource` is the grain ``RandomAccessDataSource`` of such chains: record ``i``
is one chain from ``np.random.default_rng([seed, i])`` as a training row.
"""

from __future__ import annotations

import bisect

import numpy as np

__all__ = ["MAX_CONTEXTS", "MarkovSource", "check_tokens", "context_code", "sample_chains"]

MAX_CONTEXTS = 1 << 20  # V**k table rows allowed per chain
_PYTHON_WALK_MAX_N = 4  # up to this many chains, the walk is a Python loop (same numbers)


def _check_shape_args(order: int, vocab: int, alpha: float | None = None) -> None:
    if not isinstance(order, int | np.integer) or order < 0:
        raise ValueError(f"`order` must be an int >= 0; got {order!r}")
    if not isinstance(vocab, int | np.integer) or vocab < 2:
        raise ValueError(f"`vocab` must be an int >= 2; got {vocab!r}")
    if vocab**order > MAX_CONTEXTS:
        raise ValueError(f"vocab**order = {vocab}**{order} contexts exceed {MAX_CONTEXTS}")
    if alpha is not None and not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"`alpha` must be a finite float > 0; got {alpha!r}")


def check_tokens(tokens, vocab: int, *, name: str = "tokens") -> np.ndarray:
    """``tokens`` as an int array after checking every value is in ``[0, vocab)``.

    Raises:
      ValueError: a non-integer dtype, or a value out of range (naming it).
    """
    arr = np.asarray(tokens)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"`{name}` must be integers; got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab):
        raise ValueError(f"`{name}` must lie in [0, {vocab}); got values in "
                         f"[{arr.min()}, {arr.max()}]")
    return arr


def context_code(context, vocab: int) -> np.ndarray:
    """Table row of the contexts ``[..., k]`` (oldest first): ``sum_m c_m V^{k-1-m}``."""
    context = np.asarray(context, np.int64)
    weights = vocab ** np.arange(context.shape[-1] - 1, -1, -1, dtype=np.int64)
    return (context * weights).sum(-1)


def sample_chains(rng, n: int, length: int, *, order: int, vocab: int, alpha: float,
                  bos: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``n`` order-``k`` chains of ``length`` tokens, each with its own Dirichlet table.

    Args:
      rng: a ``np.random.Generator`` or an int seed.
      n: number of chains.
      length: tokens per chain ``L`` (``> order``).
      order: ``k``, the context length.
      vocab: ``V``, the number of chain tokens (ids ``0..V-1``).
      alpha: the Dirichlet concentration of every table row (symmetric).
      bos: prefix each chain with BOS (id ``V``): rows of width ``L + 1``.

    Returns:
      ``(tokens, tables)``: int32 ``[n, L]`` (``[n, L + 1]`` with BOS) and float64
      ``[n, V**k, V]`` with ``tables[b, c]`` the next-token distribution of context code
      ``c`` in chain ``b`` (rows sum to 1). The first ``k`` tokens are uniform.
    """
    _check_shape_args(order, vocab, alpha)
    if n < 1 or length <= order:
        raise ValueError(f"need n >= 1 and length > order; got n={n}, length={length}, "
                         f"order={order}")
    rng = np.random.default_rng(rng)
    tables = rng.dirichlet(np.full(vocab, float(alpha)), size=(n, vocab**order))
    # numpy's small-alpha Dirichlet can leave rows a rounding error off 1
    tables = tables / tables.sum(-1, keepdims=True)
    cdf = np.cumsum(tables, -1)
    tokens = np.empty((n, length), np.int64)
    tokens[:, :order] = rng.integers(0, vocab, size=(n, order))
    u = rng.random((n, length))
    rows = np.arange(n)
    code = context_code(tokens[:, :order], vocab)
    mod = vocab ** max(order - 1, 0)
    # inverse CDF: next = #{m : u >= cdf[m]}, capped at V - 1 (u above a rounded last value)
    if n <= _PYTHON_WALK_MAX_N:  # per-record sampling (grain): plain Python is faster
        for b in range(n):
            rows_b, c, row = cdf[b].tolist(), int(code[b]), tokens[b]
            for i, ui in enumerate(u[b, order:].tolist(), start=order):
                nxt = min(bisect.bisect_right(rows_b[c], ui), vocab - 1)
                row[i] = nxt
                c = (c % mod) * vocab + nxt if order > 0 else c
    else:
        for i in range(order, length):
            nxt = np.minimum((u[:, i, None] >= cdf[rows, code]).sum(-1), vocab - 1)
            tokens[:, i] = nxt
            code = (code % mod) * vocab + nxt if order > 0 else code  # drop the oldest token
    tokens = tokens.astype(np.int32)
    if bos:
        tokens = np.concatenate([np.full((n, 1), vocab, np.int32), tokens], axis=1)
    return tokens, tables


class MarkovSource:
    """grain ``RandomAccessDataSource`` of Markov-chain training rows.

    Record ``i`` is ``sample_chains(np.random.default_rng([seed, i]), 1, length + 1, ...)``
    (BOS-prefixed when ``bos``) as a next-token row: ``inputs`` = the row without its last
    token, ``targets`` = the row shifted by one (both ``[length]``, int32), ``loss_mask``
    True where the target is a transition ``x_i, i >= k`` (not one of the uniform first
    ``k`` tokens), and ``table`` ``[V**k, V]`` (float32) the chain's transition table.
    """

    def __init__(self, num_records: int, length: int, *, order: int, vocab: int, alpha: float,
                 bos: bool = True, seed: int = 0):
        _check_shape_args(order, vocab, alpha)
        if num_records < 1:
            raise ValueError(f"MarkovSource: `num_records` must be >= 1; got {num_records}")
        if length < order + 1:
            raise ValueError(f"MarkovSource: `length` must be > order; got {length}")
        self.num_records, self.length, self.order, self.vocab = num_records, length, order, vocab
        self.alpha, self.bos, self.seed = float(alpha), bos, seed

    def __len__(self) -> int:
        return self.num_records

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        index = int(index)
        if not 0 <= index < self.num_records:
            raise IndexError(f"MarkovSource: index {index} out of range [0, {self.num_records})")
        chain_len = self.length if self.bos else self.length + 1
        tokens, tables = sample_chains(np.random.default_rng([self.seed, index]), 1, chain_len,
                                       order=self.order, vocab=self.vocab, alpha=self.alpha,
                                       bos=self.bos)
        row = tokens[0]
        chain_index = np.arange(1, self.length + 1) - int(self.bos)  # chain index of targets
        return {"inputs": row[:-1], "targets": row[1:], "loss_mask": chain_index >= self.order,
                "table": tables[0].astype(np.float32)}

    def __repr__(self) -> str:
        return (f"MarkovSource(num_records={self.num_records}, length={self.length}, "
                f"order={self.order}, vocab={self.vocab}, alpha={self.alpha}, bos={self.bos}, "
                f"seed={self.seed})")
