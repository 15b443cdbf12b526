"""etcd-specific behaviour of EtcdTokenSource, on real etcd processes (the shared contract is in tests/sources)."""

from __future__ import annotations

import itertools
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from celery_fencing import (
    FencingConfigurationError,
    FencingToken,
    LeaseLostError,
    MemoryGate,
    StaleTokenError,
    TokenSource,
    TokenUnavailableError,
    token_source_from_url,
)
from celery_fencing.sources.etcd import EtcdTokenSource, resource_to_key_name
from tests.fixtures.etcd import EtcdCluster, EtcdServer, b64, etcd_post

ETCDCTL = "etcdctl"


@pytest.fixture
def source(etcd_server: EtcdServer, unique_name: str) -> Iterator[EtcdTokenSource]:
    built = EtcdTokenSource(etcd_server.endpoints, prefix=f"/{unique_name}", timeout=10, lease_ttl=3)
    yield built
    built.close()


# URLs ------------------------------------------------------------------------------


def test_url_builds_a_source_with_its_parameters() -> None:
    """etcd://h1,h2/prefix?timeout&lease_ttl&cluster_id builds an EtcdTokenSource with those values."""
    built = token_source_from_url("etcd://127.0.0.1:1,[::1]:2,example/p/q?timeout=2&lease_ttl=4&cluster_id=0x1f")
    assert isinstance(built, EtcdTokenSource)
    assert built.endpoints == ("127.0.0.1:1", "[::1]:2", "example:2379")
    assert (built.prefix, built.timeout, built.lease_ttl, built.cluster_id) == ("/p/q", 2.0, 4.0, 31)
    assert token_source_from_url("etcd://h").prefix == "/fencing"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "url",
    [
        "etcd:///p",
        "etcd://user:pw@h/p",
        "etcd://h:99999/p",
        "etcd://h/p?session_timeout=3",
        "etcd://h/p?timeout=0",
        "etcd://h/p?lease_ttl=1",
        "etcd://h/p?cluster_id=abc",
        "etcd://h/p#x",
        "etcd://h/p\x01",
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    """Malformed etcd URLs raise FencingConfigurationError when the source is built, before any I/O."""
    with pytest.raises(FencingConfigurationError):
        token_source_from_url(url)


def test_resource_names_never_nest() -> None:
    """A '/' in a resource is encoded, so one resource's lock prefix never covers another's keys."""
    assert resource_to_key_name("a/b") == "a%2Fb"
    assert not resource_to_key_name("a/b").startswith(resource_to_key_name("a") + "/")


# Tokens ------------------------------------------------------------------------------


def test_token_is_the_revision_of_one_put(source: EtcdTokenSource, etcd_server: EtcdServer) -> None:
    """A token equals the mod revision of the resource's key afterwards: one write, its revision."""
    token = source.mint("acct:1")
    key = f"{source.prefix}/tokens/acct:1"
    reply = etcd_post(etcd_server.member.endpoint, "/v3/kv/range", {"key": b64(key)})
    assert int(reply["kvs"][0]["mod_revision"]) == token.value
    assert int(reply["header"]["revision"]) == token.value


def test_tokens_survive_deleting_the_key(source: EtcdTokenSource, etcd_server: EtcdServer) -> None:
    """Deleting a resource's key does not reset its tokens: revisions are global to the store."""
    before = source.mint("acct:2").value
    etcd_post(etcd_server.member.endpoint, "/v3/kv/deleterange", {"key": b64(f"{source.prefix}/tokens/acct:2")})
    assert source.mint("acct:2").value > before


def test_mints_continue_while_the_leader_is_killed(etcd_cluster: EtcdCluster, unique_name: str) -> None:
    """Threads minting through a leader kill get unique tokens, increasing per thread, and none hangs."""
    built = token_source_from_url(etcd_cluster.url(f"/{unique_name}", timeout=30))
    results: dict[int, list[int]] = {n: [] for n in range(4)}
    errors: list[BaseException] = []
    stop = threading.Event()
    half_done = threading.Barrier(5)

    def work(n: int) -> None:
        try:
            for i in itertools.count():
                if i == 10:
                    half_done.wait(60)
                if stop.is_set() and i > 10:
                    return
                results[n].append(built.mint("hot").value)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in results]
    for thread in threads:
        thread.start()
    try:
        half_done.wait(60)
        killed = etcd_cluster.kill_leader()
        counts_at_kill = {n: len(values) for n, values in results.items()}
        # Let every thread mint at least a few tokens on the new leader.
        deadline = time.monotonic() + 60
        while any(len(results[n]) < counts_at_kill[n] + 5 for n in results) and not errors:
            assert time.monotonic() < deadline, "minting did not resume after the leader was killed"
            time.sleep(0.05)  # polling interval; the loop re-checks
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        built.close()
    assert not errors, errors
    everything = [v for values in results.values() for v in values]
    assert len(everything) == len(set(everything))
    for values in results.values():
        assert all(b > a for a, b in itertools.pairwise(values))
    assert not killed.running


