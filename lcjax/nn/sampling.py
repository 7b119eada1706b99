"""Batched sampling from a :class:`~lcjax.nn.DecoderLM` through its KV cache.

One step draws, for each row b, a token from the model's next-token logits z_b [V]:

    greedy (T = 0):  y_b = argmax_v z_b,v
    otherwise:       y_b ~ softmax(filter(z_b / T))

where ``filter`` keeps the ``top_k`` largest scores, then the smallest prefix of those
(sorted, descending) whose probability mass reaches ``top_p`` (nucleus sampling,
Holtzman et al., 2020), and sets the rest to -inf (the order of Hugging Face's
``TopKLogitsWarper`` then ``TopPLogitsWarper``).

:func:`generate` prefills a right-padded batch of prompts [B, P] (segment id 0 for real
tokens, -1 for padding, so the padded slots stay masked in the cache), then decodes
``max_new_tokens`` tokens, every row writing its step-i token at cache slot P + i with RoPE
position ``prompt_lengths[b] + i``: row b sees exactly its own prompt and its own
generated tokens, at the positions it would have alone. All under one ``jax.jit``,
with a ``lax.while_loop`` that stops early once every row has emitted a stop token.

Row b's random stream is ``fold_in(fold_in(rng, b), step)``: rows are independent and a
row's samples do not depend on the batch size, the padding or the other rows.

:func:`decode_from_caches` is the decoding half alone, for a caller that prefills the
caches itself (e.g. a prefill without a cache or padding, as a prompt-compression method
needs, with each layer's K/V captured into caches): from the next-token logits after the
prompts and the filled caches it runs the same loop :func:`generate` runs after its
prefill.

Usage::

    out = generate(model, prompts, 32, temperature=0.8, top_p=0.95, rng=jax.random.key(0),
                   prompt_lengths=lengths, stop_tokens=(eos,), return_logprobs=True)
    out.tokens     # int [B, P + 32]: prompt[:len_b] ++ generated ++ pad_id
    out.lengths    # int [B]: prompt + generated tokens, up to and including a stop token
    out.logprobs   # float32 [B, 32]: log p(generated token i | prefix), 0 after the end

    logits, caches = model(prompts, cache=model.init_cache(b, p + 31))   # any prefill
    dec = decode_from_caches(model, logits[:, -1], caches, 32, stop_tokens=(eos,))
    dec.tokens     # int [B, 32]: the generated tokens, pad_id after a stop token
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from lcjax.attention import lengths_to_segment_ids
from lcjax.nn.attention import capture_attention, update_kv_cache

if TYPE_CHECKING:
    from lcjax.nn.decoder import DecoderLM

__all__ = ["SPLIT_PREFILL", "DecodeResult", "GenerateResult", "decode_from_caches", "generate",
           "prefill", "row_keys", "sample_logits", "sampling_candidates", "split_prefill_layers"]


class GenerateResult(NamedTuple):
    """Output of :func:`generate` (N = ``max_new_tokens``).

    tokens: int [B, P + N]; row b is ``prompt[b, :prompt_lengths[b]]``, then its generated
      tokens (up to and including the first stop token), then ``pad_id``.
    lengths: int32 [B], prompt length + number of generated tokens (a stop token counts);
      ``tokens[b, lengths[b]:] == pad_id``.
    logprobs: float32 [B, N] or None (without ``return_logprobs``); ``logprobs[b, i]`` is
      log p_model(tokens[b, prompt_lengths[b] + i] | tokens[b, :prompt_lengths[b] + i]),
      the model's own log-softmax (temperature 1, no top-k/top-p filtering: what a full
      forward pass over ``tokens`` gives), and 0 for i >= lengths[b] - prompt_lengths[b].
    top_logprobs: ``(ids int32 [B, N, K], logprobs float32 [B, N, K])`` or None (without
      ``top_logprobs=K``): at step i, the K most likely tokens under the same log-softmax,
      most likely first (ids ``pad_id``, log-probs 0 after the row's end).
    """

    tokens: jax.Array
    lengths: jax.Array
    logprobs: jax.Array | None
    top_logprobs: tuple[jax.Array, jax.Array] | None = None


class DecodeResult(NamedTuple):
    """Output of :func:`decode_from_caches` (N = ``max_new_tokens``).

    tokens: int32 [B, N], row b's generated tokens (up to and including the first stop
      token), then ``pad_id``.
    lengths: int32 [B], the number of generated tokens (a stop token counts);
      ``tokens[b, lengths[b]:] == pad_id``.
    logprobs: float32 [B, N] or None (without ``return_logprobs``): log p_model of each
      generated token (temperature 1, no filtering), 0 after the row's end.
    """

    tokens: jax.Array
    lengths: jax.Array
    logprobs: jax.Array | None


def sampling_candidates(logits: jax.Array, temperature, *, top_k: int | None = None,
                        top_p: float | jax.Array | None = None):
    """Scores of the tokens that may be sampled.

    Args:
      logits: float [B, V].
      temperature: positive scalar T (may be traced).
      top_k: keep the k largest scores (static int >= 1, clipped to V), or None.
      top_p: keep the smallest prefix of the sorted candidates with probability mass
        >= top_p (scalar in (0, 1], may be traced), or None.

    Returns:
      ``(scores, ids)``: scores float32 [B, K] = z / T for the candidates, -inf for the
      ones removed by top-p; ids int32 [B, K] their token ids, or None when no filter is
      asked for (then K = V and the candidates are the vocabulary in order). The
      sampling distribution is softmax(scores) over ids.
    """
    z = logits.astype(jnp.float32) / temperature
    if top_k is None and top_p is None:
        return z, None
    k = z.shape[-1] if top_k is None else min(top_k, z.shape[-1])
    scores, ids = lax.top_k(z, k)  # sorted descending
    if top_p is not None:
        probs = jax.nn.softmax(scores, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly better tokens
        keep = (mass_before < top_p).at[:, 0].set(True)
        scores = jnp.where(keep, scores, -jnp.inf)
    return scores, ids.astype(jnp.int32)


def sample_logits(logits: jax.Array, keys: jax.Array | None, temperature=0.0, *,
                  top_k: int | None = None, top_p: float | jax.Array | None = None,
                  greedy: bool | None = None) -> jax.Array:
    """One token per row: int32 [B] from logits [B, V].

    ``keys`` holds one PRNG key per row ([B] typed keys or uint32 [B, 2]); rows sample
    independently. Greedy (argmax, ``keys`` unused) when ``greedy`` is True, or when it
    is None and ``temperature`` is 0 (then ``temperature`` must be a Python number).
    """
    if greedy is None:
        greedy = temperature == 0
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scores, ids = sampling_candidates(logits, temperature, top_k=top_k, top_p=top_p)
    choice = jax.vmap(jax.random.categorical)(keys, scores).astype(jnp.int32)
    if ids is None:
        return choice
    return jnp.take_along_axis(ids, choice[:, None], axis=-1)[:, 0]


def row_keys(rng: jax.Array, batch: int, step) -> jax.Array:
    """Key of row b at decoding step ``step``: ``fold_in(fold_in(rng, b), step)``, [batch]."""
    rows = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, jnp.arange(batch))
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(rows, step)


def _token_logprob(logits: jax.Array, tokens: jax.Array, top: int = 0):
    """log softmax(logits [B, V]) at tokens [B] -> float32 [B]; with ``top`` = K > 0 also
    the K largest log-probs and their ids (``lax.top_k``: ids int32 [B, K], float32 [B, K])."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    if not top:
        return chosen, None
    values, ids = lax.top_k(logp, top)
    return chosen, (ids.astype(jnp.int32), values)


