"""Timing primitives shared by the benchmarks.

Wall-clock times are medians over ``repeats`` calls of an already compiled
executable, after ``warmup`` untimed calls, so compilation never enters a timing;
compile time is measured separately. Memory is XLA's compiled temporary-buffer
size, ``jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes``
(on CPU ``peak_memory_in_bytes`` ignores temporaries; see DESIGN.md).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from lcjax.reporting import json_default, machine_info  # noqa: F401  (moved; re-exported)

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
