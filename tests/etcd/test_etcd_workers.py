"""Fenced tasks on etcd, with real prefork workers: each child mints from its own connections; exclusive mode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.celery.conftest import Scenario
from tests.fixtures.etcd import EtcdCluster


@pytest.fixture
def etcd_scenario(redis_url: str, tmp_path: Path, unique_name: str, etcd_cluster: EtcdCluster) -> Iterator[Scenario]:
    """A real-worker scenario whose token source is the 3-member etcd cluster."""
    world = Scenario(unique_name, redis_url, tmp_path)
    world.env["FT_SOURCE"] = etcd_cluster.url(f"/fencing-{unique_name}", lease_ttl=4)
    yield world
    world.close()


def test_prefork_children_mint_revision_tokens(etcd_scenario: Scenario) -> None:
    """Each prefork child mints from etcd after the fork; tokens of one resource strictly increase."""
    etcd_scenario.worker("w", pool="prefork", concurrency=2)
    got = [etcd_scenario.send("whoami", "etcd").get(timeout=60) for _ in range(6)]
    tokens = [g["token"] for g in got]
    assert tokens == sorted(set(tokens))


def test_exclusive_mode_on_etcd_runs_one_execution_at_a_time(etcd_scenario: Scenario) -> None:
    """With etcd's lock, the second execution of a resource enters only after the first exits, with a larger token."""
    etcd_scenario.worker("w", pool="prefork", concurrency=2)
    etcd_scenario.check_exclusive_runs_one_at_a_time()
