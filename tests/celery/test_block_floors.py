"""A block of tokens reserved before a store's floor: a first delivery is neither refused for it nor loses its result.

A worker process draws tokens from a block (celery_fencing.blocks); a store
armed afterwards (by another process, or an operator) has a floor above the
whole block and refuses its tokens. A first delivery claims nothing, so its
first contact with such a store is a write: its gated write (refused, then a
Celery retry) or its result write (refused, and the result dropped: the
task's caller waits for ever). Found by the benchmark's smoke test in CI, where
two pool processes armed the gate's store and the result store in turn.

So a fenced task skips its block's tokens below every floor it finds when it
arms its stores, and an execution that did not claim its result, refused below
the result store's floor at its seal (or its sealing result write), seals with
a fresh token, as its claim would have. Only the seal: a fresh token on any
other result write would pass a newer execution's claim and overwrite its
state; and the body's own writes keep the execution's token. An embedded worker
(celery.contrib.testing) in this process, on the real Redis (broker, fenced
result backend, a RedisGate) and a real SQLite source; a second source on the
same file is the other process. Each test has its control: the same scenario
with the rule patched out shows the retry or the lost result.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.app.task import Context
from celery.contrib.testing.worker import start_worker
from celery.signals import task_failure

from celery_fencing import RedisGate, TokenUnavailableError
from celery_fencing.celery import FencedTask, signals
from celery_fencing.context import Execution
from celery_fencing.sources.sqlite import SQLiteTokenSource

from .conftest import embedded_app

TIMEOUT = 30


@pytest.fixture
def app(redis_url: str, tmp_path: Path, unique_name: str) -> Iterator[Celery]:
    with embedded_app("block-floors-test", redis_url, tmp_path, unique_name) as app:
        app.conf.fencing_retry_countdown = 0
        yield app


@pytest.fixture
def other_process(tmp_path: Path) -> Iterator[SQLiteTokenSource]:
    """The same token file as the worker's source, with a block of its own: another worker process."""
    source = SQLiteTokenSource(tmp_path / "tokens.db")
    yield source
    source.close()


class Watch:
    """The fencing signals a run sends: rejections, dropped results (with an event to wait on)."""

    def __init__(self) -> None:
        self.rejected: list[tuple[str, str]] = []
        self.dropped: list[dict[str, Any]] = []
        self.dropped_event = threading.Event()

    def __enter__(self) -> Watch:
        signals.fencing_rejected.connect(self._on_rejected, weak=False)
        signals.result_dropped.connect(self._on_dropped, weak=False)
        return self

    def __exit__(self, *exc: object) -> None:
        signals.fencing_rejected.disconnect(self._on_rejected)
        signals.result_dropped.disconnect(self._on_dropped)

    def _on_rejected(self, sender: Any, **kwargs: Any) -> None:
        self.rejected.append((kwargs["phase"], kwargs["action"]))

    def _on_dropped(self, sender: Any, **kwargs: Any) -> None:
        self.dropped.append(kwargs)
        self.dropped_event.set()


def _tokens_task(app: Celery, **options: Any) -> tuple[Any, list[int]]:
    tokens: list[int] = []

    @app.task(bind=True, base=FencedTask, shared=False, **options)
    def job(self: Any) -> int:
        tokens.append(self.request.fencing_token.value)
        return len(tokens)

    return job, tokens


def _result_store_floor_above_the_block(app: Celery, job: Any, other: SQLiteTokenSource) -> int:
    """Run *job* once (the worker reserves its block), then arm the result store from *other*; return the floor."""
    assert job.delay().get(timeout=TIMEOUT) == 1
    return int(app.backend.arm(other.mint_transient("celery-fencing:floor")))


def test_a_first_delivery_below_the_result_store_floor_mints_fresh_and_stores_its_result(
    app: Celery, other_process: SQLiteTokenSource
) -> None:
    """The result write meets the floor first: the execution mints fresh, and its result is stored, not dropped."""
    job, tokens = _tokens_task(app)
    with Watch() as watch, start_worker(app, pool="solo", perform_ping_check=False):
        floor = _result_store_floor_above_the_block(app, job, other_process)
        second = job.delay()
        assert second.get(timeout=TIMEOUT) == 2
    assert tokens[1] < floor, "the second execution drew its token from the block reserved before the floor"
    assert watch.dropped == [] and watch.rejected == []