def _assemble(prompts, prompt_lengths, generated, num_generated, pad_id):
    """Row b = prompts[b, :len_b] ++ generated[b, :num_generated_b] ++ pad: [B, P + N]."""
    b, p = prompts.shape
    n = generated.shape[1]
    j = jnp.arange(p + n)[None, :]
    start = prompt_lengths[:, None]
    from_prompt = jnp.take_along_axis(prompts, jnp.minimum(j, p - 1).repeat(b, 0), axis=1)
    gen_idx = jnp.clip(j - start, 0, max(n - 1, 0))
    from_gen = (jnp.take_along_axis(generated, gen_idx, axis=1) if n
                else jnp.zeros((b, p), prompts.dtype))
    end = start + num_generated[:, None]
    return jnp.where(j < start, from_prompt,
                     jnp.where(j < end, from_gen, jnp.asarray(pad_id, prompts.dtype)))


def _decode_loop(model, last, cache, start, rng, temperature, top_p, stop_tokens, *,
                 max_new_tokens: int, top_k, greedy: bool, use_top_p: bool, pad_id: int,
                 dtype, top_logprobs: int = 0):
    """The one decoding loop (traced): token 0 from ``last`` [B, V], then token i from the
    model's logits after feeding token i - 1 through ``cache`` at RoPE position
    ``start + i - 1`` (``start`` int [B], or None: the model's default, the cache index).
    Returns (tokens [B, N], number generated [B], logprobs [B, N], top) where ``top`` is
    ``(ids [B, N, K], logprobs [B, N, K])`` for ``top_logprobs`` = K > 0, else None."""
    b = last.shape[0]
    n = max_new_tokens
    kk = int(top_logprobs)

    def choose(logits, step):
        keys = None if greedy else row_keys(rng, b, step)
        tok = sample_logits(logits, keys, temperature, top_k=top_k,
                            top_p=top_p if use_top_p else None, greedy=greedy)
        return tok.astype(dtype)

    tok = choose(last, 0)
    out_tokens = jnp.full((b, n), pad_id, dtype).at[:, 0].set(tok)
    logprob, top = _token_logprob(last, tok, kk)
    out_logprobs = jnp.zeros((b, n), jnp.float32).at[:, 0].set(logprob)
    out_top = ((jnp.full((b, n, kk), pad_id, jnp.int32).at[:, 0].set(top[0]),
                jnp.zeros((b, n, kk), jnp.float32).at[:, 0].set(top[1])) if kk else ())
    done = jnp.isin(tok, stop_tokens)
    count = jnp.ones((b,), jnp.int32)

    def cond(carry):
        i, _, _, done, *_ = carry
        return (i < n) & ~jnp.all(done)

    def body(carry):
        # feed token i - 1 (slot index + i - 1, position start_b + i - 1), draw token i
        i, tok, cache, done, out_tokens, out_logprobs, out_top, count = carry
        positions = None if start is None else (start + i - 1)[:, None]
        logits, cache = model(tok[:, None], cache=cache, positions=positions)
        new = jnp.where(done, jnp.asarray(pad_id, dtype), choose(logits[:, 0], i))
        logprob, top = _token_logprob(logits[:, 0], new, kk)
        logprob = jnp.where(done, 0.0, logprob)
        out_tokens = lax.dynamic_update_slice_in_dim(out_tokens, new[:, None], i, axis=1)
        out_logprobs = lax.dynamic_update_slice_in_dim(out_logprobs, logprob[:, None], i, 1)
        if kk:
            ids = jnp.where(done[:, None], jnp.int32(pad_id), top[0])
            vals = jnp.where(done[:, None], 0.0, top[1])
            out_top = (lax.dynamic_update_slice_in_dim(out_top[0], ids[:, None], i, 1),
                       lax.dynamic_update_slice_in_dim(out_top[1], vals[:, None], i, 1))
        count = count + (~done).astype(jnp.int32)
        done = done | jnp.isin(new, stop_tokens)
        return i + 1, new, cache, done, out_tokens, out_logprobs, out_top, count

    carry = (jnp.int32(1), tok, cache, done, out_tokens, out_logprobs, out_top, count)
    *_, out_tokens, out_logprobs, out_top, count = lax.while_loop(cond, body, carry)
    return out_tokens, count, out_logprobs, (out_top or None)


