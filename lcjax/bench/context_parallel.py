"""``lcjax bench context_parallel``: per-device memory and step time of one attention layer
(projections included) under Ulysses, Ring and UPipe (:mod:`lcjax.parallel`).

For fixed B, H, Hkv, D, C and growing T it reports

- the per-device compiled temp bytes of forward+backward (``jax.jit(grad).lower(...)
  .compile().memory_analysis().temp_size_in_bytes``; compile only, nothing runs);
- the analytic model beside it (:func:`memory_model`), and the compiled bytes per token
  (the slope between two lengths) against the model's slope; with ``split_d_model`` the
  compiled slope split into its attention-intermediate part and its x-sized part by
  compiling again at another d_model (:func:`split_per_token`);
- the largest T under a per-device budget for each strategy (a binary search over
  compiled memory, on multiples of the step ``2 C · block``);
- wall time of one training step (``value_and_grad``) on C CPU devices at each of
  ``time_lens``, as ratios to Ulysses (interleaved rounds, medians).

Strategies are ``ulysses``, ``ring``, ``upipe`` and the UPipe settings of :data:`SETTINGS`
(``upipe+out``: the stages' outputs and LSEs saved for the backward; ``upipe-kv``: the
K/V chunk recomputed in the backward even when there is one), measured side by side.

The memory model (bytes per device, s = bytes per element, Hv = max(Hkv, C), d = d_model):

    head layout        A = 2 s B T D n,   n = heads alive per device, counting the
        q, k, v, o tensors of the head layout (2: each with its cotangent):
        Ulysses n = 2 H/C + 2 Hv/C;  UPipe n = 4 (one q, k, v and o head per stage);
        Ring n = (2 H + 2 Hkv)/C (+ one kv block in flight, 2 Hkv/C more);
    sequence layout    Pj = 2 s B (T/C) (hq + 2 hk) D, the projections q, k, v (o) with
        cotangents: Ulysses, Ring (hq, hk) = (H, Hkv); UPipe (C, C) (one stage);
    x-sized            S = s B (T/C) m d, m = :data:`X_BUFFERS` [T/C, d] temps at the
        peak (Ulysses, Ring 1; UPipe 0: its dx and y live in the output buffers) — what
        XLA's fusion and buffer assignment make of it, measured by the split.

The attention intermediates are A + Pj (:func:`model_head_part`), all ∝ T D. For MHA
UPipe / Ulysses is C/H for both terms (25% at H = 32, C = 8); for GQA with Hkv = C = 8
(one kv head per device already) A gives 40% and A + Pj 43.75%.

Runs on C CPU devices: when fewer are visible it re-runs itself in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=C``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time

STRATEGIES = ("ulysses", "ring", "upipe")
# settings of a strategy measured under their own name: (strategy, its layer options)
SETTINGS = {"upipe+out": ("upipe", {"save_attention_output": True}),
            "upipe-kv": ("upipe", {"save_kv": False})}
# x-sized [T/C, d_model] temp buffers at the peak, per strategy: what the d_model split of
# run_benchmark measured at H = 32, C = 8, D = 64, 8K -> 32K (Ulysses 1.0 GQA, 0.0 MHA;
# UPipe -0.1 GQA, 0.4 MHA; Ring not measured, it shares Ulysses' layer code). XLA's
# fusion and buffer assignment decide it: docs/context_parallel.md. The 2026-12-04 quick
# run, after the blockwise backward's delta change, measured Ulysses 0.37 GQA, 0.0 MHA;
# UPipe -0.13 GQA, 0.36 MHA (the constants are not refitted to it)
X_BUFFERS = {"ulysses": 1.0, "ring": 1.0, "upipe": 0.0}


def memory_model(strategy: str, *, seq_len: int, batch: int, heads: int, kv_heads: int,
                 head_dim: int, d_model: int, context: int, bytes_per: int = 4,
                 x_buffers: float | None = None) -> dict:
    """The analytic per-device bytes of fwd+bwd of one layer (module docstring):
    ``{"attention": A, "projections": Pj, "sequence": S, "total": A + Pj + S}`` with A
    the head-layout tensors, Pj the sequence-layout projections (both ∝ T D: the
    *attention-intermediate* part, :func:`model_head_part`) and S the x-sized
    [T/C, d_model] buffers (∝ T d_model; ``x_buffers`` of them, default
    :data:`X_BUFFERS` of the strategy)."""
    t, c, d = seq_len, context, head_dim
    hv = max(kv_heads, c)
    if strategy == "ulysses":
        n, hq, hk = 2 * heads / c + 2 * hv / c, heads, kv_heads
    elif strategy == "upipe":
        n, hq, hk = 4.0, c, c  # one stage: C query heads and one kv chunk of C heads
    elif strategy == "ring":
        n, hq, hk = (2 * heads + 4 * kv_heads) / c, heads, kv_heads
    else:
        raise ValueError(f"memory_model: unknown strategy {strategy!r}")
    m = X_BUFFERS[strategy] if x_buffers is None else x_buffers
    attention = 2 * bytes_per * batch * t * d * n
    projections = bytes_per * batch * (t / c) * 2 * (hq + 2 * hk) * d
    seq = bytes_per * batch * (t / c) * m * d_model
    return {"attention": attention, "projections": projections, "sequence": seq,
            "total": attention + projections + seq}


def model_head_part(model: dict) -> float:
    """The model's attention-intermediate bytes (everything ∝ T·D, not ∝ d_model)."""
    return model["attention"] + model["projections"]


