"""Secrets never reach a log record, an exception message or the command line's output: operations run
with a ZooKeeper digest password, Redis and PostgreSQL passwords and a signing key, on real servers,
through success and failure, while every log record (every level, every logger) is captured and grepped."""

from __future__ import annotations

import functools
import io
import logging
import secrets
import traceback
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from celery import Celery, states
from celery.app.task import Context
from kazoo.client import KazooClient

from celery_fencing import (
    FencingError,
    FencingToken,
    TokenSigner,
    ZooKeeperTokenSource,
    token_source_from_url,
)
from celery_fencing.cli import main
from celery_fencing.operations.urls import gate_from_url
from tests.fixtures.services import armed
from tests.fixtures.zookeeper import ZooKeeperServer

from .conftest import PG_PASSWORD, REDIS_PASSWORD
from .servers import Certs, PostgresServer, RedisServer

ZK_SECRET = "zk-" + secrets.token_hex(8) + "@:/"
SIGNING_KEY = secrets.token_hex(32)


class Capture(logging.Handler):
    """Every record of every logger, at every level (kazoo's BLATHER at 5 included), formatted with its traceback."""

    def __init__(self) -> None:
        super().__init__(level=1)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        self.texts.append(f"{record.name}: {text}")


@pytest.fixture
def capture() -> Iterator[Capture]:
    handler = Capture()
    root = logging.getLogger()
    old_level = root.level
    # Libraries that set their own levels would hide records: open them all for the test.
    names = ("kazoo", "kazoo.client", "celery", "redis", "sqlalchemy")
    touched = {name: logging.getLogger(name).level for name in names}
    root.addHandler(handler)
    root.setLevel(1)
    for name in touched:
        logging.getLogger(name).setLevel(1)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        for name, level in touched.items():
            logging.getLogger(name).setLevel(level)


def _exception_text(exc: BaseException) -> str:
    parts = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts += [str(current), repr(current), repr(current.args)]
        current = current.__cause__ or current.__context__
    return "\n".join(parts) + "\n" + "".join(traceback.format_exception(exc))


def _forms(secret: str) -> list[str]:
    return [secret, quote(secret, safe=""), quote(secret)]


def test_no_secret_in_logs_errors_or_output(
    capture: Capture,
    zookeeper_server: ZooKeeperServer,
    redis_tls: RedisServer,
    pg_tls: PostgresServer,
    certs: Certs,
    unique_name: str,
) -> None:
    """Across successes and failures of sources, gates, the result backend, signing and the CLI, no secret leaks."""
    seen: list[str] = []

    def attempt(action: Callable[[], object]) -> None:
        try:
            result = action()
            seen.append(repr(result))
        except (FencingError, Exception) as exc:  # every failure path is part of the test
            seen.append(_exception_text(exc))

    zk = f"zookeeper://fencer:{quote(ZK_SECRET, safe='')}@{zookeeper_server.hosts}/{unique_name}?timeout=20"
    zk_wrong = zk.replace(quote(ZK_SECRET, safe=""), "wrong").replace("timeout=20", "timeout=2")
    rediss = f"rediss://fencer:{REDIS_PASSWORD}@127.0.0.1:{redis_tls.port}/0?ssl_ca_certs={certs.ca}"
    pg = (
        f"postgresql+psycopg://fencer:{PG_PASSWORD}@127.0.0.1:{pg_tls.port}/postgres"
        f"?sslmode=verify-full&sslrootcert={certs.ca}"
    )

    with ZooKeeperTokenSource.from_url(zk) as source:
        token = source.mint("acct")
        seen.append(repr(source))
        with source.lease("acct") as lease:
            seen.append(repr(lease))
    with ZooKeeperTokenSource.from_url(zk_wrong) as stranger:
        attempt(lambda: stranger.mint("acct"))
    attempt(lambda: token_source_from_url(zk + "&bogus=1"))
    attempt(lambda: token_source_from_url(zk.replace("@", "@[")))
    attempt(lambda: token_source_from_url(zk.replace("timeout=20", "timeout=-1")))

    for url in (rediss, pg):
        opened = gate_from_url(url, redis_prefix=unique_name, sql_table=f"hw_{unique_name}")
        seen.append(opened.label)
        if opened.kind == "sql":
            opened.gate.create_schema()  # type: ignore[attr-defined]
        attempt(functools.partial(opened.gate.claim, token))
        opened.close()
    for wrong in (rediss.replace(REDIS_PASSWORD, "nope"), pg.replace(PG_PASSWORD, "nope")):
        opened = gate_from_url(wrong, sql_table=f"hw_{unique_name}")
        attempt(functools.partial(opened.gate.claim, token))
        opened.close()

    backend = "fenced+" + rediss.replace("?", "?ssl_cert_reqs=required&")
    app = Celery("secrets", backend=backend, set_as_current=False)
    request = Context(id=unique_name, task="x", args=(), kwargs={})
    request.fencing_token = FencingToken(unique_name, 5, "zk-a")
    armed(app.backend).store_result(unique_name, "ok", states.SUCCESS, request=request)
    request.fencing_token = FencingToken(unique_name, 4, "zk-a")
    app.backend.store_result(unique_name, "stale", states.SUCCESS, request=request)  # dropped and logged
    seen.append(repr(app.backend))
    app.close()

    signer = TokenSigner({"k1": SIGNING_KEY})
    seen.append(repr(signer))
    attempt(lambda: signer.verify(FencingToken("acct", 5, "zk-a", "k1:" + "0" * 64)))
    attempt(lambda: TokenSigner({"k1": SIGNING_KEY[:10]}))

    for argv in (
        ["inspect", "--source", zk, "--gate", rediss, "--gate", pg, "--sql-table", f"hw_{unique_name}", "acct"],
        ["repair", "--source", zk, "--gate", rediss, "acct"],
        ["rebase", "--source", zk_wrong, "--gate", rediss, "acct"],
        ["inspect", "--source", zk, "--gate", rediss.replace(str(redis_tls.port), "9"), "acct"],
        ["inspect", "--source", zk, "--gate", pg.replace(PG_PASSWORD, "nope"), "acct"],
    ):
        out = io.StringIO()
        main(argv, out=out, err=out)
        seen.append(out.getvalue())

    engine = sa.create_engine(pg, connect_args={"connect_timeout": 5})
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS hw_{unique_name}")
    engine.dispose()

    everything = "\n".join(capture.texts + seen)
    assert capture.texts, "the capture saw no record at all"
    # kazoo logged the authentication packet (at DEBUG), masked by the source's logger adapter.
    assert any("Auth(" in text and "auth='***'" in text for text in capture.texts)
    for secret in (ZK_SECRET, REDIS_PASSWORD, PG_PASSWORD, SIGNING_KEY):
        for form in _forms(secret):
            assert form not in everything, f"secret {secret[:6]}... leaked"


def test_capture_would_see_a_leak(capture: Capture, zookeeper_server: ZooKeeperServer) -> None:
    """Negative control: a plain KazooClient with digest auth logs the password at DEBUG, and the capture finds it."""
    client = KazooClient(zookeeper_server.hosts, auth_data=[("digest", f"fencer:{ZK_SECRET}")])
    client.start(timeout=30)
    client.stop()
    client.close()
    assert any(ZK_SECRET in text for text in capture.texts)
