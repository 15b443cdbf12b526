"""pytest-celery, in containers: a deposit re-delivered while the whole worker host that started it is frozen.

pytest-celery runs the setup (two worker containers, a Redis container as
broker, backend and data); celery-fencing's container kit makes the workers
fenced (ZooKeeper in a container as their token source) and shares the test's
pause points and events with them. Host A reads 100 and is held at its pause
point; then the whole host is frozen (``docker pause``: the task, its ZooKeeper
session and its broker connection stop at once, as in a VM freeze). Past the
Redis visibility timeout the broker re-delivers the deposit to host B (110),
another deposit follows (115), and A is thawed and released. Fenced, A's
write is refused and the deposit is applied once: 115. Unfenced
(``EXAMPLE_FENCING=off``), A writes 110 over the 115.

Run: ``pytest examples/testing/test_pytest_celery.py`` (pytest-celery, and a
Docker engine with the kit's images: ``scripts/containers.sh up``).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
import redis
from celery import Celery
from pytest_celery import (
    CeleryBackendCluster,
    CeleryBrokerCluster,
    CeleryTestSetup,
    CeleryTestWorker,
    CeleryWorkerCluster,
    RedisTestBackend,
    RedisTestBroker,
)

from celery_fencing.testing import PausePoints, assert_applied_once, assert_fenced_out, redis_redelivery_settings
from celery_fencing.testing.containers import (
    ContainerFaults,
    FencedWorkerContainer,
    IsolatedRedisContainer,
)
from celery_fencing.testing.events import FencingEvents

from . import app as bank
from .containers import tasks

pytest_plugins = ["celery_fencing.testing.containers.fixtures"]


@pytest.fixture
def default_worker_container_cls() -> type[FencedWorkerContainer]:
    return FencedWorkerContainer  # the kit's worker image and app template (install(app))


@pytest.fixture
def default_worker_tasks() -> set[Any]:
    return {bank, tasks}  # copied into each worker's /app


@pytest.fixture
def default_worker_app(default_worker_app: Celery) -> Celery:
    # The workers' settings (and the test's client app's): re-delivery 3 s after a host stops acknowledging.
    default_worker_app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        fencing_retry_countdown=0.05,
        **redis_redelivery_settings(visibility_timeout=3),
    )
    return default_worker_app


@pytest.fixture
def default_worker_env(default_worker_env: dict[str, str], fencing_redis_container: IsolatedRedisContainer) -> Any:
    switches = {name: os.environ[name] for name in ("EXAMPLE_FENCING", "EXAMPLE_NAMESPACE") if name in os.environ}
    return {**default_worker_env, "EXAMPLE_REDIS_URL": fencing_redis_container.url, **switches}


@pytest.fixture
def default_worker_container(fencing_worker_containers: list[FencedWorkerContainer]) -> FencedWorkerContainer:
    return fencing_worker_containers[0]  # host A; host B joins the cluster below


@pytest.fixture
def celery_worker_cluster(
    celery_worker: CeleryTestWorker, fencing_worker_containers: list[FencedWorkerContainer], default_worker_app: Celery
) -> CeleryWorkerCluster:
    return CeleryWorkerCluster(celery_worker, CeleryTestWorker(fencing_worker_containers[1], app=default_worker_app))


@pytest.fixture
def celery_broker_cluster(fencing_redis_container: IsolatedRedisContainer) -> CeleryBrokerCluster:
    return CeleryBrokerCluster(RedisTestBroker(fencing_redis_container))  # never pytest-celery's localhost:6379


@pytest.fixture
def celery_backend_cluster(fencing_redis_container: IsolatedRedisContainer) -> CeleryBackendCluster:
    return CeleryBackendCluster(RedisTestBackend(fencing_redis_container))


def test_a_frozen_host_is_fenced_out_and_the_deposit_applied_once(
    celery_setup: CeleryTestSetup,
    fencing_redis_container: IsolatedRedisContainer,
    fencing_container_faults: ContainerFaults,
    fencing_pause_points: PausePoints,
    fencing_events: FencingEvents,
) -> None:
    """A's stale write is refused after B ran the re-delivered deposit and a later one: 100 + 10 + 5."""
    data = redis.Redis.from_url(fencing_redis_container.host_url, decode_responses=True)
    account = uuid.uuid4().int % 10**9
    data.set(bank.balance_key(account), 100)
    fencing_pause_points.hold("after-read")
    task = celery_setup.app.send_task("bank.deposit", args=[account, 10])
    frozen = fencing_pause_points.wait("after-read")  # a host read 100
    host_a = next(worker for worker in celery_setup.worker_cluster if task.id in worker.logs())
    fencing_container_faults.pause(host_a.container)  # the whole host frozen
    copy = fencing_pause_points.wait("after-read", 2)  # the broker re-delivered it to host B
    assert copy.task_id == task.id
    fencing_events.wait_ended(task.id)  # 100 -> 110 on B
    later = celery_setup.app.send_task("bank.deposit", args=[account, 5])
    fencing_events.wait_ended(later.id)  # 110 -> 115 on B (A is still frozen)
    fencing_container_faults.unpause(host_a.container)
    frozen.release()
    fencing_events.wait_ended(task.id, 2)  # A's execution ended too

    assert int(data.get(bank.balance_key(account))) == 115
    assert_fenced_out(fencing_events, task.id, token=frozen.token)
    assert_applied_once(fencing_events, task.id)
