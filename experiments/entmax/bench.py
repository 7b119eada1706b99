r"""α-entmax benchmark (AdaSplash-2, ICML 2026): ``python -m experiments.entmax.bench``.

    from lcjax.bench import EntmaxBenchConfig, run_entmax_benchmark
    result = run_entmax_benchmark(EntmaxBenchConfig.quick())

Five parts (``parts``; the first four by default), each reported in ``entmax.json`` /
``entmax.md`` and a PNG (a sweep-only run, ``--sweep``, writes ``entmax_sweep.json`` /
``entmax_sweep.md`` so it leaves the other report alone):

``iterations`` (a)
    Solver steps until |Σp - 1| < tol (1e-5) of the α = 1.5 threshold, per row, for the
    histogram-initialised solver, bisection and the exact sort, counted by
    ``lcjax.attention.entmax.mapping.entmax_threshold`` (its ``iterations``: steps after the
    initialisation for
    ``"histogram"``, halvings for ``"bisect"`` — the ``entmax`` package always runs 50 —, and
    0 for ``"sort"``, which is exact and is reported by its time instead). Rows are random
    scores ``σ·N(0, 1)`` of length ``row_len`` at several scales σ (σ is an inverse
    temperature), and attention score rows ``scale·q·kᵀ`` of a small ``lcjax.nn.DecoderLM``
    trained in-process through ``lcjax.train.train`` on the Shakespeare corpus for
    ``train_steps`` steps (``experiments.entmax.trained``), on held-out text (first and last
    layer, q and k captured from the model's own forward pass, after RoPE;
    causal, masked keys -inf; the query rows of the second half of each window, so that each
    row has between ``model_row_len/2`` and ``model_row_len`` keys). Independently of the
    solver's own test, the residual |Σ_i [(α-1)x_i - τ]₊² - 1| is recomputed in float64 from
    the returned float32 τ. Reported: the distribution of steps per method and the fraction
    of rows within ``within`` (2) steps for the histogram solver — target ≥ 99%; and the
    time of each method's mapping on the same rows, beside ``jax.nn.softmax``.

``attention`` (b)
    Cases of the attention harness (``lcjax.bench.harness``: same random q, k, v, compile
    excluded, median of ``repeats``, each variant's error against its spec reference, the
    rerun command per row) of ``entmax`` (α = 1.5, histogram solver) against ``softmax``
    (dense, capped at ``dense_max_len``) and ``blockwise`` (online softmax), forward and
    forward+backward, with XLA's compiled temporary memory; the ratios entmax/blockwise
    and entmax/softmax per T.

``sparsity`` (c)
    ``block_sparsity`` from ``entmax_attention(..., return_aux=True)`` (the fraction of
    (batch, head, query block, key block) tiles on or below the causal diagonal with no
    weight above τ, i.e. the fraction a sparse kernel skips), for square tiles of
    ``sparsity_tiles`` (64: AdaSplash's kernel tile; 128: the XLA path's default), and the
    in-attention solver steps, vs T: on the random q, k, v of (b), and on the trained
    model's q, k, v of its
    first and last layer over held-out windows (``model_sparsity_lens``; beyond the
    training length the model runs on positions it was not trained on).

``peer`` (d)
    The PyPI ``entmax`` package (PyTorch, CPU; imported lazily — absent, the part is
    skipped with the install command) on the same ``peer_n``×``peer_n`` float32 input:
    ``entmax15`` and ``sparsemax`` (sort-based) and ``entmax_bisect(α=1.5)`` against
    ours
    (``lcjax.attention.entmax.mapping``: histogram solver by default, bisection with an early
    stop), with the
    max abs difference of the outputs and time ratios; ``jax.nn.softmax`` and
    ``torch.softmax`` are timed in the same interleaved rounds. Targets: our entmax15 ≥ 5×
    faster than the package's; our histogram α = 1.5 mapping within 4× of
    ``jax.nn.softmax``.

``sweep`` (e)
    AdaSplash-2's speed claim where it is made (parity with FlashAttention-2 per step once
    block sparsity exceeds ~60%): at T = ``sweep_seq_lens`` (8K, 16K), the forward and
    forward+backward time of ``entmax`` (α = 1.5, XLA path, histogram solver, tiles
    ``block_q`` x ``block_kv``) over that of ``blockwise`` softmax on the same inputs,
    measured side by side (interleaved rounds), against the block sparsity that entmax's
    own ``aux`` reports for those inputs. Inputs: (1) RoPE'd random q, k with a locality
    scale λ (:func:`locality_inputs`; λ = 0 is N(0, 1), a larger λ concentrates attention
    near the diagonal, so more tiles hold no weight), one point per λ in
    ``sweep_locality``; (2) q, k, v of each layer of a ``DecoderLM`` trained with α = 1.5
    entmax attention for ``sweep_train_steps`` steps (``experiments.entmax.trained``), on a
    held-out window of length T. Reported per T: the crossing point — the block sparsity at
    which the ratio crosses 1.0, linearly interpolated (:func:`crossing_point`) — and the
    worst fwd+bwd ratio among points at ≥ 60% block sparsity (target ≤ 1.0).

Timings interleave the functions compared (one call of each per round) so a busy machine
slows them alike; note that this is CPU XLA, several processes may share the cores, and
the machine's load is recorded by the caller (``uptime``) beside the reports.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import parse_bench_args, print_bench_result
from experiments.entmax import trained
from lcjax import attention as attn
from lcjax.attention.entmax.mapping import (
    entmax,
    entmax15,
    entmax_bisect,
    entmax_threshold,
    sparsemax,
)
from lcjax.bench.attention import AttentionBenchConfig, cases, row_command
from lcjax.bench.harness import Case, format_records, make_inputs, plot_records, run_cases
from lcjax.bench.report import (
    check,
    command_line,
    figure_title,
    format_checks,
    log_axes,
    machine_line,
    ms,
    pct,
    ratio,
    write_report,
)
from lcjax.bench.timing import compile_fn, machine_info, time_compiled, time_interleaved

__all__ = [
    "EntmaxBenchConfig",
    "PARTS",
    "PEER_INSTALL",
    "TARGETS",
    "format_summary",
    "iteration_summary",
    "row_iterations",
    "run_entmax_benchmark",
    "write_entmax_reports",
]

PARTS = ("iterations", "attention", "sparsity", "peer", "sweep")
DEFAULT_PARTS = PARTS[:4]  # the sweep (long T) runs when asked: --sweep or --parts sweep
ALPHA = 1.5
METHODS = ("histogram", "bisect", "sort")
# name -> (target, comparison): value must satisfy `value <op> target`
TARGETS = {
    "histogram_within": (0.99, ">="),  # fraction of rows solved in <= `within` steps
    "peer_entmax15_speedup": (5.0, ">="),  # peer entmax15 time / ours
    "entmax15_over_softmax": (4.0, "<="),  # our entmax15 time / jax.nn.softmax
    # (e) worst entmax/blockwise fwd+bwd time among sweep points with block sparsity >= 60%
    "sweep_fwd_bwd_over_blockwise": (1.0, "<="),
}
SWEEP_SPARSITY = 0.6  # AdaSplash-2's operating point: parity above ~60% block sparsity
PEER_INSTALL = ("make bench-entmax   (or: .venv/bin/pip install -e '.[peer]', which installs "
                "torch==2.13.0 and entmax)")
RESIDUAL_NOTE = (
    "Steps are counted by the solver, which stops when its float32 |Σp - 1| < tol. The "
    "residual columns recompute |Σp - 1| in float64 from the float32 τ it returns: rows "
    "at ~1e-5 there are float32 rounding of that stop test, not unconverged rows.")
DEFAULT_SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_SEQ_LENS = (512, 1024, 2048)


@dataclasses.dataclass(frozen=True)
class EntmaxBenchConfig:
    """What to run. ``parts`` ⊆ ``PARTS`` (default ``DEFAULT_PARTS``: all but the sweep);
    ``train_steps=0`` leaves out the trained-model rows (a) and q/k (c);
    ``sweep_train_steps=0`` the trained-model points of (e); ``out_dir`` None writes no
    files."""

    parts: tuple[str, ...] = DEFAULT_PARTS
    # (a) iterations
    rows: int = 1024
    row_len: int = 4096
    scales: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)
    tol: float = 1e-5
    within: int = 2
    # the trained model (a, c)
    train_steps: int = 300
    train_batch: int = 8
    train_seq_len: int = 128
    model_dim: int = 128
    model_layers: int = 2
    model_heads: int = 4
    model_head_dim: int = 32
    model_attention: str = "softmax"
    model_windows: int = 4
    model_row_len: int = 1024
    model_sparsity_lens: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    # (b, c) attention
    seq_lens: tuple[int, ...] = DEFAULT_SEQ_LENS
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    causal: bool = True
    dtype: str = "float32"
    dense_max_len: int = 4096
    block_q: int = 128
    block_kv: int = 128
    sparsity_tiles: tuple[int, ...] = (64, 128)  # (c) square tiles whose sparsity is counted
    # (d) peer
    peer_n: int = 4096
    # (e) sweep: entmax (XLA, tiles block_q x block_kv) vs blockwise softmax at long T
    sweep_seq_lens: tuple[int, ...] = (8192, 16384)
    sweep_heads: int = 2
    sweep_head_dim: int = 64
    sweep_locality: tuple[float, ...] = (0.0, 0.5, 0.75, 1.0, 1.25, 2.0)
    sweep_train_steps: int = 300  # the entmax-trained model (0: RoPE'd inputs only)
    sweep_train_seq_len: int = 256
    sweep_repeats: int = 2
    # timing
    repeats: int = 3
    warmup: int = 1
    seed: int = 0
    out_dir: str | None = "reports/bench/entmax"

    def __post_init__(self):
        bad = [p for p in self.parts if p not in PARTS]
        if bad:
            raise ValueError(f"EntmaxBenchConfig: unknown parts {bad}; choose from {PARTS}")

    @classmethod
    def quick(cls, **overrides) -> EntmaxBenchConfig:
        """Small sizes for a few-minute run (``--quick``)."""
        base = dict(rows=256, scales=(0.5, 1.0, 4.0), train_steps=100, model_windows=2,
                    model_row_len=512, model_sparsity_lens=(256, 512, 1024),
                    seq_lens=QUICK_SEQ_LENS, repeats=2, sweep_seq_lens=(1024, 2048),
                    sweep_train_steps=60, sweep_train_seq_len=128)
        return cls(**{**base, **overrides})

    def attention_config(self) -> AttentionBenchConfig:
        """The ``lcjax bench attention`` configuration of part (b) (no files)."""
        return AttentionBenchConfig(
            variants=("softmax", "blockwise", "entmax"), seq_lens=self.seq_lens,
            batch=self.batch, heads=self.heads, head_dim=self.head_dim, causal=self.causal,
            dtype=self.dtype, repeats=self.repeats, warmup=self.warmup, backward=True,
            options={"entmax": {"alpha": ALPHA, "block_q": self.block_q,
                                "block_kv": self.block_kv}},
            max_len={"softmax": self.dense_max_len},
            ref_max_len=min(512, self.dense_max_len), ref_slice=64, matmul_n=512,
            anchor="blockwise", candidate="entmax", seed=self.seed, out_dir=None,
        )


# ----------------------------------------------------------------------------
# (a) iterations
# ----------------------------------------------------------------------------
def iteration_summary(iterations, within: int = 2) -> dict:
    """Distribution of per-row step counts: ``counts`` {steps: rows}, ``mean``, ``max``,
    ``rows`` and ``within`` (fraction of rows with at most ``within`` steps)."""
    it = np.asarray(iterations).reshape(-1)
    values, counts = np.unique(it, return_counts=True)
    return {
        "rows": int(it.size),
        "counts": {str(int(v)): int(c) for v, c in zip(values, counts)},
        "mean": float(it.mean()) if it.size else None,
        "max": int(it.max()) if it.size else None,
        "within_steps": within,
        "within": float(np.mean(it <= within)) if it.size else None,
    }


def _residual(x, tau, alpha: float = ALPHA) -> np.ndarray:
    """|Σ_i [(α-1)x_i - τ]₊^{1/(α-1)} - 1| per row, in float64 from the float32 τ."""
    x = np.asarray(x, np.float64)
    tau = np.asarray(tau, np.float64)
    with np.errstate(invalid="ignore"):
        p = np.maximum((alpha - 1.0) * x - tau, 0.0) ** (1.0 / (alpha - 1.0))
    return np.abs(p.sum(axis=-1) - 1.0)


_THRESHOLD = {
    m: jax.jit(lambda x, tol, m=m: entmax_threshold(x, ALPHA, -1, m, tol=tol),
               static_argnums=1)
    for m in METHODS
}


def row_iterations(rows, *, tol: float = 1e-5, within: int = 2,
                   methods: tuple[str, ...] = METHODS) -> dict:
    """Per method: the step-count summary of ``entmax_threshold`` on ``rows`` [n, len]
    (α = 1.5) and the float64 residual (``residual_max``, ``converged``: fraction of rows
    with residual < tol, ``residual_p99``). Also returns ``raw`` iterations per method."""
    rows = jnp.asarray(rows, jnp.float32)
    out, raw = {}, {}
    for method in methods:
        tau, iters = jax.device_get(_THRESHOLD[method](rows, tol))
        res = _residual(rows, tau)
        raw[method] = np.asarray(iters).reshape(-1)
        out[method] = {**iteration_summary(iters, within),
                       "residual_max": float(res.max()),
                       "residual_p99": float(np.quantile(res, 0.99)),
                       "converged": float(np.mean(res < tol))}
    return {"methods": out, "raw": raw}


def _gaussian_rows(config: EntmaxBenchConfig, scale: float, salt: int) -> jax.Array:
    """σ·N(0, 1) rows [rows, row_len], float32."""
    key = jax.random.fold_in(jax.random.key(config.seed), salt)
    return scale * jax.random.normal(key, (config.rows, config.row_len), jnp.float32)


_MAPPINGS = {f"entmax a=1.5 {m}": functools.partial(entmax, alpha=ALPHA, axis=-1, method=m)
             for m in METHODS}
_MAPPINGS["jax.nn.softmax"] = jax.nn.softmax


def _time_mappings(rows, config: EntmaxBenchConfig) -> dict:
    """Median time of the α = 1.5 mapping by each method and of ``jax.nn.softmax``."""
    args = (jnp.asarray(rows),)
    fns = {name: (fn, args, True) for name, fn in _MAPPINGS.items()}
    stats, _ = time_interleaved(fns, repeats=config.repeats, warmup=config.warmup)
    soft = stats["jax.nn.softmax"]["median_s"]
    return {name: {"median_s": s["median_s"], "times_s": s["times_s"],
                   "over_softmax": s["median_s"] / soft} for name, s in stats.items()}


def _run_iterations(config: EntmaxBenchConfig, model_rows: dict | None,
                    log: Callable) -> dict:
    sources, raw = [], {}

    def add(name, group, rows):
        res = row_iterations(rows, tol=config.tol, within=config.within)
        sources.append({"source": name, "group": group, "rows": int(rows.shape[0]),
                        "row_len": int(rows.shape[1]), "methods": res["methods"]})
        raw[name] = res["raw"]
        log(_iteration_line(sources[-1]))

    for i, scale in enumerate(config.scales):
        add(f"gaussian sigma={scale:g}", "random", _gaussian_rows(config, scale, 1000 + i))
    for layer, rows in (model_rows or {}).items():
        add(f"model layer {layer}", "model", rows)
    log("timing the mappings ...")
    fresh = _gaussian_rows(config, 1.0, 2000)
    timing = {"random": {"rows": "gaussian sigma=1 (a fresh draw)", "shape": list(fresh.shape),
                         "stats": _time_mappings(fresh, config)}}
    if model_rows:
        layer, rows = next(iter(model_rows.items()))
        timing["model"] = {"rows": f"model layer {layer}", "shape": list(rows.shape),
                           "stats": _time_mappings(rows, config)}
    pooled = {}
    groups = {s["group"] for s in sources}
    for group in ("random", "model", "all"):
        names = [s["source"] for s in sources if group in ("all", s["group"])]
        if names and (group != "all" or len(groups) > 1):
            pooled[group] = {m: iteration_summary(np.concatenate([raw[n][m] for n in names]),
                                                  config.within) for m in METHODS}
    return {"sources": sources, "pooled": pooled, "timing": timing}


def _iteration_line(source: dict) -> str:
    parts = []
    for m in METHODS:
        s = source["methods"][m]
        parts.append(f"{m} mean {s['mean']:.2f} max {s['max']} "
                     f"<= {s['within_steps']}: {100 * s['within']:.1f}%")
    return f"{source['source']:<22} " + " | ".join(parts)


# ----------------------------------------------------------------------------
# The trained model: training, held-out windows, captured q, k, v
# ----------------------------------------------------------------------------
def _train_cfgs(config: EntmaxBenchConfig):
    """The DecoderLM and TrainConfig of the trained-model rows."""
    from lcjax.data import VOCAB_SIZE
    from lcjax.nn import DecoderConfig
    from lcjax.train import TrainConfig

    model_cfg = DecoderConfig(
        vocab_size=VOCAB_SIZE, d_model=config.model_dim, num_layers=config.model_layers,
        num_heads=config.model_heads, num_kv_heads=config.model_heads,
        head_dim=config.model_head_dim, mlp_hidden=4 * config.model_dim,
        max_len=max(config.model_sparsity_lens + (config.model_row_len,)),
        attention=config.model_attention)
    train_cfg = TrainConfig(
        steps=config.train_steps, batch_size=config.train_batch,
        seq_len=config.train_seq_len, warmup_steps=min(100, config.train_steps // 10),
        seed=config.seed, eval_batches=4, progress=False)
    return model_cfg, train_cfg


def _train_model(config: EntmaxBenchConfig, log: Callable):
    model_cfg, train_cfg = _train_cfgs(config)
    log(f"training DecoderLM ({config.model_layers} layers, d={config.model_dim}, "
        f"{config.model_heads} heads x {config.model_head_dim}, {config.model_attention}) "
        f"for {config.train_steps} steps on Shakespeare ...")
    return trained.train_model(model_cfg, train_cfg, log)


def _windows(config: EntmaxBenchConfig, seq_len: int) -> np.ndarray:
    """Held-out windows of the trained model's split."""
    return trained.heldout_windows(seq_len, config.model_windows, _train_cfgs(config)[1])


