"""Benchmarks: ``lcjax bench attention`` and its Python API.

    from lcjax.bench import AttentionBenchConfig, run_attention_benchmark
    result = run_attention_benchmark(AttentionBenchConfig(seq_lens=(1024, 2048)))
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
from lcjax.bench.timing import machine_info, matmul_throughput, measure

__all__ = [
    "AttentionBenchConfig",
    "attention_flops",
    "format_headline",
    "format_table",
    "headline",
    "machine_info",
    "matmul_throughput",
    "measure",
    "run_attention_benchmark",
    "write_reports",
]
