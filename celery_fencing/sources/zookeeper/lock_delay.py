"""Lock-delay: the per-resource holder record, and waiting out a failed holder's delay on ZooKeeper's clock.

The record ``<root>/holders/<name>`` (a small JSON document) says ``held``,
``released`` or ``failed``, and which lock node it was about. Every write to
it is a multi-op checked against the writer's own lock node, so a holder that
lost its lock records nothing; a clean release marks it ``released`` in the
same multi-op that deletes the lock node, and anything else that ends a hold
leaves ``held`` behind, which the next holder reads as a failure. The delay
counts from the ``mtime`` of the ``failed`` write (the leader's clock), and
"now" is the ``mtime`` of a write to ``<root>/clock``: local clocks only pace
the sleeps. docs/sinks.md ("Lock-delay") tells the whole protocol.

Errors: a lock node found gone raises :class:`~celery_fencing.LeaseLostError`
(nothing written); a delay that outlasts the deadline, a lease lost while
waiting, or a failed request raise
:class:`~celery_fencing.TokenUnavailableError`, leaving ``failed`` in place so
that the next acquirer continues the countdown. Unreadable records count as
``held`` by an unknown holder: when in doubt, delay.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import socket
import time
from typing import Any, Protocol

from kazoo.exceptions import BadVersionError, NoNodeError
from kazoo.protocol.states import KazooState, ZnodeStat

from ...exceptions import LeaseLostError, TokenUnavailableError
from .calls import create_path, request, send_checked_set
from .names import Layout, lock_prefix
from .orphans import delete_lock_node, track_orphan
from .session import Session

__all__ = ["HolderRecords", "whoami"]

log = logging.getLogger(__package__)

_HOLDER_STATES = frozenset({"held", "released", "failed"})


class _Holder(Protocol):
    """What the holder record needs of a lease."""

    resource: str
    lock_path: str
    lock_delay_waited: float
    _recorded: bool

    @property
    def lost_reason(self) -> str | None: ...

    def wait_lost(self, timeout: float | None = None) -> bool: ...

    def _mark_lost(self, reason: str, *, notify: bool = True) -> None: ...


def whoami() -> str:
    """Who holds a lock: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _holder_record(state: str, lock: str, holder: str) -> bytes:
    """A holder record: ``held``, ``released`` or ``failed``, the lock node's name and who held it."""
    return json.dumps({"state": state, "lock": lock, "holder": holder}, separators=(",", ":")).encode()


def _read_holder_record(data: bytes) -> tuple[str, str]:
    """Return ``(state, lock)`` of a holder record; ``("", "")`` for an empty (never written) one."""
    if not data:
        return "", ""
    try:
        record = json.loads(data)
        state, lock = record["state"], record["lock"]
    except (ValueError, TypeError, KeyError):
        return "held", "?"
    if state not in _HOLDER_STATES or not isinstance(lock, str):
        return "held", "?"
    return str(state), lock


