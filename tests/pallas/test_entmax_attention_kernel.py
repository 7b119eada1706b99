"""α-entmax attention Pallas kernels (pallas_kernels.entmax_attention): forward, τ and
gradients against the dense sort-based reference; the live-tile mask; empty rows; a
per-head (array) α and its gradient dα against the XLA path and float64 finite differences;
the backward skipping dead tiles; the pure-jnp reference's gradient at α ∉ {1.5, 2};
argument errors; lowering of forward and backward for TPU (Mosaic) and GPU (Triton) from
this CPU.

The kernel tests live in a base class; ``TestEntmaxAttentionInterpret`` runs them in
interpret mode (CPU), ``TestEntmaxAttentionDevice`` compiled on a GPU/TPU backend.
Shapes are tiny and few (one compile each): interpret mode is slow.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcjax import attention
from lcjax.attention.entmax import entmax_attention
from lcjax.attention.entmax.mapping import SolverConfig, entmax_threshold
from pallas_kernels.entmax_attention import (
    BlockSizes,
    entmax_attention_pallas,
    entmax_attention_reference,
)

# B, T, S, H, Hkv, D: T and S are not multiples of the blocks; GQA with 2 groups
B, T, S, H, HKV, D = 2, 40, 56, 4, 2, 16
BLOCKS = BlockSizes(block_q=16, block_k=16)
# the dq / dk-dv kernels on other tiles than the forward (the live mask is regridded)
BLOCKS_BWD = BlockSizes(block_q=32, block_k=32, block_q_dq=16, block_k_dq=64,
                        block_q_dkv=64, block_k_dkv=16)
LENGTHS = np.array([45, 0], np.int32)  # ragged; batch 1 has nothing to attend to
DEAD_TILE = 8


def solver_args(alpha, **overrides):
    """The kernel's solver settings as lcjax passes them: every value of the one
    ``SolverConfig`` (the kernel has no defaults of its own); ``alpha`` None or an array:
    a per-head α."""
    cfg = SolverConfig(**overrides)
    r = cfg.resolve(alpha if isinstance(alpha, float) else None, jnp.float32)
    return dict(solver=cfg.solver, n_iter=r.n_iter, bins=r.bins, tol=r.tol)


def _inputs(seed=0, temp=2.0):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (B, T, H, D)) * temp
    k = jax.random.normal(ks[1], (B, S, HKV, D)) * temp
    v = jax.random.normal(ks[2], (B, S, HKV, D))
    w = jax.random.normal(ks[3], (B, T, H, D))  # cotangent of the output
    return q, k, v, w


def _dead_key_block(n=32, tile=DEAD_TILE):
    """Non-causal q, k ~ 3·N(0, 1) [1, n, H, D], [1, n, HKV, D] except the last key block,
    k = 0 there: its scores are 0 while every row's max exceeds 1/(α-1) = 4 for the
    smallest α used (1.25), so z ≤ -1 ≤ τ there: no weight for any row or head (checked).
    ``poison``: v with that block set to 3e38 (finite); the cotangent w > 0."""
    rng = np.random.default_rng(12)
    q = np.asarray(3 * rng.standard_normal((1, n, H, D)), np.float32)
    k = np.asarray(3 * rng.standard_normal((1, n, HKV, D)), np.float32)
    k[:, n - tile:] = 0.0
    x = _dense_scores(jnp.asarray(q), jnp.asarray(k), causal=False, lengths=None)
    assert float(jnp.min(jnp.max(x, axis=-1))) > 4.5
    v = np.asarray(rng.standard_normal((1, n, HKV, D)), np.float32)
    poison = v.copy()
    poison[:, n - tile:] = 3e38
    w = np.abs(rng.standard_normal((1, n, H, D))) + 0.5
    return (jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(poison),
            jnp.asarray(w, jnp.float32))


def _dense_scores(q, k, *, causal, lengths, scale=None):
    """[B, H, T, S] scores x = scale·q·kᵀ with -inf where masked."""
    g = q.shape[2] // k.shape[2]
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    x = jnp.einsum("bthd,bshd->bhts", q, jnp.repeat(k, g, axis=2)) * scale
    t, s = q.shape[1], k.shape[1]
    mask = np.ones((q.shape[0], 1, t, s), bool)
    if causal:
        mask &= np.tril(np.ones((t, s), bool))
    if lengths is not None:
        mask &= (np.arange(s)[None, :] < np.asarray(lengths)[:, None])[:, None, None, :]
    return jnp.where(mask, x, -jnp.inf)


class _EntmaxAttentionTests:
    INTERPRET = False

    def _kernel(self, solver=None, **kw):
        solver = solver_args(kw.get("alpha", 1.5), **(solver or {}))
        return functools.partial(entmax_attention_pallas, interpret=self.INTERPRET, **solver,
                                 **kw)

    @pytest.mark.parametrize("alpha", [1.5, 2.0])
    @pytest.mark.parametrize("causal", [False, True])
    def test_forward_and_tau(self, alpha, causal):
        q, k, v, _ = _inputs()
        f = jax.jit(self._kernel(alpha=alpha, causal=causal, kv_lengths=LENGTHS,
                                 block_sizes=BLOCKS, return_aux=True))
        out, aux = f(q, k, v)
        ref = entmax_attention_reference(q, k, v, alpha=alpha, causal=causal,
                                         kv_lengths=LENGTHS)
        assert out.shape == (B, T, H, D)
        np.testing.assert_allclose(out, ref, atol=1e-5, rtol=0)
        # τ against the exact sort-based threshold (entmax convention on x = scale·q·kᵀ)
        x = _dense_scores(q, k, causal=causal, lengths=LENGTHS)
        tau_ref, _ = entmax_threshold(x, alpha, axis=-1, method="sort")
        tau_ref = jnp.swapaxes(tau_ref[..., 0], 1, 2)  # [B, T, H]
        np.testing.assert_allclose(aux["tau"][0], tau_ref[0], atol=1e-5, rtol=0)
        # the empty batch row: zeros, τ = +inf, no NaN, no live tile
        assert np.all(np.asarray(out[1]) == 0.0)
        assert np.all(np.isinf(aux["tau"][1])) and np.all(np.isinf(tau_ref[1]))
        assert not np.any(aux["live"][1])
        # sparsity: some tiles are skipped (beyond the length, above the diagonal, or dead)
        assert aux["live"].shape == (B, H, 3, 4)
        assert 0 < np.mean(aux["live"][0]) < 1
        # iterations per row (histogram: a few steps; 0 on the empty batch row) and the block
        # sparsity of the exact live tiles, counted at or below the causal diagonal
        assert aux["iterations"].shape == (B, T, H) and aux["iterations"].dtype == jnp.int32
        assert int(aux["iterations"].max()) <= 3 and not np.any(aux["iterations"][1])
        in_range = np.ones((3, 4), bool)
        if causal:
            in_range = np.arange(4)[None, :] * 16 <= (np.arange(3) * 16 + 15)[:, None]
        live = np.asarray(aux["live"])
        want = 1 - live[..., in_range].sum() / (B * H * in_range.sum())
        np.testing.assert_allclose(aux["block_sparsity"], want, rtol=1e-6)

    @pytest.mark.parametrize(
        "alpha,causal,blocks",
        [(1.5, True, BLOCKS), (2.0, False, BLOCKS_BWD), (1.5, False, BLOCKS_BWD),
         (2.0, True, BLOCKS)],
    )
    def test_gradients(self, alpha, causal, blocks):
        q, k, v, w = _inputs(seed=1)

        def loss(fn):
            return lambda q, k, v: jnp.sum(fn(q, k, v) * w)

        fk = self._kernel(alpha=alpha, causal=causal, kv_lengths=LENGTHS, block_sizes=blocks)
        fr = functools.partial(entmax_attention_reference, alpha=alpha, causal=causal,
                               kv_lengths=LENGTHS)
        val, grads = jax.jit(jax.value_and_grad(loss(fk), argnums=(0, 1, 2)))(q, k, v)
        val_r, grads_r = jax.jit(jax.value_and_grad(loss(fr), argnums=(0, 1, 2)))(q, k, v)
        np.testing.assert_allclose(val, val_r, atol=1e-4, rtol=1e-6)
        for name, g, gr in zip("qkv", grads, grads_r):
            assert np.all(np.isfinite(g)), name
            assert float(jnp.max(jnp.abs(gr))) > 1.0, name  # a non-trivial gradient
            np.testing.assert_allclose(g, gr, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")
        # the empty batch row receives and passes no gradient
        assert np.all(np.asarray(grads[0][1]) == 0.0)
        assert np.all(np.asarray(grads[1][1]) == 0.0) and np.all(np.asarray(grads[2][1]) == 0.0)

    def test_vmap_of_forward_and_gradients(self):
        """vmap over a leading axis (folded into the kernels' batch: Pallas's own batching
        rule would add a grid axis, which TPU refuses on the operands left in HBM) gives
        each instance's output and gradients, against the reference per instance."""
        q, k, v, w = _inputs(seed=5)
        stack = [jnp.stack([x[:1], x[1:]]) for x in (q, k, v, w)]  # [2, 1, ...]

        def loss(fn):
            return lambda q, k, v, w: jnp.sum(fn(q, k, v) * w)

        fk = self._kernel(causal=True, block_sizes=BLOCKS_BWD)
        fr = functools.partial(entmax_attention_reference, causal=True)
        vg = jax.jit(jax.vmap(jax.value_and_grad(loss(fk), argnums=(0, 1, 2))))
        val, grads = vg(*stack)
        for i in range(2):
            val_r, grads_r = jax.value_and_grad(loss(fr), argnums=(0, 1, 2))(
                *[x[i] for x in stack])
            np.testing.assert_allclose(val[i], val_r, atol=1e-4, rtol=1e-6)
            for name, g, gr in zip("qkv", grads, grads_r):
                np.testing.assert_allclose(g[i], gr, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")

    def test_other_alpha_bisection(self):
        q, k, v, _ = _inputs(seed=2)
        f = jax.jit(self._kernel(alpha=1.3, causal=True, kv_lengths=LENGTHS,
                                 block_sizes=BLOCKS))
        ref = entmax_attention_reference(q, k, v, alpha=1.3, causal=True, kv_lengths=LENGTHS)
        np.testing.assert_allclose(f(q, k, v), ref, atol=1e-4, rtol=0)

    @pytest.mark.parametrize("alpha,steps", [(1.5, 1), (2.0, 2)])
    def test_one_or_two_steps(self, alpha, steps):
        """After the histogram initialisation, 1 (α = 1.5) or 2 (α = 2) solver steps give
        τ to float32 rounding, on flat to peaked rows (one query block, 8 key tiles)."""
        n_t, n_s = 16, 1024
        ks = jax.random.split(jax.random.key(3), 3)
        q0 = jax.random.normal(ks[0], (1, n_t, 1, D))
        k = jax.random.normal(ks[1], (1, n_s, 1, D))
        v = jax.random.normal(ks[2], (1, n_s, 1, D))
        f = jax.jit(self._kernel(alpha=alpha, solver=dict(n_iter=steps), return_aux=True,
                                 block_sizes=BlockSizes(16, 128)))
        for temp in (0.1, 1.0, 20.0):
            q = q0 * temp
            _, aux = f(q, k, v)
            tau_ref, _ = entmax_threshold(_dense_scores(q, k, causal=False, lengths=None),
                                          alpha, axis=-1, method="sort")
            np.testing.assert_allclose(aux["tau"], jnp.swapaxes(tau_ref[..., 0], 1, 2),
                                       atol=2e-6, rtol=0, err_msg=f"temperature {temp}")

    def test_live_mask_keeps_weights_a_step_uncovers(self):
        """One Newton step (α = 2) from a histogram iterate above τ*: the final τ is lower
        than the τ the mask was measured at, and the only key of tile 3 (score -0.541) lies
        between them. A mask built at the measuring τ would drop that key's weight; the
        kernel's mask (threshold min(τ_build, τ_final)) keeps it."""
        n_t, n_s, bk = 8, 64, 16
        x = np.full(n_s, -10.0, np.float32)
        x[:3] = [0.0, -0.877, -0.697]  # tile 0
        x[16], x[32], x[48] = -0.091, -0.603, -0.541  # one key in each other tile
        q = jnp.zeros((1, n_t, 1, D)).at[..., 0].set(1.0)
        k = jnp.zeros((1, n_s, 1, D)).at[0, :, 0, 0].set(x)
        v = jnp.eye(n_s)[None, :, None, :]  # out = p itself
        # bins = 4 (the input is built for it); tol = 1: the first pass converges and takes
        # the polish step from τ_build
        f = jax.jit(self._kernel(alpha=2.0, scale=1.0, solver=dict(n_iter=1, tol=1.0, bins=4),
                                 return_aux=True, block_sizes=BlockSizes(16, bk)))
        out, aux = f(q, k, v)
        tau_b, tau_f = float(aux["tau_build"][0, 0, 0]), float(aux["tau"][0, 0, 0])
        tau_star = float(entmax_threshold(jnp.asarray(x), 2.0, method="sort")[0][0])
        # the polish step (clipped to the bracket: it lands on τ*) lowered τ past the key
        assert tau_f <= tau_star + 1e-6 and tau_star < x[48] <= tau_b - 1e-3
        naive_live = [bool(np.any(x[j * bk:(j + 1) * bk] > tau_b)) for j in range(4)]
        assert naive_live[3] is False
        assert bool(aux["live"][0, 0, 0, 3])
        p_dense = np.maximum(x - tau_f, 0.0)
        p_dense /= p_dense.sum()
        assert p_dense[48] > 1e-3 and float(out[0, 0, 0, 48]) > 1e-3
        np.testing.assert_allclose(out[0, :, 0], np.broadcast_to(p_dense, (n_t, n_s)),
                                   atol=1e-6, rtol=0)
        # every key with a nonzero weight lies in a live tile; the dead tile 2 is skipped
        nz_tiles = {j // bk for j in np.flatnonzero(p_dense > 0)}
        assert all(bool(aux["live"][0, 0, 0, j]) for j in nz_tiles)
        assert not bool(aux["live"][0, 0, 0, 2])


    def test_alpha_gradient_and_dead_tiles(self):
        """A per-head α [1.25, 1.5, 2.0, 1.75] (traced): out, dq, dk, dv and dα of the kernel
        equal the XLA path's (same array α), and dα equals central finite differences of the
        float64 dense reference (bisection to rounding). The same compiled gradient on v
        poisoned with 3e38 in a key block that holds no weight: if the dq or dk/dv kernel
        read that block, dO·vᵀ = inf and 0·inf = NaN; the gradients are bitwise those of
        the clean v."""
        q, k, v, poison, w = _dead_key_block()
        a0 = jnp.array([1.25, 1.5, 2.0, 1.75], jnp.float32)
        sizes = BlockSizes(DEAD_TILE, DEAD_TILE)

        def loss(fn):
            return lambda q, k, v, a: jnp.sum(fn(q, k, v, alpha=a) * w)

        kern = self._kernel(alpha=a0, block_sizes=sizes)
        xla = functools.partial(entmax_attention, implementation="xla", block_q=DEAD_TILE,
                                block_kv=DEAD_TILE)
        vg = jax.jit(jax.value_and_grad(loss(kern), argnums=(0, 1, 2, 3)))
        (val, grads), (val_p, grads_p) = vg(q, k, v, a0), vg(q, k, poison, a0)
        val_x, grads_x = jax.jit(jax.value_and_grad(loss(xla), argnums=(0, 1, 2, 3)))(
            q, k, v, a0)
        np.testing.assert_allclose(val, val_x, atol=1e-4, rtol=1e-6)
        for name, g, gx in zip(["q", "k", "v", "alpha"], grads, grads_x):
            assert float(jnp.max(jnp.abs(gx))) > 0.1, name  # a non-trivial gradient
            np.testing.assert_allclose(g, gx, atol=2e-4, rtol=1e-4, err_msg=f"d{name}")
        with jax.enable_x64(True):
            q64, k64, v64, w64 = (jnp.asarray(x, jnp.float64) for x in (q, k, v, w))
            ref = attention.spec("entmax").reference

            def ref_loss(a):
                return jnp.sum(ref(q64, k64, v64, alpha=a) * w64)

            eps = 1e-4
            steps = eps * jnp.eye(4, dtype=jnp.float64)
            a64 = jnp.asarray(a0, jnp.float64)
            fd = jax.jit(jax.vmap(lambda e: (ref_loss(a64 + e) - ref_loss(a64 - e)) / (2 * eps)))
            np.testing.assert_allclose(grads[3], fd(steps), atol=2e-4, rtol=2e-4)
        assert float(val_p) == float(val)
        for name, g, gp in zip(["q", "k", "v", "alpha"], grads, grads_p):
            assert bool(jnp.all(jnp.isfinite(gp))), name
            np.testing.assert_array_equal(g, gp, err_msg=f"d{name}")

    def test_reference_gradient_other_alpha(self):
        """The pure-jnp reference at α = 1.25 (bisection plus one implicit Newton step): its
        autodiff gradient equals that of lcjax's dense reference (bisection with the
        analytic entmax backward), which differentiating the bisection loop did not."""
        if self.INTERPRET is False:
            pytest.skip("pure jnp: runs once, with the interpreter tests")
        q, k, v, w = _inputs(seed=4)

        def loss(fn, **kw):
            return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, alpha=1.25, **kw) * w),
                                    argnums=(0, 1, 2)))

        ours = loss(entmax_attention_reference, causal=True, kv_lengths=LENGTHS)(q, k, v)
        mask = (np.arange(S)[None, :] < LENGTHS[:, None])[:, None, None, :]
        theirs = loss(attention.spec("entmax").reference, causal=True,
                      mask=jnp.asarray(mask))(q, k, v)
        for name, a, b in zip("qkv", ours, theirs):
            assert float(jnp.max(jnp.abs(b))) > 0.1, name
            np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5, err_msg=f"d{name}")


