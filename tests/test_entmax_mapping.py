"""α-entmax mapping (lcjax.attention.entmax.mapping): known values, agreement of the sort /
bisection /
histogram thresholds, the histogram bracket and its iteration count, gradients (x and α)
against finite differences and autodiff of the sort algorithm, low-precision and masking
edge cases, α → 1⁺, argument errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcjax.attention.entmax import mapping as E

# Few distinct shapes so that jit caches hit; hypothesis varies seeds, scales and α.
SHAPES = [(5, 33), (2, 3, 128)]
HYP = settings(max_examples=8, deadline=None, derandomize=True)

# jitted entry points (eager dispatch of the solver loop is slow on CPU)
threshold = jax.jit(E.entmax_threshold, static_argnames=("alpha", "method", "bins"))
mapping = jax.jit(E.entmax, static_argnames=("alpha", "method"))


def _rows(seed, shape, scale, dtype=jnp.float32):
    return (jax.random.normal(jax.random.PRNGKey(seed), shape) * scale).astype(dtype)


def _np_tau(x, alpha):
    """Independent float64 NumPy root of Σ[(α-1)x - τ]₊^{1/(α-1)} = 1 per row (bisection)."""
    z = (alpha - 1.0) * np.asarray(x, np.float64)
    lo = z.max(-1, keepdims=True) - 1.0
    hi = z.max(-1, keepdims=True)
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        f = (np.maximum(z - mid, 0.0) ** (1.0 / (alpha - 1.0))).sum(-1, keepdims=True) - 1.0
        lo, hi = np.where(f > 0, mid, lo), np.where(f > 0, hi, mid)
    return 0.5 * (lo + hi)


# ----------------------------------------------------------------------------
# Known values and basic properties
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["sort", "bisect", "histogram", "auto"])
def test_known_values(method):
    x = jnp.array([-2.0, 0.0, 0.5])
    np.testing.assert_allclose(mapping(x, 1.5, method=method), [0, 0.3260, 0.6740], atol=1e-4)
    np.testing.assert_allclose(mapping(x, 2.0, method=method), [0, 0.25, 0.75], atol=1e-5)
    np.testing.assert_allclose(jax.jit(E.entmax15)(x), [0, 0.3260, 0.6740], atol=1e-4)
    np.testing.assert_allclose(jax.jit(E.sparsemax)(x), [0, 0.25, 0.75], atol=1e-5)


@functools.partial(jax.jit, static_argnums=1)
def _all_methods(x, alpha):
    out = {}
    for method in ("sort", "bisect", "histogram"):
        tau, iters = E.entmax_threshold(x, alpha, method=method)
        out[method] = (tau, iters, E.entmax(x, alpha, method=method))
    return out


@HYP
@given(shape=st.sampled_from(SHAPES), seed=st.integers(0, 10_000),
       scale=st.sampled_from([0.03, 0.3, 1.0, 3.0, 10.0]), alpha=st.sampled_from([1.5, 2.0]))
def test_methods_agree_on_threshold_and_support(shape, seed, scale, alpha):
    """sort / bisect / histogram: τ within 1e-5 of an independent float64 root; outputs are
    distributions (≥ 0, Σ = 1) equal to the exact sort's, with the same support."""
    x = _rows(seed, shape, scale)
    out = _all_methods(x, alpha)
    ref = _np_tau(x, alpha)
    t_sort, i_sort, p_sort = out["sort"]
    assert t_sort.shape == shape[:-1] + (1,) and int(i_sort.max()) == 0
    margin = np.abs((alpha - 1) * np.asarray(x, np.float64) - ref)
    clear = margin > 1e-5  # elements not within 1e-5 of τ*
    for method, (tau, _, p) in out.items():
        np.testing.assert_allclose(tau, ref, atol=1e-5, rtol=1e-6, err_msg=method)
        p = np.asarray(p)
        assert (p >= 0).all()
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5, err_msg=method)
        np.testing.assert_allclose(p, p_sort, atol=2e-5, err_msg=method)
        support = (alpha - 1) * np.asarray(x, np.float64) > ref
        np.testing.assert_array_equal((p > 0)[clear], support[clear], err_msg=method)
    if scale >= 1.0:  # wide rows are genuinely sparse
        assert (np.asarray(p_sort) == 0).any()


