"""The ZooKeeper session: the client, its connection state, and what dies with it.

A :class:`Session` builds (lazily) or adopts the KazooClient, follows its
state changes, rebuilds it after ``fork()``, and keeps what belongs to the
session: the leases held on it, the acquirers waiting in a lock queue, and
lock nodes it may have left behind. Errors: nothing is sent while the session
is suspended or lost (kazoo would queue the request and send it later,
perhaps on a new session); waiting for it past a deadline, or using a closed
source, raises :class:`~celery_fencing.TokenUnavailableError`, and a caller's
client that crossed ``fork()`` raises
:class:`~celery_fencing.FencingConfigurationError`. State changes mark every
held lease lost and wake every waiter; state listeners' exceptions are logged.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from ...exceptions import FencingConfigurationError, TokenUnavailableError
from ...values import seconds as validated_seconds

__all__ = ["HeldLease", "Session", "session_of"]

# One logger for the whole package, named as the module was before it became one.
log = logging.getLogger(__package__)


class HeldLease(Protocol):
    """What the session needs of a lease it holds: its lock node, and being told it is gone."""

    lock_path: str

    def _mark_lost(self, reason: str, *, notify: bool = True) -> None: ...

    def _after_fork(self) -> None: ...


# Sessions of open sources, reset in a forked child before any of its threads run.
_sessions: weakref.WeakSet[Session] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for session in list(_sessions):
        session.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Session:
    """One source's connection to the ensemble. Thread-safe.

    *hosts* builds a client of its own (with *options* from the source), or
    *client* is the caller's, never started or stopped here.
    """

    def __init__(
        self,
        hosts: str | None,
        client: KazooClient | None,
        *,
        timeout: float,
        session_timeout: float,
        options: Callable[[], dict[str, Any]],
    ) -> None:
        self.hosts = hosts
        self.timeout = timeout
        self.session_timeout = session_timeout
        self._options = options
        self.owns_client = client is None
        self.client: Any = client
        self.pid = os.getpid()
        self._forked_client = False
        self.closed = False
        self.connected = threading.Event()
        self._state = "NOT_STARTED"
        # Guards client creation, leases, waiters and orphans; never held across a ZooKeeper call.
        self.lock = threading.Lock()
        self.leases: set[HeldLease] = set()
        # Set to wake acquirers waiting in a lock queue when the session is in trouble.
        self.waiters: set[threading.Event] = set()
        # (lock directory, lock-node prefix) of lock nodes this session may have left
        # behind when a create or delete did not complete in time.
        self.orphans: set[tuple[str, str]] = set()
        #: Deletes the orphans, in a thread of its own, when the session is (re)connected.
        self.clean_orphans: Callable[[Any], object] | None = None
        self._listener: Callable[[str], None] | None = None
        self._state_listeners: list[Callable[[str], object]] = []
        if client is not None:
            self._attach(client)
        _sessions.add(self)

    @property
    def state(self) -> str:
        return "CLOSED" if self.closed else self._state

    def where(self) -> str:
        return self.hosts if self.hosts is not None else "the caller's client"

    def add_state_listener(self, callback: Callable[[str], object]) -> None:
        with self.lock:
            self._state_listeners.append(callback)

    def remove_state_listener(self, callback: Callable[[str], object]) -> None:
        with self.lock, contextlib.suppress(ValueError):
            self._state_listeners.remove(callback)

    def deadline(self, timeout: float | None) -> float:
        seconds = self.timeout if timeout is None else validated_seconds("timeout", timeout)
        return time.monotonic() + seconds

    def usable_client(self, resource: str | None) -> Any:
        """The client to send with, built and started on first use (and again after a fork)."""
        if self.pid != os.getpid():
            # Forked through a path that skipped os.register_at_fork (C-level fork()).
            self.after_fork()
        if self.closed:
            raise TokenUnavailableError("ZooKeeperTokenSource is closed", resource=resource)
        if self._forked_client:
            raise FencingConfigurationError(
                "the KazooClient given to ZooKeeperTokenSource was created before fork(); a kazoo client "
                "must not cross fork(): build the client (and the source) in the child process, "
                "e.g. in Celery's worker_process_init"
            )
        client = self.client
        if client is None:
            built = None
            with self.lock:
                if self.closed:
                    raise TokenUnavailableError("ZooKeeperTokenSource is closed", resource=resource)
                if self.client is None:
                    # Assigned before it starts, so the listener accepts its first CONNECTED.
                    self.client = built = self._build_client()
                client = self.client
            if built is not None:
                # Outside the lock (the listener takes it). start_async does not wait:
                # callers wait for CONNECTED within their own timeouts.
                built.start_async()
        return client

    def await_connected(self, client: Any, deadline: float, resource: str | None) -> None:
        remaining = deadline - time.monotonic()
        if not self.connected.wait(max(0.0, remaining)):
            raise TokenUnavailableError(
                f"no ZooKeeper session ({self.state}) with {self.where()} within the timeout; nothing was sent",
                resource=resource,
            )

    def require_connected(self, client: Any, resource: str | None) -> None:
        # The last look before a request is queued: kazoo would hold a request made
        # while SUSPENDED and send it after reconnecting, perhaps on a new session.
        if self.closed:
            raise TokenUnavailableError("ZooKeeperTokenSource is closed", resource=resource)
        if not (client.connected and client.state == KazooState.CONNECTED):
            raise TokenUnavailableError(
                f"ZooKeeper session is {client.state} ({self.where()}); refusing to send", resource=resource
            )

    def close(self, abandon: Callable[[Any, str], object]) -> None:
        """Mark held leases lost, ``abandon(client, lock_path)`` each one's lock node, and stop an own client."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            leases, self.leases = list(self.leases), set()
            waiters = list(self.waiters)
            client = self.client if self.pid == os.getpid() else None
            if self.owns_client:
                self.client = None
        for event in waiters:
            event.set()
        for lease in leases:
            lease._mark_lost("the token source was closed")
            if client is not None and client.connected:
                # Fire and forget: the next holder need not wait for our session to end.
                abandon(client, lease.lock_path)
        self.connected.clear()
        if client is None:
            return
        if self._listener is not None:
            client.remove_listener(self._listener)
        if self.owns_client:
            stopper = threading.Thread(target=_stop_client, args=(client,), name="fencing-zk-close", daemon=True)
            stopper.start()
            stopper.join(self.timeout)

    def after_fork(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.waiters = set()
        self.orphans = set()
        leases, self.leases = self.leases, set()
        for lease in leases:
            lease._after_fork()
        if self.owns_client:
            # The parent's client: its threads did not survive the fork and its session
            # is the parent's. Drop it without stopping it; a new one is built on use.
            self.client = None
            self._listener = None
            self._state = "NOT_STARTED"
        else:
            self._forked_client = True

    # Internal -----------------------------------------------------------------

    def _build_client(self) -> Any:
        client = KazooClient(
            hosts=self.hosts,
            timeout=self.session_timeout,
            # Reconnect forever, but at least once a second: kazoo's default backoff
            # grows to an hour, leaving a source offline long after ZooKeeper is back.
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, ignore_expire=True),
            **self._options(),
        )
        self._attach(client)
        return client

    def _attach(self, client: Any) -> None:
        listener = functools.partial(self._on_state, client)
        self._listener = listener
        client.add_listener(listener)
        if client.connected and client.state == KazooState.CONNECTED:
            self._state = "CONNECTED"
            self.connected.set()
        elif not self.owns_client:
            self._state = str(client.state)

    def _on_state(self, client: Any, state: str) -> None:
        # Called on kazoo's connection thread: record, wake waiters, never block or call ZooKeeper.
        if client is not self.client:
            return  # a client this source has let go of (closed, or the parent's after fork)
        self._state = str(state)
        if state == KazooState.CONNECTED:
            self.connected.set()
            if self.orphans and self.clean_orphans is not None:
                threading.Thread(
                    target=self.clean_orphans, args=(client,), name="fencing-zk-cleanup", daemon=True
                ).start()
        else:
            self.connected.clear()
            with self.lock:
                leases = list(self.leases)
                waiters = list(self.waiters)
                if state == KazooState.LOST:
                    # An expired session's ephemeral nodes are gone with it.
                    self.orphans.clear()
            for lease in leases:
                lease._mark_lost(f"ZooKeeper session {state}")
            for event in waiters:
                event.set()
        # Last, so a listener sees the source's own view already updated.
        with self.lock:
            callbacks = list(self._state_listeners)
        for callback in callbacks:
            try:
                callback(str(state))
            except Exception:
                log.exception("fencing ZooKeeper state listener %r failed", callback)


def session_of(client: Any) -> int | None:
    """The client's current session id, ``None`` while it has none."""
    client_id = client.client_id
    return None if client_id is None else int(client_id[0])


def _stop_client(client: Any) -> None:
    try:
        client.stop()
        client.close()
    except Exception:
        log.debug("error while stopping the ZooKeeper client", exc_info=True)
