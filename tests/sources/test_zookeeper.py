"""ZooKeeperTokenSource behaviour beyond the source contract, against real ZooKeeper servers.

Covered here: znode naming, the token being the write's zxid, refusal while
the session is suspended, client ownership and fork, exclusive leases (waiting,
hand-over on session expiry, the multi-op that stops a lost holder), and
minting through a leader failover.
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from celery_fencing import (
    FencingConfigurationError,
    InvalidTokenError,
    LeaseLostError,
    TokenUnavailableError,
    token_source_from_url,
)
from celery_fencing.blocks import SCALE_BITS
from celery_fencing.sources.zookeeper import (
    MAX_ZNODE_NAME_LENGTH,
    ZooKeeperLease,
    ZooKeeperTokenSource,
    resource_to_znode_name,
    znode_name_to_resource,
)
from tests.fixtures.kazoo_client import started_client
from tests.fixtures.zookeeper import ZooKeeperEnsemble, ZooKeeperServer, expire_session, free_ports

TRICKY = [
    "a/b/c",
    "/leading",
    "trailing/",
    "100%",
    "%2F",
    "with space",
    "orders/2026:ü",
    ".",
    "..",
    "...",
    "zookeeper",
    "Zookeeper",
    "emoji 😀",
    "tab-free:@+=,!~_.-",
    "x" * 200,
    "😀" * 200,
]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll *predicate* until it holds; fail naming *what* after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)  # polling interval; the predicate is re-checked


# Znode names ---------------------------------------------------------------------------


@pytest.mark.parametrize("resource", TRICKY, ids=repr)
def test_znode_name_round_trips_and_is_one_valid_component(resource: str) -> None:
    """Every resource maps to a single znode name (no '/', not '.', '..' or 'zookeeper') that maps back."""
    name = resource_to_znode_name(resource)
    assert "/" not in name
    assert name not in {".", "..", "zookeeper"}
    assert name.isascii() and name.isprintable() and " " not in name
    assert len(name) <= MAX_ZNODE_NAME_LENGTH
    assert znode_name_to_resource(name) == resource


def test_reserved_and_escape_lookalike_names_stay_distinct() -> None:
    """'.', '..', 'zookeeper' are escaped, and a resource spelled like an escape does not collide."""
    assert resource_to_znode_name(".") == "%2E"
    assert resource_to_znode_name("..") == "%2E."
    assert resource_to_znode_name("zookeeper") == "%7Aookeeper"
    assert resource_to_znode_name("%2E") == "%252E"
    names = [resource_to_znode_name(r) for r in TRICKY]
    assert len(set(names)) == len(TRICKY)


@pytest.mark.parametrize("name", ["%zz", "%FF", "a%2fb", "%61", "a/b"])
def test_non_canonical_znode_names_are_refused(name: str) -> None:
    """A znode name the mapping would never produce is an InvalidTokenError, not a silent alias."""
    with pytest.raises(InvalidTokenError):
        znode_name_to_resource(name)


def test_tricky_resources_each_get_their_own_znode(
    make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient, unique_name: str
) -> None:
    """Minting for tricky names creates one znode per resource under <root>/tokens, named reversibly."""
    source = make_source()
    for resource in TRICKY:
        assert source.mint(resource).resource == resource
    children = admin.get_children(f"/{unique_name}/tokens")
    assert sorted(znode_name_to_resource(child) for child in children) == sorted(TRICKY)


# The token is the write's zxid -------------------------------------------------------


def test_token_is_the_mzxid_of_the_write(make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient) -> None:
    """The token is the mzxid ZooKeeper recorded for the write, and each mint is exactly one write:
    the create of the znode for a resource's first token, one setData for each later one."""
    source = make_source()
    tokens = [source.mint("acct:1") for _ in range(3)]
    _, stat = admin.get(f"{source.root}/tokens/acct:1")
    assert tokens[0].value == stat.czxid << SCALE_BITS
    assert tokens[-1].value == stat.mzxid << SCALE_BITS
    assert stat.version == 2  # created by the first mint, then one setData per mint


def test_recreated_znode_still_mints_higher(
    make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient
) -> None:
    """Deleting the token znode (and its lock tree) resets its version, yet the next tokens are higher."""
    source = make_source()
    before = source.mint("acct:2").value
    admin.delete(f"{source.root}/tokens/acct:2")
    after = source.mint("acct:2").value
    assert after > before
    admin.delete(f"{source.root}/tokens/acct:2")
    with source.lease("acct:2") as lease:
        assert lease.token.value > after


