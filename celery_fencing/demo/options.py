"""The demo's options, and the settings they choose: the token source, the account's store, the broker.

Each server flag swaps one embedded component for a real one; without flags
everything lives in a temp dir (a SQLite counter file, a SQLite account, the
kombu filesystem transport).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..exceptions import FencingConfigurationError
from .settings import DemoSettings
from .store import describe_url

__all__ = ["DemoOptions", "check_options", "settings_for"]


@dataclass(frozen=True)
class DemoOptions:
    """The demo's command-line options: each server flag swaps one embedded component for a real one."""

    zookeeper: str | None = None
    redis: str | None = None
    postgres: str | None = None
    broker: str | None = None
    keep: bool = False
    wait_timeout: float = 40.0


def _normalise_postgres(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme in ("postgresql", "postgres"):
        return parts._replace(scheme="postgresql+psycopg").geturl()
    if not parts.scheme.startswith("postgresql+"):
        raise FencingConfigurationError(f"--postgres needs a postgresql:// URL, got {describe_url(url)!r}")
    return url


def check_options(options: DemoOptions) -> None:
    """Refuse options that contradict each other or name the wrong kind of URL, before anything starts."""
    if options.redis and options.postgres:
        raise FencingConfigurationError(
            "--redis and --postgres both choose where the account lives: give one of them (the demo has one gate)"
        )
    if options.redis and urlsplit(options.redis).scheme not in ("redis", "rediss"):
        raise FencingConfigurationError(f"--redis needs a redis:// URL, got {describe_url(options.redis)!r}")
    if options.postgres:
        _normalise_postgres(options.postgres)
    if options.broker is not None and "://" not in options.broker:
        raise FencingConfigurationError(f"--broker needs a broker URL like redis://host:6379/0, got {options.broker!r}")


def settings_for(options: DemoOptions, directory: Path) -> tuple[DemoSettings, tuple[str, str] | None]:
    """The settings of one invocation in *directory*, and the ZooKeeper (hosts, root) to delete at the end."""
    namespace = "cfdemo" + uuid.uuid4().hex[:10]
    zookeeper_root = None
    if options.zookeeper:
        hosts = options.zookeeper.removeprefix("zookeeper://").rstrip("/")
        root = f"/celery-fencing-demo-{namespace}"
        source = f"zookeeper://{hosts}{root}"
        zookeeper_root = (hosts, root)
    else:
        source = f"sqlite:///{directory / 'tokens.db'}"
    if options.redis:
        store = options.redis
    elif options.postgres:
        store = _normalise_postgres(options.postgres)
    else:
        store = f"sqlite:///{directory / 'bank.db'}"
    broker = options.broker or "filesystem://"
    settings = DemoSettings(str(directory), namespace, broker, source, store)
    return settings, zookeeper_root
