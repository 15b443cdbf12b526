"""Fenced tasks on etcd, with real prefork workers: each child mints from its own connections; exclusive mode."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.celery.conftest import Scenario
from tests.celery.workers import wait_for
from tests.fixtures.etcd import EtcdCluster


@pytest.fixture
def etcd_scenario(redis_url: str, tmp_path: Path, unique_name: str, etcd_cluster: EtcdCluster) -> Iterator[Scenario]:
    """A real-worker scenario whose token source is the 3-member etcd cluster."""
    world = Scenario(unique_name, redis_url, tmp_path)
    world.env["FT_SOURCE"] = etcd_cluster.url(f"/fencing-{unique_name}", lease_ttl=4)
    yield world
    world.close()


def _events(scenario: Scenario, kind: str, task_id: str) -> list[list[str]]:
    return [e for e in scenario.events() if e[0] == kind and e[1] == task_id]


def test_prefork_children_mint_revision_tokens(etcd_scenario: Scenario) -> None:
    """Each prefork child mints from etcd after the fork; tokens of one resource strictly increase."""
    etcd_scenario.worker("w", pool="prefork", concurrency=2)
    got = [etcd_scenario.send("whoami", "etcd").get(timeout=60) for _ in range(6)]
    tokens = [g["token"] for g in got]
    assert tokens == sorted(set(tokens))


def test_exclusive_mode_on_etcd_runs_one_execution_at_a_time(etcd_scenario: Scenario) -> None:
    """With etcd's lock, the second execution of a resource enters only after the first exits, with a larger token."""
    scenario = etcd_scenario
    scenario.worker("w", pool="prefork", concurrency=2)
    name = uuid.uuid4().hex[:6]
    first = scenario.send("exclusive_job", name)
    entered = wait_for(lambda: _events(scenario, "enter", first.id), 60, "the first execution to enter")
    second = scenario.send("exclusive_job", name)
    wait_for(lambda: f"[{second.id}] received" in scenario.workers[0].log(), 30, "the second task to be received")
    assert not _events(scenario, "enter", second.id)
    scenario.release(first.id, entered[0][2])  # type: ignore[index]
    first_token = first.get(timeout=60)
    second_enter = wait_for(lambda: _events(scenario, "enter", second.id), 60, "the second execution to enter")
    scenario.release(second.id, second_enter[0][2])  # type: ignore[index]
    second_token = second.get(timeout=60)
    assert second_token > first_token
    order = [e[0] for e in scenario.events() if e[0] in ("enter", "exit")]
    assert order == ["enter", "exit", "enter", "exit"]
