"""AutoSelect (lcjax.selection): Plackett–Luce against a pure-Python reference and sampling
frequencies, the KL target and policy cross-entropy's optimum, the LM reward against a direct
forward pass, baselines, and option errors."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from scipy import stats

from lcjax.data.tokenizer import BOS, encode
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.selection import (
    SelectionPolicy,
    answer_log_likelihood,
    best_of_k_selection,
    demonstration_reward,
    gumbel_top_k,
    kl_target_weights,
    make_lookup_episode,
    make_offset_episode,
    nearest_neighbour_selection,
    ordered_subsets,
    pl_expectation,
    pl_log_prob,
    policy_cross_entropy,
    policy_log_prob,
    policy_select,
)

_batched_log_prob = jax.jit(jax.vmap(pl_log_prob, (None, 0)))


def _reference_pl_prob(scores, order):
    """Slow pure-Python Plackett–Luce probability of an ordered selection."""
    remaining, p = list(range(len(scores))), 1.0
    for item in order:
        p *= math.exp(scores[item]) / sum(math.exp(scores[j]) for j in remaining)
        remaining.remove(item)
    return p


@pytest.mark.parametrize("n,k", [(5, 5), (5, 3)])
def test_pl_probabilities_sum_to_one_and_match_reference(n, k):
    scores = np.random.default_rng(n * 10 + k).normal(size=n).astype(np.float32) * 1.5
    orders = ordered_subsets(n, k)
    assert orders.shape == (math.perm(n, k), k)
    assert len({tuple(o) for o in orders}) == len(orders)
    probs = np.exp(np.asarray(_batched_log_prob(jnp.asarray(scores), jnp.asarray(orders))))
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-5)
    ref = np.array([_reference_pl_prob(scores.tolist(), o.tolist()) for o in orders])
    np.testing.assert_allclose(probs, ref, rtol=1e-5, atol=1e-8)


def test_gumbel_top_k_frequencies_match_pl_chi_square():
    n, k, num = 4, 3, 40_000
    scores = jnp.asarray(np.random.default_rng(1).normal(size=n).astype(np.float32))
    sample = jax.jit(jax.vmap(gumbel_top_k, (0, None, None)), static_argnums=2)
    draws = np.asarray(sample(jax.random.split(jax.random.key(0), num), scores, k))
    orders = ordered_subsets(n, k)
    index = {tuple(o): i for i, o in enumerate(orders)}
    counts = np.bincount([index[tuple(d)] for d in draws], minlength=len(orders))
    probs = np.exp(np.asarray(_batched_log_prob(scores, jnp.asarray(orders)), np.float64))
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-5)
    expected = num * probs / probs.sum()   # float64, so the totals agree as scipy requires
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    # and it is not uniform sampling: the same counts reject the uniform law
    assert stats.chisquare(counts).pvalue < 1e-6


def test_pl_expectation_exact_and_monte_carlo():
    n, k = 4, 2
    scores = jnp.asarray(np.random.default_rng(2).normal(size=n).astype(np.float32))
    values = jnp.asarray(np.random.default_rng(3).normal(size=(n, n)).astype(np.float32))
    fn = lambda o: values[o[0], o[1]]
    ref = sum(_reference_pl_prob(np.asarray(scores).tolist(), o) * float(values[o])
              for o in itertools.permutations(range(n), k))
    exact_fn = jax.jit(lambda s: pl_expectation(fn, s, k))
    np.testing.assert_allclose(exact_fn(scores), ref, rtol=1e-5)
    mc = jax.jit(lambda s: pl_expectation(fn, s, k, key=jax.random.key(4), num_samples=20_000))
    assert abs(float(mc(scores)) - ref) < 0.05
    # gradient of the exact form against central finite differences (one vmapped compile)
    eps = 1e-2
    shifts = jnp.concatenate([jnp.eye(n), -jnp.eye(n)]) * eps
    g, shifted = jax.jit(lambda s: (jax.grad(exact_fn)(s), jax.vmap(exact_fn)(s + shifts)))(
        scores)
    fd = (shifted[:n] - shifted[n:]) / (2 * eps)
    np.testing.assert_allclose(g, fd, atol=2e-3)


def test_value_errors():
    with pytest.raises(ValueError, match="k > n"):
        ordered_subsets(3, 4)
    with pytest.raises(ValueError, match="k > n"):
        pl_log_prob(jnp.zeros(3), jnp.arange(4))
    with pytest.raises(ValueError, match="k > n"):
        gumbel_top_k(jax.random.key(0), jnp.zeros(3), 4)
    with pytest.raises(ValueError, match="float vector"):
        pl_log_prob(jnp.zeros((2, 3)), jnp.arange(2))
    for beta in (0.0, -1.0, float("nan"), float("inf"), "x"):
        with pytest.raises(ValueError, match="beta"):
            kl_target_weights(jnp.ones(3), beta)
    with pytest.raises(ValueError, match="log_ref"):
        kl_target_weights(jnp.ones(3), 1.0, log_ref=jnp.ones(2))
    policy = SelectionPolicy(6, 8, max_steps=4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="k > n"):
        policy_select(policy, jnp.ones(6), jnp.ones((3, 6)), 4)
    with pytest.raises(ValueError, match="query"):
        policy_select(policy, jnp.ones(5), jnp.ones((3, 6)), 2)
    with pytest.raises(ValueError, match="k > n"):
        nearest_neighbour_selection(jnp.ones(6), jnp.ones((3, 6)), 4)


def test_policy_is_a_distribution_and_masks_chosen():
    n, k, f = 5, 3, 6
    rng = np.random.default_rng(5)
    query = jnp.asarray(rng.normal(size=f).astype(np.float32))
    cands = jnp.asarray(rng.normal(size=(n, f)).astype(np.float32))
    policy = SelectionPolicy(f, 8, max_steps=n, rngs=nnx.Rngs(1))
    orders = jnp.asarray(ordered_subsets(n, k))
    chosen = jnp.array([True, False, True, False, False])
    other_set = jnp.array([False, True, True, False, False])

    @nnx.jit
    def run(policy):
        logps = nnx.vmap(policy_log_prob, in_axes=(None, None, None, 0))(policy, query, cands,
                                                                          orders)
        return (policy(query, cands, chosen, 2), policy(query, cands, other_set, 2), logps,
                policy_select(policy, query, cands, n, key=jax.random.key(0)))

    logits, other, logps, picks = (np.asarray(a) for a in run(policy))
    assert np.all(np.isneginf(logits[[0, 2]])) and np.all(np.isfinite(logits[[1, 3, 4]]))
    np.testing.assert_allclose(np.exp(logps).sum(), 1.0, rtol=1e-5)
    # the policy is context dependent (not a fixed PL): its step-2 logits change with the set
    assert abs(float(logits[4] - logits[3]) - float(other[4] - other[3])) > 1e-4
    assert sorted(picks.tolist()) == list(range(n))


def test_cross_entropy_optimum_with_small_beta_picks_best_sequence():
    """Toy reward over ordered pairs of 4 candidates (order matters: R(a, b) != R(b, a)); the
    enumerated candidate set with β → 0; Adam on −Σ q log π puts π on argmax R."""
    n, k, f = 4, 2, 5
    rng = np.random.default_rng(7)
    query = jnp.asarray(rng.normal(size=f).astype(np.float32))
    cands = jnp.asarray(rng.normal(size=(n, f)).astype(np.float32))
    table = rng.normal(size=(n, n)).astype(np.float32)
    orders = ordered_subsets(n, k)
    rewards = jnp.asarray(table[orders[:, 0], orders[:, 1]])
    best = int(np.argmax(rewards))
    weights = kl_target_weights(rewards, 1e-3)
    assert int(np.argmax(weights)) == best and float(weights[best]) > 0.999
    # large β: q → the uniform reference
    np.testing.assert_allclose(kl_target_weights(rewards, 1e6), 1 / len(orders), rtol=1e-4)

    policy = SelectionPolicy(f, 16, max_steps=k, rngs=nnx.Rngs(3))
    opt = nnx.Optimizer(policy, optax.adam(0.05), wrt=nnx.Param)
    orders_j = jnp.asarray(orders)

    @nnx.jit
    def step(policy, opt):
        loss, grads = nnx.value_and_grad(policy_cross_entropy)(policy, query, cands, orders_j,
                                                               weights)
        opt.update(policy, grads)
        return loss

    first = float(step(policy, opt))
    for _ in range(199):
        last = step(policy, opt)
    assert float(last) < 0.1 < first
    greedy, p_best = nnx.jit(lambda p: (policy_select(p, query, cands, k), jnp.exp(
        policy_log_prob(p, query, cands, orders_j[best]))))(policy)
    assert np.asarray(greedy).tolist() == orders[best].tolist()
    assert float(p_best) > 0.9


@pytest.fixture(scope="module")
def tiny_lm():
    cfg = DecoderConfig(vocab_size=259, d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                        head_dim=16, mlp_hidden=64, max_len=128)
    return DecoderLM(cfg, rngs=nnx.Rngs(0))


def test_reward_equals_hand_computed_log_likelihood(tiny_lm):
    ep = make_offset_episode(np.random.default_rng(0), 5)
    reward = demonstration_reward(tiny_lm, ep.demonstrations, ep.query, ep.answer)
    orders = np.array([[0, 1, 2], [2, 1, 0], [4, 3, 0]])
    got = np.asarray(reward(orders))
    rows = []
    for o in orders:
        prompt = "".join(ep.demonstrations[j] for j in o) + ep.query
        rows.append(np.concatenate([[BOS], encode(prompt + ep.answer)]).astype(np.int32))
    start = 1 + len(prompt.encode())                 # index of the first answer token (same
    tokens = np.stack(rows)                          # for all rows: demos have one length)
    logp = np.asarray(nnx.jit(lambda m, t: jax.nn.log_softmax(m(t), axis=-1))(
        tiny_lm, jnp.asarray(tokens[:, :-1])))
    for value, row, lp in zip(got, tokens, logp):
        hand = sum(float(lp[t - 1, row[t]]) for t in range(start, len(row)))
        np.testing.assert_allclose(value, hand, rtol=1e-5, atol=1e-5)
    assert len(set(np.round(got, 5))) == 3           # order changes the reward
    with pytest.raises(ValueError, match="k > n"):
        reward(np.arange(6)[None])
    order, value = best_of_k_selection(reward, jax.random.key(1), 5, 3, 3)  # same [3, T] shape
    assert value == pytest.approx(float(reward(order)), rel=1e-5)


def test_answer_log_likelihood_padded_rows_equal_unpadded_forward_passes(tiny_lm):
    """Prompts and answers of different lengths share one right-padded batch; each row's
    value equals the same sum from that row's own forward pass, without any padding."""
    rng = np.random.default_rng(11)
    lengths = [(1, 1), (9, 2), (4, 6)]           # (prompt, answer) tokens
    prompts = [np.concatenate([[BOS], rng.integers(256, size=p - 1)]).astype(np.int32)
               for p, _ in lengths]
    answers = [rng.integers(258, size=a).astype(np.int32) for _, a in lengths]  # EOS too
    got = np.asarray(answer_log_likelihood(tiny_lm, prompts, answers))
    forward = nnx.jit(lambda m, t: jax.nn.log_softmax(m(t), axis=-1))
    for value, p, a in zip(got, prompts, answers):
        row = np.concatenate([p, a])
        lp = np.asarray(forward(tiny_lm, jnp.asarray(row[None, :-1])))[0]
        hand = sum(float(lp[len(p) - 1 + i, tok]) for i, tok in enumerate(a))
        np.testing.assert_allclose(value, hand, rtol=1e-5, atol=1e-5)
    assert len(set(np.round(got, 4))) == len(lengths)
    with pytest.raises(ValueError, match="prompt"):
        answer_log_likelihood(tiny_lm, [np.zeros(0, np.int32)], [np.ones(2, np.int32)])
    with pytest.raises(ValueError, match="answer"):
        answer_log_likelihood(tiny_lm, [np.ones(2, np.int32)], [np.zeros(0, np.int32)])
    with pytest.raises(ValueError, match="as many prompts"):
        answer_log_likelihood(tiny_lm, prompts, answers[:2])


