"""A durable token counter in a local SQLite file: the embedded, zero-setup grantor.

One counter for every resource, as ZooKeeper's zxid and etcd's revision are:
tokens of all resources are on one scale, which a store's floor needs (a
token minted after a store lost its marks is above every token minted
before, whatever their resources). Files of earlier versions had one counter
per resource; the one counter starts above the highest of them, so new
tokens order above every old mark. ``mint`` also keeps the resource's last
token (``fencing_tokens``, for ``celery-fencing inspect``);
``mint_transient``, which fenced tasks use for their task ids, keeps nothing.

Blocks (:mod:`celery_fencing.blocks`): ``mint_transient`` advances the
counter by ``block`` in its one transaction, returns the first value and
keeps the rest for this process's ``mint_in_block``, which then needs no
transaction (and no fsync) until the block is used up.

Suits a single host (the demo, a one-machine deployment, development). Several
processes on that host may mint concurrently: each mint is one ``BEGIN
IMMEDIATE`` transaction, which SQLite serialises across processes with a file
lock. The counter is on disk with ``synchronous=FULL`` in WAL mode, so a value
once returned survives a crash or power loss and is never returned again.

Deleting the file resets the counters: tokens then restart below the marks the
gates hold. The file also holds the grantor's identity (a random id, created
with the file), so a new file is a new grantor: the gates refuse its tokens
with :class:`~celery_fencing.GrantorMismatchError` rather than comparing them
with the old file's marks, until ``celery-fencing rebase`` moves the resources
over. Treat the file as state to back up.

Thread and fork safety: each OS thread of each process opens its own
connection (SQLite connections must not cross threads or ``fork()``); the
greenlets of a gevent worker share their thread's.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..blocks import DEFAULT_BLOCK_SIZE, TokenBlock, validate_block_size
from ..exceptions import FencingConfigurationError, InvalidTokenError, TokenUnavailableError
from ..token import FencingToken, validate_grantor, validate_resource

__all__ = ["SQLiteTokenSource"]

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fencing_tokens (
    resource TEXT PRIMARY KEY,
    value INTEGER NOT NULL CHECK (value >= 1 AND value <= 9223372036854775807)
)
"""
# One row, written once by whichever connection comes first: the file's identity.
_GRANTOR_SCHEMA = """
CREATE TABLE IF NOT EXISTS fencing_grantor (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    id TEXT NOT NULL
)
"""
# The one counter, in one row. Created above the per-resource counters of
# earlier versions (fencing_tokens), which are read once and never written.
_SEQUENCE_SCHEMA = """
CREATE TABLE IF NOT EXISTS fencing_sequence (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    value INTEGER NOT NULL CHECK (value >= 0 AND value <= 9223372036854775807)
)
"""
_SEQUENCE_START = """
INSERT OR IGNORE INTO fencing_sequence (singleton, value)
SELECT 1, coalesce(max(value), 0) FROM fencing_tokens
"""
# One statement: the lock of BEGIN IMMEDIATE makes the increment atomic
# across processes, and RETURNING hands back the value that was stored.
_MINT = "UPDATE fencing_sequence SET value = value + ? WHERE singleton = 1 RETURNING value"
_KEEP_LAST = """
INSERT INTO fencing_tokens (resource, value) VALUES (?, ?)
ON CONFLICT (resource) DO UPDATE SET value = excluded.value
"""