def test_transient_tokens_leave_no_znode_and_order_with_named_ones(
    make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient
) -> None:
    """mint_transient (what fenced tasks use for task ids) writes one shared znode, never one per
    resource; its tokens interleave with mint()'s of the same resource, from two sessions, in
    strictly increasing order, and each is the zxid of its own write."""
    first, second = make_source(), make_source()
    task_ids = [f"task-{n}" for n in range(20)]
    transient = [first.mint_transient(task_id) for task_id in task_ids]
    assert [token.resource for token in transient] == task_ids
    assert [token.value for token in transient] == sorted({token.value for token in transient})
    assert not admin.exists(f"{first.root}/tokens") or admin.get_children(f"{first.root}/tokens") == []
    _, stat = admin.get(f"{first.root}/transient")
    assert stat.mzxid << SCALE_BITS == transient[-1].value
    assert transient[-1].grantor == first.grantor_id()

    mixed = []
    for n in range(12):
        source = (first, second)[n % 2]
        mint = source.mint_transient if n % 3 else source.mint
        mixed.append(mint("task-mixed").value)
    assert mixed == sorted(set(mixed)), mixed
    assert mixed[0] > transient[-1].value
    with pytest.raises(InvalidTokenError):
        first.mint_transient("")


# Connection trouble -------------------------------------------------------------------


def test_suspended_session_refuses_and_nothing_runs_later(
    zookeeper_server: ZooKeeperServer, make_source: Callable[..., ZooKeeperTokenSource]
) -> None:
    """While SUSPENDED, mint raises within its timeout and queues nothing that runs once the session resumes."""
    # A restarted standalone server restores its sessions, so this client resumes the
    # *same* session: exactly when kazoo would send requests it queued while suspended.
    # The longest session the server allows and a reconnect at least twice a second,
    # so a slow JVM restart on a busy machine does not expire the session.
    with started_client(
        zookeeper_server.hosts, timeout=20.0, connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5)
    ) as client:
        source = make_source(client=client)
        last = source.mint("acct:3").value
        session_id = client.client_id[0]
        zookeeper_server.stop()
        wait_for(lambda: source.state == "SUSPENDED", 15, "the client to notice the server is gone")
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(TokenUnavailableError, match="SUSPENDED"):
                source.mint("acct:3", timeout=0.5)
            assert time.monotonic() - started < 2.0
        zookeeper_server.start()
        wait_for(lambda: source.state == "CONNECTED", 30, "the session to come back")
        assert client.client_id[0] == session_id, "the session expired; the test proves nothing"
        # kazoo sends what it queued, in order, before this sync, and ZooKeeper answers a
        # session's requests in order: the read below sees any write a refused mint queued.
        client.sync(f"{source.root}/tokens/acct:3")
        _, stat = client.get(f"{source.root}/tokens/acct:3")
        assert stat.mzxid << SCALE_BITS == last, "a refused mint reached ZooKeeper after all"
        assert source.mint("acct:3").value > last


def test_frozen_server_bounds_an_in_flight_mint(
    zookeeper_server: ZooKeeperServer, make_source: Callable[..., ZooKeeperTokenSource]
) -> None:
    """A server that stops answering mid-session (SIGSTOP) makes mint raise within its timeout, not hang."""
    source = make_source()
    source.mint("acct:11")
    zookeeper_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(TokenUnavailableError):
            source.mint("acct:11", timeout=1.0)
        # Well inside the 10 s session timeout a hung call would reach; loose, as the suite runs loaded.
        assert time.monotonic() - started < 5.0
    finally:
        zookeeper_server.resume()
    assert source.mint("acct:11", timeout=30).value > 0


def test_state_listeners_hear_suspension_and_recovery(
    zookeeper_server: ZooKeeperServer, make_source: Callable[..., ZooKeeperTokenSource]
) -> None:
    """State listeners get CONNECTED, then SUSPENDED when the server goes, then CONNECTED again; removal works."""
    # The server's longest session (20 s): a restart on a loaded machine must not outlast it (LOST, not CONNECTED).
    source = make_source(session_timeout=20.0)
    heard: queue.Queue[str] = queue.Queue()
    removed: list[str] = []
    source.add_state_listener(heard.put)
    source.add_state_listener(removed.append)
    source.remove_state_listener(removed.append)
    source.remove_state_listener(removed.append)  # not registered any more: ignored
    source.connect()
    assert heard.get(timeout=10) == "CONNECTED"
    zookeeper_server.restart()
    assert heard.get(timeout=30) == "SUSPENDED"
    assert heard.get(timeout=30) == "CONNECTED"
    assert not removed