def base_strategy(name: str) -> str:
    """The strategy a benchmarked name runs (``"upipe+out"`` -> ``"upipe"``)."""
    return SETTINGS.get(name, (name, {}))[0]


def layer_step(strategy, mesh, *, heads, kv_heads, head_dim, causal, block, d_model=None,
              value: bool = False):
    """(init, jitted step, d_model) of one layer's fwd+bwd. ``value``: the step is
    ``value_and_grad`` (what training runs: the forward's output is used, so XLA must run
    the whole forward); otherwise ``grad``, whose loss value nobody reads, so XLA may drop
    forward work the backward does not need (UPipe's recomputing backward needs none of
    it) — the compile-only memory measurement uses it: the backward's peak, as inside a
    network, where the layer's output is consumed elsewhere (docs/context_parallel.md)."""
    import jax
    import jax.numpy as jnp

    from lcjax.parallel import layer

    d_model = d_model or heads * head_dim
    base, options = SETTINGS.get(strategy, (strategy, {}))
    init, apply = layer(base, mesh=mesh, d_model=d_model, num_heads=heads,
                        num_kv_heads=kv_heads, head_dim=head_dim, causal=causal,
                        variant="blockwise", block_q=block, block_kv=block, **options)
    transform = jax.value_and_grad if value else jax.grad
    step = jax.jit(transform(lambda p, x, w: jnp.sum(w * apply(p, x)), argnums=(0, 1)))
    return init, step, d_model


def _abstract(mesh, init, batch, seq_len, d_model):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    params = jax.eval_shape(init, jax.random.PRNGKey(0))
    rep = NamedSharding(mesh, P())
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep),
                          params)
    x = jax.ShapeDtypeStruct((batch, seq_len, d_model), jnp.float32,
                             sharding=NamedSharding(mesh, P("data", "context", None)))
    return params, x


def compiled_temp_bytes(strategy: str, seq_len: int, *, mesh, batch=1, heads=32, kv_heads=8,
                        head_dim=64, causal=True, block=512, d_model: int | None = None,
                        value: bool = False) -> tuple[int, float]:
    """(per-device temp bytes of the compiled fwd+bwd, compile seconds); nothing runs.
    ``d_model``: default ``heads * head_dim``; ``value``: of ``value_and_grad``
    (:func:`layer_step`)."""
    init, step, d_model = layer_step(strategy, mesh, heads=heads, kv_heads=kv_heads,
                                     head_dim=head_dim, causal=causal, block=block,
                                     d_model=d_model, value=value)
    params, x = _abstract(mesh, init, batch, seq_len, d_model)
    start = time.perf_counter()
    compiled = step.lower(params, x, x).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes), time.perf_counter() - start


