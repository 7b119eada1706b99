"""Optional dependencies: the one place that turns a missing third-party package into a
one-line ``ImportError`` naming the ``lcjax`` extra that installs it.

The core install (``pip install lcjax``) is jax, flax, optax, orbax-checkpoint, chex, grain,
numpy, jaxtyping and tqdm. Everything else is an extra (pyproject.toml):

    serve        fastapi, uvicorn, jinja2, tokenizers      lcjax serve
    data         faker, sentencex, statsmodels, tokenizers lcjax.data's generators
    eval         requests, matplotlib, threadpoolctl       lcjax.eval, lcjax.analysis
    experiments  all of the above                           experiments/, make reproduce
    hf           safetensors, tokenizers, jinja2            lcjax.interop.hf, LoRA files

Use it around the imports of an extra's packages, at module level or in a function::

    with require("serve", "lcjax.serve"):
        from fastapi import FastAPI

which raises ``ImportError: lcjax.serve needs fastapi: pip install 'lcjax[serve]'``. Only a
missing third-party module is translated; a missing ``lcjax`` module (a bug) propagates as is.
No lcjax imports: any layer may use it.
"""

import contextlib
from collections.abc import Iterator

__all__ = ["EXTRAS", "require"]

# extra -> the top-level modules it provides (documentation and tests; require() reads the
# missing module's name from the error itself)
EXTRAS = {
    "serve": ("fastapi", "uvicorn", "starlette", "pydantic", "jinja2", "tokenizers"),
    "data": ("faker", "sentencex", "statsmodels", "tokenizers"),
    "eval": ("requests", "matplotlib", "threadpoolctl"),
    "hf": ("safetensors", "tokenizers", "jinja2"),
}
EXTRAS["experiments"] = tuple(dict.fromkeys(m for e in ("serve", "data", "eval", "hf")
                                            for m in EXTRAS[e]))

_OURS = ("lcjax", "pallas_kernels", "experiments")


@contextlib.contextmanager
def require(extra: str, needed_by: str) -> Iterator[None]:
    """Run the ``import`` statements of the block; if a third-party module is missing, raise
    ``ImportError("<needed_by> needs <module>: pip install 'lcjax[<extra>]'")``.

    ``extra`` must be a key of :data:`EXTRAS` (or ``gpu``/``tpu``/``peer``/``hf-peer``/
    ``tfds``); ``needed_by`` names the module or command that needs it.
    """
    if extra not in EXTRAS and extra not in ("gpu", "tpu", "peer", "hf-peer", "tfds"):
        raise ValueError(f"require: unknown extra {extra!r}; the extras are "
                         f"{sorted(EXTRAS)} and gpu, tpu, peer, hf-peer, tfds")
    try:
        yield
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if not top or top in _OURS:
            raise
        raise ImportError(f"{needed_by} needs {top}: pip install 'lcjax[{extra}]'",
                          name=err.name) from None
