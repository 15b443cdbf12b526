"""RedisGate on a real Redis Cluster of three masters: hash-tagged keys work, a key outside its slot is refused.

In a cluster a script may only touch keys of one slot. With one hash tag in
the resource and the same tag in its data keys, every gated operation,
exactly-once records included, runs as on a single server. A data key
outside the resource's slot is a programming error: it is refused before any
I/O with both slots named, instead of the cluster's raw CROSSSLOT error,
which a task would retry as an outage.

The whole gate contract suite runs on the same cluster too (the
``redis_cluster`` adapter, one hash tag per test); this file pins what only a
cluster has.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from celery_fencing import AlreadyAppliedError, FencingToken, InvalidArgumentError, RedisGate, StaleTokenError
from celery_fencing.context import Execution, token_context
from tests.fixtures.redis_cluster import RedisClusterServers


@pytest.fixture
def cluster_gate(redis_cluster: RedisClusterServers) -> Iterator[tuple[RedisGate, RedisCluster, str]]:
    client = redis_cluster.client(decode_responses=True)
    tag = uuid.uuid4().hex[:8]
    gate = RedisGate(client, prefix=f"t{tag}")
    gate.arm(0, resource=f"any:{{{tag}}}")  # a new store: in a cluster, one floor per hash tag
    yield gate, client, tag
    client.close()


def test_tagged_keys_fence_as_on_one_server(cluster_gate: tuple[RedisGate, RedisCluster, str]) -> None:
    """Claim, set, hset, eval and delete with the resource's hash tag; a stale token is refused."""
    gate, client, tag = cluster_gate
    resource, key = f"account:{{{tag}}}", f"account:{{{tag}}}:balance"
    gate.claim(FencingToken(resource, 5))
    gate.set(FencingToken(resource, 5), key, "100")
    gate.hset(FencingToken(resource, 6), f"{key}:h", {"a": "1"})
    assert gate.eval(FencingToken(resource, 7), "return redis.call('GET', KEYS[1])", [key]) == "100"
    with pytest.raises(StaleTokenError):
        gate.set(FencingToken(resource, 4), key, "stale")
    gate.delete(FencingToken(resource, 8), f"{key}:h")
    assert client.get(key) == "100" and gate.high_water(resource) == 8


def test_exactly_once_records_live_in_the_resources_slot(cluster_gate: tuple[RedisGate, RedisCluster, str]) -> None:
    """A second execution of one task id is refused as already applied, in the cluster too."""
    gate, client, tag = cluster_gate
    resource, key = f"account:{{{tag}}}", f"account:{{{tag}}}:balance"
    for value in (1, 2):
        token = FencingToken(resource, value)
        with token_context(Execution(token, task_id="task-1", once=True)):
            if value == 1:
                gate.set(None, key, "applied once")
            else:
                with pytest.raises(AlreadyAppliedError):
                    gate.set(None, key, "applied twice")
    assert client.get(key) == "applied once"
    assert gate.applied(resource, "task-1") is not None


def test_a_key_outside_the_resources_slot_is_refused_before_any_io(
    cluster_gate: tuple[RedisGate, RedisCluster, str],
) -> None:
    """A data key without the resource's tag: InvalidArgumentError naming both slots; nothing is written."""
    gate, client, tag = cluster_gate
    resource, stray = f"account:{{{tag}}}", f"balance-of-{tag}"
    with pytest.raises(InvalidArgumentError, match=r"hashes to slot \d+, but the fence keys .* are in slot \d+"):
        gate.set(FencingToken(resource, 1), stray, "100")
    with pytest.raises(InvalidArgumentError, match="hash tag"):
        gate.eval(FencingToken(resource, 1), "return 1", [stray])
    assert client.get(stray) is None and gate.high_water(resource) is None


def test_a_resource_without_a_tag_is_refused(cluster_gate: tuple[RedisGate, RedisCluster, str]) -> None:
    """Without a hash tag the resource's own mark and grantor keys fall in different slots: refused, named."""
    gate, _, tag = cluster_gate
    with pytest.raises(InvalidArgumentError, match="slot"):
        gate.claim(FencingToken(f"account-{tag}", 1))
