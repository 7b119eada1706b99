"""α-entmax attention, one folder: the mapping (``mapping``: α-entmax, sparsemax, the
threshold solvers), the one config (``config``: :class:`EntmaxConfig`), the dense reference
(``reference``), the XLA implementation (``xla``), the specs ``"entmax"``/``"sparsemax"``
and their Pallas dispatch (``method``), and length scaling (``length_scaling``: the specs
``"asentmax"`` and ``"ssmax"``). The kernel is ``pallas_kernels.entmax_attention``, imported
only when a call dispatches to it.
"""

from lcjax.attention.entmax.config import AUX, EntmaxConfig
from lcjax.attention.entmax.length_scaling import (
    ASENTMAX,
    SSMAX,
    asentmax_reference,
    length_factor,
    ssmax_reference,
    visible_key_counts,
)
from lcjax.attention.entmax.mapping import (
    alpha_from_param,
    entmax,
    entmax15,
    entmax_bisect,
    entmax_threshold,
    sparsemax,
)
from lcjax.attention.entmax.method import (
    ENTMAX,
    SPARSEMAX,
    entmax_attention,
    sparsemax_attention,
)
from lcjax.attention.entmax.reference import entmax_attention_reference
from lcjax.attention.entmax.xla import block_sparsity

__all__ = [
    "ASENTMAX", "AUX", "ENTMAX", "SPARSEMAX", "SSMAX", "EntmaxConfig", "alpha_from_param",
    "asentmax_reference", "block_sparsity", "entmax", "entmax15", "entmax_attention",
    "entmax_attention_reference", "entmax_bisect", "entmax_threshold", "length_factor",
    "sparsemax", "sparsemax_attention", "ssmax_reference", "visible_key_counts",
]
