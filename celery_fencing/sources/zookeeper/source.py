"""ZooKeeper, the production grantor: a token is the zxid of one ZooKeeper write.

Minting is one ``setData`` on a per-resource znode, ``<root>/tokens/<name>``;
the token is the write's ``mzxid``. Resources minted for only briefly (task
ids) mint with ``mint_transient`` instead, a ``setData`` on one shared znode
``<root>/transient``: zxids are global, so that write's zxid orders the same
way and no znode is left behind per task. A zxid is 64-bit (leader epoch in the high
32 bits, a counter in the low 32) and is assigned through ZooKeeper's
replicated log, so it grows across leader failover, server restart, and even
deletion and re-creation of the znode. Sequence-node suffixes (signed 32-bit,
wrapping, compared as strings by some clients) and znode ``version`` (reset on
re-creation) are deliberately not used. Tokens are only as durable as
ZooKeeper's data directory: an ensemble that loses it restarts zxids from zero,
below every mark the gates hold, and every writer is then refused.

Grantor identity
----------------
The first source to reach an ensemble stores a random id in ``<root>/grantor``
(a ``create`` that only one client wins; the others read the winner's id).
Every token carries it (``token.grantor``, ``zk-<32 hex digits>``) and the
gates keep it with the mark. An ensemble whose data directory was wiped has
no such znode, so the next source creates a new id, and the gates refuse its
tokens (which count from zero again) with
:class:`~celery_fencing.GrantorMismatchError` instead of comparing them with
marks of the old data; ``celery-fencing rebase`` moves resources over. The id
is cached per ZooKeeper session and read again on a new session (a wiped
server cannot continue an old session), and a mint whose session changed
while it ran is done again, so a token never carries the id of the data it
was not minted from. Never delete ``<root>/grantor``.

Exclusive mode
--------------
``with source.lease(resource) as lease:`` holds a ZooKeeper lock (ephemeral
sequential znodes under ``<root>/locks/<name>``) and mints with a multi-op
``[check(own lock node), setData(token node)]``, so a holder whose lock node is
gone (session expired, node deleted) can never mint. The lock is for
efficiency; the token stays the safety: a holder that is paused and loses its
lock still carries a token lower than its successor's, and the gates refuse it.

Lock-delay
----------
For sinks that cannot check a token (an e-mail or payment API, an
append-only log), ``lock_delay`` (Chubby's lock-delay) keeps a resource
un-grantable for that many seconds after its holder *failed* (session expired,
worker killed, lock node deleted under it), so that a holder that is merely
slow, or requests it already sent, have that long to finish before the next
holder starts. A clean release re-grants at once. It narrows the window; it
cannot close it: a holder paused for longer than the session timeout plus the
delay still writes after its successor started. Only a gate closes that.

The state lives in ZooKeeper, in a per-resource *holder record*
``<root>/holders/<name>`` (a small JSON document), so it survives the restart
of whichever worker would take the lease next:

* **Acquire.** Every exclusive lease, with or without a delay of its own,
  records itself as ``held`` (its lock node's name) with a multi-op
  ``[check(own lock node), setData(record)]`` once it is first in the queue.
* **Release.** A clean release is one multi-op ``[setData(record, released),
  delete(own lock node)]``: the lock is never free with the record still
  saying ``held``, and a holder whose lock node is already gone (it lost the
  lease) cannot mark anything. Every other way a lock node goes (session
  expiry, deletion, a release that could not reach ZooKeeper, ``close()``
  with leases held) leaves ``held`` behind: it counts as a failure.
* **Failure found.** An acquirer that is first in the queue and finds
  ``held`` with another lock node's name knows that holder failed: it writes
  ``failed`` (again under ``check(own lock node)``). The ``mtime`` of that
  write, the leader's clock, is when the delay starts.
* **Waiting.** It waits until ZooKeeper's time is at least that ``mtime``
  plus the delay, asking for "now" with a write of its own (``setData`` on
  ``<root>/clock``, whose ``mtime`` is the server's time) after sleeping the
  remainder locally: local clocks only time the sleeps, never decide the
  grant. An acquirer that dies, or times out, while waiting leaves ``failed``
  in place, so the next one (a restarted worker, say) continues the same
  countdown from the recorded ``mtime`` instead of starting afresh or
  forgetting it. When the remaining delay exceeds the lease's timeout, the
  acquirer raises at once rather than holding its queue place in vain.
* **Granted.** It overwrites the record with its own ``held`` (conditional
  on the version it read) and mints as usual.

Limits, stated plainly: the delay counts from when the next acquirer finds
the failure (never earlier; an idle resource pays the full delay on its next
lease), and a worker killed with ``kill -9`` keeps its lock until its session
expires, so the resource is held for the session timeout *plus* the delay.
The delay is the acquirer's setting, measured on the ZooKeeper leader's wall
clock: a leader change to a server whose clock is behind (ahead) lengthens
(shortens) it by the skew. A record left by an older version of this library
that wrote none is absent, and absent means "no failure known". Cost: one
``getData`` and one multi-op more per lease with a delay, one multi-op more
per lease without; releases cost what they did.

Error handling
--------------
No call can hang: every ZooKeeper request is sent with ``*_async`` and awaited
with ``.get(timeout=...)``, and kazoo's retry helpers (which retry forever by
default) are not used. Everything that prevents minting raises
:class:`~celery_fencing.TokenUnavailableError` with the driver's error chained.

* ``SUSPENDED`` (connection lost, session possibly alive): kazoo would queue a
  request made now and send it after reconnecting, perhaps on a new session.
  ``mint`` therefore checks the state right before sending, and while suspended
  it waits (within its timeout) for the connection to come back, sending
  nothing; when the timeout passes it raises. Every held lease is marked lost
  at once: while suspended, the lock may already belong to someone else.
* ``LOST`` (session expired): the same for ``mint``; kazoo opens a new session
  in the background and minting resumes on it. Lock nodes of the old session
  are gone, so leases are lost for good.
* A request already sent when the connection drops may still execute on the
  server; its reply is discarded and the caller got ``TokenUnavailableError``,
  so no token escapes. It only advances the zxid, which tokens tolerate.

Access control and TLS
----------------------
With ``digest=("user", "password")`` (or ``zookeeper://user:password@host/root``)
the client authenticates with ZooKeeper's digest scheme, and every znode the
source creates (the root if it creates it, ``grantor``, token, lock and
holder znodes) gets the ACL ``digest:user:<hash>`` with all permissions and
nothing for anyone else: a client without the credentials can neither read,
change nor delete them, nor create or delete znodes under them. ZooKeeper ACLs
are per znode and not inherited: a root that already existed keeps its own
ACL (set it with ``setAcl``). With ``tls=ZooKeeperTLS(...)`` (or ``?tls=true&ca=...``)
the client speaks TLS to the servers' ``secureClientPort``. The password is
never logged or shown: ``repr()`` and error messages print URLs with ``***``,
and the client the source builds logs through an adapter of kazoo's logger
that masks the password: kazoo itself logs every request it sends at DEBUG,
the authentication packet with the clear-text ``user:password`` included.

Threads and processes
---------------------
A source is thread-safe: one KazooClient serves every thread. A KazooClient
must never cross ``fork()`` (its threads do not survive, its socket would be
shared with the parent). A source that built its own client rebuilds it,
lazily, in the child after a fork (the parent's session is left untouched:
never stopped from the child); leases do not cross fork and are lost in the
child. A source given a caller's client refuses to work in a forked child with
:class:`~celery_fencing.FencingConfigurationError`: create the client in the
child (Celery's ``worker_process_init``).

The client a source builds itself is connected lazily, on the first ``mint``,
``lease`` or ``connect`` call, and then reconnects in the background for as long
as the source is open. A caller's client is never started or stopped by the source.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError, RolledBackError
from kazoo.protocol.states import EventType, KazooState, ZnodeStat
from kazoo.retry import KazooRetry

from ...exceptions import (
    FencingConfigurationError,
    InvalidTokenError,
    LeaseLostError,
    TokenUnavailableError,
)
from ...lease_state import LeaseState
from ...token import FencingToken, validate_grantor, validate_resource, validate_token_value
from . import config
from .config import ZooKeeperTLS
from .names import LEASE_MARKER, MAX_ZNODE_NAME_LENGTH, lease_sequence, resource_to_znode_name, znode_name_to_resource

__all__ = [
    "MAX_ZNODE_NAME_LENGTH",
    "Lease",
    "ZooKeeperTLS",
    "ZooKeeperTokenSource",
    "resource_to_znode_name",
    "znode_name_to_resource",
]

# Named as the module was before it became a package.
log = logging.getLogger(__package__)

_HOLDER_STATES = frozenset({"held", "released", "failed"})
# How many token znodes a source remembers having written (see ZooKeeperTokenSource._known).
_KNOWN_PATHS = 10_000
# How far the create-or-setData guess for unknown znodes looks back (see mint_many).
_GUESS_MEMORY = 8


def _holder_record(state: str, lock: str, holder: str) -> bytes:
    """A holder record: ``held``, ``released`` or ``failed``, the lock node's name and who held it."""
    return json.dumps({"state": state, "lock": lock, "holder": holder}, separators=(",", ":")).encode()


