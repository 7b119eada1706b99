"""The attention benchmark harness: one :class:`Case` per configuration, :func:`run_cases`
measures them all the same way.

A case names a registered variant (``lcjax.attention.spec(name)``), optionally one of its
implementations, its keyword options and the shapes::

    q: [B, T, H, D]; k, v: [B, T, Hkv, D]; dtype; causal

and for each case :func:`run_cases` measures, on random inputs shared by every case of the
same shapes (:func:`make_inputs`, derived from ``seed`` and T):

* forward          ``out = spec(q, k, v, causal=..., implementation=..., **options)``
* forward+backward the gradient of ``sum(out * c)`` w.r.t. (q, k, v), ``c`` a fixed random
                   cotangent (when ``case.backward``),

each jitted and compiled once (compile time reported apart), then timed as the median of
``repeats`` calls after ``warmup`` untimed ones (``lcjax.bench.timing.measure``), with XLA's
compiled temporary-buffer bytes. The error is the max abs difference, in float32, from the
spec's own ``reference`` (called with the options its signature accepts: ``alpha`` yes, a
block size of the implementation only if the reference takes it): all rows and the
gradients up to ``ref_max_len``; beyond it, the last ``ref_slice`` query rows when the
reference takes ``q_offset`` (rows of the exact reference), otherwise not measured.

Records are JSON-ready dicts (see :func:`run_case`); an implementation that cannot serve
the call (``NotImplementedError``, e.g. a Pallas kernel on CPU) gives ``status
"skipped"`` with the reason, any other exception ``status "error"``: one failing case
never stops a run.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from lcjax import attention as attn
from lcjax.bench.report import MiB, err, mib, ms
from lcjax.bench.timing import measure

__all__ = [
    "Case",
    "add_speedups",
    "format_records",
    "make_inputs",
    "plot_records",
    "progress_line",
    "reference_outputs",
    "run_case",
    "run_cases",
]


@dataclasses.dataclass(frozen=True)
class Case:
    """One attention configuration to measure.

    ``variant``: a registered name. ``implementation``: None (the spec's dispatch) or one
    of ``spec(variant).implementation_names``. ``label``: the row's name in reports
    (default: ``variant``, or ``variant@implementation``). ``kv_heads`` None means
    ``heads``. ``backward``: also time forward+backward. ``max_len``: beyond it the case
    is recorded as skipped (dense variants do not fit); None, no cap.
    """

    variant: str
    seq_len: int
    batch: int = 1
    heads: int = 8
    kv_heads: int | None = None
    head_dim: int = 64
    dtype: str = "float32"
    causal: bool = True
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    implementation: str | None = None
    label: str = ""
    backward: bool = True
    max_len: int | None = None

    def __post_init__(self):
        for field in ("seq_len", "batch", "heads", "head_dim"):
            if getattr(self, field) < 1:
                raise ValueError(f"Case: `{field}` must be >= 1, got {getattr(self, field)}")
        if self.heads % self.num_kv_heads:
            raise ValueError(f"Case: `heads` ({self.heads}) must be a multiple of "
                             f"`kv_heads` ({self.num_kv_heads})")

    @property
    def num_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def name(self) -> str:
        """The row label."""
        if self.label:
            return self.label
        return self.variant + (f"@{self.implementation}" if self.implementation else "")

    @property
    def shape(self) -> tuple:
        """What the random inputs depend on: (B, T, H, Hkv, D, dtype)."""
        return (self.batch, self.seq_len, self.heads, self.num_kv_heads, self.head_dim,
                self.dtype)


# ----------------------------------------------------------------------------
# Inputs and the reference
# ----------------------------------------------------------------------------
def make_inputs(case: Case, seed: int = 0):
    """Random N(0, 1) q [B, T, H, D], k, v [B, T, Hkv, D] and output cotangent [B, T, H, D]
    in ``case.dtype``; the same for every case of the same shapes, seed and T."""
    dtype = jnp.dtype(case.dtype)
    key = jax.random.fold_in(jax.random.key(seed), case.seq_len)
    kq, kk, kv, kc = jax.random.split(key, 4)
    q_shape = (case.batch, case.seq_len, case.heads, case.head_dim)
    kv_shape = (case.batch, case.seq_len, case.num_kv_heads, case.head_dim)
    return (jax.random.normal(kq, q_shape, dtype), jax.random.normal(kk, kv_shape, dtype),
            jax.random.normal(kv, kv_shape, dtype), jax.random.normal(kc, q_shape, dtype))


def _accepts(fn: Callable, name: str, *, var_keyword: bool = True) -> bool:
    """Whether ``fn`` names keyword ``name`` (or, with ``var_keyword``, takes ``**kw``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or (var_keyword and p.kind is p.VAR_KEYWORD) for p in params)


def _reference_options(fn: Callable, options: Mapping) -> dict:
    """The options of a case that the reference ``fn`` takes."""
    return {k: v for k, v in options.items() if _accepts(fn, k)}


def _forward(fn: Callable, causal: bool, options: Mapping) -> Callable:
    """``(q, k, v) -> out`` with ``causal`` and ``options`` bound."""
    return lambda q, k, v: fn(q, k, v, causal=causal, **options)


def _forward_backward(forward: Callable) -> Callable:
    """``(q, k, v, c) -> (dq, dk, dv)``: the gradient of sum(forward(q, k, v) * c)."""

    def loss(q, k, v, cot):
        return jnp.sum(forward(q, k, v).astype(jnp.float32) * cot.astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1, 2))


