"""α-entmax attention (lcjax.attention.entmax): equality with a dense reference (scores
materialised, then lcjax.attention.entmax.mapping.entmax), α → 1⁺ limit, gradients (autodiff of
the dense
reference and finite differences, float64), low precision and empty rows, block sparsity on a
constructed input, jit/vmap, argument errors, and the learnable per-head α of the Flax module.

Shapes are ragged (T = 13, S = 11 with 4 x 3 tiles) and grouped (H = 4, Hkv = 2). A few
module-level jitted entry points keep the number of compilations small."""

import importlib.util
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax import attention
from lcjax.attention import build_mask, dot_product_attention
from lcjax.attention.entmax import entmax_attention
from lcjax.attention.entmax.mapping import entmax, entmax_threshold
from lcjax.nn import Attention

B, T, S, H, HKV, D = 2, 13, 11, 4, 2, 8
TILES = dict(block_q=4, block_kv=3)
STATIC = ("alpha", "causal", "solver", "block_q", "block_kv", "return_aux", "implementation")
attn = jax.jit(entmax_attention, static_argnames=STATIC)  # Python-number α
attn_arr = jax.jit(entmax_attention, static_argnames=STATIC[1:])  # array α (traced)


def _normal(seed, shape, dtype=jnp.float32):
    """NumPy random normals (no PRNG kernels to compile, which costs seconds per shape)."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _qkv(seed, dtype=jnp.float32, q_scale=2.0, t=T, s=S, h=H, hkv=HKV, d=D):
    q = _normal(seed, (B, t, h, d)) * q_scale
    k = _normal(seed + 1000, (B, s, hkv, d))
    v = _normal(seed + 2000, (B, s, hkv, d))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _scores(q, k, scale=None):
    """Dense [B, H, T, S] scaled scores with the kv heads repeated (GQA)."""
    g = q.shape[2] // k.shape[2]
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    kk = jnp.repeat(k, g, axis=2).astype(jnp.promote_types(k.dtype, jnp.float32))
    return scale * jnp.einsum("bthd,bshd->bhts", q.astype(kk.dtype), kk)


def dense(q, k, v, alpha, method, *, causal=False, mask=None, q_segment_ids=None,
          kv_segment_ids=None):
    """Reference: materialised scores, -inf where masked, lcjax.attention.entmax.mapping.entmax
    over keys."""
    sc = _scores(q, k)
    m = build_mask(q.shape[1], k.shape[1], causal=causal, mask=mask,
                   q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
    if m is not None:
        sc = jnp.where(m, sc, -jnp.inf)
    a = alpha if isinstance(alpha, float) else jnp.asarray(alpha)[None, :, None, None]
    p = entmax(sc, a, axis=-1, method=method)
    vv = jnp.repeat(v, q.shape[2] // v.shape[2], axis=2).astype(p.dtype)
    return jnp.einsum("bhts,bshd->bthd", p, vv), sc


dense_jit = jax.jit(dense, static_argnames=("alpha", "method", "causal"))
threshold = jax.jit(entmax_threshold, static_argnames=("alpha", "axis", "method"))


def _masking(causal):
    """Non-causal: a random explicit mask with one fully masked query row. Causal: packed
    segments, a padded (empty) query row and padded keys."""
    if not causal:
        mask = np.random.default_rng(7).random((B, 1, T, S)) < 0.7
        mask[1, 0, 3] = False
        return dict(mask=jnp.asarray(mask))
    q_seg = jnp.array([[0] * 6 + [1] * 7, [0] * 12 + [-1]], jnp.int32)
    kv_seg = jnp.array([[0] * 5 + [1] * 6, [0] * 9 + [-1] * 2], jnp.int32)
    return dict(q_segment_ids=q_seg, kv_segment_ids=kv_seg)


# ----------------------------------------------------------------------------
# Forward: equality with the dense reference
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "alpha,method,causal",
    [(1.5, "sort", False), (1.5, "sort", True), (2.0, "sort", False), (2.0, "sort", True),
     (1.3, "bisect", True)],
)
def test_matches_dense_reference(alpha, method, causal):
    q, k, v = _qkv(0)
    kw = _masking(causal)
    out, aux = attn(q, k, v, alpha=alpha, causal=causal, return_aux=True, **kw, **TILES)
    ref, sc = dense_jit(q, k, v, alpha, method, causal=causal, **kw)
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=0)
    # τ per row agrees with the dense threshold (entmax convention); empty rows: +inf, zeros
    tau_ref, _ = threshold(sc, alpha, axis=-1, method=method)
    tau_ref = jnp.moveaxis(tau_ref[..., 0], 1, 2)  # [B, T, H]
    empty = ~jnp.isfinite(tau_ref)
    assert bool(jnp.any(empty))  # each masking pattern has an empty row
    np.testing.assert_array_equal(~jnp.isfinite(aux["tau"]), empty)
    np.testing.assert_allclose(aux["tau"][~empty], tau_ref[~empty], atol=2e-5)
    assert bool(jnp.all(out[empty] == 0))
    assert aux["tau"].dtype == jnp.float32 and aux["tau"].shape == (B, T, H)
    assert aux["iterations"].shape == (B, T, H)
    if alpha in (1.5, 2.0):  # histogram initialisation: τ within a few steps
        assert int(aux["iterations"].max()) <= 3
    assert 0.0 <= float(aux["block_sparsity"]) <= 1.0


def test_registry_and_sparsemax_gradients():
    """The registered "sparsemax" (α = 2; ``solver="newton"``: Newton from the power-mean
    lower bound, no histogram) against the dense reference: output and gradients (float32;
    the float64 test below covers α = 1.5 and per-head α)."""
    assert attention.spec("entmax").implementation_names == ("pallas", "xla")
    assert set(attention.spec("entmax").aux) == {"tau", "iterations", "block_sparsity"}
    assert inspect.signature(entmax_attention).parameters["alpha"].default == 1.5
    q, k, v = _qkv(1)
    w = _normal(2, (B, T, H, D))
    kw = _masking(causal=False)
    sparsemax = attention.get("sparsemax")

    def loss(fn, q, k, v):
        out = fn(q, k, v)
        return jnp.sum(w * out), out

    vg = jax.value_and_grad(loss, argnums=(1, 2, 3), has_aux=True)
    (_, out), grads = jax.jit(vg, static_argnums=0)(
        lambda q, k, v: sparsemax(q, k, v, solver="newton", **kw, **TILES), q, k, v)
    (_, ref), grads_ref = jax.jit(vg, static_argnums=0)(
        lambda q, k, v: dense(q, k, v, 2.0, "sort", **kw)[0], q, k, v)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    for g, gr in zip(grads, grads_ref):
        np.testing.assert_allclose(g, gr, atol=2e-5, rtol=1e-5)


def test_alpha_to_one_approaches_softmax():
    """α = 1 + ε against softmax attention. On the support, with t = (τ + 1)/ε,
    p_j = (1 + ε(x_j - t))^{1/ε} = exp((x_j - t) - ε(x_j - t)²/2 + O(ε²)) and t = lse(x) + O(ε),
    so p = softmax(x) ⊙ (1 - ε(y - E y)/2) + O(ε²) with y = (x - lse)², and

        out_ε - out_softmax = -(ε/2)·Cov_softmax(y, v) + O(ε²).

    The tolerance is that expansion: at ε = 0.01 the deviation is within 5% of the first-order
    term (measured: ~1%), and the remainder shrinks like ε² (0.1 -> 0.01: by > 20x; measured
    ~100x). Bisection with a per-head α array (one compilation for both ε)."""
    q, k, v = _qkv(2, q_scale=1.0)
    soft = np.asarray(dot_product_attention(q, k, v, causal=True), np.float64)
    allowed = np.tril(np.ones((T, S), bool))
    x = np.where(allowed, np.asarray(_scores(q, k), np.float64), -np.inf)  # [B, H, T, S]
    m = x.max(-1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(-1, keepdims=True))
    p = np.exp(x - lse)
    y = np.where(allowed, (x - lse) ** 2, 0.0)
    vv = np.repeat(np.asarray(v, np.float64), H // HKV, axis=2)  # [B, S, H, D]
    cov = (np.einsum("bhts,bshd->bthd", p * y, vv)
           - np.moveaxis((p * y).sum(-1), 1, 2)[..., None] * np.einsum("bhts,bshd->bthd", p, vv))
    resid = {}
    for eps in (0.1, 0.01):
        out = attn_arr(q, k, v, alpha=jnp.full((H,), 1.0 + eps), causal=True, solver="bisect",
                       **TILES)
        dev = np.asarray(out, np.float64) - soft
        first = -eps / 2 * cov
        resid[eps] = np.abs(dev - first).max()
        if eps == 0.01:
            assert np.abs(dev).max() < 0.05
            assert resid[eps] < 0.05 * np.abs(first).max()
    assert resid[0.01] < resid[0.1] / 20, resid


# ----------------------------------------------------------------------------
# Gradients
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [1.5, "per-head"])
def test_gradients_match_dense_autodiff_and_finite_differences(alpha):
    with jax.enable_x64(True):
        q, k, v = _qkv(3, jnp.float64)
        w = _normal(4, (B, T, H, D), jnp.float64)
        kw = _masking(causal=True)  # segments, an empty query row, padded keys
        a0 = jnp.array([1.2, 1.5, 2.0, 2.5], jnp.float64)  # Newton and (α > 2) bisection
        method = "bisect" if alpha == "per-head" else "sort"

        def alpha_of(a):
            return a if alpha == "per-head" else alpha

        def loss(q, k, v, a):
            out = entmax_attention(q, k, v, alpha=alpha_of(a), causal=True, **kw, **TILES)
            return jnp.sum(w * out)

        def loss_ref(q, k, v, a):
            return jnp.sum(w * dense(q, k, v, alpha_of(a), method, causal=True, **kw)[0])

        vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
        val, grads = vg(q, k, v, a0)
        val_ref, grads_ref = jax.jit(jax.value_and_grad(loss_ref, argnums=(0, 1, 2, 3)))(
            q, k, v, a0)
        np.testing.assert_allclose(val, val_ref, rtol=1e-10)
        for g, gr in zip(grads, grads_ref):
            assert bool(jnp.all(jnp.isfinite(g)))
            np.testing.assert_allclose(g, gr, atol=1e-9, rtol=1e-7)
        if alpha == "per-head":
            assert bool(jnp.all(grads[3] != 0))
        else:
            assert bool(jnp.all(grads[3] == 0))
        # central finite differences along random directions
        args = (q, k, v, a0)
        n_args = 4 if alpha == "per-head" else 3
        for i in range(n_args):
            d = _normal(10 + i, args[i].shape, jnp.float64)
            eps = 1e-5  # smaller steps meet the solver's float64 tolerance (|Σp - 1| < 1e-12)
            plus = [a + eps * d if j == i else a for j, a in enumerate(args)]
            minus = [a - eps * d if j == i else a for j, a in enumerate(args)]
            fd = (vg(*plus)[0] - vg(*minus)[0]) / (2 * eps)
            np.testing.assert_allclose(fd, jnp.vdot(grads[i], d), rtol=2e-6, atol=1e-9)


def test_bf16_huge_logits_and_empty_rows():
    """bf16 inputs with logits ~1e3: one-hot rows, no overflow; empty rows are zeros with
    zero, finite gradients."""
    q, k, v = _qkv(5, jnp.bfloat16, q_scale=1000.0)
    mask = np.ones((B, H, T, S), bool)
    mask[0, :, 2] = mask[1, 3] = False

    def loss(q, k, v):
        out = entmax_attention(q, k, v, alpha=1.5, mask=mask, **TILES)
        return jnp.sum(out.astype(jnp.float32) ** 2), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    assert out.dtype == jnp.bfloat16
    assert bool(jnp.all(jnp.isfinite(out.astype(jnp.float32))))
    ref, _ = dense_jit(q, k, v, 1.5, "sort", mask=mask)
    np.testing.assert_allclose(out.astype(jnp.float32), ref, atol=2e-2)
    assert bool(jnp.all(out[0, 2] == 0)) and bool(jnp.all(out[1, :, 3] == 0))
    for g in grads:
        assert g.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(g.astype(jnp.float32))))
    assert bool(jnp.all(grads[0][0, 2] == 0)) and bool(jnp.all(grads[0][1, :, 3] == 0))


# ----------------------------------------------------------------------------
# Block sparsity
# ----------------------------------------------------------------------------
def _clustered(blk):
    """q, k, v with 4 blocks of ``blk`` positions; queries and keys of block b are 4·e_b."""
    n = 4 * blk
    basis = np.eye(4)[np.arange(n) // blk] * 4.0  # [n, 4]: row j = 4·e_{j // blk}
    q = jnp.asarray(np.broadcast_to(basis[None, :, None], (1, n, 2, 4)), jnp.float32)
    k = jnp.asarray(np.broadcast_to(basis[None, :, None], (1, n, 1, 4)), jnp.float32)
    return q, k, _normal(6, (1, n, 1, 4))


@pytest.mark.parametrize("causal,expected", [(False, 1 - 4 / 16), (True, 1 - 4 / 10)])
def test_block_sparsity_on_clustered_input(causal, expected):
    """Queries and keys of block b point along e_b (scores 8 inside a block, 0 across: for
    α = 1.5, z differs by 4 > 1, so no weight crosses blocks): only the 4 diagonal tiles of
    the 4 x 4 tile grid are live (per batch and head). Causal: 10 tiles at or below the
    diagonal are counted."""
    q, k, v = _clustered(4)
    tiles = dict(block_q=4, block_kv=4)
    out, aux = attn(q, k, v, alpha=1.5, causal=causal, return_aux=True, **tiles)
    np.testing.assert_allclose(out, dense_jit(q, k, v, 1.5, "sort", causal=causal)[0], atol=1e-5)
    np.testing.assert_allclose(aux["block_sparsity"], expected, rtol=1e-6)
    # uniform attention (q = 0): every counted tile is live
    _, aux0 = attn(jnp.zeros_like(q), k, v, alpha=1.5, causal=causal, return_aux=True, **tiles)
    assert float(aux0["block_sparsity"]) == 0.0


@pytest.mark.parametrize("alpha,solver,causal", [(1.5, "histogram", True),
                                                  (1.5, "histogram", False),
                                                  (2.0, "newton", True), (1.3, "bisect", True)])
def test_solve_passes_skipping_blocks_stay_exact(alpha, solver, causal):
    """Local (RoPE'd, λ = 2) inputs: most 4 x 4 tiles hold no weight, so the histogram and
    solver passes skip the key blocks whose every z is at or below the row's lower bound
    (origin, bracket lo). τ and the output still equal the dense reference's (float64: the
    scores reach ~30 here, where float32 rounding alone moves τ by ~1e-5). Skipping above
    origin·0.3, lo + 0.2 or even the bracket's hi instead breaks it (checked by mutation)."""
    from experiments.entmax.bench import locality_inputs

    with jax.enable_x64(True):
        q, k, v, _ = (x.astype(jnp.float64) for x in locality_inputs(64, 2, 16, 2.0, seed=3))
        out, aux = entmax_attention(q, k, v, alpha=alpha, causal=causal, solver=solver,
                                    return_aux=True, block_q=4, block_kv=4, tol=1e-12)
        method = "sort" if alpha in (1.5, 2.0) else "bisect"
        ref, sc = dense(q, k, v, alpha, method, causal=causal)
        tau_ref = jnp.moveaxis(threshold(sc, alpha, axis=-1, method=method)[0][..., 0], 1, 2)
    assert float(aux["block_sparsity"]) >= 0.5
    np.testing.assert_allclose(out, ref, atol=1e-9, rtol=0)
    np.testing.assert_allclose(aux["tau"], tau_ref, atol=1e-9)


