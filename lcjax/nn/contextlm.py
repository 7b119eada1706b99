"""ContextLM — next-context prediction as an auxiliary objective of a decoder LM.

Paper: "ContextLM: next-context prediction" (LUMIA-Group; no public code when this was
written). The skeleton follows the abstract and the public sibling project
LUMIA-Group/ConceptLM (read for the method, not copied); the parts marked *(inferred)*
are our choices where neither says more. Switch it on with
``DecoderConfig(context_lm=ContextLMConfig(chunk=C, weight=λ, loss="mse"))``.

With h_t the residual stream after the first ``layer`` = k blocks of the decoder
(``lcjax.nn.DecoderLM``), C the chunk size and chunk j = tokens [jC, (j+1)C)::

    u_t   = h_t / rms(h_t)                                   (parameter-free RMS norm)
    c_j   = mean_{t in chunk j, valid} u_t                  [B, J, D]   chunk (context) embedding
    z     = P(c_0, ..., c_{J-1})                            causal Transformer over chunks
    ĉ_j   = W_p RMSNorm(z_j)                                prediction of c_{j+1}
    h_t  <- h_t + W_f ĉ_{m(t)},   m(t) = ⌊(t+1)/C⌋ − 1      (0 when m(t) < 0)
    logits = the remaining blocks k .. L−1 and the LM head on h (unchanged)
    L_ctx = mean_{j = 0 .. J_c−2} ℓ(ĉ_j, stopgrad(c_{j+1})),   J_c = ⌊T/C⌋ complete chunks
    ℓ     = mean_d (ĉ − c)²  ("mse")   or   1 − cos(ĉ, c)  ("cosine")
    loss  = CE + λ · L_ctx                  (lcjax.train.losses.context_lm_loss)

Causality: ĉ_m depends on chunks 0..m, i.e. on tokens ≤ (m+1)C − 1, and token t receives
ĉ_{m(t)} with (m(t)+1)C − 1 ≤ t: the last token of a chunk sees the prediction made from
its own finished chunk (ConceptLM's shift: prepend a zero chunk, repeat every chunk C times,
drop the first slot), the other tokens of chunk j+1 see ĉ_j. Changing a token after t
changes nothing at ≤ t. Token-level evaluation (perplexity) is unchanged: ``model(tokens)``
returns next-token logits.

Decoding (:class:`ContextLMState`, the last entry of ``DecoderLM.init_cache``'s tuple):
the running sum and count of u over the current chunk, the latest prediction ĉ, the token
count, and the predictor's own KV cache over chunk slots. A step adds the new tokens' u
one by one (``lax.scan``); at a chunk's last token it runs the predictor on the finished
chunk embedding (one query against the chunk cache) and replaces ĉ. So decoding token by
token equals the full pass.

*(inferred)*:
- where the context branch sits: between block k − 1 and block k of the same stack
  (default k = L // 2; ConceptLM has separate encoder and decoder stacks with a final norm
  between them — here the residual stream is left as is, so that with W_f = 0 the model is
  the base LM exactly);
- pooling the parameter-free RMS-normed states (ConceptLM pools the final-normed encoder
  output; no learnable scale keeps the target from being shrunk);
- the predictor: ``predictor_layers`` pre-norm softmax blocks of the model's width and
  heads, RoPE over chunk indices, then RMSNorm and W_p;
- the feedback projection W_f [D, D], initialised to 0: training starts from the base LM
  (ConceptLM adds the normed prediction directly);
- padding (segment id < 0) is left out of the chunk means (a chunk of padding only has
  c = 0, and its pair is not counted); chunks are fixed windows of C slots and may span
  packed documents;
- L_ctx is a mean over pairs per batch; with ``grad_accum`` the train loop combines
  micro-batches by their ``loss_weight`` (the number of CE targets), so the combined
  context term is weighted by targets, not by pairs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from lcjax.nn.attention import KVCache
from lcjax.nn.block import DecoderBlock
from lcjax.nn.layers import RMSNorm, dense_init, rms_norm

__all__ = ["CONTEXT_LOSSES", "ContextLM", "ContextLMConfig", "ContextLMState",
           "context_pair_loss", "check_context_lm", "chunk_embeddings",
           "feedback_index"]

CONTEXT_LOSSES = ("mse", "cosine")


@dataclasses.dataclass(frozen=True)
class ContextLMConfig:
    """ContextLM's settings (hashable: part of the static ``DecoderConfig``).

    chunk: C, tokens per context chunk (int >= 1).
    weight: λ >= 0, the weight of the next-context loss in
      :func:`lcjax.train.losses.context_lm_loss`.
    loss: "mse" or "cosine" (module docstring).
    layer: k, the number of decoder blocks before the context branch (1 <= k <= L − 1);
      None = L // 2.
    predictor_layers: Transformer blocks of the context predictor (int >= 1).
    """

    chunk: int = 16
    weight: float = 1.0
    loss: str = "mse"
    layer: int | None = None
    predictor_layers: int = 1

    def __post_init__(self):
        for name in ("chunk", "predictor_layers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ContextLMConfig: `{name}` must be an int >= 1, got {v!r}")
        try:
            w = float(self.weight)
        except (TypeError, ValueError):
            raise ValueError(f"ContextLMConfig: `weight` must be a number >= 0, got "
                             f"{self.weight!r}") from None
        if not w >= 0:
            raise ValueError(f"ContextLMConfig: `weight` must be >= 0, got {self.weight!r}")
        if self.loss not in CONTEXT_LOSSES:
            raise ValueError(f"ContextLMConfig: `loss` must be one of {CONTEXT_LOSSES}, got "
                             f"{self.loss!r}")
        if self.layer is not None and (isinstance(self.layer, bool)
                                       or not isinstance(self.layer, int)):
            raise ValueError(f"ContextLMConfig: `layer` must be an int or None, got "
                             f"{self.layer!r}")

    def branch_layer(self, num_layers: int) -> int:
        """k for a model of ``num_layers`` blocks."""
        return num_layers // 2 if self.layer is None else self.layer


def check_context_lm(cfg: Any, num_layers: int) -> ContextLMConfig:
    """``cfg`` validated against a model of ``num_layers`` blocks (ValueError naming both)."""
    if not isinstance(cfg, ContextLMConfig):
        raise ValueError(f"DecoderConfig: `context_lm` must be a ContextLMConfig or None, got "
                         f"{type(cfg).__name__}")
    k = cfg.branch_layer(num_layers)
    if not 1 <= k <= num_layers - 1:
        raise ValueError(f"ContextLMConfig: `layer` must lie in [1, num_layers - 1] = "
                         f"[1, {num_layers - 1}] (the branch sits between two blocks), got "
                         f"{k} for num_layers={num_layers}")
    return cfg


class ContextLMState(NamedTuple):
    """ContextLM's decoding state for a batch of B rows.

    pred_cache: one :class:`~lcjax.nn.KVCache` [B, S_chunks, Hkv, D] per predictor block
      (its index = the number of finished chunks); chunk_sum: float32 [B, D], Σ u over the
      current chunk's valid tokens; chunk_count: float32 [B], their number; feedback:
      float32 [B, D], the latest prediction ĉ (0 before the first chunk ends); index: int32
      scalar, the tokens seen.
    """

    pred_cache: tuple[KVCache, ...]
    chunk_sum: jax.Array
    chunk_count: jax.Array
    feedback: jax.Array
    index: jax.Array


def feedback_index(length: int, chunk: int) -> jax.Array:
    """m(t) = ⌊(t+1)/C⌋ − 1 for t = 0 .. length − 1: int32 [length] (−1 = no prediction)."""
    return (jnp.arange(length, dtype=jnp.int32) + 1) // chunk - 1


def _valid(segment_ids, shape):
    if segment_ids is None:
        return jnp.ones(shape, jnp.float32)
    return (segment_ids >= 0).astype(jnp.float32)


def chunk_embeddings(u: jax.Array, chunk: int, valid: jax.Array | None = None
                     ) -> tuple[jax.Array, jax.Array]:
    """Chunk means of u [B, T, D] over its valid tokens (``valid`` [B, T], default all):
    ``(c float32 [B, J, D], count float32 [B, J])``, J = ⌈T / C⌉ (the last chunk may be
    partial); c = 0 where a chunk has no valid token."""
    b, t, d = u.shape
    valid = jnp.ones((b, t), jnp.float32) if valid is None else valid.astype(jnp.float32)
    j = -(-t // chunk)
    pad = j * chunk - t
    uf = jnp.pad(u.astype(jnp.float32) * valid[..., None], ((0, 0), (0, pad), (0, 0)))
    count = jnp.pad(valid, ((0, 0), (0, pad))).reshape(b, j, chunk).sum(-1)
    total = uf.reshape(b, j, chunk, d).sum(2)
    return total / jnp.maximum(count, 1.0)[..., None], count


def context_pair_loss(pred: jax.Array, target: jax.Array, kind: str = "mse") -> jax.Array:
    """ℓ(ĉ, c) per pair: pred, target [..., D] -> float32 [...]; "mse": mean_d (ĉ − c)²,
    "cosine": 1 − ĉ·c / (|ĉ| |c|) (norms floored at 1e-6)."""
    p, c = pred.astype(jnp.float32), target.astype(jnp.float32)
    if kind == "mse":
        return jnp.mean(jnp.square(p - c), axis=-1)
    if kind == "cosine":
        norm = lambda x: jnp.maximum(jnp.linalg.norm(x, axis=-1), 1e-6)
        return 1.0 - jnp.sum(p * c, axis=-1) / (norm(p) * norm(c))
    raise ValueError(f"context_pair_loss: `kind` must be one of {CONTEXT_LOSSES}, got {kind!r}")


class ContextLM(nnx.Module):
    """The context branch of a :class:`~lcjax.nn.DecoderLM` (module docstring).

    ``model.context_lm``; built by ``DecoderLM`` when ``config.context_lm`` is set, after
    every other parameter (so the base parameters equal those of the model without it).
    Attributes: ``layer`` (k), ``predictor`` (the chunk-level blocks), ``out_norm`` and
    ``w_pred`` (W_p [D, D]), ``w_feedback`` (W_f [D, D], init 0).
    """

    def __init__(self, config, *, rngs: nnx.Rngs):
        cl = check_context_lm(config.context_lm, config.num_layers)
        self.chunk, self.kind, self.layer = cl.chunk, cl.loss, cl.branch_layer(config.num_layers)
        self.eps, self.dtype = config.norm_eps, config.dtype
        fields = {f.name for f in dataclasses.fields(config)}
        plain = dict(attention="softmax", attention_options={}, attention_learn=(),
                     capture_attention_weights=False, context_parallel=None, trsp=False,
                     position="rope", context_lm=None, num_layers=cl.predictor_layers)
        if "causal" in fields:
            plain["causal"] = True
        sub = dataclasses.replace(config, **{k: v for k, v in plain.items() if k in fields})
        self.predictor = nnx.List([DecoderBlock(sub, rngs=rngs, layer=i)
                                   for i in range(cl.predictor_layers)])
        d, pd = config.d_model, config.param_dtype
        self.out_norm = RMSNorm(d, eps=config.norm_eps, param_dtype=pd)
        self.w_pred = nnx.Param(dense_init()(rngs.params(), (d, d), pd))
        self.w_feedback = nnx.Param(jnp.zeros((d, d), pd))

    # -- pieces -------------------------------------------------------------------------
    def pool_input(self, h: jax.Array) -> jax.Array:
        """u = h / rms(h), float32 [..., D] (parameter-free)."""
        return rms_norm(h.astype(jnp.float32), jnp.ones((h.shape[-1],), jnp.float32),
                        eps=self.eps)

    def predict(self, c: jax.Array, positions: jax.Array, caches=None):
        """ĉ = W_p RMSNorm(P(c)): c float32 [B, J, D] at chunk positions [B, J] ->
        (float32 [B, J, D], new caches or None)."""
        z = c.astype(self.dtype)
        new = []
        for i, block in enumerate(self.predictor):
            z, kv = block(z, positions, cache=None if caches is None else caches[i])
            new.append(kv)
        z = self.out_norm(z).astype(jnp.float32)
        return z @ self.w_pred[...].astype(jnp.float32), (None if caches is None else tuple(new))

    def feed(self, h: jax.Array, pred: jax.Array) -> jax.Array:
        """h [B, T, D] + W_f pred [B, T, D] in h's dtype."""
        dt = self.dtype
        return h + jnp.einsum("BTD,DE->BTE", pred.astype(dt), self.w_feedback[...].astype(dt))

    def init_state(self, batch: int, max_len: int, *, dtype=None) -> ContextLMState:
        """Empty :class:`ContextLMState` for ``max_len`` tokens (⌊max_len / C⌋ chunk slots,
        at least 1)."""
        slots = max(1, max_len // self.chunk)
        d = self.w_pred.shape[0]
        caches = tuple(b.attn.init_cache(batch, slots, dtype=dtype) for b in self.predictor)
        return ContextLMState(caches, jnp.zeros((batch, d), jnp.float32),
                              jnp.zeros((batch,), jnp.float32), jnp.zeros((batch, d), jnp.float32),
                              jnp.zeros((), jnp.int32))

    # -- the branch ---------------------------------------------------------------------
    def __call__(self, h: jax.Array, *, segment_ids: jax.Array | None = None,
                 state: ContextLMState | None = None):
        """h [B, T, D] (the stream after block k − 1) -> (h with feedback, new state or None,
        aux). Full pass (``state=None``): aux = ``{"context_loss": (L_ctx, pairs)}``, both
        float32 scalars (L_ctx = 0 without pairs). With a state the T tokens continue it,
        and aux is ``{}``."""
        if state is not None:
            return self._step(h, segment_ids, state)
        b, t, _ = h.shape
        u = self.pool_input(h)
        c, count = chunk_embeddings(u, self.chunk, _valid(segment_ids, (b, t)))
        j = c.shape[1]
        pred, _ = self.predict(c, jnp.broadcast_to(jnp.arange(j, dtype=jnp.int32), (b, j)))
        m = feedback_index(t, self.chunk)
        fb = jnp.where((m >= 0)[None, :, None], jnp.take(pred, jnp.maximum(m, 0), axis=1), 0.0)
        complete = t // self.chunk
        if complete >= 2:
            per = context_pair_loss(pred[:, :complete - 1],
                                    lax.stop_gradient(c[:, 1:complete]), self.kind)
            w = ((count[:, :complete - 1] > 0) & (count[:, 1:complete] > 0)).astype(jnp.float32)
            pairs = w.sum()
            loss = (per * w).sum() / jnp.maximum(pairs, 1.0)
        else:
            loss = pairs = jnp.zeros((), jnp.float32)
        return self.feed(h, fb), None, {"context_loss": (loss, pairs)}

    def _step(self, h, segment_ids, state: ContextLMState):
        b, t, _ = h.shape
        if state.chunk_sum.shape[0] != b:
            raise ValueError(f"ContextLM: the state has {state.chunk_sum.shape[0]} rows, the "
                             f"input {b}")
        u = self.pool_input(h)
        valid = _valid(segment_ids, (b, t))

        def finish(carry):
            caches, total, count, _, index = carry
            c = (total / jnp.maximum(count, 1.0)[:, None])[:, None, :]
            pos = jnp.broadcast_to(index // self.chunk, (b, 1)).astype(jnp.int32)
            pred, caches = self.predict(c, pos, caches)
            zero = jnp.zeros_like(total)
            return caches, zero, jnp.zeros_like(count), pred[:, 0], index

        def one(carry, xs):
            u_t, v_t = xs
            caches, total, count, fb, index = carry
            carry = (caches, total + u_t * v_t[:, None], count + v_t, fb, index)
            carry = lax.cond((index + 1) % self.chunk == 0, finish, lambda c: c, carry)
            caches, total, count, fb, index = carry
            return (caches, total, count, fb, index + 1), fb

        carry = (state.pred_cache, state.chunk_sum, state.chunk_count, state.feedback,
                 state.index)
        carry, fb = lax.scan(one, carry, (jnp.swapaxes(u, 0, 1), jnp.swapaxes(valid, 0, 1)))
        return self.feed(h, jnp.swapaxes(fb, 0, 1)), ContextLMState(*carry), {}