def test_unreachable_server_bounds_mint_connect_and_lease() -> None:
    """With nothing listening, mint, connect and lease each raise TokenUnavailableError within their timeout."""
    (port,) = free_ports(1)
    source = ZooKeeperTokenSource(f"127.0.0.1:{port}", root="/nowhere")
    try:
        for call in (
            lambda: source.mint("r", timeout=0.5),
            lambda: source.connect(timeout=0.5),
            lambda: source.lease("r", timeout=0.5).__enter__(),
        ):
            started = time.monotonic()
            with pytest.raises(TokenUnavailableError):
                call()
            assert time.monotonic() - started < 2.0
    finally:
        started = time.monotonic()
        source.close()
        assert time.monotonic() - started < source.timeout + 1.0


def test_closed_source_refuses_and_close_is_idempotent(make_source: Callable[..., ZooKeeperTokenSource]) -> None:
    """After close(), mint and lease raise TokenUnavailableError; closing twice is harmless."""
    source = make_source()
    source.mint("r")
    source.close()
    source.close()
    assert source.state == "CLOSED"
    with pytest.raises(TokenUnavailableError, match="closed"):
        source.mint("r")
    with pytest.raises(TokenUnavailableError, match="closed"), source.lease("r"):
        pass


# Client ownership and fork ------------------------------------------------------------


@pytest.fixture
def callers_client(zookeeper_server: ZooKeeperServer) -> Iterator[KazooClient]:
    """A KazooClient of the test's own on the standalone server, to hand to a source as the caller's client."""
    with started_client(zookeeper_server.hosts) as client:
        yield client


def test_callers_client_is_not_stopped_on_close(
    callers_client: KazooClient, make_source: Callable[..., ZooKeeperTokenSource]
) -> None:
    """A source given a caller's KazooClient leaves it connected and usable when it closes."""
    source = make_source(client=callers_client)
    source.mint("r")
    source.close()
    assert callers_client.connected
    assert callers_client.exists(f"{source.root}/tokens/r") is not None


def _mint_in_child(source: ZooKeeperTokenSource, results: multiprocessing.Queue[object]) -> None:
    try:
        results.put(source.mint("forked", timeout=20).value)
    except Exception as exc:
        results.put(exc)


def _run_forked(source: ZooKeeperTokenSource) -> object:
    ctx = multiprocessing.get_context("fork")
    results: multiprocessing.Queue[object] = ctx.Queue()
    child = ctx.Process(target=_mint_in_child, args=(source, results))
    child.start()
    try:
        return results.get(timeout=60)
    finally:
        child.join(30)
        if child.is_alive():  # pragma: no cover - only on a hang, which the assertion reports
            child.kill()


def test_own_client_is_rebuilt_in_a_forked_child(make_source: Callable[..., ZooKeeperTokenSource]) -> None:
    """After fork, a source's own client is replaced in the child, and the parent's session is untouched."""
    source = make_source()
    first = source.mint("forked").value
    in_child = _run_forked(source)
    assert isinstance(in_child, int) and in_child > first
    assert source.state == "CONNECTED"
    assert source.mint("forked").value > in_child


def test_callers_client_is_refused_in_a_forked_child(
    callers_client: KazooClient, make_source: Callable[..., ZooKeeperTokenSource]
) -> None:
    """A caller's KazooClient that crossed fork is refused with a FencingConfigurationError naming the cause."""
    source = make_source(client=callers_client)
    source.mint("forked")
    in_child = _run_forked(source)
    assert isinstance(in_child, FencingConfigurationError)
    assert "fork" in str(in_child)
    source.mint("forked")


# URLs and arguments -------------------------------------------------------------------


