"""Package re-exports that load on first use (PEP 562), so importing one light submodule of a
package (a command's options, say) does not import what its siblings need (torch, transformers)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` re-exporting ``exports`` (module ->
    names it provides): a name's module is imported when the name is first read, then the name is
    cached on the package. Assign both in the package's ``__init__``."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__


def load_component(ref: str | Callable) -> Any:
    """``"package.module:attr"`` -> the object, as in ``[tool.flwr.app.components]`` (a callable, as
    a release kind registered at run time may give, is returned as it is)."""
    if callable(ref):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
