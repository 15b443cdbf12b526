"""Canvas under a pause and a re-delivery, with real workers: a group and a chord whose member is re-delivered.

The timeline (as in test_exactly_once.py): w1 takes the first member, reads,
and is frozen past the Redis visibility timeout; the broker re-delivers it to
w2, which runs the copy and every other member to their ends; w1 resumes and
goes on from its read. With exactly once (the default) w1's write finds the
member applied and ends as done: every member's effect happens once, every
member's stored result is the applying execution's, and the chord's callback
runs once with those results. The controls run the same canvas with
exactly-once off: the paused member's effect is applied twice.
"""

from __future__ import annotations

import json
import uuid

import pytest
from celery import chord, group, states

from .conftest import Scenario
from .workers import WorkerProcess, wait_for

CANVAS = "tests.celery.canvas_tasks"
PAUSED, OTHER = 1, 2


def _workers_with_one_paused(scenario: Scenario, first_id: str) -> tuple[WorkerProcess, WorkerProcess]:
    """Start w1, freeze it in the first member's body, let w2 take the re-delivered copy and the rest, resume w1."""
    scenario.env["FT_VISIBILITY_TIMEOUT"] = "2"
    # One message at a time per worker: the frozen w1 holds only the member it is running.
    scenario.env["FT_CONF"] = json.dumps({"imports": [CANVAS], "worker_prefetch_multiplier": 1})
    w1 = scenario.worker("w1")
    starts = lambda: scenario.events_of("start", first_id)  # noqa: E731
    first = wait_for(starts, 60, "w1 to read in the first member")[0]  # type: ignore[index]
    w1.pause()
    w2 = scenario.worker("w2")
    wait_for(lambda: len(starts()) >= 2, 60, "the broker to re-deliver the first member to w2")
    second = starts()[1]
    assert second[3] != first[3], "the copy must run in the other worker"
    scenario.release(first_id, second[2])
    wait_for(lambda: f"[{first_id}] succeeded" in w2.log(), 60, "w2 to finish the copy")
    w1.resume()
    scenario.release(first_id, first[2])
    return w1, w2


def _signature(scenario: Scenario, task: str, order_id: int, paused: bool) -> object:
    return scenario.client.signature(f"{CANVAS}.{task}", args=(order_id, paused), queue=scenario.name)


def _charged(scenario: Scenario, order_id: int) -> int:
    return int(scenario.redis.get(scenario.key("charged", order_id)) or 0)


def _applied_token(scenario: Scenario, order_id: int, task_id: str) -> int:
    """The token recorded with the member's effect: ``<20-digit token>:<execution id>``."""
    record = scenario.redis.get(scenario.key("fence", "applied", f"order:{order_id}", task_id))
    assert record, f"no applied record for {task_id}"
    return int(record.split(":", 1)[0])


def _send_group(scenario: Scenario, task: str) -> tuple[str, list[str]]:
    members = group(_signature(scenario, task, PAUSED, True), _signature(scenario, task, OTHER, False))
    result = members.apply_async()
    result.save()
    return str(result.id), [str(child.id) for child in result.results]


@pytest.mark.slow
def test_group_member_redelivered_while_paused_applies_once(scenario: Scenario) -> None:
    """group(member(1), member(2)), member 1 re-delivered: each order charged once, each result the applied one."""
    _, (first_id, other_id) = _send_group(scenario, "member")
    w1, _ = _workers_with_one_paused(scenario, first_id)
    wait_for(lambda: "already applied" in w1.log(), 60, "w1's copy to find the member applied")
    assert _charged(scenario, PAUSED) == 1 and _charged(scenario, OTHER) == 1
    for order_id, task_id in ((PAUSED, first_id), (OTHER, other_id)):
        result = scenario.client.AsyncResult(task_id)
        assert result.state == states.SUCCESS
        assert result.result == _applied_token(scenario, order_id, task_id), "the stored result is the applied one"


@pytest.mark.slow
def test_group_without_once_applies_the_paused_member_twice(scenario: Scenario) -> None:
    """Control: the refused copy of member 1 retries, re-reads and charges the order again."""
    _, (first_id, _) = _send_group(scenario, "member_repeatable")
    _workers_with_one_paused(scenario, first_id)
    wait_for(lambda: _charged(scenario, PAUSED) >= 2, 60, "the refused copy's retry to charge again")
    assert _charged(scenario, PAUSED) == 2 and _charged(scenario, OTHER) == 1


def _send_chord(scenario: Scenario, task: str, name: str) -> list[str]:
    header = [_signature(scenario, task, PAUSED, True), _signature(scenario, task, OTHER, False)]
    body = scenario.client.signature(f"{CANVAS}.callback", args=(name,), queue=scenario.name)
    result = chord(header)(body)
    return [str(child.id) for child in result.parent.results]


def _callbacks(scenario: Scenario, name: str) -> list[list[int]]:
    return [json.loads(entry) for entry in scenario.redis.lrange(scenario.key("callback", name), 0, -1)]


@pytest.mark.slow
def test_chord_callback_runs_once_with_the_applied_results(scenario: Scenario) -> None:
    """chord([member(1), member(2)], callback), member 1 re-delivered: one callback, given the applied results."""
    name = uuid.uuid4().hex[:6]
    first_id, other_id = _send_chord(scenario, "member", name)
    w1, _ = _workers_with_one_paused(scenario, first_id)
    wait_for(lambda: _callbacks(scenario, name), 60, "the chord's callback")
    wait_for(lambda: "already applied" in w1.log(), 60, "w1's copy to find the member applied")
    assert _charged(scenario, PAUSED) == 1 and _charged(scenario, OTHER) == 1
    expected = sorted([_applied_token(scenario, PAUSED, first_id), _applied_token(scenario, OTHER, other_id)])
    callbacks = _callbacks(scenario, name)
    assert len(callbacks) == 1, f"the callback ran {len(callbacks)} times: {callbacks}"
    assert sorted(callbacks[0]) == expected, "the callback must get the applied executions' results"


@pytest.mark.slow
def test_chord_without_once_applies_the_paused_member_twice(scenario: Scenario) -> None:
    """Control: the chord's paused member is charged twice; its part is returned twice to the chord."""
    name = uuid.uuid4().hex[:6]
    first_id, _ = _send_chord(scenario, "member_repeatable", name)
    _workers_with_one_paused(scenario, first_id)
    wait_for(lambda: _charged(scenario, PAUSED) >= 2, 60, "the refused copy's retry to charge again")
    assert _charged(scenario, PAUSED) == 2
