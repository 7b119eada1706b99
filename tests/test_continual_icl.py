"""In-context continual learning with linear attention (lcjax/attention/linear.py,
lcjax/analysis/icl_theory.py): the predictor against a numpy computation of its formula,
every closed form against Monte Carlo through the predictor (within the 99% CI), exact zero
interference for a shared task, and task order changing the masked error only.

Monte Carlo sizes: 2048 prompts x 8 queries; one compilation per prompt shape (three)."""

import jax
import numpy as np
import pytest

from lcjax.analysis import icl_theory as th
from lcjax.attention import icl_predict, linear_attention

NUM_PROMPTS, NUM_QUERIES = 2048, 8
BLOCKS = (6, 4, 8)          # T = 3 tasks, N = 18 pairs
D = 4
NOISE = (0.1, 0.3, 0.2)


def _tasks(seed=0, d=D, t=3, scale=0.8):
    return np.random.default_rng(seed).normal(size=(t, d)) * scale


def _gamma(seed=1, d=D):
    """A non-symmetric Γ (catches Γ / Γᵀ mix-ups)."""
    return 0.8 * np.eye(d) + 0.25 * np.random.default_rng(seed).normal(size=(d, d))


def _mc(seed, blocks, query, **kw):
    return th.monte_carlo_terms(jax.random.key(seed), blocks, query, num_prompts=NUM_PROMPTS,
                                num_queries=NUM_QUERIES, **kw)


def _assert_covers(cf: th.ErrorTerms, mc: dict, what: str):
    for name in th.TERMS:
        est, value = mc[name], getattr(cf, name)
        assert est.covers(value), f"{what} {name}: closed form {value:.5f}, MC {est}"