def _qualname(fn: Callable) -> str:
    module = getattr(fn, "__module__", "") or ""
    return f"{module}.{getattr(fn, '__qualname__', repr(fn))}".lstrip(".")


def reference_outputs(case: Case, q, k, v, cot, *, ref_max_len: int = 4096,
                      ref_slice: int = 256) -> dict:
    """The spec's reference on float32 inputs: ``{"reference": name, "method", "start",
    "out", "grads"}``. ``out`` is [B, T - start, H, D] (``start`` > 0: the last rows only,
    beyond ``ref_max_len``); ``grads`` (dq, dk, dv) when ``case.backward`` and T <=
    ``ref_max_len``, else None; ``out`` None when not measurable."""
    fn = attn.spec(case.variant).reference
    opts = _reference_options(fn, case.options)
    q, k, v, cot = (x.astype(jnp.float32) for x in (q, k, v, cot))
    ref = {"reference": _qualname(fn), "start": 0, "out": None, "grads": None}
    seq_len = q.shape[1]
    if seq_len <= ref_max_len:
        forward = _forward(fn, case.causal, opts)
        ref["out"] = jax.jit(forward)(q, k, v)
        if case.backward:
            ref["grads"] = jax.jit(_forward_backward(forward))(q, k, v, cot)
        return {**ref, "method": "full"}
    if not _accepts(fn, "q_offset", var_keyword=False):
        return {**ref, "method": f"not measured: T > {ref_max_len} and the reference takes "
                                  "no q_offset"}
    start = seq_len - min(ref_slice, seq_len)
    rows = jax.jit(lambda q, k, v: fn(q[:, start:], k, v, causal=case.causal, q_offset=start,
                                      **opts))
    return {**ref, "start": start, "out": rows(q, k, v), "method": f"last {seq_len - start} rows"}


def _max_abs_err(x, ref) -> float:
    return float(jnp.max(jnp.abs(x.astype(jnp.float32) - ref)))


# ----------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------
def _head(case: Case) -> dict:
    return {"variant": case.name, "name": case.variant, "implementation": case.implementation,
            "options": dict(case.options), "seq_len": case.seq_len, "batch": case.batch,
            "heads": case.heads, "kv_heads": case.num_kv_heads, "head_dim": case.head_dim,
            "dtype": case.dtype, "causal": case.causal}


