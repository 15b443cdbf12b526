"""An in-process idempotency store over a dict: the reference semantics, for unit tests.

It implements exactly what the Redis and SQL stores implement, with a lock
standing in for their atomicity and ``time.monotonic`` for their clocks. It
shares nothing across processes, and forgets everything on restart: never use
it to make a real side effect happen once.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ..exceptions import EffectPendingError
from .core import Claim, validate_key

__all__ = ["MemoryIdempotencyStore"]


@dataclass
class _Entry:
    claim_id: str
    claimed_at: float
    expires_at: float
    outcome: str | None = None
    done: bool = False


class MemoryIdempotencyStore:
    """Idempotency keys in this process's memory. Thread-safe.

    :param clock: seconds, monotonic; injectable so tests can move time.
    """

    volatile = True

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def claim(self, key: str, *, retention: float, reclaim_after: float | None) -> Claim:
        validate_key(key)
        with self._lock:
            now = self._clock()
            entry = self._entries.get(key)
            if entry is not None and entry.expires_at > now:
                if entry.done:
                    return Claim(key, entry.claim_id, done=True, outcome=entry.outcome)
                age = now - entry.claimed_at
                if reclaim_after is None or age < reclaim_after:
                    raise EffectPendingError(key=key, age=age)
            claim_id = uuid.uuid4().hex
            self._entries[key] = _Entry(claim_id, claimed_at=now, expires_at=now + retention)
            return Claim(key, claim_id)

    def record(self, claim: Claim, outcome: str, *, retention: float) -> bool:
        with self._lock:
            now = self._clock()
            entry = self._entries.get(claim.key)
            if entry is None or entry.claim_id != claim.claim_id or entry.done or entry.expires_at <= now:
                return False
            entry.done, entry.outcome, entry.expires_at = True, outcome, now + retention
            return True

    def forget(self, claim: Claim) -> None:
        with self._lock:
            entry = self._entries.get(claim.key)
            if entry is not None and entry.claim_id == claim.claim_id and not entry.done:
                del self._entries[claim.key]

    def __repr__(self) -> str:
        return f"<MemoryIdempotencyStore {len(self._entries)} key(s)>"
