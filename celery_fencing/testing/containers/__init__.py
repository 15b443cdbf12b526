"""Fenced Celery workers in real containers, with pytest-celery: whole hosts paused and partitioned.

A :class:`ContainerLab` owns one test's Docker networks and containers: a
ZooKeeper server or ensemble (the vendor pytest-celery lacks), Redis and RabbitMQ
with addresses that are the containers' own (never ``localhost``), and fenced
worker containers running the user's app with ``install(app)`` applied.
:class:`ContainerFaults` pauses a worker container (``docker pause``: the whole
host frozen) or cuts it off ZooKeeper or the broker, and heals it.

Load the fixtures with ``pytest_plugins = ["celery_fencing.testing.containers.fixtures"]``;
docs/testing.md ("In containers, with pytest-celery") names the pytest-celery
fixtures to override. Needs ``pytest-celery`` and a running Docker engine.
"""

from __future__ import annotations

from .brokers import IsolatedRabbitMQContainer, IsolatedRedisContainer
from .faults import ContainerFaults
from .lab import ContainerLab, SharedServiceError, assert_isolated_url
from .worker import FencedWorkerContainer
from .zookeeper import ZooKeeperContainer, ZooKeeperEnsemble, ZooKeeperNode

__all__ = [
    "ContainerFaults",
    "ContainerLab",
    "FencedWorkerContainer",
    "IsolatedRabbitMQContainer",
    "IsolatedRedisContainer",
    "SharedServiceError",
    "ZooKeeperContainer",
    "ZooKeeperEnsemble",
    "ZooKeeperNode",
    "assert_isolated_url",
]
