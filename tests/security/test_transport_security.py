"""Transport security on throwaway servers of our own (tests/security/servers.py): ZooKeeper over TLS
with digest auth, Redis with ACL users and TLS only (RedisGate, gate URLs and the fenced result
backend), PostgreSQL taking TLS only (SQLGate). Each with its negative controls: no TLS, an untrusted
CA, a missing client certificate, a wrong password."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from celery import Celery, states
from celery.app.task import Context
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from celery_fencing import (
    GateUnavailableError,
    RedisGate,
    SQLGate,
    StaleTokenError,
    TokenUnavailableError,
    ZooKeeperTokenSource,
)
from celery_fencing.operations.urls import gate_from_url
from celery_fencing.token import FencingToken
from tests.fixtures.services import armed

from .conftest import PG_PASSWORD, REDIS_PASSWORD, ZK_PASSWORD
from .servers import Certs, PostgresServer, RedisServer, TLSZooKeeperServer


def zk_url(server: TLSZooKeeperServer, certs: Certs, root: str, **overrides: str) -> str:
    params = {
        "tls": "true",
        "ca": str(certs.ca),
        "certfile": str(certs.client_cert),
        "keyfile": str(certs.client_key),
        "timeout": "20",
        **overrides,
    }
    query = "&".join(f"{key}={value}" for key, value in params.items() if value)
    return f"zookeeper://fencer:{ZK_PASSWORD}@{server.secure_hosts}{root}?{query}"


# ZooKeeper ------------------------------------------------------------------------------


def test_zookeeper_over_tls_with_digest_auth(zk_tls: TLSZooKeeperServer, certs: Certs, unique_name: str) -> None:
    """A source over TLS with a client certificate and digest credentials mints, and its znodes refuse strangers."""
    root = f"/{unique_name}"
    with ZooKeeperTokenSource.from_url(zk_url(zk_tls, certs, root)) as source:
        assert source.tls is not None and "tls" in repr(source)
        first, second = source.mint("acct"), source.mint("acct")
        assert second.value > first.value and first.grantor is not None
        with source.lease("acct") as lease:
            assert lease.token.grantor == first.grantor
    stranger = KazooClient(
        zk_tls.secure_hosts,
        use_ssl=True,
        ca=str(certs.ca),
        certfile=str(certs.client_cert),
        keyfile=str(certs.client_key),
    )
    stranger.start(timeout=30)
    try:
        with pytest.raises(NoAuthError):
            stranger.set(f"{root}/grantor", b"zk-attacker")
    finally:
        stranger.stop()
        stranger.close()


@pytest.mark.parametrize(
    "overrides",
    [
        {"tls": "false", "ca": "", "certfile": "", "keyfile": "", "timeout": "3"},
        {"ca": "OTHER", "timeout": "3"},
        {"certfile": "", "keyfile": "", "timeout": "3"},
    ],
    ids=["no-tls", "untrusted-server-ca", "no-client-certificate"],
)
def test_zookeeper_tls_refuses_what_it_should(
    zk_tls: TLSZooKeeperServer, certs: Certs, unique_name: str, overrides: dict[str, str]
) -> None:
    """Plain TCP to the TLS port, an untrusted server certificate, no client certificate: nothing is minted."""
    if overrides.get("ca") == "OTHER":
        overrides = {**overrides, "ca": str(certs.other_ca)}
    url = zk_url(zk_tls, certs, f"/{unique_name}", **overrides)
    with ZooKeeperTokenSource.from_url(url) as source, pytest.raises(TokenUnavailableError) as caught:
        source.mint("acct")
    assert ZK_PASSWORD not in str(caught.value)


# Redis ----------------------------------------------------------------------------------


def _redis(server: RedisServer, certs: Certs, **overrides: object) -> redis.Redis:
    options: dict[str, object] = {
        "host": "127.0.0.1",
        "port": server.port,
        "username": "fencer",
        "password": REDIS_PASSWORD,
        "ssl": True,
        "ssl_ca_certs": str(certs.ca),
        "socket_connect_timeout": 5,
        "socket_timeout": 5,
        "retry": None,
        **overrides,
    }
    return redis.Redis(**options)  # type: ignore[arg-type]


def test_redis_gate_with_an_acl_user_over_tls(redis_tls: RedisServer, certs: Certs, unique_name: str) -> None:
    """RedisGate works with an ACL user over TLS, from a client and from a rediss:// gate URL."""
    client = _redis(redis_tls, certs)
    gate = armed(RedisGate(client, prefix=unique_name))
    gate.claim(FencingToken("acct", 5, "zk-a"))
    gate.set(FencingToken("acct", 6, "zk-a"), f"{unique_name}:k", "v")
    with pytest.raises(StaleTokenError):
        gate.set(FencingToken("acct", 5, "zk-a"), f"{unique_name}:k", "stale")
    url = f"rediss://fencer:{REDIS_PASSWORD}@127.0.0.1:{redis_tls.port}/0?ssl_ca_certs={certs.ca}"
    opened = gate_from_url(url, redis_prefix=unique_name)
    try:
        assert opened.gate.high_water("acct") == 6
        assert REDIS_PASSWORD not in opened.label
    finally:
        opened.close()
    client.close()


