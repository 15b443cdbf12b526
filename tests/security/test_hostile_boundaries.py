"""Hostile input at every boundary besides the token itself (property-based, hypothesis): source and
gate URLs, fencing_* settings, gate arguments and the command line. Each refuses with a clear
FencingError subclass, never crashes, and changes nothing."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_fencing import (
    FencingConfigurationError,
    FencingError,
    FencingToken,
    InvalidArgumentError,
    MemoryGate,
    RedisGate,
    token_source_from_url,
)
from celery_fencing.celery.settings import SETTINGS
from celery_fencing.cli import main
from celery_fencing.operations.urls import gate_from_url
from tests.fixtures.services import armed

# Ports nothing listens on: a URL that slips through validation reaches no server.
CLOSED = "127.0.0.1:9"

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=40),
    st.binary(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.sampled_from(["9" * 5000, "1e999", "-0", "nan", "inf", " 5 ", "0x10", "\x00", "\uff15"]),
    st.sampled_from([10**400, -(10**400), float("inf"), float("-inf"), 2**63, -1, 0]),
)
hostile_text = st.text(
    alphabet=st.one_of(st.characters(), st.sampled_from(list(":/@?#&=%[],;\\ \t\n\x00"))), max_size=60
)


@contextlib.contextmanager
def in_temp_dir() -> Iterator[str]:
    """Run in a fresh temporary directory: a sqlite:/// URL that is accepted creates its file there."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory() as directory:
        os.chdir(directory)
        try:
            yield directory
        finally:
            os.chdir(old)


def _build_or_refuse(build: Callable[[str], Any], url: str) -> None:
    """Build from *url* in a temporary directory and close what was built, unless *build* raises
    FencingConfigurationError (any other exception fails the test)."""
    # Relative sqlite paths only: an absolute one could name any file on the machine.
    if url.lower().startswith("sqlite:////"):
        url = "sqlite:///" + url[len("sqlite:////") :]
    with in_temp_dir():
        try:
            built = build(url)
        except FencingConfigurationError:
            return
        built.close()


def _url(scheme: str, netloc: str, path: str, query: str) -> str:
    return f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "")


source_urls = st.one_of(
    hostile_text,
    st.builds(
        _url,
        st.sampled_from(["zookeeper", "ZooKeeper", "etcd", "memory", "sqlite", "zk", "redis", ""]),
        st.one_of(hostile_text, st.sampled_from(["", CLOSED, "user:pw@" + CLOSED, "[::1]:99999", "h:0", "a,b"])),
        st.one_of(hostile_text, st.sampled_from(["", "/", "/fencing", "//x", "/zookeeper", "/a/../b", "/%00"])),
        st.one_of(
            hostile_text,
            st.sampled_from(
                ["", "timeout=5", "timeout=-1", "timeout=nan", "timeout=1e999", "session_timeout=0", "x=1", "&&", "a"]
            ),
        ),
    ),
)


@settings(max_examples=300, deadline=None)
@given(source_urls)
def test_source_urls_build_a_source_or_refuse_clearly(url: str) -> None:
    """token_source_from_url either builds a source (connecting to nothing) or raises FencingConfigurationError."""
    _build_or_refuse(token_source_from_url, url)


gate_urls = st.one_of(
    hostile_text,
    st.builds(
        _url,
        st.sampled_from(["redis", "rediss", "unix", "postgresql", "postgres+psycopg", "mysql", "sqlite", "ftp", ""]),
        st.one_of(hostile_text, st.sampled_from(["", CLOSED, "u:p@" + CLOSED, ":pw@" + CLOSED, "[::1]:x"])),
        st.one_of(
            hostile_text, st.sampled_from(["", "/0", "/99999999999999999999", "/db", "/:memory:", "/missing.db"])
        ),
        st.one_of(hostile_text, st.sampled_from(["", "ssl_cert_reqs=none", "db=x", "socket_timeout=abc"])),
    ),
)


@settings(max_examples=300, deadline=None)
@given(gate_urls)
def test_gate_urls_build_a_gate_or_refuse_clearly(url: str) -> None:
    """gate_from_url either builds a gate (sending nothing) or raises FencingConfigurationError."""
    _build_or_refuse(gate_from_url, url)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([s for s in SETTINGS if s.name != "fencing_source"]), junk)
