"""The attention contract under jax.shard_map on 8 CPU devices (set in conftest):
heads sharded, and keys sharded with partial results merged by log-sum-exp."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from lcjax.attention import blockwise_attention, dot_product_attention, merge_attention


def _mesh():
    assert jax.device_count() == 8, "conftest must provide 8 CPU devices"
    return jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))


def _qkv(t=32, h=8, hk=8, d=16):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    return (jax.random.normal(kq, (2, t, h, d)), jax.random.normal(kk, (2, t, hk, d)),
            jax.random.normal(kv, (2, t, hk, d)))


def test_heads_sharded_blockwise_equals_dense():
    mesh = _mesh()
    q, k, v = _qkv()
    spec = P(None, None, "x", None)
    q, k, v = (jax.device_put(x, NamedSharding(mesh, spec)) for x in (q, k, v))
    fn = functools.partial(blockwise_attention, causal=True, block_q=8, block_kv=8)
    sharded = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec))
    np.testing.assert_allclose(sharded(q, k, v), dot_product_attention(q, k, v, causal=True),
                               atol=1e-5)


def test_keys_sharded_and_merged_by_lse_equals_dense():
    """Each device attends to its slice of keys; an all-gather of (out, lse) and a fold
    of merge_attention gives exact attention over all keys."""
    mesh = _mesh()
    q, k, v = _qkv(t=64, h=4, hk=2)
    kv_spec = P(None, "x", None, None)

    def partial_then_merge(q, k, v):
        out, lse = blockwise_attention(q, k, v, block_q=16, block_kv=8, return_lse=True)
        outs = jax.lax.all_gather(out, "x")
        lses = jax.lax.all_gather(lse, "x")
        acc_out, acc_lse = outs[0], lses[0]
        for i in range(1, outs.shape[0]):
            acc_out, acc_lse = merge_attention(acc_out, acc_lse, outs[i], lses[i])
        return acc_out[None]  # every device holds the full result; keep one copy each

    want = dot_product_attention(q, k, v)
    ks, vs = (jax.device_put(x, NamedSharding(mesh, kv_spec)) for x in (k, v))
    qs = jax.device_put(q, NamedSharding(mesh, P()))
    f = jax.jit(jax.shard_map(partial_then_merge, mesh=mesh, in_specs=(P(), kv_spec, kv_spec),
                              out_specs=P("x")))
    per_device = np.asarray(f(qs, ks, vs))
    for i in range(8):
        np.testing.assert_allclose(per_device[i], want, atol=1e-5)


def test_grad_through_shard_map():
    mesh = _mesh()
    q, k, v = _qkv()
    spec = P(None, None, "x", None)
    fn = jax.shard_map(functools.partial(blockwise_attention, block_q=8, block_kv=8),
                       mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    place = lambda x: jax.device_put(x, NamedSharding(mesh, spec))
    g = jax.jit(jax.grad(lambda q: jnp.sum(jnp.sin(fn(q, place(k), place(v))))))(place(q))
    want = jax.jit(jax.grad(lambda q: jnp.sum(jnp.sin(dot_product_attention(q, k, v)))))(q)
    np.testing.assert_allclose(g, want, atol=1e-5)


def test_entmax_shard_map_over_heads_and_batch_fwd_and_grad():
    """α-entmax attention (XLA path) inside shard_map, heads and batch sharded: the solver's
    while_loop carries take the inputs' varying axes (blocks.match_varying), so it
    type-checks with the default check_vma; output and dq equal the unsharded call."""
    from lcjax.attention import entmax_attention

    mesh = jax.make_mesh((2, 4), ("b", "h"), axis_types=(AxisType.Explicit,) * 2)
    q, k, v = _qkv(t=20, h=8, hk=4, d=8)
    spec = P("b", None, "h", None)
    fn = functools.partial(entmax_attention, causal=True, block_q=8, block_kv=8,
                           implementation="xla")
    sharded = jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    place = lambda x: jax.device_put(x, NamedSharding(mesh, spec))
    np.testing.assert_allclose(jax.jit(sharded)(place(q), place(k), place(v)),
                               jax.jit(fn)(q, k, v), atol=1e-6)
    w = jax.random.normal(jax.random.PRNGKey(1), q.shape)
    g = jax.jit(jax.grad(lambda q: jnp.sum(w * sharded(q, place(k), place(v)))))(place(q))
    want = jax.jit(jax.grad(lambda q: jnp.sum(w * fn(q, k, v))))(q)  # one compile each
    np.testing.assert_allclose(g, want, atol=1e-5)