def run_case(case: Case, inputs, ref: dict, *, repeats: int, warmup: int) -> dict:
    """Time, temp memory and error of one case on ``inputs`` (:func:`make_inputs`) against
    ``ref`` (:func:`reference_outputs`).

    Returns ``status "ok"`` with ``forward`` (and ``fwd_bwd``) stats (``compile_s``,
    ``median_s``, ``min_s``, ``times_s``, ``temp_bytes``), ``max_abs_err`` (None if not
    measured), ``err_method``, ``reference`` and ``grad_max_abs_err`` when the reference
    has gradients.
    """
    q, k, v, cot = inputs
    options = dict(case.options)
    if case.implementation is not None:
        options["implementation"] = case.implementation
    forward = _forward(attn.get(case.variant), case.causal, options)
    fwd_stats, out = measure(forward, (q, k, v), repeats=repeats, warmup=warmup)
    record = {"status": "ok", "forward": fwd_stats, "reference": ref["reference"],
              "err_method": ref["method"], "max_abs_err": None}
    if ref["out"] is not None:
        record["max_abs_err"] = _max_abs_err(out[:, ref["start"]:], ref["out"])
    del out
    if case.backward:
        stats, grads = measure(_forward_backward(forward), (q, k, v, cot), repeats=repeats,
                               warmup=warmup)
        record["fwd_bwd"] = stats
        if ref["grads"] is not None:
            record["grad_max_abs_err"] = max(_max_abs_err(g, r)
                                             for g, r in zip(grads, ref["grads"]))
    return record


def _failure(err: Exception, what: str = "") -> dict:
    """``skipped`` (with ``reason``) for NotImplementedError, else ``error``."""
    text = f"{what}{type(err).__name__}: {err}"[:800]
    if isinstance(err, NotImplementedError):
        return {"status": "skipped", "reason": text}
    return {"status": "error", "error": text}


def run_cases(cases: Sequence[Case], *, repeats: int = 5, warmup: int = 1, seed: int = 0,
              ref_max_len: int = 4096, ref_slice: int = 256,
              command: Callable[[Case], str] | None = None,
              log: Callable[[str], Any] = print) -> list[dict]:
    """Measure every case (:func:`run_case`), in order; one record per case.

    Inputs and references are computed once per shape (and per reference and its
    options) and kept while consecutive cases share the shape, so order cases by shape.
    ``command(case)``, when given, is stored as the record's ``command`` (the exact
    rerun command of that row).
    """
    records, inputs, refs, shape = [], None, {}, None
    for case in cases:
        head = _head(case)
        if command is not None:
            head["command"] = command(case)
        if case.max_len is not None and case.seq_len > case.max_len:
            record = {**head, "status": "skipped", "reason": f"T > max_len {case.max_len}"}
        else:
            if case.shape != shape:
                shape, inputs, refs = case.shape, make_inputs(case, seed), {}
            record = {**head, **_measured(case, inputs, refs, repeats, warmup,
                                          ref_max_len, ref_slice)}
        log(progress_line(record))
        records.append(record)
    return records


def _measured(case, inputs, refs, repeats, warmup, ref_max_len, ref_slice) -> dict:
    """run_case with the reference cached in ``refs``; failures recorded, not raised."""
    try:
        spec = attn.spec(case.variant)
        opts = _reference_options(spec.reference, case.options)
        key = (id(spec.reference), repr(sorted(opts.items())), case.causal, case.backward)
        if key not in refs:
            refs[key] = reference_outputs(case, *inputs, ref_max_len=ref_max_len,
                                          ref_slice=ref_slice)
    except Exception as err:  # noqa: BLE001 - a failing reference must not stop the run
        return _failure(err, "reference: ")
    try:
        return run_case(case, inputs, refs[key], repeats=repeats, warmup=warmup)
    except Exception as err:  # noqa: BLE001 - one failing case must not stop the run
        return _failure(err)


def add_speedups(records: Sequence[dict], anchor: str) -> None:
    """Set ``fwd_speedup_vs_anchor`` (and ``fwd_bwd_speedup_vs_anchor``) = the anchor
    label's median time / the record's, at the same shapes, on every measured record."""
    keys = ("seq_len", "batch", "heads", "kv_heads", "head_dim", "dtype", "causal")
    anchors = {tuple(r[k] for k in keys): r for r in records
               if r["variant"] == anchor and r["status"] == "ok"}
    for r in records:
        a = anchors.get(tuple(r[k] for k in keys))
        if a is None or r["status"] != "ok":
            continue
        for key, name in (("forward", "fwd_speedup_vs_anchor"),
                          ("fwd_bwd", "fwd_bwd_speedup_vs_anchor")):
            if key in r and key in a:
                r[name] = a[key]["median_s"] / r[key]["median_s"]


