"""Harness fixtures for every kind of token source: embedded (memory, SQLite), ZooKeeper and etcd."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_fencing.testing.servers import ServerGroup
from tests.fixtures.etcd import EtcdCluster, EtcdServer
from tests.fixtures.zookeeper import ZooKeeperEnsemble, ZooKeeperServer

from .harness import SourceHarness


@pytest.fixture
def memory_harness() -> Iterator[SourceHarness]:
    harness = SourceHarness("memory", "memory://", shared_across_processes=False)
    yield harness
    harness.close_all()


@pytest.fixture
def sqlite_harness(tmp_path: Path) -> Iterator[SourceHarness]:
    db = tmp_path / "tokens.db"
    harness = SourceHarness("sqlite", f"sqlite:///{db}")

    def restart() -> None:
        # A "restart" of the embedded grantor: every connection closes, new ones open the file again.
        harness.close_all()

    def make_unavailable() -> str:
        # An unwritable location stands in for a grantor that cannot be reached.
        blocked = tmp_path / "no-such-dir" / "tokens.db"
        return f"sqlite:///{blocked}"

    harness.restart = restart
    harness.make_unavailable = make_unavailable
    yield harness
    harness.close_all()


@pytest.fixture
def zookeeper_harness(zookeeper_server: ZooKeeperServer, unique_name: str) -> Iterator[SourceHarness]:
    """The standalone server; restart is stop + start on the same data directory."""
    url = zookeeper_server.url(f"/{unique_name}")
    # The server the URL names goes away; the next test's fixture starts it again.
    yield from _server_harness("zookeeper", url, restart=zookeeper_server.restart, stop=zookeeper_server.stop)


@pytest.fixture
def zookeeper_ensemble_harness(zookeeper_ensemble: ZooKeeperEnsemble, unique_name: str) -> Iterator[SourceHarness]:
    """The 3-node ensemble; restart is kill -9 of the current leader, and minting goes on after re-election."""
    yield from _quorum_harness("zookeeper_ensemble", zookeeper_ensemble, zookeeper_ensemble.url(f"/{unique_name}"))


@pytest.fixture
def etcd_harness(etcd_server: EtcdServer, unique_name: str) -> Iterator[SourceHarness]:
    """The single member; restart is stop + start on the same data directory."""
    # The member the URL names goes away; the next test's fixture starts it again.
    yield from _server_harness(
        "etcd", etcd_server.url(f"/{unique_name}"), restart=etcd_server.restart, stop=etcd_server.member.stop
    )


@pytest.fixture
def etcd_cluster_harness(etcd_cluster: EtcdCluster, unique_name: str) -> Iterator[SourceHarness]:
    """The 3-member cluster; restart is kill -9 of the current leader, and minting goes on after re-election."""
    yield from _quorum_harness("etcd_cluster", etcd_cluster, etcd_cluster.url(f"/{unique_name}"))


def _quorum_harness(name: str, group: ServerGroup[Any], url: str) -> Iterator[SourceHarness]:
    """A harness on a 3-member group: restart kills the leader, unavailable pauses every member."""

    def pause_all() -> None:
        # SIGSTOP every member: TCP connects still succeed but nothing ever answers,
        # the partition case where a client without timeouts hangs forever.
        for member in group.members:
            member.pause()

    def resume_all() -> None:
        for member in group.members:
            member.resume()

    # The killed member stays down for the rest of the test: two of three keep quorum.
    yield from _server_harness(name, url, restart=group.kill_leader, stop=pause_all, after=resume_all)


def _server_harness(
    name: str,
    url: str,
    *,
    restart: Callable[[], None],
    stop: Callable[[], None],
    after: Callable[[], None] | None = None,
) -> Iterator[SourceHarness]:
    """A harness on servers of the test's own: *restart* restarts the grantor; unavailable is *stop*, after which
    the same URL names servers that do not answer. At the end the sources close, then *after* runs."""
    harness = SourceHarness(name, url)

    def make_unavailable() -> str:
        stop()
        return harness.url

    harness.restart = restart
    harness.make_unavailable = make_unavailable
    try:
        yield harness
    finally:
        harness.close_all()
        if after is not None:
            after()