def _model_rows(model, config: EntmaxBenchConfig) -> dict[int, np.ndarray]:
    """Per layer (first, last): score rows of the second half of each window's queries."""
    layers = sorted({0, config.model_layers - 1})
    per_layer = {layer: [] for layer in layers}
    for window in _windows(config, config.model_row_len):
        captured = trained.capture_qkv(model, window[None])
        for layer in layers:
            q, k, _, scale = captured[layer]
            per_layer[layer].append(trained.score_rows(q, k, scale, from_row=q.shape[1] // 2))
    return {layer: np.concatenate(rows) for layer, rows in per_layer.items()}


# ----------------------------------------------------------------------------
# (b) attention timing and (c) block sparsity
# ----------------------------------------------------------------------------
def _entmax_available() -> str | None:
    """None if ``entmax`` is a registered attention variant, else the reason."""
    if "entmax" in attn.available():
        return None
    return ("the 'entmax' attention variant is not registered in lcjax.attention "
            "(lcjax/attention/entmax/ has not landed)")


def _aux_fn(causal: bool, tile: int, scale: float | None = None):
    """Jitted ``(q, k, v) -> aux`` of entmax attention (α = 1.5, square tiles ``tile``)."""
    fn = attn.get("entmax")
    return jax.jit(lambda q, k, v: fn(q, k, v, alpha=ALPHA, causal=causal, scale=scale,
                                      block_q=tile, block_kv=tile, return_aux=True)[1])


def _sparsity_record(aux, within: int) -> dict:
    rec = {"block_sparsity": float(aux["block_sparsity"])}
    if "iterations" in aux:
        s = iteration_summary(aux["iterations"], within)
        rec.update(iterations_mean=s["mean"], iterations_max=s["max"],
                   iterations_within=s["within"])
    return rec


def _run_attention(config: EntmaxBenchConfig, log: Callable) -> dict:
    """The attention cases of ``config.attention_config()``, and per T the entmax time
    over blockwise and over softmax (forward, forward+backward)."""
    acfg = config.attention_config()
    records = run_cases(cases(acfg), repeats=acfg.repeats, warmup=acfg.warmup,
                        seed=acfg.seed, ref_max_len=acfg.ref_max_len, ref_slice=acfg.ref_slice,
                        command=lambda case: row_command(acfg, case), log=log)
    rows = []
    for t in config.seq_lens:
        row = {"seq_len": t}
        for r in records:
            if r["seq_len"] == t:
                row[r["variant"]] = _timing_of(r)
        ent = row.get("entmax")
        for key in ("forward", "fwd_bwd"):
            for base in ("blockwise", "softmax"):
                b = row.get(base)
                ok = ent and b and ent.get(key) and b.get(key)
                row[f"{key}_entmax_over_{base}"] = (
                    ent[key]["median_s"] / b[key]["median_s"] if ok else None)
        rows.append(row)
    return {"config": dataclasses.asdict(acfg), "rows": rows, "records": records}


def _timing_of(record: dict) -> dict:
    if record["status"] != "ok":
        return {"status": record["status"],
                "note": record.get("reason") or record.get("error")}
    return {key: {"median_s": record[key]["median_s"], "compile_s": record[key]["compile_s"],
                  "temp_bytes": record[key]["temp_bytes"]}
            for key in ("forward", "fwd_bwd") if key in record}


def _run_sparsity(config: EntmaxBenchConfig, model, log: Callable) -> dict:
    out = {"tiles": list(config.sparsity_tiles), "random": [], "model": []}
    for tile in config.sparsity_tiles:
        aux_fn = _aux_fn(config.causal, tile)
        for t in config.seq_lens:
            case = Case("entmax", t, batch=config.batch, heads=config.heads,
                        head_dim=config.head_dim, dtype=config.dtype, causal=config.causal)
            q, k, v, _ = make_inputs(case, config.seed)
            rec = {"seq_len": t, "tile": tile,
                   **_sparsity_record(jax.device_get(aux_fn(q, k, v)), config.within)}
            out["random"].append(rec)
            log(f"sparsity random T={t:>6} tile {tile}: {rec['block_sparsity']:.3f}")
    if model is None:
        return out
    layers = sorted({0, config.model_layers - 1})
    aux_fns = {}
    for t in config.model_sparsity_lens:
        auxes = {(layer, tile): [] for layer in layers for tile in config.sparsity_tiles}
        for window in _windows(config, t):
            captured = trained.capture_qkv(model, window[None])
            for layer, tile in auxes:
                q, k, v, scale = captured[layer]
                if (tile, scale) not in aux_fns:
                    aux_fns[tile, scale] = _aux_fn(True, tile, scale)
                auxes[layer, tile].append(jax.device_get(aux_fns[tile, scale](q, k, v)))
        for (layer, tile), per_window in auxes.items():
            recs = [_sparsity_record(a, config.within) for a in per_window]
            rec = {"seq_len": t, "tile": tile, "layer": layer, "windows": len(recs),
                   "block_sparsity": float(np.mean([r["block_sparsity"] for r in recs]))}
            if "iterations_within" in recs[0]:
                rec["iterations_within"] = float(np.mean([r["iterations_within"] for r in recs]))
                rec["iterations_max"] = max(r["iterations_max"] for r in recs)
            out["model"].append(rec)
            log(f"sparsity model layer {layer} T={t:>6} tile {tile}: "
                f"{rec['block_sparsity']:.3f}")
    return out


# ----------------------------------------------------------------------------
# (e) block-sparsity sweep: entmax vs blockwise softmax at long T
# ----------------------------------------------------------------------------
def locality_inputs(seq_len: int, heads: int, head_dim: int, locality: float, seed: int = 0):
    """RoPE'd random q, k [1, T, H, D] whose attention is local with strength ``locality``,
    random v and an output cotangent (float32).

    Per head a random direction c ~ N(0, I_D); before RoPE q_t = λ·c + ε_t, k_s = λ·c + ε'_s
    (ε, ε' ~ N(0, I_D), λ = ``locality``), then both are rotated by their positions
    (``lcjax.rope.apply_rope``). So q_t·k_s = λ²·c·R_{s-t}c + noise, where
    c·R_d c = Σ_m (c_{2m}² + c_{2m+1}²) cos(d·θ_m) is largest at d = 0 and decays with |d|:
    λ = 0 is plain N(0, 1) inputs (dense entmax supports), a larger λ sharpens the attention
    around the diagonal, so more tiles hold no weight (the measured block sparsity is what
    the sweep reports, not λ)."""
    from lcjax.rope import apply_rope

    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), seq_len), 7919)
    kc, kq, kk, kv, kw = jax.random.split(key, 5)
    shape = (1, seq_len, heads, head_dim)
    c = jax.random.normal(kc, (1, 1, heads, head_dim), jnp.float32)
    pos = jnp.arange(seq_len)
    q = apply_rope(locality * c + jax.random.normal(kq, shape, jnp.float32), pos)
    k = apply_rope(locality * c + jax.random.normal(kk, shape, jnp.float32), pos)
    return (q, k, jax.random.normal(kv, shape, jnp.float32),
            jax.random.normal(kw, shape, jnp.float32))


