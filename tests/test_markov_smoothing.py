"""Markov-chain sampler, in-context smoothing estimators, the Bayes-optimal loss and the
analytically-set disentangled transformer (issue 18, item 1).

References: hand computations (worked in the comments), slow pure-Python loops written
from the definitions in ``lcjax.analysis.smoothing``'s docstring, the Polya-urn closed form
of the Dirichlet-Markov marginal, and the Dirichlet moments.
"""

from __future__ import annotations

import itertools
import math

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.analysis import smoothing as sm
from lcjax.data.markov import MarkovSource, context_code, sample_chains
from lcjax.nn.disentangled import DisentangledConfig, DisentangledTransformer, build

# ----------------------------------------------------------------------------- references


def _ref_counts(x, t, m, vocab):
    """N_t^m(v) by a loop over observations j in [m, t] (contexts compared as tuples)."""
    c = [0] * vocab
    if t < m - 1:
        return c
    ctx = tuple(x[t - m + 1:t + 1])
    for j in range(m, t + 1):
        if tuple(x[j - m:j]) == ctx:
            c[x[j]] += 1
    return c


def _ref_ml(x, order, vocab):
    out = []
    for t in range(len(x)):
        c = _ref_counts(x, t, order, vocab)
        n = sum(c)
        out.append([ci / n for ci in c] if n else [1 / vocab] * vocab)
    return np.array(out)


def _ref_additive(x, order, vocab, alpha):
    out = []
    for t in range(len(x)):
        c = _ref_counts(x, t, order, vocab)
        out.append([(ci + alpha) / (sum(c) + vocab * alpha) for ci in c])
    return np.array(out)


def _ref_jm(x, order, vocab, lambdas):
    out = []
    for t in range(len(x)):
        p = [1 / vocab] * vocab
        for m in range(order + 1):
            c = _ref_counts(x, t, m, vocab)
            n = sum(c)
            if n:
                p = [lambdas[m] * ci / n + (1 - lambdas[m]) * pi for ci, pi in zip(c, p)]
        out.append(p)
    return np.array(out)


def _ref_soft(x, order, vocab, beta, alpha):
    out = []
    for t in range(len(x)):
        num = [alpha * math.exp(beta * order)] * vocab
        for j in range(order, t + 1):
            o = sum(1 for i in range(1, order + 1)
                    if t + 1 - i >= 0 and x[j - i] == x[t + 1 - i])
            num[x[j]] += math.exp(beta * o)
        den = sum(num)
        out.append([v / den for v in num] if den > 0 else [1 / vocab] * vocab)
    return np.array(out)


def _polya_prob(x, order, vocab, alpha):
    """Closed-form prior probability of a sequence: uniform first k tokens, then per context
    the Dirichlet-multinomial  Gamma(Va)/Gamma(Va + N(s)) prod_v Gamma(a + N(s,v))/Gamma(a)."""
    counts = {}
    for i in range(order, len(x)):
        s = tuple(x[i - order:i])
        counts.setdefault(s, [0] * vocab)[x[i]] += 1
    logp = -min(order, len(x)) * math.log(vocab)
    for c in counts.values():
        logp += math.lgamma(vocab * alpha) - math.lgamma(vocab * alpha + sum(c))
        logp += sum(math.lgamma(alpha + ci) - math.lgamma(alpha) for ci in c)
    return math.exp(logp)


# ----------------------------------------------------------------------------- sampler


