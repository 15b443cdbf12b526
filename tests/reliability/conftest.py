"""One reliability world per module: throwaway Redis and PostgreSQL, proxies, fenced and control workers.

The world uses the session's 3-node ZooKeeper ensemble (tests.fixtures.zookeeper),
which its nemeses kill and pause; the next user of the ensemble fixture gets it
repaired (every node serving, one leader).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from reliability.world import World, WorldConfig


@pytest.fixture(scope="module")
def world(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, _fencing_zookeeper_ensemble_session: Any
) -> Iterator[World]:
    _fencing_zookeeper_ensemble_session.ensure_serving()
    config = WorldConfig(root=tmp_path_factory.mktemp("reliability"), seed=6, broker_url=redis_url)
    world = World(config, _fencing_zookeeper_ensemble_session).start()
    yield world
    world.close()
