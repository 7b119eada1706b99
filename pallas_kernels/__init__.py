"""Pallas kernels, one file per kernel, each with a BlockSizes dataclass, a custom_vjp,
an ``interpret`` flag and a pure-jnp reference it is tested against.

Imports are lazy (PEP 562): ``import pallas_kernels.entmax_rules`` (plain jnp rules the
XLA paths share with the kernels) loads no kernel; the names below load theirs on first use.
"""

import importlib

__all__ = ["EntmaxBlockSizes", "entmax_attention_pallas", "entmax_attention_reference"]

_LAZY = {"EntmaxBlockSizes": ("pallas_kernels.entmax_attention", "BlockSizes"),
         "entmax_attention_pallas": ("pallas_kernels.entmax_attention", "entmax_attention_pallas"),
         "entmax_attention_reference": ("pallas_kernels.entmax_attention",
                                        "entmax_attention_reference")}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'pallas_kernels' has no attribute {name!r}")
    module, attr = _LAZY[name]
    return getattr(importlib.import_module(module), attr)