def test_sampler_dirichlet_moments():
    v, alpha, n = 3, 0.5, 3000
    _, tables = sample_chains(np.random.default_rng(0), n, 2, order=1, vocab=v, alpha=alpha)
    assert tables.shape == (n, v, v)
    np.testing.assert_allclose(tables.sum(-1), 1.0, atol=1e-12)
    rows = tables.reshape(-1, v)  # n * V independent Dirichlet(alpha) rows
    big_n = rows.shape[0]
    mean, var = 1 / v, (1 / v) * (1 - 1 / v) / (v * alpha + 1)  # Dirichlet moments
    cov = -(1 / v**2) / (v * alpha + 1)
    m = rows.mean(0)
    np.testing.assert_array_less(np.abs(m - mean), 5 * math.sqrt(var / big_n))
    d = rows - m
    s2 = (d**2).mean(0)
    se_var = np.sqrt(((d**4).mean(0) - s2**2) / big_n)
    np.testing.assert_array_less(np.abs(s2 - var), 5 * se_var)
    c01 = d[:, 0] * d[:, 1]
    assert abs(c01.mean() - cov) < 5 * c01.std() / math.sqrt(big_n)


def test_sampler_transitions_follow_tables():
    k, v, n, length = 2, 3, 400, 120
    tokens, tables = sample_chains(7, n, length, order=k, vocab=v, alpha=1.0)
    assert tokens.shape == (n, length) and tokens.dtype == np.int32
    codes = context_code(np.stack([tokens[:, i - k:i] for i in range(k, length)], 1), v)
    probs = np.take_along_axis(tables, codes[..., None], axis=1)  # [n, L-k, V]
    onehot = np.eye(v)[tokens[:, k:]]
    # martingale differences 1[x_i = v] - P(v | s_i): per (context, token) sums are ~N(0, var)
    for s in range(v**k):
        sel = codes == s
        resid = (onehot[sel] - probs[sel]).sum(0)
        sd = np.sqrt((probs[sel] * (1 - probs[sel])).sum(0))
        np.testing.assert_array_less(np.abs(resid), 5 * sd + 1e-9)
    # the first k tokens are uniform
    first = np.bincount(tokens[:, :k].ravel(), minlength=v)
    sd = math.sqrt(n * k * (1 / v) * (1 - 1 / v))
    np.testing.assert_array_less(np.abs(first - n * k / v), 5 * sd)


def test_sampler_python_and_vectorised_walks_agree(monkeypatch):
    import lcjax.data.markov as markov

    for k in (0, 1, 3):
        small = sample_chains(5, 3, 40, order=k, vocab=3, alpha=0.3)[0]  # Python walk
        monkeypatch.setattr(markov, "_PYTHON_WALK_MAX_N", 0)
        np.testing.assert_array_equal(sample_chains(5, 3, 40, order=k, vocab=3, alpha=0.3)[0],
                                      small)
        monkeypatch.undo()


def test_sampler_bos_and_source():
    plain, t1 = sample_chains(3, 4, 10, order=2, vocab=3, alpha=0.5)
    with_bos, t2 = sample_chains(3, 4, 10, order=2, vocab=3, alpha=0.5, bos=True)
    assert with_bos.shape == (4, 11) and (with_bos[:, 0] == 3).all()
    np.testing.assert_array_equal(with_bos[:, 1:], plain)
    np.testing.assert_array_equal(t1, t2)

    src = MarkovSource(50, 16, order=2, vocab=3, alpha=0.5, bos=True, seed=5)
    row = src[7]
    np.testing.assert_array_equal(row["inputs"], src[7]["inputs"])  # deterministic
    assert row["inputs"].shape == row["targets"].shape == (16,) and row["inputs"][0] == 3
    np.testing.assert_array_equal(row["inputs"][1:], row["targets"][:-1])
    # targets x_0, x_1 are the uniform initial tokens: no transition, no loss
    np.testing.assert_array_equal(row["loss_mask"], np.arange(16) >= 2)
    chain, table = sample_chains(np.random.default_rng([5, 7]), 1, 16, order=2, vocab=3,
                                 alpha=0.5, bos=True)
    np.testing.assert_array_equal(row["targets"], chain[0, 1:])
    np.testing.assert_allclose(row["table"], table[0], rtol=1e-6)
    batch = next(iter(grain.MapDataset.source(src).shuffle(seed=0).batch(4)))
    assert batch["inputs"].shape == (4, 16) and batch["table"].shape == (4, 9, 3)


