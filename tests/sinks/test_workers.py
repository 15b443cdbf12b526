"""Sinks that cannot check tokens, with real ``celery worker`` processes (tests/sinks/app_under_test.py).

* Lock-delay: a worker SIGKILLed while holding an exclusive lease leaves the
  resource un-grantable for the delay after its lock node vanished, measured
  on the local clock and on ZooKeeper's; a clean release re-grants at once.
* Idempotency keys: a task re-delivered while its first execution is paused
  calls the external API once; a claim without an outcome makes the task retry.
* Conditional HTTP writes: a stale ETag write gets 412 and the task's policy retries it.

Each safety test has its negative control (no lock-delay, no key, a blind PUT).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kombu import Connection

from celery_fencing.idempotency.redis import RedisIdempotencyStore
from celery_fencing.sources.zookeeper import resource_to_znode_name
from tests.celery.conftest import Scenario
from tests.celery.workers import WorkerProcess, wait_for
from tests.fixtures.zookeeper import ZooKeeperServer

from .fake_services import ExternalService

APP_MODULE = "tests.sinks.app_under_test"
LOCK_DELAY = 4.0


class World(Scenario):
    """One test's queue, key prefix, workers and client app, all on tests/sinks/app_under_test.py."""

    def __init__(self, name: str, redis_url: str, tmp_path: Path, *, broker: str, service: ExternalService) -> None:
        super().__init__(name, redis_url, tmp_path, broker=broker)
        self.env["FT_SERVICE"] = service.url
        self.app_module = self.task_module = APP_MODULE

    def workers_started(
        self, *names: str, pool: str = "solo", concurrency: int = 1, extra_args: tuple[str, ...] = ()
    ) -> list[WorkerProcess]:
        """Start workers side by side (a worker takes seconds to boot) and wait until all are ready."""
        started = [self.add_worker(name, pool=pool, concurrency=concurrency, extra_args=extra_args) for name in names]
        errors: list[BaseException] = []

        def boot(worker: WorkerProcess) -> None:
            try:
                worker.wait_ready()
            except BaseException as exc:
                errors.append(exc)

        # Launched from this (long-lived) thread: a worker dies with the thread that started it.
        for worker in started:
            worker.launch()
        threads = [threading.Thread(target=boot, args=(worker,)) for worker in started]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        if errors:
            raise errors[0]
        return started

    def close(self) -> None:
        # Side by side: an idle solo worker on RabbitMQ takes up to ~10 s to notice a warm shutdown.
        stoppers = [threading.Thread(target=worker.stop) for worker in self.workers]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(60)
        if self.env["FT_BROKER"].startswith("amqp"):
            with Connection(self.env["FT_BROKER"], connect_timeout=5) as conn:
                conn.default_channel.queue_delete(self.name)
        super().close()  # the workers are stopped: it closes the client and removes the test's keys


@pytest.fixture(scope="module")
def service() -> Iterator[ExternalService]:
    """The fake external service, shared by the module (tests use their own documents and customers)."""
    running = ExternalService().start()
    yield running
    running.close()


@pytest.fixture
def world_factory(redis_url: str, tmp_path: Path, unique_name: str, service: ExternalService) -> Iterator[Any]:
    made: list[World] = []

    def make(broker: str | None = None) -> World:
        world = World(unique_name, redis_url, tmp_path, broker=broker or redis_url, service=service)
        made.append(world)
        return world

    yield make
    for world in made:
        world.close()


@pytest.fixture(scope="module")
def shared_world(redis_url: str, tmp_path_factory: pytest.TempPathFactory, service: ExternalService) -> Iterator[World]:
    """One threads worker (2 threads) on the Redis broker for the tests that need no fault injection."""
    world = World(
        "t" + uuid.uuid4().hex[:12], redis_url, tmp_path_factory.mktemp("sinks"), broker=redis_url, service=service
    )
    world.workers_started("w", pool="threads", concurrency=2)
    yield world
    world.close()


# Lock-delay ----------------------------------------------------------------------------------


@dataclass
class KillRun:
    """What happened when the holder of an exclusive lease was SIGKILLed."""

    task_id: str
    holder_token: int
    successor: WorkerProcess
    successor_token: int
    #: Successor's entry minus the last moment the dead holder's lock node was seen (local wall clock).
    measured_local: float
    #: Successor's grant minus the recorded failure, both ZooKeeper mtimes; None if no failure was recorded.
    measured_server: float | None
    record_path: str


