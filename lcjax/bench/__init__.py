"""Benchmarks: ``lcjax bench attention``, ``lcjax bench entmax`` and their Python API.

One harness (``harness``: :class:`Case`, :func:`run_cases`; ``timing``; ``report``) and,
per method, its benchmark as data: ``attention`` turns every registered variant and each
sequence length into cases; ``entmax`` adds what is special to it (solver steps, block
sparsity, the PyPI peer). See ``docs/benchmarks.md``.

    from lcjax.bench import Case, run_cases
    records = run_cases([Case("blockwise", 1024, options={"block_q": 256})], repeats=3)

    from lcjax.bench import AttentionBenchConfig, run_attention_benchmark
    result = run_attention_benchmark(AttentionBenchConfig(seq_lens=(1024, 2048)))

    from lcjax.bench import EntmaxBenchConfig, run_entmax_benchmark
    result = run_entmax_benchmark(EntmaxBenchConfig.quick())
"""

from lcjax.bench.attention import (
    AttentionBenchConfig,
    attention_flops,
    format_headline,
    format_table,
    headline,
    run_attention_benchmark,
    write_reports,
)
from lcjax.bench.entmax import (
    EntmaxBenchConfig,
    iteration_summary,
    row_iterations,
    run_entmax_benchmark,
    write_entmax_reports,
)
from lcjax.bench.harness import Case, format_records, make_inputs, run_cases
from lcjax.bench.timing import machine_info, matmul_throughput, measure, time_interleaved

__all__ = [
    "AttentionBenchConfig",
    "Case",
    "EntmaxBenchConfig",
    "attention_flops",
    "format_headline",
    "format_records",
    "format_table",
    "headline",
    "iteration_summary",
    "machine_info",
    "make_inputs",
    "matmul_throughput",
    "measure",
    "row_iterations",
    "run_attention_benchmark",
    "run_cases",
    "run_entmax_benchmark",
    "time_interleaved",
    "write_entmax_reports",
    "write_reports",
]
