"""Canvas under a pause and a re-delivery, with real workers, on the result stores: a chain, a group and a chord.

The timeline (as in test_exactly_once.py): w1 takes the first member, reads,
and is frozen past the Redis visibility timeout; the broker re-delivers it to
w2, which runs the copy and every other member to their ends; w1 resumes and
goes on from its read. With exactly once (the default) w1's write finds the
member applied and ends as done: every member's effect happens once, every
member's stored result (read from the store itself: the Redis key, the
``celery_taskmeta`` row, the ``TaskResult`` row) is the applying execution's,
and the chain's next step or the chord's callback runs once, given those
results. The chord's callback is a fenced task: on the SQLAlchemy backend
Celery's ``celery.chord_unlock`` sends it, and a copy of that (plain) task
re-delivered on a loaded machine sends it again. The controls run the same
canvas with exactly-once off: the paused member's effect is applied twice,
and a chain's next step runs twice.

A chord is the store's own: counters in Redis, django-celery-results'
``ChordCounter`` row, Celery's ``chord_unlock`` polling of the group's
results on the SQLAlchemy backend.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from celery import chain, chord, group, states

from ..conftest import Scenario
from ..workers import WorkerProcess, wait_for
from .conftest import use_backend
from .stores import Store

CANVAS = "tests.celery.canvas_tasks"
PAUSED, OTHER = 1, 2


@dataclass
class Sent:
    """A canvas sent: its members' task ids by order (the paused one first), and its callback's name."""

    members: dict[int, str]
    name: str

    @property
    def paused_id(self) -> str:
        return self.members[PAUSED]


def _signature(scenario: Scenario, task: str, order_id: int, paused: bool) -> Any:
    return scenario.client.signature(f"{CANVAS}.{task}", args=(order_id, paused), queue=scenario.name)


def _callback(scenario: Scenario, name: str, *, fenced: bool = False) -> Any:
    body = "fenced_callback" if fenced else "callback"
    return scenario.client.signature(f"{CANVAS}.{body}", args=(name,), queue=scenario.name)


def _send_chain(scenario: Scenario, task: str, name: str) -> Sent:
    result = chain(_signature(scenario, task, PAUSED, True), _callback(scenario, name)).apply_async()
    return Sent({PAUSED: str(result.parent.id)}, name)


def _send_group(scenario: Scenario, task: str, name: str) -> Sent:
    members = group(_signature(scenario, task, PAUSED, True), _signature(scenario, task, OTHER, False))
    result = members.apply_async()
    result.save()
    return Sent({PAUSED: str(result.results[0].id), OTHER: str(result.results[1].id)}, name)


def _send_chord(scenario: Scenario, task: str, name: str) -> Sent:
    header = [_signature(scenario, task, PAUSED, True), _signature(scenario, task, OTHER, False)]
    # A fenced callback: on the SQLAlchemy backend a celery.chord_unlock re-delivered after it sent
    # the callback sends it again (test_redelivered_chord_unlock_runs_a_fenced_callback_once).
    result = chord(header)(_callback(scenario, name, fenced=True))
    return Sent({PAUSED: str(result.parent.results[0].id), OTHER: str(result.parent.results[1].id)}, name)


SEND: dict[str, Callable[[Scenario, str, str], Sent]] = {
    "chain": _send_chain,
    "group": _send_group,
    "chord": _send_chord,
}

#: (shape, store) pairs. Every shape runs on both database backends (SQLAlchemy's and Django's: their own
#: fence statements, and their own chords); Django's PostgreSQL and SQLite databases share that code, so
#: the chord, the one shape with more of the store's own writes (its ChordCounter row), runs on both and
#: the chain and the group on one each. The chain on Redis is test_exactly_once.py's.
CASES = [
    ("chain", "postgresql"),
    ("chain", "django-sqlite"),
    ("group", "redis"),
    ("group", "postgresql"),
    ("group", "django-postgresql"),
    ("chord", "redis"),
    ("chord", "postgresql"),
    ("chord", "django-postgresql"),
    ("chord", "django-sqlite"),
]


def _configure_workers(scenario: Scenario) -> None:
    """Workers that import the canvas tasks and re-deliver after 2 s, holding one message at a time.

    One message at a time: the frozen w1 holds only the member it is running.
    A chord_unlock retry every 0.2 s (not 1 s): w2 holds each of its delayed
    messages well under the visibility timeout, so none is re-delivered.
    """
    scenario.env["FT_VISIBILITY_TIMEOUT"] = "2"
    conf = json.loads(scenario.env.get("FT_CONF", "{}"))
    extra = {"imports": [CANVAS], "worker_prefetch_multiplier": 1, "result_chord_retry_interval": 0.2}
    scenario.env["FT_CONF"] = json.dumps({**conf, **extra})


def _workers_with_one_paused(scenario: Scenario, first_id: str) -> tuple[WorkerProcess, WorkerProcess]:
    """Start w1, freeze it in the first member's body, let w2 take the re-delivered copy and the rest, resume w1."""
    _configure_workers(scenario)
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


def _charged(scenario: Scenario, order_id: int) -> int:
    return int(scenario.redis.get(scenario.key("charged", order_id)) or 0)


