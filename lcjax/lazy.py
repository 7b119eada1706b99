"""Lazy package namespaces (PEP 562), a base utility that imports no other lcjax module.

A package ``__init__`` lists its public names and the submodule each lives in, and imports
nothing::

    _EXPORTS = {"DecoderLM": "lcjax.nn.decoder", ...}
    __all__ = sorted(_EXPORTS)
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

``from lcjax.nn import DecoderLM`` then imports ``lcjax.nn.decoder`` (and what it imports)
on first use, and ``import lcjax.nn`` alone imports no submodule. A submodule's name
(``lcjax.nn.decoder``) also resolves on attribute access, as with an eager ``__init__``.
A name defined in a submodule of the same name (``lcjax.tools.ast_check.ast_check``) is
bound when the package is imported: importing the submodule later would otherwise replace
the name with the module.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps each public name to the
    module that defines it; a name is imported on first access and then cached in the
    package's namespace."""
    exports = dict(exports)
    namespace = vars(sys.modules[package])
    for name, module in exports.items():
        if module == f"{package}.{name}":
            namespace[name] = getattr(importlib.import_module(module), name)

    def __getattr__(name: str):
        module = exports.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}"):
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