def split_per_token(slope: float, other_slope: float, *, d_model: int, other_d_model: int,
                    x_buffer_bytes: float) -> dict:
    """Split compiled bytes per token into the part ∝ d_model and the rest.

    With temp(T, d) = c(d) + T (a + b d) (a: bytes per token of tensors with head
    dimensions — the attention intermediates, in any layout; b d: of x-sized [T/C, d]
    buffers), the slopes at two d_models give b = (slope - other) / (d - d') and
    a = slope - b d. ``x_buffers`` = b d / ``x_buffer_bytes`` (the bytes per token of one
    x-sized buffer). ``physical``: 0 <= a <= slope and b >= 0 (else the fit does not
    describe the compiled code, e.g. XLA chose other fusions at the other d_model)."""
    b = (slope - other_slope) / (d_model - other_d_model)
    a = slope - b * d_model
    return {"attention": a, "x_part": b * d_model, "x_buffers": b * d_model / x_buffer_bytes,
            "slope": slope, "other_slope": other_slope, "other_d_model": other_d_model,
            "physical": bool(0 <= a <= slope and b >= 0)}


def max_length_under(strategy: str, budget: int, *, step: int, guess: int, measure,
                     max_compiles: int = 8) -> dict:
    """Largest T (a multiple of ``step``) with ``measure(T) <= budget``: bracket from
    ``guess`` by doubling/halving, then bisect; at most ``max_compiles`` measurements
    (the result is then the best proven T, with ``exact`` False)."""
    seen = {}

    def fits(t):
        if t not in seen:
            seen[t] = measure(t)
        return seen[t] <= budget

    guess = max(step, guess // step * step)
    lo, hi = (guess, None) if fits(guess) else (None, guess)
    while lo is None and len(seen) < max_compiles and hi > step:
        t = max(step, hi // 2 // step * step)
        lo, hi = (t, hi) if fits(t) else (None, t)
    while hi is None and len(seen) < max_compiles:
        t = lo * 2
        lo, hi = (t, None) if fits(t) else (lo, t)
    while lo is not None and hi is not None and hi - lo > step and len(seen) < max_compiles:
        t = (lo + hi) // 2 // step * step
        lo, hi = (t, hi) if fits(t) else (lo, t)
    exact = lo is not None and hi is not None and hi - lo <= step
    return {"strategy": strategy, "max_len": lo, "upper": hi, "exact": exact,
            "measured": {str(k): v for k, v in sorted(seen.items())}}


def step_times(strategies, *, mesh, batch, heads, kv_heads, head_dim, seq_len, causal, block,
               repeats=3) -> dict:
    """Median wall seconds of one training step (``value_and_grad``: forward and backward)
    per strategy (interleaved rounds)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from lcjax.bench.timing import time_interleaved

    fns = {}
    for s in strategies:
        init, step, d_model = layer_step(s, mesh, heads=heads, kv_heads=kv_heads,
                                        head_dim=head_dim, causal=causal, block=block,
                                        value=True)
        params = jax.device_put(init(jax.random.PRNGKey(0)), NamedSharding(mesh, P()))
        x = jax.device_put(jax.random.normal(jax.random.PRNGKey(1), (batch, seq_len, d_model)),
                           NamedSharding(mesh, P("data", "context", None)))
        fns[s] = (step, (params, x, x), True)
    stats, _ = time_interleaved(fns, repeats=repeats, warmup=1)
    return {s: st["median_s"] for s, st in stats.items()}


def _upipe_over_ulysses(result: dict, upipe: dict, ulysses: dict) -> dict:
    """UPipe's ratios to Ulysses: compiled temp bytes at the longest length (rows
    ``upipe``/``ulysses``), the model's attention bytes per token, and, with a d_model split
    in ``result``, the attention part of the compiled bytes per token."""
    out = {"upipe_over_ulysses_temp": upipe["temp_bytes"] / ulysses["temp_bytes"]}
    if "bytes_per_token" in result:
        sl = result["bytes_per_token"]
        out["model_upipe_over_ulysses_attention"] = (
            sl["upipe"]["model_attention"] / sl["ulysses"]["model_attention"])
    if "split" in result:
        sp = result["split"]
        out["upipe_over_ulysses_attention"] = sp["upipe"]["attention"] / sp["ulysses"]["attention"]
        out["split_physical"] = all(sp[s]["physical"] for s in ("ulysses", "upipe"))
    return out


def _max_length(strategy: str, result: dict, first: dict, first_len: int, *, step: int,
                max_compiles: int, measure) -> dict:
    """The largest T of ``strategy`` whose compiled temp bytes fit ``result["budget_bytes"]``
    (:func:`max_length_under`, started at the line through the first row ``first`` with the
    compiled bytes-per-token slope); ``measure(strategy, T)`` compiles one length."""
    budget = result["budget_bytes"]
    slope = result.get("bytes_per_token", {}).get(strategy, {}).get("compiled")
    guess = int(first_len + (budget - first["temp_bytes"]) / slope) if slope else first_len
    found = max_length_under(strategy, budget, step=step, guess=max(step, guess),
                             max_compiles=max_compiles,
                             measure=lambda t: measure(strategy, t)[0])
    print(f"  {strategy:8s} largest T under {budget / 2**20:.0f} MiB: {found['max_len']}",
          flush=True)
    return found


def run_benchmark(*, strategies=STRATEGIES, heads=32, kv_heads=8, head_dim=64, context=8,
                  batch=1, seq_lens=(8192, 32768), causal=True, block=512,
                  budget_mib: float | None = None, search: bool = True, max_compiles=6,
                  time_lens=(1024,), time_head_dim=None, repeats=3,
                  split_d_model: int | None = None, memory_value: bool = False) -> dict:
    """The whole benchmark as a dict (see the module docstring). ``split_d_model``: also
    compile every strategy at the first and last length with this d_model (not
    ``heads * head_dim``) and split the compiled bytes per token into the part ∝ d_model
    and the rest, the attention intermediates (:func:`split_per_token`). ``memory_value``:
    the memory rows of ``value_and_grad`` instead of ``grad`` (:func:`layer_step`)."""
    import jax

    from lcjax.parallel import make_mesh

    mesh = make_mesh(data=1, context=context, devices=jax.devices()[:context])
    shape = dict(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    rows = []
    for t in seq_lens:
        for s in strategies:
            temp, compile_s = compiled_temp_bytes(s, t, mesh=mesh, causal=causal, block=block,
                                                  value=memory_value, **shape)
            model = memory_model(base_strategy(s), seq_len=t, context=context,
                                 d_model=heads * head_dim, head_dim=head_dim, heads=heads,
                                 kv_heads=kv_heads, batch=batch)
            rows.append({"strategy": s, "seq_len": t, "temp_bytes": temp,
                         "compile_s": compile_s, "model": model})
            print(f"  {s:8s} T={t:7d} temp {temp / 2**20:9.1f} MiB  model "
                  f"{model['total'] / 2**20:9.1f} MiB  (compile {compile_s:.1f} s)", flush=True)
    result = {"config": {**shape, "context": context, "causal": causal, "block": block,
                         "seq_lens": list(seq_lens), "variant": "blockwise",
                         "memory_step": "value_and_grad" if memory_value else "grad"},
              "rows": rows}
    by = {(r["strategy"], r["seq_len"]): r for r in rows}
    if len(seq_lens) >= 2:
        t1, t2 = seq_lens[0], seq_lens[-1]
        slopes = {}
        for s in strategies:
            a, b = by[(s, t1)], by[(s, t2)]
            slopes[s] = {"compiled": (b["temp_bytes"] - a["temp_bytes"]) / (t2 - t1),
                         "model": (b["model"]["total"] - a["model"]["total"]) / (t2 - t1),
                         "model_attention": (model_head_part(b["model"])
                                             - model_head_part(a["model"])) / (t2 - t1)}
        result["bytes_per_token"] = slopes
        if split_d_model:
            result["split"] = {}
            for s in strategies:
                temps = [compiled_temp_bytes(s, t, mesh=mesh, causal=causal, block=block,
                                             d_model=split_d_model, **shape)[0]
                         for t in (t1, t2)]
                result["split"][s] = split_per_token(
                    slopes[s]["compiled"], (temps[1] - temps[0]) / (t2 - t1),
                    d_model=heads * head_dim, other_d_model=split_d_model,
                    x_buffer_bytes=4 * batch * heads * head_dim / context)
                result["split"][s].update(temp_other_d_model=temps,
                                          model=slopes[s]["model_attention"])
                print(f"  {s:8s} d_model={split_d_model}: temp {temps[0] / 2**20:.1f}, "
                      f"{temps[1] / 2**20:.1f} MiB; attention part "
                      f"{result['split'][s]['attention']:.0f} B/token of "
                      f"{slopes[s]['compiled']:.0f}", flush=True)
    if "ulysses" in strategies and "upipe" in strategies:
        result.update(_upipe_over_ulysses(result, by[("upipe", seq_lens[-1])],
                                          by[("ulysses", seq_lens[-1])]))
    if search and budget_mib is not None:
        measure = functools.partial(compiled_temp_bytes, mesh=mesh, causal=causal, block=block,
                                    **shape)
        result["budget_bytes"] = int(budget_mib * 2**20)
        result["max_len"] = {
            s: _max_length(s, result, by[(s, seq_lens[0])], seq_lens[0],
                           step=2 * context * block, max_compiles=max_compiles,
                           measure=measure)
            for s in strategies}
    hd = time_head_dim or head_dim
    for t in time_lens:
        times = step_times(strategies, mesh=mesh, batch=batch, heads=heads, kv_heads=kv_heads,
                           head_dim=hd, seq_len=t, causal=causal,
                           block=min(block, t // context), repeats=repeats)
        result.setdefault("step_s", {})[str(t)] = times
        if "ulysses" in times:
            result.setdefault("step_ratio_vs_ulysses", {})[str(t)] = {
                s: v / times["ulysses"] for s, v in times.items()}
        print(f"  step T={t}: " + ", ".join(f"{s} {v:.3f} s" for s, v in times.items()),
              flush=True)
    return result


def format_result(result: dict) -> str:
    """A markdown summary of :func:`run_benchmark`'s result."""
    c = result["config"]
    lines = [f"Context-parallel attention layer, fwd+bwd, per device: B={c['batch']} "
             f"H={c['heads']} Hkv={c['kv_heads']} D={c['head_dim']} C={c['context']} "
             f"blockwise block={c['block']}, causal={c['causal']}", "",
             "| strategy | T | compiled temp MiB | model MiB (attention + projections + "
             "x-sized) |",
             "|---|---|---|---|"]
    for r in result["rows"]:
        m = r["model"]
        lines.append(f"| {r['strategy']} | {r['seq_len']} | {r['temp_bytes'] / 2**20:.1f} | "
                     f"{m['total'] / 2**20:.1f} ({m['attention'] / 2**20:.1f} + "
                     f"{m['projections'] / 2**20:.1f} + {m['sequence'] / 2**20:.1f}) |")
    if "bytes_per_token" in result:
        lines += ["", "| strategy | compiled bytes/token | model bytes/token |", "|---|---|---|"]
        for s, v in result["bytes_per_token"].items():
            lines.append(f"| {s} | {v['compiled']:.0f} | {v['model']:.0f} |")
    if "split" in result:
        lines += ["", "| strategy | attention-intermediate bytes/token (measured) | x-sized "
                  "buffers (measured) | model attention bytes/token |", "|---|---|---|---|"]
        for s, v in result["split"].items():
            lines.append(f"| {s} | {v['attention']:.0f} | {v['x_buffers']:.2f} | "
                         f"{v['model']:.0f} |")
    for key, label in (("upipe_over_ulysses_temp", "UPipe / Ulysses temp bytes"),
                       ("upipe_over_ulysses_attention",
                        "UPipe / Ulysses attention-intermediate bytes per token (measured)"),
                       ("model_upipe_over_ulysses_attention", "the same, model")):
        if key in result:
            lines.append(f"\n{label}: {result[key]:.1%}")
    if result.get("split_physical") is False:
        lines.append("\nThe d_model split is not physical (a negative or too large part): "
                     "the measured share means nothing.")
    if "max_len" in result:
        lines += ["", f"Largest T under {result['budget_bytes'] / 2**20:.0f} MiB per device:"]
        for s, v in result["max_len"].items():
            lines.append(f"- {s}: {v['max_len']} ({'exact' if v['exact'] else 'bound'}; "
                         f"upper {v['upper']})")
    for t, ratios in result.get("step_ratio_vs_ulysses", {}).items():
        lines += ["", f"Step time (value_and_grad: forward + backward) vs Ulysses, T = {t}: "
                  + ", ".join(f"{s} {r:.2f}x" for s, r in ratios.items())]
    return "\n".join(lines) + "\n"


def add_arguments(sub) -> None:
    """Register ``bench context_parallel`` on the bench subparsers."""
    p = sub.add_parser("context_parallel", help="memory and step time of Ulysses, Ring, UPipe",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _arguments(p)


def _arguments(p):
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--context", type=int, default=8)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq-lens", default="8192,32768")
    p.add_argument("--block", type=int, default=512)
    p.add_argument("--budget-mib", type=float, default=None,
                   help="per-device budget for the largest-T search (none: no search)")
    p.add_argument("--max-compiles", type=int, default=6)
    p.add_argument("--time-lens", default="1024",
                   help="comma-separated T of the timed steps (empty or 0: none)")
    p.add_argument("--time-head-dim", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--split-d-model", type=int, default=None,
                   help="also compile at this d_model to split the bytes per token into "
                        "attention intermediates and x-sized buffers")
    p.add_argument("--memory-value-and-grad", action="store_true",
                   help="compile value_and_grad, not grad, for the memory rows")
    p.add_argument("--json", default=None, help="write the result here")


def _run(args) -> int:
    result = run_benchmark(
        strategies=tuple(s for s in args.strategies.split(",") if s), heads=args.heads,
        kv_heads=args.kv_heads, head_dim=args.head_dim, context=args.context,
        batch=args.batch, seq_lens=tuple(int(t) for t in args.seq_lens.split(",")),
        block=args.block, budget_mib=args.budget_mib, search=args.budget_mib is not None,
        max_compiles=args.max_compiles,
        time_lens=tuple(int(t) for t in args.time_lens.split(",") if t and int(t)),
        time_head_dim=args.time_head_dim, repeats=args.repeats,
        split_d_model=args.split_d_model, memory_value=args.memory_value_and_grad)
    print(format_result(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def run_cli(args) -> int:
    """``lcjax bench context_parallel``: here if C devices are visible, else in a
    subprocess with C host devices."""
    import jax

    if jax.device_count() >= args.context:
        return _run(args)
    return run_subprocess(sys.argv[sys.argv.index("context_parallel") + 1:], args.context)


def run_subprocess(argv, context: int, **kwargs) -> int:
    """Run this module as a script with ``context`` CPU devices."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                          + f" --xla_force_host_platform_device_count={context}").strip())
    return subprocess.run([sys.executable, "-m", "lcjax.bench.context_parallel", *argv],
                          env=env, check=False, **kwargs).returncode


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m lcjax.bench.context_parallel")
    _arguments(parser)
    sys.exit(_run(parser.parse_args()))
