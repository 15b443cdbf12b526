"""ZooKeeperTokenSource.mint_many (pipelined minting) and prune (idle znodes), against a real ZooKeeper."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from celery_fencing import FencingConfigurationError, InvalidTokenError, TokenUnavailableError
from celery_fencing.blocks import SCALE_BITS
from celery_fencing.sources.zookeeper import ZooKeeperTokenSource, resource_to_znode_name
from tests.fixtures.zookeeper import ZooKeeperServer


@pytest.fixture
def source(zookeeper_server: ZooKeeperServer, unique_name: str) -> Iterator[ZooKeeperTokenSource]:
    with ZooKeeperTokenSource(zookeeper_server.hosts, root=f"/{unique_name}", timeout=10) as built:
        yield built


def test_mint_many_returns_the_zxid_of_each_resources_own_write_in_order(
    source: ZooKeeperTokenSource, admin: KazooClient
) -> None:
    """Each token of mint_many is its resource znode's mzxid, returned in the order the resources were named."""
    source.mint("old")
    resources = ["old", "new/1", "new 2", "old"]
    tokens = source.mint_many(resources)
    assert [token.resource for token in tokens] == resources
    for name in ("new/1", "new 2", "old"):
        stat = admin.exists(f"{source.root}/tokens/{resource_to_znode_name(name)}")
        assert stat is not None
        assert max(token.value for token in tokens if token.resource == name) == stat.mzxid << SCALE_BITS
    assert tokens[0].value < tokens[3].value, "a resource named twice gets two tokens, the later one larger"
    assert len({token.value for token in tokens}) == len(tokens), "one write per token"


def test_mint_many_tokens_interleave_strictly_with_mint(source: ZooKeeperTokenSource) -> None:
    """Tokens from mint, mint_many and mint again strictly increase for every resource."""
    names = [f"r{n}" for n in range(50)]
    before = {name: source.mint(name).value for name in names[:25]}
    batch = source.mint_many(names)
    after = {name: source.mint(name).value for name in names}
    for token in batch:
        assert before.get(token.resource, 0) < token.value < after[token.resource]


def test_mint_many_of_nothing_sends_nothing(source: ZooKeeperTokenSource) -> None:
    """An empty batch returns an empty list without connecting."""
    assert source.mint_many([]) == []
    assert source.state == "NOT_STARTED"


def test_mint_many_refuses_an_invalid_resource_before_sending(source: ZooKeeperTokenSource, admin: KazooClient) -> None:
    """One invalid resource name fails the whole batch with InvalidTokenError before any write."""
    with pytest.raises(InvalidTokenError):
        source.mint_many(["fine", ""])
    assert admin.exists(f"{source.root}/tokens/fine") is None


def test_mint_many_times_out_when_the_server_does_not_answer(
    source: ZooKeeperTokenSource, zookeeper_server: ZooKeeperServer
) -> None:
    """A paused server makes mint_many raise TokenUnavailableError within its timeout, never hang."""
    source.mint("warm")
    zookeeper_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(TokenUnavailableError):
            source.mint_many([f"p{n}" for n in range(20)], timeout=1.5)
        assert time.monotonic() - started < 5
    finally:
        zookeeper_server.resume()


def test_prune_deletes_idle_znodes_and_later_tokens_still_exceed_earlier_ones(
    source: ZooKeeperTokenSource, admin: KazooClient
) -> None:
    """Pruned resources lose their znodes; minted again, they get tokens above every token minted before."""
    idle = [f"idle{n}" for n in range(20)]
    before = source.mint_many(idle)
    with source.lease("idle0") as lease:
        leased = lease.token
    time.sleep(1.2)
    fresh = source.mint("fresh")
    assert source.prune(older_than=1.0) == len(idle)
    assert admin.exists(f"{source.root}/tokens/idle3") is None
    assert admin.exists(f"{source.root}/locks/idle0") is None, "the empty lock directory went too"
    assert admin.exists(f"{source.root}/tokens/fresh") is not None, "a recently minted resource is kept"
    highest = max([token.value for token in before] + [leased.value, fresh.value])
    again = source.mint_many(idle)
    assert min(token.value for token in again) > highest
    assert source.mint("idle0").value > again[0].value
    with source.lease("idle0") as lease:
        assert lease.token.value > highest


def test_prune_keeps_a_lock_directory_with_a_holder(source: ZooKeeperTokenSource, admin: KazooClient) -> None:
    """A resource whose lease is held keeps its lock directory; the holder can still mint under it."""
    with source.lease("held") as lease:
        first = lease.token
        time.sleep(1.2)
        assert source.prune(older_than=1.0) == 1
        assert admin.exists(f"{source.root}/locks/held") is not None
        assert lease.mint().value > first.value
        assert not lease.lost


def test_prune_of_an_empty_root_and_bad_arguments(source: ZooKeeperTokenSource) -> None:
    """prune on a root never minted under deletes nothing; a negative age is a configuration error."""
    assert source.prune(older_than=0) == 0
    with pytest.raises(FencingConfigurationError):
        source.prune(older_than=-1)
    with pytest.raises(FencingConfigurationError):
        source.prune(older_than=1, window=0)


def test_first_mint_in_a_process_falls_back_from_create_to_set_data(
    source: ZooKeeperTokenSource, zookeeper_server: ZooKeeperServer, admin: KazooClient
) -> None:
    """A source that never wrote a resource's znode tries create first; the znode existing, it writes setData."""
    first = source.mint("shared")
    with ZooKeeperTokenSource(zookeeper_server.hosts, root=source.root, timeout=10) as other:
        second = other.mint("shared")
        third, fourth = other.mint_many(["shared", "shared"])
    stat = admin.exists(f"{source.root}/tokens/shared")
    assert stat is not None
    assert first.value == stat.czxid << SCALE_BITS < second.value < third.value < fourth.value
    assert fourth.value == stat.mzxid << SCALE_BITS
    assert stat.version == 3, "one create, then one setData per later token"
