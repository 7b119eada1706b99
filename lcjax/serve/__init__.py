"""``lcjax serve``: an OpenAI-compatible HTTP server for lcjax models.

    lcjax serve --checkpoint runs/a --port 8000           # an `lcjax train` run folder
    lcjax serve --checkpoint Qwen3-0.6B --port 8000       # a Hugging Face checkpoint folder

:func:`load_served` loads the model and tokenizer, :func:`create_app` builds the FastAPI app
(``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``), and its :class:`Batcher`
runs concurrent requests as one jitted :func:`lcjax.nn.generate` call. See
``docs/serve.md``.
"""

from lcjax.lazy import lazy_exports

# public name -> the module that defines it, imported on first access (lcjax.lazy)
_EXPORTS = {
    "APIError": "lcjax.serve.app",
    "ChatRequest": "lcjax.serve.app",
    "CompletionRequest": "lcjax.serve.app",
    "ServeLimits": "lcjax.serve.app",
    "create_app": "lcjax.serve.app",
    "cut_at_stop": "lcjax.serve.app",
    "Batcher": "lcjax.serve.batcher",
    "BatchStats": "lcjax.serve.batcher",
    "Generation": "lcjax.serve.batcher",
    "group_jobs": "lcjax.serve.batcher",
    "next_power_of_two": "lcjax.serve.batcher",
    "ByteTokenizer": "lcjax.serve.model",
    "HFTokenizer": "lcjax.serve.model",
    "ServedModel": "lcjax.serve.model",
    "load_served": "lcjax.serve.model",
    "render_byte_chat": "lcjax.serve.model",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
