"""Property-based tests (hypothesis) for grantor ids and signatures: the version 2 and 3 wire forms round-trip
and refuse junk, and every gate (MemoryGate, Redis, SQLite and PostgreSQL SQLGate) follows a small model of
marks with grantors for any sequence of claims and writes, including tokens of other grantors and none."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_fencing import (
    MAX_TOKEN_VALUE,
    FencingToken,
    GrantorMismatchError,
    MemoryGate,
    RedisGate,
    SQLGate,
    StaleTokenError,
    TokenSigner,
)
from celery_fencing.token import MAX_RESOURCE_LENGTH, Mark
from tests.fixtures.services import armed
from tests.security.test_properties import parse_round_trip_or_refuse

resources = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=MAX_RESOURCE_LENGTH)
grantor_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", fullmatch=True)
values = st.one_of(
    st.integers(min_value=1, max_value=MAX_TOKEN_VALUE),
    st.sampled_from([1, 2**53, 2**53 + 1, MAX_TOKEN_VALUE]),
)
SIGNER = TokenSigner({"k1": "k" * 32})


@given(resources, values, st.one_of(st.none(), grantor_ids), st.booleans())
def test_versioned_headers_round_trip(resource: str, value: int, grantor: str | None, signed: bool) -> None:
    """Every token, with or without a grantor, signed or not, survives to_header() and from_header(), signature too."""
    token = FencingToken(resource, value, grantor)
    if signed and grantor is not None:
        token = SIGNER.sign(token)
    parsed = FencingToken.from_header(token.to_header())
    assert parsed == token and parsed.grantor == token.grantor and parsed.signature == token.signature
    if token.signature is not None:
        SIGNER.verify(parsed)


@given(st.text(max_size=400).map(lambda text: st_prefix(text)))
def test_versioned_header_parser_never_crashes(header: str) -> None:
    """Any text after a version prefix either parses to a token that round-trips, or raises InvalidTokenError."""
    parse_round_trip_or_refuse(header)


def st_prefix(text: str) -> str:
    # Half the inputs start like a real header, so the parser's later checks are reached.
    return ("2:zk-a:" + text) if len(text) % 2 else ("3:zk-a:5:k1:" + text)


GRANTORS = ["zk-old", "zk-new", None]
ops = st.lists(
    st.tuples(st.sampled_from(["claim", "write"]), st.sampled_from(["a", "b"]), values, st.sampled_from(GRANTORS)),
    max_size=20,
)


#: For a model test on a database gate: fewer examples (each is a round of SQL statements), and the gate's
#: fixture reused across them (each example names its resources and keys under a namespace of its own).
ON_A_DATABASE = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _check_against_model(gate: Any, write: Any, operations: list[tuple[str, str, int, str | None]], ns: str) -> None:
    """The model: another grantor's token is refused first, then value >= mark passes; a grantor-less mark adopts."""
    marks: dict[str, tuple[int, str | None]] = {}
    for op, name, value, grantor in operations:
        resource = f"{ns}{name}"
        token = FencingToken(resource, value, grantor)
        mark, owner = marks.get(name, (None, None))
        try:
            gate.claim(token) if op == "claim" else write(token)
        except GrantorMismatchError as exc:
            assert owner is not None and grantor is not None and grantor != owner
            assert (exc.token_grantor, exc.expected_grantor) == (grantor, owner)
        except StaleTokenError as exc:
            assert not (owner is not None and grantor is not None and grantor != owner)
            assert mark is not None and value < mark and exc.high_water == mark
        else:
            assert owner is None or grantor is None or grantor == owner
            assert mark is None or value >= mark
            marks[name] = (value, owner if grantor is None else grantor)
        expected = marks.get(name)
        assert gate.mark(resource) == (None if expected is None else Mark(resource, *expected))


@settings(max_examples=150, deadline=None)
@given(ops)
def test_memory_gate_follows_the_grantor_model(operations: list[tuple[str, str, int, str | None]]) -> None:
    """MemoryGate's marks and grantors follow the model for any sequence."""
    gate = MemoryGate()
    _check_against_model(gate, lambda token: gate.set(token, f"key-{token.resource}", 1), operations, "")


@pytest.fixture(scope="module")
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops)
def test_redis_gate_follows_the_grantor_model(
    redis_client: redis.Redis, operations: list[tuple[str, str, int, str | None]]
) -> None:
    """RedisGate on the real server follows the same model, in its Lua scripts."""
    ns = "gp" + uuid.uuid4().hex[:10] + ":"
    gate = armed(RedisGate(redis_client, prefix=ns + "fence"))
    try:
        _check_against_model(gate, lambda token: gate.set(token, f"{ns}key-{token.resource}", 1), operations, ns)
    finally:
        keys = list(redis_client.scan_iter(f"{ns}*"))
        if keys:
            redis_client.delete(*keys)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def sql_gate(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SQLGate]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('grantor-props') / 'marks.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    engine = sa.create_engine(url)
    gate = SQLGate(engine, table="hwp_" + uuid.uuid4().hex[:10])
    gate.create_schema()
    yield gate
    gate.table.drop(engine, checkfirst=True)
    engine.dispose()


@ON_A_DATABASE
@given(ops)
def test_sql_gate_follows_the_grantor_model(
    sql_gate: SQLGate, operations: list[tuple[str, str, int, str | None]]
) -> None:
    """SQLGate's one-statement upsert follows the same model on SQLite and PostgreSQL."""
    ns = uuid.uuid4().hex[:10] + ":"
    _check_against_model(sql_gate, sql_gate.claim, operations, ns)