class SQLiteTokenSource:
    """Mints tokens from one counter, for every resource, in the SQLite file *path*.

    :param path: the database file; its directory must exist.
    :param timeout: default bound, in seconds, on how long ``mint`` waits for
        the file lock held by other minting processes.
    :param block: tokens per block for :meth:`mint_in_block` (1 turns blocks off).
    :raises FencingConfigurationError: the file cannot be opened or created.
    """

    volatile = False
    #: ``ceiling()`` is one counter for every resource.
    ceiling_is_global = True

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 5.0, block: int = DEFAULT_BLOCK_SIZE) -> None:
        self.path = Path(path)
        self.timeout = timeout
        #: Tokens one transaction reserves for :meth:`mint_in_block` (1: blocks are off).
        self.block_size = validate_block_size(block)
        self._block = TokenBlock()
        # One connection per process and OS thread (SQLite connections must not cross
        # threads or fork()). Keyed by the native thread id, not a threading.local:
        # gevent makes those per greenlet, which would open the file once per task.
        # Greenlets of one thread may share it: a mint runs no code that yields.
        self._by_thread: dict[tuple[int, int], sqlite3.Connection] = {}
        self._connections: list[tuple[int, sqlite3.Connection]] = []
        self._registry_lock = threading.Lock()
        self._closed = False
        try:
            deadline = time.monotonic() + timeout
            stored = self._retry_while_locked(lambda: self._create(deadline), deadline)
        except sqlite3.Error as exc:
            raise FencingConfigurationError(f"cannot open SQLite token database {str(self.path)!r}: {exc}") from exc
        try:
            #: This file's grantor id, carried by every token it mints.
            self.grantor: str = validate_grantor(stored) or ""
        except InvalidTokenError as exc:
            raise FencingConfigurationError(f"{str(self.path)!r} holds no valid grantor id: {exc}") from exc

    @staticmethod
    def _retry_while_locked(step: Callable[[], _T], deadline: float) -> _T:
        # Several processes opening a new file at once (the workers of a fresh
        # deployment) contend for it: switching to WAL and a statement that
        # upgrades a read to a write in WAL fail at once with "locked"/"busy"
        # instead of waiting in SQLite's busy handler. Retry until the deadline.
        delay = 0.005
        while True:
            try:
                return step()
            except sqlite3.OperationalError as exc:
                message = str(exc)
                if ("locked" not in message and "busy" not in message) or time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _create(self, deadline: float) -> str:
        """Create the tables and the grantor row if missing; return the stored grantor id."""
        conn = self._connection(deadline)
        # One write transaction taken up front: BEGIN IMMEDIATE waits in the busy
        # handler for other writers, so schema and identity appear together.
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(_SCHEMA)
            conn.execute(_SEQUENCE_SCHEMA)
            conn.execute(_SEQUENCE_START)
            conn.execute(_GRANTOR_SCHEMA)
            conn.execute("INSERT OR IGNORE INTO fencing_grantor (singleton, id) VALUES (1, ?)", (_new_grantor(),))
            (stored,) = conn.execute("SELECT id FROM fencing_grantor WHERE singleton = 1").fetchone()
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):  # keep the original error, not the rollback's
                conn.execute("ROLLBACK")
            raise
        return str(stored)

    def _connection(self, deadline: float | None = None) -> sqlite3.Connection:
        where = (os.getpid(), threading.get_native_id())
        conn: sqlite3.Connection | None = self._by_thread.get(where)
        if conn is not None:
            return conn
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves.
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
        try:
            # Within the caller's deadline: opening never waits longer than one timeout in all.
            until = time.monotonic() + self.timeout if deadline is None else deadline
            self._retry_while_locked(lambda: conn.execute("PRAGMA journal_mode=WAL"), until)
            conn.execute("PRAGMA synchronous=FULL")
        except BaseException:
            conn.close()
            raise
        with self._registry_lock:
            self._by_thread[where] = conn
            self._connections.append((os.getpid(), conn))
        return conn

    def mint(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """Return the counter's next value for *resource*, durably stored (with the resource's last token) first.

        :raises TokenUnavailableError: the file stayed locked for *timeout*
            seconds (default: the constructor's), or SQLite failed.
        """
        return self._mint(resource, timeout, keep=True)

    def mint_transient(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """As :meth:`mint`, keeping no row for *resource*: for task ids, never minted for again.

        Fresh, as :meth:`mint`; the same transaction reserves this process's next block.
        """
        return self._mint(resource, timeout, keep=False)

    def mint_in_block(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """The next token of this process's block; a :meth:`mint_transient` when it is used up.

        Above every token this process handed out before, but perhaps below one
        another process handed out earlier (see :mod:`celery_fencing.blocks`).
        """
        validate_resource(resource)
        if self._closed:
            raise TokenUnavailableError("SQLiteTokenSource is closed", resource=resource)
        taken = self._block.take()
        if taken is not None:
            return FencingToken(resource, taken[0], taken[1])
        return self._mint(resource, timeout, keep=False)

    def skip_block_below(self, floor: int) -> bool:
        """Hand out no token of this process's block below *floor*: a store armed with it refuses them.

        A fenced task calls it with the floors it finds, so that its next draw
        is not refused (see :mod:`celery_fencing.blocks`); returns whether any
        token was skipped.
        """
        return self._block.skip_below(floor)

    def _mint(self, resource: str, timeout: float | None, *, keep: bool) -> FencingToken:
        validate_resource(resource)
        if self._closed:
            raise TokenUnavailableError("SQLiteTokenSource is closed", resource=resource)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            try:
                conn = self._connection(deadline)
                # A transient mint reserves a block: the counter moves by its size, the first value is the token.
                step = 1 if keep else self.block_size
                conn.execute("BEGIN IMMEDIATE")
                try:
                    (value,) = conn.execute(_MINT, (step,)).fetchone()
                    if keep:
                        conn.execute(_KEEP_LAST, (resource, value))
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                first = value - step + 1
                if step > 1:
                    self._block.install(first + 1, value, self.grantor)
                return FencingToken(resource, first, self.grantor)
            except sqlite3.OperationalError as exc:
                # "database is locked" after the connection's busy timeout: retry
                # until our own deadline, then give up loudly.
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise TokenUnavailableError(
                        f"SQLite token source {str(self.path)!r} could not mint for {resource!r}: {exc}",
                        resource=resource,
                    ) from exc
            except sqlite3.Error as exc:
                raise TokenUnavailableError(
                    f"SQLite token source {str(self.path)!r} failed for {resource!r}: {exc}", resource=resource
                ) from exc

    def ceiling(self, resource: str, *, timeout: float | None = None) -> int:
        """Return the counter (0 if nothing was minted): no token of any resource is above. Writes nothing.

        :raises TokenUnavailableError: SQLite failed.
        """
        validate_resource(resource)
        try:
            row = self._connection().execute("SELECT value FROM fencing_sequence WHERE singleton = 1").fetchone()
        except sqlite3.Error as exc:
            raise TokenUnavailableError(
                f"SQLite token source {str(self.path)!r} failed: {exc}", resource=resource
            ) from exc
        return 0 if row is None else int(row[0])

    def grantor_id(self, *, timeout: float | None = None) -> str:
        """Return the file's grantor id (read when the source was opened)."""
        return self.grantor

    def close(self) -> None:
        """Close every connection this source opened in this process. Idempotent."""
        self._closed = True
        pid = os.getpid()
        with self._registry_lock:
            connections = [conn for owner, conn in self._connections if owner == pid]
            self._connections = []
            self._by_thread.clear()
        # A connection inherited across fork() belongs to the parent: leave it be.
        for conn in connections:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def __repr__(self) -> str:
        return f"<SQLiteTokenSource {str(self.path)!r}>"


def _new_grantor() -> str:
    return f"sqlite-{secrets.token_hex(16)}"
