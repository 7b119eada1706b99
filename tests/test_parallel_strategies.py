"""Context parallelism on 8 CPU devices (conftest): every collective moves each element
where it belongs (rank-coded inputs), Ulysses / Ring / UPipe layers equal the one-device
layer in output and gradients, and bad configurations raise ValueError before tracing."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from lcjax.nn import Attention
from lcjax.parallel import (
    activation_sharding,
    from_zigzag,
    heads_to_seq,
    layer,
    make_mesh,
    replicate_kv,
    ring_attention,
    ring_shift,
    seq_to_heads,
    stage_heads,
    to_zigzag,
    ulysses_attention,
)


def _coded(b, t, h, d=2):
    """x[b, t, h, d] = 10000 b + 100 t + h + 0.01 d: every element names its place."""
    grid = jnp.meshgrid(jnp.arange(b), jnp.arange(t), jnp.arange(h), jnp.arange(d),
                        indexing="ij")
    return 10000.0 * grid[0] + 100.0 * grid[1] + grid[2] + 0.01 * grid[3]


def _local(mesh, fn, in_spec, out_spec):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(in_spec,), out_specs=out_spec))


# ----------------------------------------------------------------------------
# collectives, rank-coded
# ----------------------------------------------------------------------------
def test_all_to_all_moves_every_element_to_its_head_chunk_and_back():
    mesh = make_mesh(data=2, context=4)
    x = _coded(2, 16, 8)
    seq, heads = P("data", "context", None, None), P("data", None, "context", None)
    to_heads = _local(mesh, lambda a: seq_to_heads(a, "context"), seq, heads)
    y = to_heads(x)  # device r must hold heads [2r, 2r+2) of the whole sequence
    np.testing.assert_array_equal(y, x)
    for shard in y.addressable_shards:
        r = shard.index[2].start // 2
        np.testing.assert_array_equal(shard.data, x[shard.index[0], :, 2 * r:2 * r + 2])
    back = _local(mesh, lambda a: heads_to_seq(a, "context"), heads, seq)
    np.testing.assert_array_equal(back(y), x)


def test_kv_replication_gives_device_r_the_kv_head_of_its_query_heads():
    """Hkv = 2 < C = 8: device r must receive kv head r // 4 (query heads [r, r+1) of H = 8
    use kv head h // 4), i.e. standard GQA."""
    mesh = make_mesh(data=1, context=8)
    k = _coded(1, 16, 2)
    fn = _local(mesh, lambda a: seq_to_heads(replicate_kv(a, 4), "context"),
                P("data", "context", None, None), P("data", None, "context", None))
    out = np.asarray(fn(k))  # [1, 16, 8, 2]: head slot r = device r
    for r in range(8):
        np.testing.assert_array_equal(out[:, :, r], k[:, :, r // 4])


def test_zigzag_layout_and_ring_shift():
    c = 4
    mesh = make_mesh(data=2, context=c)
    x = _coded(2, 32, 1)[..., 0, 0]  # [B, T]: 10000 b + 100 t
    spec = P("data", "context")
    zig = _local(mesh, lambda a: to_zigzag(a, "context", c), spec, spec)(x)
    chunks = np.split(np.asarray(x), 2 * c, axis=1)
    want = np.concatenate([np.concatenate([chunks[r], chunks[2 * c - 1 - r]], 1)
                           for r in range(c)], 1)
    np.testing.assert_array_equal(zig, want)
    np.testing.assert_array_equal(
        _local(mesh, lambda a: from_zigzag(a, "context", c), spec, spec)(zig), x)
    for s in range(1, c + 1):
        shifted = _local(mesh, lambda a, s=s: functools.reduce(
            lambda t, _: ring_shift(t, "context", c), range(s), a), spec, spec)(x)
        blocks = np.split(np.asarray(x), c, axis=1)
        want = np.concatenate([blocks[(r - s) % c] for r in range(c)], 1)
        np.testing.assert_array_equal(shifted, want)  # device r holds block (r - s) mod C


@pytest.mark.parametrize("heads,kv_heads,context", [(32, 8, 8), (32, 32, 8), (8, 2, 8),
                                                    (16, 4, 4)])
def test_upipe_stage_heads_are_standard_gqa(heads, kv_heads, context):
    q, kv = stage_heads(heads, kv_heads, context)
    assert sorted(q.ravel().tolist()) == list(range(heads))  # each head in one stage
    g = heads // kv_heads
    for c in range(q.shape[0]):
        for i in range(context):
            assert (q[c, :, i] // g == kv[c, i]).all()


# ----------------------------------------------------------------------------
# equivalence with one device
# ----------------------------------------------------------------------------
D_MODEL, T = 32, 32


def _check_layer(strategy, mesh, heads, kv_heads, causal, variant="softmax", layer_opts=None,
                 **opts):
    """``opts`` go to the variant (both layers), ``layer_opts`` to the strategy only."""
    init, ref = layer("none", d_model=D_MODEL, num_heads=heads, num_kv_heads=kv_heads,
                      head_dim=8, causal=causal, variant=variant, **opts)
    _, apply = layer(strategy, mesh=mesh, d_model=D_MODEL, num_heads=heads,
                     num_kv_heads=kv_heads, head_dim=8, causal=causal, variant=variant,
                     **opts, **(layer_opts or {}))
    params = init(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, T, D_MODEL))
    w = jax.random.normal(jax.random.PRNGKey(2), x.shape)
    xs = jax.device_put(x, activation_sharding(mesh))  # P("data", <sequence axes>, None)
    loss = lambda f: (lambda p, x: jnp.sum(w * f(p, x)))
    both = lambda f: jax.jit(lambda p, x: (f(p, x), jax.grad(loss(f), (0, 1))(p, x)))
    y, g = both(apply)(params, xs)
    assert y.sharding.is_equivalent_to(activation_sharding(mesh), 3)
    y_ref, g_ref = both(ref)(params, x)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5 * float(jnp.abs(y_ref).max()))
    for got, want in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(got, want, rtol=1e-5,
                                   atol=1e-5 * float(jnp.abs(want).max()))


@pytest.mark.parametrize("strategy", ["ulysses", "ring", "upipe"])
def test_causal_mha_layer_equals_one_device(strategy):
    _check_layer(strategy, make_mesh(data=2, context=4), 8, 8, True)


@pytest.mark.parametrize("strategy", ["ulysses", "ring", "upipe"])
def test_bidirectional_gqa_kv_heads_below_context_equals_one_device(strategy):
    """Hkv = 2 < C = 8: kv heads replicated, their gradients summed."""
    _check_layer(strategy, make_mesh(data=1, context=8), 8, 2, False)


@pytest.mark.parametrize("strategy,context", [("ulysses", 4), ("upipe", 2)])
def test_entmax_inside_equals_one_device(strategy, context):
    """UPipe at C = 2 (H = 8, Hkv = 4): two kv chunks of two query stages each, so both
    stage indices of the weight slices and of the dW writes move."""
    mesh = make_mesh(data=2, context=context, devices=jax.devices()[:2 * context])
    _check_layer(strategy, mesh, 8, 4, True, variant="entmax", block_q=16, block_kv=16)


@pytest.mark.parametrize("causal,kv_heads,context,variant,save_out,save_kv", [
    (True, 8, 4, "blockwise", True, True),  # two kv chunks: outputs saved, K/V recomputed
    (False, 2, 8, "softmax", True, True),  # one chunk (Hkv < C): outputs and K/V saved
    (True, 2, 8, "blockwise", False, False),  # one chunk, everything recomputed
    (True, 2, 4, "entmax", True, True),  # no softmax backward: attention re-run, K/V saved
])
def test_upipe_residual_settings_equal_one_device(causal, kv_heads, context, variant,
                                                  save_out, save_kv):
    """UPipe's backward from saved stage outputs and LSEs (blockwise_attention_bwd, delta
    from the sequence layout), from the forward's K/V chunk, or recomputing either: the
    one-device layer's outputs and gradients (H = 8)."""
    mesh = make_mesh(data=8 // context, context=context)
    opts = {"blockwise": dict(block_q=8, block_kv=8), "entmax": dict(block_q=16, block_kv=16)}
    _check_layer("upipe", mesh, 8, kv_heads, causal, variant=variant,
                 layer_opts=dict(save_attention_output=save_out, save_kv=save_kv),
                 **opts.get(variant, {}))


def test_upipe_saves_outputs_only_for_exact_softmax_by_xla():
    """The saved-output backward is taken for the softmax variants by their XLA path (its
    options passed on to blockwise_attention_bwd) and never for others."""
    from lcjax.attention import blockwise_attention, get
    from lcjax.parallel.upipe import _softmax_backward_options as pick

    assert pick(get("blockwise"), {"block_q": 8}) == {"block_q": 8}
    assert pick(get("softmax"), {"implementation": "xla"}) == {}
    assert pick(blockwise_attention, {}) == {}
    assert pick(get("entmax"), {}) is None
    assert pick(get("jax"), {}) is None
    assert pick(get("blockwise"), {"implementation": "pallas"}) is None


def test_usp_layer_causal_gqa_equals_one_device():
    """layer("usp") on a data=2 x ring=2 x context=2 mesh (x sharded P("data", ("ring",
    "context"))), causal (zigzag over the ring), Hkv = 1 < U = 2 (replicated kv head)."""
    mesh = make_mesh(data=2, ring=2, context=2)
    assert mesh.axis_names == ("data", "ring", "context")
    _check_layer("usp", mesh, 4, 1, True)


def test_none_layer_is_lcjax_nn_attention():
    """The params pytree is nn.Attention's: same weights, same output."""
    attn = Attention(D_MODEL, 8, 2, 8, rngs=nnx.Rngs(0))
    params = {n: getattr(attn, n)[...] for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    x = jax.random.normal(jax.random.PRNGKey(1), (2, T, D_MODEL))
    _, apply = layer("none", d_model=D_MODEL, num_heads=8, num_kv_heads=2, head_dim=8)
    want, _ = attn(x, jnp.arange(T))
    np.testing.assert_allclose(apply(params, x), want, rtol=1e-5, atol=1e-6)


def test_attention_functions_with_gqa_and_blockwise_equal_dense():
    from lcjax.attention import dot_product_attention

    mesh = make_mesh(data=2, context=4)
    ks = jax.random.split(jax.random.PRNGKey(3), 3)
    q = jax.random.normal(ks[0], (2, 32, 4, 8))
    k, v = (jax.random.normal(kk, (2, 32, 2, 8)) for kk in ks[1:])
    want = dot_product_attention(q, k, v, causal=True)
    got_u = jax.jit(lambda *a: ulysses_attention(*a, mesh=mesh, causal=True,
                                                 variant="blockwise", block_q=8,
                                                 block_kv=8))(q, k, v)
    got_r = jax.jit(lambda *a: ring_attention(*a, mesh=mesh, causal=True, balance=None))(q, k, v)
    np.testing.assert_allclose(got_u, want, atol=1e-5)
    np.testing.assert_allclose(got_r, want, atol=1e-5)


# ----------------------------------------------------------------------------
# configuration errors, before tracing
# ----------------------------------------------------------------------------
def test_bad_configurations_raise_value_errors_naming_the_numbers():
    mesh = make_mesh(data=1, context=8)
    kw = dict(mesh=mesh, d_model=16, head_dim=8)
    with pytest.raises(ValueError, match=r"H=12 is not divisible by the context size C=8"):
        layer("ulysses", num_heads=12, num_kv_heads=12, **kw)
    with pytest.raises(ValueError, match=r"Hkv=3 must be a multiple of the context size C=8"):
        layer("upipe", num_heads=24, num_kv_heads=3, **kw)
    with pytest.raises(ValueError, match="strategy"):
        layer("tree", num_heads=8, num_kv_heads=8, **kw)
    init, apply = layer("ulysses", num_heads=8, num_kv_heads=8, **kw)
    params = init(jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match=r"T=20 is not a multiple of the context size 8"):
        apply(params, jnp.ones((1, 20, 16)))
    _, ring = layer("ring", num_heads=8, num_kv_heads=8, **kw)
    with pytest.raises(ValueError, match=r"T=24 is not a multiple of 2 x the context size 8"):
        ring(params, jnp.ones((1, 24, 16)))
    _, ring_entmax = layer("ring", num_heads=8, num_kv_heads=8, variant="entmax", **kw)
    with pytest.raises(ValueError, match="log-sum-exp"):
        ring_entmax(params, jnp.ones((1, 32, 16)))
    other = jax.make_mesh((8,), ("x",))
    with pytest.raises(ValueError, match=r"mesh has axes \['x'\], missing \['context'\]"):
        layer("upipe", num_heads=8, num_kv_heads=8, mesh=other, d_model=16, head_dim=8)
    with pytest.raises(ValueError, match=r"missing \['data', 'context'\]"):
        ulysses_attention(*(jnp.ones((1, 32, 8, 8)),) * 3, mesh=other)
    with pytest.raises(ValueError, match="no mesh"):
        ulysses_attention(*(jnp.ones((1, 32, 8, 8)),) * 3)
    with pytest.raises(ValueError, match=r"missing \['ring'\]"):
        layer("usp", num_heads=8, num_kv_heads=8, **kw)
    _, usp = layer("usp", num_heads=8, num_kv_heads=8, mesh=make_mesh(ring=2, context=4),
                   d_model=16, head_dim=8)
    with pytest.raises(ValueError, match=r"T=24 is not a multiple of 2 x the context size "
                                         r"\(ring 2 x ulysses 4\) 8 \(= 16\)"):
        usp(params, jnp.ones((1, 24, 16)))
    with pytest.raises(ValueError, match=r"batch B=3 is not a multiple of the data axis size 2"):
        layer("upipe", num_heads=8, num_kv_heads=8, mesh=make_mesh(data=2, context=4),
              d_model=16, head_dim=8)[1](params, jnp.ones((3, 32, 16)))


def test_usp_hybrid_ulysses_by_ring_equals_dense_fwd_and_grad():
    """Ulysses over a 2-axis, ring (zigzag) over a 4-axis; Hkv = 1 < U (replicated)."""
    from jax.sharding import AxisType

    from lcjax.attention import dot_product_attention
    from lcjax.parallel import usp_attention

    mesh = jax.make_mesh((4, 2), ("ring", "uly"), axis_types=(AxisType.Auto,) * 2)
    ks = jax.random.split(jax.random.PRNGKey(4), 4)
    q = jax.random.normal(ks[0], (1, 32, 4, 8))
    k, v = (jax.random.normal(kk, (1, 32, 1, 8)) for kk in ks[1:3])
    w = jax.random.normal(ks[3], q.shape)
    f = lambda q, k, v: usp_attention(q, k, v, mesh=mesh, ulysses_axis="uly",
                                      ring_axis="ring", causal=True)
    ref = lambda q, k, v: dot_product_attention(q, k, v, causal=True)
    np.testing.assert_allclose(jax.jit(f)(q, k, v), ref(q, k, v), atol=1e-5)
    g = jax.jit(jax.grad(lambda *a: jnp.sum(w * f(*a)), (0, 1, 2)))(q, k, v)
    g_ref = jax.jit(jax.grad(lambda *a: jnp.sum(w * ref(*a)), (0, 1, 2)))(q, k, v)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("chunks", [1, 4])
def test_accumulate_matmul_in_slices_equals_one_einsum(chunks):
    """UPipe's in-place accumulation of a stage's projection share, in sequence slices."""
    from lcjax.parallel import accumulate_matmul

    ks = jax.random.split(jax.random.PRNGKey(5), 3)
    acc = jax.random.normal(ks[0], (2, 16, 12))
    a = jax.random.normal(ks[1], (2, 16, 3, 4))
    w = jax.random.normal(ks[2], (12, 3, 4))
    got = jax.jit(lambda *t: accumulate_matmul(*t, "BTNH,DNH->BTD", chunks))(acc, a, w)
    want = np.asarray(acc) + np.einsum("btnh,dnh->btd", np.asarray(a), np.asarray(w))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_usp_mesh_axes_parse_and_errors():
    """make_mesh(ring=) adds the ring axis (ring-major sequence sharding); --mesh parses it;
    sizes that do not multiply to the device count name the numbers."""
    from lcjax.parallel import parse_mesh, sequence_axes, token_sharding

    mesh = make_mesh(data=2, ring=2)  # context takes the rest: 8 / (2 x 2) = 2
    assert dict(mesh.shape) == {"data": 2, "ring": 2, "context": 2}
    assert sequence_axes(mesh) == ("ring", "context")
    assert sequence_axes(make_mesh(data=2, context=4)) == "context"
    assert token_sharding(mesh).spec == P("data", ("ring", "context"))
    assert parse_mesh("data=2,ring=2,context=2") == {"data": 2, "ring": 2, "context": 2}
    with pytest.raises(ValueError, match=r"data \* ring \* context = 1 \* 3 \* 2 = 6 but 8"):
        make_mesh(ring=3, context=2)
    with pytest.raises(ValueError, match="ring must be a positive int"):
        make_mesh(ring=0)
