"""Every token source has a grantor id, shared by all its clients and carried by every token; a grantor
whose state is replaced gets a new one (real ZooKeeper, etcd and SQLite files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_fencing import GrantorMismatchError, MemoryGate, MemoryTokenSource, SQLiteTokenSource
from celery_fencing.sources.etcd import EtcdTokenSource
from celery_fencing.sources.zookeeper import ZooKeeperTokenSource
from tests.fixtures.etcd import EtcdServer, b64, etcd_post
from tests.fixtures.zookeeper import ZooKeeperServer


def test_zookeeper_sources_share_one_grantor_id(zookeeper_server: ZooKeeperServer, unique_name: str) -> None:
    """Two sources on one ensemble agree on the id stored under the root, and their tokens and leases carry it."""
    url = zookeeper_server.url(f"/{unique_name}", timeout=20)
    with ZooKeeperTokenSource.from_url(url) as one, ZooKeeperTokenSource.from_url(url) as two:
        grantor = one.grantor_id()
        assert grantor.startswith("zk-") and two.grantor_id() == grantor
        assert one.mint("r").grantor == grantor and two.mint_many(["r", "s"])[1].grantor == grantor
        with two.lease("r") as lease:
            assert lease.token.grantor == grantor
    # Negative control: another root is another grantor.
    with ZooKeeperTokenSource.from_url(zookeeper_server.url(f"/{unique_name}-other", timeout=20)) as other:
        assert other.grantor_id() != grantor


def test_etcd_source_follows_a_replaced_grantor_id(etcd_server: EtcdServer, unique_name: str) -> None:
    """An etcd mint checks the grantor key in its transaction: when the id changes, tokens carry the new one."""
    prefix = f"/{unique_name}"
    with EtcdTokenSource(etcd_server.endpoints, prefix=prefix, timeout=10) as source:
        first = source.mint("r")
        assert first.grantor is not None and first.grantor.startswith("etcd-")
        with source.lease("r") as lease:
            assert lease.token.grantor == first.grantor
        # State replaced under a running source (as a wiped cluster would be): a new id is stored.
        etcd_post(
            etcd_server.member.endpoint, "/v3/kv/put", {"key": b64(f"{prefix}/grantor"), "value": b64("etcd-new")}
        )
        second = source.mint("r")
        assert second.grantor == "etcd-new" and source.grantor_id() == "etcd-new"
        gate = MemoryGate()
        gate.claim(first)
        with pytest.raises(GrantorMismatchError):
            gate.claim(second)


def test_sqlite_file_is_its_grantor(tmp_path: Path) -> None:
    """A SQLite token file keeps its id across reopening; a new file (the old one deleted) is a new grantor."""
    path = tmp_path / "tokens.db"
    with_source = SQLiteTokenSource(path)
    grantor = with_source.mint("r").grantor
    with_source.close()
    reopened = SQLiteTokenSource(path)
    assert reopened.mint("r").grantor == grantor and grantor is not None and grantor.startswith("sqlite-")
    reopened.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    fresh = SQLiteTokenSource(path)
    token = fresh.mint("r")
    fresh.close()
    assert token.grantor != grantor and token.value == 1


def test_memory_source_instances_are_different_grantors() -> None:
    """A memory source is volatile: each instance is its own grantor, so a 'restart' is detected at a gate."""
    gate = MemoryGate()
    gate.claim(MemoryTokenSource(start=100).mint("r"))
    with pytest.raises(GrantorMismatchError):
        gate.claim(MemoryTokenSource(start=500).mint("r"))
