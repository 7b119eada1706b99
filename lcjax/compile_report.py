"""Compile one decoder layer or a whole training step for a named TPU topology, from any
host, and report what the TPU compiler says: per-chip HBM, compile time, collectives.

Nothing is materialised: parameters, optimizer state and activations are
``jax.ShapeDtypeStruct``s placed on the topology's devices (:mod:`lcjax.aot`), and
``jax.jit(step).trace(*structs).lower().compile()`` runs libtpu's compiler (an HBM overflow
is its ``RESOURCE_EXHAUSTED`` error, reported here as ``fits=False``).

    shape = MODELS["llama3-8b"]
    rep = compile_report(shape, topology="v5p:2x2x2", seq_len=131072, strategy="upipe",
                         target="layer")        # or target="step": the whole model
    rep["memory"]["total_bytes"], rep["fits"], rep["collectives"]["all-to-all"]

Targets (batch B, length T, mesh axes ``data`` x ``context`` [x ``ring`` for usp]):

- ``"layer"``: one Llama decoder layer, fwd+bwd (``value_and_grad`` of Σ y·dy):
  h = x + attn(rmsnorm(x)), y = h + W_down(silu(h W_gate) * (h W_up)), attention by the
  context-parallel ``strategy`` (:func:`lcjax.parallel.layer_apply`, blockwise softmax
  inside); weights bf16 replicated, x and dy bf16 sharded ``P(data, seq, None)``.
- ``"step"``: a training step of the whole decoder LM: embedding, ``lax.scan`` over the
  layers (each ``jax.checkpoint``ed with nothing saveable, so only the layer inputs are
  kept: L x [B, T/C, d] bf16 per chip), final norm, cross-entropy over the vocabulary in
  sequence chunks (no [T, V] logits), AdamW (optax). Parameters fp32 and the optimizer's
  moments sharded over all chips (FSDP/ZeRO-3: each weight's d_model or MLP dimension
  over ``(data, context[, ring])``), gathered to bf16 per layer inside the scan;
  parameters and optimizer state donated.

Checks before compiling (``ValueError`` naming the numbers, :func:`check_config`): the
topology name, the mesh against its chip count, the length against the context axis
(T % C; ring with zigzag: T % 2C), the heads against the context axis (Ulysses, UPipe,
USP), and a lower bound on the bytes per chip — the step's arguments (parameters,
moments, the saved layer inputs) or the layer's (x, dy, weights) — against the chip's
HBM: a length whose arguments alone exceed HBM cannot fit and is refused before any
compile. Beyond that bound, whether it fits is the compiler's answer.

Collectives are counted in the compiled HLO text (instructions, each counted once — one
inside a ``while`` body runs once per trip).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lcjax import aot
from lcjax.nn.layers import rms_norm
from lcjax.parallel import CONTEXT, DATA, RING, layer_apply, parse_mesh
from lcjax.parallel.validation import check_heads, check_length, check_positive

__all__ = ["COLLECTIVES", "MODELS", "STRATEGIES", "ModelShape", "add_arguments", "check_config",
           "collective_counts", "compile_report", "default_mesh_axes", "format_report",
           "layer_step", "report_compiled", "run", "shape_from_args",
           "train_step"]

COLLECTIVES = ("all-to-all", "all-gather", "reduce-scatter", "collective-permute",
               "all-reduce")
STRATEGIES = ("ulysses", "ring", "upipe", "usp")
TARGETS = ("layer", "step")
GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A Llama-style decoder's shapes: d_model, heads (query, key/value), head_dim, the
    MLP's hidden width, layers and vocabulary (GQA attention, SwiGLU MLP, RMSNorm)."""

    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp: int
    layers: int
    vocab: int

    def __post_init__(self):
        check_positive("ModelShape", **dataclasses.asdict(self))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelShape: num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")

    def param_count(self) -> int:
        """Parameters: L (attention + MLP + 2 norms) + embedding + head + final norm."""
        d, a = self.d_model, self.head_dim
        attn = d * a * (2 * self.num_heads + 2 * self.num_kv_heads)
        return (self.layers * (attn + 3 * d * self.mlp + 2 * d) + 2 * self.vocab * d + d)


# Public model cards' shapes (Qwen3's q/k norms are left out: d_model-sized, no memory).
MODELS = {
    "llama3-8b": ModelShape(4096, 32, 8, 128, 14336, 32, 128256),
    "llama3-70b": ModelShape(8192, 64, 8, 128, 28672, 80, 128256),
    "qwen3-4b": ModelShape(2560, 32, 8, 128, 9728, 36, 151936),
}


