"""Benchmarks: ``lcjax bench attention``, ``lcjax bench entmax`` and their Python API.

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
from lcjax.bench.timing import machine_info, matmul_throughput, measure

__all__ = [
    "AttentionBenchConfig",
    "EntmaxBenchConfig",
    "attention_flops",
    "format_headline",
    "format_table",
    "headline",
    "iteration_summary",
    "machine_info",
    "matmul_throughput",
    "measure",
    "row_iterations",
    "run_attention_benchmark",
    "run_entmax_benchmark",
    "write_entmax_reports",
    "write_reports",
]