def test_blockwise_memory_is_not_quadratic():
    """The compiled forward + backward needs temporaries well below one float32 [H, T, S]
    score matrix (8 MiB here; dense attention needs about twice that for the forward
    alone)."""
    t = 1024
    q = jnp.zeros((1, t, 2, 16))
    k = v = jnp.zeros((1, t, 1, 16))
    grad = jax.grad(lambda q, k, v: jnp.sum(entmax_attention(q, k, v, causal=True)),
                    argnums=(0, 1, 2))
    temp = jax.jit(grad).lower(q, k, v).compile().memory_analysis().temp_size_in_bytes
    assert temp < t * t * 2 * 4 / 4


@pytest.mark.skipif(importlib.util.find_spec("pallas_kernels.entmax_attention") is None,
                    reason="no Pallas kernel module")
def test_pallas_implementation_matches_xla():
    """implementation="pallas" (the kernel, interpret mode on CPU) gives the XLA path's
    output, τ and block sparsity through this function's adapter."""
    q, k, v = _clustered(16)
    tiles = dict(block_q=16, block_kv=16)
    out, aux = entmax_attention(q, k, v, implementation="pallas", return_aux=True, **tiles)
    ref, aux_ref = attn(q, k, v, alpha=1.5, causal=False, implementation="xla",
                        return_aux=True, **tiles)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    np.testing.assert_allclose(aux["tau"], aux_ref["tau"], atol=1e-5)
    assert float(aux["block_sparsity"]) == float(aux_ref["block_sparsity"]) == 0.75