# Variants whose method computes a prefill differently from a call over a KV cache:
# token_sparse selects tokens in a self-attention prefill only (a cached call has
# kv_len != q_len and decodes densely, as the method does).
SPLIT_PREFILL = frozenset({"token_sparse"})


def split_prefill_layers(model) -> tuple[int, ...]:
    """Layers of ``model`` whose attention variant is in :data:`SPLIT_PREFILL`."""
    return tuple(i for i, block in enumerate(model.blocks)
                 if getattr(block.attn.attention_fn, "name", None) in SPLIT_PREFILL)


def prefill(model, prompts: jax.Array, prompt_lengths: jax.Array, cache_len: int, *,
            return_inputs: bool = False):
    """The prompts' pass of :func:`generate` (traceable): (logits [B, P, V], caches of
    ``cache_len`` slots holding the prompts' K/V, padding at segment id -1).

    With a layer of :func:`split_prefill_layers` the model runs on the prompts alone, as
    in training (no cache, segment ids marking each row's padding), so those layers run
    their method (e.g. token-sparse selection per row); each layer's K/V (what its
    variant received, RoPE applied) then fills its cache, and decoding runs from it.
    Otherwise the prompts are written through the cache in one cached call.
    ``return_inputs``: also return, per layer, the ``{"q", "k", "v", "scale"}`` its
    variant received (split prefill only; None otherwise), e.g. for a method's
    statistics."""
    b, p = prompts.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    seg = lengths_to_segment_ids(prompt_lengths, p)
    cache = model.init_cache(b, cache_len)
    if not split_prefill_layers(model):
        out = model(prompts, positions=positions, cache=cache, segment_ids=seg)
        return (*out, None) if return_inputs else out
    if model.config.trsp or model.context_lm is not None:
        raise ValueError("generate: a split prefill (layers "
                         f"{split_prefill_layers(model)} use {sorted(SPLIT_PREFILL)}) needs "
                         "plain KV caches; TRSP and ContextLM keep more state")
    logits, inputs = capture_attention(model, prompts, tap="inputs", positions=positions,
                                       segment_ids=seg)
    if len(inputs) != len(cache):
        raise ValueError(f"generate: the prefill captured {len(inputs)} attention inputs for "
                         f"{len(cache)} layer caches")
    caches = tuple(update_kv_cache(c, x["k"], x["v"], seg) for c, x in zip(cache, inputs))
    return (logits, caches, inputs) if return_inputs else (logits, caches)


