"""Exactly once at the gate: every gate records "task id T applied on resource R" with the effect.

Parametrised over every gate of the contract suite (memory, Redis, Redis
Cluster, PostgreSQL, MariaDB, SQLite; Django runs the same file from
tests/django). Each execution is an :class:`~celery_fencing.context.Execution`
made current with ``token_context``, as a fenced task does. The negative
control runs the same schedule with exactly-once off, and the effect is applied
twice.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from celery_fencing import AlreadyAppliedError, FencingToken, StaleTokenError, token_context
from celery_fencing.context import Execution

from .adapters import AdapterSpec, GateAdapter, open_adapter

RESOURCE = "acct:{7}"


@contextmanager
def executing(
    value: int, task_id: str = "task-1", *, once: bool = True, retention: float = 60.0
) -> Iterator[FencingToken]:
    """One execution of *task_id* holding token *value*, current for the block."""
    token = FencingToken(RESOURCE, value)
    with token_context(Execution(token, task_id=task_id, once=once, once_retention=retention)):
        yield token


def test_same_task_id_twice_applies_once(adapter: GateAdapter) -> None:
    """A second execution of the same task id, with a higher token, is refused as already applied; nothing changes."""
    with executing(1) as first:
        adapter.claim(first)
        adapter.append(first, "log", 1)
    with executing(2) as second:
        adapter.claim(second)
        with pytest.raises(AlreadyAppliedError) as refused:
            adapter.append(second, "log", 2)
    assert refused.value.resource == RESOURCE and refused.value.task_id == "task-1"
    assert refused.value.superseded is False
    assert adapter.log("log") == [1]


def test_the_paused_copy_is_refused_as_superseded(adapter: GateAdapter) -> None:
    """The quickstart timeline: the older copy resumes after the newer one applied; it is refused, not retried."""
    with executing(1) as older:
        adapter.claim(older)
    with executing(2) as newer:
        adapter.claim(newer)
        adapter.append(newer, "log", 2)
    with executing(1) as older, pytest.raises(AlreadyAppliedError) as refused:  # the resumed copy
        adapter.append(older, "log", 1)
    assert refused.value.superseded is True and refused.value.applied_token == 2
    assert adapter.log("log") == [2]


def test_on_a_shared_resource_the_newest_copy_is_not_superseded_by_another_task(adapter: GateAdapter) -> None:
    """Task A applied, then task B raised the mark; A's newer copy is refused as applied but not superseded.

    "Superseded" means a newer execution of the same task applied: the
    resource's mark, which another task may hold, does not say that.
    """
    with executing(1, "task-a") as first:
        adapter.append(first, "log", 1)
    with executing(3, "task-b") as other_task:
        adapter.claim(other_task)
    with executing(2, "task-a") as newer_copy, pytest.raises(AlreadyAppliedError) as refused:
        adapter.append(newer_copy, "log", 2)
    assert refused.value.superseded is False and refused.value.applied_token == 1
    assert adapter.log("log") == [1]


def test_a_stale_copy_of_an_unapplied_task_is_stale_not_applied(adapter: GateAdapter) -> None:
    """Refused by the mark while no execution of its task id applied: StaleTokenError, so the policy may retry."""
    with executing(1, "task-a") as older:
        adapter.claim(older)
    with executing(2, "task-b") as other_task:
        adapter.append(other_task, "log", 2)
    with executing(1, "task-a") as older, pytest.raises(StaleTokenError):
        adapter.append(older, "log", 1)
    assert adapter.log("log") == [2]


def test_one_execution_may_write_many_times(adapter: GateAdapter) -> None:
    """The record names the execution: its own later writes pass."""
    with executing(1) as token:
        adapter.append(token, "log", 1)
        adapter.append(token, "log", 2)
    assert adapter.log("log") == [1, 2]


def test_different_task_ids_each_apply(adapter: GateAdapter) -> None:
    """Records are per task id: other tasks on the same resource are not held off."""
    for value, task_id in enumerate(("a", "b", "c"), start=1):
        with executing(value, task_id) as token:
            adapter.append(token, "log", value)
    assert adapter.log("log") == [1, 2, 3]
    assert adapter.applied(RESOURCE, "a") is not None and adapter.applied(RESOURCE, "zzz") is None


def test_without_once_the_second_execution_applies_again(adapter: GateAdapter) -> None:
    """Negative control: the same schedule with exactly-once off applies the effect twice."""
    with executing(1, once=False) as first:
        adapter.append(first, "log", 1)
    with executing(2, once=False) as second:
        adapter.append(second, "log", 2)
    assert adapter.log("log") == [1, 2]
    assert adapter.applied(RESOURCE, "task-1") is None


def test_explicit_token_outside_its_execution_records_nothing(adapter: GateAdapter) -> None:
    """Only the current execution's own token carries its task id; a token for something else records nothing."""
    with executing(5):
        adapter.append(FencingToken(RESOURCE, 6), "log", 6)
    assert adapter.applied(RESOURCE, "task-1") is None