def test_nearest_neighbour_and_episode():
    rng = np.random.default_rng(9)
    query, cands = rng.normal(size=4), rng.normal(size=(6, 4))
    sims = cands @ query / np.linalg.norm(cands, axis=1) / np.linalg.norm(query)
    got = np.asarray(nearest_neighbour_selection(jnp.asarray(query), jnp.asarray(cands), 3))
    assert got.tolist() == np.argsort(sims)[-3:].tolist()   # most similar last
    ep = make_offset_episode(np.random.default_rng(1), 8)
    xq = int(ep.query[2])
    offsets = {(int(d[6]) - int(d[2])) % 10 for d, ok in zip(ep.demonstrations, ep.consistent)
               if ok}
    assert len(offsets) == 1 and int(ep.answer[0]) == (xq + offsets.pop()) % 10
    assert ep.features.shape == (8, 30) and ep.consistent.any()
    lk = make_lookup_episode(np.random.default_rng(2), 12, distractor_fraction=0.4)
    table = {}
    for d, ok in zip(lk.demonstrations, lk.consistent):
        if ok:
            assert table.setdefault(d[2], d[6]) == d[6]     # one digit per key when consistent
    assert lk.answer[0] == table[lk.query[2]]
    assert all(d[6] != table.get(d[2]) for d, ok in zip(lk.demonstrations, lk.consistent)
               if not ok)
    np.testing.assert_array_equal(lk.features[:, :10].argmax(1),
                                  [ord(d[2]) - ord("a") for d in lk.demonstrations])
