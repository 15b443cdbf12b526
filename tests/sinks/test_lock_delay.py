"""Lock-delay in exclusive mode, on a real ZooKeeper: a failed holder's resource stays un-grantable for the delay.

Failures are made the way ZooKeeper sees them in production: the holder's
session expires (its lock node goes with it), or its lock node is deleted.
Delays are measured twice: on the local clock around the acquisition, and on
ZooKeeper's clock as the ``mtime`` of the holder record's writes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import ZnodeStat

from celery_fencing import FencingConfigurationError, TokenUnavailableError
from celery_fencing.sources.zookeeper import ZooKeeperLease, ZooKeeperTokenSource, resource_to_znode_name
from tests.fixtures.zookeeper import ZooKeeperServer, expire_session

from .waiting import wait_for


@dataclass
class FailedHolder:
    """A lease whose holder failed: its session expired and its lock node is gone."""

    lease: ZooKeeperLease
    manager: AbstractContextManager[ZooKeeperLease]
    client: KazooClient


def _record(admin: KazooClient, source: ZooKeeperTokenSource, resource: str) -> tuple[dict[str, str], ZnodeStat]:
    data, stat = admin.get(f"{source.root}/holders/{resource_to_znode_name(resource)}")
    return json.loads(data), stat


@pytest.fixture
def fail_holder(
    zookeeper_server: ZooKeeperServer, make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient
) -> Iterator[Callable[[str], FailedHolder]]:
    """Take a lease on a resource from a client of its own, then expire that client's session."""
    failed: list[FailedHolder] = []

    def fail(resource: str) -> FailedHolder:
        client = KazooClient(zookeeper_server.hosts, timeout=4.0)
        client.start(30)
        manager = make_source(client=client).lease(resource, timeout=10)
        holder = FailedHolder(manager.__enter__(), manager, client)
        failed.append(holder)
        expire_session(client, zookeeper_server.hosts)
        wait_for(lambda: admin.exists(holder.lease.lock_path) is None, 30, "the expired holder's lock node to go")
        return holder

    yield fail
    for holder in failed:
        holder.manager.__exit__(None, None, None)
        holder.client.stop()
        holder.client.close()


def test_clean_release_regrants_at_once(make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient) -> None:
    """A lease released cleanly is granted again at once, well inside a timeout far shorter than the delay."""
    first_source, second_source = make_source(lock_delay=60), make_source(lock_delay=60)
    with first_source.lease("sink:1") as first:
        assert _record(admin, first_source, "sink:1")[0]["state"] == "held"
    record, _ = _record(admin, first_source, "sink:1")
    assert record == {**record, "state": "released", "lock": first.lock_path.rsplit("/", 1)[1]}
    with second_source.lease("sink:1", timeout=5) as second:
        assert second.lock_delay_waited == 0.0
        assert second.token > first.token
        assert _record(admin, first_source, "sink:1")[0]["lock"] == second.lock_path.rsplit("/", 1)[1]


@pytest.mark.parametrize("delay", [3.0, 0.0], ids=["with-lock-delay", "negative-control-without"])
def test_failed_holder_leaves_the_resource_ungrantable_for_the_delay(
    delay: float,
    make_source: Callable[..., ZooKeeperTokenSource],
    admin: KazooClient,
    fail_holder: Callable[[str], FailedHolder],
) -> None:
    """After a holder's session expired, the next lease waits at least the delay (on both clocks); without one, none."""
    failed = fail_holder("sink:2")
    source = make_source(lock_delay=delay)
    asked = time.monotonic()
    # Without a delay, a timeout as long as the delay must be plenty: the grant is immediate.
    with source.lease("sink:2", timeout=delay + 30 if delay else 3.0) as lease:
        waited = time.monotonic() - asked
        record, _ = _record(admin, source, "sink:2")
    print(f"lock_delay={delay}: granted after {waited:.3f}s; ZooKeeper time waited {lease.lock_delay_waited:.3f}s")
    assert record["state"] == "held" and record["lock"] == lease.lock_path.rsplit("/", 1)[1]
    assert lease.token > failed.lease.token
    assert waited >= delay
    assert lease.lock_delay_waited >= delay
    if not delay:
        assert lease.lock_delay_waited == 0.0


def test_lock_delay_survives_a_restart_of_the_next_acquirer(
    make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient, fail_holder: Callable[[str], FailedHolder]
) -> None:
    """The countdown lives in ZooKeeper: a fresh source, after the first acquirer gave up, continues it."""
    delay = 4.0
    fail_holder("sink:3")
    impatient = make_source(lock_delay=delay)
    with pytest.raises(TokenUnavailableError, match="lock-delay"), impatient.lease("sink:3", timeout=1.0):
        pass
    record, failed_stat = _record(admin, impatient, "sink:3")
    assert record["state"] == "failed"
    impatient.close()  # the worker that would take the lease next restarts; nothing survives in memory

    restarted = make_source(lock_delay=delay)
    with restarted.lease("sink:3", timeout=30) as lease:
        record, held_stat = _record(admin, restarted, "sink:3")
    measured = (held_stat.mtime - failed_stat.mtime) / 1000
    print(f"failure recorded at {failed_stat.mtime} ms, granted at {held_stat.mtime} ms (ZooKeeper time): {measured}s")
    assert record["state"] == "held" and record["lock"] == lease.lock_path.rsplit("/", 1)[1]
    assert measured >= delay
    # One write between the recorded failure and the grant: the countdown was continued, not restarted.
    assert held_stat.version == failed_stat.version + 1


def test_a_holder_that_lost_its_lock_cannot_mark_it_released(
    make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient
) -> None:
    """A release after the lock node was deleted under the holder leaves 'held', so the next holder still waits."""
    holder = make_source()
    with holder.lease("sink:4") as lease:
        admin.delete(lease.lock_path)
        assert lease.wait_lost(10)
    record, _ = _record(admin, holder, "sink:4")
    assert record["state"] == "held" and record["lock"] == lease.lock_path.rsplit("/", 1)[1]
    with pytest.raises(TokenUnavailableError, match="lock-delay"), make_source(lock_delay=30).lease("sink:4"):
        pass


def test_an_unreadable_holder_record_counts_as_a_failure(
    make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient
) -> None:
    """A holder record that cannot be parsed is treated as an unreleased hold: when in doubt, delay."""
    source = make_source(lock_delay=30)
    admin.create(f"{source.root}/holders/{resource_to_znode_name('sink:5')}", b"\x00garbage", makepath=True)
    with pytest.raises(TokenUnavailableError, match="lock-delay"), source.lease("sink:5", timeout=2):
        pass


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "15", True])
def test_bad_lock_delays_are_refused(bad: object, make_source: Callable[..., ZooKeeperTokenSource]) -> None:
    """A negative, non-finite or non-numeric lock_delay is a configuration error, in the constructor and in lease()."""
    with pytest.raises(FencingConfigurationError, match="lock_delay"):
        make_source(lock_delay=bad)
    source = make_source()
    with pytest.raises(FencingConfigurationError, match="lock_delay"), source.lease("sink:6", lock_delay=bad):  # type: ignore[arg-type]
        pass