def default_mesh_axes(strategy: str, devices: int) -> list[tuple[str, int]]:
    """All chips on the context axis (``data`` 1); usp: a ring of 2 (8 when there are 64
    or more chips) times Ulysses over the rest."""
    if strategy == "usp":
        ring = 8 if devices >= 64 else 2
        if devices % ring:
            raise ValueError(f"usp: {devices} devices are not a multiple of ring={ring}")
        return [(DATA, 1), (RING, ring), (CONTEXT, devices // ring)]
    return [(DATA, 1), (CONTEXT, devices)]


def _seq_axes(axes: Mapping[str, int]):
    return (RING, CONTEXT) if RING in axes else CONTEXT


def check_config(shape: ModelShape, *, topology: str, seq_len: int, strategy: str,
                 target: str = "layer", batch: int = 1, mesh_axes=None,
                 offload: bool = False) -> list[tuple]:
    """``ValueError`` naming the numbers for a configuration that cannot compile or cannot
    fit (module docstring); returns the mesh axes [(name, size), ...]."""
    if strategy not in STRATEGIES:
        raise ValueError(f"compile: `strategy` must be one of {STRATEGIES}, got {strategy!r}")
    if target not in TARGETS:
        raise ValueError(f"compile: `target` must be one of {TARGETS}, got {target!r}")
    check_positive("compile", seq_len=seq_len, batch=batch)
    devices = len(aot.topology_devices(topology))  # ValueError for an unknown topology
    axes = list(mesh_axes) if mesh_axes else default_mesh_axes(strategy, devices)
    sizes = dict(axes)
    if int(np.prod(list(sizes.values()))) != devices:
        raise ValueError(f"compile: mesh {sizes} has {int(np.prod(list(sizes.values())))} "
                         f"devices, topology {topology!r} has {devices}")
    if strategy == "usp" and RING not in sizes:
        raise ValueError(f"compile: strategy 'usp' needs a 'ring' mesh axis, got {sizes}")
    name = f"compile({strategy!r})"
    c = sizes.get(CONTEXT, 1) * (sizes.get(RING, 1) if strategy == "usp" else 1)
    zigzag = 2 if strategy in ("ring", "usp") else 1
    check_length(name, seq_len, c, multiple=zigzag, what="sequence-parallel degree")
    if batch % sizes.get(DATA, 1):
        raise ValueError(f"{name}: batch B={batch} is not a multiple of the data axis "
                         f"size {sizes.get(DATA, 1)}")
    if strategy in ("ulysses", "upipe", "usp"):
        check_heads(name, shape.num_heads, shape.num_kv_heads, sizes.get(CONTEXT, 1))
    need, hbm = argument_bytes(shape, seq_len=seq_len, batch=batch, devices=devices,
                               target=target, offload=offload), aot.hbm_bytes_per_chip(topology)
    if need > hbm:
        raise ValueError(f"{name}: T={seq_len} cannot fit: the {target}'s arguments alone "
                         f"need {need / GiB:.1f} GiB per chip, over the {hbm / GiB:.0f} GiB "
                         f"of HBM of a {topology.split(':')[0]} chip")
    return axes


def argument_bytes(shape: ModelShape, *, seq_len: int, batch: int, devices: int,
                   target: str, offload: bool = False) -> int:
    """A lower bound on the bytes per chip: ``"layer"``: x and dy (bf16, sharded) and the
    layer's bf16 weights (replicated); ``"step"``: parameters + two AdamW moments (fp32,
    sharded over every chip) and the saved layer inputs (bf16, L x [B, T, d] / chips;
    not counted with ``offload``: they live in host memory)."""
    tokens = batch * seq_len // devices
    if target == "layer":
        one = shape.param_count() - 2 * shape.vocab * shape.d_model - shape.d_model
        return 2 * 2 * tokens * shape.d_model + 2 * one // shape.layers
    saved = 0 if offload else 2 * shape.layers * tokens * shape.d_model
    return 12 * shape.param_count() // devices + saved


def layer_params(shape: ModelShape, dtype=jnp.bfloat16, layers: int | None = None) -> dict:
    """``ShapeDtypeStruct``s (no sharding) of one decoder layer's weights, or of ``layers``
    of them stacked on a leading axis: attention as :func:`lcjax.parallel.layer`'s
    (q_proj [d, H, D], ...), MLP gate/up [d, F], down [F, d], two RMSNorm scales [d]."""
    d, h, k, a, f = (shape.d_model, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                     shape.mlp)
    shapes = {"q_proj": (d, h, a), "k_proj": (d, k, a), "v_proj": (d, k, a),
              "o_proj": (h, a, d), "gate": (d, f), "up": (d, f), "down": (f, d),
              "attn_norm": (d,), "mlp_norm": (d,)}
    lead = () if layers is None else (layers,)
    return {n: jax.ShapeDtypeStruct(lead + s, dtype) for n, s in shapes.items()}


def swiglu(h, gate, up, down):
    """SwiGLU MLP: (silu(h W_gate) * (h W_up)) W_down, h [..., d] -> [..., d]."""
    dt = h.dtype
    return (jax.nn.silu(h @ gate.astype(dt)) * (h @ up.astype(dt))) @ down.astype(dt)


def tiled_swiglu(mesh, seq, chunk: int) -> Callable:
    """:func:`swiglu` inside ``shard_map``, each chip's tokens ``chunk`` at a time, each
    chunk rematerialised in the backward (ALST's tiled MLP): the [tokens, F] hidden
    activations exist for one chunk at a time, never for the chip's whole slice."""

    def local(h, gate, up, down):
        b, n, d = h.shape
        size = min(chunk, n)
        if n % size:
            raise ValueError(f"tiled MLP: the {n} tokens per chip are not a multiple of "
                             f"mlp_chunk={size}")
        hs = h.reshape(b, n // size, size, d).swapaxes(0, 1)
        one = jax.checkpoint(lambda x: swiglu(x, gate, up, down))
        return lax.map(one, hs).swapaxes(0, 1).reshape(b, n, d)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(DATA, seq, None), P(), P(), P()),
                         out_specs=P(DATA, seq, None), check_vma=False)


def _decoder_layer(p, x, *, strategy, mesh, block, attn_options, mlp=swiglu):
    """x [B, T, d] -> y: pre-norm attention then SwiGLU MLP (``mlp``), both residual."""
    h = rms_norm(x, p["attn_norm"])
    x = x + layer_apply(strategy, p, h, mesh=mesh, causal=True, variant="blockwise",
                        block_q=block, block_kv=block, **attn_options).astype(x.dtype)
    h = rms_norm(x, p["mlp_norm"])
    return x + mlp(h, p["gate"], p["up"], p["down"])


def _layer_fn(mesh, *, strategy, block, mlp_chunk):
    axes = dict(zip(mesh.axis_names, mesh.devices.shape))
    mlp = swiglu if mlp_chunk is None else tiled_swiglu(mesh, _seq_axes(axes), mlp_chunk)
    return functools.partial(_decoder_layer, strategy=strategy, mesh=mesh, block=block,
                             attn_options=_attn_options(strategy, axes), mlp=mlp)


def _attn_options(strategy: str, axes: Mapping[str, int]) -> dict:
    return {"ring_axis": RING} if strategy == "usp" else {}


def layer_step(shape: ModelShape, mesh, *, strategy: str, seq_len: int, batch: int = 1,
               block: int = 512, mlp_chunk: int | None = None, offload: bool = False
               ) -> tuple[Callable, tuple]:
    """(fn, argument structs) of one decoder layer's fwd+bwd on ``mesh``:
    ``value_and_grad`` of Σ y·dy in fp32 with respect to the weights and x. ``mlp_chunk``:
    the MLP tiled over each chip's tokens (:func:`tiled_swiglu`); ``offload`` concerns the
    step's saved layer inputs, so it is refused here (ValueError)."""
    if offload:
        raise ValueError("compile: --offload moves the training step's saved layer inputs to "
                         "host memory; it needs --target step (one layer saves none)")
    axes = dict(zip(mesh.axis_names, mesh.devices.shape))
    seq = _seq_axes(axes)
    rep = NamedSharding(mesh, P())
    params = {n: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep)
              for n, s in layer_params(shape).items()}
    x = jax.ShapeDtypeStruct((batch, seq_len, shape.d_model), jnp.bfloat16,
                             sharding=NamedSharding(mesh, P(DATA, seq, None)))
    layer_fn = _layer_fn(mesh, strategy=strategy, block=block, mlp_chunk=mlp_chunk)

    def loss(p, x, dy):
        return jnp.sum(layer_fn(p, x).astype(jnp.float32) * dy.astype(jnp.float32))

    return jax.value_and_grad(loss, argnums=(0, 1)), (params, x, x)


