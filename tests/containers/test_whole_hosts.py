"""The seed's timeline with whole hosts: a worker container frozen with ``docker pause`` past its
ZooKeeper session and the broker's re-delivery, the task re-delivered to the other host, the frozen
one thawed. Fenced, its write is refused and the effect applied once; the control (plain writes)
shows the stale host overwriting the newer write. Then the same on RabbitMQ."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from celery_fencing.testing import redis_redelivery_settings

from .conftest import WholeHosts

# kombu hands an unacknowledged message to another worker after the visibility timeout.
REDIS_REDELIVERY = redis_redelivery_settings(visibility_timeout=3)
# RabbitMQ re-queues a consumer's unacknowledged messages when it closes the connection:
# with 2 s heartbeats it does so a few seconds after the host froze.
RABBITMQ_REDELIVERY = {"broker_heartbeat": 2}


@dataclass
class Timeline:
    task_id: str
    stale: list[str]  # the frozen execution's start event: start <task id> <token> <host>
    newer: list[str]


def freeze_redeliver_thaw(hosts: WholeHosts, *, fenced: bool) -> Timeline:
    """The first host to start the task is frozen; the other takes the re-delivery and writes; the first thaws."""
    result = hosts.app.send_task("tests.containers.tasks.write_record", args=["r1"], kwargs={"fenced": fenced})
    stale = hosts.wait(lambda: hosts.events("start", result.id), "a host to start the task")[0]
    frozen = hosts.worker_named(stale[3])
    hosts.faults.pause(frozen)
    # Frozen past the ZooKeeper session (2 s) and the broker's re-delivery: the other host starts it.
    starts = hosts.wait(lambda: [e for e in hosts.events("start", result.id) if e[3] != stale[3]], "the re-delivery")
    newer = starts[0]
    hosts.release(result.id, newer[2])
    hosts.wait(lambda: hosts.events("wrote", result.id), "the newer execution's write")
    hosts.release(result.id, stale[2])
    hosts.faults.unpause(frozen)
    hosts.wait(
        lambda: [e for e in hosts.events("wrote", result.id) + hosts.events("refused", result.id) if e[2] == stale[2]],
        "the thawed execution to write or be refused",
    )
    return Timeline(result.id, stale, newer)


def _run(whole_hosts: Any, broker: str, members: int, fenced: bool) -> tuple[WholeHosts, Timeline]:
    settings = RABBITMQ_REDELIVERY if broker == "rabbitmq" else REDIS_REDELIVERY
    hosts = whole_hosts(broker=broker, zookeeper_members=members, settings=settings)
    return hosts, freeze_redeliver_thaw(hosts, fenced=fenced)


@pytest.mark.parametrize(("broker", "members"), [("redis", 1), ("redis", 3), ("rabbitmq", 1)])
def test_frozen_host_is_fenced_out_after_redelivery(whole_hosts: Any, broker: str, members: int) -> None:
    """Thawed after the re-delivery, the frozen host's write is refused; the newer host's write stands, once."""
    hosts, run = _run(whole_hosts, broker, members, fenced=True)
    assert int(run.newer[2]) > int(run.stale[2])
    assert run.newer[3] != run.stale[3]
    assert hosts.record("r1") == f"{run.newer[3]}@{run.newer[2]}"
    assert [e[2] for e in hosts.events("wrote", run.task_id)] == [run.newer[2]]  # applied once
    assert [e[2] for e in hosts.events("refused", run.task_id)] == [run.stale[2]]


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_without_fencing_the_frozen_host_overwrites(whole_hosts: Any, broker: str) -> None:
    """Negative control: with plain writes the thawed host overwrites the newer write (applied twice)."""
    hosts, run = _run(whole_hosts, broker, 1, fenced=False)
    assert hosts.record("r1") == f"{run.stale[3]}@{run.stale[2]}"
    assert sorted(e[2] for e in hosts.events("wrote", run.task_id)) == sorted([run.newer[2], run.stale[2]])