def _applied_token(scenario: Scenario, order_id: int, task_id: str) -> int:
    """The token recorded with the member's effect: ``<20-digit token>:<execution id>``."""
    record = scenario.redis.get(scenario.key("fence", "applied", f"order:{order_id}", task_id))
    assert record, f"no applied record for {task_id}"
    return int(record.split(":", 1)[0])


def _callbacks(scenario: Scenario, name: str) -> list[Any]:
    """What each run of the callback was given: the chain's first result, the chord's list of results."""
    return [json.loads(entry) for entry in scenario.redis.lrange(scenario.key("callback", name), 0, -1)]


def _case_id(case: tuple[str, str]) -> str:
    return "-".join(case)


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "store"), CASES, ids=map(_case_id, CASES), indirect=["store"])
def test_member_redelivered_while_paused_applies_once(world: Scenario, store: Store, shape: str) -> None:
    """The paused member re-delivered: each order charged once, each stored result the applied one, one callback."""
    use_backend(world, store)
    sent = SEND[shape](world, "member", uuid.uuid4().hex[:6])
    w1, _ = _workers_with_one_paused(world, sent.paused_id)
    wait_for(lambda: "already applied" in w1.log(), 60, "w1's copy to find the member applied")
    # w2 may take the re-delivered copy before the other member: wait for each to succeed somewhere.
    logs = lambda: "".join(worker.log() for worker in world.workers)  # noqa: E731
    for task_id in sent.members.values():
        wait_for(lambda t=task_id: f"[{t}] succeeded" in logs(), 60, f"member {task_id} to succeed")
    applied = {order: _applied_token(world, order, task_id) for order, task_id in sent.members.items()}
    for order, task_id in sent.members.items():
        assert _charged(world, order) == 1, f"order {order} charged {_charged(world, order)} times"
        stored = store.stored_result(world.client, task_id)
        assert stored == (states.SUCCESS, applied[order]), f"the stored result must be the applied one: {stored}"
    if shape == "group":
        return
    wait_for(lambda: _callbacks(world, sent.name), 60, "the callback")
    expected = applied[PAUSED] if shape == "chain" else sorted(applied.values())
    callbacks = _callbacks(world, sent.name)
    assert len(callbacks) == 1, f"the callback ran {len(callbacks)} times: {callbacks}"
    given = callbacks[0] if shape == "chain" else sorted(callbacks[0])
    assert given == expected, "the callback must get the applied executions' results"


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "store"), CASES, ids=map(_case_id, CASES), indirect=["store"])
def test_without_once_the_paused_member_applies_twice(world: Scenario, store: Store, shape: str) -> None:
    """Control: the paused member's refused copy retries, re-reads and charges again; a chain's next step runs twice."""
    use_backend(world, store)
    sent = SEND[shape](world, "member_repeatable", uuid.uuid4().hex[:6])
    _workers_with_one_paused(world, sent.paused_id)
    wait_for(lambda: _charged(world, PAUSED) >= 2, 60, "the refused copy's retry to charge again")
    assert _charged(world, PAUSED) == 2
    if shape == "chain":
        wait_for(lambda: len(_callbacks(world, sent.name)) >= 2, 60, "the chain's next step to run again")


@pytest.mark.slow
@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
@pytest.mark.parametrize("body", ["fenced_callback", "callback"], ids=["fenced", "control"])
def test_redelivered_chord_unlock_runs_a_fenced_callback_once(world: Scenario, store: Store, body: str) -> None:
    """SQLAlchemy's chords: a chord_unlock re-delivered after sending the callback sends it again; fenced, it runs once.

    w1 runs the header and the ``celery.chord_unlock`` polling it, and is
    frozen after the unlock sent the callback, before its ack (the callback's
    message is then w1's, or still in Redis); the broker re-delivers the
    unlock to w2, which finds the header ready and sends the callback again,
    with the same task id; w1 resumes. A fenced callback (exactly once on its
    task id) runs once; the control, a plain callback, runs twice.
    """
    use_backend(world, store)
    _configure_workers(world)
    world.env["FT_HOLD_UNLOCK"] = "1"
    name = uuid.uuid4().hex[:6]
    header = [_signature(world, "member", PAUSED, False), _signature(world, "member", OTHER, False)]
    callback = world.client.signature(f"{CANVAS}.{body}", args=(name,), queue=world.name)
    callback_id = str(chord(header)(callback).id)
    w1 = world.worker("w1")
    unlocked = lambda: [e for e in world.events() if e[0] == "unlocked"]  # noqa: E731
    held = wait_for(unlocked, 60, "chord_unlock to send the callback")[0]  # type: ignore[index]
    w1.pause()
    w2 = world.worker("w2")
    wait_for(lambda: w2.log().count(f"[{held[1]}] succeeded"), 60, "w2's copy of chord_unlock to send the callback")
    w1.resume()
    world.release(held[1], 0)
    logs = lambda: w1.log() + w2.log()  # noqa: E731
    if body == "fenced_callback":
        wait_for(lambda: f"[{callback_id}] ignored" in logs(), 60, "the second run of the callback to be ignored")
        assert len(_callbacks(world, name)) == 1, "a fenced callback runs once"
    else:
        wait_for(lambda: len(_callbacks(world, name)) >= 2, 60, "the callback to run a second time")
    assert logs().count(f"[{callback_id}] received") == 2, "the re-delivered unlock sent the callback again"