def _fsdp_spec(shape_: tuple, mesh_axes: tuple, size: int, stacked: bool) -> P:
    """Shard the first dimension (after the layer axis) divisible by the chip count."""
    lead = 1 if stacked else 0
    for i in range(lead, len(shape_)):
        if shape_[i] % size == 0:
            return P(*([None] * i), mesh_axes)
    return P()


def _model_params(shape: ModelShape) -> dict:
    return {"embed": jax.ShapeDtypeStruct((shape.vocab, shape.d_model), jnp.float32),
            "layers": layer_params(shape, jnp.float32, layers=shape.layers),
            "final_norm": jax.ShapeDtypeStruct((shape.d_model,), jnp.float32),
            "head": jax.ShapeDtypeStruct((shape.d_model, shape.vocab), jnp.float32)}


def _chunked_loss(mesh, seq, chunk: int):
    """Σ cross-entropy of h [B, T, d] against targets [B, T] through the head [d, V],
    inside ``shard_map`` (each device its slice), ``chunk`` tokens at a time, each chunk
    rematerialised in the backward: logits are [B, chunk, V] at a time, never [T, V]."""
    all_axes = tuple(mesh.axis_names)

    def local(h, targets, w):
        b, n, d = h.shape
        size = min(chunk, n)
        hs = h.reshape(b, n // size, size, d).swapaxes(0, 1)
        ts = targets.reshape(b, n // size, size).swapaxes(0, 1)

        @jax.checkpoint
        def one(h_c, t_c):
            logits = (h_c @ w).astype(jnp.float32)
            gold = jnp.take_along_axis(logits, t_c[..., None], -1)[..., 0]
            return jnp.sum(jax.nn.logsumexp(logits, -1) - gold)

        total = lax.map(lambda a: one(*a), (hs, ts)).sum()
        return lax.psum(total, all_axes)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(DATA, seq, None), P(DATA, seq), P()),
                         out_specs=P(), check_vma=False)


