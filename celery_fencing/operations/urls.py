"""Gates from URLs, for the operator commands.

================================================  ==========================================
URL                                               gate
================================================  ==========================================
``redis://host:6379/0``, ``rediss://``, ``unix://``  :class:`~celery_fencing.RedisGate`
``postgresql://user@host/db``                     :class:`~celery_fencing.SQLGate` (psycopg)
``mysql://root@host/db``, ``mariadb://...``        :class:`~celery_fencing.SQLGate` (PyMySQL)
``sqlite:///relative.db``, ``sqlite:////abs.db``   :class:`~celery_fencing.SQLGate`
================================================  ==========================================

SQLAlchemy URLs with an explicit driver (``postgresql+psycopg://``) are used as
given; a bare ``postgresql://`` or ``mysql://`` picks the driver that is installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..exceptions import FencingConfigurationError
from ..protocols import Gate
from ..urls import redact_url, split_url

__all__ = ["GATE_SCHEMES", "OpenedGate", "gate_from_url", "sqlalchemy_url"]

GATE_SCHEMES = ("redis", "rediss", "unix", "postgresql", "postgres", "mysql", "mariadb", "sqlite")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def sqlalchemy_url(url: str) -> str:
    """*url* with a SQLAlchemy driver that is installed, when it names none.

    ``postgresql://`` means psycopg2 to SQLAlchemy; this package's tests and docs
    use psycopg 3, so a bare URL gets whichever of the two is installed.
    """
    parts = split_url(url, "database URL")
    scheme = parts.scheme.lower()
    if scheme in ("postgresql", "postgres"):
        driver = "psycopg" if _installed("psycopg") or not _installed("psycopg2") else "psycopg2"
        return parts._replace(scheme=f"postgresql+{driver}").geturl()
    if scheme in ("mysql", "mariadb"):
        driver = "pymysql" if _installed("pymysql") or not _installed("MySQLdb") else "mysqldb"
        return parts._replace(scheme=f"{scheme}+{driver}").geturl()
    return url


@dataclass
class OpenedGate:
    """A gate built from a URL, what to call it in output, and how to release it."""

    url: str
    gate: Gate
    kind: str
    close: Callable[[], None]
    client: Any = None  # the redis client or SQLAlchemy engine behind the gate

    @property
    def label(self) -> str:
        return redact_url(self.url)


def gate_from_url(url: str, *, redis_prefix: str = "fencing", sql_table: str | None = None) -> OpenedGate:
    """Build the gate a URL names; nothing is sent to the server yet.

    :raises FencingConfigurationError: a malformed URL, an unknown scheme, or a
        missing driver (naming the extra to install).
    """
    if not isinstance(url, str) or "://" not in url:
        raise FencingConfigurationError(
            f"gate URL must look like redis://host:6379/0 or postgresql://user@host/db, got {url!r}"
        )
    scheme = split_url(url, "gate URL").scheme.lower()
    if scheme in ("fenced+redis", "fenced+rediss"):
        return _result_fences(url)
    base = scheme.split("+", 1)[0]
    if base not in GATE_SCHEMES:
        raise FencingConfigurationError(
            f"unknown gate URL scheme {scheme!r} in {redact_url(url)!r}; known: redis, rediss, unix, postgresql, "
            "mysql, mariadb, sqlite"
        )
    if base in ("redis", "rediss", "unix"):
        try:
            import redis

            from ..gates.redis import RedisGate
        except ImportError as exc:
            raise FencingConfigurationError(f"{scheme}:// needs redis-py: pip install 'celery-fencing[redis]'") from exc
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
        except (ValueError, TypeError) as exc:
            raise FencingConfigurationError(f"malformed Redis URL {redact_url(url)!r}: {exc}") from exc
        return OpenedGate(url, RedisGate(client, prefix=redis_prefix), "redis", client.close, client)
    try:
        from sqlalchemy import create_engine
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        from ..gates.sql import DEFAULT_TABLE, SQLGate
    except ImportError as exc:
        raise FencingConfigurationError(f"{scheme}:// needs SQLAlchemy: pip install 'celery-fencing[sql]'") from exc
    target = sqlalchemy_url(url)
    if base == "sqlite":
        _require_sqlite_file(url)
    connect_args: dict[str, Any] = {} if base == "sqlite" else {"connect_timeout": 5}
    try:
        engine = create_engine(target, connect_args=connect_args)
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise FencingConfigurationError(f"malformed database URL {redact_url(url)!r}: {exc}") from exc
    except ImportError as exc:
        raise FencingConfigurationError(
            f"{redact_url(url)!r} needs the database driver {exc.name!r}, which is not installed"
        ) from exc
    gate = SQLGate(engine, table=sql_table or DEFAULT_TABLE)
    return OpenedGate(url, gate, "sql", engine.dispose, engine)


def _result_fences(url: str) -> OpenedGate:
    """The fenced result backend's fence hashes at the Redis of a ``fenced+redis://`` URL (read-only)."""
    try:
        import redis
    except ImportError as exc:
        raise FencingConfigurationError("fenced+redis:// needs redis-py: pip install 'celery-fencing[redis]'") from exc
    from .result_fences import ResultFences

    try:
        client = redis.Redis.from_url(url.removeprefix("fenced+"), socket_connect_timeout=5, socket_timeout=5)
    except (ValueError, TypeError) as exc:
        raise FencingConfigurationError(f"malformed Redis URL {redact_url(url)!r}: {exc}") from exc
    return OpenedGate(url, ResultFences(client), "result", client.close, client)


def _require_sqlite_file(url: str) -> None:
    # Connecting would create an empty database: an operator command must not.
    path = split_url(url, "sqlite:// URL").path
    path = path[1:] if path.startswith("/") else path
    if not path or path == ":memory:":
        raise FencingConfigurationError(f"{url!r} names no database file")
    if not Path(path).is_file():
        raise FencingConfigurationError(f"SQLite database {path!r} (from {url!r}) does not exist")
