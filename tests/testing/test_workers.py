"""The kit with real processes: pause points across a real worker, freezing it, re-delivery on RabbitMQ, ZooKeeper."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis
from celery import Celery
from kombu import Connection

from celery_fencing import token_source_from_url
from celery_fencing.testing import (
    FencedWorkers,
    FencingEvents,
    PausePoints,
    ZooKeeperEnsemble,
    ZooKeeperServer,
    assert_applied_once,
    assert_fenced_out,
    fencing_flags,
)
from celery_fencing.testing.processes import process_state

APP = "tests.testing.app_under_test"


@pytest.fixture
def producer(kit_env: dict[str, str]) -> Iterator[Celery]:
    """The test's side: sends kit.write by name to this test's queue."""
    app = Celery("kit-producer", broker=kit_env.get("KIT_BROKER") or kit_env["KIT_REDIS_URL"], set_as_current=False)
    app.conf.task_default_queue = kit_env["KIT_QUEUE"]
    yield app
    app.close()


def _item(kit_env: dict[str, str], item: str) -> str | None:
    client = redis.Redis.from_url(kit_env["KIT_REDIS_URL"], decode_responses=True)
    try:
        return client.get(f"{kit_env['KIT_QUEUE']}:item:{item}")
    finally:
        client.close()


def test_a_held_execution_waits_in_the_worker_until_released(
    kit_env: dict[str, str],
    producer: Celery,
    fencing_zookeeper: ZooKeeperServer,
    fencing_workers: FencedWorkers,
    fencing_pause_points: PausePoints,
    fencing_events: FencingEvents,
) -> None:
    """A held execution stays at its point while another execution of the same worker runs to its end; released,
    it goes on; its arrival names the worker process, the task and its token; freeze stops the whole worker."""
    worker = fencing_workers.start(
        APP, source=fencing_zookeeper.url(f"/{kit_env['KIT_QUEUE']}"), pool="threads", concurrency=2
    )
    fencing_pause_points.hold("before-write")
    held = producer.send_task("kit.write", args=("a", "1"))
    arrival = fencing_pause_points.wait("before-write")
    passing = producer.send_task("kit.write", args=("b", "2"))
    fencing_events.wait_ended(passing.id)

    assert arrival.held and not fencing_pause_points.arrivals("before-write")[1].held
    assert fencing_events.ended(held.id) == [] and _item(kit_env, "a") is None, "the held execution went on"
    minted = fencing_events.of("minted", task_id=held.id)[0]
    assert (arrival.pid, arrival.task_id, arrival.token, arrival.resource) == (
        worker.pid,
        held.id,
        minted.token,
        "item:a",
    )
    arrival.release()
    fencing_events.wait_ended(held.id)
    assert _item(kit_env, "a") == "1"
    assert_applied_once(fencing_events, held.id)

    worker.freeze()
    assert {process_state(worker.pid)} <= {"T", "t"}
    worker.thaw()
    assert process_state(worker.pid) not in ("T", "t", "")


@pytest.fixture
def rabbit_env(kit_env: dict[str, str], rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """This test's queue on RabbitMQ, for the producer and the workers (deleted after)."""
    kit_env["KIT_BROKER"] = rabbitmq_url
    monkeypatch.setenv("KIT_BROKER", rabbitmq_url)
    yield kit_env
    with Connection(rabbitmq_url, connect_timeout=5) as broker:
        broker.default_channel.queue_delete(kit_env["KIT_QUEUE"])


def test_a_connection_cut_at_the_proxy_redelivers_on_rabbitmq(
    rabbit_env: dict[str, str],
    producer: Celery,
    fencing_sqlite_source: str,
    fencing_tcp_proxy: object,
    fencing_workers: FencedWorkers,
    fencing_pause_points: PausePoints,
    fencing_events: FencingEvents,
) -> None:
    """w1, held at its point, consumes through the proxy; the cut makes RabbitMQ re-deliver to w2, and
    released, w1's stale write is refused: applied once."""
    url = rabbit_env["KIT_BROKER"]
    parts = urlsplit(url)
    proxy = fencing_tcp_proxy(parts.hostname, parts.port or 5672)  # type: ignore[operator]
    fencing_pause_points.hold("before-write")
    w1 = fencing_workers.start(APP, source=fencing_sqlite_source, settings={"broker_url": proxy.proxied(url)})
    task = producer.send_task("kit.write", args=("r", "1"))
    first = fencing_pause_points.wait("before-write")
    assert proxy.cut() >= 1, "w1 had no connection through the proxy"
    w2 = fencing_workers.start(APP, source=fencing_sqlite_source)
    copy = fencing_pause_points.wait("before-write", 2)
    assert (copy.pid, copy.task_id) == (w2.pid, task.id)
    fencing_events.wait_ended(task.id, pid=w2.pid)
    first.release()
    fencing_events.wait_ended(task.id, 2)
    assert_fenced_out(fencing_events, task.id, pid=w1.pid, token=first.token)
    assert_applied_once(fencing_events, task.id)
    for worker in (w1, w2):
        worker.kill()  # their work is done; a warm shutdown on AMQP idles for seconds


def test_the_ensemble_serves_with_one_leader_and_mints_through_its_url(
    fencing_zookeeper_ensemble: ZooKeeperEnsemble, unique_name: str
) -> None:
    """Every node serves, one leads, and a source on the ensemble's URL mints increasing tokens."""
    assert sorted(node.mode() or "" for node in fencing_zookeeper_ensemble.nodes) == ["follower", "follower", "leader"]
    source = token_source_from_url(fencing_zookeeper_ensemble.url(f"/{unique_name}"))
    try:
        first, second = source.mint("r"), source.mint("r")
    finally:
        source.close()  # type: ignore[attr-defined]
    assert second.value > first.value


def test_fencing_flags_are_the_settings_worker_flags_and_unknown_names_are_refused() -> None:
    """Names with or without the prefix become --fencing-* flags; on/off settings become bare flags."""
    flags = fencing_flags({"source": "sqlite:///t.db", "fencing_timeout": 2, "abort_on_session_loss": True})
    assert flags == ["--fencing-source", "sqlite:///t.db", "--fencing-timeout", "2", "--fencing-abort-on-session-loss"]
    assert fencing_flags({"abort_on_session_loss": False}) == []
    with pytest.raises(ValueError, match="'sauce' is not a fencing setting"):
        fencing_flags({"sauce": 1})
    with pytest.raises(ValueError, match="on/off flag"):
        fencing_flags({"abort_on_session_loss": "yes"})
