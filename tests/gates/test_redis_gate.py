"""RedisGate specifics: exact 63-bit comparison, script loading, eval, hashes, cluster layout, failures."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from redis.backoff import ExponentialBackoff
from redis.crc import key_slot
from redis.retry import Retry

from celery_fencing import (
    FencingConfigurationError,
    FencingToken,
    GateUnavailableError,
    InvalidTokenError,
    MemoryTokenSource,
    RedisGate,
    ResourceMismatchError,
    StaleTokenError,
)
from celery_fencing.gates.redis import decode_mark, encode_mark
from tests.fixtures.services import armed

T = FencingToken


@pytest.fixture(params=[False, True], ids=["bytes", "decoded"])
def client(request: pytest.FixtureRequest, redis_url: str, unique_name: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=request.param, socket_connect_timeout=5)
    yield client
    keys = list(client.scan_iter(match=f"{unique_name}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def gate(client: redis.Redis, unique_name: str) -> RedisGate:
    return armed(RedisGate(client, prefix=unique_name))


@pytest.fixture
def key(unique_name: str) -> str:
    return f"{unique_name}-data"


def _closed_port() -> int:
    # Bind, note the port, close: nothing listens there, so connecting is refused at once.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# Exactness ---------------------------------------------------------------------


def test_lua_numbers_cannot_tell_2_53_from_2_53_plus_1(client: redis.Redis) -> None:
    """Negative control: compared as Lua numbers (doubles), 2**53 + 1 equals 2**53."""
    same = client.eval("return tonumber(ARGV[1]) == tonumber(ARGV[2]) and 1 or 0", 0, 2**53, 2**53 + 1)
    assert same == 1


def test_2_53_is_stale_after_2_53_plus_1(gate: RedisGate, key: str) -> None:
    """The gate compares exactly where doubles cannot: 2**53 is refused after 2**53 + 1."""
    gate.set(T("r", 2**53 + 1), key, "newer")
    with pytest.raises(StaleTokenError) as info:
        gate.set(T("r", 2**53), key, "older")
    assert info.value.high_water == 2**53 + 1
    assert gate.high_water("r") == 2**53 + 1


def test_largest_token_is_exact(gate: RedisGate, key: str) -> None:
    """2**63 - 1 is accepted and stored exactly; 2**63 - 2 is then refused."""
    gate.claim(T("r", 2**63 - 2))
    gate.set(T("r", 2**63 - 1), key, "v")
    with pytest.raises(StaleTokenError):
        gate.claim(T("r", 2**63 - 2))
    assert gate.high_water("r") == 2**63 - 1


def test_marks_are_stored_as_fixed_width_decimal_strings(gate: RedisGate, client: redis.Redis) -> None:
    """The stored mark is 20 zero-padded digits, which is what makes string order numeric order."""
    gate.claim(T("r", 42))
    raw = client.get(gate.mark_key("r"))
    assert raw in (b"00000000000000000042", "00000000000000000042")
    assert encode_mark(2**63 - 1) == "09223372036854775807"
    assert decode_mark(encode_mark(2**63 - 1)) == 2**63 - 1


def test_corrupt_mark_is_refused_not_misread(gate: RedisGate, client: redis.Redis, key: str) -> None:
    """A mark key holding something else than 20 digits makes the gate fail rather than compare it."""
    client.set(gate.mark_key("r"), "34")
    with pytest.raises(GateUnavailableError):
        gate.set(T("r", 5), key, "v")
    with pytest.raises(GateUnavailableError):
        gate.claim(T("r", 5))
    with pytest.raises(GateUnavailableError):
        gate.high_water("r")
    assert client.get(key) is None


@pytest.mark.parametrize(
    "junk", ["x" * 20, "not a floor, not digits at all", "0000000000000000004x:g", "00000000000000000005junk"]
)
def test_a_floor_key_holding_no_floor_refuses_every_token(
    gate: RedisGate, client: redis.Redis, key: str, junk: str, unique_name: str
) -> None:
    """A floor key overwritten with something else fails closed: every token refused, arming leaves the key alone."""
    client.set(gate.floor_key("r"), junk)
    fresh_process = RedisGate(client, prefix=unique_name)  # has not looked at the floor key yet
    assert fresh_process.ensure_armed("r", MemoryTokenSource()) is None, "no floor to skip below, and no error"
    for token in (T("r", 5), T("r", 2**62)):
        with pytest.raises(GateUnavailableError, match="floor key does not hold"):
            gate.set(token, key, "v")
        with pytest.raises(GateUnavailableError, match="floor key does not hold"):
            gate.claim(token)
    assert client.get(key) is None
    assert client.get(gate.floor_key("r")) in (junk, junk.encode())


# Scripts -------------------------------------------------------------------------


@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decoded"])
def test_scripts_reload_after_script_flush(private_redis_url: str, decode: bool, unique_name: str, key: str) -> None:
    """After SCRIPT FLUSH the gate reloads its scripts (NOSCRIPT) and keeps checking tokens.

    On a redis-server of this session's own: SCRIPT FLUSH on the shared one would
    empty the script cache under every other worker's tests.
    """
    client = redis.Redis.from_url(private_redis_url, decode_responses=decode, socket_connect_timeout=5)
    try:
        gate = armed(RedisGate(client, prefix=unique_name))
        gate.set(T("r", 5), key, "a")
        gate.eval(T("r", 5), "return 1", [key], [])
        client.script_flush()
        gate.set(T("r", 6), key, "b")
        assert gate.eval(T("r", 6), "return 1", [key], []) == 1
        gate.claim(T("r", 7))
        with pytest.raises(StaleTokenError):
            gate.set(T("r", 6), key, "c")
        assert client.get(key) in (b"b", "b")
    finally:
        client.close()


def test_eval_runs_a_body_after_the_check(gate: RedisGate, client: redis.Redis, key: str) -> None:
    """The body sees only its own KEYS and ARGV and returns its result; a stale token never runs it."""
    body = "redis.call('INCRBY', KEYS[1], ARGV[1]) return {KEYS[1], ARGV[1], #KEYS, #ARGV}"
    result = gate.eval(T("r", 5), body, [key], [10])
    assert [x.decode() if isinstance(x, bytes) else x for x in result] == [key, "10", 1, 1]
    gate.claim(T("r", 6))
    with pytest.raises(StaleTokenError):
        gate.eval(T("r", 5), body, [key], [10])
    assert int(client.get(key) or 0) == 10
    assert gate.eval(T("r", 6), "return redis.call('GET', KEYS[1])", [key], []) in (b"10", "10")
    assert gate.eval(T("r", 6), "return nil") is None


def test_eval_binds_every_key(gate: RedisGate, client: redis.Redis, key: str) -> None:
    """Keys an eval body wrote belong to its resource: another resource's larger token cannot run on them."""
    other = key + "-2"
    gate.eval(T("a", 5), "redis.call('SET', KEYS[1], 1) redis.call('SET', KEYS[2], 2)", [key, other], [])
    with pytest.raises(ResourceMismatchError):
        gate.eval(T("b", 1000), "redis.call('SET', KEYS[1], 9)", [other], [])
    with pytest.raises(ResourceMismatchError):
        gate.set(T("b", 1000), key, "9")
    assert client.get(other) in (b"2", "2")
    assert gate.high_water("b") is None