def crossing_point(points) -> float | None:
    """Block sparsity at which the time ratio crosses 1.0, from ``points`` [(sparsity,
    ratio), ...]: sorted by sparsity, the linear interpolation between the last point with
    ratio > 1 and the next one, so that every measured point beyond it has ratio ≤ 1.
    None when no point has ratio ≤ 1 after the last one above 1 (it never crosses); the
    lowest sparsity when every ratio is ≤ 1 (reported with ``below`` = True by
    :func:`sweep_crossings`)."""
    pts = sorted((float(s), float(r)) for s, r in points if r is not None)
    if not pts:
        return None
    above = [i for i, (_, r) in enumerate(pts) if r > 1.0]
    if not above:
        return pts[0][0]
    i = above[-1]
    if i == len(pts) - 1:
        return None
    (s0, r0), (s1, r1) = pts[i], pts[i + 1]
    return s0 + (r0 - 1.0) / (r0 - r1) * (s1 - s0)


def sweep_crossings(rows: list[dict]) -> list[dict]:
    """Per T and per time (``forward``, ``fwd_bwd``): the crossing point of the entmax /
    blockwise ratio (:func:`crossing_point`, all sources pooled), ``between`` (the measured
    sparsities that bracket it: its resolution), ``below`` (every point already ≤ 1), and
    the worst ratio among points with block sparsity ≥ 60%."""
    out = []
    for t in sorted({r["seq_len"] for r in rows}):
        at = [r for r in rows if r["seq_len"] == t]
        for key in ("forward", "fwd_bwd"):
            pts = [(r["block_sparsity"], r[f"{key}_ratio"]) for r in at]
            high = [ratio_ for s, ratio_ in pts if s >= SWEEP_SPARSITY]
            cross = crossing_point(pts)
            below = bool(pts) and all(x <= 1.0 for _, x in pts)
            ss = sorted(s for s, _ in pts)
            between = None
            if cross is not None and not below:
                between = [max(s for s in ss if s <= cross), min(s for s in ss if s >= cross)]
            out.append({"seq_len": t, "time": key, "crossing": cross, "between": between,
                        "below": below, "points": len(pts),
                        "worst_ratio_at_60": max(high) if high else None})
    return out