def test_histogram_bracket_and_iterations():
    """The bracket holds τ* on every row; ≥ 99% of Gaussian rows reach |Σp-1| < 1e-5
    within 2 steps after the histogram initialisation."""
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 200, 256)) * jnp.array([0.3, 1.0, 3.0])[
        :, None, None
    ]
    for alpha in (1.5, 2.0):
        ref = _np_tau(x, alpha)
        lo, hi, t0 = jax.jit(E.histogram_bracket, static_argnums=(1, 2, 3))(x, alpha, -1, 8)
        slack = 1e-6 * (1 + np.abs(ref))
        assert (np.asarray(lo) <= ref + slack).all() and (ref <= np.asarray(hi) + slack).all()
        assert (np.asarray(hi - lo) <= 1 / 8 + 1e-6).all()
        assert ((lo <= t0) & (t0 <= hi)).all()
        tau, iters = threshold(x, alpha, method="histogram", bins=8)
        counts = np.bincount(np.asarray(iters).ravel())
        frac = counts[:3].sum() / iters.size
        print(f"alpha={alpha}: steps after histogram init {counts.tolist()}, "
              f"within 2: {100 * frac:.2f}%")
        assert frac >= 0.99
        np.testing.assert_allclose(tau, ref, atol=1e-5, rtol=1e-6)
    ref = _np_tau(x, 1.5)
    for bins in (2, 4):
        lo, hi, _ = jax.jit(E.histogram_bracket, static_argnums=(1, 2, 3))(x, 1.5, -1, bins)
        assert (np.asarray(lo) <= ref + 1e-6).all() and (ref <= np.asarray(hi) + 1e-6).all()


@pytest.mark.parametrize("alpha", [1.2, 1.7, 2.0, 3.0])
def test_bisect_any_alpha(alpha):
    x = _rows(1, (4, 50), 2.0)
    p = jax.jit(E.entmax_bisect, static_argnums=1)(x, alpha)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)
    ref = np.maximum((alpha - 1) * np.asarray(x, np.float64) - _np_tau(x, alpha), 0) ** (
        1 / (alpha - 1)
    )
    np.testing.assert_allclose(p, ref, atol=1e-5)
    if alpha not in (1.5, 2.0):  # histogram falls back to bisection
        np.testing.assert_allclose(mapping(x, alpha, method="histogram"), p, atol=1e-7)


def test_axis_jit_vmap_and_per_head_alpha():
    x = _rows(2, (2, 3, 6, 20), 2.0)  # [batch, heads, q, k]

    @jax.jit
    def run(x):
        p = E.entmax15(x)
        p_axis = jnp.swapaxes(E.entmax15(jnp.swapaxes(x, 1, 3), axis=1), 1, 3)
        p_vmap = jax.vmap(E.entmax15)(x)
        alpha = jnp.array([1.3, 1.5, 2.0])[:, None, None]  # per head
        p_head = E.entmax(x, alpha)
        p_each = jnp.stack([E.entmax_bisect(x[:, h], a) for h, a in enumerate([1.3, 1.5, 2.0])],
                           axis=1)
        return p, p_axis, p_vmap, p_head, p_each, E.entmax_threshold(x, alpha)

    p, p_axis, p_vmap, p_head, p_each, (tau, iters) = run(x)
    np.testing.assert_allclose(p_axis, p, atol=1e-6)
    np.testing.assert_allclose(p_vmap, p, atol=1e-6)
    np.testing.assert_allclose(p_head, p_each, atol=1e-5)
    assert tau.shape == (2, 3, 6, 1) and iters.dtype == jnp.int32


# ----------------------------------------------------------------------------
# Gradients (float64)
# ----------------------------------------------------------------------------
def _fd_grad(f, x, eps=1e-6):
    flat = np.asarray(x).ravel()
    out = np.zeros_like(flat)
    for i in range(flat.size):
        d = np.zeros_like(flat)
        d[i] = eps
        out[i] = (f(jnp.asarray((flat + d).reshape(x.shape)))
                  - f(jnp.asarray((flat - d).reshape(x.shape)))) / (2 * eps)
    return out.reshape(x.shape)


@pytest.mark.parametrize("alpha,method", [(1.5, "sort"), (1.5, "histogram"), (2.0, "histogram"),
                                          (1.3, "bisect")])
def test_grad_x_matches_finite_differences_and_autodiff(alpha, method):
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.PRNGKey(3), (3, 7), jnp.float64) * 2.0
        g = jax.random.normal(jax.random.PRNGKey(4), (3, 7), jnp.float64)

        def loss(x):
            return jnp.sum(g * E.entmax(x, alpha, method=method))

        grad = jax.jit(jax.grad(loss))(x)
        np.testing.assert_allclose(grad, _fd_grad(jax.jit(loss), x), atol=1e-6)
        if alpha in (1.5, 2.0):
            auto = jax.grad(lambda x: jnp.sum(g * E._entmax_reference(x, alpha)))(x)
            np.testing.assert_allclose(grad, auto, atol=1e-10)