def test_failing_eval_body_leaves_the_mark_covering_its_writes(gate: RedisGate, client: redis.Redis, key: str) -> None:
    """A body that fails after writing raises GateUnavailableError, and its token stays the mark.

    Redis keeps the writes a script made before an error, so the mark must
    still refuse every lower token.
    """
    body = "redis.call('SET', KEYS[1], 'partial') return redis.error_reply('boom')"
    with pytest.raises(GateUnavailableError) as info:
        gate.eval(T("r", 9), body, [key], [])
    assert isinstance(info.value.__cause__, redis.ResponseError)
    assert client.get(key) in (b"partial", "partial")
    assert gate.high_water("r") == 9
    with pytest.raises(StaleTokenError):
        gate.set(T("r", 8), key, "older")


def test_hset_and_delete_are_gated(gate: RedisGate, client: redis.Redis, key: str) -> None:
    """hset writes the mapping and delete removes the key, each only with a token not below the mark."""
    gate.hset(T("r", 5), key, {"a": 1, "b": "x"})
    assert client.hgetall(key) in ({b"a": b"1", b"b": b"x"}, {"a": "1", "b": "x"})
    gate.claim(T("r", 7))
    with pytest.raises(StaleTokenError):
        gate.hset(T("r", 6), key, {"a": 2})
    with pytest.raises(StaleTokenError):
        gate.delete(T("r", 6), key)
    assert client.hget(key, "a") in (b"1", "1")
    gate.delete(T("r", 7), key)
    assert client.exists(key) == 0


def test_hset_writes_large_mappings_in_one_script(gate: RedisGate, client: redis.Redis, key: str) -> None:
    """A mapping larger than one unpack() chunk is written whole."""
    mapping = {f"f{i}": i for i in range(2500)}
    gate.hset(T("r", 1), key, mapping)
    assert client.hlen(key) == 2500