class HolderRecords:
    """The holder records of one source's resources."""

    def __init__(self, session: Session, layout: Layout) -> None:
        self._session = session
        self._layout = layout

    def take(self, client: Any, lease: _Holder, deadline: float, lock_delay: float) -> None:
        """Record *lease* as the resource's holder, first waiting out a lock-delay if one is due.

        Called once the lease is first in the queue, before minting.

        :raises LeaseLostError: the lock node is gone.
        :raises TokenUnavailableError: the delay outlasts *deadline*, or ZooKeeper failed.
        """
        held = _holder_record("held", lease.lock_path.rsplit("/", 1)[1], whoami())
        for _ in range(5):
            version = self._wait_lock_delay(client, lease, deadline, lock_delay) if lock_delay > 0 else -1
            if self._write(client, lease, held, version, deadline) is not None:
                lease._recorded = True
                return
        raise TokenUnavailableError(
            f"the holder record of {lease.resource!r} kept changing while the lease was taken", resource=lease.resource
        )

    def release(self, client: Any, lease: _Holder, *, wait: bool) -> None:
        """Release cleanly: ``[setData(holder record, released), delete(lock node)]`` in one multi-op.

        A lease that never recorded itself, or a release that cannot be sent now,
        falls back to deleting the lock node alone, which leaves the record at
        ``held``: the next holder then treats it as a failure (a longer wait, never a shorter one).
        """
        session = self._session
        if not lease._recorded or not (client.connected and client.state == KazooState.CONNECTED):
            delete_lock_node(session, client, lease.lock_path, wait=wait)
            return
        lock_dir, name = lease.lock_path.rsplit("/", 1)
        prefix = lock_prefix(name)
        key = (lock_dir, prefix)
        with session.lock:
            session.orphans.add(key)
        transaction = client.transaction()
        transaction.set_data(self._layout.holder(lease.resource), _holder_record("released", name, whoami()))
        transaction.delete(lease.lock_path)
        async_result = transaction.commit_async()

        def done(result: Any) -> None:
            # On kazoo's completion thread: no waiting, only async requests.
            value = result.value if result.exception is None else None
            released = isinstance(value, list) and len(value) == 2 and value[0] is True and value[1] is True
            if released or (isinstance(value, list) and len(value) == 2 and isinstance(value[1], NoNodeError)):
                # Released, or the lock node was already gone (the lease was lost): nothing left to do.
                with session.lock:
                    session.orphans.discard(key)
                return
            follow_up = client.delete_async(lease.lock_path)
            track_orphan(session, client, lock_dir, prefix, follow_up, deleting=True)

        async_result.rawlink(done)
        if wait:
            with contextlib.suppress(Exception):
                async_result.get(timeout=session.timeout)

    # Internal -----------------------------------------------------------------

    def _write(self, client: Any, lease: _Holder, data: bytes, version: int, deadline: float) -> ZnodeStat | None:
        """``[check(own lock node), setData(holder record, version)]``; ``None`` if the version moved.

        :raises LeaseLostError: the lock node is gone (nothing was written).
        """
        resource = lease.resource
        path = self._layout.holder(resource)
        send = functools.partial(send_checked_set, client, lease.lock_path, path, data, version)
        for attempt in range(2):
            results = request(self._session, client, send, deadline, resource, "multi [check, setData holder]")
            if not (isinstance(results, list) and len(results) == 2):
                break
            if results[0] is True and isinstance(results[1], ZnodeStat):
                stat: ZnodeStat = results[1]
                return stat
            if isinstance(results[0], NoNodeError):
                lease._mark_lost("ZooKeeper found the lock node gone when recording the holder")
                raise LeaseLostError(
                    f"lease on {resource!r} is lost: its lock node {lease.lock_path!r} no longer exists",
                    resource=resource,
                )
            if isinstance(results[1], BadVersionError):
                return None
            if attempt == 0 and isinstance(results[1], NoNodeError):
                create_path(self._session, client, path, deadline, resource)
                continue
            break
        raise TokenUnavailableError(f"unexpected multi-op result from ZooKeeper: {results!r}", resource=resource)

    def _wait_lock_delay(self, client: Any, lease: _Holder, deadline: float, lock_delay: float) -> int:
        """Wait until a failed previous holder's lock-delay is over; return the record's version to overwrite."""
        resource = lease.resource
        path = self._layout.holder(resource)
        own = lease.lock_path.rsplit("/", 1)[1]
        delay_ms = lock_delay * 1000.0
        while True:
            try:
                data, stat = request(
                    self._session,
                    client,
                    functools.partial(client.get_async, path),
                    deadline,
                    resource,
                    "getData",
                    NoNodeError,
                )
            except NoNodeError:
                create_path(self._session, client, path, deadline, resource)
                continue
            state, lock = _read_holder_record(data)
            if state in ("", "released") or (state == "held" and lock == own):
                return int(stat.version)
            if state == "held":
                # We are first in the queue, so that holder's lock node is gone without a clean
                # release: it failed. Record when we found out; that write's mtime starts the delay.
                failed = _holder_record("failed", lock, whoami())
                written = self._write(client, lease, failed, stat.version, deadline)
                if written is None:
                    continue
                log.warning(
                    "lease on %r: the previous holder (lock node %s) failed without releasing; "
                    "not granted again for %.1fs (lock-delay)",
                    resource,
                    lock,
                    lock_delay,
                )
                start_ms, version, now_ms = written.mtime, written.version, written.mtime
            else:
                # "failed": an acquirer before us found the failure and did not see the delay
                # through (it died, or timed out). Continue its countdown.
                start_ms, version = stat.mtime, stat.version
                now_ms = self._server_time_ms(client, resource, deadline)
            # mtimes are whole milliseconds, truncated: wait for a "now" strictly past the end,
            # so the delay is never a fraction of a millisecond short.
            end_ms = start_ms + delay_ms
            while now_ms <= end_ms:
                remaining = (end_ms - now_ms) / 1000.0 + 0.001
                if time.monotonic() + remaining > deadline:
                    raise TokenUnavailableError(
                        f"lease on {resource!r} is in its lock-delay after a failed holder for another "
                        f"{remaining:.1f}s, beyond the timeout; the countdown continues in ZooKeeper",
                        resource=resource,
                    )
                # Local time only paces the sleep; the server's clock decides when it is over.
                if lease.wait_lost(remaining):
                    raise TokenUnavailableError(
                        f"lease on {resource!r} was lost during its lock-delay: {lease.lost_reason}", resource=resource
                    )
                now_ms = self._server_time_ms(client, resource, deadline)
            lease.lock_delay_waited = max(0.0, (now_ms - start_ms) / 1000.0)
            return int(version)

    def _server_time_ms(self, client: Any, resource: str, deadline: float) -> int:
        """ZooKeeper's "now", in ms: the ``mtime`` of a write to ``<root>/clock`` (the leader's clock)."""
        path = self._layout.clock
        session = self._session
        try:
            stat = request(
                session, client, lambda: client.set_async(path, b""), deadline, resource, "setData clock", NoNodeError
            )
        except NoNodeError:
            create_path(session, client, path, deadline, resource)
            stat = request(session, client, lambda: client.set_async(path, b""), deadline, resource, "setData clock")
        return int(stat.mtime)
