"""Gate adapters for the contract suite, one fixture per backend, each in its own namespace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .adapters import AdapterSpec, GateAdapter, MemoryAdapter, RedisAdapter, SQLAdapter

GATE_KINDS = ["memory", "redis", "postgres", "mariadb", "sqlite"]


@pytest.fixture
def memory_adapter(unique_name: str) -> Iterator[GateAdapter]:
    yield MemoryAdapter(AdapterSpec("memory", namespace=unique_name))


@pytest.fixture
def redis_adapter(redis_url: str, unique_name: str) -> Iterator[RedisAdapter]:
    adapter = RedisAdapter(AdapterSpec("redis", redis_url, unique_name))
    try:
        yield adapter
    finally:
        adapter.drop()
        adapter.close()


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
