"""Gates: the storage side, where tokens are checked against a high-water mark.

* :class:`MemoryGate` - in-process reference semantics, for unit tests.
* :class:`RedisGate` - marks and checks in Lua scripts beside the data (``[redis]`` extra).
* :class:`SQLGate` - a mark table advanced inside the caller's transaction (``[sql]`` extra).
* :class:`DjangoGate` - the same in the Django ORM, inside ``transaction.atomic()`` (``[django]`` extra).

Driver-backed gates are imported lazily: naming one imports its driver only then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _lazy
from .memory import MemoryGate

if TYPE_CHECKING:
    from .django import DjangoGate
    from .redis import RedisGate
    from .sql import SQLGate

__all__ = ["DjangoGate", "MemoryGate", "RedisGate", "SQLGate"]

_LAZY = {"DjangoGate": ".django", "RedisGate": ".redis", "SQLGate": ".sql"}


__getattr__ = _lazy.lazy_names(__name__, _LAZY, globals())
