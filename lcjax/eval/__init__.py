"""One evaluator for lcjax models, Python callables and OpenAI-compatible endpoints.

    from lcjax.eval import EndpointConfig, evaluate, write_report
    res = evaluate("runs/a", "ruler", lengths=(1024, 2048), depths=(0, 0.5, 1), n_per_cell=4)
    res = evaluate(lambda prompts: [...], "nolima", lengths=(1024,))
    res = evaluate(EndpointConfig("http://127.0.0.1:8000", model="m", concurrency=8), "ruler",
                   lengths=(4096,), results_file="out/results.jsonl", resume=True)
    write_report(res, "out")   # results.json, results.md, <task>_heatmap.png

See docs/long_context_eval.md ("Evaluator").
"""

from lcjax.lazy import lazy_exports

# public name -> the module that defines it, imported on first access (lcjax.lazy)
_EXPORTS = {
    "DEFAULT_DEPTHS": "lcjax.data.items",
    "EvalItem": "lcjax.data.items",
    "build_items": "lcjax.data.items",
    "parse_depths": "lcjax.data.items",
    "parse_lengths": "lcjax.data.items",
    "EndpointConfig": "lcjax.eval.endpoint",
    "EndpointError": "lcjax.eval.endpoint",
    "complete": "lcjax.eval.endpoint",
    "endpoint_runner": "lcjax.eval.endpoint",
    "EvalResults": "lcjax.eval.evaluate",
    "evaluate": "lcjax.eval.evaluate",
    "make_runner": "lcjax.eval.evaluate",
    "max_answer_tokens": "lcjax.eval.evaluate",
    "format_markdown": "lcjax.eval.report",
    "plot_heatmap": "lcjax.eval.report",
    "write_report": "lcjax.eval.report",
    "read_results": "lcjax.eval.results",
    "summarize": "lcjax.eval.results",
    "bucket_length": "lcjax.eval.runners",
    "callable_runner": "lcjax.eval.runners",
    "length_buckets": "lcjax.eval.runners",
    "model_runner": "lcjax.eval.runners",
    "with_attention": "lcjax.eval.runners",
    "load_model": "lcjax.train.checkpoint",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
