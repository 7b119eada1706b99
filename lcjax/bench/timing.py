"""Timing primitives shared by the benchmarks.

Wall-clock times are medians over ``repeats`` calls of an already compiled
executable, after ``warmup`` untimed calls, so compilation never enters a timing;
compile time is measured separately. Memory is XLA's compiled temporary-buffer
size, ``jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes``
(on CPU ``peak_memory_in_bytes`` ignores temporaries; see DESIGN.md).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

__all__ = [
    "compile_fn",
    "temp_bytes",
    "time_compiled",
    "measure",
    "time_interleaved",
    "matmul_throughput",
    "machine_info",
    "json_default",
]


def compile_fn(fn: Callable, args: Sequence[Any]):
    """Lower and compile ``jax.jit(fn)`` for ``args``; returns (compiled, seconds)."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


def temp_bytes(compiled) -> int | None:
    """XLA's temporary-buffer bytes of a compiled executable (None if unavailable)."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return int(analysis.temp_size_in_bytes)


def time_compiled(compiled, args: Sequence[Any], *, repeats: int, warmup: int):
    """Run ``compiled(*args)`` ``warmup`` times untimed, then ``repeats`` times timed.

    Returns (list of seconds per timed call, output of the last call).
    """
    out = None
    for _ in range(warmup):
        out = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return times, out


def _summary(times: list[float], **extra) -> dict:
    """``{**extra, median_s, min_s, times_s}`` of a list of seconds."""
    return {**extra, "median_s": statistics.median(times), "min_s": min(times),
            "times_s": times}


def measure(fn: Callable, args: Sequence[Any], *, repeats: int, warmup: int):
    """Compile, then time ``fn`` on ``args``.

    Returns (stats, output) where stats has ``compile_s``, ``median_s``, ``min_s``,
    ``times_s`` and ``temp_bytes``.
    """
    compiled, compile_s = compile_fn(fn, args)
    times, out = time_compiled(compiled, args, repeats=repeats, warmup=warmup)
    return _summary(times, compile_s=compile_s, temp_bytes=temp_bytes(compiled)), out


def time_interleaved(fns: dict[str, tuple[Callable, Sequence[Any], bool]], *, repeats: int,
                     warmup: int) -> tuple[dict, dict]:
    """Time several functions in interleaved rounds (one call of each per round), so that
    a change of machine load hits all of them alike.

    ``fns`` maps a name to ``(fn, args, jit)``: with ``jit`` the function is compiled first
    (compile time and temp bytes reported), otherwise called as is (e.g. a PyTorch
    function; ``compile_s`` and ``temp_bytes`` None). Returns (name -> stats as
    :func:`measure`'s, name -> output of the last call).
    """
    calls, extra, times, outs = {}, {}, {}, {}
    for name, (fn, args, jit) in fns.items():
        compile_s = temp = None
        if jit:
            fn, compile_s = compile_fn(fn, args)
            temp = temp_bytes(fn)
        calls[name], extra[name], times[name] = (fn, args), (compile_s, temp), []
    for fn, args in calls.values():
        if warmup > 0:
            time_compiled(fn, args, repeats=warmup, warmup=0)
    for _ in range(max(repeats, 1)):
        for name, (fn, args) in calls.items():
            seconds, outs[name] = time_compiled(fn, args, repeats=1, warmup=0)
            times[name] += seconds
    stats = {name: _summary(times[name], compile_s=c, temp_bytes=t)
             for name, (c, t) in extra.items()}
    return stats, outs


def matmul_throughput(n: int = 2048, *, repeats: int = 5, warmup: int = 1, seed: int = 0):
    """Throughput of one float32 ``jnp.dot`` of two [n, n] matrices (2 n^3 FLOPs).

    Returns a dict with ``n``, ``flops``, ``median_s``, ``times_s`` and ``gflops``
    (FLOPs / median time / 1e9): the machine's XLA matmul rate that attention
    floors are measured against.
    """
    ka, kb = jax.random.split(jax.random.key(seed))
    a = jax.random.normal(ka, (n, n), jnp.float32)
    b = jax.random.normal(kb, (n, n), jnp.float32)
    dot = lambda x, y: jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST)
    stats, _ = measure(dot, (a, b), repeats=max(repeats, 3), warmup=max(warmup, 1))
    flops = 2 * n**3
    return {
        "n": n,
        "flops": flops,
        "median_s": stats["median_s"],
        "times_s": stats["times_s"],
        "gflops": flops / stats["median_s"] / 1e9,
    }


def _git(*args: str) -> str | None:
    """Output of a read-only git command in this checkout, or None outside one."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", *args], cwd=here, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.rstrip() if out.returncode == 0 else None


def _git_state() -> dict:
    """HEAD commit and the tracked files modified since it (numbers may come from them)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    modified = None if status is None else [line[3:] for line in status.splitlines()]
    return {"git_commit": _git("rev-parse", "HEAD") or None, "git_modified": modified}


def json_default(obj):
    """``json.dump`` fallback for reports: dataclasses, arrays, numpy/jax scalars, paths."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if getattr(obj, "ndim", 0) > 0 and hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):  # numpy / jax scalars
        return obj.item()
    return str(obj)


def machine_info() -> dict:
    """Where and when the numbers were taken: platform, CPUs, JAX, devices, date."""
    device = jax.devices()[0]
    try:
        usable_cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable_cpus = os.cpu_count()
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus,
        "jax": jax.__version__,
        "jaxlib": _jaxlib_version(),
        "backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        **_git_state(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _jaxlib_version() -> str | None:
    try:
        import jaxlib

        return jaxlib.__version__
    except (ImportError, AttributeError):
        return None
