"""Exclusive mode: the lock queue under ``<root>/locks/<name>``, and the :class:`ZooKeeperLease` it grants.

A lease is an ephemeral sequential lock node; the holder is the first in the
queue, and each waiter watches only the node just ahead of its own. Tokens are
minted with a multi-op ``[check(own lock node), setData(token node)]``, so a
holder whose lock node is gone (session expired, node deleted) can never mint.
The lock is for efficiency; the token stays the safety. Errors: not getting
the lock in time, or ZooKeeper failing, raise
:class:`~celery_fencing.TokenUnavailableError` and leave no lock node behind
(one whose request did not complete is tracked as an orphan); a lock node
found gone marks the lease lost and raises
:class:`~celery_fencing.LeaseLostError`. Watches run on kazoo's threads and
never block there.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import NoNodeError, RolledBackError
from kazoo.protocol.states import EventType, ZnodeStat

from ...exceptions import LeaseLostError, TokenUnavailableError
from ...lease_state import LeaseState
from ...token import FencingToken
from .calls import create_path, request, send_checked_set
from .grantor import Grantor, token_from
from .lock_delay import HolderRecords, whoami
from .names import LEASE_MARKER, Layout, lease_sequence
from .orphans import clean_orphans, track_orphan
from .session import Session, session_of

__all__ = ["ZooKeeperLease", "LockQueue"]

log = logging.getLogger(__package__)


class ZooKeeperLease(LeaseState):
    """An exclusive hold on a resource, and the token minted under it.

    Obtained from :meth:`ZooKeeperTokenSource.lease`. ``token`` was minted by a
    multi-op that checked this holder's lock node in the same transaction.

    The lease is *lost* when the ZooKeeper session is suspended or lost, when
    the lock node disappears, or when the source closes; ``lost`` then stays
    true, and callbacks registered with :meth:`on_lost` run once, each in a
    short-lived thread of its own (never on kazoo's threads). A lost holder
    should stop: its token still guards the data, but a successor may already
    hold a larger one.

    Thread-safe. A lease does not cross ``fork()``: in the child it is lost.
    """

    _log = log

    def __init__(self, queue: LockQueue, resource: str, lock_path: str) -> None:
        super().__init__(resource)
        #: The holder's lock znode, ``<root>/locks/<name>/<uuid>-lease-<sequence>``.
        self.lock_path = lock_path
        self._queue = queue
        #: Seconds of ZooKeeper time this lease waited for a lock-delay before it
        #: was granted (0.0 when the previous holder released cleanly, or no delay applied).
        self.lock_delay_waited = 0.0
        # Whether the holder record says this lease holds the resource (a clean
        # release then marks it released).
        self._recorded = False
        # The grantor id of the session that created the lock node.
        self._grantor = ""
        self._contended = threading.Event()
        self._contended_callbacks: list[Callable[[ZooKeeperLease], object]] = []
        self._watching_queue = False

    @property
    def contended(self) -> bool:
        """Whether another holder (a process, a worker) has queued for this lease's lock since it was granted.

        Known only once :meth:`on_contended` asked ZooKeeper to watch the queue.
        """
        return self._contended.is_set()

    def on_contended(self, callback: Callable[[ZooKeeperLease], object]) -> None:
        """Call ``callback(lease)`` once when another holder queues for the lock (at once if one already waits).

        The first call sets a watch on the lock's queue (one ``getChildren``,
        sent asynchronously: this never blocks). The callback runs in a thread
        of its own; callbacks are dropped when the lease is released or lost.
        A lease reused between tasks uses it to hand the lock over as soon as
        it is idle and wanted, rather than when its reuse window ends.
        """
        watch = run_now = False
        with self._lock:
            if self._released.is_set() or self._lost.is_set():
                return
            if self._contended.is_set():
                run_now = True
            else:
                self._contended_callbacks.append(callback)
                watch, self._watching_queue = not self._watching_queue, True
        if run_now:
            self._run_callbacks([callback], "contended")
        elif watch:
            self._queue.watch(self)

    def mint(self, *, timeout: float | None = None) -> FencingToken:
        """Mint a new, larger token under the lock, with the same multi-op check.

        :raises LeaseLostError: the lease is lost, or ZooKeeper found the lock node gone.
        :raises TokenUnavailableError: ZooKeeper did not answer within *timeout*.
        """
        self.check()
        token = self._queue.mint_again(self, timeout)
        self._token = token
        return token

    # Internal -----------------------------------------------------------------

    def _mark_lost(self, reason: str, *, notify: bool = True) -> None:
        super()._mark_lost(reason, notify=notify)
        with self._lock:
            self._contended_callbacks = []

    def _mark_released(self) -> None:
        super()._mark_released()
        with self._lock:
            self._contended_callbacks = []

    def _mark_contended(self) -> None:
        with self._lock:
            if self._contended.is_set() or self._released.is_set() or self._lost.is_set():
                return
            self._contended.set()
            callbacks, self._contended_callbacks = self._contended_callbacks, []
        if callbacks:
            self._run_callbacks(callbacks, "contended")

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        # The parent's callbacks belong to the parent's threads: do not run them here.
        self._callbacks = []
        self._contended_callbacks = []
        self._lost_reason = self._lost_reason or "the process forked"
        self._lost.set()

    def __repr__(self) -> str:
        return f"<ZooKeeperLease {self.resource!r} {self._token!r} {self._state_word()}>"


class LockQueue:
    """Takes, mints under and releases the leases of one source."""

    def __init__(self, session: Session, layout: Layout, grantor: Grantor) -> None:
        self._session = session
        self._layout = layout
        self._grantor = grantor
        self._holders = HolderRecords(session, layout)

    def acquire(self, client: Any, resource: str, deadline: float, lock_delay: float = 0.0) -> ZooKeeperLease:
        """Queue for *resource*'s lock, wait for the turn and any lock-delay, record the hold and mint."""
        session = self._session
        if session.orphans:
            # Our own leftover lock node could be ahead of us in the queue.
            clean_orphans(session, client, deadline)
        lock_dir = self._layout.lock_dir(resource)
        # A unique prefix finds our node again if a create's reply is lost, and keeps
        # lock paths unique even if the lock directory is deleted and re-created.
        prefix = f"{uuid.uuid4().hex}{LEASE_MARKER}"
        holder = whoami().encode()
        # Read in the session that will own the lock node: a lease's tokens are minted under
        # check(lock node), which only a live node of that same session passes.
        session_id, grantor = self._grantor.current(client, deadline, resource)
        lock_path = self._create_lock_node(client, lock_dir, prefix, holder, deadline, resource)
        lease = ZooKeeperLease(self, resource, lock_path)
        lease._grantor = grantor
        if session_of(client) != session_id:
            lease._mark_lost("the ZooKeeper session changed while the lease was taken")
        wake = threading.Event()
        with session.lock:
            session.leases.add(lease)
            session.waiters.add(wake)
        try:
            self._wait_for_turn(client, lease, lock_dir, wake, deadline)
            # Watch our own node: its deletion means the lease is gone.
            watch = functools.partial(self._on_lock_node_event, client, lease)
            if (
                request(
                    session, client, lambda: client.exists_async(lock_path, watch=watch), deadline, resource, "exists"
                )
                is None
            ):
                lease._mark_lost("the lock node disappeared")
            if lease.lost:
                raise TokenUnavailableError(
                    f"lease on {resource!r} was lost while being taken: {lease.lost_reason}", resource=resource
                )
            try:
                self._holders.take(client, lease, deadline, lock_delay)
                lease._token = self._mint(client, lease, deadline)
            except LeaseLostError as exc:
                raise TokenUnavailableError(f"lease on {resource!r} was lost while being taken: {exc}") from exc
        except BaseException:
            with session.lock:
                session.leases.discard(lease)
                session.waiters.discard(wake)
            lease._mark_released()
            # Never wait here: the caller's deadline may be spent. Tracked if it fails. Nothing
            # ran under this lease, so a recorded hold is released cleanly (no lock-delay).
            self._holders.release(client, lease, wait=False)
            raise
        with session.lock:
            session.waiters.discard(wake)
        return lease

    def release(self, client: Any, lease: ZooKeeperLease) -> None:
        """Leave the lock cleanly, waiting (at most the source's timeout) for ZooKeeper to confirm."""
        session = self._session
        with session.lock:
            session.leases.discard(lease)
        lease._mark_released()
        if session.pid != os.getpid() or session.closed:
            return
        self._holders.release(client, lease, wait=True)

    def mint_again(self, lease: ZooKeeperLease, timeout: float | None) -> FencingToken:
        deadline = self._session.deadline(timeout)
        client = self._session.usable_client(lease.resource)
        return self._mint(client, lease, deadline)

    def watch(self, lease: ZooKeeperLease) -> None:
        """Watch the lease's lock queue until a node queues behind it; then mark the lease contended.

        Everything runs on kazoo's callbacks, never blocking them: a failed
        request just ends the watch (a lease in trouble is marked lost by the
        session and lock-node handling, and an unwatched lease is only kept
        until its reuse window ends, as before).
        """
        client = self._session.client
        lock_dir, own = lease.lock_path.rsplit("/", 1)
        own_sequence = lease_sequence(own)
        if client is None or own_sequence is None:
            return

        def on_children(async_result: Any) -> None:
            try:
                children = async_result.get_nowait()
            except Exception:
                return
            if any((sequence := lease_sequence(name)) is not None and sequence > own_sequence for name in children):
                lease._mark_contended()

        def on_event(_event: Any) -> None:
            if not (lease.contended or lease.lost or lease._released.is_set()):
                watch_children()

        def watch_children() -> None:
            try:
                client.get_children_async(lock_dir, watch=on_event).rawlink(on_children)
            except Exception:
                log.debug("cannot watch the lock queue of %r", lease.resource, exc_info=True)

        watch_children()

    # Internal -----------------------------------------------------------------

    def _create_lock_node(
        self, client: Any, lock_dir: str, prefix: str, holder: bytes, deadline: float, resource: str
    ) -> str:
        session = self._session
        for attempt in range(2):
            session.await_connected(client, deadline, resource)
            session.require_connected(client, resource)
            async_result = client.create_async(f"{lock_dir}/{prefix}", holder, ephemeral=True, sequence=True)
            try:
                path: str = async_result.get(timeout=max(0.001, deadline - time.monotonic()))
                return path
            except NoNodeError:
                if attempt:
                    raise TokenUnavailableError(
                        f"cannot create lock directory {lock_dir!r}", resource=resource
                    ) from None
                create_path(session, client, lock_dir, deadline, resource)
            except Exception as exc:
                # The create may still happen (or have happened, its reply lost): make sure
                # the node is deleted when it does, or it would block every other holder.
                track_orphan(session, client, lock_dir, prefix, async_result)
                if isinstance(exc, client.handler.timeout_exception):
                    message = f"ZooKeeper did not create the lock node within the timeout ({session.where()})"
                else:
                    message = f"creating the lock node failed ({session.where()}): {type(exc).__name__}: {exc}"
                raise TokenUnavailableError(message, resource=resource) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait_for_turn(
        self, client: Any, lease: ZooKeeperLease, lock_dir: str, wake: threading.Event, deadline: float
    ) -> None:
        session = self._session
        resource = lease.resource
        own = lease.lock_path.rsplit("/", 1)[1]
        while True:
            if lease.lost:
                raise TokenUnavailableError(
                    f"lost the lock queue for {resource!r}: {lease.lost_reason}", resource=resource
                )
            children = request(
                session, client, lambda: client.get_children_async(lock_dir), deadline, resource, "getChildren"
            )
            queue = sorted((seq, name) for name in children if (seq := lease_sequence(name)) is not None)
            names = [name for _, name in queue]
            if own not in names:
                raise TokenUnavailableError(
                    f"our lock node for {resource!r} vanished while waiting (session expired?)", resource=resource
                )
            position = names.index(own)
            if position == 0:
                return
            # Watch only the node just ahead of ours: no herd wakes when the holder leaves.
            ahead = f"{lock_dir}/{names[position - 1]}"
            wake.clear()
            stat = request(
                session,
                client,
                functools.partial(client.exists_async, ahead, watch=lambda _event: wake.set()),
                deadline,
                resource,
                "exists",
            )
            if stat is None:
                continue
            # The state listener sets `wake` too, so a lost connection ends the wait at once.
            session.require_connected(client, resource)
            if not wake.wait(max(0.0, deadline - time.monotonic())):
                raise TokenUnavailableError(
                    f"the lease on {resource!r} stayed with another holder for the whole timeout", resource=resource
                )

    def _mint(self, client: Any, lease: ZooKeeperLease, deadline: float) -> FencingToken:
        """Mint with [check(lock node), setData(token node)]: a holder without its lock cannot mint."""
        resource = lease.resource
        token_path = self._layout.token(resource)
        send = functools.partial(send_checked_set, client, lease.lock_path, token_path, b"")
        for attempt in range(2):
            results = request(self._session, client, send, deadline, resource, "multi [check, setData]")
            # A failed transaction does not raise: every entry must be looked at.
            pair = results if isinstance(results, list) and len(results) == 2 else None
            if pair is not None and pair[0] is True and isinstance(pair[1], ZnodeStat):
                return token_from(resource, pair[1], lease._grantor)
            if pair is not None and isinstance(pair[0], NoNodeError):
                lease._mark_lost("ZooKeeper found the lock node gone when minting")
                raise LeaseLostError(
                    f"lease on {resource!r} is lost: its lock node {lease.lock_path!r} no longer exists",
                    resource=resource,
                )
            if (
                attempt == 0
                and pair is not None
                and isinstance(pair[0], RolledBackError)
                and isinstance(pair[1], NoNodeError)
            ):
                create_path(self._session, client, token_path, deadline, resource)
                continue
            raise TokenUnavailableError(f"unexpected multi-op result from ZooKeeper: {results!r}", resource=resource)
        raise AssertionError("unreachable")  # pragma: no cover

    def _on_lock_node_event(self, client: Any, lease: ZooKeeperLease, event: Any) -> None:
        # Runs on kazoo's callback thread: no blocking, at most an async re-arm.
        if event.type == EventType.DELETED:
            lease._mark_lost("the lock node was deleted")
        elif event.type == EventType.CHANGED and not lease.lost and client.connected:
            client.exists_async(lease.lock_path, watch=functools.partial(self._on_lock_node_event, client, lease))
        # EventType.NONE: a connection state change, which the state listener handles.
