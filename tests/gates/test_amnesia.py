"""Fail closed after amnesia: a Redis restarted without persistence refuses every token minted before it forgot.

Each test plays the story the floor exists for, on a throwaway redis-server
with ``save ""`` and ``appendonly no``: a stale execution claims and pauses; a
newer one claims and writes; Redis is killed and started again, empty; the
stale execution resumes and writes. With the floor it is refused and nothing
lands. The control is the same story with the floor defeated the only way a
user can: the store is re-armed at 0 after the restart (an operator calling it
new), which is what every store was before floors existed: the stale write
lands.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, states
from celery.app.task import Context

from celery_fencing import BelowFloorError, FencingToken, RedisGate, StoreUnarmedError
from celery_fencing.celery import signals
from celery_fencing.context import Execution, token_context
from celery_fencing.sources.sqlite import SQLiteTokenSource
from celery_fencing.testing.redis_server import RedisServer


class VolatileRedis(RedisServer):
    """A redis-server that keeps nothing on disk (the kit's default): a restart forgets every key."""

    def restart(self) -> None:
        """kill -9 and start again: everything the server held is gone."""
        self.kill()
        self.start()


@pytest.fixture
def volatile_redis() -> Iterator[VolatileRedis]:
    with VolatileRedis() as server:
        yield server


@pytest.fixture
def source(tmp_path: Path) -> Iterator[SQLiteTokenSource]:
    minted = SQLiteTokenSource(tmp_path / "tokens.db")
    yield minted
    minted.close()


@pytest.mark.parametrize("floor", ["on", "off"], ids=["floor", "control"])
def test_a_writer_paused_across_a_restart_is_refused(
    volatile_redis: VolatileRedis, source: SQLiteTokenSource, floor: str
) -> None:
    """RedisGate: the stale writer's token is below the floor the restarted store was armed with; nothing lands."""
    client = redis.Redis.from_url(volatile_redis.url, decode_responses=True)
    gate = RedisGate(client, prefix="fencing", source=source)
    gate.arm()  # a new store
    key = "account:{1}:balance"
    stale = source.mint("account:{1}")
    gate.claim(stale)  # ... reads the balance, and pauses
    newer = source.mint("account:{1}")
    gate.claim(newer)
    gate.set(newer, key, "110")
    volatile_redis.restart()
    assert client.get(key) is None and gate.floor() is None, "the restart forgot the data, the marks and the floor"
    if floor == "off":
        gate.arm(0)  # the control: the store called new, as every store was before floors
        gate.set(stale, key, "105")
        assert client.get(key) == "105", "without a floor the stale writer lands"
        return
    with pytest.raises(BelowFloorError) as refused:
        gate.set(stale, key, "105")
    assert client.get(key) is None, "the refused write changed nothing"
    floor_value = gate.floor()
    assert floor_value is not None and refused.value.high_water == floor_value > newer.value
    fresh = source.mint("account:{1}")
    gate.set(fresh, key, "1")  # the stale execution's retry: a fresh token, a fresh read
    assert client.get(key) == "1"
    client.close()


def test_a_gate_without_a_source_refuses_until_armed(volatile_redis: VolatileRedis, source: SQLiteTokenSource) -> None:
    """No source to take a floor from: every write is refused, with the fix in the message, until an operator arms."""
    client = redis.Redis.from_url(volatile_redis.url, decode_responses=True)
    gate = RedisGate(client, prefix="fencing")
    token = source.mint("account:{1}")
    with pytest.raises(StoreUnarmedError, match="celery-fencing arm"):
        gate.set(token, "account:{1}:balance", "1")
    assert client.dbsize() == 0, "nothing was written"
    inside_a_task = token_context(Execution(token, floor_source=source))  # the worker's source arms the store
    with inside_a_task, pytest.raises(BelowFloorError):
        gate.set(None, "account:{1}:balance", "1")
    assert gate.floor() is not None and client.get("account:{1}:balance") is None
    client.close()


def _request(token: FencingToken, source: SQLiteTokenSource) -> Context:
    context = Context(id="task-1", task="deposit", args=(), kwargs={})
    context.fencing_token = token
    context.fencing_execution = Execution(token, task_id="task-1", floor_source=source)
    return context


@pytest.mark.parametrize("floor", ["on", "off"], ids=["floor", "control"])
def test_a_result_paused_across_a_restart_is_dropped(
    volatile_redis: VolatileRedis, source: SQLiteTokenSource, floor: str
) -> None:
    """The fenced result backend: the stale execution's result is dropped (and signalled), not stored."""
    app = Celery("amnesia", backend="fenced+" + volatile_redis.url, set_as_current=False)
    dropped: list[dict[str, Any]] = []

    def on_dropped(sender: Any, **kwargs: Any) -> None:
        dropped.append(kwargs)

    signals.result_dropped.connect(on_dropped, weak=False)
    try:
        backend = app.backend
        backend.ensure_armed("task-1", source)  # as a fenced task does before it mints
        stale = source.mint("task-1")
        backend.claim_result("task-1", stale)  # the stale execution starts, and pauses
        newer = source.mint("task-1")
        backend.claim_result("task-1", newer)
        backend.store_result("task-1", "newer", states.SUCCESS, request=_request(newer, source))
        volatile_redis.restart()
        if floor == "off":
            backend.arm(0)
        backend.store_result("task-1", "stale", states.SUCCESS, request=_request(stale, source))
        stored = app.AsyncResult("task-1")
        if floor == "off":
            assert stored.get(timeout=5) == "stale", "without a floor the stale result lands"
            return
        assert stored.state == states.PENDING, "nothing was stored"
        assert [d["token"] for d in dropped] == [stale] and "floor" in dropped[0]["reason"]
    finally:
        signals.result_dropped.disconnect(on_dropped)
        app.close()