def test_url_builds_a_configured_source() -> None:
    """token_source_from_url reads hosts, root, timeout and session_timeout, and connects only on use."""
    source = token_source_from_url("zookeeper://h1:2181,[::1]:2182,h3/app/fence?timeout=2.5&session_timeout=8")
    assert isinstance(source, ZooKeeperTokenSource)
    assert (source.hosts, source.root, source.timeout, source.session_timeout) == (
        "h1:2181,[::1]:2182,h3",
        "/app/fence",
        2.5,
        8.0,
    )
    assert source.state == "NOT_STARTED"
    source.close()
    default = ZooKeeperTokenSource.from_url("zookeeper://h1:2181/")
    assert default.root == "/fencing"
    default.close()


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("zookeeper:///root", "names no host"),
        # Digest credentials are accepted since ZooKeeper ACL support; a user without a password is not.
        ("zookeeper://user@h:2181/root", "credentials"),
        ("zookeeper://h:notaport/root", "malformed ZooKeeper host"),
        ("zookeeper://h:70000/root", "out of range"),
        ("zookeeper://h:2181,,h2:2181/root", "malformed ZooKeeper host"),
        ("zookeeper://h:2181/zookeeper/x", "reserves"),
        ("zookeeper://h:2181/a//b", "empty, '.' or '..'"),
        ("zookeeper://h:2181/a/../b", "empty, '.' or '..'"),
        ("zookeeper://h:2181/r?session_timeout=0", "session_timeout='0'"),
        ("zookeeper://h:2181/r?chroot=/x", "unknown parameter(s) chroot"),
        ("zookeeper://h:2181/r#frag", "fragment"),
    ],
    ids=repr,
)
def test_bad_urls_name_the_problem(url: str, names: str) -> None:
    """A malformed zookeeper:// URL raises FencingConfigurationError whose message names what is wrong."""
    with pytest.raises(FencingConfigurationError) as info:
        token_source_from_url(url)
    assert names in str(info.value)


def test_hosts_xor_client() -> None:
    """Exactly one of hosts= and client= is required."""
    with pytest.raises(FencingConfigurationError, match="exactly one"):
        ZooKeeperTokenSource()
    with pytest.raises(FencingConfigurationError, match="exactly one"):
        ZooKeeperTokenSource("h:2181", client=KazooClient("h:2181"))


# Exclusive mode -----------------------------------------------------------------------


def _lock_children(admin: KazooClient, source: ZooKeeperTokenSource, resource: str) -> list[str]:
    return list(admin.get_children(f"{source.root}/locks/{resource_to_znode_name(resource)}"))


def test_second_holder_waits_bounded_then_gets_a_larger_token(
    make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient
) -> None:
    """A second lease waits for the first, gives up at its timeout leaving no lock node, then gets a larger token."""
    first_source, second_source = make_source(), make_source()
    with first_source.lease("acct:4") as first:
        started = time.monotonic()
        with pytest.raises(TokenUnavailableError, match="another holder"), second_source.lease("acct:4", timeout=1.0):
            pass
        assert 1.0 <= time.monotonic() - started < 3.0
        # The loser's lock node is deleted without making it wait past its timeout: poll.
        own = [first.lock_path.rsplit("/", 1)[1]]
        wait_for(lambda: _lock_children(admin, first_source, "acct:4") == own, 10, "the loser's lock node to go")
        first.check()
    with second_source.lease("acct:4", timeout=5) as second:
        assert second.token > first.token
    assert _lock_children(admin, first_source, "acct:4") == []


def test_expired_session_hands_the_lease_over_and_tells_the_holder(
    zookeeper_server: ZooKeeperServer, make_source: Callable[..., ZooKeeperTokenSource]
) -> None:
    """Expiring the holder's session hands the lease over with a larger token; the holder's flag and callback fire."""
    with started_client(zookeeper_server.hosts, timeout=4.0) as holder_client:
        holder = make_source(client=holder_client)
        waiter = make_source()
        told = threading.Event()
        handed: queue.Queue[object] = queue.Queue()
        proceed = threading.Event()

        def wait_for_lease() -> None:
            try:
                with waiter.lease("acct:5", timeout=30) as lease:
                    handed.put(lease)
                    proceed.wait(30)
            except Exception as exc:
                handed.put(exc)

        with holder.lease("acct:5") as first:
            first.on_lost(lambda lease: told.set())
            thread = threading.Thread(target=wait_for_lease)
            thread.start()
            expire_session(holder_client, zookeeper_server.hosts)

            second = handed.get(timeout=30)
            assert isinstance(second, ZooKeeperLease), second
            assert second.token > first.token
            assert first.wait_lost(10)
            assert told.wait(10)
            with pytest.raises(LeaseLostError):
                first.check()
            with pytest.raises(LeaseLostError):
                first.mint()
            second.check()
            proceed.set()
        thread.join(30)