def _sweep_fns(config: EntmaxBenchConfig, scale: float | None):
    """name -> function of (q, k, v[, cot]): entmax (XLA path, α = 1.5; its forward also
    returns the block sparsity and the max solver steps of its ``aux``, a few reductions
    of what it computes anyway) and blockwise softmax, forward and the gradient of
    sum(out * cot) (forward+backward)."""
    ent, soft = attn.get("entmax"), attn.get("blockwise")
    opts = dict(alpha=ALPHA, causal=True, scale=scale, block_q=config.block_q,
                block_kv=config.block_kv, implementation="xla")

    def entmax_fwd(q, k, v):
        out, aux = ent(q, k, v, return_aux=True, **opts)
        return out, aux["block_sparsity"], jnp.max(aux["iterations"])

    def blockwise_fwd(q, k, v):
        return soft(q, k, v, causal=True, scale=scale)

    def grad_of(fwd):
        return jax.grad(lambda q, k, v, c: jnp.sum(fwd(q, k, v) * c), argnums=(0, 1, 2))

    return {"entmax fwd": entmax_fwd, "blockwise fwd": blockwise_fwd,
            "entmax fwd+bwd": grad_of(lambda q, k, v: ent(q, k, v, **opts)),
            "blockwise fwd+bwd": grad_of(blockwise_fwd)}