def test_a_member_that_never_answers_is_skipped(etcd_cluster: EtcdCluster, unique_name: str) -> None:
    """With the first endpoint SIGSTOPped (connects succeed, nothing answers), mint fails over within its timeout."""
    built = token_source_from_url(etcd_cluster.url(f"/{unique_name}"))
    try:
        before = built.mint("acct", timeout=10).value
        etcd_cluster.members[0].pause()
        # The source prefers the member that answered last; make it start at the paused one.
        built._gateway.preferred = 0  # type: ignore[attr-defined]
        # Without failover the paused member would take the whole timeout and this would raise.
        assert built.mint("acct", timeout=15).value > before
    finally:
        etcd_cluster.members[0].resume()
        built.close()


# Exclusive mode ----------------------------------------------------------------------


def test_lease_excludes_others_and_tokens_increase(source: EtcdTokenSource) -> None:
    """While A holds the lease, B times out waiting; after A leaves, B gets it with a larger token."""
    with source.lease("job") as a:
        first = a.token
        again = a.mint()
        assert again > first
        started = time.monotonic()
        with pytest.raises(TokenUnavailableError), source.lease("job", timeout=1.5):
            pass
        assert time.monotonic() - started < 10
        a.check()
    with source.lease("job", timeout=10) as b:
        assert b.token > again
        assert b.lock_revision < b.token.value


def test_holder_whose_lock_key_is_gone_cannot_mint(source: EtcdTokenSource, etcd_server: EtcdServer) -> None:
    """The mint transaction checks the lock key: once it is deleted, lease.mint() raises LeaseLostError."""
    with source.lease("job") as held:
        assert held.lock_key is not None
        etcd_post(etcd_server.member.endpoint, "/v3/kv/deleterange", {"key": b64(held.lock_key)})
        with pytest.raises(LeaseLostError):
            held.mint()
        assert held.lost
        with pytest.raises(LeaseLostError):
            held.check()
        # Negative control: a plain mint (no lock check) still succeeds for the same resource.
        assert source.mint("job").value > held.token.value


def test_expired_lease_is_lost_and_the_paused_holder_is_fenced(
    source: EtcdTokenSource, etcd_server: EtcdServer
) -> None:
    """A's etcd lease ends (as after a long pause); B takes the lock; A's write with its old token is refused."""
    gate = MemoryGate()
    lost = threading.Event()
    with source.lease("acct:9") as a:
        a.on_lost(lambda _lease: lost.set())
        gate.claim(a.token)
        # The lease ends behind A's back, as when A was paused past its TTL.
        etcd_post(etcd_server.member.endpoint, "/v3/lease/revoke", {"ID": str(a.lease_id)})
        with source.lease("acct:9", timeout=10) as b:
            gate.claim(b.token)
            gate.set(b.token, "balance", 120)
            with pytest.raises(StaleTokenError) as info:
                gate.set(a.token, "balance", 110)
            assert info.value.high_water == b.token.value
        assert lost.wait(30), "the keep-alive thread must notice the lease is gone"
        assert a.lost
    assert gate.get("balance") == 120


# Grantor identity --------------------------------------------------------------------


def test_source_refuses_another_cluster(etcd_server: EtcdServer, unique_name: str) -> None:
    """A source pinned to another cluster id refuses to mint, naming both ids; unpinned it mints."""
    url = etcd_server.url(f"/{unique_name}")
    unpinned = token_source_from_url(url)
    try:
        unpinned.mint("r")
        actual = unpinned.cluster_id  # type: ignore[attr-defined]
        assert isinstance(actual, int)
    finally:
        unpinned.close()
    pinned = token_source_from_url(url + f"?cluster_id={actual ^ 1}")
    try:
        with pytest.raises(TokenUnavailableError, match=f"{actual:x}"):
            pinned.mint("r", timeout=3)
    finally:
        pinned.close()