# ----------------------------------------------------------------------------- estimators

X1 = [0, 1, 0, 0, 1]  # V = 2, k = 1; observations j=1..4: 0->1, 1->0, 0->0, 0->1


def test_estimators_by_hand_order1():
    x = jnp.array(X1)
    # ML: row t's context is x_t; t=0: no j; t=1 (ctx 1): j=1 has ctx 0 -> none;
    # t=2 (ctx 0): j=1 -> 1; t=3: j=1 -> 1, j=3 -> 0; t=4 (ctx 1): j=2 -> 0
    ml = [[.5, .5], [.5, .5], [0, 1], [.5, .5], [1, 0]]
    np.testing.assert_allclose(sm.ml_kgram(x, order=1, vocab=2), ml, atol=1e-6)
    # additive alpha=.5: t=2 (0,1)->(.5,1.5)/2; t=3 (1,1)->(1.5,1.5)/3; t=4 (1,0)->(1.5,.5)/2
    add = [[.5, .5], [.5, .5], [.25, .75], [.5, .5], [.75, .25]]
    np.testing.assert_allclose(sm.additive(x, order=1, vocab=2, alpha=0.5), add, atol=1e-6)
    # JM (lambda_0, lambda_1) = (.5, .8). Order 0 = unigram of x_0..x_t mixed with 1/2:
    # t=0 (1,0)->[.75,.25]; t=1 (1,1)->[.5,.5]; t=2 (2,1)->.5[2/3,1/3]+.25=[7/12,5/12];
    # t=3 (3,1)->[5/8,3/8]; t=4 (3,2)->[11/20,9/20]. Order 1 (t>=2): .8 ML + .2 p0:
    # t=2 [7/60,53/60]; t=3 .8[.5,.5]+.2[5/8,3/8]=[.525,.475]; t=4 .8[1,0]+.2p0=[.91,.09]
    jm = [[.75, .25], [.5, .5], [7 / 60, 53 / 60], [.525, .475], [.91, .09]]
    np.testing.assert_allclose(sm.jelinek_mercer(x, order=1, vocab=2, lambdas=[.5, .8]), jm,
                               atol=1e-6)
    # soft matching, beta = ln 2 (weight 2 per matching token), alpha = 0:
    # t=1: j=1 (o=0, next 1) -> [0,1]; t=2 (x_2=0): j=1 w2 ->1, j=2 w1 ->0 -> [1/3,2/3];
    # t=3: j=1 w2 ->1, j=2 w1 ->0, j=3 w2 ->0 -> [3/5,2/5];
    # t=4 (x_4=1): j=1 w1 ->1, j=2 w2 ->0, j=3 w1 ->0, j=4 w1 ->1 -> [3/5,2/5]
    soft = [[.5, .5], [0, 1], [1 / 3, 2 / 3], [.6, .4], [.6, .4]]
    np.testing.assert_allclose(sm.soft_matching(x, order=1, vocab=2, beta=math.log(2)), soft,
                               atol=1e-6)
    # with alpha = .5 each token gets .5 * e^{beta k} = 1 more: t=1 [1,2]/3; t=4 [4,3]/7
    soft_a = np.asarray(sm.soft_matching(x, order=1, vocab=2, beta=math.log(2), alpha=0.5))
    np.testing.assert_allclose(soft_a[[0, 1, 4]], [[.5, .5], [1 / 3, 2 / 3], [4 / 7, 3 / 7]],
                               atol=1e-6)


