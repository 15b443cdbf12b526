"""The on-stale policies on RabbitMQ with a prefork worker: a retry is re-published, a reject leaves no message."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kombu import Connection

from .conftest import Scenario
from .test_policies import _attempts, check_the_retry_lands_with_a_newer_token
from .workers import wait_for


@pytest.fixture(scope="module")
def rabbit_worker(
    redis_url: str, rabbitmq_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Scenario, str]]:
    """One prefork worker consuming from RabbitMQ, shared by this module's tests."""
    world = Scenario("t" + uuid.uuid4().hex[:12], redis_url, tmp_path_factory.mktemp("rabbitmq"), broker=rabbitmq_url)
    try:
        world.worker("w", pool="prefork", concurrency=2)
        yield world, rabbitmq_url
    finally:
        world.close()
        with Connection(rabbitmq_url, connect_timeout=5) as broker:
            broker.default_channel.queue_delete(world.name)


def test_retry_is_republished_through_rabbitmq(rabbit_worker: tuple[Scenario, str]) -> None:
    """'retry': the fenced-out attempt goes back through RabbitMQ; the retry's larger token lands the write."""
    world, _ = rabbit_worker
    check_the_retry_lands_with_a_newer_token(world)


def test_reject_leaves_nothing_in_the_rabbitmq_queue(rabbit_worker: tuple[Scenario, str]) -> None:
    """'reject': basic.reject without requeue; the queue holds no message and the task never runs again."""
    world, broker_url = rabbit_worker
    name = uuid.uuid4().hex[:8]
    result = world.send("policy_reject", name)
    worker = world.workers[0]
    wait_for(lambda: f"[{result.id}] rejected" in worker.log() or "-> reject" in worker.log(), 60, "the rejection")
    follow_up = world.send("whoami", name)  # the queue is FIFO: once this ran, a requeued copy would have too
    follow_up.get(timeout=60)
    with Connection(broker_url, connect_timeout=5) as broker:
        _, messages, _ = broker.default_channel.queue_declare(world.name, passive=True)
    assert messages == 0
    assert len(_attempts(world, result.id)) == 1
