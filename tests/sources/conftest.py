"""Harness fixtures for every kind of token source: embedded (memory, SQLite), ZooKeeper and etcd."""

from __future__ import annotations

from collections.abc import Iterator
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
    harness = SourceHarness("zookeeper", zookeeper_server.url(f"/{unique_name}"))

    def restart() -> None:
        zookeeper_server.restart()

    def make_unavailable() -> str:
        # The server the URL names goes away; the next test's fixture starts it again.
        zookeeper_server.stop()
        return harness.url

    harness.restart = restart
    harness.make_unavailable = make_unavailable
    yield harness
    harness.close_all()


@pytest.fixture
def zookeeper_ensemble_harness(zookeeper_ensemble: ZooKeeperEnsemble, unique_name: str) -> Iterator[SourceHarness]:
    """The 3-node ensemble; restart is kill -9 of the current leader, and minting goes on after re-election."""
    yield from _quorum_harness("zookeeper_ensemble", zookeeper_ensemble, zookeeper_ensemble.url(f"/{unique_name}"))


@pytest.fixture
def etcd_harness(etcd_server: EtcdServer, unique_name: str) -> Iterator[SourceHarness]:
    """The single member; restart is stop + start on the same data directory."""
    harness = SourceHarness("etcd", etcd_server.url(f"/{unique_name}"))

    def make_unavailable() -> str:
        # The member the URL names goes away; the next test's fixture starts it again.
        etcd_server.member.stop()
        return harness.url

    harness.restart = etcd_server.restart
    harness.make_unavailable = make_unavailable
    yield harness
    harness.close_all()


@pytest.fixture
def etcd_cluster_harness(etcd_cluster: EtcdCluster, unique_name: str) -> Iterator[SourceHarness]:
    """The 3-member cluster; restart is kill -9 of the current leader, and minting goes on after re-election."""
    yield from _quorum_harness("etcd_cluster", etcd_cluster, etcd_cluster.url(f"/{unique_name}"))


def _quorum_harness(name: str, group: ServerGroup[Any], url: str) -> Iterator[SourceHarness]:
    """A harness on a 3-member group: restart kills the leader, unavailable pauses every member."""
    harness = SourceHarness(name, url)

    def restart() -> None:
        # The killed member stays down for the rest of the test: two of three keep quorum.
        group.kill_leader()

    def make_unavailable() -> str:
        # SIGSTOP every member: TCP connects still succeed but nothing ever answers,
        # the partition case where a client without timeouts hangs forever.
        for member in group.members:
            member.pause()
        return harness.url

    harness.restart = restart
    harness.make_unavailable = make_unavailable
    try:
        yield harness
    finally:
        harness.close_all()
        for member in group.members:
            member.resume()