@pytest.mark.parametrize("alpha0", [1.2, 1.9, 2.5])
def test_grad_alpha_matches_finite_differences(alpha0):
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.PRNGKey(5), (3, 9), jnp.float64) * 2.0
        g = jax.random.normal(jax.random.PRNGKey(6), (3, 9), jnp.float64)
        alpha = jnp.array([[alpha0], [alpha0 + 0.05], [alpha0 - 0.05]])

        def loss(alpha, x):
            return jnp.sum(g * E.entmax(x, alpha, method="bisect"))

        ga, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(alpha, x)
        np.testing.assert_allclose(ga, _fd_grad(jax.jit(lambda a: loss(a, x)), alpha), atol=1e-6)
        np.testing.assert_allclose(gx, _fd_grad(jax.jit(lambda v: loss(alpha, v)), x), atol=1e-6)


def test_grad_per_head_alpha_via_param():
    """A learned per-head α through alpha_from_param: gradient shape, finiteness, and FD."""
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.PRNGKey(7), (2, 3, 2, 8), jnp.float64)
        raw = jnp.array([-1.0, 0.0, 1.5])

        @jax.jit
        def loss(raw):
            alpha = E.alpha_from_param(raw)[:, None, None]
            return jnp.sum(E.entmax(x, alpha) ** 2)

        g = jax.grad(loss)(raw)
        assert g.shape == (3,) and np.isfinite(g).all()
        np.testing.assert_allclose(g, _fd_grad(loss, raw), atol=1e-6)


# ----------------------------------------------------------------------------
# Robustness: low precision, masking, extremes
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("method", ["sort", "histogram", "bisect"])
def test_low_precision_extremes(dtype, method):
    big = 60000.0 if dtype == jnp.float16 else 1e30
    x = jnp.array([
        [-1000.0, -1008.0, -1016.0, -1024.0],  # gaps of 8: one-hot for α ∈ {1.5, 2}
        [-1000.0, -1000.0, -1000.0, -1000.0],  # equal: uniform
        [big, 0.0, -1.0, 1.0],                 # one huge logit: one-hot
        [-jnp.inf, -jnp.inf, -jnp.inf, -jnp.inf],  # fully masked: zeros
        [-jnp.inf, -1000.0, -jnp.inf, -jnp.inf],   # one live element
    ], dtype)

    @jax.jit
    def run(x):
        out = []
        for alpha in (1.5, 2.0):
            p = E.entmax(x, alpha, method=method)
            gx = jax.grad(lambda x, a=alpha: jnp.sum(E.entmax(x, a, method=method)
                                                     .astype(jnp.float32) * jnp.arange(4.0)))(x)
            out.append((p, gx))
        return out, E.entmax_threshold(x, 1.5, method=method)[0]

    out, tau = run(x)
    want = [[1, 0, 0, 0], [0.25] * 4, [1, 0, 0, 0], [0] * 4, [0, 1, 0, 0]]
    for p, gx in out:
        assert p.dtype == dtype and gx.dtype == dtype
        np.testing.assert_allclose(np.asarray(p, np.float32), want, atol=1e-3)
        assert np.isfinite(np.asarray(gx, np.float32)).all()
    assert np.isposinf(np.asarray(tau)[3]).all() and np.isfinite(np.asarray(tau)[:3]).all()


def test_partial_masks_and_inf_rows():
    x = jnp.array([[0.3, -jnp.inf, 0.1, -jnp.inf], [jnp.inf, 0.0, jnp.inf, 1.0]])
    alpha = jnp.array([[1.5], [1.7]])

    @jax.jit
    def run(x, alpha):
        grads = jax.grad(lambda a, x: jnp.sum(E.entmax(x, a) * jnp.arange(4.0)),
                         argnums=(0, 1))(alpha, x)
        return E.entmax15(x), E.entmax15(jnp.array([0.3, -1e9, 0.1, -1e9])), grads

    p, p_finite, (ga, gx) = run(x, alpha)
    assert np.asarray(p)[0, 1] == 0 and np.asarray(p)[0, 3] == 0
    np.testing.assert_allclose(p[0], p_finite, atol=1e-6)
    np.testing.assert_allclose(p[1], [0.5, 0, 0.5, 0], atol=1e-6)  # +inf entries share
    assert np.isfinite(ga).all() and np.isfinite(gx).all()


def test_near_softmax_limit():
    x = _rows(8, (4, 30), 1.0)
    p, p13 = jax.jit(lambda x: (E.entmax_bisect(x, 1.001), E.entmax_bisect(x, 1.3)))(x)
    np.testing.assert_allclose(p, jax.nn.softmax(x), atol=2e-3)
    assert (np.asarray(p) > 0).all()
    far = np.abs(np.asarray(p13) - np.asarray(jax.nn.softmax(x))).max()
    assert far > 0.01  # the check above is not vacuous


