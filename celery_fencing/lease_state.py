"""What every exclusive lease tracks, whatever grants it: held, lost (once, with a reason), released.

The ZooKeeper and etcd leases differ in how they find out that a lease is
gone (a watch and the session state; a keep-alive loop), not in what they
report: this base holds the shared part, with no driver import.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from .exceptions import LeaseLostError
from .token import FencingToken

__all__ = ["LeaseState"]


class LeaseState:
    """The state of one exclusive lease on *resource*. Thread-safe; lost in a forked child.

    Subclasses set ``_token`` when they mint under the lease, and call
    :meth:`_mark_lost` and :meth:`_mark_released` as the grantor tells them.
    """

    #: The logger that reports a lost lease (the subclass's module logger).
    _log: ClassVar[logging.Logger] = logging.getLogger(__name__)

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self._token: FencingToken | None = None
        self._lost = threading.Event()
        self._lost_reason: str | None = None
        self._released = threading.Event()
        self._callbacks: list[Callable[[Any], object]] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @property
    def token(self) -> FencingToken:
        """The token minted when the lease was taken (or by the last ``mint``)."""
        if self._token is None:
            raise LeaseLostError("this lease holds no token yet", resource=self.resource)
        return self._token

    @property
    def lost(self) -> bool:
        """Whether the lease was lost. A released lease is not lost."""
        return self._lost.is_set()

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost (``None`` while it is held)."""
        return self._lost_reason

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the lease is lost or *timeout* seconds pass; return ``lost``."""
        return self._lost.wait(timeout)

    def on_lost(self, callback: Callable[[Any], object]) -> None:
        """Call ``callback(lease)`` once when the lease is lost (at once if it already is).

        The callback runs in a thread of its own; its exceptions are logged.
        Callbacks are dropped when the lease is released without being lost.
        """
        with self._lock:
            if not self._lost.is_set():
                self._callbacks.append(callback)
                return
        self._run_callbacks([callback])

    def check(self) -> None:
        """Return if the lease is still held, else raise.

        :raises LeaseLostError: the lease was lost or released, or this is a forked child.
        """
        if self._pid != os.getpid():
            raise LeaseLostError(f"lease on {self.resource!r} was taken in another process", resource=self.resource)
        if self._lost.is_set():
            raise LeaseLostError(f"lease on {self.resource!r} was lost: {self._lost_reason}", resource=self.resource)
        if self._released.is_set():
            raise LeaseLostError(f"lease on {self.resource!r} was released", resource=self.resource)

    # Internal -----------------------------------------------------------------

    def _mark_lost(self, reason: str, *, notify: bool = True) -> None:
        """Record the loss once (not after a release), log it, and run the on_lost callbacks."""
        with self._lock:
            if self._lost.is_set() or self._released.is_set():
                return
            self._lost_reason = reason
            self._lost.set()
            callbacks, self._callbacks = self._callbacks, []
        self._log.warning("fencing lease on %r lost: %s", self.resource, reason)
        if notify and callbacks:
            self._run_callbacks(callbacks)

    def _mark_released(self) -> None:
        with self._lock:
            self._released.set()
            self._callbacks = []

    def _run_callbacks(self, callbacks: list[Callable[[Any], object]], what: str = "lost") -> None:
        def run() -> None:
            for callback in callbacks:
                try:
                    callback(self)
                except Exception:
                    self._log.exception("fencing lease on_%s callback %r failed", what, callback)

        threading.Thread(target=run, name=f"fencing-lease-{what}:{self.resource}", daemon=True).start()

    def _state_word(self) -> str:
        return "lost" if self.lost else "released" if self._released.is_set() else "held"