def kill_the_holder(world: World, zookeeper: ZooKeeperServer, admin: KazooClient, task: str, name: str) -> KillRun:
    """Two workers; the one that takes *task* is SIGKILLed; RabbitMQ re-delivers it to the other at once."""
    root = f"/fencing-{world.name}"
    world.env["FT_SOURCE"] = zookeeper.url(root, session_timeout=2, timeout=10)
    workers = world.workers_started("a", "b", extra_args=("--fencing-lock-delay", str(LOCK_DELAY)))
    result = world.send(task, name)
    entered = wait_for(lambda: world.events_of("enter", result.id), 60, "the first execution to enter")[0]  # type: ignore[index]
    holder = next(worker for worker in workers if str(worker.pid) == entered[3])
    successor = next(worker for worker in workers if worker is not holder)
    znode = resource_to_znode_name(f"sink:{name}")
    lock_dir, record_path = f"{root}/locks/{znode}", f"{root}/holders/{znode}"
    holder_lock = f"{lock_dir}/{admin.get_children(lock_dir)[0]}"

    os.killpg(holder.pid, signal.SIGKILL)
    assert holder.proc is not None
    holder.proc.wait(30)
    last_seen = time.time()
    failed_mtime: int | None = None
    deadline = time.monotonic() + 120
    while not (second := world.events_of("enter", result.id)[1:]):
        assert time.monotonic() < deadline, "the re-delivered task never entered"
        before = time.time()
        if admin.exists(holder_lock) is not None:
            last_seen = before  # the node existed after this instant: it vanished later
        data, stat = admin.get(record_path)
        if failed_mtime is None and json.loads(data)["state"] == "failed":
            failed_mtime = stat.mtime
        time.sleep(0.02)  # polling interval; the loop re-checks
    enter_time = float(second[0][4])
    held, held_stat = admin.get(record_path)
    assert json.loads(held)["state"] == "held"
    return KillRun(
        task_id=result.id,
        holder_token=int(entered[2]),
        successor=successor,
        successor_token=int(second[0][2]),
        measured_local=enter_time - last_seen,
        measured_server=None if failed_mtime is None else (held_stat.mtime - failed_mtime) / 1000,
        record_path=record_path,
    )


def test_killed_holder_leaves_the_resource_ungrantable_for_the_delay(
    world_factory: Any, zookeeper_server: ZooKeeperServer, admin: KazooClient, rabbitmq_url: str
) -> None:
    """After kill -9 of the holder, the re-delivered task enters no sooner than the delay after its lock node
    vanished (local and ZooKeeper clocks); after the successor's clean release the next task enters at once."""
    world = world_factory(rabbitmq_url)
    name = uuid.uuid4().hex[:6]
    run = kill_the_holder(world, zookeeper_server, admin, "exclusive_job", name)
    print(
        f"lock-delay {LOCK_DELAY}s: successor entered {run.measured_local:.3f}s after the dead holder's lock node "
        f"was last seen; ZooKeeper time from recorded failure to grant {run.measured_server}s"
    )
    assert run.successor_token > run.holder_token
    assert run.measured_server is not None and run.measured_server >= LOCK_DELAY
    assert run.measured_local >= LOCK_DELAY
    assert run.successor.log().count("failed without releasing") == 1

    # A clean release re-grants at once: no failure recorded, no delay waited.
    world.release(run.task_id, run.successor_token)
    wait_for(lambda: json.loads(admin.get(run.record_path)[0])["state"] == "released", 60, "the clean release")
    released_at = time.time()
    after = world.send("exclusive_job", name)
    entered = wait_for(lambda: world.events_of("enter", after.id), 60, "the next task to enter")[0]  # type: ignore[index]
    print(f"after a clean release the next task entered {float(entered[4]) - released_at:.3f}s later")
    assert int(entered[2]) > run.successor_token
    assert run.successor.log().count("failed without releasing") == 1, "a clean release counted as a failure"
    world.release(after.id, entered[2])
    assert after.get(timeout=60) == int(entered[2])


def test_without_lock_delay_the_resource_is_regranted_at_once(
    world_factory: Any, zookeeper_server: ZooKeeperServer, admin: KazooClient, rabbitmq_url: str
) -> None:
    """Negative control: the task option fencing_lock_delay=0 overrides the worker's flag; the re-delivered task
    enters as soon as the dead holder's session expires, with no failure recorded and nothing waited."""
    world = world_factory(rabbitmq_url)
    run = kill_the_holder(world, zookeeper_server, admin, "exclusive_job_without_delay", uuid.uuid4().hex[:6])
    print(f"no lock-delay: successor entered {run.measured_local:.3f}s after the dead holder's lock node was last seen")
    assert run.successor_token > run.holder_token
    assert run.measured_server is None
    assert "failed without releasing" not in run.successor.log()
    world.release(run.task_id, run.successor_token)


# Idempotency keys ----------------------------------------------------------------------------