def _etcdctl(*args: str) -> None:
    subprocess.run([ETCDCTL, *args], check=True, capture_output=True, env={"ETCDCTL_API": "3", "PATH": "/usr/bin"})


def _restore(server: EtcdServer, snapshot: Path, cluster_token: str) -> None:
    """Replace the member's data with *snapshot* (as after losing it), the way etcd's disaster recovery does."""
    member = server.member
    member.stop()
    member.data_dir.rename(member.directory / f"lost-{time.monotonic_ns()}")
    _etcdctl(
        "snapshot",
        "restore",
        str(snapshot),
        "--data-dir",
        str(member.data_dir),
        "--name",
        member.name,
        "--initial-cluster",
        member.cluster,
        "--initial-cluster-token",
        cluster_token,
        "--initial-advertise-peer-urls",
        f"http://127.0.0.1:{member.peer_port}",
    )
    member.launch()
    member.wait_serving()


@contextmanager
def _snapshot_after_a_mint(tmp_path: Path, unique_name: str) -> Iterator[tuple[EtcdServer, str, TokenSource, Path]]:
    """A server of the test's own, the URL of a live source on it, the source (closed on exit) after it minted
    ``acct`` once, and a snapshot of the server saved after that mint."""
    with EtcdServer(tmp_path / "etcd") as server:
        url = server.url(f"/{unique_name}")
        live = token_source_from_url(url)
        try:
            live.mint("acct")
            snapshot = tmp_path / "snapshot.db"
            _etcdctl("--endpoints", server.member.endpoint, "snapshot", "save", str(snapshot))
            yield server, url, live, snapshot
        finally:
            live.close()


def test_snapshot_restore_reissues_revisions(tmp_path: Path, unique_name: str) -> None:
    """After a restore keeping the cluster id (no --bump-revision) etcd re-issues revisions; a live source refuses."""
    with _snapshot_after_a_mint(tmp_path, unique_name) as (server, url, live, snapshot):
        issued = [live.mint("acct").value for _ in range(5)]
        # The same cluster token and peer URLs: the restored cluster has the same id.
        _restore(server, snapshot, server.member.token)
        with pytest.raises(TokenUnavailableError, match="went backwards"):
            live.mint("acct", timeout=10)
        # Negative control: a fresh process has no memory of what was issued, and gets a
        # token equal to one handed out before the restore, which every gate accepts.
        fresh = token_source_from_url(url)
        try:
            reissued = fresh.mint("acct", timeout=10).value
            assert fresh.cluster_id == live.cluster_id  # type: ignore[attr-defined]
        finally:
            fresh.close()
        assert reissued in issued
        # Two executions now hold the same number: a gate cannot tell them apart.
        gate = MemoryGate()
        gate.claim(FencingToken("acct", reissued))  # the one from before the restore
        gate.claim(FencingToken("acct", reissued))  # the one after it: accepted too


def test_restore_under_a_new_cluster_token_changes_the_identity(tmp_path: Path, unique_name: str) -> None:
    """A restore under a new --initial-cluster-token gets a new cluster id: pinned sources refuse until re-pinned."""
    with _snapshot_after_a_mint(tmp_path, unique_name) as (server, url, live, snapshot):
        old_id = live.cluster_id  # type: ignore[attr-defined]
        _restore(server, snapshot, f"restored-{unique_name}")
        with pytest.raises(TokenUnavailableError, match=f"not {old_id:x}"):
            live.mint("acct", timeout=10)
        pinned = token_source_from_url(f"{url}?cluster_id={old_id}")
        try:
            with pytest.raises(TokenUnavailableError, match="belongs to cluster"):
                pinned.mint("acct", timeout=10)
        finally:
            pinned.close()
        # The operator's deliberate step: pin the new id (after bumping revisions past the old ones).
        repinned = token_source_from_url(url)
        try:
            repinned.mint("acct", timeout=10)
            assert repinned.cluster_id != old_id  # type: ignore[attr-defined]
        finally:
            repinned.close()
