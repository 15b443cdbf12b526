"""The first delivery of a task fenced on its own id runs without a claim; every other execution claims.

An embedded worker (celery.contrib.testing) in this process, on the real
Redis: broker, fenced result backend and a RedisGate. The body looks at the
gate's mark of its own task id before it writes: a claim would have raised
it to the execution's token. Exactly once is what makes the first delivery's
claim redundant (tests/model/protocol.py explores it; tests/celery/test_block_tokens.py
plays the re-delivered copy with the lower token on real workers); these
tests pin when the claim is skipped, and the one rule the claim had to hand
over: a store that is down at the first write is retried, as at a claim.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_fencing import GateUnavailableError, MemoryGate, RedisGate
from celery_fencing.celery import FencedTask, signals
from celery_fencing.context import applied_record, current_token
from celery_fencing.token import FencingToken
from tests.fixtures.services import armed

from .conftest import embedded_app

TIMEOUT = 30


@pytest.fixture
def app(redis_url: str, tmp_path: Path, unique_name: str) -> Iterator[Celery]:
    with embedded_app("first-delivery-test", redis_url, tmp_path, unique_name) as app:
        app.conf.fencing_retry_countdown = 0
        yield app


@pytest.fixture
def gate(redis_url: str, unique_name: str) -> RedisGate:
    return armed(RedisGate(redis.Redis.from_url(redis_url), prefix=f"{unique_name}:fence"))


def _marks_seen_by_the_body(app: Celery, gate: RedisGate, unique_name: str, **options: Any) -> list[tuple[int, Any]]:
    """Run a task that retries once; return, per attempt, (retries, the gate's mark of its task id at the start)."""
    seen: list[tuple[int, Any]] = []

    @app.task(bind=True, base=FencedTask, fencing_gates=[gate], shared=False, **options)
    def job(self: Any) -> int:
        seen.append((self.request.retries, gate.high_water(self.request.id)))
        if not self.request.retries:
            raise self.retry(countdown=0)  # before any write: a write of the task id is its effect, applied once
        gate.set(None, f"{unique_name}:written", "once")
        return len(seen)

    with start_worker(app, pool="solo", perform_ping_check=False):
        assert job.delay().get(timeout=TIMEOUT) == 2
    return seen


def test_the_first_delivery_runs_without_a_claim_and_its_retry_claims(
    app: Celery, gate: RedisGate, unique_name: str
) -> None:
    """Attempt 0 starts with no mark on its task id; the retry (an attempt that may follow another) claims first."""
    seen = _marks_seen_by_the_body(app, gate, unique_name)
    (first, first_mark), (retry, retry_mark) = seen
    assert (first, first_mark) == (0, None), "the first delivery claimed nothing"
    assert retry == 1 and retry_mark is not None, "the retry claimed its task id before its body"


def test_claim_first_delivery_claims_on_the_first_delivery_too(app: Celery, gate: RedisGate, unique_name: str) -> None:
    """Control: with fencing_claim_first_delivery the first delivery's mark is its claim, before the body writes."""
    app.conf.fencing_claim_first_delivery = True
    (first, first_mark), (_, retry_mark) = _marks_seen_by_the_body(app, gate, unique_name)
    assert first == 0 and first_mark is not None
    assert retry_mark is not None and retry_mark > first_mark


def test_a_task_on_a_domain_resource_claims_on_its_first_delivery(
    app: Celery, gate: RedisGate, unique_name: str
) -> None:
    """Other tasks contend for a domain resource: the claim keeps their reads and writes apart, so it stays."""
    seen: list[Any] = []

    @app.task(bind=True, base=FencedTask, fencing_resource="acct:{n}", fencing_gates=[gate], shared=False)
    def job(self: Any, n: int) -> None:
        seen.append(gate.high_water(self.request.fencing_resource) == self.request.fencing_token.value)

    with start_worker(app, pool="solo", perform_ping_check=False):
        job.delay(1).get(timeout=TIMEOUT)
    assert seen == [True]


class StoreDown(MemoryGate):
    """A memory gate whose store is down for the writes numbered in *down* (1 is the first).

    As a real gate does, it asks for the execution's applied record before
    its I/O, so the execution counts the attempt.
    """

    def __init__(self, *down: int) -> None:
        super().__init__()
        self.down = set(down)
        self.writes = 0

    def set(self, token: FencingToken | None, key: str, value: Any) -> None:
        self.writes += 1
        if self.writes in self.down:
            applied_record(token or current_token())  # type: ignore[arg-type]
            raise GateUnavailableError("store restarting", gate="StoreDown")
        super().set(token, key, value)


def _run_with_a_store_down(app: Celery, gate: StoreDown) -> tuple[list[int], list[dict[str, Any]], Any]:
    """Run a task whose body writes two keys; return its attempts' tokens, the rejections, and its result."""
    tokens: list[int] = []
    rejected: list[dict[str, Any]] = []

    def on_rejected(sender: Any, **kwargs: Any) -> None:
        rejected.append(kwargs)

    @app.task(bind=True, base=FencedTask, shared=False)
    def job(self: Any) -> int:
        tokens.append(self.request.fencing_token.value)
        gate.set(None, "first", 1)
        gate.set(None, "second", 2)
        return len(tokens)

    signals.fencing_rejected.connect(on_rejected, weak=False)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False):
            result = job.delay()
            result.get(timeout=TIMEOUT, propagate=False)
    finally:
        signals.fencing_rejected.disconnect(on_rejected)
    return tokens, rejected, result


def test_a_store_down_at_the_first_write_of_an_unclaimed_delivery_is_retried(app: Celery) -> None:
    """The outage the claim would have met is met at the first write: retried with backoff, then applied."""
    gate = StoreDown(1)
    tokens, rejected, result = _run_with_a_store_down(app, gate)
    assert result.successful() and result.result == 2
    assert len(tokens) == 2 and tokens[1] > tokens[0], "the retry minted a new token"
    assert [(r["phase"], r["action"]) for r in rejected] == [("body", "retry")]
    assert (gate.get("first"), gate.get("second")) == (1, 2)


def test_a_store_down_after_a_write_went_through_fails_the_task(app: Celery) -> None:
    """Control: past the first write a retry would find that write applied and end the task with the rest undone."""
    gate = StoreDown(2)
    tokens, rejected, result = _run_with_a_store_down(app, gate)
    assert result.failed() and isinstance(result.result, GateUnavailableError)
    assert len(tokens) == 1 and rejected == []
    assert (gate.get("first"), gate.get("second")) == (1, None)
