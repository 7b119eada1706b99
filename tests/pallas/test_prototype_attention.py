"""PLASH's query-to-enriched-prototype Pallas kernel (pallas_kernels/prototype_attention.py):
interpret mode against the pure-jnp reference on random tables (ragged sizes, several row
and prototype blocks), the whole PLASH call with the kernel against the XLA path (causal and
not, GQA, cross lengths, a key mask: output, log-sum-exp, certificate and the gradients in
q, k, v and the prototypes), bfloat16 without NaN, argument errors, and lowering for TPU
(Mosaic) and GPU (Triton) from this CPU."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcjax.attention import plash as P
from pallas_kernels.prototype_attention import (
    BlockSizes,
    Table,
    prototype_attention_pallas,
    prototype_attention_reference,
)

SMALL = BlockSizes(block_q=8, block_m=8)


def _table(seed, b=2, kk=2, rows=21, m=20, d=12, dv=10, dsk=6, degree=3, qscale=1.0):
    """Random rows q [B, K, R, d], a random but well-formed table (radius ≥ 0,
    0 ≤ τ ≤ radius², some empty prototypes) and the sketch w."""
    ks = iter(jax.random.split(jax.random.key(seed), 16))
    n = lambda *shape: jax.random.normal(next(ks), shape)
    u = lambda *shape: jax.random.uniform(next(ks), shape)
    radius = 2.0 * u(b, kk, m)
    table = Table(
        live=u(b, kk, m) > 0.2, logn=jnp.log(1.0 + 9.0 * u(b, kk, m)), protos=n(b, kk, m, d),
        mu=0.3 * n(b, kk, m, d), e=0.3 * n(b, kk, max(degree - 1, 1), m, dsk),
        u=n(b, kk, m, dv), g=0.5 * n(b, kk, m, dv, dsk), radius=radius,
        tau=radius ** 2 * u(b, kk, m), rho=2.0 * u(b, kk, m))
    w = P.plash_sketch(jax.random.key(seed + 1), degree, dsk, d)
    return qscale * n(b, kk, rows, d), table, w


def _close(got, want, tol, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want), err_msg=what)
    fin = np.isfinite(want)
    scale = max(1.0, float(np.abs(want[fin]).max(initial=0.0)))
    np.testing.assert_allclose(np.where(fin, got, 0), np.where(fin, want, 0), rtol=0,
                               atol=tol * scale, err_msg=what)


def _with_grads(fn, cot, cot_l):
    """One jitted function: fn's (out, lse) and the gradients of
    Σ out·cot + Σ lse·cot_l (finite lse only) in q and the table's mu, g, protos."""
    def both(q, table, w):
        def f(q, mu, g, protos):
            return fn(q, table._replace(mu=mu, g=g, protos=protos), w)
        res, pull = jax.vjp(f, q, table.mu, table.g, table.protos)
        return res, pull((cot, jnp.where(jnp.isfinite(res[1]), cot_l, 0.0)))
    return jax.jit(both)


@pytest.mark.parametrize("interpret,block_q_bwd", [(True, None), (True, 8), ("tpu", None)])
def test_interpret_kernel_equals_reference_forward_and_backward(interpret, block_q_bwd):
    """Ragged sizes (21 rows, 20 prototypes, d 12, dv 10, D 6) over 3 row blocks and 4
    prototype blocks, degree 3, a KV head with no live prototype; the backward in one step
    or scanned over 3 blocks of 8 rows (the last one padded); the Triton form (prototype
    loop in the program) and the Mosaic form (prototype blocks on a sequential grid axis
    with a scratch carry)."""
    degree = 3
    q, table, w = _table(0, degree=degree, qscale=2.0)
    table = table._replace(live=table.live.at[0, 1].set(False))  # a head with nothing live
    sizes = dataclasses.replace(SMALL, block_q_bwd=block_q_bwd)
    kern = functools.partial(prototype_attention_pallas, scale=0.4, degree=degree,
                             block_sizes=sizes, interpret=interpret)
    ref = functools.partial(prototype_attention_reference, scale=0.4, degree=degree)
    cot = jax.random.normal(jax.random.key(5), q.shape[:3] + (table.u.shape[-1],))
    cot_l = jax.random.normal(jax.random.key(6), q.shape[:3])
    ((out, lse), grads), ((out_r, lse_r), grads_r) = (
        _with_grads(fn, cot, cot_l)(q, table, w) for fn in (kern, ref))
    _close(out, out_r, 2e-5, "out")
    _close(lse, lse_r, 2e-5, "lse")
    assert np.isneginf(np.asarray(lse[0, 1])).all() and (np.asarray(out[0, 1]) == 0).all()
    assert float(jnp.std(out_r[1])) > 0.1  # a non-trivial output
    for name, a, b in zip(("q", "mu", "g", "protos"), grads, grads_r):
        _close(a, b, 1e-5, f"d{name}")


