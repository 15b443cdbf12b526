"""The container suite's scenario: fenced worker containers, ZooKeeper, and Redis or RabbitMQ, all on the kit's lab.

Docker must be running (scripts/test starts it): without it these tests fail, never skip.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from celery import Celery

from celery_fencing.testing.containers import ContainerFaults, ContainerLab
from celery_fencing.testing.containers.brokers import start_rabbitmq, start_redis
from celery_fencing.testing.containers.fixtures import (  # noqa: F401 - fixtures used by the tests
    fencing_container_faults,
    fencing_container_lab,
)
from celery_fencing.testing.containers.worker import FencedWorkerContainer, start_workers, worker_files
from celery_fencing.testing.containers.zookeeper import start_zookeeper
from celery_fencing.testing.processes import wait_for

from . import tasks


@dataclass
class WholeHosts:
    """Two fenced worker hosts, ZooKeeper and a broker, each a container; the test talks to them by address."""

    lab: ContainerLab
    faults: ContainerFaults
    redis: redis.Redis
    app: Celery
    workers: list[FencedWorkerContainer] = field(default_factory=list)

    def events(self, kind: str, task_id: str) -> list[list[str]]:
        lines = (line.split() for line in self.redis.lrange("scenario:events", 0, -1))
        return [e for e in lines if e[0] == kind and e[1] == task_id]

    def release(self, task_id: str, token: str) -> None:
        self.redis.set(f"scenario:release:{task_id}:{token}", 1)

    def worker_named(self, host: str) -> FencedWorkerContainer:
        return next(w for w in self.workers if w.name == host)

    def wait(self, condition: Any, what: str, timeout: float = 60) -> Any:
        """Poll *condition*; on timeout, fail with every worker's log tail (what the hosts were doing)."""
        try:
            return wait_for(condition, timeout, what, interval=0.05)
        except AssertionError as exc:
            logs = "\n".join(f"--- {w.name}\n{w.logs()[-2500:]}" for w in self.workers)
            raise AssertionError(f"{exc}\n{logs}") from None

    def record(self, name: str) -> str | None:
        return self.redis.get(f"scenario:record:{name}")  # type: ignore[return-value]


def build_hosts(
    lab: ContainerLab, faults: ContainerFaults, *, broker: str, zookeeper_members: int = 1, settings: dict[str, Any]
) -> WholeHosts:
    """Start ZooKeeper, Redis (data, gate, results) and *broker* ("redis" or "rabbitmq"), then two workers."""
    zookeeper = start_zookeeper(lab, members=zookeeper_members)
    data = start_redis(lab)
    if broker == "rabbitmq":
        amqp = start_rabbitmq(lab)
        broker_url, broker_host_url = amqp.url, amqp.host_url
    else:
        broker_url, broker_host_url = f"{data.url[:-2]}/1", f"{data.host_url[:-2]}/1"
    settings = {"worker_prefetch_multiplier": 1, "task_acks_late": True, **settings}
    env = {
        "CELERY_BROKER_URL": broker_url,
        "CELERY_RESULT_BACKEND": f"{data.url[:-2]}/2",
        "CELERY_FENCING_SOURCE": zookeeper.source_url(session_timeout=2),
        "CELERY_SETTINGS": json.dumps(settings),
        "SCENARIO_REDIS_URL": data.url,
    }
    workers = start_workers(lab, roles=["host-a", "host-b"], files=worker_files({tasks}), environment=env)
    app = Celery(
        "scenario-client", broker=lab.check_url(broker_host_url), backend=lab.check_url(f"{data.host_url[:-2]}/2")
    )
    app.conf.update(settings)
    client = redis.Redis.from_url(lab.check_url(data.host_url), decode_responses=True)
    return WholeHosts(lab, faults, client, app, workers)


@pytest.fixture
def whole_hosts(fencing_container_lab: ContainerLab, fencing_container_faults: ContainerFaults) -> Iterator[Any]:  # noqa: F811
    """A factory: ``whole_hosts(broker=..., zookeeper_members=..., settings=...)`` -> :class:`WholeHosts`."""
    built: list[WholeHosts] = []

    def build(**kwargs: Any) -> WholeHosts:
        hosts = build_hosts(fencing_container_lab, fencing_container_faults, **kwargs)
        built.append(hosts)
        return hosts

    yield build
    for hosts in built:
        hosts.app.close()
