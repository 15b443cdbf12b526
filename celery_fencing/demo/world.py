"""What one demo invocation creates on servers and on disk, and how it is checked, described and undone.

A :class:`World` records everything as it is created (temp dir, account
store, Celery app, workers, a ZooKeeper root), so that cleanup can undo it on
every path. :func:`preflight` turns an unreachable server into a
:class:`~celery_fencing.FencingConfigurationError` naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..exceptions import FencingConfigurationError
from .processes import DemoWorker
from .settings import DemoSettings
from .store import AccountStore, describe_url
from .story import ACCOUNT, WORKERS

__all__ = ["World", "check_broker", "check_zookeeper", "delete_queues", "delete_znodes", "describe", "preflight"]


@dataclass
class World:
    """Everything one demo invocation created, so that cleanup can undo it."""

    directory: Path
    settings: DemoSettings
    store: AccountStore | None = None
    app: Any = None
    workers: list[DemoWorker] = field(default_factory=list)
    zookeeper_root: tuple[str, str] | None = None  # (hosts, root) to delete at the end


def describe(settings: DemoSettings, store: AccountStore) -> list[tuple[str, str]]:
    """(what, where) of each component, for the header of the output."""
    if settings.source.startswith("zookeeper://"):
        source = f"ZooKeeper {urlsplit(settings.source).netloc} (token = zxid of a write)"
    else:
        source = "SQLite counter file (embedded, durable)"
    if settings.broker.startswith("filesystem:"):
        broker = "kombu filesystem transport (files in a temp dir)"
    else:
        broker = describe_url(settings.broker)
    return [
        ("token source", source),
        ("storage", f"account {ACCOUNT} behind {store.description}"),
        ("broker", broker),
        ("results", "Celery file:// backend"),
    ]


def preflight(what: str, url: str, check: Callable[[], object]) -> None:
    """Run *check* of *what* at *url*; any failure but a configuration error becomes one naming it."""
    try:
        check()
    except FencingConfigurationError:
        raise
    except Exception as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FencingConfigurationError(f"cannot reach {what} at {describe_url(url)}: {detail}") from exc


def check_zookeeper(url: str) -> None:
    """Connect a source of *url* once, and close it."""
    from ..sources import token_source_from_url

    source = token_source_from_url(url)
    try:
        connect = getattr(source, "connect", None)
        if connect is not None:
            connect(timeout=5)
    finally:
        source.close()


def check_broker(app: Any) -> None:
    """Connect to *app*'s broker once."""
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=5)


def delete_queues(app: Any, settings: DemoSettings) -> None:
    """Delete the workers' queues on a real broker."""
    if settings.broker.startswith("filesystem:"):
        return  # the folders go with the temp dir
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for name in WORKERS:
            # Declared first: a virtual transport (Redis) deletes only the bindings it knows of.
            queue = app.amqp.queues[settings.queue(name)].bind(channel)
            queue.declare()
            queue.delete()


def delete_znodes(hosts: str, root: str) -> None:
    """Delete the demo's ZooKeeper root, recursively."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=5)
    client.start(timeout=5)
    try:
        client.delete(root, recursive=True)
    finally:
        client.stop()
        client.close()