def _plash_inputs(seed, t, s, h=4, hk=2, d=16, m=20):
    kq, kk, kv, kp = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(kq, (2, t, h, d))
    k = jax.random.normal(kk, (2, s, hk, d))
    v = jax.random.normal(kv, (2, s, hk, d))
    return q, k, v, 1.2 * jax.random.normal(kp, (hk, m, d))


def test_pallas_path_equals_xla_path():
    """The whole causal call (the kernel inside the chunk scan; GQA, a ragged length, a
    key-only mask, several row and prototype blocks): output, lse, certificate and the
    gradients in q, k, v and the prototypes equal the XLA path's. (The non-causal path is
    the conformance suite's, and the bfloat16 test's.)"""
    causal = True
    t = s = 27
    q, k, v, protos = _plash_inputs(2, t, s)
    mask = jax.random.bernoulli(jax.random.key(9), 0.8, (2, 1, 1, s))
    opts = dict(degree=2, sketch_dim=8, chunk=8, causal=causal, mask=mask, return_lse=True,
                return_aux=True)
    cot = jax.random.normal(jax.random.key(3), q.shape)

    def run(impl, **kw):
        def both(q, k, v, protos):
            f = lambda *a: P.plash_attention(*a, implementation=impl, **opts, **kw)
            (out, lse), aux = f(q, k, v, protos)
            grads = jax.grad(lambda *a: jnp.sum(f(*a)[0][0] * cot), argnums=(0, 1, 2, 3))(
                q, k, v, protos)
            return out, lse, aux["certificate"], grads
        return jax.jit(both)(q, k, v, protos)

    out, lse, cert, grads = run("pallas", block_q=8, block_m=8, interpret=True)
    out_x, lse_x, cert_x, grads_x = run("xla")
    _close(out, out_x, 2e-5, "out")
    _close(lse, lse_x, 2e-5, "lse")
    _close(cert, cert_x, 1e-4, "certificate")
    assert float(jnp.max(cert_x)) > 0  # compressed rows exist
    for name, a, b in zip("qkvp", grads, grads_x):
        _close(a, b, 1e-4, f"d{name}")


def test_bfloat16_is_finite_and_close():
    q, k, v, protos = _plash_inputs(4, 21, 21, m=12)
    lo = lambda x: x.astype(jnp.bfloat16)
    opts = dict(degree=2, sketch_dim=8)
    out = jax.jit(functools.partial(P.plash_attention, implementation="pallas",
                                    interpret=True, block_q=8, block_m=8, **opts))(
        lo(q), lo(k), lo(v), protos)
    ref = jax.jit(functools.partial(P.plash_attention, **opts))(
        *(lo(x).astype(jnp.float32) for x in (q, k, v)), protos)
    assert out.dtype == jnp.bfloat16 and np.isfinite(np.asarray(out, np.float32)).all()
    _close(out.astype(jnp.float32), ref, 3e-2, "bf16")


def test_argument_errors():
    q, table, w = _table(2, degree=2)
    call = functools.partial(prototype_attention_pallas, scale=0.3, degree=2, interpret=True)
    with pytest.raises(ValueError, match="block_m"):
        jax.eval_shape(functools.partial(call, block_sizes=BlockSizes(8, 12)), q, table, w)
    with pytest.raises(ValueError, match="table.mu"):
        jax.eval_shape(call, q, table._replace(mu=table.mu[..., :5]), w)
    with pytest.raises(ValueError, match="`w`"):
        jax.eval_shape(functools.partial(call, degree=3), q,
                       table._replace(e=jnp.zeros(table.e.shape[:2] + (2,) + table.e.shape[3:])),
                       w)
    with pytest.raises(ValueError, match="block_q"):
        P.PlashKernelConfig(block_q=24)
    with pytest.raises(ValueError, match="block_q_bwd"):
        jax.eval_shape(functools.partial(call, block_sizes=BlockSizes(8, 8, 12)), q, table, w)
    with pytest.raises(ValueError, match="interpret"):
        jax.eval_shape(functools.partial(call, interpret="gpu"), q, table, w)
    with jax.enable_x64(True):  # the kernel computes in float32: float64 is declined
        x = jnp.ones((1, 8, 2, 16), jnp.float64)
        with pytest.raises(NotImplementedError, match="float64"):
            P.PLASH(x, x, x, implementation="pallas", num_prototypes=2)


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_lowers_for_real_targets(platform):
    q, table, w = _table(3, b=1, kk=2, rows=128, m=32, d=64, dv=64, dsk=32, degree=2)
    f = functools.partial(prototype_attention_pallas, scale=0.125, degree=2)
    text = jax.jit(f).trace(q, table, w).lower(lowering_platforms=(platform,)).as_text()
    assert "tpu_custom_call" in text or "triton" in text or "plash_prototype" in text