def progress_line(record: dict) -> str:
    """One log line for a record."""
    head = f"T={record['seq_len']:>6} {record['variant']:<14}"
    if record["status"] != "ok":
        return f"{head} {record['status']}: {record.get('reason') or record.get('error')}"
    fwd = record["forward"]
    line = (f"{head} fwd {ms(fwd['median_s'])} ms (compile {fwd['compile_s']:.1f} s, "
            f"temp {mib(fwd['temp_bytes'])} MiB)")
    if "fwd_bwd" in record:
        bwd = record["fwd_bwd"]
        line += f" | fwd+bwd {ms(bwd['median_s'])} ms (temp {mib(bwd['temp_bytes'])} MiB)"
    error = record["max_abs_err"]
    return line + (" | err -" if error is None else f" | err {error:.1e}")


# ----------------------------------------------------------------------------
# Reports of records: the table and the time / memory panels
# ----------------------------------------------------------------------------
def _speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_records(records: Sequence[dict], *, anchor: str | None = None) -> str:
    """Markdown table, one row per record: times, compile, temp memory, errors vs the
    reference; ``fwd / floor`` when the records carry ``fwd_over_floor``; the anchor's
    time over the variant's when ``anchor`` is given (:func:`add_speedups`)."""
    floor = any("fwd_over_floor" in r for r in records)
    header = ["variant", "T", "fwd ms", *(["fwd / floor"] if floor else []), "fwd+bwd ms",
              "compile s (fwd, fwd+bwd)", "temp MiB fwd", "temp MiB fwd+bwd",
              "max err vs reference", "grad err vs reference",
              *([f"{anchor} / variant fwd time"] if anchor else [])]
    rows = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for r in records:
        head = [r["variant"], str(r["seq_len"])]
        if r["status"] != "ok":
            note = r.get("reason") or r.get("error", "")
            rows.append("| " + " | ".join(head + [f"{r['status']}: {note}"]
                                          + [""] * (len(header) - 3)) + " |")
            continue
        fwd, bwd = r["forward"], r.get("fwd_bwd", {})
        compile_s = f"{fwd['compile_s']:.1f}" + (f", {bwd['compile_s']:.1f}" if bwd else "")
        cells = head + [ms(fwd["median_s"]), *([f"{r['fwd_over_floor']:.2f}"] if floor else []),
                        ms(bwd.get("median_s")), compile_s, mib(fwd["temp_bytes"]),
                        mib(bwd.get("temp_bytes")), err(r["max_abs_err"]),
                        err(r.get("grad_max_abs_err")),
                        *([_speedup(r.get("fwd_speedup_vs_anchor"))] if anchor else [])]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot_records(ax_time, ax_memory, records: Sequence[dict]) -> None:
    """Median time and compiled temp memory vs T, one colour per variant label (forward
    solid, forward+backward dashed), on two matplotlib axes."""
    labels = list(dict.fromkeys(r["variant"] for r in records))
    for i, label in enumerate(labels):
        recs = sorted((r["seq_len"], r) for r in records
                      if r["variant"] == label and r["status"] == "ok")
        ts = [t for t, _ in recs]
        for key, style in (("forward", "-"), ("fwd_bwd", "--")):
            if not recs or not all(key in r for _, r in recs):
                continue
            name = label + ("" if key == "forward" else " fwd+bwd")
            ax_time.plot(ts, [r[key]["median_s"] for _, r in recs], style, marker="o",
                         color=f"C{i % 10}", label=name)
            ax_memory.plot(ts, [max(r[key]["temp_bytes"] or 0, 1) / MiB for _, r in recs],
                           style, marker="o", color=f"C{i % 10}", label=name)