@pytest.mark.parametrize(
    "overrides",
    [
        {"password": "wrong"},
        {"username": None, "password": None},
        {"ssl": False},
        {"ssl_ca_certs": "OTHER"},
    ],
    ids=["wrong-password", "default-user-disabled", "no-tls", "untrusted-server-ca"],
)
def test_redis_gate_refusals_are_gate_unavailable(
    redis_tls: RedisServer, certs: Certs, unique_name: str, overrides: dict[str, object]
) -> None:
    """A wrong password, no credentials, no TLS or an untrusted CA: GateUnavailableError, no password in it."""
    if overrides.get("ssl_ca_certs") == "OTHER":
        overrides = {**overrides, "ssl_ca_certs": str(certs.other_ca)}
    if overrides.get("ssl") is False:
        overrides = {**overrides, "ssl_ca_certs": None}
        overrides.pop("ssl_ca_certs")
    client = _redis(redis_tls, certs, **overrides)
    gate = RedisGate(client, prefix=unique_name)
    with pytest.raises(GateUnavailableError) as caught:
        gate.claim(FencingToken("acct", 5, "zk-a"))
    assert REDIS_PASSWORD not in str(caught.value) and "wrong" not in str(caught.value)
    client.close()


def test_fenced_result_backend_over_tls_with_an_acl_user(redis_tls: RedisServer, certs: Certs) -> None:
    """fenced+rediss:// with an ACL user stores results under the fence over TLS; a stale write is dropped."""
    url = (
        f"fenced+rediss://fencer:{REDIS_PASSWORD}@127.0.0.1:{redis_tls.port}/0"
        f"?ssl_cert_reqs=required&ssl_ca_certs={certs.ca}"
    )
    app = Celery("tls-backend", backend=url, set_as_current=False)
    try:

        def request(token: FencingToken) -> Context:
            context = Context(id="tls-task", task="x", args=(), kwargs={})
            context.fencing_token = token
            return context

        armed(app.backend).claim_result("tls-task", FencingToken("tls-task", 9, "zk-a"))
        newer, stale = FencingToken("tls-task", 9, "zk-a"), FencingToken("tls-task", 7, "zk-a")
        app.backend.store_result("tls-task", "newer", states.SUCCESS, request=request(newer))
        app.backend.store_result("tls-task", "stale", states.SUCCESS, request=request(stale))
        assert app.AsyncResult("tls-task").get(timeout=10) == "newer"
        assert app.backend.client.connection_pool.connection_kwargs.get("ssl_ca_certs") == str(certs.ca)
    finally:
        app.close()


# PostgreSQL -----------------------------------------------------------------------------


def pg_url(server: PostgresServer, certs: Certs, *, sslmode: str = "verify-full", ca: Path | None = None) -> str:
    root = ca or certs.ca
    return (
        f"postgresql+psycopg://fencer:{PG_PASSWORD}@127.0.0.1:{server.port}/postgres"
        f"?sslmode={sslmode}&sslrootcert={root}"
    )


def test_sql_gate_over_tls(pg_tls: PostgresServer, certs: Certs, unique_name: str) -> None:
    """SQLGate on a PostgreSQL that takes TLS only: the connection is encrypted, the gate fences as usual."""
    engine = sa.create_engine(pg_url(pg_tls, certs), connect_args={"connect_timeout": 5})
    gate = SQLGate(engine, table=f"hw_{unique_name}")
    try:
        gate.create_schema()
        with gate.transaction(FencingToken("acct", 5, "zk-a")) as conn:
            assert conn.exec_driver_sql("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").scalar() is True
        with pytest.raises(StaleTokenError):
            gate.claim(FencingToken("acct", 4, "zk-a"))
        opened = gate_from_url(pg_url(pg_tls, certs), sql_table=f"hw_{unique_name}")
        try:
            assert opened.gate.high_water("acct") == 5 and PG_PASSWORD not in opened.label
        finally:
            opened.close()
    finally:
        gate.table.drop(engine, checkfirst=True)
        engine.dispose()


@pytest.mark.parametrize("case", ["no-tls", "untrusted-server-ca", "wrong-password"])
def test_sql_gate_refusals_are_gate_unavailable(pg_tls: PostgresServer, certs: Certs, case: str) -> None:
    """No TLS (the server rejects it), an untrusted CA or a wrong password: GateUnavailableError, no password in it."""
    url = {
        "no-tls": pg_url(pg_tls, certs, sslmode="disable"),
        "untrusted-server-ca": pg_url(pg_tls, certs, ca=certs.other_ca),
        "wrong-password": pg_url(pg_tls, certs).replace(PG_PASSWORD, "wrong-pw"),
    }[case]
    engine = sa.create_engine(url, connect_args={"connect_timeout": 5})
    try:
        with pytest.raises(GateUnavailableError) as caught:
            SQLGate(engine, table="hw_never").claim(FencingToken("acct", 5, "zk-a"))
        assert PG_PASSWORD not in str(caught.value) and "wrong-pw" not in str(caught.value)
    finally:
        engine.dispose()
