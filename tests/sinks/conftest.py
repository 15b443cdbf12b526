"""Fixtures for the sinks that cannot check tokens: lock-delay, idempotency keys, conditional HTTP writes."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient

from celery_fencing.sources.zookeeper import ZooKeeperTokenSource
from tests.fixtures.zookeeper import ZooKeeperServer


@pytest.fixture
def admin(zookeeper_server: ZooKeeperServer) -> Iterator[KazooClient]:
    """A plain kazoo client on the standalone server, to inspect znodes."""
    client = KazooClient(zookeeper_server.hosts)
    client.start(30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def make_source(zookeeper_server: ZooKeeperServer, unique_name: str) -> Iterator[Callable[..., ZooKeeperTokenSource]]:
    """Build sources on the standalone server under this test's root; all closed at the end."""
    made: list[ZooKeeperTokenSource] = []

    def make(**kwargs: object) -> ZooKeeperTokenSource:
        kwargs.setdefault("root", f"/{unique_name}")
        if "client" not in kwargs:
            kwargs.setdefault("hosts", zookeeper_server.hosts)
        source = ZooKeeperTokenSource(**kwargs)  # type: ignore[arg-type]
        made.append(source)
        return source

    yield make
    for source in made:
        source.close()