def train_step(shape: ModelShape, mesh, *, strategy: str, seq_len: int, batch: int = 1,
               block: int = 512, loss_chunk: int = 1024, learning_rate: float = 1e-4,
               mlp_chunk: int | None = None, offload: bool = False
               ) -> tuple[Callable, tuple]:
    """(fn, argument structs) of one AdamW training step of the whole model on ``mesh``
    (module docstring): fn(params, opt_state, tokens, targets) -> (params, opt_state,
    loss). ``mlp_chunk``: the MLP tiled over each chip's tokens (:func:`tiled_swiglu`);
    ``offload``: the saved layer inputs (L x [B, T/C, d]) go to the host's pinned memory
    in the forward and come back layer by layer in the backward (ALST's checkpoint
    offload), instead of staying in HBM."""
    import optax

    axes = dict(zip(mesh.axis_names, mesh.devices.shape))
    seq, every = _seq_axes(axes), tuple(mesh.axis_names)
    size = int(np.prod(mesh.devices.shape))
    rep = NamedSharding(mesh, P())

    def place(s, stacked=False):
        spec = _fsdp_spec(s.shape, every, size, stacked)
        return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, spec))

    raw = _model_params(shape)
    params = {"embed": place(raw["embed"]), "final_norm": place(raw["final_norm"]),
              "head": place(raw["head"]),
              "layers": {n: place(s, stacked=True) for n, s in raw["layers"].items()}}
    optimizer = optax.adamw(learning_rate)
    opt_state = jax.eval_shape(optimizer.init, params)
    by_shape = {}
    for leaf in jax.tree.leaves(params):
        by_shape.setdefault((leaf.shape, leaf.dtype), leaf.sharding)
    opt_state = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                       sharding=by_shape.get((s.shape, s.dtype), rep)),
        opt_state)
    tokens = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32,
                                  sharding=NamedSharding(mesh, P(DATA, seq)))
    layer_fn = _layer_fn(mesh, strategy=strategy, block=block, mlp_chunk=mlp_chunk)
    loss_fn = _chunked_loss(mesh, seq, loss_chunk)
    policy = (jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["layer_input"],
        offload_src="device", offload_dst="pinned_host") if offload
        else jax.checkpoint_policies.nothing_saveable)

    def gathered(w):  # FSDP: this layer's weight, bf16, on every chip
        return lax.with_sharding_constraint(w.astype(jnp.bfloat16), rep)

    def loss(params, tokens, targets):
        x = jnp.take(gathered(params["embed"]), tokens, axis=0)
        x = lax.with_sharding_constraint(x, NamedSharding(mesh, P(DATA, seq, None)))

        @functools.partial(jax.checkpoint, policy=policy)
        def body(x, p):
            x = checkpoint_name(x, "layer_input")
            return layer_fn(jax.tree.map(gathered, p), x), None

        x, _ = lax.scan(body, x, params["layers"])
        h = rms_norm(x, gathered(params["final_norm"]))
        return loss_fn(h, targets, gathered(params["head"])) / (batch * seq_len)

    def step(params, opt_state, tokens, targets):
        value, grads = jax.value_and_grad(loss)(params, tokens, targets)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step, (params, opt_state, tokens, tokens)