# ----------------------------------------------------------------------------
# The predictor
# ----------------------------------------------------------------------------
def test_icl_predict_matches_numpy_masked_and_unmasked():
    rng = np.random.default_rng(3)
    xs, ys, xq = rng.normal(size=(2, 9, 3)), rng.normal(size=(2, 9)), rng.normal(size=(2, 5, 3))
    g = _gamma(d=3)
    vis = np.array([1, 3, 4, 9, 0])
    got_all = np.asarray(icl_predict(xs, ys, xq, g))
    got_mask = np.asarray(icl_predict(xs, ys, xq, g, visible=vis))
    h_all = np.einsum("bn,bnd->bd", ys, xs) / 9
    want_all = np.einsum("bqd,de,be->bq", xq, g, h_all)
    np.testing.assert_allclose(got_all, want_all, rtol=1e-5, atol=1e-6)
    for j, p in enumerate(vis):
        h = np.einsum("bn,bnd->bd", ys[:, :p], xs[:, :p]) / max(p, 1)
        np.testing.assert_allclose(got_mask[:, j], np.einsum("bd,de,be->b", xq[:, j], g, h),
                                   rtol=1e-5, atol=1e-6)
    assert (got_mask[:, 4] == 0).all()  # sees no pair
    per_row = np.stack([vis, vis[::-1]])                       # visible [B, Q]
    got_rows = np.asarray(icl_predict(xs, ys, xq, g, visible=per_row))
    np.testing.assert_allclose(got_rows[0], got_mask[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_rows[1], np.asarray(icl_predict(
        xs, ys, xq, g, visible=vis[::-1].copy()))[1], rtol=1e-5, atol=1e-6)


def test_causal_linear_attention_is_the_masked_predictor_per_position():
    """causal=True (the scan path) at query i equals the count-normalised prefix sum."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(1, 11, 2, 3)).astype(np.float32) for _ in range(3))
    out = np.asarray(linear_attention(q, k, v, causal=True, scale=1.0, chunk=4))
    scores = np.einsum("bthd,bshd->bhts", q, k) * np.tril(np.ones((11, 11)))
    want = np.einsum("bhts,bshv->bthv", scores, v) / np.arange(1, 12)[None, :, None, None]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    raw = np.asarray(linear_attention(q, k, v, causal=True, scale=1.0, normalize="none"))
    np.testing.assert_allclose(raw, want * np.arange(1, 12)[None, :, None, None], rtol=1e-4,
                               atol=1e-4)


def test_causal_scan_with_more_queries_than_keys():
    """Top-left causal with T = 7 queries over S = 4 keys: query i sees keys j <= min(i, 3),
    so rows i >= 3 divide by 4 keys, not by i + 1 (numpy reference; chunk 3 does not divide)."""
    rng = np.random.default_rng(5)
    q = rng.normal(size=(1, 7, 2, 3)).astype(np.float32)
    k, v = (rng.normal(size=(1, 4, 2, 3)).astype(np.float32) for _ in range(2))
    visible = np.arange(4)[None, :] <= np.arange(7)[:, None]             # [T, S]
    scores = np.einsum("bthd,bshd->bhts", q, k) * visible
    want = np.einsum("bhts,bshv->bthv", scores, v) / visible.sum(1)[None, :, None, None]
    out = np.asarray(linear_attention(q, k, v, causal=True, scale=1.0, chunk=3))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_bad_arguments_raise_value_error():
    xs, ys, xq = np.ones((1, 4, 2)), np.ones((1, 4)), np.ones((1, 3, 2))
    with pytest.raises(ValueError, match="gamma"):
        icl_predict(xs, ys, xq, np.eye(3))
    with pytest.raises(ValueError, match="visible"):
        icl_predict(xs, ys, xq, 1.0, visible=np.array([1, 2]))
    with pytest.raises(ValueError, match="xq"):
        icl_predict(xs, ys, np.ones((1, 3, 5)), 1.0)
    with pytest.raises(ValueError, match="normalize"):
        linear_attention(np.ones((1, 2, 1, 2)), np.ones((1, 2, 1, 2)), np.ones((1, 2, 1, 2)),
                         normalize="softmax")
    with pytest.raises(ValueError, match="query"):
        th.error_terms([2, 3], 2, gamma=1.0, noise_var=0.1, d=2)
    with pytest.raises(ValueError, match="counts"):
        th.error_terms([0, 0], 0, gamma=1.0, noise_var=0.1, d=2)
    with pytest.raises(ValueError, match="noise_var"):
        th.error_terms([2, 3], 0, gamma=1.0, noise_var=[0.1, 0.2, 0.3], d=2)
    with pytest.raises(ValueError, match="position"):
        th.prefix_counts([2, 3], 6)


# ----------------------------------------------------------------------------
# Closed forms against Monte Carlo
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("d,n,noise", [(4, 8, 0.1), (2, 5, 0.5)])
def test_lsa_error_matches_monte_carlo(d, n, noise):
    """Single task, Γ = I and Γ = γ*I; γ* is the minimum of the closed form."""
    w = np.zeros((1, d))
    w[0, :2] = [1.0, -0.5]
    s = float(np.sum(w * w))
    for gamma in (1.0, None):
        cf = th.lsa_error(d, n, s, noise, gamma=gamma)
        g = th.optimal_gamma(d, [n], 0, noise_var=noise, w_norm2=s) if gamma is None else gamma
        mc = _mc(7, (n,), 0, gamma=g, noise_var=noise, tasks=w)
        assert mc["total"].covers(cf), (d, n, noise, gamma, cf, mc["total"])
        assert mc["interference"] == (0.0, 0.0)  # one task: the relabelled prompt is itself
    # the hand formula (γ = 1): ‖w‖²(d + 1)/n + σ²(1 + d/n)
    assert th.lsa_error(d, n, s, noise, gamma=1.0) == pytest.approx(
        s * (d + 1) / n + noise * (1 + d / n), rel=1e-12)
    g = th.optimal_gamma(d, [n], 0, noise_var=noise, w_norm2=s)
    assert g == pytest.approx(n * s / (s * (n + 1) + d * (s + noise)), rel=1e-12)
    best = th.lsa_error(d, n, s, noise)
    assert best < min(th.lsa_error(d, n, s, noise, gamma=g * f) for f in (0.9, 1.1))


@pytest.mark.parametrize("visible,query", [(None, 0), (None, 1), (10, 1), (10, 0), (5, 0)])
def test_conditional_terms_match_monte_carlo(visible, query):
    """Given task vectors, non-symmetric Γ: every term, unmasked and masked prefixes."""
    tasks, g = _tasks(), _gamma()
    counts = th.prefix_counts(BLOCKS, visible)
    cf = th.error_terms(counts, query, gamma=g, noise_var=NOISE, tasks=tasks)
    mc = _mc(11 + query, BLOCKS, query, gamma=g, noise_var=NOISE, tasks=tasks, visible=visible)
    _assert_covers(cf, mc, f"visible={visible} query={query}")
    assert cf.total == pytest.approx(sum(cf[:4]), rel=1e-12)


@pytest.mark.parametrize("rho", [0.0, 0.6])
def test_expected_terms_match_monte_carlo(rho):
    """Averaged over the Gaussian task model (tasks drawn per prompt), γ = γ*."""
    kw = dict(noise_var=NOISE, w_norm2=1.5, rho=rho)
    g = th.optimal_gamma(D, BLOCKS, 1, **kw)
    kw["d"] = D
    cf = th.error_terms(BLOCKS, 1, gamma=g, **kw)
    mc = _mc(21, BLOCKS, 1, gamma=g, **kw)
    _assert_covers(cf, mc, f"rho={rho}")
    assert cf.interference > 0  # tasks differ: the other blocks hurt the query task


def test_forgetting_matches_monte_carlo():
    tasks, g = _tasks(), _gamma()
    for task in (0, 1):
        cf = th.forgetting(BLOCKS, task, gamma=g, noise_var=NOISE, tasks=tasks)
        mc = th.monte_carlo_forgetting(jax.random.key(31 + task), BLOCKS, task, gamma=g,
                                       noise_var=NOISE, tasks=tasks, num_prompts=NUM_PROMPTS,
                                       num_queries=NUM_QUERIES)
        assert mc.covers(cf), (task, cf, mc)
        assert abs(cf) > 2 * mc.half_width  # a real effect, not 0 within noise
    assert th.forgetting(BLOCKS, 2, gamma=g, noise_var=NOISE, tasks=tasks) == 0.0  # last task


# ----------------------------------------------------------------------------
# Shared task, task order
# ----------------------------------------------------------------------------
def test_interference_is_exactly_zero_for_a_shared_task():
    w = _tasks(5)[0]
    shared = np.stack([w, w, w])
    for visible in (None, 7, 13):
        for q in range(3):
            cf = th.error_terms(th.prefix_counts(BLOCKS, visible), q, gamma=_gamma(),
                                noise_var=NOISE, tasks=shared)
            assert cf.interference == pytest.approx(0.0, abs=1e-13)
    assert th.error_terms(BLOCKS, 1, gamma=0.7, noise_var=NOISE, d=D, rho=1.0).interference \
        == 0.0
    mc = _mc(41, BLOCKS, 1, gamma=_gamma(), noise_var=NOISE, tasks=shared)
    # relabelling with w_q changes nothing: zero up to float32 rounding of the simulation
    assert abs(mc["interference"].mean) < 1e-6 and mc["interference"].half_width < 1e-6


def test_task_order_changes_masked_error_not_unmasked():
    tasks, g = _tasks(), _gamma()
    blocks, noise = np.array(BLOCKS), np.array(NOISE)
    runs = {}
    for order in ((0, 1, 2), (2, 1, 0), (1, 0, 2)):
        o = list(order)
        for masked in (True, False):
            res = th.continual_errors(blocks[o], gamma=g, noise_var=noise[o], tasks=tasks[o],
                                      masked=masked)
            # per original task id, error right after its block
            after = np.empty(3)
            after[o] = [e.total for e in res["after"]]
            runs[order, masked] = after
    for order in ((2, 1, 0), (1, 0, 2)):
        np.testing.assert_allclose(runs[order, False], runs[(0, 1, 2), False], rtol=1e-12)
        assert np.abs(runs[order, True] - runs[(0, 1, 2), True]).max() > 0.05
    # the predictor itself: permuting the blocks leaves the unmasked prediction unchanged
    # and changes the masked one (query right after the task-1 block)
    rng = np.random.default_rng(6)
    owner = np.repeat(np.arange(3), BLOCKS)
    xs = rng.normal(size=(1, owner.size, D))
    ys = np.einsum("bnd,nd->bn", xs, tasks[owner])
    xq = rng.normal(size=(1, 4, D))
    perm = np.concatenate([np.flatnonzero(owner == t) for t in (2, 1, 0)])
    base = np.asarray(icl_predict(xs, ys, xq, g))
    np.testing.assert_allclose(np.asarray(icl_predict(xs[:, perm], ys[:, perm], xq, g)), base,
                               rtol=1e-5, atol=1e-6)
    after_1 = np.full(4, BLOCKS[0] + BLOCKS[1])
    after_1_rev = np.full(4, BLOCKS[2] + BLOCKS[1])
    masked = np.asarray(icl_predict(xs, ys, xq, g, visible=after_1))
    masked_rev = np.asarray(icl_predict(xs[:, perm], ys[:, perm], xq, g, visible=after_1_rev))
    assert np.abs(masked - masked_rev).max() > 0.05
    # and Monte Carlo sees the masked order effect on task 1 beyond both CIs
    e_fwd = _mc(51, BLOCKS, 1, gamma=g, noise_var=NOISE, tasks=tasks, visible=int(after_1[0]))
    rev = [2, 1, 0]
    e_rev = _mc(52, tuple(blocks[rev]), 1, gamma=g, noise_var=noise[rev], tasks=tasks[rev],
                visible=int(after_1_rev[0]))
    gap = abs(e_fwd["total"].mean - e_rev["total"].mean)
    assert gap > e_fwd["total"].half_width + e_rev["total"].half_width
    assert e_fwd["total"].covers(runs[(0, 1, 2), True][1])
    assert e_rev["total"].covers(runs[(2, 1, 0), True][1])