def _read_holder_record(data: bytes) -> tuple[str, str]:
    """Return ``(state, lock)`` of a holder record; ``("", "")`` for an empty (never written) one.

    Anything unreadable counts as ``held`` by an unknown holder: when in doubt, delay.
    """
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


# Sources that build their own client, reset in a forked child before any of its threads run.
_instances: weakref.WeakSet[ZooKeeperTokenSource] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for source in list(_instances):
        source._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Lease(LeaseState):
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

    def __init__(self, source: ZooKeeperTokenSource, resource: str, lock_path: str) -> None:
        super().__init__(resource)
        #: The holder's lock znode, ``<root>/locks/<name>/<uuid>-lease-<sequence>``.
        self.lock_path = lock_path
        self._source = source
        #: Seconds of ZooKeeper time this lease waited for a lock-delay before it
        #: was granted (0.0 when the previous holder released cleanly, or no delay applied).
        self.lock_delay_waited = 0.0
        # Whether the holder record says this lease holds the resource (a clean
        # release then marks it released).
        self._recorded = False
        # The grantor id of the session that created the lock node.
        self._grantor = ""
        self._contended = threading.Event()
        self._contended_callbacks: list[Callable[[Lease], object]] = []
        self._watching_queue = False

    @property
    def contended(self) -> bool:
        """Whether another holder (a process, a worker) has queued for this lease's lock since it was granted.

        Known only once :meth:`on_contended` asked ZooKeeper to watch the queue.
        """
        return self._contended.is_set()

    def on_contended(self, callback: Callable[[Lease], object]) -> None:
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
            self._source._watch_queue(self)

    def mint(self, *, timeout: float | None = None) -> FencingToken:
        """Mint a new, larger token under the lock, with the same multi-op check.

        :raises LeaseLostError: the lease is lost, or ZooKeeper found the lock node gone.
        :raises TokenUnavailableError: ZooKeeper did not answer within *timeout*.
        """
        self.check()
        token = self._source._mint_for_lease(self, timeout)
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
        return f"<Lease {self.resource!r} {self._token!r} {self._state_word()}>"