_COLLECTIVE_RE = re.compile(r"=\s*[^=]*?\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")


def collective_counts(hlo_text: str) -> dict[str, int]:
    """Collective instructions in compiled HLO text by kind (an async pair's ``-start``
    counted once, its ``-done`` not)."""
    counts = dict.fromkeys(COLLECTIVES, 0)
    for line in hlo_text.splitlines():
        match = _COLLECTIVE_RE.search(line)
        if match:
            counts[match.group(1)] += 1
    return counts


def _out_of_memory(err: Exception) -> bool:
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text


def report_compiled(fn: Callable, *args, topology: str, donate_argnums=()) -> dict:
    """Compile ``fn`` on ``args`` (structs placed on ``topology``'s devices) and report:
    ``memory`` (:func:`lcjax.aot.memory_report`), ``compile_s``, ``collectives``
    (:func:`collective_counts`), ``fits`` (total ≤ the chip's HBM). A compile that runs
    out of HBM gives ``fits=False`` and its ``error`` (first line), no memory."""
    start = time.perf_counter()
    try:
        compiled = jax.jit(fn, donate_argnums=donate_argnums).trace(*args).lower().compile()
    except Exception as err:  # noqa: BLE001 — only the compiler's HBM overflow is an answer
        if not _out_of_memory(err):
            raise
        return {"topology": topology, "compile_s": time.perf_counter() - start,
                "fits": False, "memory": None, "collectives": None,
                "error": str(err).strip().splitlines()[0][:400]}
    seconds = time.perf_counter() - start
    memory = aot.memory_report(compiled, topology)
    return {"topology": topology, "compile_s": seconds,
            "fits": memory["total_bytes"] <= memory["hbm_bytes"], "memory": memory,
            "collectives": collective_counts(compiled.as_text())}


def compile_report(shape: ModelShape | str, *, topology: str, seq_len: int, strategy: str,
                   target: str = "layer", batch: int = 1, mesh_axes=None, block: int = 512,
                   mlp_chunk: int | None = None, offload: bool = False) -> dict:
    """Check (:func:`check_config`), build (:func:`layer_step` / :func:`train_step`) and
    compile one configuration; the report of :func:`report_compiled` plus the settings.
    ``mlp_chunk`` / ``offload``: the long-context recipe (tiled MLP, layer inputs
    offloaded to the host; :func:`train_step`)."""
    if isinstance(shape, str):
        if shape not in MODELS:
            raise ValueError(f"compile: unknown model {shape!r}; known: {sorted(MODELS)}")
        shape = MODELS[shape]
    axes = check_config(shape, topology=topology, seq_len=seq_len, strategy=strategy,
                        target=target, batch=batch, mesh_axes=mesh_axes, offload=offload)
    if mlp_chunk is not None:
        check_positive("compile", mlp_chunk=mlp_chunk)
    mesh = aot.topology_mesh(topology, axes)
    build = layer_step if target == "layer" else train_step
    fn, args = build(shape, mesh, strategy=strategy, seq_len=seq_len, batch=batch,
                     block=block, mlp_chunk=mlp_chunk, offload=offload)
    rep = report_compiled(fn, *args, topology=topology,
                          donate_argnums=(0, 1) if target == "step" else ())
    return {"model": dataclasses.asdict(shape), "strategy": strategy, "target": target,
            "seq_len": seq_len, "batch": batch, "mesh": dict(axes), "block": block,
            "mlp_chunk": mlp_chunk, "offload": offload, **rep}