def _sweep_model(config: EntmaxBenchConfig, log: Callable):
    """A DecoderLM trained with α = 1.5 entmax attention (``sweep_heads`` x
    ``sweep_head_dim``, the shapes of the RoPE'd inputs) for ``sweep_train_steps``."""
    model_cfg, train_cfg = _train_cfgs(config)
    model_cfg = dataclasses.replace(
        model_cfg, num_heads=config.sweep_heads, num_kv_heads=config.sweep_heads,
        head_dim=config.sweep_head_dim, attention="entmax",
        attention_options={"alpha": ALPHA}, max_len=max(config.sweep_seq_lens))
    train_cfg = dataclasses.replace(train_cfg, steps=config.sweep_train_steps,
                                    seq_len=config.sweep_train_seq_len,
                                    warmup_steps=min(100, config.sweep_train_steps // 10))
    log(f"(e) training an entmax DecoderLM ({model_cfg.num_layers} layers, "
        f"d={model_cfg.d_model}, {model_cfg.num_heads} heads x {model_cfg.head_dim}) for "
        f"{train_cfg.steps} steps at T={train_cfg.seq_len} ...")
    model, info = trained.train_model(model_cfg, train_cfg, log)
    return model, info, train_cfg


def _sweep_inputs(config: EntmaxBenchConfig, model, train_cfg, seq_len: int):
    """(source, label, (q, k, v, cot), scale) of every sweep point at ``seq_len``."""
    for lam in config.sweep_locality:
        yield ("rope", f"locality {lam:g}",
               locality_inputs(seq_len, config.sweep_heads, config.sweep_head_dim, lam,
                               config.seed), None)
    if model is None:
        return
    window = trained.heldout_windows(seq_len, 1, train_cfg)
    cot_key = jax.random.fold_in(jax.random.key(config.seed), 31 * seq_len + 1)
    for layer, (q, k, v, scale) in enumerate(trained.capture_qkv(model, window)):
        cot = jax.random.normal(cot_key, q.shape, jnp.float32)
        if np.isclose(scale, 1.0 / np.sqrt(q.shape[-1]), rtol=1e-6):
            scale = None  # the default: the RoPE'd points' compiled functions serve it
        yield "model", f"model layer {layer}", (q, k, v, cot), scale


def _run_sweep(config: EntmaxBenchConfig, log: Callable) -> dict:
    """Every sweep point: its measured block sparsity and the four times, interleaved
    round by round (``sweep_repeats`` rounds, compile excluded, one compile per shape);
    the ratios entmax / blockwise and the crossing points."""
    model = train_cfg = info = None
    if config.sweep_train_steps > 0:
        model, info, train_cfg = _sweep_model(config, log)
    compiled, rows = {}, []
    for t in config.sweep_seq_lens:
        for source, label, (q, k, v, cot), scale in _sweep_inputs(config, model, train_cfg, t):
            key = (q.shape, k.shape, scale)
            if key not in compiled:
                start = time.perf_counter()
                fns = _sweep_fns(config, scale)
                compiled[key] = {name: compile_fn(fn, (q, k, v) if "bwd" not in name
                                                  else (q, k, v, cot))[0]
                                 for name, fn in fns.items()}
                log(f"(e) compiled T={t} {tuple(q.shape)} in {time.perf_counter() - start:.0f} s")
            fns = compiled[key]
            times, outs = {name: [] for name in fns}, {}
            for _ in range(max(config.sweep_repeats, 1)):
                for name in times:
                    args = (q, k, v) if "bwd" not in name else (q, k, v, cot)
                    seconds, outs[name] = time_compiled(fns[name], args, repeats=1, warmup=0)
                    times[name] += seconds
            _, sparsity, steps = jax.device_get(outs["entmax fwd"])
            med = {name: float(np.median(ts)) for name, ts in times.items()}
            row = {"source": source, "label": label, "seq_len": t,
                   "shape": list(q.shape), "scale": scale,
                   "block_sparsity": float(sparsity), "iterations_max": int(steps),
                   "times_s": times, "median_s": med}
            for key_, name in (("forward", "fwd"), ("fwd_bwd", "fwd+bwd")):
                row[f"{key_}_ratio"] = med[f"entmax {name}"] / med[f"blockwise {name}"]
                row[f"{key_}_ratio_min"] = (min(times[f"entmax {name}"])
                                            / min(times[f"blockwise {name}"]))
            rows.append(row)
            log(f"(e) T={t:>6} {label:<16} block sparsity {row['block_sparsity']:.3f}  "
                f"entmax/blockwise fwd {row['forward_ratio']:.2f}  "
                f"fwd+bwd {row['fwd_bwd_ratio']:.2f}")
    out = {"rows": rows, "crossings": sweep_crossings(rows),
           "entmax": {"alpha": ALPHA, "implementation": "xla", "solver": "histogram",
                      "block_q": config.block_q, "block_kv": config.block_kv},
           "blockwise": "lcjax.attention.get('blockwise') defaults (BlockwiseConfig)"}
    if info is not None:
        out["model"] = info
    for c in out["crossings"]:
        log(f"(e) crossing T={c['seq_len']} {c['time']}: {_crossing_text(c)}")
    return out


def _crossing_text(c: dict) -> str:
    if c["below"]:
        return "entmax is faster at every measured sparsity"
    if c["crossing"] is None:
        return "no crossing: entmax is slower up to the sparsest point measured"
    text = f"ratio crosses 1.0 at block sparsity {c['crossing']:.3f}"
    if c.get("between"):
        lo, hi = c["between"]
        text += f" (interpolated between the measured sparsities {lo:.3f} and {hi:.3f})"
    return text


# ----------------------------------------------------------------------------
# (d) the PyPI entmax package
# ----------------------------------------------------------------------------
def peer_missing() -> list[str]:
    """Modules of the peer that are not installed (``torch``, ``entmax``)."""
    return [m for m in ("torch", "entmax") if importlib.util.find_spec(m) is None]


def _run_peer(config: EntmaxBenchConfig, log: Callable) -> dict:
    missing = peer_missing()
    if missing:
        msg = f"peer skipped: {', '.join(missing)} not installed; install with {PEER_INSTALL}"
        log(msg)
        return {"skipped": msg}
    import entmax as peer  # noqa: PLC0415 - optional, heavy
    import torch  # noqa: PLC0415

    n = config.peer_n
    x = jax.random.normal(jax.random.fold_in(jax.random.key(config.seed), 3000), (n, n),
                          jnp.float32)
    xt = torch.from_numpy(np.asarray(x).copy())

    def no_grad(f):
        def call(t):
            with torch.no_grad():
                return f(t)
        return call

    pairs = {  # label -> (ours, the peer's)
        "entmax15": (entmax15, no_grad(lambda t: peer.entmax15(t, dim=-1))),
        "sparsemax": (sparsemax, no_grad(lambda t: peer.sparsemax(t, dim=-1))),
        "entmax_bisect α=1.5": (lambda a: entmax_bisect(a, ALPHA),
                                no_grad(lambda t: peer.entmax_bisect(t, alpha=ALPHA, dim=-1))),
        "softmax": (jax.nn.softmax, no_grad(lambda t: torch.softmax(t, dim=-1))),
    }
    fns = {}
    for label, (ours, theirs) in pairs.items():
        fns[f"ours {label}"] = (ours, (x,), True)
        fns[f"torch {label}"] = (theirs, (xt,), False)
    log(f"peer: entmax {getattr(peer, '__version__', '?')}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads) on [{n}, {n}] float32 ...")
    stats, outs = time_interleaved(fns, repeats=config.repeats, warmup=config.warmup)
    soft, soft_min = stats["ours softmax"]["median_s"], stats["ours softmax"]["min_s"]
    rows = []
    for label in pairs:
        ours, theirs = stats[f"ours {label}"], stats[f"torch {label}"]
        diff = float(np.max(np.abs(np.asarray(outs[f"ours {label}"])
                                   - outs[f"torch {label}"].numpy())))
        rows.append({"function": label, "ours_s": ours["median_s"],
                     "peer_s": theirs["median_s"],
                     "ours_over_peer": ours["median_s"] / theirs["median_s"],
                     "ours_over_jax_softmax": ours["median_s"] / soft,
                     # the same ratios from the fastest call of each: less sensitive to load
                     "ours_over_peer_min": ours["min_s"] / theirs["min_s"],
                     "ours_over_jax_softmax_min": ours["min_s"] / soft_min,
                     "max_abs_diff": diff,
                     "ours_times_s": ours["times_s"], "peer_times_s": theirs["times_s"]})
        log(f"  {label:<20} ours {ms(ours['median_s'])} ms  peer {ms(theirs['median_s'])} ms"
            f"  ours/peer {ours['median_s'] / theirs['median_s']:.3f}  max|diff| {diff:.1e}")
    return {"n": n, "entmax_version": getattr(peer, "__version__", None),
            "torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
            "input": "N(0, 1) float32", "rows": rows}


# ----------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------
def run_entmax_benchmark(config: EntmaxBenchConfig, *, log: Callable = print) -> dict:
    """Run the parts of ``config``; write reports if ``config.out_dir``.

    Returns a JSON-ready dict: ``config``, ``command``, ``machine``, one entry per part
    (``iterations``, ``model``, ``attention``, ``sparsity``, ``peer``; a part that cannot
    run holds ``{"skipped": reason}``), ``checks`` (the targets with PASS/FAIL) and
    ``files`` when written.
    """
    result = {"config": dataclasses.asdict(config), "command": config_to_command(config),
              "machine": machine_info()}
    parts = set(config.parts)
    reason = _entmax_available()
    model = model_rows = None
    if config.train_steps > 0 and ("iterations" in parts or ("sparsity" in parts
                                                             and not reason)):
        model, result["model"] = _train_model(config, log)
        if "iterations" in parts:
            model_rows = _model_rows(model, config)
            result["model"]["rows"] = {str(k): list(v.shape) for k, v in model_rows.items()}
    if "iterations" in parts:
        log("(a) solver iterations, alpha=1.5 ...")
        result["iterations"] = _run_iterations(config, model_rows, log)
    for part, letter in (("attention", "b"), ("sparsity", "c")):
        if part not in parts:
            continue
        if reason:
            log(f"({letter}) {part} skipped: {reason}")
            result[part] = {"skipped": reason}
        else:
            log(f"({letter}) {part} ...")
            result[part] = (_run_attention(config, log) if part == "attention"
                            else _run_sparsity(config, model, log))
    if "peer" in parts:
        log("(d) peer: the PyPI entmax package ...")
        result["peer"] = _run_peer(config, log)
    if "sweep" in parts:
        if reason:
            log(f"(e) sweep skipped: {reason}")
            result["sweep"] = {"skipped": reason}
        else:
            log("(e) block-sparsity sweep ...")
            result["sweep"] = _run_sweep(config, log)
    result["machine"]["finished"] = machine_info()["date"]
    result["checks"] = checks(result)
    if config.out_dir:
        result["files"] = write_entmax_reports(result, config.out_dir)
    return result


def checks(result: dict) -> list[dict]:
    """The issue's targets that this result measured, each with its verdict."""
    out = []
    pooled = result.get("iterations", {}).get("pooled", {})
    for group in ("random", "model"):
        if group in pooled:
            s = pooled[group]["histogram"]
            out.append(check(TARGETS, "histogram_within", s["within"],
                              f"histogram solver rows in <= {s['within_steps']} steps "
                              f"({group} rows, {s['rows']})"))
    peer = result.get("peer", {})
    if "rows" in peer:
        row = {r["function"]: r for r in peer["rows"]}
        out.append(check(TARGETS, "peer_entmax15_speedup",
                         1.0 / row["entmax15"]["ours_over_peer"],
                          "our entmax15 speed-up over the entmax package's entmax15"))
        out.append(check(TARGETS, "entmax15_over_softmax",
                         row["entmax15"]["ours_over_jax_softmax"],
                          "our entmax15 (histogram) time / jax.nn.softmax time"))
    for c in result.get("sweep", {}).get("crossings", []):
        if c["time"] == "fwd_bwd":
            out.append(check(TARGETS, "sweep_fwd_bwd_over_blockwise", c["worst_ratio_at_60"],
                             f"T={c['seq_len']}: worst entmax/blockwise fwd+bwd time at block "
                             f"sparsity >= {SWEEP_SPARSITY:.0%}"))
    return out


# ----------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------
def _counts_text(summary: dict, top: int = 6) -> str:
    items = sorted(summary["counts"].items(), key=lambda kv: int(kv[0]))
    text = ", ".join(f"{k}:{v}" for k, v in items[:top])
    return text + (", ..." if len(items) > top else "")


def format_iterations(part: dict) -> str:
    header = ("| rows | method | mean steps | max | <= 2 steps | steps: rows | "
              "residual < tol | max residual |")
    lines = [header, "|---" * 8 + "|"]
    for s in part["sources"]:
        for m in METHODS:
            r = s["methods"][m]
            lines.append(
                f"| {s['source']} ({s['rows']}x{s['row_len']}) | {m} | {r['mean']:.2f} "
                f"| {r['max']} | {pct(r['within'])} | {_counts_text(r)} "
                f"| {pct(r['converged'])} | {r['residual_max']:.1e} |")
    for group, per in part["pooled"].items():
        for m in ("histogram", "bisect"):
            r = per[m]
            what = "all rows" if group == "all" else f"all {group} rows"
            lines.append(f"| **{what}** ({r['rows']}) | {m} | {r['mean']:.2f} "
                         f"| {r['max']} | {pct(r['within'])} | {_counts_text(r)} | | |")
    return "\n".join(lines)


def format_mapping_times(part: dict) -> str:
    lines = ["| rows | function | median ms | / jax.nn.softmax |", "|---|---|---|---|"]
    for t in part["timing"].values():
        for name, s in t["stats"].items():
            lines.append(f"| {t['rows']} {tuple(t['shape'])} | {name} | {ms(s['median_s'])} "
                         f"| {s['over_softmax']:.2f} |")
    return "\n".join(lines)


def format_attention(part: dict) -> str:
    """The attention records' table, then entmax's time over blockwise and softmax per T."""
    lines = [format_records(part["records"]), "",
             "| T | entmax/blockwise fwd | entmax/softmax fwd | entmax/blockwise f+b "
             "| entmax/softmax f+b |", "|---|---|---|---|---|"]
    for r in part["rows"]:
        cells = [ratio(r[f"{key}_entmax_over_{base}"]) for key in ("forward", "fwd_bwd")
                 for base in ("blockwise", "softmax")]
        lines.append(f"| {r['seq_len']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_sparsity(part: dict) -> str:
    lines = ["| inputs | T | tile | block sparsity | in-attention rows <= 2 steps "
             "| max steps |", "|---|---|---|---|---|---|"]
    for r in part["random"] + part["model"]:
        what = ("random q, k, v" if "layer" not in r
                else f"model layer {r['layer']} ({r['windows']} windows)")
        lines.append(f"| {what} | {r['seq_len']} | {r['tile']}x{r['tile']} "
                     f"| {r['block_sparsity']:.3f} | {pct(r.get('iterations_within'))} "
                     f"| {r.get('iterations_max', '-')} |")
    return "\n".join(lines)


def format_peer(part: dict) -> str:
    if "skipped" in part:
        return part["skipped"]
    lines = [f"entmax {part['entmax_version']}, torch {part['torch_version']} "
             f"({part['torch_threads']} threads), input [{part['n']}, {part['n']}] "
             f"{part['input']}. Ours: entmax15 and sparsemax by the histogram-initialised "
             "solver (the default), entmax_bisect stopping at |Σp - 1| < 1e-5; the package's: "
             "entmax15 and sparsemax sort-based (k=None), entmax_bisect 50 halvings.", "",
             "| function | ours ms | entmax package / torch ms | ours / peer "
             "| ours / jax.nn.softmax | same two ratios of the fastest calls | max abs diff |",
             "|---|---|---|---|---|---|---|"]
    for r in part["rows"]:
        lines.append(f"| {r['function']} | {ms(r['ours_s'])} | {ms(r['peer_s'])} "
                     f"| {r['ours_over_peer']:.3f} | {r['ours_over_jax_softmax']:.2f} "
                     f"| {r['ours_over_peer_min']:.3f}, {r['ours_over_jax_softmax_min']:.2f} "
                     f"| {r['max_abs_diff']:.1e} |")
    return "\n".join(lines)


def format_sweep(part: dict) -> str:
    """The sweep's table (one row per point) and the crossing points."""
    e = part["entmax"]
    lines = [f"entmax: α = {e['alpha']:g}, {e['implementation']} path, {e['solver']} solver, "
             f"tiles {e['block_q']}x{e['block_kv']} (the granularity of block sparsity and of "
             f"the skipped work); blockwise: {part['blockwise']}. Causal, batch 1, float32; "
             "times are medians of interleaved rounds (all four functions once per round), "
             "compile excluded. Ratio = entmax time / blockwise softmax time on the same "
             "inputs (min: the same ratio of the fastest calls).", "",
             "| inputs | T | [B, T, H, D] | block sparsity | max steps | entmax fwd ms "
             "| blockwise fwd ms | fwd ratio (min) | entmax f+b ms | blockwise f+b ms "
             "| f+b ratio (min) |", "|---" * 11 + "|"]
    for r in sorted(part["rows"], key=lambda r: (r["seq_len"], r["source"],
                                                  r["block_sparsity"])):
        m = r["median_s"]
        lines.append(
            f"| {r['label']} | {r['seq_len']} | {r['shape']} | {r['block_sparsity']:.3f} "
            f"| {r['iterations_max']} | {ms(m['entmax fwd'])} | {ms(m['blockwise fwd'])} "
            f"| {ratio(r['forward_ratio'])} ({ratio(r['forward_ratio_min'])}) "
            f"| {ms(m['entmax fwd+bwd'])} | {ms(m['blockwise fwd+bwd'])} "
            f"| {ratio(r['fwd_bwd_ratio'])} ({ratio(r['fwd_bwd_ratio_min'])}) |")
    lines += ["", "Crossing points (block sparsity at which entmax / blockwise crosses 1.0, "
              "linear interpolation between the measured points, all inputs pooled):", ""]
    for c in part["crossings"]:
        worst = c["worst_ratio_at_60"]
        lines.append(f"- T={c['seq_len']} {'fwd+bwd' if c['time'] == 'fwd_bwd' else 'fwd'}: "
                     f"{_crossing_text(c)}; worst ratio at block sparsity >= "
                     f"{SWEEP_SPARSITY:.0%}: {ratio(worst)}")
    if "model" in part:
        m = part["model"]
        lines += ["", f"Trained points: {m['model']}, trained {m['train']} in "
                  f"{m['train_s']:.0f} s, loss {m['first_loss']:.3f} -> {m['final_loss']:.3f}; "
                  "q, k, v of each layer captured (lcjax.nn.capture_attention, tap 'inputs') "
                  "on one held-out window of length T (beyond the training length)."]
    return "\n".join(lines)


def format_summary(result: dict, *, markdown: bool = False) -> str:
    """Everything measured, as printed by ``python -m experiments.entmax.bench`` (``markdown``: with
    section headings, for ``entmax.md``)."""
    h = "## " if markdown else ""
    blocks = []
    if "model" in result:
        m = result["model"]
        blocks.append(f"{h}Trained model\n\n{m['model']}, trained {m['train']['steps']} steps "
                      f"({m['train']}) in {m['train_s']:.0f} s, loss {m['first_loss']:.3f} -> "
                      f"{m['final_loss']:.3f}" + (f", held-out {m['eval']['eval_bpb']:.3f} "
                                                  "bits/byte" if m["eval"] else "")
                      + f". Score rows: {m.get('rows', '-')} (layer: [rows, keys]).")
    sections = (("iterations", "(a) solver steps to |sum p - 1| < tol, alpha = 1.5",
                 lambda p: format_iterations(p) + "\n\n" + RESIDUAL_NOTE
                 + "\n\nMapping time (median of interleaved calls):\n\n"
                 + format_mapping_times(p)),
                ("attention", "(b) attention time, memory and error",
                 format_attention),
                ("sparsity", "(c) block sparsity", format_sparsity),
                ("peer", "(d) the PyPI entmax package", format_peer),
                ("sweep", "(e) block-sparsity sweep: entmax vs blockwise softmax",
                 format_sweep))
    for key, title, fmt in sections:
        if key in result:
            part = result[key]
            body = part["skipped"] if "skipped" in part else fmt(part)
            blocks.append(f"{h}{title}\n\n{body}")
    targets = format_checks(result["checks"])
    blocks.append(f"{h}Targets\n\n```\n{targets}\n```" if markdown else targets)
    return "\n\n".join(blocks)


def _markdown(result: dict) -> str:
    m, cfg = result["machine"], result["config"]
    lines = [
        "# α-entmax benchmark",
        "",
        f"Command: `{result['command']}`",
        "",
        machine_line(m),
        "",
        *([f"Note: {result['note']}", ""] if result.get("note") else []),
        f"Timing: median of {cfg['repeats']} after {cfg['warmup']} warm-up, compile "
        "excluded; in (a) and (d) the functions compared are interleaved round by round."
        + (f" Attention: B={cfg['batch']} H={cfg['heads']} D={cfg['head_dim']} "
           f"{'causal' if cfg['causal'] else 'non-causal'} {cfg['dtype']}, entmax α=1.5 "
           f"(histogram solver, tiles {cfg['block_q']}x{cfg['block_kv']}); dense softmax up "
           f"to T={cfg['dense_max_len']}." if "attention" in result else ""),
        "",
        format_summary(result, markdown=True),
        "",
    ]
    lines += [f"![{name}]({name}.png)\n" for name in _plots(result)]
    return "\n".join(lines)


def _plots(result: dict) -> dict:
    """The PNGs this result has data for: name -> plot function."""
    plots = {}
    if "iterations" in result:
        plots["entmax_iterations"] = _plot_iterations
    if any(k in result and "skipped" not in result[k] for k in ("attention", "sparsity")):
        plots["entmax_attention"] = _plot_attention
    if "sweep" in result and "skipped" not in result["sweep"]:
        plots["entmax_sweep"] = _plot_sweep
    return plots


def _plot_sweep(result: dict, path: str) -> None:
    from matplotlib.figure import Figure

    part = result["sweep"]
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    lens = sorted({r["seq_len"] for r in part["rows"]})
    for ax, key, title in zip(fig.subplots(1, 2), ("forward", "fwd_bwd"),
                              ("forward", "forward + backward")):
        for i, t in enumerate(lens):
            for source, marker in (("rope", "o"), ("model", "s")):
                pts = sorted((r["block_sparsity"], r[f"{key}_ratio"]) for r in part["rows"]
                             if r["seq_len"] == t and r["source"] == source)
                if pts:
                    ax.plot(*zip(*pts), linestyle="-" if source == "rope" else "none",
                            marker=marker,
                            color=f"C{i}", label=f"T={t}, " + (
                                "RoPE'd q, k (locality sweep)" if source == "rope"
                                else "entmax-trained model layers"))
            for c in part["crossings"]:
                if c["seq_len"] == t and c["time"] == key and c["crossing"] is not None:
                    ax.axvline(c["crossing"], color=f"C{i}", linestyle=":", linewidth=1)
        ax.axhline(1.0, color="k", linewidth=0.8)
        ax.axvline(SWEEP_SPARSITY, color="grey", linestyle="--", linewidth=0.8,
                   label=f"{SWEEP_SPARSITY:.0%} (AdaSplash-2 parity claim)")
        ax.set_yscale("log")
        ax.set_xlim(-0.02, 1.02)
        ax.set_xlabel("measured block sparsity (entmax tiles without weight)")
        ax.set_ylabel("entmax time / blockwise softmax time")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    m = result["machine"]
    fig.suptitle(f"α = 1.5 entmax (XLA) vs blockwise softmax, causal float32 "
                 f"({m['backend']}, {m['usable_cpus']} CPUs); dotted: crossing points")
    fig.savefig(path, dpi=110)


def _plot_iterations(result: dict, path: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    axes = fig.subplots(1, 2)
    sources = result["iterations"]["sources"]
    width = 0.8 / max(len(sources), 1)
    for ax, method in zip(axes, ("histogram", "bisect")):
        for i, s in enumerate(sources):
            counts = s["methods"][method]["counts"]
            xs = np.array(sorted(int(k) for k in counts))
            total = sum(counts.values())
            ax.bar(xs - 0.4 + (i + 0.5) * width, [100 * counts[str(x)] / total for x in xs],
                   width=width, color=f"C{i}", label=s["source"],
                   hatch="" if s["group"] == "random" else "//")
        if method == "histogram":
            within = sources[0]["methods"][method]["within_steps"] if sources else 2
            ax.axvline(within + 0.5, color="k", linestyle=":", label=f"<= {within} steps")
        ax.set_title(method + (" (AdaSplash-2 initialisation)" if method == "histogram"
                               else " (early stop at tol)"))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("solver steps to |Σp - 1| < tol")
        ax.set_ylabel("% of rows")
        ax.set_yscale("log")
        ax.grid(True, which="both", axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("α = 1.5 threshold: steps per row (sort: exact, 0 steps)")
    fig.savefig(path, dpi=110)


def _plot_attention(result: dict, path: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 9), layout="constrained")
    (ax_t, ax_r), (ax_m, ax_s) = fig.subplots(2, 2)
    att = result.get("attention", {})
    if "rows" in att:
        plot_records(ax_t, ax_m, att["records"])
        for j, base in enumerate(("blockwise", "softmax")):
            for key, style in (("forward", "-"), ("fwd_bwd", "--")):
                pts = [(r["seq_len"], r[f"{key}_entmax_over_{base}"]) for r in att["rows"]
                       if r[f"{key}_entmax_over_{base}"] is not None]
                if pts:
                    ax_r.plot(*zip(*pts), style, marker="o", color=f"C{j + 3}",
                              label=f"entmax / {base}" + ("" if key == "forward" else
                                                          " fwd+bwd"))
        ax_r.axhline(1.0, color="k", linewidth=0.8)
    sp = result.get("sparsity", {})
    if "random" in sp:
        series = {}
        for r in sp["random"] + sp["model"]:
            what = "random q, k" if "layer" not in r else f"model layer {r['layer']}"
            series.setdefault((what, r["tile"]), []).append((r["seq_len"], r["block_sparsity"]))
        whats = list(dict.fromkeys(w for w, _ in series))
        styles = dict(zip(sp["tiles"], ("-", "--", ":", "-.")))
        for (what, tile), pts in series.items():
            ax_s.plot(*zip(*pts), styles.get(tile, "-"), marker="o",
                      color=f"C{whats.index(what)}", label=f"{what}, tiles {tile}x{tile}")
        ax_s.set_ylim(0, 1)
    log_axes(ax_t, "median time (s)")
    log_axes(ax_r, "time ratio")
    log_axes(ax_m, "compiled temp memory (MiB)")
    log_axes(ax_s, "block sparsity (skipped tiles)", log_y=False)
    fig.suptitle(figure_title("entmax (α=1.5) vs softmax attention", result["config"],
                              result["machine"]))
    fig.savefig(path, dpi=110)


def report_stem(parts) -> str:
    """``entmax`` (``entmax.json``, ``entmax.md``), or ``entmax_sweep`` for a sweep-only run,
    so that ``--sweep`` does not overwrite the report of the other parts."""
    return "entmax_sweep" if tuple(parts) == ("sweep",) else "entmax"


def write_entmax_reports(result: dict, out_dir: str) -> dict[str, str]:
    """Write ``<stem>.json``, ``<stem>.md`` (:func:`report_stem`) and the PNGs into
    ``out_dir``."""
    return write_report(result, out_dir, report_stem(result["config"]["parts"]),
                        _markdown(result), _plots(result))


# ----------------------------------------------------------------------------
# Command line: ``python -m experiments.entmax.bench``
# ----------------------------------------------------------------------------
def _tuple_of(kind):
    return lambda text: tuple(kind(x) for x in text.split(",") if x.strip())


# (flag, parser, help): each sets the EntmaxBenchConfig field of the flag's name
_FLAGS = (
    ("--rows", int, "(a) random rows per scale"),
    ("--row-len", int, "(a) random row length"),
    ("--scales", _tuple_of(float), "(a) scales sigma of the N(0, 1) rows"),
    ("--train-steps", int, "steps of the trained model; 0 = no model rows"),
    ("--model-windows", int, "held-out windows fed to the model"),
    ("--model-row-len", int, "(a) held-out window length for the model rows"),
    ("--model-sparsity-lens", _tuple_of(int), "(c) window lengths on the trained model"),
    ("--seq-lens", _tuple_of(int), "(b, c) sequence lengths T"),
    ("--dense-max-len", int, "(b) longest T of the dense softmax"),
    ("--sparsity-tiles", _tuple_of(int), "(c) square tile sizes whose sparsity is counted"),
    ("--peer-n", int, "(d) rows = columns of the peer comparison"),
    ("--sweep-seq-lens", _tuple_of(int), "(e) sequence lengths T of the sweep"),
    ("--sweep-heads", int, "(e) heads of the sweep inputs and of its trained model"),
    ("--sweep-head-dim", int, "(e) head dim of the sweep inputs and of its trained model"),
    ("--sweep-locality", _tuple_of(float), "(e) locality scales of the RoPE'd inputs"),
    ("--sweep-train-steps", int, "(e) steps of the entmax-trained model; 0 = none"),
    ("--sweep-train-seq-len", int, "(e) training length of that model"),
    ("--sweep-repeats", int, "(e) interleaved timing rounds"),
    ("--repeats", int, "timed calls"),
    ("--warmup", int, "untimed calls first"),
    ("--seed", int, "random inputs"),
)


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def config_to_command(config: EntmaxBenchConfig) -> str:
    """The ``python -m experiments.entmax.bench`` command line that reruns ``config``."""
    flags = [("--parts", config.parts)]
    flags += [(flag, getattr(config, _dest(flag))) for flag, _, _ in _FLAGS]
    return command_line(["python", "-m", "experiments.entmax.bench"],
                        flags + [("--out", config.out_dir or "none")])


def add_arguments(sub) -> None:
    """Register ``entmax`` on the ``lcjax bench`` subparsers ``sub``."""
    d = EntmaxBenchConfig()
    p = sub.add_parser("entmax", help="α-entmax: solver steps, attention time, block "
                       "sparsity, the PyPI entmax package")
    p.add_argument("--parts", type=_tuple_of(str), default=None,
                   help=f"comma list of {','.join(PARTS)} (default {','.join(DEFAULT_PARTS)})")
    p.add_argument("--sweep", action="store_true",
                   help="only the block-sparsity sweep (e): the same as --parts sweep")
    p.add_argument("--quick", action="store_true",
                   help="small sizes (EntmaxBenchConfig.quick()); flags given override it")
    for flag, kind, help_text in _FLAGS:
        p.add_argument(flag, type=kind, default=None,
                       help=f"{help_text} (default {getattr(d, _dest(flag))!r})")
    p.add_argument("--out", default=d.out_dir,
                   help=f"report folder, 'none' writes no files (default {d.out_dir})")


def config_from_args(args) -> EntmaxBenchConfig:
    """The configuration described by parsed ``bench entmax`` arguments."""
    fields = ("parts",) + tuple(_dest(flag) for flag, _, _ in _FLAGS)
    given = {f: getattr(args, f) for f in fields if getattr(args, f) is not None}
    given["out_dir"] = None if args.out.lower() in ("", "none") else args.out
    if getattr(args, "sweep", False):
        given["parts"] = ("sweep",)
    return EntmaxBenchConfig.quick(**given) if args.quick else EntmaxBenchConfig(**given)


def run_cli(args) -> int:
    """``python -m experiments.entmax.bench``: run, print the summary and the verdicts; 0 on
    completion."""
    result = run_entmax_benchmark(config_from_args(args))
    print_bench_result(result, format_summary)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags of :func:`add_arguments`, parsed from ``argv`` (without the program name)."""
    return parse_bench_args("entmax", add_arguments, argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.entmax.bench [flags]``: parse, run, print; 0 on completion."""
    return run_cli(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