def test_control_without_the_fresh_mint_the_first_delivery_loses_its_result(
    app: Celery, other_process: SQLiteTokenSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the result write refused below the floor is dropped, and the task's result never arrives."""
    monkeypatch.setattr("celery_fencing.celery.backend.remint_unclaimed", lambda *args: None)
    job, tokens = _tokens_task(app)
    with Watch() as watch, start_worker(app, pool="solo", perform_ping_check=False):
        floor = _result_store_floor_above_the_block(app, job, other_process)
        second = job.delay()
        assert watch.dropped_event.wait(TIMEOUT), "no result_dropped signal"
        assert second.state == "PENDING"
    assert tokens[1] < floor
    assert [(d["task_id"], d["state"], d["high_water"]) for d in watch.dropped] == [(second.id, "SUCCESS", floor)]


def _chained_run(app: Celery, other: SQLiteTokenSource) -> tuple[Any, list[int], list[int], int]:
    """A task with a callback (it seals before its result write), run after the result store got a new floor."""
    job, tokens = _tokens_task(app)
    calls: list[int] = []
    called = threading.Event()

    @app.task(shared=False)
    def after(value: int) -> None:
        calls.append(value)
        called.set()

    with start_worker(app, pool="solo", perform_ping_check=False):
        floor = _result_store_floor_above_the_block(app, job, other)
        chained = job.apply_async(link=after.s())
        assert chained.get(timeout=TIMEOUT) >= 2
        # The callback is a task of its own, sent before the result is stored: wait for it here.
        assert called.wait(TIMEOUT), "the callback never ran"
    return chained, tokens, calls, floor


def test_a_first_delivery_with_a_callback_below_the_floor_mints_fresh_at_its_seal(
    app: Celery, other_process: SQLiteTokenSource
) -> None:
    """The seal meets the floor first: the execution mints fresh and seals; the body ran once, the callback once."""
    with Watch() as watch:
        chained, tokens, calls, floor = _chained_run(app, other_process)
    assert chained.result == 2 and len(tokens) == 2 and tokens[1] < floor
    assert calls == [2] and watch.rejected == [] and watch.dropped == []


def test_control_without_the_fresh_mint_the_refused_seal_retries_the_body(
    app: Celery, other_process: SQLiteTokenSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the refused seal is taken for an outage and the task retried: its body runs a second time."""
    monkeypatch.setattr("celery_fencing.celery.seals.remint_unclaimed", lambda *args: None)
    with Watch() as watch:
        chained, tokens, calls, floor = _chained_run(app, other_process)
    assert len(tokens) == 3 and tokens[1] < floor < tokens[2]
    assert chained.result == 3 and calls == [3], "the result and the callback are the second run's"
    assert watch.rejected == [("body", "retry")]


def test_a_seal_whose_fresh_mint_fails_is_retried_not_failed(
    app: Celery, other_process: SQLiteTokenSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fresh token (the source out of reach): the refusal below the floor stands and is taken for what it is,
    not a newer execution: the task is retried (a retry claims, above the floor) and ends with its result."""

    def unavailable(*args: Any) -> None:
        raise TokenUnavailableError("the source is out of reach")

    monkeypatch.setattr("celery_fencing.celery.seals.remint_unclaimed", unavailable)
    with Watch() as watch:
        chained, tokens, calls, floor = _chained_run(app, other_process)
    assert len(tokens) == 3 and tokens[1] < floor < tokens[2]
    assert chained.result == 3 and calls == [3] and watch.rejected == [("body", "retry")]


def _gated_run(app: Celery, redis_url: str, unique_name: str, other: SQLiteTokenSource) -> tuple[list[int], int, Any]:
    """Run a task without gates (the worker reserves its block), arm a new gate's store from *other*, then
    run a task writing through that gate; return the gated task's tokens, the gate's floor and its result."""
    plain, _ = _tokens_task(app)
    gate = RedisGate(redis.Redis.from_url(redis_url), prefix=f"{unique_name}:gate")
    tokens: list[int] = []

    @app.task(bind=True, base=FencedTask, fencing_gates=[gate], shared=False)
    def gated(self: Any) -> str:
        tokens.append(self.request.fencing_token.value)
        gate.set(None, f"{unique_name}:k", "v")
        return "written"

    with start_worker(app, pool="solo", perform_ping_check=False):
        assert plain.delay().get(timeout=TIMEOUT) == 1
        floor = gate.arm(other.mint_transient("celery-fencing:floor"))
        result = gated.delay()
        assert result.get(timeout=TIMEOUT) == "written"
    assert gate.get(f"{unique_name}:k") == b"v"
    return tokens, floor, result


def test_a_block_below_a_floor_found_when_arming_is_skipped_before_the_first_write(
    app: Celery, redis_url: str, unique_name: str, other_process: SQLiteTokenSource
) -> None:
    """A store armed by another process after this one reserved its block: its floor, read when the task arms
    its stores, makes the task skip the block's lower tokens, so the first delivery's write is not refused."""
    with Watch() as watch:
        tokens, floor, _ = _gated_run(app, redis_url, unique_name, other_process)
    assert len(tokens) == 1 and tokens[0] >= floor
    assert watch.rejected == []


def test_control_without_the_skip_the_first_write_is_refused_and_retried(
    app: Celery, redis_url: str, unique_name: str, other_process: SQLiteTokenSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: drawing the block's lower token, the first write is refused below the floor and the task retried."""
    monkeypatch.setattr(SQLiteTokenSource, "skip_block_below", lambda self, floor: False)
    with Watch() as watch:
        tokens, floor, _ = _gated_run(app, redis_url, unique_name, other_process)
    assert len(tokens) == 2 and tokens[0] < floor <= tokens[1]
    assert watch.rejected == [("body", "retry")]


def test_a_first_delivery_on_a_domain_resource_below_the_result_floor_stores_its_result(
    app: Celery, other_process: SQLiteTokenSource
) -> None:
    """On a domain resource a first delivery claims its gates but not its result: it too seals with a fresh token."""
    job, tokens = _tokens_task(app, fencing_resource=f"account:{uuid.uuid4().hex}")
    with Watch() as watch, start_worker(app, pool="solo", perform_ping_check=False):
        floor = _result_store_floor_above_the_block(app, job, other_process)
        assert job.delay().get(timeout=TIMEOUT) == 2
    assert tokens[1] < floor and watch.dropped == [] and watch.rejected == []


def test_control_on_a_domain_resource_counted_as_claimed_the_result_is_lost(
    app: Celery, other_process: SQLiteTokenSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the first delivery counted as having claimed its result (as before result_claimed) is not given a
    fresh token: its result write, refused below the floor, is dropped."""
    start = FencedTask._start_fencing

    def counted_as_claimed(self: FencedTask, args: Any, kwargs: Any) -> Execution:
        execution = start(self, args, kwargs)
        execution.result_claimed = True
        return execution

    monkeypatch.setattr(FencedTask, "_start_fencing", counted_as_claimed)
    job, tokens = _tokens_task(app, fencing_resource=f"account:{uuid.uuid4().hex}")
    with Watch() as watch, start_worker(app, pool="solo", perform_ping_check=False):
        floor = _result_store_floor_above_the_block(app, job, other_process)
        second = job.delay()
        assert watch.dropped_event.wait(TIMEOUT), "no result_dropped signal"
        assert second.state == "PENDING"
    assert tokens[1] < floor and [d["state"] for d in watch.dropped] == ["SUCCESS"]


def test_a_progress_state_below_the_floor_is_refused_and_the_body_keeps_its_token(
    app: Celery, redis_url: str, unique_name: str, other_process: SQLiteTokenSource
) -> None:
    """update_state below the result floor is refused (no fresh token for it); the body's next write, with the
    token it was given, still carries its applied record, and the result is sealed with a fresh token."""
    job, _ = _tokens_task(app)
    gate = RedisGate(redis.Redis.from_url(redis_url), prefix=f"{unique_name}:gate")
    seen: list[tuple[int, int]] = []

    @app.task(bind=True, base=FencedTask, fencing_gates=[gate], shared=False)
    def stepped(self: Any) -> str:
        given = self.request.fencing_token
        self.update_state(state="PROGRESS", meta={"step": 1})
        seen.append((given.value, self.request.fencing_execution.token.value))
        gate.set(given, f"{unique_name}:k", "v")  # the token passed explicitly, as a user may
        return "done"

    gate.ensure_armed(f"{unique_name}:k", other_process)  # before the block: only the result floor is above it
    with Watch() as watch, start_worker(app, pool="solo", perform_ping_check=False):
        floor = _result_store_floor_above_the_block(app, job, other_process)
        result = stepped.delay()
        assert result.get(timeout=TIMEOUT) == "done"
    ((given, current),) = seen
    assert given == current < floor, "the progress write left the body's token alone"
    assert gate.applied(result.id, result.id) is not None, "the gated write recorded its task id"
    assert [(d["state"], d["high_water"]) for d in watch.dropped] == [("PROGRESS", floor)]


def _newer_execution_claims_and_reports_progress(app: Celery, source: SQLiteTokenSource, task_id: str) -> None:
    """E2, a newer execution of *task_id* (a fresh token, above the floor), claims the result and writes PROGRESS."""
    newer = source.mint(task_id)
    app.backend.claim_result(task_id, newer)
    e2 = Execution(newer, task_id=task_id, once=True, floor_source=source)
    app.backend.store_result(
        task_id, {"step": 1}, "PROGRESS", request=Context(fencing_token=newer, fencing_execution=e2)
    )


def _stale_failure_over_a_newer_claim(app: Celery, source: SQLiteTokenSource, *, fresh_failure_token: bool) -> str:
    """E1, a first delivery holding a token of a block below the result floor, writes FAILURE after E2, a newer
    execution of the task, claimed the result and wrote PROGRESS; return the state the result store keeps."""
    backend = app.backend
    task_id = str(uuid.uuid4())
    old = source.mint(task_id)  # E1's token, from a block reserved before the store was armed
    backend.arm(source.mint_transient("celery-fencing:floor"))
    _newer_execution_claims_and_reports_progress(app, source, task_id)
    e1 = Execution(old, task_id=task_id, once=True, floor_source=source, claimed=False, result_claimed=False)
    if fresh_failure_token:
        e1.fresh_result_token = source.mint(task_id)  # what minting fresh at any result write would do
    failure = RuntimeError("E1 failed")
    backend.store_result(task_id, failure, "FAILURE", request=Context(fencing_token=old, fencing_execution=e1))
    return str(backend.get_task_meta(task_id)["status"])


def test_a_stale_first_delivery_below_the_floor_never_overwrites_a_newer_claims_state(
    app: Celery, other_process: SQLiteTokenSource
) -> None:
    """E1's FAILURE, below the floor and not a seal, is refused as it is: E2's state stands, E1's is reported."""
    with Watch() as watch:
        assert _stale_failure_over_a_newer_claim(app, other_process, fresh_failure_token=False) == "PROGRESS"
    assert [d["state"] for d in watch.dropped] == ["FAILURE"]


def test_control_a_fresh_token_on_a_non_sealing_write_overwrites_the_newer_execution(
    app: Celery, other_process: SQLiteTokenSource
) -> None:
    """Control: with a fresh token (above E2's claim) E1's FAILURE passes and overwrites E2's state."""
    with Watch() as watch:
        assert _stale_failure_over_a_newer_claim(app, other_process, fresh_failure_token=True) == "FAILURE"
    assert watch.dropped == []


def _seal_fails_after_the_fresh_mint(
    app: Celery, other: SQLiteTokenSource, monkeypatch: pytest.MonkeyPatch, *, keep_fresh_token: bool
) -> tuple[str, list[dict[str, Any]]]:
    """E2, a newer execution of a task, claimed its result and wrote PROGRESS; then E1, the task's first delivery
    (with a callback: it seals before its result write), below the floor, mints fresh and its second seal fails
    (the connection drops), so the task fails. Return the state the result store keeps and the dropped writes.

    *keep_fresh_token*: the execution keeps the fresh token after the failed seal (as when it was set before
    the seal and never taken back)."""
    job, tokens = _tokens_task(app)

    @app.task(shared=False)
    def after(value: int) -> None:
        pass

    seal = type(app.backend).seal_result
    kept: dict[int, Any] = {}

    def seal_then_drop(self: Any, task_id: str, execution: Execution) -> None:
        if execution.fresh_result_token is None:
            seal(self, task_id, execution)  # with the block's token: refused below the floor
        else:
            kept[id(execution)] = execution.fresh_result_token
            raise redis.ConnectionError("connection dropped during the seal")

    if keep_fresh_token:
        monkeypatch.setattr(
            Execution, "result_token", property(lambda self: self.fresh_result_token or kept.get(id(self), self.token))
        )
    failed = threading.Event()

    def on_failure(sender: Any = None, **kwargs: Any) -> None:
        failed.set()  # sent after Celery wrote the FAILURE

    task_failure.connect(on_failure, weak=False)
    try:
        with Watch() as watch, start_worker(app, pool="solo", perform_ping_check=False):
            floor = _result_store_floor_above_the_block(app, job, other)
            task_id = str(uuid.uuid4())
            _newer_execution_claims_and_reports_progress(app, other, task_id)
            monkeypatch.setattr(type(app.backend), "seal_result", seal_then_drop)
            job.apply_async(task_id=task_id, link=after.s())
            assert failed.wait(TIMEOUT), "the task never failed"
    finally:
        task_failure.disconnect(on_failure)
    assert len(tokens) == 2 and tokens[1] < floor and len(kept) == 1, "E1 drew a block token and minted fresh"
    return str(app.backend.get_task_meta(task_id)["status"]), watch.dropped


def test_a_seal_that_fails_after_the_fresh_mint_leaves_a_newer_executions_state_alone(
    app: Celery, other_process: SQLiteTokenSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fresh token is the result's only once its seal went through: E1's FAILURE carries the block's token,
    is refused below the floor and reported, and E2's state stands."""
    state, dropped = _seal_fails_after_the_fresh_mint(app, other_process, monkeypatch, keep_fresh_token=False)
    assert state == "PROGRESS"
    assert [d["state"] for d in dropped] == ["FAILURE"]


def test_control_a_fresh_token_kept_after_a_failed_seal_overwrites_the_newer_execution(
    app: Celery, other_process: SQLiteTokenSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: kept after the failed seal, the fresh token (above E2's claim) carries E1's FAILURE over E2's state."""
    state, dropped = _seal_fails_after_the_fresh_mint(app, other_process, monkeypatch, keep_fresh_token=True)
    assert state == "FAILURE" and dropped == []


def _sealed_with_a_fresh_token_then_written_with_the_block_token(
    app: Celery, source: SQLiteTokenSource, *, writer_sealed: bool
) -> str:
    """E1 (unclaimed, a block token below the floor) sealed with a fresh token, then lost it (a soft time limit
    between its seal and the bookkeeping), and writes its result with the block token. Return the state kept.

    *writer_sealed*: the write is E1's own; else another execution's, with a token as old."""
    backend = app.backend
    task_id = str(uuid.uuid4())
    old = source.mint(task_id)
    backend.arm(source.mint_transient("celery-fencing:floor"))
    e1 = Execution(old, task_id=task_id, once=True, floor_source=source, claimed=False, result_claimed=False)
    e1.fresh_result_token = source.mint(task_id)
    backend.seal_result(task_id, e1)
    e1.fresh_result_token = None
    writer = e1 if writer_sealed else Execution(old, task_id=task_id, once=True, claimed=False, result_claimed=False)
    backend.store_result(task_id, "done", "SUCCESS", request=Context(fencing_token=old, fencing_execution=writer))
    return str(backend.get_task_meta(task_id)["status"])


def test_the_execution_that_sealed_writes_its_result_below_the_floor(
    app: Celery, other_process: SQLiteTokenSource
) -> None:
    """The seal passed the floor; the sealer's own result write, with its older token, lands (its id is the seal)."""
    with Watch() as watch:
        assert _sealed_with_a_fresh_token_then_written_with_the_block_token(app, other_process, writer_sealed=True) == (
            "SUCCESS"
        )
    assert watch.dropped == []


def test_another_execution_with_the_same_old_token_is_still_refused_below_the_floor(
    app: Celery, other_process: SQLiteTokenSource
) -> None:
    """Only the sealer skips the floor: the same write from an execution that did not seal is refused below it."""
    with Watch() as watch:
        state = _sealed_with_a_fresh_token_then_written_with_the_block_token(app, other_process, writer_sealed=False)
    assert state == "PENDING" and [d["state"] for d in watch.dropped] == ["SUCCESS"]
    assert "below the store's floor" in watch.dropped[0]["reason"]
