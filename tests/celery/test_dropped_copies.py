"""Dropped copies: a refused copy of a task fenced on its own id must not drop the task, for the newer copy may die.

The timeline (Redis broker, ``acks_late``, a 4 s visibility timeout): worker A
reads and is frozen (SIGSTOP) at the task's pause point past the visibility
timeout; the broker re-delivers task T to worker B, which mints a newer token,
claims, reads and is held at the same point; B is SIGKILLed there (OOM, host
loss); A resumes, and its gated write is refused: a newer execution of T
holds the resource.

kombu's Redis transport gives every delivery of a message one delivery tag
(assigned at publish, kept when a message is restored) and keys its unacked
set by it, so A's acknowledgement removes B's entry too: B's death brings
nothing back. With the default policy for a task fenced on its id (``defer``),
A publishes a retry of T (a new message with its own tag) before it acks; the
retry mints a fresh token, finds B gone and applies T. The negative control is
the same task with ``fencing_on_stale="ignore"`` (the rule before ``defer``):
T is lost, with no effect, no result and no message left in the queue or the
unacked set once the broker's sweep has run past the visibility timeout.

How the test knows that sweep ran: a canary task, held by B's second pool
process when B dies, is re-delivered by it (its unacked entry, younger than
T's, survives); T's entry, had it survived, would have come back with it.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery import states

from celery_fencing.testing.pause import Arrival, PausePoints
from tests.rabbitmq.proxy import TcpProxy

from .conftest import Scenario
from .test_rabbitmq_redelivery import rabbit  # noqa: F401  (fixture)
from .workers import WorkerProcess, wait_for

VISIBILITY_TIMEOUT = 4


@pytest.fixture
def points(tmp_path: Path) -> Iterator[PausePoints]:
    pauses = PausePoints(tmp_path / "pauses")
    yield pauses
    pauses.close()


@dataclass
class Dropped:
    task_id: str
    canary_id: str
    a: WorkerProcess
    first: Arrival  # A's copy of T
    second: Arrival  # B's copy of T, which dies


def _kill(worker: WorkerProcess) -> None:
    """SIGKILL the worker's whole process group (parent and pool): nothing runs its shutdown."""
    assert worker.proc is not None
    os.killpg(worker.pid, signal.SIGKILL)
    worker.proc.wait(10)


def newer_copy_dies(scenario: Scenario, points: PausePoints, task: str) -> Dropped:
    """Run the timeline above for *task* (``count_once`` or ``count_once_ignore``), until A has ended its copy."""
    scenario.env.update(points.env)
    scenario.env["FT_VISIBILITY_TIMEOUT"] = str(VISIBILITY_TIMEOUT)
    # The transport's unacked set of this test's own, so the test can assert on it (and no other test's
    # worker sweeps it with a shorter visibility timeout).
    unacked = {f"unacked{suffix}_key": scenario.key(f"unacked{suffix}") for suffix in ("", "_index", "_mutex")}
    scenario.env["FT_CONF"] = json.dumps({"broker_transport_options": unacked})
    points.hold("count", times=3)  # A's copy of T, B's copy of T, and the canary in B
    a = scenario.worker("a")
    result = scenario.send(task, "t")
    first = points.wait("count", 1)
    a.pause()
    b = scenario.worker("b", pool="prefork", concurrency=2)
    second = points.wait("count", 2, timeout=60)  # the visibility timeout re-delivered T to B, which claimed
    assert second.task_id == result.id and second.pid != first.pid
    assert second.token is not None and first.token is not None and second.token > first.token
    canary = scenario.send(task, "canary")
    assert points.wait("count", 3).task_id == canary.id
    _kill(b)
    a.resume()
    first.release()
    wait_for(lambda: f"[{result.id}] ignored" in a.log(), 60, "A to end its refused copy")
    return Dropped(result.id, canary.id, a, first, second)


def _count(scenario: Scenario, name: str) -> int:
    return int(scenario.redis.get(scenario.key("count", name)) or 0)


def _messages_of(scenario: Scenario, task_id: str) -> list[str]:
    """The broker's messages of *task_id*: in the queue (each priority's list) or in the unacked set."""
    found = []
    for name in scenario.redis.scan_iter(f"{scenario.name}*"):
        if scenario.redis.type(name) == "list":
            found += [m for m in scenario.redis.lrange(name, 0, -1) if task_id in m]
    found += [m for m in scenario.redis.hvals(scenario.key("unacked")) if task_id in m]
    return found


