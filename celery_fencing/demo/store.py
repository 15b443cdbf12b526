"""The demo's bank account, in SQLite, PostgreSQL (SQLGate) or Redis (RedisGate).

Each store offers the same five operations, so the story is told identically
on every backend: read the balance, write it unchecked (fencing off), write it
through the gate with a token (fencing on), and the gate itself for the
task's claim. Drivers are imported only by the store that needs them.
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import urlsplit

from ..exceptions import FencingConfigurationError
from ..protocols import Gate
from ..token import FencingToken

__all__ = ["AccountStore", "RedisAccountStore", "SQLAccountStore", "describe_url", "store_from_url"]


class AccountStore(Protocol):
    """One place holding account balances, with a gate in front of it."""

    description: str

    def setup(self) -> None:
        """Create what the store needs (tables). Idempotent."""

    def reset(self, account_id: int, balance: int) -> None:
        """Set the balance before a run (setup, unchecked)."""

    def read(self, account_id: int) -> int:
        """Read the balance (reads are never gated: the task's claim fences them)."""
        ...

    def write_unchecked(self, account_id: int, balance: int) -> None:
        """Write the balance with nothing checking who writes: fencing off."""

    def write_fenced(self, token: FencingToken, account_id: int, balance: int) -> None:
        """Write the balance through the gate; raises StaleTokenError for a stale token."""

    def gate(self) -> Gate:
        """The gate a fenced task claims its token on when it starts."""
        ...

    def high_water(self, resource: str) -> int | None:
        """The resource's high-water mark at the gate."""
        ...

    def teardown(self) -> None:
        """Remove everything the demo created on a shared server."""

    def close(self) -> None:
        """Release connections."""


def describe_url(url: str) -> str:
    """A URL without its password, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


class SQLAccountStore:
    """Accounts in a SQL table; the gate is an :class:`~celery_fencing.SQLGate` mark table.

    A fenced write is a guarded transaction: the mark is advanced (or the token
    refused) by the transaction's first statement, and the balance update
    commits with it.
    """

    def __init__(self, url: str, namespace: str) -> None:
        from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, create_engine, event

        from ..gates.sql import SQLGate

        self.url = url
        is_sqlite = url.startswith("sqlite")
        if is_sqlite:
            self.engine = create_engine(url, connect_args={"timeout": 30})

            @event.listens_for(self.engine, "connect")
            def _wal(dbapi_connection: Any, _record: Any) -> None:
                # WAL lets the runner read while a worker writes.
                dbapi_connection.execute("PRAGMA journal_mode=WAL")

            self.description = "SQLGate on a SQLite file"
        else:
            self.engine = create_engine(url, pool_pre_ping=True, connect_args=_connect_timeout(url))
            self.description = f"SQLGate on {self.engine.dialect.name} ({describe_url(url)})"
        self._temporary_tables = not is_sqlite
        self._metadata = MetaData()
        self._accounts = Table(
            f"{namespace}_accounts",
            self._metadata,
            Column("id", Integer, primary_key=True, autoincrement=False),
            Column("balance", BigInteger, nullable=False),
        )
        self._gate = SQLGate(self.engine, table=f"{namespace}_marks", metadata=self._metadata)

    def setup(self) -> None:
        self._metadata.create_all(self.engine)

    def reset(self, account_id: int, balance: int) -> None:
        from sqlalchemy import delete, insert

        with self.engine.begin() as conn:
            conn.execute(delete(self._accounts).where(self._accounts.c.id == account_id))
            conn.execute(insert(self._accounts).values(id=account_id, balance=balance))

    def read(self, account_id: int) -> int:
        from sqlalchemy import select

        with self.engine.connect() as conn:
            value = conn.execute(select(self._accounts.c.balance).where(self._accounts.c.id == account_id)).scalar()
        return int(value or 0)

    def write_unchecked(self, account_id: int, balance: int) -> None:
        from sqlalchemy import update

        with self.engine.begin() as conn:
            conn.execute(update(self._accounts).where(self._accounts.c.id == account_id).values(balance=balance))

    def write_fenced(self, token: FencingToken, account_id: int, balance: int) -> None:
        from sqlalchemy import update

        with self._gate.transaction(token) as conn:
            conn.execute(update(self._accounts).where(self._accounts.c.id == account_id).values(balance=balance))

    def gate(self) -> Gate:
        return self._gate

    def high_water(self, resource: str) -> int | None:
        return self._gate.high_water(resource)

    def teardown(self) -> None:
        if self._temporary_tables:
            self._metadata.drop_all(self.engine)

    def close(self) -> None:
        self.engine.dispose()


class RedisAccountStore:
    """Accounts as Redis keys; the gate is a :class:`~celery_fencing.RedisGate` (marks beside the data)."""

    def __init__(self, url: str, namespace: str) -> None:
        import redis

        from ..gates.redis import RedisGate

        self.url = url
        self.namespace = namespace
        self.client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
        self._gate = RedisGate(self.client, prefix=f"{namespace}:fence")
        self.description = f"RedisGate on {describe_url(url)}"

    def _key(self, account_id: int) -> str:
        return f"{self.namespace}:account:{account_id}:balance"

    def setup(self) -> None:
        self.client.ping()

    def reset(self, account_id: int, balance: int) -> None:
        self.client.set(self._key(account_id), balance)

    def read(self, account_id: int) -> int:
        return int(self.client.get(self._key(account_id)) or 0)

    def write_unchecked(self, account_id: int, balance: int) -> None:
        self.client.set(self._key(account_id), balance)

    def write_fenced(self, token: FencingToken, account_id: int, balance: int) -> None:
        self._gate.set(token, self._key(account_id), balance)

    def gate(self) -> Gate:
        return self._gate

    def high_water(self, resource: str) -> int | None:
        return self._gate.high_water(resource)

    def teardown(self) -> None:
        keys = list(self.client.scan_iter(f"{self.namespace}:*"))
        if keys:
            self.client.delete(*keys)

    def close(self) -> None:
        self.client.close()


def _connect_timeout(url: str) -> dict[str, Any]:
    # A server that does not answer must fail the demo fast, not hang it.
    if url.startswith("postgresql"):
        return {"connect_timeout": 5}
    if url.startswith(("mysql", "mariadb")):
        return {"connect_timeout": 5}
    return {}


def store_from_url(url: str, namespace: str) -> AccountStore:
    """Build the store a URL names.

    :raises FencingConfigurationError: unknown scheme, or its driver is missing.
    """
    scheme = urlsplit(url).scheme.lower()
    try:
        if scheme in ("redis", "rediss"):
            return RedisAccountStore(url, namespace)
        if scheme.split("+")[0] in ("sqlite", "postgresql", "postgres", "mysql", "mariadb"):
            return SQLAccountStore(url, namespace)
    except ImportError as exc:
        extra = "redis" if scheme.startswith("redis") else "sql"
        raise FencingConfigurationError(
            f"the demo's store {describe_url(url)} needs a driver that is not installed ({exc.name}): "
            f"pip install 'celery-fencing[{extra}]'"
        ) from exc
    raise FencingConfigurationError(f"the demo cannot keep an account in {describe_url(url)!r}")