def _redeliver_charge(world: World, once: bool) -> tuple[list[str], list[str]]:
    """w1 charges and is SIGSTOPped; the Redis visibility timeout re-delivers the task to w2; both finish."""
    world.env["FT_VISIBILITY_TIMEOUT"] = "2"
    (w1,) = world.workers_started("w1")
    result = world.send("charge_job", f"cust-{world.name}", 10, once)
    first = wait_for(lambda: world.events_of("charged", result.id), 60, "w1 to charge")[0]  # type: ignore[index]
    w1.pause()
    try:
        world.workers_started("w2")
        second = wait_for(lambda: world.events_of("charged", result.id)[1:], 60, "the re-delivery to w2")[0]  # type: ignore[index]
        world.release(result.id, second[2])
        assert result.get(timeout=60) == second[3]
    finally:
        w1.resume()
    world.release(result.id, first[2])
    # w2 finished first and sealed the task (exactly once): w1's result is not stored.
    wait_for(lambda: f"[{result.id}] succeeded" in w1.log(), 60, "w1 to finish")
    assert f"task {result.id} already applied by another execution: its SUCCESS result" in w1.log()
    return first, second


def test_a_redelivered_task_calls_the_external_api_once(world_factory: Any, service: ExternalService) -> None:
    """With an idempotency key, the re-delivered execution gets the first charge back and the service sees one call."""
    world = world_factory()
    before = service.charge_count()
    first, second = _redeliver_charge(world, once=True)
    assert first[4] != second[4], "both executions ran in the same process"
    assert first[3] == second[3]
    assert service.charge_count() - before == 1


def test_without_a_key_the_redelivered_task_charges_twice(world_factory: Any, service: ExternalService) -> None:
    """Negative control: the same schedule without an idempotency key charges the customer twice."""
    world = world_factory()
    before = service.charge_count()
    first, second = _redeliver_charge(world, once=False)
    assert first[3] != second[3]
    assert service.charge_count() - before == 2


def test_a_pending_claim_makes_the_task_retry_until_an_outcome_is_recorded(
    shared_world: World, service: ExternalService
) -> None:
    """A key claimed by an execution that recorded nothing: the task retries (EffectPendingError), never calls,
    and returns the outcome once it is recorded."""
    world = shared_world
    task_id = str(uuid.uuid4())
    store = RedisIdempotencyStore(world.redis, prefix=f"{world.name}:once")
    claim = store.claim(f"{task_id}:charge", retention=600, reclaim_after=None)
    before = service.charge_count()
    result = world.send("charge_job", "cust-pending", 5, task_id=task_id)
    retried = f"[{task_id}] fenced out at body"
    wait_for(lambda: world.workers[0].log().count(retried) >= 2, 60, "the task to retry on the pending claim")
    assert "is not recorded yet -> retry" in world.workers[0].log()
    assert store.record(claim, json.dumps({"id": "ch_recorded"}), retention=600)
    charged = wait_for(lambda: world.events_of("charged", task_id), 60, "the retry to find the outcome")[0]  # type: ignore[index]
    world.release(task_id, charged[2])
    assert result.get(timeout=60) == "ch_recorded"
    assert service.charge_count() == before


# Conditional HTTP writes ---------------------------------------------------------------------


def _race_on_document(world: World, service: ExternalService, conditional: bool) -> tuple[str, Any, Any]:
    """A reads the document and waits; B reads, writes and finishes; then A writes (If-Match, or blindly)."""
    name = f"acct-{uuid.uuid4().hex[:6]}"
    service.documents[name] = (1, {"total": 100})
    a = world.send("add_to_doc", name, 10, conditional)
    a_read = wait_for(lambda: world.events_of("read", a.id), 60, "A to read")[0]  # type: ignore[index]
    b = world.send("add_to_doc", name, 20, conditional)
    b_read = wait_for(lambda: world.events_of("read", b.id), 60, "B to read")[0]  # type: ignore[index]
    world.release(b.id, b_read[2])
    assert b.get(timeout=60) == 120
    world.release(a.id, a_read[2])
    return name, a, a_read


def test_a_stale_etag_write_gets_412_and_the_policy_retries_it(shared_world: World, service: ExternalService) -> None:
    """A's write with the ETag it read before B's write is refused (412); the retry re-reads and both amounts count."""
    name, a, a_read = _race_on_document(shared_world, service, conditional=True)
    retry = wait_for(
        lambda: [e for e in shared_world.events_of("read", a.id) if e[3] == "1"], 60, "A's retry to re-read"
    )[0]  # type: ignore[index]
    assert retry[4] == "120" and int(retry[2]) > int(a_read[2])
    shared_world.release(a.id, retry[2])
    assert a.get(timeout=60) == 130
    assert service.document(name) == {"total": 130}
    log = shared_world.workers[0].log()
    assert f"[{a.id}] fenced out at body on 'doc:{name}'" in log and "refused (412)" in log
    assert len([refusal for refusal in service.refused if refusal.startswith(name)]) == 1


def test_a_blind_write_loses_the_other_update(shared_world: World, service: ExternalService) -> None:
    """Negative control: the same race with a blind PUT: A overwrites B's write and 20 is lost."""
    name, a, _ = _race_on_document(shared_world, service, conditional=False)
    assert a.get(timeout=60) == 110
    assert service.document(name) == {"total": 110}