def _arrivals_of(points: PausePoints, task_id: str) -> list[Arrival]:
    return [arrival for arrival in points.arrivals("count") if arrival.task_id == task_id]


def _wait_for_the_canary(scenario: Scenario, run: Dropped) -> None:
    """Wait until the broker re-delivered the canary (its sweep past the visibility timeout ran) and A ran it."""
    canary = scenario.client.AsyncResult(run.canary_id)
    assert canary.get(timeout=60) == 1
    assert _count(scenario, "canary") == 1


@pytest.mark.slow
def test_refused_copy_defers_and_the_task_is_applied_once(scenario: Scenario, points: PausePoints) -> None:
    """The default (defer): A publishes a retry and acks; the retry finds B dead, applies T once, stores SUCCESS."""
    run = newer_copy_dies(scenario, points, "count_once")
    assert f"fenced out at body on '{run.task_id}'" in run.a.log()
    assert f"-> defer in {VISIBILITY_TIMEOUT / 2:.2f}s" in run.a.log()
    result = scenario.client.AsyncResult(run.task_id)
    assert result.get(timeout=60) == 1
    assert result.state == states.SUCCESS
    assert _count(scenario, "t") == 1
    copies = _arrivals_of(points, run.task_id)
    assert len(copies) == 3, copies
    retry = copies[2]
    assert retry.retries == 1 and retry.token is not None and run.second.token is not None
    assert retry.token > run.second.token, "the retry mints a fresh token, above the dead copy's"
    _wait_for_the_canary(scenario, run)
    assert _count(scenario, "t") == 1 and len(_arrivals_of(points, run.task_id)) == 3
    assert _messages_of(scenario, run.task_id) == [], "the task is done: no message of it is left"


@pytest.mark.slow
def test_ignored_refused_copy_loses_the_task_when_the_newer_copy_dies(scenario: Scenario, points: PausePoints) -> None:
    """Negative control: with ``ignore`` A's ack also removes B's unacked entry; B dies; T is never applied."""
    run = newer_copy_dies(scenario, points, "count_once_ignore")
    assert f"fenced out at body on '{run.task_id}'" in run.a.log() and "-> ignore" in run.a.log()
    _wait_for_the_canary(scenario, run)
    assert _count(scenario, "t") == 0
    assert len(_arrivals_of(points, run.task_id)) == 2, "nothing ran T again"
    assert _messages_of(scenario, run.task_id) == [], "no message of T is left in the queue or the unacked set"
    assert scenario.client.AsyncResult(run.task_id).state == states.PENDING


@pytest.mark.slow
def test_on_rabbitmq_the_newer_copy_of_an_ignored_one_is_redelivered_when_it_dies(
    rabbit: tuple[Scenario, TcpProxy, str],  # noqa: F811
    points: PausePoints,
) -> None:
    """RabbitMQ keeps the newer copy's delivery: there the loss needs the shared tag of Redis.

    The re-delivery comes from A's cut connection, so A's ack goes to a dead
    channel and acknowledges nothing; B's own delivery stays unacked, and
    RabbitMQ re-delivers it when B's connection dies with B. Even ``ignore``
    loses nothing here; ``defer`` is for the brokers that share the tag.
    """
    scenario, proxy, broker_url = rabbit
    scenario.env.update(points.env)
    scenario.env["FT_BROKER"] = proxy.url()
    points.hold("count", times=2)
    a = scenario.worker("a")
    scenario.env["FT_BROKER"] = broker_url  # the client and B talk to RabbitMQ directly
    result = scenario.send("count_once_ignore", "t")
    first = points.wait("count", 1)
    a.pause()
    assert proxy.cut() >= 1, "A had no connection through the proxy"
    b = scenario.worker("b")
    second = points.wait("count", 2, timeout=60)
    assert second.token is not None and first.token is not None and second.token > first.token
    _kill(b)
    a.resume()
    first.release()
    assert result.get(timeout=90) == 1
    assert f"fenced out at body on '{result.id}'" in a.log() and "-> ignore" in a.log()
    assert _count(scenario, "t") == 1
    third = _arrivals_of(points, result.id)[2]
    assert third.retries == 0, "the copy that applied is B's delivery, re-delivered: not a retry"