def test_soft_matching_by_hand_order2():
    # V = 3, k = 2, x = 0 1 2 2 1, beta = ln 2. Row t=4, query (x_3, x_4) = (2, 1):
    # j=2 ctx (0,1): x_1=1=x_4, x_0=0!=x_3 -> o=1, w=2, next x_2=2
    # j=3 ctx (1,2): no, no -> w=1, next x_3=2;  j=4 ctx (2,2): x_3=2!=1, x_2=2=x_3 -> w=2,
    # next x_4=1  =>  [0, 2, 3] / 5
    p = sm.soft_matching(jnp.array([0, 1, 2, 2, 1]), order=2, vocab=3, beta=math.log(2))
    np.testing.assert_allclose(p[4], [0, .4, .6], atol=1e-6)
    np.testing.assert_allclose(p[:2], np.full((2, 3), 1 / 3), atol=1e-6)  # no observation
    np.testing.assert_array_equal(
        sm.overlap(jnp.array([0, 1, 2, 2, 1]), order=2)[4, 2:], [1, 0, 1])


@pytest.fixture(scope="module")
def chains():
    return sample_chains(11, 3, 24, order=2, vocab=3, alpha=0.4)[0]


@pytest.mark.parametrize("order", [1, 2])
def test_estimators_match_reference(chains, order):
    x = chains
    cases = [
        (sm.ml_kgram, _ref_ml, {}),
        (sm.additive, _ref_additive, {"alpha": 0.3}),
        (sm.jelinek_mercer, _ref_jm, {"lambdas": [0.2, 0.6, 0.9][:order + 1]}),
        (sm.soft_matching, _ref_soft, {"beta": 1.3, "alpha": 0.2}),
        (sm.soft_matching, _ref_soft, {"beta": -0.7, "alpha": 0.0}),
    ]
    for fn, ref, kw in cases:
        got = np.asarray(fn(jnp.asarray(x), order=order, vocab=3, **kw))
        assert got.shape == (3, 24, 3)
        want = np.stack([ref(list(r), order, 3, *kw.values()) for r in x])
        np.testing.assert_allclose(got, want, atol=2e-6, err_msg=fn.__name__)


def test_estimators_jit_with_traced_params(chains):
    x = jnp.asarray(chains)
    f = jax.jit(sm.soft_matching, static_argnames=("order", "vocab"))
    np.testing.assert_allclose(f(x, order=2, vocab=3, beta=jnp.float32(1.1), alpha=0.3),
                               sm.soft_matching(x, order=2, vocab=3, beta=1.1, alpha=0.3),
                               atol=1e-6)
    g = jax.jit(sm.jelinek_mercer, static_argnames=("order", "vocab"))
    np.testing.assert_allclose(g(x, order=2, vocab=3, lambdas=jnp.array([.1, .5, .7])),
                               _ref_jm_batch(chains, [.1, .5, .7]), atol=2e-6)


def test_soft_matching_gradient_matches_finite_differences(chains):
    # the experiment fits (beta, alpha) by L-BFGS-B on jax gradients
    x = jnp.asarray(chains)
    f = lambda b, a: jnp.log(sm.soft_matching(x, order=2, vocab=3, beta=b, alpha=a)).mean()
    gb, ga = jax.grad(f, argnums=(0, 1))(1.0, 0.3)
    e = 1e-2
    assert abs(gb - (f(1 + e, 0.3) - f(1 - e, 0.3)) / (2 * e)) < 2e-3 * max(1, abs(gb))
    assert abs(ga - (f(1.0, 0.3 + e) - f(1.0, 0.3 - e)) / (2 * e)) < 2e-3 * max(1, abs(ga))


def _ref_jm_batch(x, lambdas):
    return np.stack([_ref_jm(list(r), 2, 3, lambdas) for r in x])


# ----------------------------------------------------------------------------- Bayes loss