_STATIC = ("graphdef", "max_new_tokens", "top_k", "greedy", "use_top_p", "return_logprobs",
           "pad_id", "top_logprobs")


@functools.partial(jax.jit, static_argnames=_STATIC)
def _generate(state, prompts, prompt_lengths, rng, temperature, top_p, stop_tokens, *,
              graphdef, max_new_tokens: int, top_k, greedy: bool, use_top_p: bool,
              return_logprobs: bool, pad_id: int, top_logprobs: int = 0) -> GenerateResult:
    model = nnx.merge(graphdef, state)
    logits, cache = prefill(model, prompts, prompt_lengths, prompts.shape[1] + max_new_tokens - 1)
    last = jnp.take_along_axis(logits, (prompt_lengths - 1)[:, None, None], axis=1)[:, 0]
    out_tokens, count, out_logprobs, out_top = _decode_loop(
        model, last, cache, prompt_lengths, rng, temperature, top_p, stop_tokens,
        max_new_tokens=max_new_tokens, top_k=top_k, greedy=greedy, use_top_p=use_top_p,
        pad_id=pad_id, dtype=prompts.dtype, top_logprobs=top_logprobs)
    tokens = _assemble(prompts, prompt_lengths, out_tokens, count, pad_id)
    return GenerateResult(tokens, prompt_lengths + count,
                          out_logprobs if return_logprobs else None, out_top)


@functools.partial(jax.jit, static_argnames=_STATIC)
def _decode(state, last, caches, start, rng, temperature, top_p, stop_tokens, *, graphdef,
            max_new_tokens: int, top_k, greedy: bool, use_top_p: bool, return_logprobs: bool,
            pad_id: int, top_logprobs: int = 0) -> DecodeResult:
    model = nnx.merge(graphdef, state)
    out_tokens, count, out_logprobs, _ = _decode_loop(
        model, last, caches, start, rng, temperature, top_p, stop_tokens,
        max_new_tokens=max_new_tokens, top_k=top_k, greedy=greedy, use_top_p=use_top_p,
        pad_id=pad_id, dtype=jnp.int32, top_logprobs=top_logprobs)
    return DecodeResult(out_tokens, count, out_logprobs if return_logprobs else None)