def test_holder_without_its_lock_node_cannot_mint_before_it_is_told(
    callers_client: KazooClient, make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient
) -> None:
    """With the lock node gone but the watch not yet delivered, the multi-op itself refuses to mint."""
    source = make_source(client=callers_client)
    with source.lease("acct:6") as lease:
        token_path = f"{source.root}/tokens/acct:6"
        _, before = admin.get(token_path)
        # Hold kazoo's callback thread (which delivers watches) inside a watch of our own.
        blocking, release = threading.Event(), threading.Event()

        def block(_event: object) -> None:
            blocking.set()
            release.wait(30)

        callers_client.exists(f"{source.root}/blocker", watch=block)
        admin.create(f"{source.root}/blocker")
        assert blocking.wait(10)
        try:
            admin.delete(lease.lock_path)
            assert not lease.lost, "the deletion watch should still be queued"
            with pytest.raises(LeaseLostError, match="no longer exists"):
                lease.mint()
            assert lease.lost
        finally:
            release.set()
        _, after = admin.get(token_path)
        assert after.mzxid == before.mzxid, "a holder without its lock node minted"


def test_deleted_lock_node_marks_the_lease_lost(
    make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient
) -> None:
    """When the holder's lock node is deleted, the watch marks the lease lost and runs its callback."""
    source = make_source()
    with source.lease("acct:7") as lease:
        told = threading.Event()
        lease.on_lost(lambda _lease: told.set())
        admin.delete(lease.lock_path)
        assert lease.wait_lost(10)
        assert told.wait(10)
        assert lease.lost_reason is not None and "deleted" in lease.lost_reason


def test_suspended_session_marks_the_lease_lost(
    zookeeper_server: ZooKeeperServer, make_source: Callable[..., ZooKeeperTokenSource]
) -> None:
    """A holder whose connection is suspended is told at once: its lock may already be someone else's."""
    source = make_source(session_timeout=2.0)
    with source.lease("acct:8") as lease:
        zookeeper_server.pause()
        try:
            assert lease.wait_lost(15)
            assert "SUSPENDED" in (lease.lost_reason or "")
            with pytest.raises(LeaseLostError):
                lease.check()
        finally:
            zookeeper_server.resume()


def test_callback_registered_after_loss_still_runs(
    make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient
) -> None:
    """on_lost on an already lost lease calls the callback, once."""
    source = make_source()
    with source.lease("acct:9") as lease:
        admin.delete(lease.lock_path)
        assert lease.wait_lost(10)
        calls: queue.Queue[ZooKeeperLease] = queue.Queue()
        lease.on_lost(calls.put)
        assert calls.get(timeout=10) is lease
        assert calls.empty()


# Ensemble -----------------------------------------------------------------------------


def test_minting_continues_across_a_leader_kill(zookeeper_ensemble: ZooKeeperEnsemble, unique_name: str) -> None:
    """Minting while the leader is killed -9 goes on after re-election, every value above all earlier ones."""
    source = ZooKeeperTokenSource(zookeeper_ensemble.hosts, root=f"/{unique_name}", session_timeout=6.0)
    values: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def mint_forever() -> None:
        while not stop.is_set():
            try:
                values.append(source.mint("acct:10", timeout=10).value)
            except TokenUnavailableError as exc:  # during the election: allowed, and reported
                errors.append(exc)
            except BaseException as exc:  # pragma: no cover - fails the test below
                errors.append(exc)
                return

    thread = threading.Thread(target=mint_forever)
    thread.start()
    try:
        # Generous deadlines: a 3-node ensemble fsyncs every write, and CI machines are loaded.
        wait_for(lambda: len(values) >= 20, 90, "minting to get going")
        killed_at = len(values)
        zookeeper_ensemble.kill_leader()
        wait_for(lambda: len(values) >= killed_at + 20, 90, "minting to resume after the election")
    finally:
        stop.set()
        thread.join(30)
        source.close()
    assert all(isinstance(exc, TokenUnavailableError) for exc in errors), errors
    assert all(b > a for a, b in itertools.pairwise(values))
    # The new leader's epoch (high 32 bits of the zxid) is above the old one.
    assert values[-1] >> 32 > values[0] >> 32