@pytest.mark.parametrize("order,vocab,alpha,length", [(1, 2, 0.5, 7), (2, 3, 0.7, 6)])
def test_bayes_optimal_loss_exact(order, vocab, alpha, length):
    exact = sm.bayes_optimal_loss(length, order=order, vocab=vocab, alpha=alpha)
    # reference: E[-log p_add(x_{t+1})] over all sequences x_0..x_{t+1} with their closed-
    # form Polya probability (the additive rule never enters the weights)
    for t in range(length - 1):
        total, mass = 0.0, 0.0
        for x in itertools.product(range(vocab), repeat=t + 2):
            p = _polya_prob(x, order, vocab, alpha)
            q = _ref_additive(list(x[:t + 1]), order, vocab, alpha)[t][x[t + 1]]
            total, mass = total - p * math.log(q), mass + p
        assert abs(mass - 1) < 1e-12
        assert abs(exact[t] - total) < 1e-10, (t, exact[t], total)
    np.testing.assert_allclose(exact[:order], math.log(vocab), atol=1e-12)
    assert (np.diff(exact[order - 1:]) < 0).all()  # more evidence, lower loss


def test_additive_is_the_posterior_predictive():
    # P(x_{<=t}, v) / P(x_{<=t}) under the Polya marginal equals the additive row t
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = list(rng.integers(0, 3, size=8))
        pred = _ref_additive(x, 2, 3, 0.6)[-1]
        ratio = [_polya_prob(x + [v], 2, 3, 0.6) / _polya_prob(x, 2, 3, 0.6) for v in range(3)]
        np.testing.assert_allclose(pred, ratio, rtol=1e-10)


def test_bayes_monte_carlo_agrees_and_other_alpha_is_worse():
    exact = sm.bayes_optimal_loss(7, order=1, vocab=3, alpha=0.5)
    mean, se = sm.bayes_loss_monte_carlo(np.random.default_rng(1), 7, 4000, order=1, vocab=3,
                                         alpha=0.5)
    np.testing.assert_array_less(np.abs(mean - exact)[1:], 4.5 * se[1:])
    assert abs(mean[0] - math.log(3)) < 1e-6
    # the additive rule with another alpha has a higher exact expected loss under the prior
    tokens, _ = sample_chains(2, 3000, 7, order=1, vocab=3, alpha=0.5)
    loss = lambda a: float(sm.cross_entropy(sm.additive(jnp.asarray(tokens), order=1, vocab=3,
                                                        alpha=a), tokens)[:, 1:].mean())
    assert loss(0.5) < loss(2.0) and loss(0.5) < loss(0.1)


# ----------------------------------------------------------------------------- transformer


@pytest.mark.parametrize("order", [1, 2])
def test_disentangled_build_reproduces_estimators(order):
    tokens, _ = sample_chains(np.random.default_rng(order), 3, 30, order=order, vocab=3,
                              alpha=0.5, bos=True)
    x = jnp.asarray(tokens)
    cases = [("soft_matching", {"beta": 0.8}, sm.soft_matching),
             ("soft_matching", {"beta": 2.5, "alpha": 0.4}, sm.soft_matching),
             ("additive", {"alpha": 0.5}, sm.additive),
             ("additive", {"alpha": 0.05}, sm.additive)]
    for name, kw, est in cases:
        model = build(name, order=order, vocab=3, max_len=32, **kw)
        q = np.exp(np.asarray(model(x)))
        want = np.asarray(est(x[:, 1:], order=order, vocab=3, **kw))
        np.testing.assert_allclose(q[:, 1:], want, atol=1e-5, err_msg=f"{name} {kw}")
        np.testing.assert_allclose(q[:, 0], 1 / 3, atol=1e-6)  # BOS row: uniform
    prev, match = model.attention(x)
    assert prev.shape == (3, order, 31, 31) and match.shape == (3, 31, 31)
    # previous-token head i at position p >= i attends to p - i
    for i in range(order):
        np.testing.assert_allclose(np.diagonal(prev[:, i], offset=-(i + 1), axis1=1, axis2=2),
                                   1.0, atol=1e-6)