# ----------------------------------------------------------------------------
# Transformations, options, errors
# ----------------------------------------------------------------------------
def test_vmap_and_jit_compose():
    q, k, v = _qkv(8)
    q2, k2, v2 = _qkv(9)
    stack = [jnp.stack(pair) for pair in ((q, q2), (k, k2), (v, v2))]
    f = jax.jit(jax.vmap(lambda q, k, v: entmax_attention(q, k, v, causal=True, **TILES)))
    out = f(*stack)
    np.testing.assert_allclose(out[0], dense_jit(q, k, v, 1.5, "sort", causal=True)[0],
                               atol=1e-5)
    np.testing.assert_allclose(out[1], dense_jit(q2, k2, v2, 1.5, "sort", causal=True)[0],
                               atol=1e-5)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(alpha=1.0), "alpha"),
        (dict(alpha=0.5), "alpha"),
        (dict(alpha=np.array([1.5, 1.5, 1.0, 2.0])), "alpha"),
        (dict(alpha=jnp.ones((3,)) * 1.5), "alpha"),
        (dict(implementation="cuda"), "implementation"),
        (dict(solver="sort"), "solver"),
        (dict(bins=3), "bins"),
        (dict(block_q=0), "block"),
        (dict(n_iter=-1), "n_iter"),
        (dict(mask=jnp.ones((T, T), bool)), "mask"),
        (dict(q_segment_ids=jnp.zeros((B, T), jnp.int32)), "segment_ids"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    q, k, v = _qkv(0)
    with pytest.raises(ValueError, match=match):
        entmax_attention(q, k, v, **kwargs)


def test_bad_shapes_raise_and_pallas_needs_the_kernel():
    q, k, v = _qkv(0)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        entmax_attention(q[:, :, :3], k, v)
    with pytest.raises(ValueError, match="rank 4"):
        entmax_attention(q[0], k, v)
    if importlib.util.find_spec("pallas_kernels.entmax_attention") is None:
        with pytest.raises(ValueError, match="implementation"):
            entmax_attention(q, k, v, implementation="pallas")


# ----------------------------------------------------------------------------
# Flax module with a learnable per-head α
# ----------------------------------------------------------------------------
def test_flax_learnable_alpha_receives_gradient():
    kw = dict(d_model=16, num_heads=4, num_kv_heads=2, head_dim=8, attention="entmax")
    learned = Attention(**kw, learn=("alpha",), rngs=nnx.Rngs(0))
    assert learned.variant_params.alpha_raw[...].shape == (4,)
    np.testing.assert_allclose(learned.variant_params.alpha_raw[...], 0.0, atol=1e-6)  # α=1.5
    x = _normal(0, (2, 7, 16))
    pos = jnp.arange(7)
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(x, pos)[0] ** 2)))(learned)
    g = grads.variant_params.alpha_raw[...]
    assert g.shape == (4,) and bool(jnp.all(jnp.isfinite(g))) and bool(jnp.all(g != 0))
    init = Attention(**kw, learn_alpha=True, attention_options={"alpha": 1.8},
                     rngs=nnx.Rngs(0))  # the deprecated alias of learn=("alpha",)
    np.testing.assert_allclose(1 + jax.nn.sigmoid(init.variant_params.alpha_raw[...]), 1.8,
                               rtol=1e-6)
    with pytest.raises(ValueError, match="learn_alpha"):
        Attention(**{**kw, "attention": "softmax"}, learn_alpha=True, rngs=nnx.Rngs(0))