class TestEntmaxAttentionInterpret(_EntmaxAttentionTests):
    INTERPRET = True


class TestEntmaxAttentionTpuInterpret(_EntmaxAttentionTests):
    """The TPU form (K/V left in HBM, tiles copied into VMEM by async copies) in the TPU
    interpreter: forward, τ and gradients against the reference (the other tests run the
    generic form, whose arithmetic the TPU form shares)."""

    INTERPRET = "tpu"

    @pytest.fixture(autouse=True)
    def _only_numerics(self, request):
        if request.function.__name__ not in ("test_forward_and_tau", "test_gradients"):
            pytest.skip("the TPU form: forward and gradients only (interpret mode is slow)")


@pytest.mark.skipif(jax.default_backend() not in ("gpu", "tpu"), reason="needs a GPU or TPU")
class TestEntmaxAttentionDevice(_EntmaxAttentionTests):
    INTERPRET = False


class TestArguments:
    def test_errors(self):
        q = jnp.zeros((1, 8, 4, 16))
        k = jnp.zeros((1, 8, 2, 16))
        f = functools.partial(entmax_attention_pallas, **solver_args(1.5))
        for alpha in (1.0, 0.5, True, jnp.ones(3), jnp.array([2, 2, 2, 2]),
                      np.array([1.5, 0.9, 1.5, 1.5])):
            with pytest.raises(ValueError, match="alpha"):
                f(q, k, k, alpha=alpha, interpret=True)
        with pytest.raises(ValueError, match="alpha"):  # the reference is for a static α
            entmax_attention_reference(q, k, k, alpha=jnp.array(1.5))
        with pytest.raises(ValueError, match="heads"):
            f(q, jnp.zeros((1, 8, 3, 16)), jnp.zeros((1, 8, 3, 16)), interpret=True)
        with pytest.raises(ValueError, match="head_dim"):
            f(q, jnp.zeros((1, 8, 2, 8)), jnp.zeros((1, 8, 2, 8)), interpret=True)
        with pytest.raises(ValueError, match="rank 4"):
            f(q[0], k, k, interpret=True)
        with pytest.raises(ValueError, match="bins"):
            f(q, k, k, bins=3, interpret=True)
        with pytest.raises(ValueError, match="n_iter"):
            f(q, k, k, n_iter=-1, interpret=True)
        with pytest.raises(ValueError, match="kv_lengths"):
            f(q, k, k, kv_lengths=jnp.array([4, 4]), interpret=True)
        with pytest.raises(ValueError, match="block_q"):
            f(q, k, k, block_sizes=BlockSizes(24, 16), interpret=True)
        with pytest.raises(ValueError, match="block_k_dq"):
            f(q, k, k, block_sizes=BlockSizes(16, 16, block_k_dq=8), interpret=False)
        with pytest.raises(ValueError, match="block_k_dq"):
            f(q, k, k, block_sizes=BlockSizes(16, 16, block_k_dq=4), interpret=True)
        assert BlockSizes.get_default() == BlockSizes(128, 128)