def _check_sampling(fn: str, max_new_tokens, temperature, top_k, top_p, rng) -> bool:
    """Validate the sampling options shared by generate and decode_from_caches; returns
    whether decoding is greedy."""
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise ValueError(f"{fn}: `max_new_tokens` must be an int >= 0, got "
                         f"{max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"{fn}: `temperature` must be >= 0, got {temperature}")
    if top_k is not None and (not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise ValueError(f"{fn}: `top_k` must be an int >= 1 or None, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"{fn}: `top_p` must lie in (0, 1] or be None, got {top_p}")
    greedy = temperature == 0
    if not greedy and rng is None:
        raise ValueError(f"{fn}: `rng` (a PRNG key) is required when temperature > 0, "
                         f"got temperature={temperature} and rng=None")
    return greedy


def _check_prompt_lengths(prompt_lengths, b: int, p: int) -> jax.Array:
    if prompt_lengths is None:
        return jnp.full((b,), p, jnp.int32)
    lengths = jnp.asarray(prompt_lengths)
    if lengths.shape != (b,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"generate: `prompt_lengths` must be int [batch={b}], got "
                         f"{lengths.dtype} {lengths.shape}")
    if not isinstance(lengths, jax.core.Tracer):
        lo, hi = int(np.min(lengths)), int(np.max(lengths))
        if lo < 1 or hi > p:
            raise ValueError(f"generate: `prompt_lengths` must lie in [1, P={p}], got "
                             f"min {lo}, max {hi}")
    return lengths.astype(jnp.int32)


def generate(
    model: DecoderLM,
    prompts: jax.Array,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_tokens=(),
    rng: jax.Array | None = None,
    prompt_lengths: jax.Array | None = None,
    return_logprobs: bool = False,
    pad_id: int = 0,
    top_logprobs: int = 0,
) -> GenerateResult:
    """Sample ``max_new_tokens`` tokens after each prompt of a ragged batch (one ``jax.jit``).

    Args:
      model: a :class:`~lcjax.nn.DecoderLM` (any attention variant that takes segment ids
        or masks).
      prompts: int [B, P], right-padded: row b's prompt is ``prompts[b, :prompt_lengths[b]]``
        (what follows is ignored).
      max_new_tokens: N >= 0, the number of tokens to generate per row (fewer when a row
        emits a stop token).
      temperature: T >= 0; 0 is greedy decoding (argmax; ``rng`` may be None, top-k/top-p
        are moot). Otherwise tokens are drawn from softmax(z / T) after filtering.
      top_k: int >= 1 or None: sample among the k most likely tokens only.
      top_p: float in (0, 1] or None: nucleus sampling (applied after top-k); 1 = off.
      stop_tokens: token ids that end a row; the stop token is kept and counted in
        ``lengths``, everything after it is ``pad_id``.
      rng: a JAX PRNG key (``jax.random.key`` or ``PRNGKey``), required when T > 0.
      prompt_lengths: int [B] in [1, P]; default: every row has length P.
      return_logprobs: also return the generated tokens' log-probabilities under the model.
      pad_id: token written after each row's end (default 0).
      top_logprobs: K >= 0; K > 0 also returns, per step, the K most likely tokens and their
        log-probs under the model (what OpenAI's ``logprobs`` field reports).

    Returns:
      :class:`GenerateResult` ``(tokens [B, P + N], lengths [B], logprobs [B, N] | None,
      top_logprobs ([B, N, K] ids, [B, N, K] log-probs) | None)``.

    The KV cache holds P + N - 1 slots (the last token is never fed back). Greedy decoding
    of a row is the same whatever the other rows and the padding; so is sampling with a
    given ``rng``, since row b uses the keys ``fold_in(fold_in(rng, b), step)``.
    """
    prompts = jnp.asarray(prompts)
    if prompts.ndim != 2 or not jnp.issubdtype(prompts.dtype, jnp.integer) or not prompts.size:
        raise ValueError(f"generate: `prompts` must be a non-empty int [batch, len] array, got "
                         f"{prompts.dtype} {prompts.shape}")
    b, p = prompts.shape
    greedy = _check_sampling("generate", max_new_tokens, temperature, top_k, top_p, rng)
    stops = jnp.asarray(stop_tokens, jnp.int32).reshape(-1)
    lengths = _check_prompt_lengths(prompt_lengths, b, p)
    if not isinstance(top_logprobs, (int, np.integer)) or isinstance(top_logprobs, bool) \
            or top_logprobs < 0:
        raise ValueError(f"generate: `top_logprobs` must be an int >= 0, got {top_logprobs!r}")
    top_logprobs = int(top_logprobs)
    if top_logprobs and top_logprobs > model.config.vocab_size:
        raise ValueError(f"generate: `top_logprobs` ({top_logprobs}) exceeds the vocabulary "
                         f"({model.config.vocab_size} tokens)")
    if max_new_tokens == 0:
        empty = jnp.zeros((b, 0), prompts.dtype)
        top = ((jnp.zeros((b, 0, top_logprobs), jnp.int32),
                jnp.zeros((b, 0, top_logprobs), jnp.float32)) if top_logprobs else None)
        return GenerateResult(_assemble(prompts, lengths, empty, jnp.zeros_like(lengths), pad_id),
                              lengths, jnp.zeros((b, 0), jnp.float32) if return_logprobs else None,
                              top)
    graphdef, state = nnx.split(model)
    return _generate(
        state, prompts, lengths, None if greedy else rng, jnp.float32(temperature),
        jnp.float32(1.0 if top_p is None else top_p), stops,
        graphdef=graphdef, max_new_tokens=int(max_new_tokens),
        top_k=None if top_k is None else int(top_k), greedy=greedy,
        use_top_p=top_p is not None and top_p < 1, return_logprobs=return_logprobs,
        pad_id=int(pad_id), top_logprobs=top_logprobs,
    )


def decode_from_caches(
    model: DecoderLM,
    logits: jax.Array,
    caches,
    max_new_tokens: int,
    *,
    positions: jax.Array | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_tokens=(),
    rng: jax.Array | None = None,
    return_logprobs: bool = False,
    pad_id: int = 0,
) -> DecodeResult:
    """Decode ``max_new_tokens`` tokens through caches the caller has filled (one
    ``jax.jit``): the loop :func:`generate` runs after its own prefill.

    Token 0 of row b is drawn from ``logits[b]``; token i >= 1 from the model's logits
    after feeding token i - 1 through the caches (one model call per step, N - 1 in all,
    stopping early once every row has emitted a stop token), at RoPE position
    ``positions[b] + i - 1``. With the same ``rng``, row b draws with the keys
    ``fold_in(fold_in(rng, b), i)``, as in :func:`generate`, so a prefill equal to
    :func:`generate`'s gives the same tokens.

    Args:
      model: a :class:`~lcjax.nn.DecoderLM` (any attention that decodes with a cache).
      logits: float [B, V], the next-token logits after each row's prompt (the prefill's
        logits at the row's last prompt position).
      caches: the model's cache (as from :meth:`DecoderLM.init_cache`: one entry per layer),
        holding the prompts' K/V, with room for N - 1 more slots.
      max_new_tokens: N >= 0.
      positions: int [B], the RoPE position of token 0 (row b's prompt length), or None:
        the model's default, the cache index (right when every prompt fills the cache up
        to its index, i.e. no padding).
      temperature, top_k, top_p, stop_tokens, rng, return_logprobs, pad_id: as in
        :func:`generate`.

    Returns:
      :class:`DecodeResult` ``(tokens [B, N], lengths [B], logprobs [B, N] | None)``.
    """
    logits = jnp.asarray(logits)
    if logits.ndim != 2 or not jnp.issubdtype(logits.dtype, jnp.floating) or not logits.size:
        raise ValueError(f"decode_from_caches: `logits` must be a non-empty float "
                         f"[batch, vocab] array, got {logits.dtype} {logits.shape}")
    b = logits.shape[0]
    greedy = _check_sampling("decode_from_caches", max_new_tokens, temperature, top_k, top_p,
                             rng)
    if positions is not None:
        positions = jnp.asarray(positions)
        if positions.shape != (b,) or not jnp.issubdtype(positions.dtype, jnp.integer):
            raise ValueError(f"decode_from_caches: `positions` must be int [batch={b}] or "
                             f"None, got {positions.dtype} {positions.shape}")
        positions = positions.astype(jnp.int32)
    if max_new_tokens == 0:
        return DecodeResult(jnp.zeros((b, 0), jnp.int32), jnp.zeros((b,), jnp.int32),
                            jnp.zeros((b, 0), jnp.float32) if return_logprobs else None)
    graphdef, state = nnx.split(model)
    return _decode(
        state, logits, caches, positions, None if greedy else rng, jnp.float32(temperature),
        jnp.float32(1.0 if top_p is None else top_p),
        jnp.asarray(stop_tokens, jnp.int32).reshape(-1),
        graphdef=graphdef, max_new_tokens=int(max_new_tokens),
        top_k=None if top_k is None else int(top_k), greedy=greedy,
        use_top_p=top_p is not None and top_p < 1, return_logprobs=return_logprobs,
        pad_id=int(pad_id),
    )
