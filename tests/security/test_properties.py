"""Property-based tests (hypothesis): no input crashes the token parser or a gate, or changes
a gate's state outside the rules; every refusal is a FencingError subclass."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_fencing import (
    MAX_TOKEN_VALUE,
    FencingError,
    FencingToken,
    InvalidTokenError,
    MemoryGate,
    RedisGate,
    StaleTokenError,
)
from celery_fencing.token import MAX_RESOURCE_LENGTH
from tests.fixtures.services import armed

resources = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=MAX_RESOURCE_LENGTH)
# Edges where a float comparison would go wrong are drawn often, not left to chance.
values = st.one_of(
    st.integers(min_value=1, max_value=MAX_TOKEN_VALUE),
    st.sampled_from([1, 2**53 - 1, 2**53, 2**53 + 1, 2**53 + 2, MAX_TOKEN_VALUE - 1, MAX_TOKEN_VALUE]),
)
tokens = st.builds(FencingToken, resources, values)
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True),
    st.integers(),
    st.text(max_size=50),
    st.binary(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@given(tokens)
def test_header_round_trip(token: FencingToken) -> None:
    """Every valid token survives to_header() and from_header() unchanged."""
    assert FencingToken.from_header(token.to_header()) == token


@given(st.one_of(st.text(max_size=300), junk))
def test_header_parser_never_crashes(header: Any) -> None:
    """Any input to from_header() either parses to a valid token or raises InvalidTokenError."""
    parse_round_trip_or_refuse(header)


def parse_round_trip_or_refuse(header: Any) -> None:
    """from_header(*header*) raises InvalidTokenError, or gives a token that survives to_header() and back."""
    try:
        token = FencingToken.from_header(header)
    except InvalidTokenError:
        return
    assert FencingToken.from_header(token.to_header()) == token


@given(st.text(max_size=30), values)
def test_header_with_mutated_value_is_refused_or_exact(resource: str, value: int) -> None:
    """A header whose digits are padded, signed or spaced is refused rather than read leniently."""
    for mutated in (f"1:0{value}:{resource}", f"1:+{value}:{resource}", f"1: {value}:{resource}"):
        with pytest.raises(InvalidTokenError):
            FencingToken.from_header(mutated)


@given(junk, junk)
def test_constructor_refuses_junk(resource: Any, value: Any) -> None:
    """FencingToken(resource, value) with junk raises InvalidTokenError, never anything else."""
    try:
        FencingToken(resource, value)
    except InvalidTokenError:
        return
    assert isinstance(resource, str) and isinstance(value, int) and not isinstance(value, bool)


ops = st.lists(st.tuples(st.sampled_from(["claim", "set"]), st.sampled_from(["a", "b"]), values), max_size=25)


def _check_against_model(gate: Any, operations: list[tuple[str, str, int]], ns: str) -> None:
    """Run operations on *gate* and on a two-line model: accept value >= mark, reject below, reject changes nothing."""
    marks: dict[str, int] = {}
    data: dict[str, int] = {}
    for op, resource, value in operations:
        token = FencingToken(f"{ns}{resource}", value)
        key = f"{ns}key-{resource}"
        mark = marks.get(resource)
        try:
            if op == "claim":
                gate.claim(token)
            else:
                gate.set(token, key, str(value))
        except StaleTokenError as exc:
            assert mark is not None and value < mark
            assert exc.high_water == mark and exc.token == value
        else:
            assert mark is None or value >= mark
            marks[resource] = value
            if op == "set":
                data[resource] = value
        assert gate.high_water(f"{ns}{resource}") == marks.get(resource)
        stored = gate.get(key)
        expected = data.get(resource)
        assert (None if stored is None else int(stored)) == expected


@given(ops)
def test_memory_gate_follows_the_rules(operations: list[tuple[str, str, int]]) -> None:
    """MemoryGate's marks and data follow the model for any sequence of claims and writes."""
    _check_against_model(MemoryGate(), operations, "")


@pytest.fixture(scope="module")
def redis_gate(redis_url: str) -> Iterator[RedisGate]:
    prefix = "prop" + uuid.uuid4().hex[:8]
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield armed(RedisGate(client, prefix=prefix))
    keys = list(client.scan_iter(f"*{prefix}*"))
    if keys:
        client.delete(*keys)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops)
def test_redis_gate_follows_the_rules(redis_gate: RedisGate, operations: list[tuple[str, str, int]]) -> None:
    """RedisGate on the real server follows the same model, exactly for any 63-bit values."""
    ns = "p" + uuid.uuid4().hex[:10] + ":"
    gate = armed(RedisGate(redis_gate.client, prefix=ns + "fence"))
    _check_against_model(gate, operations, ns)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk)
def test_redis_gate_refuses_junk_before_io(redis_gate: RedisGate, bad: Any) -> None:
    """Junk in place of a token is refused with a FencingError, and no key is written."""
    key = "junk" + uuid.uuid4().hex
    with pytest.raises(FencingError):
        redis_gate.set(bad, key, "x")
    with pytest.raises(FencingError):
        redis_gate.claim(bad)
    assert redis_gate.get(key) is None