# ----------------------------------------------------------------------------
# Lowering for real targets, from this CPU machine
# ----------------------------------------------------------------------------
LB, LT, LS, LH, LHKV, LD = 1, 256, 384, 4, 2, 128  # TPU-friendly: D = 128, 128-blocks
FORBIDDEN = {"sort", "cumsum", "cumlogsumexp", "cummax", "cummin", "cumprod",
             "scatter", "scatter-add", "scatter_add", "gather"}


def _lowering_fns(alpha):
    if alpha == "array":  # per-head α: the dynamic-α kernels and the dα output of dq
        alpha = jnp.array([1.25, 1.5, 2.0, 2.5], jnp.float32)
    kw = dict(alpha=alpha, causal=True, kv_lengths=np.array([300], np.int32),
              block_sizes=BlockSizes(128, 128), **solver_args(alpha))

    def fwd(q, k, v):
        return entmax_attention_pallas(q, k, v, **kw)

    def grad(q, k, v):
        return jax.grad(lambda q, k, v: jnp.sum(fwd(q, k, v).astype(jnp.float32)),
                        argnums=(0, 1, 2))(q, k, v)

    q = jnp.zeros((LB, LT, LH, LD), jnp.bfloat16)
    k = jnp.zeros((LB, LS, LHKV, LD), jnp.bfloat16)
    return fwd, grad, (q, k, k)


