"""Benchmarks for users' own shapes and variants: ``lcjax bench attention`` (and
``context_parallel``, ``serve``) and their Python API.

One harness (``harness``: :class:`Case`, :func:`run_cases`; ``timing``; ``report``);
``attention`` turns every registered variant and each sequence length into cases. The
paper-claim benchmarks (entmax's solver steps, block sparsity, the PyTorch peer and trained
models; token-sparse, PLASH, FlashBlock) are lab code: ``python -m experiments.<method>.bench``
(``experiments/entmax/bench.py``, ...), built on this harness. See ``docs/benchmarks.md``.

    from lcjax.bench import Case, run_cases
    records = run_cases([Case("blockwise", 1024, options={"block_q": 256})], repeats=3)

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
from lcjax.bench.harness import Case, format_records, make_inputs, run_cases
from lcjax.bench.timing import machine_info, matmul_throughput, measure, time_interleaved

__all__ = [
    "AttentionBenchConfig",
    "Case",
    "attention_flops",
    "format_headline",
    "format_records",
    "format_table",
    "headline",
    "machine_info",
    "make_inputs",
    "matmul_throughput",
    "measure",
    "run_attention_benchmark",
    "run_cases",
    "time_interleaved",
    "write_reports",
]