class ZooKeeperTokenSource:
    """Mints fencing tokens as zxids of writes to a ZooKeeper ensemble.

    :param hosts: ``"host1:2181,host2:2181"``; the source builds, owns and
        eventually stops its own KazooClient (connected on first use).
    :param root: the znode under which tokens and locks live.
    :param client: a caller's KazooClient instead of *hosts*; the caller
        starts and stops it (the source never does). It must use kazoo's
        threading handler.
    :param timeout: default bound, in seconds, on ``mint``, ``connect`` and
        ``lease`` (each request and any wait for a connection or a lock).
    :param session_timeout: the ZooKeeper session timeout asked for by a client
        the source builds. A session that loses contact for this long expires
        and its locks go to the next holder.
    :param lock_delay: default seconds an exclusive resource stays un-grantable
        after its holder failed rather than released it (see "Lock-delay" in the
        module docstring); 0 (the default) turns it off. ``lease()`` can override it.
    :param digest: ``(username, password)``: authenticate with ZooKeeper's
        digest scheme and create every znode with an ACL for that user only
        (see "Access control and TLS"). Only for a client the source builds.
    :param tls: TLS options for a client the source builds.
    :raises FencingConfigurationError: for bad arguments.
    """

    volatile = False
    #: ``ceiling()`` is one counter for every resource: the ensemble's zxid.
    ceiling_is_global = True

    def __init__(
        self,
        hosts: str | None = None,
        *,
        root: str = "/fencing",
        client: KazooClient | None = None,
        timeout: float = 5.0,
        session_timeout: float = 10.0,
        lock_delay: float = 0.0,
        digest: tuple[str, str] | None = None,
        tls: ZooKeeperTLS | None = None,
    ) -> None:
        if (hosts is None) == (client is None):
            raise FencingConfigurationError("ZooKeeperTokenSource needs exactly one of hosts= or client=")
        self._digest = config.validate_digest(digest)
        if tls is not None and not isinstance(tls, ZooKeeperTLS):
            raise FencingConfigurationError(f"tls must be a ZooKeeperTLS, not {type(tls).__name__}")
        self.tls = tls
        if client is not None and (digest is not None or tls is not None):
            raise FencingConfigurationError(
                "digest= and tls= configure a client the source builds; give your own client its auth and TLS"
            )
        self.hosts = config.validate_hosts(hosts) if hosts is not None else None
        self.root = config.validate_root(root)
        self.timeout = config.validate_seconds("timeout", timeout)
        self.session_timeout = config.validate_seconds("session_timeout", session_timeout)
        self.lock_delay = config.validate_lock_delay(lock_delay)
        self._owns_client = client is None
        self._client: Any = client
        self._pid = os.getpid()
        self._forked_client = False
        self._closed = False
        self._connected = threading.Event()
        self._state = "NOT_STARTED"
        # Guards _client creation, _leases, _waiters and _orphans; never held across a ZooKeeper call.
        self._lock = threading.Lock()
        self._leases: set[Lease] = set()
        self._waiters: set[threading.Event] = set()
        # (lock directory, lock-node prefix) of lock nodes this session may have left
        # behind when a create or delete did not complete in time.
        self._orphans: set[tuple[str, str]] = set()
        self._listener: Callable[[str], None] | None = None
        self._state_listeners: list[Callable[[str], object]] = []
        # Token znodes this process wrote (oldest first, bounded): minted with setData
        # first; others with create first. Only a hint: a wrong guess costs one request.
        self._known: dict[str, None] = {}
        # Creates that found no znode minus creates that found one, within +-_GUESS_MEMORY.
        self._creates_won = 0
        # (session id, grantor id) of the session the id was last read in.
        self._grantor: tuple[int, str] | None = None
        if client is not None:
            self._attach(client)
        _instances.add(self)

    @classmethod
    def from_url(cls, url: str) -> ZooKeeperTokenSource:
        """Build a source from ``zookeeper://[user:password@]h1:2181,h2:2181/root?timeout=5&session_timeout=10``.

        The path is the root znode (default ``/fencing``). ``user:password@``
        are digest credentials (percent-encoded). TLS: ``tls=true`` and
        optionally ``ca=``, ``certfile=``, ``keyfile=`` (file paths) and
        ``verify_certs=false``.

        :raises FencingConfigurationError: naming what is wrong with *url*
            (with the password shown as ``***``).
        """
        settings = config.parse_url(url)
        return cls(settings.hosts, root=settings.root, digest=settings.digest, tls=settings.tls, **settings.seconds)

    def client_options(self) -> dict[str, Any]:
        """The ``KazooClient`` keyword arguments for this source's auth, ACL, TLS and password-masking logger.

        For tools that open a client of their own on the same ensemble
        (``celery-fencing inspect``). The result holds the password: never log it.
        """
        return config.client_options(self._digest, self.tls)

    @property
    def username(self) -> str | None:
        """The digest user, or ``None`` (the password is not exposed)."""
        return None if self._digest is None else self._digest[0]

    # Public API ----------------------------------------------------------------

    @property
    def state(self) -> str:
        """The last connection state seen: CONNECTED, SUSPENDED, LOST, NOT_STARTED or CLOSED."""
        return "CLOSED" if self._closed else self._state

    def add_state_listener(self, callback: Callable[[str], object]) -> None:
        """Call ``callback(state)`` on every session state change: CONNECTED, SUSPENDED or LOST.

        It runs on kazoo's connection thread, after the source has updated
        ``state`` and marked its leases lost: it must return quickly, never
        block and never call ZooKeeper. Exceptions it raises are logged.
        Listeners stay registered across ``fork()`` and then report the
        child's own connection.
        """
        with self._lock:
            self._state_listeners.append(callback)

    def remove_state_listener(self, callback: Callable[[str], object]) -> None:
        """Stop calling *callback*; one that is not registered is ignored."""
        with self._lock, contextlib.suppress(ValueError):
            self._state_listeners.remove(callback)

    def connect(self, *, timeout: float | None = None) -> None:
        """Connect now (instead of on first use) and wait until the session is up.

        :raises TokenUnavailableError: not connected within *timeout* (the
            client keeps trying in the background).
        """
        deadline = self._deadline(timeout)
        self._await_connected(self._usable_client(None), deadline, None)

    def grantor_id(self, *, timeout: float | None = None) -> str:
        """Return this ensemble's grantor id, creating it on first use (see "Grantor identity").

        :raises TokenUnavailableError: not connected, or ZooKeeper failed, within *timeout*.
        """
        deadline = self._deadline(timeout)
        return self._session_grantor(self._usable_client(None), deadline, None)[1]

    def ceiling(self, resource: str | None = None, *, timeout: float | None = None) -> int:
        """Return the ensemble's last zxid: no token minted so far, of any resource, is above it. Writes nothing.

        A ``sync`` of the root, then an ``exists``: every reply carries the
        server's last processed zxid, which after the sync covers every write
        committed before it. For :class:`~celery_fencing.signing.PlausibilityBound`.

        :raises TokenUnavailableError: not connected, or no answer within *timeout*.
        """
        deadline = self._deadline(timeout)
        client = self._usable_client(resource)
        self._request(client, lambda: client.sync_async(self.root), deadline, resource, "sync")
        self._request(client, lambda: client.exists_async(self.root), deadline, resource, "exists")
        return int(client.last_zxid)

    def mint(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """Mint a token for *resource*: the zxid of one write to its znode.

        The write is a ``setData`` on the resource's znode, or, for a resource
        this process has not minted for yet (a task id, typically), the
        ``create`` of that znode, whose zxid serves as well; the other is
        tried only when ZooKeeper says the znode is missing or already exists.

        Thread-safe; returns within *timeout* seconds (default: the
        constructor's) or raises.

        :raises InvalidTokenError: *resource* is not a valid resource name (nothing is sent).
        :raises TokenUnavailableError: not connected, session suspended or
            lost, ZooKeeper did not answer in time, the source is closed.
        :raises FencingConfigurationError: a caller's client crossed ``fork()``.
        """
        return self.mint_many((resource,), timeout=timeout)[0]

    def mint_many(self, resources: Iterable[str], *, timeout: float | None = None) -> list[FencingToken]:
        """Mint one token for each of *resources*, pipelined: every write is sent before any reply is awaited.

        Each token is still the zxid of one write of its own (``setData``, or
        the ``create`` of a resource's znode), exactly as :meth:`mint` gives; only the waiting is shared, so N tokens
        cost about one round trip and the server's group commit instead of N
        round trips. Tokens come back in the order of *resources*; a resource
        named twice gets two tokens, the later one larger (ZooKeeper runs one
        session's requests in order).

        All or nothing for the caller: on any failure it raises, and the
        writes already sent may still run on the server, which only advances
        the zxid (no token escapes). Thread-safe; returns within *timeout*
        seconds (default: the constructor's) or raises. The same session
        checks as :meth:`mint` apply before every request: nothing is sent
        while the session is suspended or lost.

        :raises InvalidTokenError: a resource name is invalid (nothing is sent).
        :raises TokenUnavailableError: as :meth:`mint`.
        :raises FencingConfigurationError: a caller's client crossed ``fork()``.
        """
        names = [validate_resource(resource) for resource in resources]
        return self._mint(names, [self._token_path(name) for name in names], timeout)

    def mint_transient(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """Mint a token for *resource* without giving the resource a znode of its own.

        For resources that are minted for a few times and never looked up
        again: a task id, the default resource of a fenced task, would
        otherwise leave one znode per task behind (ZooKeeper's memory grows
        with every task until :meth:`prune` runs). The token is the zxid of a
        ``setData`` on one shared znode, ``<root>/transient``. That is as good
        a token as :meth:`mint`'s: a zxid is global, so a write made after any
        earlier token of *resource* was minted (by either method) has a
        larger zxid, and two writes never share one. It is also cheaper for
        ZooKeeper than the ``create`` of a new znode. What the resource loses
        is only a per-resource record of its last token (``inspect`` shows
        ``no znode`` and bounds its marks by the ensemble's last zxid).
        Errors and guarantees as :meth:`mint`.
        """
        name = validate_resource(resource)
        return self._mint([name], [f"{self.root}/transient"], timeout)[0]

    def _mint(self, names: list[str], paths: list[str], timeout: float | None) -> list[FencingToken]:
        """One token per name: the zxid of one write to the znode at the same position of *paths*."""
        deadline = self._deadline(timeout)
        if not names:
            return []
        client = self._usable_client(names[0])
        for _ in range(3):
            session, grantor = self._session_grantor(client, deadline, names[0])
            stats = self._write_token_znodes(client, names, paths, deadline)
            # A reply came on the session the id was read in: the zxids are that data's.
            if _session_of(client) == session:
                return [self._token_from(name, stat, grantor) for name, stat in zip(names, stats, strict=True)]
        raise TokenUnavailableError(
            "the ZooKeeper session kept changing while minting; no token was handed out", resource=names[0]
        )

    def _write_token_znodes(self, client: Any, names: list[str], paths: list[str], deadline: float) -> list[Any]:
        """One write per path (``setData``, or ``create`` of a new znode), pipelined; their stats in order."""
        known = self._known
        # A znode this process has written exists (unless pruned since): setData. Any
        # other is most likely new: create it, its create being the one write.
        # Unknown beyond the bounded memory, an old resource would pay a failed create
        # first: _creates_won tracks how create-first guesses have fared lately.
        create_unknown = self._creates_won >= 0
        unknown = [path not in known for path in paths]
        creating = [create_unknown and new for new in unknown]
        stats: list[Any] = [None] * len(names)
        pending = list(range(len(names)))
        for _ in range(3):
            self._await_connected(client, deadline, names[pending[0]])
            sent = []
            for index in pending:
                self._require_connected(client, names[index])
                if creating[index]:
                    request = client.create_async(paths[index], b"", makepath=True, include_data=True)
                else:
                    request = client.set_async(paths[index], b"")
                sent.append((index, request))
            pending = []
            for index, request in sent:
                what = "create" if creating[index] else "setData"
                try:
                    reply = self._collect(client, request, deadline, names[index], what, NoNodeError, NodeExistsError)
                except (NoNodeError, NodeExistsError) as exc:
                    # Created by another minter meanwhile, or pruned: the other write will do.
                    if unknown[index]:
                        self._guessed(isinstance(exc, NoNodeError))
                        unknown[index] = False
                    creating[index] = isinstance(exc, NoNodeError)
                    pending.append(index)
                    continue
                if unknown[index]:
                    self._guessed(creating[index])
                stats[index] = reply[1] if creating[index] else reply
                self._remember(paths[index])
            if not pending:
                return stats
        raise TokenUnavailableError(
            f"the znode of {names[pending[0]]!r} kept being created and deleted while minting",
            resource=names[pending[0]],
        )

    def prune(self, older_than: float, *, timeout: float | None = None, window: int = 1000) -> int:
        """Delete the znodes of resources not minted for *older_than* seconds; return how many went.

        Safe because a token is a zxid, and zxids are global to the ensemble:
        a resource minted again after its znode was pruned gets a new znode
        whose first write has a zxid above every token ever minted before, so
        the gates' marks keep refusing older tokens. A pruned resource only
        costs one ``create`` on its next mint.

        Each token znode is deleted with the version its ``exists`` returned,
        so a resource minted between that read and the delete is kept (the
        mint bumped the version). A resource's lock directory is deleted only
        when its token znode went and no holder is queued in it (ZooKeeper
        refuses to delete a node with children); a lease taken meanwhile
        re-creates the directory. Ages use this host's clock against the
        znode's ``mtime`` from the server: clock skew moves the age, never the
        safety. Requests are pipelined, at most *window* in flight.

        :raises FencingConfigurationError: *older_than* is negative or not a number.
        :raises TokenUnavailableError: ZooKeeper failed or did not answer within
            *timeout* (default: the constructor's); znodes deleted so far stay deleted.
        """
        if isinstance(older_than, bool) or not isinstance(older_than, (int, float)) or not older_than >= 0:
            raise FencingConfigurationError(f"older_than must be a number of seconds >= 0, got {older_than!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise FencingConfigurationError(f"window must be a positive int, got {window!r}")
        deadline = self._deadline(timeout)
        client = self._usable_client(None)
        cutoff_ms = (time.time() - float(older_than)) * 1000
        tokens_dir, locks_dir = f"{self.root}/tokens", f"{self.root}/locks"
        try:
            names = self._request(
                client, lambda: client.get_children_async(tokens_dir), deadline, None, "getChildren", NoNodeError
            )
        except NoNodeError:
            return 0
        idle: list[tuple[str, int]] = []
        for stat_name, stat in self._pipelined(
            client, names, lambda name: client.exists_async(f"{tokens_dir}/{name}"), deadline, "exists", window
        ):
            if isinstance(stat, ZnodeStat) and stat.mtime < cutoff_ms:
                idle.append((stat_name, stat.version))
        versions = dict(idle)
        pruned = [
            name
            for name, outcome in self._pipelined(
                client,
                [name for name, _ in idle],
                lambda name: client.delete_async(f"{tokens_dir}/{name}", version=versions[name]),
                deadline,
                "delete",
                window,
                BadVersionError,
                NoNodeError,
            )
            if outcome is True
        ]
        for name in pruned:
            self._known.pop(f"{tokens_dir}/{name}", None)
        # Empty lock directories of the pruned resources; one with a holder or waiter is refused.
        for _ in self._pipelined(
            client,
            pruned,
            lambda name: client.delete_async(f"{locks_dir}/{name}"),
            deadline,
            "delete",
            window,
            NotEmptyError,
            NoNodeError,
        ):
            pass
        log.info("pruned %d idle resource znode(s) under %s", len(pruned), tokens_dir)
        return len(pruned)

    @contextlib.contextmanager
    def lease(self, resource: str, *, timeout: float | None = None, lock_delay: float | None = None) -> Iterator[Lease]:
        """Hold the resource's ZooKeeper lock, with a token minted under it.

        ::

            with source.lease("account:42", timeout=10) as lease:
                gate.claim(lease.token)
                ...
                lease.check()       # raises LeaseLostError once lost

        Waiting for the lock, waiting out a lock-delay, taking the lock and
        minting take at most *timeout* seconds together (default: the
        constructor's). Leaving the block releases the lock cleanly (the next
        holder is granted at once); it never raises because the lease was lost.

        *lock_delay* (default: the constructor's) is how long the resource
        stays un-grantable after a previous holder failed instead of releasing
        it, measured on ZooKeeper's clock from when the failure was found; see
        "Lock-delay" in the module docstring. A wait longer than what is left
        of *timeout* raises at once; the countdown is recorded in ZooKeeper and
        the next attempt (from any process) continues it.

        :raises TokenUnavailableError: the lock was not obtained within
            *timeout* (or the lock-delay outlasts it), or ZooKeeper is
            unreachable; no lock is left behind.
        :raises FencingConfigurationError: *lock_delay* is negative or not a number.
        """
        validate_resource(resource)
        delay = self.lock_delay if lock_delay is None else config.validate_lock_delay(lock_delay)
        deadline = self._deadline(timeout)
        client = self._usable_client(resource)
        if self._orphans:
            # Our own leftover lock node could be ahead of us in the queue.
            self._clean_orphans(client, deadline)
        lease = self._acquire(client, resource, deadline, delay)
        try:
            yield lease
        finally:
            self._release(client, lease)

    def close(self) -> None:
        """Release held leases and stop the client the source built. Idempotent.

        A caller's client is left running. Bounded: stopping an unresponsive
        connection is finished in the background after ``timeout`` seconds.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            leases, self._leases = list(self._leases), set()
            waiters = list(self._waiters)
            client = self._client if self._pid == os.getpid() else None
            if self._owns_client:
                self._client = None
        for event in waiters:
            event.set()
        for lease in leases:
            lease._mark_lost("the token source was closed")
            if client is not None and client.connected:
                # Fire and forget: the next holder need not wait for our session to end.
                self._delete_lock_node(client, lease.lock_path, wait=False)
        self._connected.clear()
        if client is None:
            return
        if self._listener is not None:
            client.remove_listener(self._listener)
        if self._owns_client:
            stopper = threading.Thread(target=_stop_client, args=(client,), name="fencing-zk-close", daemon=True)
            stopper.start()
            stopper.join(self.timeout)

    def __enter__(self) -> ZooKeeperTokenSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.hosts if self.hosts is not None else "caller's client"
        user = f"{self.username}@" if self._digest is not None else ""
        tls = " tls" if self.tls is not None else ""
        return f"<ZooKeeperTokenSource {user}{where}{self.root}{tls} {self.state}>"

    # Connection ----------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> float:
        seconds = self.timeout if timeout is None else config.validate_seconds("timeout", timeout)
        return time.monotonic() + seconds

    def _usable_client(self, resource: str | None) -> Any:
        if self._pid != os.getpid():
            # Forked through a path that skipped os.register_at_fork (C-level fork()).
            self._after_fork()
        if self._closed:
            raise TokenUnavailableError("ZooKeeperTokenSource is closed", resource=resource)
        if self._forked_client:
            raise FencingConfigurationError(
                "the KazooClient given to ZooKeeperTokenSource was created before fork(); a kazoo client "
                "must not cross fork(): build the client (and the source) in the child process, "
                "e.g. in Celery's worker_process_init"
            )
        client = self._client
        if client is None:
            built = None
            with self._lock:
                if self._closed:
                    raise TokenUnavailableError("ZooKeeperTokenSource is closed", resource=resource)
                if self._client is None:
                    # Assigned before it starts, so the listener accepts its first CONNECTED.
                    self._client = built = self._build_client()
                client = self._client
            if built is not None:
                # Outside the lock (the listener takes it). start_async does not wait:
                # callers wait for CONNECTED within their own timeouts.
                built.start_async()
        return client

    def _build_client(self) -> Any:
        client = KazooClient(
            hosts=self.hosts,
            timeout=self.session_timeout,
            # Reconnect forever, but at least once a second: kazoo's default backoff
            # grows to an hour, leaving a source offline long after ZooKeeper is back.
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, ignore_expire=True),
            **self.client_options(),
        )
        self._attach(client)
        return client

    def _attach(self, client: Any) -> None:
        listener = functools.partial(self._on_state, client)
        self._listener = listener
        client.add_listener(listener)
        if client.connected and client.state == KazooState.CONNECTED:
            self._state = "CONNECTED"
            self._connected.set()
        elif not self._owns_client:
            self._state = str(client.state)

    def _on_state(self, client: Any, state: str) -> None:
        # Called on kazoo's connection thread: record, wake waiters, never block or call ZooKeeper.
        if client is not self._client:
            return  # a client this source has let go of (closed, or the parent's after fork)
        self._state = str(state)
        if state == KazooState.CONNECTED:
            self._connected.set()
            if self._orphans:
                threading.Thread(
                    target=self._clean_orphans, args=(client,), name="fencing-zk-cleanup", daemon=True
                ).start()
        else:
            self._connected.clear()
            with self._lock:
                leases = list(self._leases)
                waiters = list(self._waiters)
                if state == KazooState.LOST:
                    # An expired session's ephemeral nodes are gone with it.
                    self._orphans.clear()
            for lease in leases:
                lease._mark_lost(f"ZooKeeper session {state}")
            for event in waiters:
                event.set()
        # Last, so a listener sees the source's own view already updated.
        with self._lock:
            callbacks = list(self._state_listeners)
        for callback in callbacks:
            try:
                callback(str(state))
            except Exception:
                log.exception("fencing ZooKeeper state listener %r failed", callback)

    def _await_connected(self, client: Any, deadline: float, resource: str | None) -> None:
        remaining = deadline - time.monotonic()
        if not self._connected.wait(max(0.0, remaining)):
            raise TokenUnavailableError(
                f"no ZooKeeper session ({self.state}) with {self._where()} within the timeout; nothing was sent",
                resource=resource,
            )

    def _require_connected(self, client: Any, resource: str | None) -> None:
        # The last look before a request is queued: kazoo would hold a request made
        # while SUSPENDED and send it after reconnecting, perhaps on a new session.
        if self._closed:
            raise TokenUnavailableError("ZooKeeperTokenSource is closed", resource=resource)
        if not (client.connected and client.state == KazooState.CONNECTED):
            raise TokenUnavailableError(
                f"ZooKeeper session is {client.state} ({self._where()}); refusing to send", resource=resource
            )

    def _where(self) -> str:
        return self.hosts if self.hosts is not None else "the caller's client"

    def _after_fork(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._waiters = set()
        self._orphans = set()
        leases, self._leases = self._leases, set()
        for lease in leases:
            lease._after_fork()
        if self._owns_client:
            # The parent's client: its threads did not survive the fork and its session
            # is the parent's. Drop it without stopping it; a new one is built on use.
            self._client = None
            self._listener = None
            self._state = "NOT_STARTED"
        else:
            self._forked_client = True

    # Requests ------------------------------------------------------------------

    def _request(
        self,
        client: Any,
        send: Callable[[], Any],
        deadline: float,
        resource: str | None,
        what: str,
        *expected: type[BaseException],
    ) -> Any:
        """Send one request (after a state check) and wait for it until *deadline*.

        Exceptions of the *expected* types propagate; every other failure becomes
        TokenUnavailableError with the driver's error chained.
        """
        self._await_connected(client, deadline, resource)
        self._require_connected(client, resource)
        async_result = send()
        remaining = deadline - time.monotonic()
        try:
            return async_result.get(timeout=max(0.001, remaining))
        except expected:
            raise
        except Exception as exc:
            if isinstance(exc, client.handler.timeout_exception):
                message = f"ZooKeeper did not answer {what} within the timeout ({self._where()})"
            else:
                message = f"ZooKeeper {what} failed ({self._where()}): {type(exc).__name__}: {exc}"
            raise TokenUnavailableError(message, resource=resource) from exc

    def _guessed(self, was_new: bool) -> None:
        # Evidence on an unknown znode: it was new (a create won, a setData found none) or not.
        step = 1 if was_new else -1
        self._creates_won = max(-_GUESS_MEMORY, min(_GUESS_MEMORY, self._creates_won + step))

    def _remember(self, path: str) -> None:
        known = self._known
        if path not in known:
            if len(known) >= _KNOWN_PATHS:
                with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                    del known[next(iter(known))]
            known[path] = None

    def _collect(
        self,
        client: Any,
        async_result: Any,
        deadline: float,
        resource: str | None,
        what: str,
        *expected: type[BaseException],
    ) -> Any:
        """Wait until *deadline* for a request already sent; errors mapped as in :meth:`_request`."""
        try:
            return async_result.get(timeout=max(0.001, deadline - time.monotonic()))
        except expected:
            raise
        except Exception as exc:
            if isinstance(exc, client.handler.timeout_exception):
                message = f"ZooKeeper did not answer {what} within the timeout ({self._where()})"
            else:
                message = f"ZooKeeper {what} failed ({self._where()}): {type(exc).__name__}: {exc}"
            raise TokenUnavailableError(message, resource=resource) from exc

    def _pipelined(
        self,
        client: Any,
        names: list[str],
        send: Callable[[str], Any],
        deadline: float,
        what: str,
        window: int,
        *expected: type[BaseException],
    ) -> Iterator[tuple[str, Any]]:
        """Yield ``(name, reply)`` for ``send(name)`` over *names*, keeping at most *window* requests in flight.

        An *expected* error is yielded as the exception instead of a reply.
        """
        in_flight: list[tuple[str, Any]] = []
        position = 0
        while position < len(names) or in_flight:
            while position < len(names) and len(in_flight) < window:
                self._require_connected(client, None)
                in_flight.append((names[position], send(names[position])))
                position += 1
            batch, in_flight = in_flight, []
            for name, async_result in batch:
                try:
                    yield name, self._collect(client, async_result, deadline, None, what, *expected)
                except expected as exc:
                    yield name, exc

    def _create_path(self, client: Any, path: str, deadline: float, resource: str) -> None:
        with contextlib.suppress(NodeExistsError):
            self._request(
                client,
                lambda: client.create_async(path, b"", makepath=True),
                deadline,
                resource,
                "create",
                NodeExistsError,
            )

    def _token_from(self, resource: str, stat: Any, grantor: str) -> FencingToken:
        if not isinstance(stat, ZnodeStat):
            raise TokenUnavailableError(f"ZooKeeper returned {stat!r} instead of a ZnodeStat", resource=resource)
        try:
            return FencingToken(resource, validate_token_value(stat.mzxid), grantor)
        except InvalidTokenError as exc:
            raise TokenUnavailableError(f"ZooKeeper returned an unusable zxid: {exc}", resource=resource) from exc

    def _session_grantor(self, client: Any, deadline: float, resource: str | None) -> tuple[int, str]:
        """``(session id, grantor id)``: the id read (or created) in the current session, cached per session."""
        self._await_connected(client, deadline, resource)
        session = _session_of(client)
        if session is None:
            raise TokenUnavailableError(f"no ZooKeeper session ({self.state}); nothing was sent", resource=resource)
        cached = self._grantor
        if cached is not None and cached[0] == session:
            return cached
        path = f"{self.root}/grantor"
        candidate = f"zk-{uuid.uuid4().hex}"
        try:
            self._request(
                client,
                lambda: client.create_async(path, candidate.encode(), makepath=True),
                deadline,
                resource,
                "create grantor",
                NodeExistsError,
            )
            grantor = candidate
            log.warning("ZooKeeper %s%s had no grantor id: created %s", self._where(), self.root, grantor)
        except NodeExistsError:
            data, _ = self._request(client, lambda: client.get_async(path), deadline, resource, "getData grantor")
            text = bytes(data or b"").decode("ascii", "replace").strip()
            try:
                grantor = validate_grantor(text) or ""
            except InvalidTokenError as exc:
                raise TokenUnavailableError(f"{path} does not hold a grantor id: {exc}", resource=resource) from exc
        self._grantor = (session, grantor)
        return self._grantor

    def _token_path(self, resource: str) -> str:
        return f"{self.root}/tokens/{resource_to_znode_name(resource)}"

    def _lock_dir(self, resource: str) -> str:
        return f"{self.root}/locks/{resource_to_znode_name(resource)}"

    def _holder_path(self, resource: str) -> str:
        return f"{self.root}/holders/{resource_to_znode_name(resource)}"

    # Exclusive mode ------------------------------------------------------------

    def _acquire(self, client: Any, resource: str, deadline: float, lock_delay: float = 0.0) -> Lease:
        lock_dir = self._lock_dir(resource)
        # A unique prefix finds our node again if a create's reply is lost, and keeps
        # lock paths unique even if the lock directory is deleted and re-created.
        prefix = f"{uuid.uuid4().hex}{LEASE_MARKER}"
        holder = f"{socket.gethostname()}:{os.getpid()}".encode()
        # Read in the session that will own the lock node: a lease's tokens are minted under
        # check(lock node), which only a live node of that same session passes.
        session, grantor = self._session_grantor(client, deadline, resource)
        lock_path = self._create_lock_node(client, lock_dir, prefix, holder, deadline, resource)
        lease = Lease(self, resource, lock_path)
        lease._grantor = grantor
        if _session_of(client) != session:
            lease._mark_lost("the ZooKeeper session changed while the lease was taken")
        wake = threading.Event()
        with self._lock:
            self._leases.add(lease)
            self._waiters.add(wake)
        try:
            self._wait_for_turn(client, lease, lock_dir, wake, deadline)
            # Watch our own node: its deletion means the lease is gone.
            watch = functools.partial(self._on_lock_node_event, client, lease)
            if (
                self._request(client, lambda: client.exists_async(lock_path, watch=watch), deadline, resource, "exists")
                is None
            ):
                lease._mark_lost("the lock node disappeared")
            if lease.lost:
                raise TokenUnavailableError(
                    f"lease on {resource!r} was lost while being taken: {lease.lost_reason}", resource=resource
                )
            try:
                self._take_holder_record(client, lease, deadline, lock_delay)
                lease._token = self._mint_locked(client, lease, deadline)
            except LeaseLostError as exc:
                raise TokenUnavailableError(f"lease on {resource!r} was lost while being taken: {exc}") from exc
        except BaseException:
            with self._lock:
                self._leases.discard(lease)
                self._waiters.discard(wake)
            lease._mark_released()
            # Never wait here: the caller's deadline may be spent. Tracked if it fails. Nothing
            # ran under this lease, so a recorded hold is released cleanly (no lock-delay).
            self._release_lock_node(client, lease, wait=False)
            raise
        with self._lock:
            self._waiters.discard(wake)
        return lease

    def _create_lock_node(
        self, client: Any, lock_dir: str, prefix: str, holder: bytes, deadline: float, resource: str
    ) -> str:
        for attempt in range(2):
            self._await_connected(client, deadline, resource)
            self._require_connected(client, resource)
            async_result = client.create_async(f"{lock_dir}/{prefix}", holder, ephemeral=True, sequence=True)
            try:
                path: str = async_result.get(timeout=max(0.001, deadline - time.monotonic()))
                return path
            except NoNodeError:
                if attempt:
                    raise TokenUnavailableError(
                        f"cannot create lock directory {lock_dir!r}", resource=resource
                    ) from None
                self._create_path(client, lock_dir, deadline, resource)
            except Exception as exc:
                # The create may still happen (or have happened, its reply lost): make sure
                # the node is deleted when it does, or it would block every other holder.
                self._track_orphan(client, lock_dir, prefix, async_result)
                if isinstance(exc, client.handler.timeout_exception):
                    message = f"ZooKeeper did not create the lock node within the timeout ({self._where()})"
                else:
                    message = f"creating the lock node failed ({self._where()}): {type(exc).__name__}: {exc}"
                raise TokenUnavailableError(message, resource=resource) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait_for_turn(self, client: Any, lease: Lease, lock_dir: str, wake: threading.Event, deadline: float) -> None:
        resource = lease.resource
        own = lease.lock_path.rsplit("/", 1)[1]
        while True:
            if lease.lost:
                raise TokenUnavailableError(
                    f"lost the lock queue for {resource!r}: {lease.lost_reason}", resource=resource
                )
            children = self._request(
                client, lambda: client.get_children_async(lock_dir), deadline, resource, "getChildren"
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
            stat = self._request(
                client,
                functools.partial(client.exists_async, ahead, watch=lambda _event: wake.set()),
                deadline,
                resource,
                "exists",
            )
            if stat is None:
                continue
            # The state listener sets `wake` too, so a lost connection ends the wait at once.
            self._require_connected(client, resource)
            if not wake.wait(max(0.0, deadline - time.monotonic())):
                raise TokenUnavailableError(
                    f"the lease on {resource!r} stayed with another holder for the whole timeout", resource=resource
                )

    def _take_holder_record(self, client: Any, lease: Lease, deadline: float, lock_delay: float) -> None:
        """Record this lease as the resource's holder, first waiting out a lock-delay if one is due.

        Called once the lease is first in the queue, before minting.

        :raises LeaseLostError: the lock node is gone.
        :raises TokenUnavailableError: the delay outlasts *deadline*, or ZooKeeper failed.
        """
        held = _holder_record("held", lease.lock_path.rsplit("/", 1)[1], _whoami())
        for _ in range(5):
            version = self._wait_lock_delay(client, lease, deadline, lock_delay) if lock_delay > 0 else -1
            if self._write_holder_record(client, lease, held, version, deadline) is not None:
                lease._recorded = True
                return
        raise TokenUnavailableError(
            f"the holder record of {lease.resource!r} kept changing while the lease was taken", resource=lease.resource
        )

    def _write_holder_record(
        self, client: Any, lease: Lease, data: bytes, version: int, deadline: float
    ) -> ZnodeStat | None:
        """``[check(own lock node), setData(holder record, version)]``; ``None`` if the version moved.

        :raises LeaseLostError: the lock node is gone (nothing was written).
        """
        resource = lease.resource
        path = self._holder_path(resource)
        for attempt in range(2):

            def send() -> Any:
                transaction = client.transaction()
                transaction.check(lease.lock_path, -1)
                transaction.set_data(path, data, version)
                return transaction.commit_async()

            results = self._request(client, send, deadline, resource, "multi [check, setData holder]")
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
                self._create_path(client, path, deadline, resource)
                continue
            break
        raise TokenUnavailableError(f"unexpected multi-op result from ZooKeeper: {results!r}", resource=resource)

    def _wait_lock_delay(self, client: Any, lease: Lease, deadline: float, lock_delay: float) -> int:
        """Wait until a failed previous holder's lock-delay is over; return the record's version to overwrite."""
        resource = lease.resource
        path = self._holder_path(resource)
        own = lease.lock_path.rsplit("/", 1)[1]
        delay_ms = lock_delay * 1000.0
        while True:
            try:
                data, stat = self._request(
                    client, functools.partial(client.get_async, path), deadline, resource, "getData", NoNodeError
                )
            except NoNodeError:
                self._create_path(client, path, deadline, resource)
                continue
            state, lock = _read_holder_record(data)
            if state in ("", "released") or (state == "held" and lock == own):
                return int(stat.version)
            if state == "held":
                # We are first in the queue, so that holder's lock node is gone without a clean
                # release: it failed. Record when we found out; that write's mtime starts the delay.
                failed = _holder_record("failed", lock, _whoami())
                written = self._write_holder_record(client, lease, failed, stat.version, deadline)
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
        path = f"{self.root}/clock"
        try:
            stat = self._request(
                client, lambda: client.set_async(path, b""), deadline, resource, "setData clock", NoNodeError
            )
        except NoNodeError:
            self._create_path(client, path, deadline, resource)
            stat = self._request(client, lambda: client.set_async(path, b""), deadline, resource, "setData clock")
        return int(stat.mtime)

    def _mint_for_lease(self, lease: Lease, timeout: float | None) -> FencingToken:
        deadline = self._deadline(timeout)
        client = self._usable_client(lease.resource)
        return self._mint_locked(client, lease, deadline)

    def _mint_locked(self, client: Any, lease: Lease, deadline: float) -> FencingToken:
        """Mint with [check(lock node), setData(token node)]: a holder without its lock cannot mint."""
        resource = lease.resource
        token_path = self._token_path(resource)
        for attempt in range(2):

            def send() -> Any:
                transaction = client.transaction()
                transaction.check(lease.lock_path, -1)
                transaction.set_data(token_path, b"")
                return transaction.commit_async()

            results = self._request(client, send, deadline, resource, "multi [check, setData]")
            # A failed transaction does not raise: every entry must be looked at.
            if (
                isinstance(results, list)
                and len(results) == 2
                and results[0] is True
                and isinstance(results[1], ZnodeStat)
            ):
                return self._token_from(resource, results[1], lease._grantor)
            if isinstance(results, list) and len(results) == 2 and isinstance(results[0], NoNodeError):
                lease._mark_lost("ZooKeeper found the lock node gone when minting")
                raise LeaseLostError(
                    f"lease on {resource!r} is lost: its lock node {lease.lock_path!r} no longer exists",
                    resource=resource,
                )
            if (
                attempt == 0
                and isinstance(results, list)
                and len(results) == 2
                and isinstance(results[0], RolledBackError)
                and isinstance(results[1], NoNodeError)
            ):
                self._create_path(client, token_path, deadline, resource)
                continue
            raise TokenUnavailableError(f"unexpected multi-op result from ZooKeeper: {results!r}", resource=resource)
        raise AssertionError("unreachable")  # pragma: no cover

    def _watch_queue(self, lease: Lease) -> None:
        """Watch the lease's lock queue until a node queues behind it; then mark the lease contended.

        Everything runs on kazoo's callbacks, never blocking them: a failed
        request just ends the watch (a lease in trouble is marked lost by the
        session and lock-node handling, and an unwatched lease is only kept
        until its reuse window ends, as before).
        """
        client = self._client
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
                request()

        def request() -> None:
            try:
                client.get_children_async(lock_dir, watch=on_event).rawlink(on_children)
            except Exception:
                log.debug("cannot watch the lock queue of %r", lease.resource, exc_info=True)

        request()

    def _on_lock_node_event(self, client: Any, lease: Lease, event: Any) -> None:
        # Runs on kazoo's callback thread: no blocking, at most an async re-arm.
        if event.type == EventType.DELETED:
            lease._mark_lost("the lock node was deleted")
        elif event.type == EventType.CHANGED and not lease.lost and client.connected:
            client.exists_async(lease.lock_path, watch=functools.partial(self._on_lock_node_event, client, lease))
        # EventType.NONE: a connection state change, which the state listener handles.

    def _release(self, client: Any, lease: Lease) -> None:
        with self._lock:
            self._leases.discard(lease)
        lease._mark_released()
        if self._pid != os.getpid() or self._closed:
            return
        self._release_lock_node(client, lease, wait=True)

    def _release_lock_node(self, client: Any, lease: Lease, *, wait: bool) -> None:
        """Release cleanly: ``[setData(holder record, released), delete(lock node)]`` in one multi-op.

        A lease that never recorded itself, or a release that cannot be sent now,
        falls back to deleting the lock node alone, which leaves the record at
        ``held``: the next holder then treats it as a failure (a longer wait, never a shorter one).
        """
        if not lease._recorded or not (client.connected and client.state == KazooState.CONNECTED):
            self._delete_lock_node(client, lease.lock_path, wait=wait)
            return
        lock_dir, name = lease.lock_path.rsplit("/", 1)
        prefix = name[: name.rindex(LEASE_MARKER) + len(LEASE_MARKER)]
        key = (lock_dir, prefix)
        with self._lock:
            self._orphans.add(key)
        transaction = client.transaction()
        transaction.set_data(self._holder_path(lease.resource), _holder_record("released", name, _whoami()))
        transaction.delete(lease.lock_path)
        async_result = transaction.commit_async()

        def done(result: Any) -> None:
            # On kazoo's completion thread: no waiting, only async requests.
            value = result.value if result.exception is None else None
            released = isinstance(value, list) and len(value) == 2 and value[0] is True and value[1] is True
            if released or (isinstance(value, list) and len(value) == 2 and isinstance(value[1], NoNodeError)):
                # Released, or the lock node was already gone (the lease was lost): nothing left to do.
                with self._lock:
                    self._orphans.discard(key)
                return
            follow_up = client.delete_async(lease.lock_path)
            self._track_orphan(client, lock_dir, prefix, follow_up, deleting=True)

        async_result.rawlink(done)
        if wait:
            with contextlib.suppress(Exception):
                async_result.get(timeout=self.timeout)

    def _delete_lock_node(self, client: Any, path: str, *, wait: bool) -> None:
        lock_dir, name = path.rsplit("/", 1)
        prefix = name[: name.rindex(LEASE_MARKER) + len(LEASE_MARKER)]
        if not (client.connected and client.state == KazooState.CONNECTED):
            # Not sent while suspended (it could run later on a new session, harmlessly, but
            # it could also be dropped): remember it; it is retried once reconnected.
            with self._lock:
                self._orphans.add((lock_dir, prefix))
            return
        async_result = client.delete_async(path)
        self._track_orphan(client, lock_dir, prefix, async_result, deleting=True)
        if wait:
            with contextlib.suppress(Exception):
                async_result.get(timeout=self.timeout)

    def _track_orphan(
        self, client: Any, lock_dir: str, prefix: str, async_result: Any, *, deleting: bool = False
    ) -> None:
        key = (lock_dir, prefix)
        with self._lock:
            self._orphans.add(key)

        def done(result: Any) -> None:
            # On kazoo's completion thread: no waiting, only async requests.
            exc = result.exception
            if deleting:
                if exc is None or isinstance(exc, NoNodeError):
                    with self._lock:
                        self._orphans.discard(key)
            elif exc is None:
                # A lock node created after its caller gave up: delete it.
                follow_up = client.delete_async(result.value)
                self._track_orphan(client, lock_dir, prefix, follow_up, deleting=True)

        async_result.rawlink(done)

    def _clean_orphans(self, client: Any, deadline: float | None = None) -> None:
        """Delete lock nodes this session left behind; best effort, bounded by *deadline*."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        with self._lock:
            orphans = list(self._orphans)
        for lock_dir, prefix in orphans:
            try:
                children = self._request(
                    client,
                    functools.partial(client.get_children_async, lock_dir),
                    deadline,
                    None,
                    "getChildren",
                    NoNodeError,
                )
                for name in children:
                    if name.startswith(prefix):
                        self._request(
                            client,
                            functools.partial(client.delete_async, f"{lock_dir}/{name}"),
                            deadline,
                            None,
                            "delete",
                            NoNodeError,
                        )
            except NoNodeError:
                pass
            except (TokenUnavailableError, FencingConfigurationError) as exc:
                log.info("could not clean up lock nodes under %r yet: %s", lock_dir, exc)
                continue
            with self._lock:
                self._orphans.discard((lock_dir, prefix))


def _session_of(client: Any) -> int | None:
    """The client's current session id, ``None`` while it has none."""
    client_id = client.client_id
    return None if client_id is None else int(client_id[0])


def _whoami() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _stop_client(client: Any) -> None:
    try:
        client.stop()
        client.close()
    except Exception:
        log.debug("error while stopping the ZooKeeper client", exc_info=True)
