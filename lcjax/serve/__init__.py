"""``lcjax serve``: an OpenAI-compatible HTTP server for lcjax models.

    lcjax serve --checkpoint runs/a --port 8000           # an `lcjax train` run folder
    lcjax serve --checkpoint Qwen3-0.6B --port 8000       # a Hugging Face checkpoint folder

:func:`load_served` loads the model and tokenizer, :func:`create_app` builds the FastAPI app
(``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``), and its :class:`Batcher`
runs concurrent requests as one jitted :func:`lcjax.nn.generate` call. See
``docs/serve.md``.
"""

from lcjax.serve.app import (
    APIError,
    ChatRequest,
    CompletionRequest,
    ServeLimits,
    create_app,
    cut_at_stop,
)
from lcjax.serve.batcher import Batcher, BatchStats, Generation, group_jobs, next_power_of_two
from lcjax.serve.model import (
    ByteTokenizer,
    HFTokenizer,
    ServedModel,
    load_served,
    render_byte_chat,
)

__all__ = [
    "APIError",
    "BatchStats",
    "Batcher",
    "ByteTokenizer",
    "ChatRequest",
    "CompletionRequest",
    "Generation",
    "HFTokenizer",
    "ServeLimits",
    "ServedModel",
    "create_app",
    "cut_at_stop",
    "group_jobs",
    "load_served",
    "next_power_of_two",
    "render_byte_chat",
]
