"""Gate adapters for the contract suite, one fixture per backend, each in its own namespace.

``redis_cluster`` is RedisGate on the session's throwaway three-master cluster
(tests/fixtures/redis_cluster.py), the test's namespace as the hash tag of
all its resources and keys (:class:`~tests.gates.adapters.RedisClusterAdapter`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.redis_cluster import RedisClusterServers

from .adapters import AdapterSpec, GateAdapter, MemoryAdapter, RedisAdapter, RedisClusterAdapter, SQLAdapter

GATE_KINDS = ["memory", "redis", "redis_cluster", "postgres", "mariadb", "sqlite"]


@pytest.fixture
def memory_adapter(unique_name: str) -> Iterator[GateAdapter]:
    yield MemoryAdapter(AdapterSpec("memory", namespace=unique_name))


def _redis_adapter(adapter: RedisAdapter) -> Iterator[RedisAdapter]:
    try:
        yield adapter
    finally:
        adapter.drop()
        adapter.close()


@pytest.fixture
def redis_adapter(redis_url: str, unique_name: str) -> Iterator[RedisAdapter]:
    yield from _redis_adapter(RedisAdapter(AdapterSpec("redis", redis_url, unique_name)))


@pytest.fixture
def redis_cluster_adapter(redis_cluster: RedisClusterServers, unique_name: str) -> Iterator[RedisAdapter]:
    """The session's three-master cluster, every resource and key of the test under one hash tag."""
    yield from _redis_adapter(RedisClusterAdapter(AdapterSpec("redis_cluster", redis_cluster.url, unique_name)))


def _sql_adapter(url: str, namespace: str) -> Iterator[SQLAdapter]:
    adapter = SQLAdapter(AdapterSpec("sql", url, namespace))
    try:
        adapter.create()
        yield adapter
    finally:
        adapter.drop()


@pytest.fixture
def postgres_adapter(postgres_url: str, unique_name: str) -> Iterator[SQLAdapter]:
    yield from _sql_adapter(postgres_url, unique_name)


@pytest.fixture
def mariadb_adapter(mariadb_url: str, unique_name: str) -> Iterator[SQLAdapter]:
    yield from _sql_adapter(mariadb_url, unique_name)


@pytest.fixture
def sqlite_adapter(tmp_path: Path, unique_name: str) -> Iterator[SQLAdapter]:
    yield from _sql_adapter(f"sqlite:///{tmp_path / 'gates.db'}", unique_name)


@pytest.fixture(params=GATE_KINDS)
def adapter(request: pytest.FixtureRequest) -> GateAdapter:
    value: GateAdapter = request.getfixturevalue(f"{request.param}_adapter")
    return value
