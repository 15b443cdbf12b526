"""pytest fixtures of the container kit: ``pytest_plugins = ["celery_fencing.testing.containers.fixtures"]``.

Every fixture is function-scoped and named ``fencing_container_*`` or
``fencing_*_container(s)``, so none clashes with pytest-celery's, Celery's or
the in-process kit's. When Docker is not reachable the fixtures fail the test
(they never skip it): a suite that silently skips its container tests proves
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .brokers import IsolatedRabbitMQContainer, IsolatedRedisContainer, start_rabbitmq, start_redis
from .faults import ContainerFaults
from .lab import ContainerLab
from .worker import FencedWorkerContainer, start_worker
from .zookeeper import ZooKeeperEnsemble, start_zookeeper


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
def fencing_worker_container(
    fencing_container_lab: ContainerLab,
    fencing_zookeeper_containers: ZooKeeperEnsemble,
    default_worker_initial_content: dict[str, Any],
    default_worker_env: dict[str, str],
) -> FencedWorkerContainer:
    """pytest-celery's worker, fenced: return it from your ``default_worker_container`` override.

    Runs pytest-celery's generated ``/app`` (your ``default_worker_tasks``, the
    app's configuration) with ``install(app)`` applied and the token source set
    to :func:`fencing_zookeeper_containers`.
    """
    env = dict(default_worker_env)
    env["CELERY_FENCING_SOURCE"] = fencing_zookeeper_containers.source_url()
    return start_worker(fencing_container_lab, role="worker", files=default_worker_initial_content, environment=env)