def test_alpha_from_param():
    a = E.alpha_from_param(jnp.array([-10.0, 0.0, 10.0]))
    np.testing.assert_allclose(a, [1.01, 1.5, 2.0], atol=1e-4)
    g = jax.grad(lambda r: E.alpha_from_param(r).sum())(jnp.array([-10.0, 0.0]))
    np.testing.assert_allclose(g, [0.0, 0.25], atol=1e-6)


def test_float64_stays_float64_and_bf16_roundtrip():
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 16)))
        p, p_sort = jax.jit(lambda x: (E.entmax15(x), E.entmax15(x, method="sort")))(x)
        assert p.dtype == jnp.float64
        np.testing.assert_allclose(p, p_sort, atol=1e-11)
    xb = _rows(9, (2, 16), 2.0, jnp.bfloat16)
    pb, pf = jax.jit(lambda x: (E.entmax15(x), E.entmax15(x.astype(jnp.float32))))(xb)
    assert pb.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(pb, np.float32), pf, atol=1e-2)


# ----------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [1.0, 0.5, -2.0, float("nan")])
def test_alpha_not_above_one_raises(alpha):
    x = jnp.ones((2, 3))
    for fn in (functools.partial(E.entmax, method="bisect"), E.entmax_bisect, E.entmax_threshold):
        with pytest.raises(ValueError, match="alpha"):
            fn(x, alpha)
    with pytest.raises(ValueError, match="alpha"):
        E.entmax(x, np.array([[1.5], [alpha]]))


def test_bad_arguments_raise():
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="sort"):
        E.entmax(x, 1.7, method="sort")
    with pytest.raises(ValueError, match="method"):
        E.entmax(x, 1.5, method="newton")
    with pytest.raises(ValueError, match="bins"):
        E.entmax(x, 1.5, method="histogram", bins=3)
    with pytest.raises(ValueError, match="size 1 along"):
        E.entmax(x, jnp.full((2, 3), 1.5))
    with pytest.raises(ValueError, match="axis"):
        E.entmax(x, 1.5, axis=2)
    with pytest.raises(ValueError, match="floating"):
        E.entmax(jnp.ones((2, 3), jnp.int32), 1.5)


# ----------------------------------------------------------------------------
# One-pass row max and power-mean origin (blockwise attention)
# ----------------------------------------------------------------------------
def _two_pass_origin(x, am1):
    """The two-pass origin: the row max first, then A = {z > -1} relative to it."""
    from lcjax.attention.entmax.mapping import (
        power_mean_origin,
        row_shift,
        row_sums,
        shifted_scores,
    )

    m, _ = row_shift(x, jnp.float32)
    u0 = jnp.maximum(shifted_scores(x, m, am1, jnp.float32) + 1.0, 0.0)
    return power_mean_origin(*row_sums(jnp.sign(u0), u0), am1)


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.3])
def test_one_pass_origin_matches_two_pass_and_bounds_tau(alpha):
    """Folding blocks with origin_sums_update: (a) when the first block holds the row max,
    the origin equals the two-pass value (no element leaves A); (b) in any block order the
    origin is a lower bound of the exact τ (Jensen on the superset A' ⊇ A) and ≥ -1, and
    the max is exact."""
    from lcjax.attention.entmax.mapping import (
        origin_sums_init,
        origin_sums_update,
        power_mean_origin,
    )

    am1 = alpha - 1.0
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((64, 48)) * rng.uniform(0.3, 6.0, (64, 1)), jnp.float32)

    def one_pass(x, block):
        acc = origin_sums_init((x.shape[0], 1), jnp.float32)
        for j in range(0, x.shape[1], block):
            acc = origin_sums_update(acc, x[:, j:j + block], am1, jnp.float32)
        return acc.xmax, power_mean_origin(acc.n, acc.s, am1)

    first_max = x.at[:, 0].set(jnp.max(x, 1) + 0.5)  # the row max in the first block
    _, origin = one_pass(first_max, 8)
    np.testing.assert_allclose(origin, _two_pass_origin(first_max, am1), atol=2e-6, rtol=0)
    xmax, origin = one_pass(x, 8)  # maxima anywhere: blocks raise the running max
    np.testing.assert_array_equal(xmax, jnp.max(x, 1, keepdims=True))
    method = "bisect" if alpha == 1.3 else "sort"
    tau, _ = E.entmax_threshold(x, alpha, method=method, n_iter=100, tol=1e-7)
    tau_shifted = tau - am1 * xmax
    assert bool(jnp.all(origin <= tau_shifted + 1e-6)) and bool(jnp.all(origin >= -1.0))
    # with blocks that raise the max A' grows beyond A: the bound differs from the
    # two-pass one on some rows (it is not the same number), but both bound τ
    two = _two_pass_origin(x, am1)
    assert bool(jnp.all(two <= tau_shifted + 1e-6))
