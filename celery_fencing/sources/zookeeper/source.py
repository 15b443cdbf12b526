"""ZooKeeperTokenSource: minting zxids, and the facade over the session, pruning and leases.

A token is the ``mzxid`` of one write, times ``2**SCALE_BITS`` (:mod:`celery_fencing.blocks`):
a ``setData`` on the resource's znode ``<root>/tokens/<name>`` (or its
``create``, the first time), or on the shared ``<root>/transient`` for
:meth:`~ZooKeeperTokenSource.mint_transient`, whose write also reserves the
block of tokens below the next zxid for :meth:`~ZooKeeperTokenSource.mint_in_block`.
Errors: everything that prevents minting raises
:class:`~celery_fencing.TokenUnavailableError` with the driver's error
chained, within the call's timeout; a bad resource name raises
:class:`~celery_fencing.InvalidTokenError` before anything is sent. A mint
whose session changed while it ran is done again (at most three times), so a
token never carries the grantor id of data it was not minted from.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kazoo.client import KazooClient

from ...blocks import DEFAULT_BLOCK_SIZE, SCALE_BITS, TokenBlock, validate_block_size
from ...exceptions import FencingConfigurationError, TokenUnavailableError
from ...token import FencingToken, validate_resource
from ...values import seconds as validated_seconds
from . import config
from .calls import request
from .config import ZooKeeperTLS
from .grantor import Grantor, scaled, token_from
from .lease import LockQueue, ZooKeeperLease
from .names import Layout
from .orphans import clean_orphans, delete_lock_node
from .prune import prune_idle
from .session import Session, session_of
from .writer import TokenWriter

__all__ = ["ZooKeeperTokenSource"]


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
        after its holder failed rather than released it (see "Lock-delay" in
        docs/sinks.md); 0 (the default) turns it off. ``lease()`` can override it.
    :param digest: ``(username, password)``: authenticate with ZooKeeper's
        digest scheme and create every znode with an ACL for that user only
        (see "Access control" in docs/security.md). Only for a client the source builds.
    :param tls: TLS options for a client the source builds.
    :param block: tokens per block for :meth:`mint_in_block` (1 to
        ``2**SCALE_BITS``, the default): one ZooKeeper write reserves that
        many for this process. 1 turns blocks off: every token is a write.
    :raises FencingConfigurationError: for bad arguments.
    """

    volatile = False
    #: ``ceiling()`` is one counter for every resource: the ensemble's zxid.
    ceiling_is_global = True
    #: ``lease()`` takes ``lock_delay`` (:class:`~celery_fencing.protocols.LockDelaySource`).
    lease_takes_lock_delay = True

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
        block: int = DEFAULT_BLOCK_SIZE,
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
        self.timeout = validated_seconds("timeout", timeout)
        self.session_timeout = validated_seconds("session_timeout", session_timeout)
        self.lock_delay = validated_seconds("lock_delay", lock_delay, zero=True)
        #: Tokens one write reserves for :meth:`mint_in_block` (1: blocks are off).
        self.block_size = validate_block_size(block, maximum=2**SCALE_BITS)
        self._block = TokenBlock()
        self._layout = Layout(self.root)
        self._session = Session(
            self.hosts,
            client,
            timeout=self.timeout,
            session_timeout=self.session_timeout,
            options=self.client_options,
        )
        # The session knows when it is back; what to clean up is the leases' business.
        self._session.clean_orphans = functools.partial(clean_orphans, self._session)
        self._grantor = Grantor(self._session, self._layout)
        self._writer = TokenWriter(self._session)
        self._locks = LockQueue(self._session, self._layout, self._grantor)

    @classmethod
    def from_url(cls, url: str) -> ZooKeeperTokenSource:
        """Build a source from ``zookeeper://[user:password@]h1:2181,h2:2181/root?timeout=5&session_timeout=10``.

        The path is the root znode (default ``/fencing``). ``block=N`` sets
        the tokens per block (``block=1`` turns blocks off). ``user:password@``
        are digest credentials (percent-encoded). TLS: ``tls=true`` and
        optionally ``ca=``, ``certfile=``, ``keyfile=`` (file paths) and
        ``verify_certs=false``.

        :raises FencingConfigurationError: naming what is wrong with *url*
            (with the password shown as ``***``).
        """
        settings = config.parse_url(url)
        return cls(
            settings.hosts,
            root=settings.root,
            digest=settings.digest,
            tls=settings.tls,
            block=settings.block,
            **settings.seconds,
        )

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
        return self._session.state

    def add_state_listener(self, callback: Callable[[str], object]) -> None:
        """Call ``callback(state)`` on every session state change: CONNECTED, SUSPENDED or LOST.

        It runs on kazoo's connection thread, after the source has updated
        ``state`` and marked its leases lost: it must return quickly, never
        block and never call ZooKeeper. Exceptions it raises are logged.
        Listeners stay registered across ``fork()`` and then report the
        child's own connection.
        """
        self._session.add_state_listener(callback)

    def remove_state_listener(self, callback: Callable[[str], object]) -> None:
        """Stop calling *callback*; one that is not registered is ignored."""
        self._session.remove_state_listener(callback)

    def connect(self, *, timeout: float | None = None) -> None:
        """Connect now (instead of on first use) and wait until the session is up.

        :raises TokenUnavailableError: not connected within *timeout* (the
            client keeps trying in the background).
        """
        deadline = self._session.deadline(timeout)
        self._session.await_connected(self._session.usable_client(None), deadline, None)

    def grantor_id(self, *, timeout: float | None = None) -> str:
        """Return this ensemble's grantor id, creating it on first use (see "Grantor identity" in docs/security.md).

        :raises TokenUnavailableError: not connected, or ZooKeeper failed, within *timeout*.
        """
        deadline = self._session.deadline(timeout)
        return self._grantor.current(self._session.usable_client(None), deadline, None)[1]

    def ceiling(self, resource: str | None = None, *, timeout: float | None = None) -> int:
        """Return the top of the block of the ensemble's last zxid: no token minted so far is above it. Writes nothing.

        A ``sync`` of the root, then an ``exists``: every reply carries the
        server's last processed zxid, which after the sync covers every write
        committed before it; a block reserved by that write may hand out
        tokens up to the next zxid's scaled value, less one. For :class:`~celery_fencing.signing.PlausibilityBound`.

        :raises TokenUnavailableError: not connected, or no answer within *timeout*.
        """
        session = self._session
        deadline = session.deadline(timeout)
        client = session.usable_client(resource)
        request(session, client, lambda: client.sync_async(self.root), deadline, resource, "sync")
        request(session, client, lambda: client.exists_async(self.root), deadline, resource, "exists")
        return scaled(int(client.last_zxid) + 1) - 1

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
        return self._mint(names, [self._layout.token(name) for name in names], timeout)

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
        return self._mint([name], [self._layout.transient], timeout, reserve=True)[0]

    def mint_in_block(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """The next token of this process's block: no ZooKeeper write until the block is used up.

        A block is the room below the next zxid that one :meth:`mint_transient`
        write reserves: ``block`` tokens, handed out in order by this process
        (never after ``fork()``, never in another ZooKeeper session). A token
        of a block is above every token this process handed out before, but
        may be below one another process handed out earlier: a caller refused
        with it must mint fresh (:meth:`mint_transient`) before it concludes
        that a newer execution exists (see :mod:`celery_fencing.blocks`).
        With ``block=1`` every call is a :meth:`mint_transient`.

        Errors as :meth:`mint`, when the block is used up and a write is due.
        """
        name = validate_resource(resource)
        if self.block_size > 1:
            taken = self._block.take(session_of(self._session.usable_client(name)))
            if taken is not None:
                return FencingToken(name, taken[0], taken[1])
        return self.mint_transient(name, timeout=timeout)

    def skip_block_below(self, floor: int) -> bool:
        """Hand out no token of this process's block below *floor*: a store armed with it refuses them.

        A fenced task calls it with the floors it finds, so that its next draw
        is not refused (see :mod:`celery_fencing.blocks`); returns whether any
        token was skipped.
        """
        return self._block.skip_below(floor)

    def _mint(
        self, names: list[str], paths: list[str], timeout: float | None, *, reserve: bool = False
    ) -> list[FencingToken]:
        """One token per name: the zxid of one write to the znode at the same position of *paths*.

        With *reserve* (one name), the rest of the write's block becomes this process's block.
        """
        deadline = self._session.deadline(timeout)
        if not names:
            return []
        client = self._session.usable_client(names[0])
        for _ in range(3):
            session, grantor = self._grantor.current(client, deadline, names[0])
            stats = self._writer.write(client, names, paths, deadline)
            # A reply came on the session the id was read in: the zxids are that data's.
            if session_of(client) == session:
                tokens = [token_from(name, stat, grantor) for name, stat in zip(names, stats, strict=True)]
                if reserve and self.block_size > 1:
                    first = tokens[0].value
                    self._block.install(first + 1, first + self.block_size - 1, grantor, session)
                return tokens
        raise TokenUnavailableError(
            "the ZooKeeper session kept changing while minting; no token was handed out", resource=names[0]
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
        return prune_idle(self._session, self._layout, older_than, timeout, window, self._writer.forget)

    @contextlib.contextmanager
    def lease(
        self, resource: str, *, timeout: float | None = None, lock_delay: float | None = None
    ) -> Iterator[ZooKeeperLease]:
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
        "Lock-delay" in docs/sinks.md. A wait longer than what is left
        of *timeout* raises at once; the countdown is recorded in ZooKeeper and
        the next attempt (from any process) continues it.

        :raises TokenUnavailableError: the lock was not obtained within
            *timeout* (or the lock-delay outlasts it), or ZooKeeper is
            unreachable; no lock is left behind.
        :raises FencingConfigurationError: *lock_delay* is negative or not a number.
        """
        validate_resource(resource)
        delay = self.lock_delay if lock_delay is None else validated_seconds("lock_delay", lock_delay, zero=True)
        deadline = self._session.deadline(timeout)
        client = self._session.usable_client(resource)
        lease = self._locks.acquire(client, resource, deadline, delay)
        try:
            yield lease
        finally:
            self._locks.release(client, lease)

    def close(self) -> None:
        """Release held leases and stop the client the source built. Idempotent.

        A caller's client is left running. Bounded: stopping an unresponsive
        connection is finished in the background after ``timeout`` seconds.
        """
        self._session.close(functools.partial(delete_lock_node, self._session, wait=False))

    def __enter__(self) -> ZooKeeperTokenSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.hosts if self.hosts is not None else "caller's client"
        user = f"{self.username}@" if self._digest is not None else ""
        tls = " tls" if self.tls is not None else ""
        return f"<ZooKeeperTokenSource {user}{where}{self.root}{tls} {self.state}>"
