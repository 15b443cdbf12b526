"""Idempotency keys: make a side effect at most once per key, and give repeats the first outcome.

For sinks that cannot check a fencing token (a payment or e-mail API, a
third-party HTTP service, an append-only log), the next best thing is to make
retries and re-deliveries of the *same* effect harmless. Each effect gets a
key derived from the task (``"<task id>:<operation>"``, or a function of the
arguments), recorded with the effect's outcome; a repeat finds the key and
returns the first outcome instead of acting again.

* :func:`idempotent` (decorator) and :func:`run_once` (function) around a
  call to an external system: claim the key, call, record the outcome.
  **At most once** by default; **at least once** with ``reclaim_after``.
  Neither is exactly once: read :mod:`celery_fencing.idempotency.core` for
  what happens when the process dies between the call and the record.
* ``RedisIdempotencyStore.eval_once`` and ``SQLIdempotencyStore.transaction_once``
  for an effect *inside* the store: the key is recorded in the same script or
  transaction as the effect, so it is exactly once.

Stores: :class:`MemoryIdempotencyStore` (unit tests), ``RedisIdempotencyStore``
(``[redis]`` extra) and ``SQLIdempotencyStore`` (``[sql]`` extra; PostgreSQL,
SQLite), imported lazily so naming one imports its driver only then.

Keys make repeats of one effect harmless; they do not order different
effects: a stale execution of task A can still act on an external resource
after task B did, because B's effect has another key. Where the sink can
compare, use a gate or a conditional write (:mod:`celery_fencing.gates.http`);
see the "When the storage cannot check tokens" page of the docs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _lazy
from .core import (
    DEFAULT_RETENTION,
    MAX_KEY_LENGTH,
    Claim,
    IdempotencyStore,
    idempotency_key,
    idempotent,
    run_once,
    validate_key,
)
from .memory import MemoryIdempotencyStore

if TYPE_CHECKING:
    from .redis import RedisIdempotencyStore
    from .sql import SQLIdempotencyStore

__all__ = [
    "DEFAULT_RETENTION",
    "MAX_KEY_LENGTH",
    "Claim",
    "IdempotencyStore",
    "MemoryIdempotencyStore",
    "RedisIdempotencyStore",
    "SQLIdempotencyStore",
    "idempotency_key",
    "idempotent",
    "run_once",
    "validate_key",
]

_LAZY = {"RedisIdempotencyStore": ".redis", "SQLIdempotencyStore": ".sql"}


__getattr__ = _lazy.lazy_names(__name__, _LAZY, globals())
