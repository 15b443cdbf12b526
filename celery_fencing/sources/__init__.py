"""Token sources (grantors) and the URL factory that builds them.

=========================================  =======================================
URL                                        source
=========================================  =======================================
``zookeeper://h1:2181,h2:2181/root``       :class:`ZooKeeperTokenSource` (production)
``etcd://h1:2379,h2:2379/prefix``          :class:`EtcdTokenSource` (production)
``sqlite:///relative/tokens.db``           :class:`SQLiteTokenSource` (one host)
``sqlite:////absolute/tokens.db``
``memory://``                              :class:`MemoryTokenSource` (unit tests)
=========================================  =======================================

Query parameters: ``timeout`` (seconds, every source), for ZooKeeper
``session_timeout`` (seconds) and the TLS options ``tls``, ``ca``,
``certfile``, ``keyfile``, ``verify_certs``, for ZooKeeper and SQLite
``block`` (tokens one coordinator write reserves for a process, default
1024; ``block=1`` turns token blocks off: :mod:`celery_fencing.blocks`), for
etcd ``lease_ttl`` (seconds) and ``cluster_id``. ZooKeeper takes digest credentials in the URL,
``zookeeper://user:password@h1:2181/root`` (percent-encode ``@ : /`` in them);
error messages show such URLs with the password as ``***``. Driver modules are imported only when their scheme is used,
so ``import celery_fencing`` pulls in no driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..exceptions import FencingConfigurationError
from ..protocols import TokenSource

# Re-exported: sources named these before they moved to the core's URL module.
from ..urls import parse_block, parse_seconds, query_params, redact_url, split_url

if TYPE_CHECKING:
    from .etcd import EtcdTokenSource
    from .memory import MemoryTokenSource
    from .sqlite import SQLiteTokenSource
    from .zookeeper import ZooKeeperTokenSource

__all__ = [
    "EtcdTokenSource",
    "MemoryTokenSource",
    "SQLiteTokenSource",
    "ZooKeeperTokenSource",
    "redact_url",
    "split_url",
    "token_source_from_url",
]

SCHEMES = ("etcd", "memory", "sqlite", "zookeeper")


def token_source_from_url(url: str) -> TokenSource:
    """Build the token source a URL names.

    :raises FencingConfigurationError: for a malformed URL, an unknown scheme
        or parameter, or a missing driver (naming the extra to install).
    """
    if not isinstance(url, str) or "://" not in url:
        raise FencingConfigurationError(
            "token source URL must look like 'zookeeper://host:2181/root' or 'sqlite:///tokens.db', "
            f"got {redact_url(url)!r:.200}"
        )
    parts = split_url(url, "token source URL")
    scheme = parts.scheme.lower()
    if scheme == "etcd":
        # No driver to import: the etcd source speaks HTTP with the standard library.
        from .etcd import EtcdTokenSource

        return EtcdTokenSource.from_url(url)
    if scheme == "zookeeper":
        try:
            from .zookeeper import ZooKeeperTokenSource
        except ImportError as exc:
            raise FencingConfigurationError(
                f"zookeeper:// needs kazoo: pip install 'celery-fencing[zookeeper]' ({exc})"
            ) from exc
        source: TokenSource = ZooKeeperTokenSource.from_url(url)
        return source
    shown = redact_url(url)
    params = query_params(
        parts, {"timeout", "block"} if scheme == "sqlite" else {"timeout"}, what="token source URL", shown=shown
    )
    block = parse_block(shown, params.pop("block")) if "block" in params else None
    seconds = {name: parse_seconds(shown, name, raw) for name, raw in params.items()}

    if scheme == "memory":
        if parts.netloc or parts.path not in ("", "/"):
            raise FencingConfigurationError(f"memory:// takes no host or path, got {shown!r}")
        from .memory import MemoryTokenSource

        return MemoryTokenSource()
    if scheme == "sqlite":
        if parts.netloc:
            raise FencingConfigurationError(
                "sqlite:// takes no host: write sqlite:///relative/path.db or sqlite:////absolute/path.db, "
                f"got {shown!r}"
            )
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path or path.endswith("/"):
            raise FencingConfigurationError(f"sqlite:// URL {shown!r} names no database file")
        from .sqlite import SQLiteTokenSource

        options: dict[str, Any] = {**seconds} if block is None else {**seconds, "block": block}
        return SQLiteTokenSource(path, **options)
    raise FencingConfigurationError(
        f"unknown token source scheme {parts.scheme!r:.40} in {shown!r}; known schemes: {', '.join(SCHEMES)}"
    )


def __getattr__(name: str) -> object:
    # Lazy re-exports, so naming a source class never imports another's driver.
    if name == "EtcdTokenSource":
        from .etcd import EtcdTokenSource

        return EtcdTokenSource
    if name == "MemoryTokenSource":
        from .memory import MemoryTokenSource

        return MemoryTokenSource
    if name == "SQLiteTokenSource":
        from .sqlite import SQLiteTokenSource

        return SQLiteTokenSource
    if name == "ZooKeeperTokenSource":
        from .zookeeper import ZooKeeperTokenSource

        return ZooKeeperTokenSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
