"""A ZooKeeper whose data directory is wiped is a new grantor: on a real server, its tokens raise
GrantorMismatchError at real gates (Redis, SQLite), and `celery-fencing rebase` is the way back."""

from __future__ import annotations

import io
import logging
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from celery_fencing import (
    FencingToken,
    GrantorMismatchError,
    RedisGate,
    SQLGate,
    StaleTokenError,
    ZooKeeperTokenSource,
)
from celery_fencing.cli import main
from tests.fixtures.services import armed
from tests.fixtures.zookeeper import ZooKeeperServer


@pytest.fixture
def server() -> Iterator[ZooKeeperServer]:
    # Our own server: this test wipes its data directory.
    with ZooKeeperServer() as zookeeper:
        yield zookeeper


def wipe(server: ZooKeeperServer) -> None:
    """Stop the server, delete its data directory, start it again: every znode and the zxid counter are gone."""
    server.stop()
    shutil.rmtree(server.node.data_dir)
    server.node.data_dir.mkdir()
    server.start()


def test_wiped_zookeeper_is_refused_and_rebase_recovers(
    server: ZooKeeperServer, redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a wipe, new tokens raise GrantorMismatchError (not a silent forever-stale); rebase moves the marks."""
    url = server.url("/sec", timeout=20)
    prefix = f"sec{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(redis_url)
    sqlite_url = f"sqlite:///{tmp_path / 'marks.db'}"
    engine = sa.create_engine(sqlite_url)
    redis_gate, sql_gate = armed(RedisGate(client, prefix=prefix)), SQLGate(engine)
    sql_gate.create_schema()
    gates = [redis_gate, sql_gate]
    resource = "account:{42}"
    try:
        with ZooKeeperTokenSource.from_url(url) as before:
            # Enough writes that the old zxids stay above the wiped server's for the whole test.
            for _ in range(30):
                old = before.mint(resource)
            for gate in gates:
                gate.claim(old)
        assert old.grantor is not None and old.grantor.startswith("zk-")

        wipe(server)

        with ZooKeeperTokenSource.from_url(url) as after:
            new = after.mint(resource)
            assert new.grantor is not None and new.grantor != old.grantor
            assert new.value < old.value, "a wiped ensemble counts from zero again"
            for gate in gates:
                with pytest.raises(GrantorMismatchError) as caught:
                    gate.claim(new)
                assert old.grantor in str(caught.value) and new.grantor in str(caught.value)
                # Negative control: compared by value alone, the new token is stale forever.
                with pytest.raises(StaleTokenError):
                    gate.claim(FencingToken(resource, new.value))

            argv = ["rebase", "--source", url, "--gate", redis_url, "--redis-prefix", prefix, "--gate", sqlite_url]
            out = io.StringIO()
            assert main([*argv, resource], out=out, err=out) == 1, out.getvalue()
            assert "would change" in out.getvalue() and "nothing was changed" in out.getvalue()
            assert old.grantor in out.getvalue() and new.grantor in out.getvalue()
            assert redis_gate.mark(resource).grantor == old.grantor  # type: ignore[union-attr]

            out = io.StringIO()
            with caplog.at_level(logging.WARNING, logger="celery_fencing.audit"):
                assert main([*argv, "--yes", resource], out=out, err=out) == 0, out.getvalue()
            assert out.getvalue().count("changed ") == 2
            assert [r.name for r in caplog.records].count("celery_fencing.audit") == 2

            later = after.mint(resource)
            for gate in gates:
                gate.claim(later)
                mark = gate.mark(resource)  # type: ignore[attr-defined]
                assert mark is not None and (mark.value, mark.grantor) == (later.value, new.grantor)
                with pytest.raises(GrantorMismatchError):
                    gate.claim(old)  # a paused worker of the old grantor stays out
                with pytest.raises(StaleTokenError):
                    gate.claim(new)  # minted before the rebase

            out = io.StringIO()
            assert main([*argv, "--yes", resource], out=out, err=out) == 0
            assert "nothing to change" in out.getvalue()
    finally:
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()
        engine.dispose()
