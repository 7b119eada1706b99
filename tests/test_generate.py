"""Tests for lcjax.nn.generate: batched greedy/temperature/top-k/top-p sampling through the
KV cache, ragged (right-padded) prompts, stop tokens and log-probabilities; and
lcjax.nn.sampling.decode_from_caches, its decoding loop after a prefill of one's own.

Every reference is a full forward pass without a cache (``forward``): the greedy loop, the
top-k / nucleus sets, the first-token distribution and the log-probabilities.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from test_nn import forward, make, step

from lcjax.attention import lengths_to_segment_ids
from lcjax.nn import DecoderConfig, generate
from lcjax.nn.sampling import decode_from_caches

V = 17


def tiny(**overrides) -> DecoderConfig:
    base = dict(vocab_size=V, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=8, mlp_hidden=48, max_len=16)
    return DecoderConfig(**{**base, **overrides})


def tokens_of(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, shape, dtype=np.int32))


def greedy_reference(model, prompt: np.ndarray, steps: int) -> np.ndarray:
    """Greedy decoding with a full forward pass per token (no cache): [1, L] -> [1, L+steps]."""
    seq = np.asarray(prompt)
    for _ in range(steps):
        nxt = np.argmax(forward(model, jnp.asarray(seq))[:, -1], axis=-1)
        seq = np.concatenate([seq, nxt[:, None]], axis=1)
    return seq


def next_token_logits(model, tokens, prompt_lengths, n) -> np.ndarray:
    """Full-forward logits that predicted generated token i of row b: [B, n, V]."""
    logits = forward(model, jnp.asarray(tokens))
    idx = np.asarray(prompt_lengths)[:, None] - 1 + np.arange(n)[None, :]
    return np.take_along_axis(logits, idx[:, :, None], axis=1)


def generated(out, prompt_lengths, n) -> np.ndarray:
    """The N generated slots of each row: [B, n] (pad after the row's end)."""
    idx = np.asarray(prompt_lengths)[:, None] + np.arange(n)[None, :]
    return np.take_along_axis(np.asarray(out.tokens), idx, axis=1)


def num_generated(out, prompt_lengths) -> np.ndarray:
    return np.asarray(out.lengths) - np.asarray(prompt_lengths)


def pooled_chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of Pearson's chi-square of counts against probs, bins with expected count
    below 5 pooled into one (zero-probability bins must have zero counts)."""
    n = counts.sum()
    assert np.all(counts[probs == 0] == 0), "sampled a token of probability 0"
    expected = n * probs
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep]).pvalue)


# ----------------------------------------------------------------------------
# Greedy
# ----------------------------------------------------------------------------
def test_temperature_zero_equals_greedy_full_forward_loop():
    model = make(tiny(), seed=3)
    prompt = tokens_of(4, (2, 4))
    out = generate(model, prompt, 5)
    assert out.tokens.shape == (2, 9) and out.logprobs is None
    np.testing.assert_array_equal(out.lengths, [9, 9])
    for b in range(2):
        want = greedy_reference(model, np.asarray(prompt[b:b + 1]), 5)
        np.testing.assert_array_equal(np.asarray(out.tokens[b:b + 1]), want)


VARIANTS = [("softmax", {}), ("blockwise", {"block_q": 2, "block_kv": 4}), ("jax", {})]


@pytest.mark.parametrize("attention,options", VARIANTS, ids=[v for v, _ in VARIANTS])
def test_ragged_batch_rows_equal_rows_decoded_alone(attention, options):
    model = make(tiny(attention=attention, attention_options=options), seed=1)
    lengths = np.array([5, 2, 3])
    prompts = tokens_of(5, (3, 5))  # what follows each row's length is random garbage
    n = 4
    out = generate(model, prompts, n, prompt_lengths=jnp.asarray(lengths), pad_id=V - 1,
                   return_logprobs=True)
    assert out.tokens.shape == (3, 5 + n)
    np.testing.assert_array_equal(out.lengths, lengths + n)
    for b, length in enumerate(lengths):
        alone = generate(model, prompts[b:b + 1, :length], n, return_logprobs=True)
        np.testing.assert_array_equal(out.tokens[b, :length + n], alone.tokens[0])
        assert np.all(np.asarray(out.tokens[b, length + n:]) == V - 1)
        np.testing.assert_allclose(out.logprobs[b], alone.logprobs[0], atol=1e-5)
        # and the greedy tokens are those of the full-forward loop
        want = greedy_reference(model, np.asarray(prompts[b:b + 1, :length]), n)
        np.testing.assert_array_equal(np.asarray(alone.tokens), want)


def test_sampled_row_does_not_depend_on_the_other_rows_or_the_padding():
    model = make(tiny(), seed=2)
    row = tokens_of(6, (1, 3))
    kw = dict(temperature=1.5, rng=jax.random.key(7), top_k=10, return_logprobs=True)
    alone = generate(model, row, 6, **kw)
    batch = jnp.concatenate([jnp.concatenate([row, tokens_of(8, (1, 3))], 1),
                             tokens_of(9, (1, 6))], 0)  # row 0 padded by 3 garbage tokens
    out = generate(model, batch, 6, prompt_lengths=jnp.array([3, 6]), **kw)
    np.testing.assert_array_equal(out.tokens[0, :9], alone.tokens[0])
    np.testing.assert_allclose(out.logprobs[0], alone.logprobs[0], atol=1e-5)
    # another key gives other samples (the key is used)
    other = generate(model, row, 6, **{**kw, "rng": jax.random.key(8)})
    assert np.any(np.asarray(other.tokens) != np.asarray(alone.tokens))


# ----------------------------------------------------------------------------
# Filtering
# ----------------------------------------------------------------------------
def test_top_k_never_emits_a_token_outside_the_top_k():
    model = make(tiny(), seed=4)
    b, n, k = 48, 5, 3
    lengths = np.random.default_rng(0).integers(1, 5, b)
    out = generate(model, tokens_of(10, (b, 4)), n, temperature=3.0, top_k=k,
                   rng=jax.random.key(1), prompt_lengths=jnp.asarray(lengths))
    logits = next_token_logits(model, out.tokens, lengths, n)  # [B, n, V]
    gen = generated(out, lengths, n)
    # rank of each generated token among the logits that predicted it (0 = argmax)
    rank = (logits > np.take_along_axis(logits, gen[..., None], axis=-1)).sum(-1)
    assert rank.max() < k
    assert set(np.unique(rank)) == set(range(k))  # hot temperature: all of the top k occur


def nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Boolean [.., V]: the smallest set of most likely tokens with mass >= top_p."""
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(probs, order, axis=-1)
    before = np.cumsum(sorted_p, axis=-1) - sorted_p
    keep = np.zeros_like(probs, bool)
    np.put_along_axis(keep, order, before < top_p, axis=-1)
    return keep


def softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_top_p_never_emits_a_token_outside_the_nucleus():
    model = make(tiny(), seed=5)
    b, n, t, top_p = 48, 5, 1.5, 0.6
    lengths = np.random.default_rng(1).integers(1, 5, b)
    out = generate(model, tokens_of(11, (b, 4)), n, temperature=t, top_p=top_p,
                   rng=jax.random.key(2), prompt_lengths=jnp.asarray(lengths))
    keep = nucleus(softmax(next_token_logits(model, out.tokens, lengths, n) / t), top_p)
    gen = generated(out, lengths, n)
    assert np.all(np.take_along_axis(keep, gen[..., None], axis=-1))
    assert keep.sum(-1).min() < V - 3  # the nucleus does exclude tokens
    assert len(np.unique(gen)) > 3  # and sampling is not collapsed to greedy


# ----------------------------------------------------------------------------
# The sampling distribution (chi-square)
# ----------------------------------------------------------------------------
CASES = [(0.8, None, None), (1.3, 6, 0.8)]


@pytest.mark.parametrize("temperature,top_k,top_p", CASES, ids=["T", "T-topk-topp"])
def test_first_token_distribution_matches_softmax_of_logits_over_t(temperature, top_k, top_p):
    model = make(tiny(), seed=6)
    rows, length = 4000, 4
    prompt = tokens_of(12, (1, length))
    # every row: the same prompt, then 2 garbage padding tokens of its own
    prompts = jnp.concatenate([jnp.repeat(prompt, rows, 0), tokens_of(13, (rows, 2))], 1)
    out = generate(model, prompts, 1, temperature=temperature, top_k=top_k, top_p=top_p,
                   rng=jax.random.key(3), prompt_lengths=jnp.full((rows,), length))
    first = np.asarray(out.tokens[:, length])
    counts = np.bincount(first, minlength=V)
    z = forward(model, prompt)[0, -1]  # [V], the full forward pass
    probs = softmax(z / temperature)
    if top_k is not None:
        probs = np.where(z >= np.sort(z)[-top_k], probs, 0.0)
    if top_p is not None:
        probs = np.where(nucleus(probs / probs.sum(), top_p), probs, 0.0)
    probs = probs / probs.sum()
    assert pooled_chi_square(counts, probs) > 1e-3
    # power: the untempered, unfiltered distribution is rejected
    assert pooled_chi_square(counts, softmax(z)) < 1e-6
    assert (probs > 0).sum() >= 4


# ----------------------------------------------------------------------------
# Stop tokens and log-probabilities
# ----------------------------------------------------------------------------
def test_stop_tokens_truncate_the_same_samples_and_logprobs_match_full_forward():
    model = make(tiny(), seed=7)
    b, n = 6, 7
    lengths = np.array([4, 1, 3, 2, 4, 3])
    prompts = tokens_of(14, (b, 4))
    kw = dict(temperature=1.2, top_k=12, rng=jax.random.key(4),
              prompt_lengths=jnp.asarray(lengths), return_logprobs=True, pad_id=V - 1)
    free = generate(model, prompts, n, **kw)
    free_gen = generated(free, lengths, n)
    np.testing.assert_array_equal(free.lengths, lengths + n)
    stop = int(free_gen[0, 2])  # row 0 stops at step <= 2
    out = generate(model, prompts, n, stop_tokens=(stop, V + 5), **kw)
    gen, count = generated(out, lengths, n), num_generated(out, lengths)
    for r in range(b):
        hits = np.flatnonzero(free_gen[r] == stop)
        want = hits[0] + 1 if hits.size else n
        assert count[r] == want
        np.testing.assert_array_equal(gen[r, :want], free_gen[r, :want])
        assert np.all(np.asarray(out.tokens[r, lengths[r] + want:]) == V - 1)
        np.testing.assert_array_equal(out.logprobs[r, :want], free.logprobs[r, :want])
        assert np.all(np.asarray(out.logprobs[r, want:]) == 0)
    assert count.min() < n  # some row did stop early
    # the log-probs are those of a full forward pass over the result
    for res in (free, out):
        logp = jax.nn.log_softmax(next_token_logits(model, res.tokens, lengths, n), axis=-1)
        want = np.take_along_axis(np.asarray(logp), generated(res, lengths, n)[..., None],
                                  axis=-1)[..., 0]
        live = np.arange(n)[None, :] < num_generated(res, lengths)[:, None]
        np.testing.assert_allclose(np.asarray(res.logprobs)[live], want[live], atol=1e-5)
        assert np.all(want[live] < 0)


def test_greedy_logprobs_and_zero_new_tokens():
    model = make(tiny(), seed=8)
    prompts, lengths = tokens_of(15, (2, 3)), np.array([3, 1])
    out = generate(model, prompts, 0, prompt_lengths=jnp.asarray(lengths), pad_id=V - 1,
                   return_logprobs=True)
    assert out.tokens.shape == (2, 3) and out.logprobs.shape == (2, 0)
    np.testing.assert_array_equal(out.lengths, lengths)
    np.testing.assert_array_equal(out.tokens[0], prompts[0])
    np.testing.assert_array_equal(out.tokens[1], [int(prompts[1, 0]), V - 1, V - 1])
    one = generate(model, prompts, 1, prompt_lengths=jnp.asarray(lengths), return_logprobs=True)
    z = next_token_logits(model, one.tokens, lengths, 1)[:, 0]
    np.testing.assert_array_equal(generated(one, lengths, 1)[:, 0], z.argmax(-1))
    np.testing.assert_allclose(one.logprobs[:, 0], np.asarray(jax.nn.log_softmax(z).max(-1)),
                               atol=1e-5)


# ----------------------------------------------------------------------------
# decode_from_caches: the decoding loop after one's own prefill
# ----------------------------------------------------------------------------
def _own_prefill(model, prompts, lengths, n):
    """Ragged rows through the model's cache (positions and segment ids passed): the
    logits after each row's prompt [B, V] and the caches."""
    b, p = prompts.shape
    pos = jnp.broadcast_to(jnp.arange(p), (b, p))
    logits, caches = step(model, prompts, model.init_cache(b, p + n - 1), positions=pos,
                          segment_ids=lengths_to_segment_ids(jnp.asarray(lengths), p))
    last = np.take_along_axis(np.asarray(logits), np.asarray(lengths)[:, None, None] - 1, 1)
    return last[:, 0], caches


def test_decode_from_caches_continues_a_prefill_as_generate_does():
    """After a prefill of our own (ragged rows), greedy decoding equals generate's
    continuation, and each token is the argmax of a full forward pass over the prompt and
    the tokens before it; sampling with the same key gives generate's samples and
    log-probs; a stop token ends each row after its first occurrence. Without padding,
    the default positions (the cache index) give the same tokens as explicit ones."""
    model = make(tiny(), seed=11)
    lengths, n = np.array([5, 2, 4]), 5
    prompts = tokens_of(21, (3, 5))
    last, caches = _own_prefill(model, prompts, lengths, n)
    never = (V + 5,)  # one stop-token shape for every call: one compile per mode
    dec = decode_from_caches(model, last, caches, n, positions=jnp.asarray(lengths),
                             stop_tokens=never)
    assert dec.tokens.shape == (3, n) and dec.logprobs is None
    np.testing.assert_array_equal(dec.lengths, [n] * 3)
    out = generate(model, prompts, n, prompt_lengths=jnp.asarray(lengths), stop_tokens=never)
    np.testing.assert_array_equal(dec.tokens, generated(out, lengths, n))
    z = next_token_logits(model, out.tokens, lengths, n)  # full forward, no cache
    np.testing.assert_array_equal(np.asarray(dec.tokens), z.argmax(-1))
    stop = (int(dec.tokens[0, 1]),)  # row 0 stops at step <= 1
    cut = decode_from_caches(model, last, caches, n, positions=jnp.asarray(lengths),
                             stop_tokens=stop)
    for r in range(3):
        hits = np.flatnonzero(np.asarray(dec.tokens[r]) == stop[0])
        end = hits[0] + 1 if hits.size else n
        assert int(cut.lengths[r]) == end
        np.testing.assert_array_equal(cut.tokens[r, :end], dec.tokens[r, :end])
        assert np.all(np.asarray(cut.tokens[r, end:]) == 0)  # pad_id
    assert int(cut.lengths[0]) <= 2
    kw = dict(temperature=1.3, top_k=9, rng=jax.random.key(5), return_logprobs=True,
              stop_tokens=never)
    sampled = decode_from_caches(model, last, caches, n, positions=jnp.asarray(lengths), **kw)
    ref = generate(model, prompts, n, prompt_lengths=jnp.asarray(lengths), **kw)
    np.testing.assert_array_equal(sampled.tokens, generated(ref, lengths, n))
    np.testing.assert_allclose(sampled.logprobs, ref.logprobs, atol=1e-5)
    assert np.any(np.asarray(sampled.tokens) != np.asarray(dec.tokens))  # it did sample
    full = np.full(3, 5)
    last, caches = _own_prefill(model, prompts, full, n)
    plain = decode_from_caches(model, last, caches, n, stop_tokens=never)
    want = decode_from_caches(model, last, caches, n, positions=jnp.asarray(full),
                              stop_tokens=never)
    np.testing.assert_array_equal(plain.tokens, want.tokens)


def test_decode_from_caches_value_errors():
    model = make(tiny())
    last, caches = _own_prefill(model, tokens_of(0, (3, 5)), np.full(3, 5), 5)
    cases = [
        (dict(logits=jnp.ones((3, V), jnp.int32)), "logits"),
        (dict(logits=last[0]), "logits"),
        (dict(positions=jnp.array([3])), "positions"),
        (dict(positions=jnp.array([3.0, 3.0, 3.0])), "positions"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(temperature=1.0), "rng"),
        (dict(top_p=0.0, temperature=1.0, rng=jax.random.key(0)), "top_p"),
    ]
    for kw, match in cases:
        kw = {"logits": last, "max_new_tokens": 2, **kw}
        with pytest.raises(ValueError, match=f"decode_from_caches: `{match}`"):
            decode_from_caches(model, kw.pop("logits"), caches, kw.pop("max_new_tokens"), **kw)
    empty = decode_from_caches(model, last, caches, 0, return_logprobs=True)
    assert empty.tokens.shape == (3, 0) and empty.logprobs.shape == (3, 0)
    np.testing.assert_array_equal(empty.lengths, [0, 0, 0])


# ----------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------
def test_value_errors():
    model = make(tiny())
    prompts = tokens_of(0, (2, 3))
    key = jax.random.key(0)
    cases = [
        (dict(prompts=jnp.ones((2, 3), jnp.float32)), "prompts"),
        (dict(prompts=prompts[0]), "prompts"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(temperature=-0.5, rng=key), "temperature"),
        (dict(temperature=1.0), "rng"),
        (dict(top_k=0, temperature=1.0, rng=key), "top_k"),
        (dict(top_p=0.0, temperature=1.0, rng=key), "top_p"),
        (dict(top_p=1.5, temperature=1.0, rng=key), "top_p"),
        (dict(prompt_lengths=jnp.array([3])), "prompt_lengths"),
        (dict(prompt_lengths=jnp.array([0, 2])), r"prompt_lengths.*\[1, P=3\]"),
        (dict(prompt_lengths=jnp.array([4, 2])), r"prompt_lengths.*\[1, P=3\]"),
        (dict(prompt_lengths=jnp.array([1.0, 2.0])), "prompt_lengths"),
    ]
    for kw, match in cases:
        kw = {"prompts": prompts, "max_new_tokens": 2, **kw}
        with pytest.raises(ValueError, match=match):
            generate(model, kw.pop("prompts"), kw.pop("max_new_tokens"), **kw)