def test_deleted_key_stays_bound_to_its_resource(gate: RedisGate, client: redis.Redis, key: str) -> None:
    """After a gated delete, the key still refuses another resource's token."""
    gate.set(T("a", 5), key, "v")
    gate.delete(T("a", 5), key)
    with pytest.raises(ResourceMismatchError):
        gate.set(T("b", 1000), key, "w")
    assert client.exists(key) == 0


def test_set_with_expiry(gate: RedisGate, client: redis.Redis, key: str) -> None:
    """ex sets the key's time to live, in seconds or as a timedelta; a bad expiry is refused before any I/O."""
    gate.set(T("r", 1), key, "v", ex=100)
    assert 0 < client.pttl(key) <= 100_000
    gate.set(T("r", 1), key, "v", ex=timedelta(milliseconds=1500))
    assert 0 < client.pttl(key) <= 1500
    gate.set(T("r", 1), key, "v")
    assert client.pttl(key) == -1
    for bad in (0, -1, float("nan"), "10"):
        with pytest.raises((TypeError, ValueError)):
            gate.set(T("r", 1), key, "v", ex=bad)  # type: ignore[arg-type]


def test_reads_are_plain_reads(gate: RedisGate, key: str) -> None:
    """get reads through the client without a token; a missing key is None."""
    assert gate.get(key) is None
    gate.set(T("r", 1), key, "v")
    assert gate.get(key) in (b"v", "v")


# Redis Cluster layout -------------------------------------------------------------


def test_cluster_keys_share_the_data_keys_slot() -> None:
    """With one hash tag in the resource and the keys, mark, owner and data keys map to one cluster slot."""
    gate = armed(RedisGate(redis.Redis(), prefix="fencing"))
    resource = "account:{42}"
    data_keys = ["account:{42}:balance", "account:{42}:history"]
    assert gate.mark_key(resource) == "fencing:mark:account:{42}"
    assert gate.owner_key(data_keys[0]) == "fencing:owner:account:{42}:balance"
    slots = {key_slot(k.encode()) for k in [gate.mark_key(resource), *data_keys, *map(gate.owner_key, data_keys)]}
    assert slots == {key_slot(b"42")}
    # Without the tag, the gate's keys land elsewhere: a cluster would refuse the script (CROSSSLOT).
    assert key_slot(gate.mark_key("account:42").encode()) != key_slot(b"account:42:balance")


def test_prefix_with_braces_is_refused() -> None:
    """A prefix containing a brace would capture the hash tag, so the gate refuses it."""
    for prefix in ["{fencing}", "fen{cing", "fen}cing", ""]:
        with pytest.raises(FencingConfigurationError):
            RedisGate(redis.Redis(), prefix=prefix)


# Failures -------------------------------------------------------------------------


def test_unreachable_redis_is_gate_unavailable_fast() -> None:
    """A refused connection raises GateUnavailableError with the redis-py error chained, within a second.

    The bound is the client's: redis-py 8 retries a refused connection ten
    times with backoff by default, so this client retries once.
    """
    client = redis.Redis(
        port=_closed_port(), socket_connect_timeout=1, socket_timeout=1, retry=Retry(ExponentialBackoff(cap=0.05), 1)
    )
    gate = RedisGate(client)
    for call in (
        lambda: gate.claim(T("r", 1)),
        lambda: gate.set(T("r", 1), "k", "v"),
        lambda: gate.high_water("r"),
        lambda: gate.eval(T("r", 1), "return 1"),
    ):
        started = time.monotonic()
        with pytest.raises(GateUnavailableError) as info:
            call()
        assert time.monotonic() - started < 1.0
        assert isinstance(info.value.__cause__, redis.ConnectionError)


def test_bad_input_is_refused_before_any_io() -> None:
    """Bad tokens and keys raise their own errors even when Redis is unreachable: nothing was sent."""
    gate = RedisGate(redis.Redis(port=_closed_port(), socket_connect_timeout=1))
    with pytest.raises(InvalidTokenError):
        gate.set(34.5, "k", "v")  # type: ignore[arg-type]
    with pytest.raises(InvalidTokenError):
        gate.claim(None)
    with pytest.raises(InvalidTokenError):
        gate.high_water("")
    with pytest.raises(TypeError):
        gate.set(T("r", 1), b"k", "v")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        gate.hset(T("r", 1), "k", {})
    with pytest.raises(ValueError):
        gate.eval(T("r", 1), "  ")
