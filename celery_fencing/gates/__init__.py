"""Gates: the storage side, where tokens are checked against a high-water mark.

* :class:`MemoryGate` - in-process reference semantics, for unit tests.
* :class:`RedisGate` - marks and checks in Lua scripts beside the data (``[redis]`` extra).
* :class:`SQLGate` - a mark table advanced inside the caller's transaction (``[sql]`` extra).

Driver-backed gates are imported lazily: naming one imports its driver only then.
"""

from __future__ import annotations

from .memory import MemoryGate

__all__ = ["MemoryGate"]


def __getattr__(name: str) -> object:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
