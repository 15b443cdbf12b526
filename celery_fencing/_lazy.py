"""Names resolved on first access (PEP 562): a package keeps the names whose modules import a driver lazy."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, table: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for *package*: ``__getattr__ = lazy_names(__name__, _LAZY, globals())``.

    *table* maps each lazy name to the module that defines it (relative to
    *package* when it starts with a dot). The first access imports that
    module and keeps the value in *namespace*, so later ones are plain
    lookups. Any other name raises ``AttributeError``, as a module does.
    """

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    return __getattr__
