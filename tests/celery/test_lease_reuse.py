"""fencing_lease_reuse: an exclusive lease and its token kept for the next task of the same resource, safely."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from kazoo.client import KazooClient

from celery_fencing import FencingConfigurationError, RedisGate, TokenUnavailableError
from celery_fencing.celery.runtime import FencingRuntime, HeldLease
from celery_fencing.celery.settings import read_settings
from celery_fencing.sources.zookeeper import ZooKeeperTokenSource
from tests.fixtures.zookeeper import ZooKeeperServer

from .conftest import Scenario
from .workers import wait_for

EXCLUSIVE_WITH_REUSE = ("--fencing-mode", "exclusive", "--fencing-lease-reuse", "3")


def _use_zookeeper(scenario: Scenario, server: ZooKeeperServer) -> None:
    scenario.env["FT_SOURCE"] = server.url(f"/fencing-{scenario.name}", timeout=5)


def test_consecutive_tasks_of_a_resource_reuse_the_lease_and_its_token(
    scenario: Scenario, zookeeper_server: ZooKeeperServer
) -> None:
    """In one worker process, back-to-back tasks of one resource run under one lease and token;
    once the lease is released (idle past fencing_lease_reuse), the next task gets a larger token."""
    _use_zookeeper(scenario, zookeeper_server)
    scenario.worker("w", pool="solo", extra_args=EXCLUSIVE_WITH_REUSE)
    name = uuid.uuid4().hex[:6]
    first = [scenario.send("whoami", name).get(timeout=60) for _ in range(4)]
    assert len({result["token"] for result in first}) == 1
    other = scenario.send("whoami", name + "-other").get(timeout=60)
    assert other["token"] > first[0]["token"]
    time.sleep(3.5)  # the kept lease expires and is released by the worker
    later = scenario.send("whoami", name).get(timeout=60)
    assert later["token"] > other["token"]


def test_a_refused_token_is_never_reused(scenario: Scenario, zookeeper_server: ZooKeeperServer) -> None:
    """A task fenced out by a newer token drops its lease: its retry leases anew, with a token above the newer one."""
    _use_zookeeper(scenario, zookeeper_server)
    scenario.worker("w", pool="solo", extra_args=EXCLUSIVE_WITH_REUSE)
    name = uuid.uuid4().hex[:6]
    result = scenario.send("policy_retry", name).get(timeout=90)
    fenced = [event for event in scenario.events() if event[0] == "fenced-out"]
    assert len(fenced) == 1
    refused, newer = int(fenced[0][3]), int(fenced[0][4])
    assert result["retries"] == 1
    assert result["token"] > newer > refused
    # The next task of the resource reuses the retry's lease, never the refused token.
    again = scenario.send("policy_retry", name).get(timeout=90)
    assert again["token"] >= result["token"]


def test_a_kept_lease_is_not_claimed_again_and_a_newer_holder_still_refuses_its_write(
    scenario: Scenario, zookeeper_server: ZooKeeperServer
) -> None:
    """The next task on a kept lease skips the claims its token made already: a newer holder that claimed the
    resource meanwhile (the lease lost unnoticed) refuses that task at its write instead of its claim; the task
    drops the lease, and its retry leases anew above the newer holder. Nothing stale lands."""
    _use_zookeeper(scenario, zookeeper_server)
    worker = scenario.worker("w", pool="solo", extra_args=EXCLUSIVE_WITH_REUSE)
    name = uuid.uuid4().hex[:6]
    first = scenario.send("kept_lease_write", name).get(timeout=60)
    assert scenario.send("kept_lease_write", name).get(timeout=60) == first, "the second task reused lease and token"
    source = ZooKeeperTokenSource.from_url(scenario.env["FT_SOURCE"])
    try:
        newer = source.mint(f"kept:{name}")  # a holder that took the resource after this lease was lost unnoticed
    finally:
        source.close()
    gate = RedisGate(scenario.redis, prefix=scenario.key("fence"))
    gate.claim(newer)
    third = scenario.send("kept_lease_write", name)
    assert third.get(timeout=90)["retries"] == 1
    attempts = [(int(retries), int(token)) for _, _, retries, token in scenario.events_of("attempt", third.id)]
    assert attempts[0] == (0, first["token"]), "the kept lease's token ran the body: its claim was not made again"
    assert attempts[1][1] > newer.value, "the retry leased anew, above the newer holder"
    refusal = f"fenced out at body on 'kept:{name}' (token {first['token']}, high-water mark {newer.value})"
    assert refusal in worker.log()
    assert int(scenario.redis.get(scenario.key("kept", name)) or 0) == attempts[1][1]


def test_two_prefork_processes_share_a_hot_resource_without_timing_out(
    scenario: Scenario, zookeeper_server: ZooKeeperServer
) -> None:
    """With two pool processes contending for one resource, a kept lease is released within
    fencing_lease_reuse, so the other process gets it long before its fencing_timeout: every task succeeds once."""
    _use_zookeeper(scenario, zookeeper_server)
    scenario.worker("w", pool="prefork", concurrency=2, extra_args=EXCLUSIVE_WITH_REUSE)
    name = uuid.uuid4().hex[:6]
    results = [scenario.send("whoami", name) for _ in range(60)]
    got = [result.get(timeout=120) for result in results]
    by_pid: dict[int, list[int]] = {}
    for item in got:
        by_pid.setdefault(item["pid"], []).append(item["token"])
    for tokens in by_pid.values():
        assert tokens == sorted(tokens)
    assert "fenced out" not in scenario.workers[0].log()


@pytest.fixture
def source(zookeeper_server: ZooKeeperServer, unique_name: str) -> Iterator[ZooKeeperTokenSource]:
    with ZooKeeperTokenSource(zookeeper_server.hosts, root=f"/{unique_name}", timeout=5) as built:
        yield built


def _held(source: ZooKeeperTokenSource, resource: str, keep_for: float) -> HeldLease:
    manager = source.lease(resource)
    lease = manager.__enter__()
    now = time.monotonic()
    return HeldLease(manager, lease, taken_at=now, keep_until=now + keep_for)


def test_a_lost_lease_is_not_handed_out_again(source: ZooKeeperTokenSource, zookeeper_server: ZooKeeperServer) -> None:
    """A kept lease whose lock node disappeared (lost) is released, not given to the next task."""
    runtime = FencingRuntime(Celery("reuse-lost"))
    held = _held(source, "r", keep_for=30)
    assert runtime.keep_lease("r", held)
    admin = KazooClient(zookeeper_server.hosts)
    admin.start(30)
    try:
        admin.delete(held.lease.lock_path)
    finally:
        admin.stop()
        admin.close()
    wait_for(lambda: held.lease.lost, 10, "the lease to be marked lost")
    assert runtime.take_lease("r") is None
    runtime.close()


def test_an_expired_kept_lease_is_released_while_idle(source: ZooKeeperTokenSource) -> None:
    """The runtime releases a kept lease when its time is up, so another holder can take the resource."""
    runtime = FencingRuntime(Celery("reuse-idle"))
    held = _held(source, "r", keep_for=0.5)
    assert runtime.keep_lease("r", held)
    with source.lease("r", timeout=5) as successor:
        assert successor.token.value > held.lease.token.value
    assert runtime.take_lease("r") is None
    runtime.close()


def test_a_kept_lease_is_handed_over_once_another_holder_queues(
    source: ZooKeeperTokenSource, zookeeper_server: ZooKeeperServer, unique_name: str
) -> None:
    """An idle kept lease goes to a holder that queues for it (another process, another worker) within
    moments, not at the end of its reuse window: the waiter's 5 s timeout is far below the 60 s window,
    so without the hand-over it would time out."""
    runtime = FencingRuntime(Celery("reuse-contended"))
    held = _held(source, "r", keep_for=60)
    assert runtime.keep_lease("r", held)
    other = ZooKeeperTokenSource(zookeeper_server.hosts, root=f"/{unique_name}", timeout=5)
    with other, other.lease("r", timeout=5) as successor:
        assert successor.token.value > held.lease.token.value
    assert held.contended
    assert runtime.take_lease("r") is None
    runtime.close()


def test_a_lease_reports_contention_once_someone_queues(
    source: ZooKeeperTokenSource, zookeeper_server: ZooKeeperServer, unique_name: str
) -> None:
    """ZooKeeperLease.on_contended: silent while nobody waits, called when a second holder queues, and called
    at once for a callback registered after that."""
    heard: list[str] = []
    with source.lease("c", timeout=5) as lease:
        lease.on_contended(lambda _lease: heard.append("first"))
        with source.lease("c-other", timeout=5):
            pass  # another resource's queue is not this lease's
        assert not lease.contended and heard == []
        with ZooKeeperTokenSource(zookeeper_server.hosts, root=f"/{unique_name}", timeout=5) as other:
            waiting = other.lease("c", timeout=0.5)
            with pytest.raises(TokenUnavailableError):
                waiting.__enter__()  # queues, then times out: the holder keeps the lease
        wait_for(lambda: heard == ["first"], 10, "the contention callback")
        assert lease.contended
        lease.on_contended(lambda _lease: heard.append("late"))
        wait_for(lambda: heard == ["first", "late"], 10, "the late callback")


def test_a_lease_is_kept_at_most_once_per_resource_and_is_released_on_close(source: ZooKeeperTokenSource) -> None:
    """keep_lease refuses an expired lease, and close() releases every kept lease."""
    runtime = FencingRuntime(Celery("reuse-close"))
    expired = _held(source, "a", keep_for=0)
    assert not runtime.keep_lease("a", expired)
    expired.release()
    held = _held(source, "b", keep_for=30)
    assert runtime.keep_lease("b", held)
    taken = runtime.take_lease("b")
    assert taken is held
    assert runtime.keep_lease("b", held)
    runtime.close()
    with source.lease("b", timeout=2) as successor:
        assert successor.token.value > held.lease.token.value


def test_lease_reuse_must_stay_below_the_timeout() -> None:
    """fencing_lease_reuse at or above fencing_timeout is refused: a waiting process would time out first."""
    with pytest.raises(FencingConfigurationError, match="fencing_lease_reuse"):
        read_settings({"fencing_timeout": 2, "fencing_lease_reuse": 2})
    assert read_settings({"fencing_timeout": 2, "fencing_lease_reuse": 1.5}).lease_reuse == 1.5