#: How long test_records_expire's record lives: long enough to be seen at once, short enough to wait out.
RETENTION = 3.0


def test_records_expire(adapter: GateAdapter) -> None:
    """After its retention, on the store's clock, the record is gone and the task id may apply again."""
    written = time.monotonic()
    with executing(1, retention=RETENTION) as first:
        adapter.append(first, "log", 1)
    # A loaded machine may take longer than the retention to get here: only then may the record be gone.
    present = adapter.applied(RESOURCE, "task-1") is not None
    assert present or time.monotonic() - written >= RETENTION, "the record was gone before its retention"
    deadline = time.monotonic() + RETENTION + 10
    while adapter.applied(RESOURCE, "task-1") is not None:
        assert time.monotonic() < deadline, "the applied record did not expire"
        time.sleep(0.1)
    with executing(2, retention=RETENTION) as second:
        adapter.append(second, "log", 2)
    assert adapter.log("log") == [1, 2]


def report_one_execution(
    adapter: GateAdapter, value: int, start: multiprocessing.synchronize.Event, outcomes: multiprocessing.Queue[str]
) -> None:
    """A child's part: wait for the start, run one execution of "task-1" holding *value*, put its outcome."""
    start.wait(30)
    with executing(value) as token:
        try:
            adapter.append(token, "log", value)
            outcomes.put("ok")
        except AlreadyAppliedError:
            outcomes.put("applied")
        except StaleTokenError:
            outcomes.put("stale")


def _apply_in_child(
    spec: AdapterSpec, value: int, start: multiprocessing.synchronize.Event, outcomes: multiprocessing.Queue[str]
) -> None:
    adapter = open_adapter(spec)
    try:
        report_one_execution(adapter, value, start, outcomes)
    finally:
        adapter.close()


def check_concurrent_executions_apply_once(adapter: GateAdapter, child: Callable[..., None], first_arg: object) -> None:
    """Six processes (``child(first_arg, value, start, outcomes)``) run executions of one task id at once, tokens
    1..6: exactly one applies."""
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    queue: multiprocessing.Queue[str] = context.Queue()
    children = [context.Process(target=child, args=(first_arg, v, start, queue)) for v in range(1, 7)]
    for process in children:
        process.start()
    start.set()
    outcomes = [queue.get(timeout=120) for _ in children]
    for process in children:
        process.join(30)
    assert outcomes.count("ok") == 1, outcomes
    assert set(outcomes) <= {"ok", "applied", "stale"}
    assert len(adapter.log("log")) == 1


def test_concurrent_executions_in_processes_apply_once(adapter: GateAdapter) -> None:
    """Six processes run executions of one task id at once (tokens 1..6): exactly one applies."""
    if not adapter.shared_across_processes:
        pytest.skip("this gate keeps its state in one process")
    check_concurrent_executions_apply_once(adapter, _apply_in_child, adapter.spec)
