"""One evaluator for lcjax models, Python callables and OpenAI-compatible endpoints.

    from lcjax.eval import EndpointConfig, evaluate, write_report
    res = evaluate("runs/a", "ruler", lengths=(1024, 2048), depths=(0, 0.5, 1), n_per_cell=4)
    res = evaluate(lambda prompts: [...], "nolima", lengths=(1024,))
    res = evaluate(EndpointConfig("http://127.0.0.1:8000", model="m", concurrency=8), "ruler",
                   lengths=(4096,), results_file="out/results.jsonl", resume=True)
    write_report(res, "out")   # results.json, results.md, <task>_heatmap.png

See docs/long_context_eval.md ("Evaluator").
"""

from lcjax.data.items import (
    DEFAULT_DEPTHS,
    EvalItem,
    build_items,
    parse_depths,
    parse_lengths,
)
from lcjax.eval.endpoint import EndpointConfig, EndpointError, complete, endpoint_runner
from lcjax.eval.evaluate import EvalResults, evaluate, make_runner, max_answer_tokens
from lcjax.eval.report import format_markdown, plot_heatmap, write_report
from lcjax.eval.results import read_results, summarize
from lcjax.eval.runners import (
    bucket_length,
    callable_runner,
    length_buckets,
    model_runner,
    with_attention,
)
from lcjax.train.checkpoint import load_model

__all__ = [
    "DEFAULT_DEPTHS",
    "EndpointConfig",
    "EndpointError",
    "EvalItem",
    "EvalResults",
    "build_items",
    "bucket_length",
    "callable_runner",
    "complete",
    "endpoint_runner",
    "evaluate",
    "format_markdown",
    "length_buckets",
    "load_model",
    "make_runner",
    "max_answer_tokens",
    "model_runner",
    "parse_depths",
    "parse_lengths",
    "plot_heatmap",
    "read_results",
    "summarize",
    "with_attention",
    "write_report",
]
