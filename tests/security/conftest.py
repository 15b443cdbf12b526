"""Throwaway servers with auth and TLS (see servers.py), shared by the transport and secrets tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing

import pytest

from .servers import Certs, PostgresServer, RedisServer, TLSZooKeeperServer, make_certs

REDIS_PASSWORD = "redis-pw-Zq81"
PG_PASSWORD = "pg-pw-Kx27"
ZK_PASSWORD = "zk-pw-Lm55"


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def zk_tls(certs: Certs) -> Iterator[TLSZooKeeperServer]:
    with TLSZooKeeperServer(certs) as server:
        yield server


@pytest.fixture(scope="session")
def redis_tls(certs: Certs) -> Iterator[RedisServer]:
    with closing(RedisServer(certs, {"fencer": REDIS_PASSWORD})) as server:
        server.start()
        yield server


@pytest.fixture(scope="session")
def pg_tls(certs: Certs) -> Iterator[PostgresServer]:
    with closing(PostgresServer(certs, {"fencer": PG_PASSWORD})) as server:
        server.start()
        yield server