def format_report(rep: dict) -> str:
    """Human-readable lines of a :func:`compile_report`."""
    lines = [f"{rep['target']} of {rep.get('model')} | strategy {rep['strategy']} | "
             f"T={rep['seq_len']} B={rep['batch']} | mesh {rep['mesh']} | {rep['topology']}",
             f"compile: {rep['compile_s']:.1f} s"]
    mem = rep["memory"]
    if mem is None:
        lines.append(f"does NOT fit: {rep['error']}")
    else:
        lines.append(
            "per chip: arguments {:.2f} GiB, outputs {:.2f} GiB, aliased {:.2f} GiB, "
            "temporaries {:.2f} GiB, total {:.2f} GiB of {:.0f} GiB HBM ({:.0%}) -> {}".format(
                mem["argument_bytes"] / GiB, mem["output_bytes"] / GiB,
                mem["alias_bytes"] / GiB, mem["temp_bytes"] / GiB, mem["total_bytes"] / GiB,
                mem["hbm_bytes"] / GiB, mem["hbm_fraction"],
                "fits" if rep["fits"] else "does NOT fit"))
        if mem.get("host_bytes"):
            lines.append(f"host memory per chip (offloaded): {mem['host_bytes'] / GiB:.2f} GiB")
        lines.append("collectives (HLO instructions): " + ", ".join(
            f"{k} {v}" for k, v in rep["collectives"].items()))
    return "\n".join(lines)


def dumps(rep: dict) -> str:
    return json.dumps(rep, indent=2)


def _mesh_arg(text: str | None):
    if not text:
        return None

    return list(parse_mesh(text).items())


def add_arguments(parser) -> None:
    """``lcjax compile`` flags."""
    parser.add_argument("--model", default=None, choices=sorted(MODELS),
                        help="one of our model shapes (or give --config / the shape flags)")
    parser.add_argument("--config", default=None,
                        help="JSON file with ModelShape fields (d_model, num_heads, "
                             "num_kv_heads, head_dim, mlp, layers, vocab)")
    for flag in ("d-model", "heads", "kv-heads", "head-dim", "mlp", "layers", "vocab"):
        parser.add_argument(f"--{flag}", type=int, default=None)
    parser.add_argument("--topology", required=True, help="e.g. v5p:2x2x2, v5e:2x2")
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--strategy", default="upipe", choices=STRATEGIES)
    parser.add_argument("--target", default="layer", choices=TARGETS,
                        help="one decoder layer fwd+bwd, or the whole AdamW training step")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--mesh", default=None,
                        help="data=N,context=M[,ring=R]; default all chips on context")
    parser.add_argument("--block", type=int, default=512, help="blockwise attention block")
    parser.add_argument("--mlp-chunk", type=int, default=None,
                        help="tile the MLP over each chip's tokens, this many at a time")
    parser.add_argument("--offload", action="store_true",
                        help="step: keep the saved layer inputs in host memory")
    parser.add_argument("--json", default=None, help="also write the report to this file")


_FLAG_FIELDS = {"d_model": "d_model", "heads": "num_heads", "kv_heads": "num_kv_heads",
                "head_dim": "head_dim", "mlp": "mlp", "layers": "layers", "vocab": "vocab"}


def shape_from_args(args) -> ModelShape:
    """--model, else --config JSON, overridden by the shape flags."""
    fields = dataclasses.asdict(MODELS[args.model]) if args.model else {}
    if args.config:
        with open(args.config) as f:
            fields.update(json.load(f))
    fields.update({field: getattr(args, flag) for flag, field in _FLAG_FIELDS.items()
                   if getattr(args, flag) is not None})
    missing = [f.name for f in dataclasses.fields(ModelShape) if f.name not in fields]
    if missing:
        raise ValueError(f"lcjax compile: give --model {sorted(MODELS)} or a full shape "
                         f"(--config / flags); missing {missing}")
    return ModelShape(**fields)


def run(args) -> int:
    """``lcjax compile``: print the report; exit 1 when it does not fit the chip's HBM."""
    rep = compile_report(shape_from_args(args), topology=args.topology, seq_len=args.seq_len,
                         strategy=args.strategy, target=args.target, batch=args.batch,
                         mesh_axes=_mesh_arg(args.mesh), block=args.block,
                         mlp_chunk=args.mlp_chunk, offload=args.offload)
    print(format_report(rep))
    if args.json:
        with open(args.json, "w") as f:
            f.write(dumps(rep))
    return 0 if rep["fits"] else 1