def test_settings_parse_or_refuse_clearly(setting: Any, value: Any) -> None:
    """Every fencing_* setting parses a value or raises FencingConfigurationError naming the setting."""
    try:
        setting.parse(setting.name, value)
    except FencingConfigurationError as exc:
        assert setting.name in str(exc)


@pytest.fixture(scope="module")
def client(redis_url: str) -> Iterator[redis.Redis]:
    built = redis.Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=10)
    yield built
    built.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk, junk, junk, junk)
def test_redis_gate_arguments_refuse_clearly_and_change_nothing(
    client: redis.Redis, key: Any, value: Any, ex: Any, mapping: Any
) -> None:
    """Junk keys, values, expiries, mappings and Lua bodies at a real RedisGate raise a FencingError; no key appears."""
    prefix = "hb" + uuid.uuid4().hex[:10]
    gate = armed(RedisGate(client, prefix=prefix))
    token = FencingToken("r", 5)
    if isinstance(key, str) and key:
        key = f"{prefix}:{key}"  # a key that passes validation is written only under our prefix
    attempts = [
        lambda: gate.set(token, key, value, ex=ex),
        lambda: gate.hset(token, key, mapping),
        lambda: gate.delete(token, key),
        lambda: gate.eval(token, value, [key], [value]),
    ]
    for attempt in attempts:
        try:
            attempt()
        except FencingError:
            continue
    for leftover in client.scan_iter(f"{prefix}*"):
        client.delete(leftover)


@settings(max_examples=200, deadline=None)
@given(junk, junk)
def test_memory_gate_arguments_refuse_clearly(key: Any, value: Any) -> None:
    """MemoryGate refuses a junk key with InvalidArgumentError (also a TypeError/ValueError), changing nothing."""
    gate = MemoryGate()
    try:
        gate.set(FencingToken("r", 1), key, value)
    except InvalidArgumentError as exc:
        assert isinstance(exc, TypeError) and isinstance(exc, ValueError)
        assert gate.high_water("r") is None
        return
    stored = gate.get(key)
    # 'is' first: a NaN value is stored as given, and NaN != NaN.
    assert isinstance(key, str) and key and (stored is value or stored == value)


def test_bad_redis_gate_arguments_raise_invalid_argument_error(client: redis.Redis) -> None:
    """Each argument RedisGate checks is refused with InvalidArgumentError, still a TypeError or ValueError."""
    gate = armed(RedisGate(client, prefix="hb" + uuid.uuid4().hex[:10]))
    token = FencingToken("r", 5)
    for call in (
        lambda: gate.set(token, b"k", "v"),  # type: ignore[arg-type]
        lambda: gate.set(token, "", "v"),
        lambda: gate.set(token, "k", "v", ex=0),
        lambda: gate.set(token, "k", "v", ex="10"),  # type: ignore[arg-type]
        lambda: gate.hset(token, "k", {}),
        lambda: gate.eval(token, "   "),
    ):
        with pytest.raises(InvalidArgumentError) as caught:
            call()
        assert isinstance(caught.value, (TypeError, ValueError))
    assert gate.high_water("r") is None


cli_words = st.one_of(
    hostile_text,
    st.sampled_from(
        [
            "inspect",
            "rebase",
            "repair",
            "nonsense",
            "--source",
            "--gate",
            "--redis-prefix",
            "--sql-table",
            "--json",
            "--yes",
            "--help",
            "-h",
            "--version",
            f"zookeeper://{CLOSED}/f?timeout=0.2",
            f"redis://{CLOSED}/0",
            f"redis://:secret@{CLOSED}/0",
            f"postgresql://u:secret@{CLOSED}/db",
            "sqlite:///missing.db",
            "memory://",
            "etcd://" + CLOSED + "?timeout=0.2",
            "account:42",
            "",
            "\x00",
            "a" * 300,
            "{bad}",
        ]
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(cli_words, max_size=10))
def test_command_line_never_crashes(argv: list[str]) -> None:
    """Any argv to the inspect, rebase and repair commands ends in exit code 0, 1 or 2 with no traceback."""
    out, err = io.StringIO(), io.StringIO()
    with in_temp_dir():
        try:
            code = main(argv, out=out, err=err)
        except SystemExit as exc:  # --help and --version exit through argparse
            assert exc.code in (0, None)
            return
    assert code in (0, 1, 2)
    assert "Traceback" not in out.getvalue() + err.getvalue()
    assert "please report it" not in err.getvalue(), err.getvalue()