def test_attention_fit_recovers_analytic_beta_and_alpha():
    # the experiment's read-out of beta and the BOS pseudo-count, on a model whose matching
    # head is known: soft matching at beta = 2 with pseudo-count alpha = 0.5
    from experiments.induction_smoothing.experiment import attention_fit

    model = build("soft_matching", order=2, vocab=3, max_len=32, beta=2.0, alpha=0.5)
    tokens, _ = sample_chains(4, 3, 31, order=2, vocab=3, alpha=1.0, bos=True)
    fit = attention_fit(model, tokens, 2)
    assert abs(fit["beta_hat"] - 2.0) < 1e-5 and fit["r2_within_row"] > 1 - 1e-9
    assert abs(fit["alpha_hat"] - 0.5) < 1e-5
    assert [h["top_offset"] for h in fit["prev_heads"]] == [1, 2]
    np.testing.assert_allclose([h["share_at_top_offset"] for h in fit["prev_heads"]], 1.0,
                               atol=1e-6)
    np.testing.assert_allclose([h["bos_weight"] for h in fit["prev_heads"]], 0.0, atol=1e-6)
    assert fit["mass_on_non_observations"] < 1e-12


def test_disentangled_trains_through_the_loop():
    from lcjax.train import TrainConfig, train

    cfg = DisentangledConfig(order=1, vocab=3, max_len=16, init_scale=0.1)
    src = MarkovSource(64, 16, order=1, vocab=3, alpha=0.5, bos=True)
    ds = grain.MapDataset.source(src).repeat().batch(8)
    first = DisentangledTransformer(cfg, rngs=nnx.Rngs(0)).params()  # train's seed-0 init
    res = train(cfg, TrainConfig(steps=3, warmup_steps=0, lr=1e-2, eval_batches=0,
                                 progress=False, log_every=1), dataset=ds,
                model_fn=lambda c, rngs: DisentangledTransformer(c, rngs=rngs))
    assert len(res.losses) == 3 and np.isfinite(res.losses).all()
    assert abs(res.losses[0] - math.log(3)) < 0.1  # near-uniform start
    after = res.model.params()
    assert all(float(jnp.abs(after[k] - first[k]).max()) > 1e-4 for k in first)


# ----------------------------------------------------------------------------- errors


def test_value_errors():
    x = jnp.array([0, 1, 2, 1])
    with pytest.raises(ValueError, match="order"):
        sm.additive(x, order=-1, vocab=3, alpha=1.0)
    with pytest.raises(ValueError, match="vocab"):
        sm.ml_kgram(x, order=1, vocab=1)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        sm.ml_kgram(x, order=1, vocab=2)
    with pytest.raises(ValueError, match="integers"):
        sm.ml_kgram(x.astype(jnp.float32), order=1, vocab=3)
    with pytest.raises(ValueError, match="lambdas"):
        sm.jelinek_mercer(x, order=2, vocab=3, lambdas=[0.5, 0.5])
    with pytest.raises(ValueError, match="alpha"):
        sm.additive(x, order=1, vocab=3, alpha=0.0)
    with pytest.raises(ValueError, match="max_sequences"):
        sm.bayes_optimal_loss(40, order=1, vocab=3, alpha=1.0)
    with pytest.raises(ValueError, match="order"):
        sample_chains(0, 2, 10, order=-1, vocab=3, alpha=1.0)
    with pytest.raises(ValueError, match="length > order"):
        sample_chains(0, 2, 2, order=2, vocab=3, alpha=1.0)
    with pytest.raises(ValueError, match="alpha"):
        sample_chains(0, 2, 10, order=1, vocab=3, alpha=-1.0)
    with pytest.raises(ValueError, match="estimator"):
        build("kneser_ney", order=1, vocab=3)
    with pytest.raises(ValueError, match="beta"):
        build("soft_matching", order=1, vocab=3)
    with pytest.raises(ValueError, match="order"):
        build("additive", order=0, vocab=3, alpha=1.0)
    model = build("additive", order=1, vocab=3, max_len=8, alpha=1.0)
    with pytest.raises(ValueError, match="BOS"):
        model(jnp.array([[3, 0, 4]]))
    with pytest.raises(ValueError, match="max_len"):
        model(jnp.zeros((1, 9), jnp.int32))