# ----------------------------------------------------------------------------
# The backward pass skips dead tiles
# ----------------------------------------------------------------------------
def _dead_key_block(n=32, tile=8, h=2, d=8):
    """q, k ~ 2·N(0, 1) except the last key block, k = 0 there: its scores are 0 while every
    row's max is far above 2 = 1/(α-1) (α = 1.5), so for every row, batch and head that key
    block holds no weight. v random; ``poison``: v of that block set to 3e38 (finite), so
    that any product of a tile's dO·vᵀ with it overflows to inf and 0·inf = NaN."""
    rng = np.random.default_rng(11)
    q = jnp.asarray(2 * rng.standard_normal((1, n, h, d)), jnp.float32)
    k = np.asarray(2 * rng.standard_normal((1, n, h, d)), np.float32)
    k[:, n - tile:] = 0.0
    v = np.asarray(rng.standard_normal((1, n, h, d)), np.float32)
    poison = v.copy()
    poison[:, n - tile:] = 3e38
    w = jnp.asarray(np.abs(rng.standard_normal((1, n, h, d))) + 0.5, jnp.float32)  # dO > 0
    return q, jnp.asarray(k), jnp.asarray(v), jnp.asarray(poison), w


def test_backward_skips_dead_tiles():
    """Forward and backward with the dead key block's v replaced by 3e38: if any pass read
    it, dp = dO·vᵀ would be inf there and s·(dp - ρ/σ) = 0·inf = NaN would spread into dq
    and dk; the XLA path gives exactly the gradients of the clean v instead (and dv = 0 on
    the dead keys). Negative control: the dense reference, which reads every tile, turns
    NaN on the same input."""
    q, k, v, poison, w = _dead_key_block()

    def loss(q, k, v):
        out, aux = entmax_attention(q, k, v, alpha=1.5, implementation="xla", block_q=8,
                                    block_kv=8, return_aux=True)
        return jnp.sum(out * w), aux["block_sparsity"]

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    ((val, sparsity), g_clean), ((val_p, _), g_poison) = grad(q, k, v), grad(q, k, poison)
    assert float(sparsity) >= 0.25  # the last of 4 key blocks, at least
    np.testing.assert_allclose(val, jnp.sum(dense_jit(q, k, v, 1.5, "sort")[0] * w),
                               rtol=1e-5)
    assert float(val_p) == float(val)
    for name, a, b in zip("qkv", g_clean, g_poison):
        assert bool(jnp.all(jnp.isfinite(b))), name
        np.testing.assert_array_equal(a, b, err_msg=f"d{name}")
    assert float(jnp.max(jnp.abs(g_clean[0]))) > 0.1  # a non-trivial gradient
    assert not np.any(np.asarray(g_poison[2][:, -8:]))
    dense_grad = jax.jit(jax.grad(lambda q, v: jnp.sum(dense(q, k, v, 1.5, "sort")[0] * w)))
    assert not bool(jnp.all(jnp.isfinite(dense_grad(q, poison))))
