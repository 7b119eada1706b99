"""`lcjax compile` / lcjax.compile_report: compile for a TPU topology from this CPU host.

Compiles only tiny shapes on v5e:2x2 (4 chips); the refusals are ValueErrors raised
before any compile.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
pytest.importorskip("libtpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from lcjax import aot  # noqa: E402
from lcjax import compile_report as cr  # noqa: E402
from lcjax.cli import main  # noqa: E402
from lcjax.parallel import layer  # noqa: E402

TINY = cr.ModelShape(d_model=256, num_heads=8, num_kv_heads=4, head_dim=32, mlp=512,
                     layers=2, vocab=1024)
TOPO = "v5e:2x2"


@pytest.mark.parametrize("strategy", ["upipe", "ring"])
def test_layer_compiles_for_a_pod_with_default_positions(strategy):
    """positions=None under an *explicit* mesh of TPU devices: the default positions are
    built per device inside shard_map (a global arange was rejected by shard_map)."""
    devices = aot.topology_devices(TOPO)
    mesh = Mesh(np.array(devices).reshape(1, 4), ("data", "context"),
                axis_types=(AxisType.Explicit,) * 2)
    init, apply = layer(strategy, mesh=mesh, d_model=256, num_heads=8, num_kv_heads=4,
                        head_dim=32, variant="blockwise", block_q=128, block_kv=128)
    params = jax.tree.map(lambda a: aot.struct(a.shape, a.dtype, mesh),
                          jax.eval_shape(init, jax.random.PRNGKey(0)))
    x = aot.struct((1, 2048, 256), "bfloat16", mesh, P("data", "context", None))

    def loss(p, x):
        return jnp.sum(apply(p, x).astype(jnp.float32))

    with jax.set_mesh(mesh):
        compiled = aot.compile_for(jax.grad(loss, argnums=(0, 1)), params, x)
    counts = cr.collective_counts(compiled.as_text())
    kind = "all-to-all" if strategy == "upipe" else "collective-permute"
    assert counts[kind] > 0, counts


def test_cli_compiles_a_custom_config(capsys, tmp_path):
    """`lcjax compile` on a user's shape: per-chip memory, HBM capacity, collectives; the
    arguments are exactly the replicated bf16 weights plus x and dy sharded over 4 chips."""
    out = tmp_path / "rep.json"
    argv = ["compile", "--d-model", "256", "--heads", "8", "--kv-heads", "4", "--head-dim",
            "32", "--mlp", "512", "--layers", "2", "--vocab", "1024", "--topology", TOPO,
            "--seq-len", "2048", "--strategy", "upipe", "--block", "128", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "16 GiB HBM" in text and "all-to-all" in text
    import json

    rep = json.loads(out.read_text())
    weights = sum(int(np.prod(s.shape)) * 2 for s in cr.layer_params(TINY).values())
    x_bytes = 2048 // 4 * 256 * 2
    args = rep["memory"]["argument_bytes"]
    assert weights + 2 * x_bytes <= args <= 1.05 * (weights + 2 * x_bytes) + 65536, args
    assert rep["fits"] and rep["collectives"]["all-to-all"] > 0
    assert rep["mesh"] == {"data": 1, "context": 4}


@pytest.mark.parametrize("kwargs, words", [
    (dict(topology="v9:2x2"), ["unknown TPU topology", "'v9:2x2'"]),
    (dict(seq_len=2050), ["T=2050", "multiple", "4"]),
    (dict(seq_len=2052, strategy="ring"), ["T=2052", "2 x", "8"]),
    (dict(seq_len=1 << 23, shape=cr.MODELS["llama3-8b"]), ["cannot fit", "GiB", "16 GiB"]),
    (dict(shape=cr.ModelShape(256, 6, 2, 32, 512, 2, 1024)), ["H=6", "C=4"]),
    (dict(mesh_axes=[("data", 1), ("context", 8)]), ["8", "4"]),
])
def test_bad_configurations_raise_before_compiling(kwargs, words, monkeypatch):
    def no_compile(*a, **k):
        raise AssertionError("compiled a configuration that should have been refused")

    monkeypatch.setattr(cr, "report_compiled", no_compile)
    args = dict(shape=TINY, topology=TOPO, seq_len=2048, strategy="upipe")
    args.update(kwargs)
    shape = args.pop("shape")
    with pytest.raises(ValueError) as err:
        cr.compile_report(shape, **args)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_collective_counts_reads_hlo_instructions():
    hlo = "\n".join([
        "  %a = bf16[8,128]{1,0} all-to-all(bf16[8,128]{1,0} %x), replica_groups={}",
        "  %s = (f32[4], f32[16]) all-gather-start(f32[4] %p), dimensions={0}",
        "  %d = f32[16] all-gather-done((f32[4], f32[16]) %s)",
        "  %r = f32[4] reduce-scatter(f32[16] %g), dimensions={0}",
        "  %c = bf16[2,8] collective-permute-start(bf16[2,8] %k), source_target_pairs={{0,1}}",
        "  %u = f32[] all-reduce(f32[] %l), to_apply=%add",
        "  %n = f32[] add(f32[] %all-reduce.1, f32[] %b)",
    ])
    assert cr.collective_counts(hlo) == {"all-to-all": 1, "all-gather": 1,
                                         "reduce-scatter": 1, "collective-permute": 1,
                                         "all-reduce": 1}


def test_tiled_mlp_equals_the_mlp_and_its_gradients_on_cpu():
    """tiled_swiglu (each chip's tokens in chunks, rematerialised) computes swiglu: values
    and gradients on a 4-device CPU mesh, random inputs."""
    mesh = jax.make_mesh((1, 4), ("data", "context"), devices=jax.devices("cpu")[:4])
    ks = jax.random.split(jax.random.PRNGKey(3), 4)
    h = jax.random.normal(ks[0], (2, 64, 16), jnp.float32)
    w = [jax.random.normal(k, s, jnp.float32) / 4 for k, s in
         zip(ks[1:], [(16, 24), (16, 24), (24, 16)])]
    tiled = cr.tiled_swiglu(mesh, "context", chunk=4)
    h_sharded = jax.device_put(h, jax.sharding.NamedSharding(mesh, P("data", "context", None)))
    w_rep = [jax.device_put(a, jax.sharding.NamedSharding(mesh, P())) for a in w]

    def loss(fn, h, *w):
        return jnp.sum(jnp.sin(fn(h, *w)))

    with jax.set_mesh(mesh):
        got, got_g = jax.value_and_grad(lambda *a: loss(tiled, *a),
                                        argnums=(0, 1, 2, 3))(h_sharded, *w_rep)
    want, want_g = jax.value_and_grad(lambda *a: loss(cr.swiglu, *a), argnums=(0, 1, 2, 3))(h, *w)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for g, r in zip(got_g, want_g):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="mlp_chunk=5"), jax.set_mesh(mesh):
        cr.tiled_swiglu(mesh, "context", chunk=5)(h_sharded, *w_rep)


def test_step_offloads_the_saved_layer_inputs_to_host_memory():
    """--offload: the step's saved layer inputs (L x [B, T/chips, d] bf16) are the host
    bytes of the compiled program, not HBM; the pre-compile bound leaves them out too."""
    rep = cr.compile_report(TINY, topology=TOPO, seq_len=2048, strategy="upipe", target="step",
                            block=128, offload=True, mlp_chunk=256)
    assert rep["fits"] and rep["offload"] and rep["mlp_chunk"] == 256
    assert rep["memory"]["host_bytes"] == TINY.layers * (2048 // 4) * TINY.d_model * 2
    kw = dict(seq_len=2048, batch=1, devices=4, target="step")
    saved = TINY.layers * (2048 // 4) * TINY.d_model * 2
    assert (cr.argument_bytes(TINY, **kw) - cr.argument_bytes(TINY, **kw, offload=True)
            == saved)
    with pytest.raises(ValueError, match="needs --target step"):  # one layer saves none
        cr.compile_report(TINY, topology=TOPO, seq_len=2048, strategy="upipe", target="layer",
                          offload=True)