def _kernel_primitives(jaxpr):
    """Names of the primitives inside every pallas_call of a (closed) jaxpr."""
    found, kernels = set(), []

    def sub_jaxprs(eqn):
        for val in eqn.params.values():
            for item in val if isinstance(val, (tuple, list)) else (val,):
                if hasattr(item, "eqns"):
                    yield item
                elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
                    yield item.jaxpr

    def walk(jx, inside):
        for eqn in jx.eqns:
            is_kernel = eqn.primitive.name == "pallas_call"
            if is_kernel:
                kernels.append(eqn)
            if inside:
                found.add(eqn.primitive.name)
            for sub in sub_jaxprs(eqn):
                walk(sub, inside or is_kernel)

    walk(jaxpr.jaxpr, False)
    return found, len(kernels)


class TestLowering:
    @pytest.mark.parametrize("alpha", [1.5, 2.0, "array"])
    @pytest.mark.parametrize("platform", ["tpu", "cuda"])
    def test_forward_and_backward_lower(self, alpha, platform):
        fwd, grad, args = _lowering_fns(alpha)
        for fn, n_kernels in ((fwd, 1), (grad, 3)):
            text = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()
            marker = "@tpu_custom_call(" if platform == "tpu" else "@__gpu$xla.gpu.triton("
            # one Mosaic / Triton custom call per kernel: forward; forward, dq, dk-dv
            assert text.count(f"stablehlo.custom_call {marker}") == n_kernels, text[:2000]

    @pytest.mark.parametrize("alpha", [1.5, 2.0])  # the array-α kernels lower (above)
    def test_no_sort_cumsum_scatter_in_kernels(self, alpha):
        fwd, grad, args = _lowering_fns(alpha)
        for fn in (fwd, grad):
            prims, n = _kernel_primitives(jax.make_jaxpr(fn)(*args))
            assert n > 0 and "dot_general" in prims and "while" in prims
            assert not prims & FORBIDDEN, prims & FORBIDDEN

    @pytest.mark.parametrize("alpha", [1.5, "array"])
    def test_tpu_vmem_blocks_do_not_grow_with_the_sequence(self, alpha):
        """The TPU bodies (the pallas_calls with scratch: forward, dq, dk-dv) leave every
        sequence-long operand in HBM (memory space ANY): no block they pipeline into VMEM
        has a dimension above S/8 (16-tiles; the live flags are S/16 long), where the old
        kernels made K, V (and the group's Q, dO) resident, [S, D] blocks."""
        n, tiles = 512, BlockSizes(16, 16)

        def loss(q, k, v, a):
            out = entmax_attention_pallas(q, k, v, alpha=1.5 if alpha == 1.5 else a,
                                          causal=True, block_sizes=tiles,
                                          **solver_args(None if alpha == "array" else 1.5))
            return jnp.sum(out)

        q, k = jnp.ones((1, n, 4, 16)), jnp.ones((1, n, 2, 16))
        jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, k, jnp.ones(4) * 1.5)
        calls = []

        def walk(jx):
            for eqn in jx.eqns:
                if eqn.primitive.name == "pallas_call":
                    calls.append(eqn)
                for val in eqn.params.values():
                    for item in val if isinstance(val, (tuple, list)) else (val,):
                        sub = getattr(item, "jaxpr", item)
                        if hasattr(sub, "eqns"):
                            walk(sub)

        walk(jaxpr.jaxpr)
        tpu = [e for e in calls if e.params["grid_mapping"].num_scratch_operands > 0]
        assert sorted(e.params["name"] for e in tpu) == [
            "entmax_attention_dkv", "entmax_attention_dq", "entmax_attention_fwd"]
        in_hbm = 0
        for eqn in tpu:
            for bm in eqn.params["grid_mapping"].block_mappings:
                if str(bm.transformed_block_aval.memory_space) == "any":
                    in_hbm += 1
                    continue
                dims = [getattr(d, "block_size", 1) for d in bm.block_shape]
                assert max(dims) <= n // 8, (eqn.params["name"], dims)
        assert in_hbm == 2 + 2 + 6  # K, V (forward, dq); Q, dO and 4 row statistics (dk-dv)

    def test_lowering_check_rejects_sort(self):
        """Negative control: a kernel with a sort does not lower for either target, so the
        lowering test above would catch one."""
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import tpu as pltpu
        from jax.experimental.pallas import triton as plgpu

        def kernel(x_ref, o_ref):
            o_ref[...] = jnp.sort(x_ref[...], axis=1)

        x = jnp.zeros((8, 128), jnp.float32)
        for platform, params in (("tpu", pltpu.CompilerParams()),
                                 ("cuda", plgpu.CompilerParams(num_warps=4))):
            call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  compiler_params=params)
            with pytest.raises(Exception):  # noqa: B017 — each backend raises its own type
                jax.jit(call).trace(x).lower(lowering_platforms=(platform,))
