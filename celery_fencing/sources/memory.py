"""An in-process token source for unit tests. Volatile: never use it to protect data.

Its counter lives in memory, so a restart starts again from 1 and every token
minted after the restart is below the marks already stored: every writer is
then refused, or, where marks were lost too, stale writers get in. It logs a
warning when created, and the Celery layer refuses it as a worker's source
unless ``fencing_allow_volatile_source`` is set.
"""

from __future__ import annotations

import logging
import secrets
import threading

from ..token import FencingToken, validate_resource

__all__ = ["MemoryTokenSource"]

logger = logging.getLogger(__name__)


class MemoryTokenSource:
    """Mints tokens from one in-memory counter shared by all resources.

    Thread-safe. Not shared across processes: each process has its own counter,
    so use it only where one process mints.
    """

    #: Marks this source as unsafe for production; the Celery layer checks it.
    volatile = True
    #: ``ceiling()`` is one counter for every resource.
    ceiling_is_global = True

    def __init__(self, start: int = 0) -> None:
        #: A new id per instance: a "restarted" memory source is a new grantor.
        self.grantor = f"memory-{secrets.token_hex(8)}"
        self._lock = threading.Lock()
        self._last = start
        self._closed = False
        logger.warning(
            "MemoryTokenSource is volatile: its counter is lost on restart. Use it for tests only, "
            "never to protect data (use zookeeper:// or sqlite://)."
        )

    def mint(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """Return a token above every token this source minted before. *timeout* is ignored."""
        validate_resource(resource)
        with self._lock:
            self._last += 1
            return FencingToken(resource, self._last, self.grantor)

    def ceiling(self, resource: str | None = None, *, timeout: float | None = None) -> int:
        """Return the last value minted, for any resource."""
        with self._lock:
            return self._last

    def grantor_id(self, *, timeout: float | None = None) -> str:
        """Return this instance's grantor id."""
        return self.grantor

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"<MemoryTokenSource last={self._last}>"
