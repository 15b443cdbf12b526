"""pytest fixtures of the container kit: ``pytest_plugins = ["celery_fencing.testing.containers.fixtures"]``.

Every fixture is function-scoped and named ``fencing_container_*`` or
``fencing_*_container(s)``, so none clashes with pytest-celery's, Celery's or
the in-process kit's. When Docker is not reachable the fixtures fail the test
(they never skip it): a suite that silently skips its container tests proves
nothing.

The worker fixtures share the test's ``fencing_pause_points`` and
``fencing_events`` (the in-process kit's fixtures, loaded with it below) with
the containers: a ``pause_point`` in a task body holds the execution inside
its container, and the library's signals there are recorded for the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ..events import FencingEvents
from ..pause import PausePoints
from .brokers import IsolatedRabbitMQContainer, IsolatedRedisContainer, start_rabbitmq, start_redis
from .faults import ContainerFaults
from .lab import ContainerLab
from .worker import FencedWorkerContainer, start_workers
from .zookeeper import ZooKeeperEnsemble, start_zookeeper

# fencing_pause_points and fencing_events (registered once, also when the entry point loaded it).
pytest_plugins = ["celery_fencing.testing"]


@pytest.fixture
def fencing_container_lab() -> Iterator[ContainerLab]:
    """This test's networks and containers, removed after it."""
    import docker  # type: ignore[import-untyped]

    try:
        lab = ContainerLab(docker.from_env())
    except docker.errors.DockerException as exc:
        pytest.fail(f"Docker is not reachable ({exc}); start dockerd (scripts/containers.sh up)", pytrace=False)
    yield lab
    lab.close()


@pytest.fixture
def fencing_container_faults(fencing_container_lab: ContainerLab) -> Iterator[ContainerFaults]:
    """Pause and partition containers; whatever is still in force is healed after the test."""
    faults = ContainerFaults(fencing_container_lab)
    yield faults
    faults.heal()


@pytest.fixture
def fencing_zookeeper_containers(fencing_container_lab: ContainerLab) -> ZooKeeperEnsemble:
    """A standalone ZooKeeper server in a container (an ensemble of one)."""
    return start_zookeeper(fencing_container_lab, members=1)


@pytest.fixture
def fencing_zookeeper_ensemble_containers(fencing_container_lab: ContainerLab) -> ZooKeeperEnsemble:
    """A three-member ZooKeeper ensemble, one container per member."""
    return start_zookeeper(fencing_container_lab, members=3)


@pytest.fixture
def fencing_redis_container(fencing_container_lab: ContainerLab) -> IsolatedRedisContainer:
    """Redis on the lab's data network: broker, result backend and gate store."""
    return start_redis(fencing_container_lab)


@pytest.fixture
def fencing_rabbitmq_container(fencing_container_lab: ContainerLab) -> IsolatedRabbitMQContainer:
    """RabbitMQ on the lab's data network."""
    return start_rabbitmq(fencing_container_lab)


@pytest.fixture
def fencing_worker_container_starter(
    fencing_container_lab: ContainerLab,
    fencing_zookeeper_containers: ZooKeeperEnsemble,
    default_worker_initial_content: dict[str, Any],
    default_worker_env: dict[str, str],
    fencing_pause_points: PausePoints,
    fencing_events: FencingEvents,
) -> Callable[[list[str]], list[FencedWorkerContainer]]:
    """``starter(roles)`` boots one of pytest-celery's workers per role, fenced, side by side.

    Each runs pytest-celery's generated ``/app`` (your ``default_worker_tasks``,
    the app's configuration, your ``default_worker_env``) with ``install(app)``
    applied, the token source set to :func:`fencing_zookeeper_containers`, and
    the test's pause points and events shared.
    """
    environment = {
        **default_worker_env,
        "CELERY_FENCING_SOURCE": fencing_zookeeper_containers.source_url(),
    }

    def start(roles: list[str]) -> list[FencedWorkerContainer]:
        return start_workers(
            fencing_container_lab,
            roles=roles,
            files=default_worker_initial_content,
            environment=environment,
            pause_points=fencing_pause_points,
            events=fencing_events,
        )

    return start


@pytest.fixture
def fencing_worker_container(
    fencing_worker_container_starter: Callable[[list[str]], list[FencedWorkerContainer]],
) -> FencedWorkerContainer:
    """pytest-celery's worker, fenced: return it from your ``default_worker_container`` override."""
    return fencing_worker_container_starter(["worker"])[0]


@pytest.fixture
def fencing_worker_containers(
    fencing_worker_container_starter: Callable[[list[str]], list[FencedWorkerContainer]],
) -> list[FencedWorkerContainer]:
    """Two such workers, booted side by side: one host to freeze or cut off, one to take the task over."""
    return fencing_worker_container_starter(["host-a", "host-b"])
