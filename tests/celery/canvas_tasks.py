"""Tasks of the canvas tests (tests/celery/backends/test_canvas.py), imported by the workers through ``imports``.

A group or chord member charges an order (a gated read-modify-write) and
returns the token of the execution that ran it; the chord's callback, a plain
task or a fenced one, records what it was called with, once per call. A
``task_postrun`` hook can hold the ``celery.chord_unlock`` that sent a
chord's callback (the SQLAlchemy backend's chords), for the test to pause.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Task, signals, states

from celery_fencing.celery import FencedTask

from .app_under_test import _pause_point, app, data, event, gates, key, wait_released


def _charge(task: Task, order_id: int, paused: bool) -> int:
    charged = int(data().get(key("charged", order_id)) or 0)
    if paused:
        _pause_point(task)  # the member the test freezes and re-delivers
    gates()[0].set(None, key("charged", order_id), charged + 1)
    return int(task.request.fencing_token.value)


@app.task(bind=True, base=FencedTask, fencing_resource="order:{order_id}", fencing_gates=gates)
def member(self: Task, order_id: int, paused: bool = False) -> int:
    """A canvas member with exactly once (the default): returns its execution's token."""
    return _charge(self, order_id, paused)


@app.task(bind=True, base=FencedTask, fencing_resource="order:{order_id}", fencing_gates=gates, fencing_once=False)
def member_repeatable(self: Task, order_id: int, paused: bool = False) -> int:
    """The same with exactly-once off (the control)."""
    return _charge(self, order_id, paused)


@app.task
def callback(results: list[int], name: str) -> None:
    """A plain chord body: its effect is one list entry per call, holding the header's results."""
    data().rpush(key("callback", name), json.dumps(results))


@app.task(bind=True, base=FencedTask, fencing_gates=gates)
def fenced_callback(self: Task, results: list[int], name: str) -> None:
    """The same chord body, fenced on its task id with exactly once: its gated write lets one run of the id go on."""
    gates()[0].set(None, key("callback", name, "given"), json.dumps(results))
    data().rpush(key("callback", name), json.dumps(results))


@signals.task_postrun.connect(weak=False)
def _hold_chord_unlock(
    task: Task | None = None, task_id: str | None = None, state: str | None = None, **_: Any
) -> None:
    """With ``FT_HOLD_UNLOCK`` set, the first ``celery.chord_unlock`` to send its callback waits, unacked, for the test.

    (Retries end as RETRY: only the run that found the header ready and sent
    the callback ends as SUCCESS.)
    """
    if not os.environ.get("FT_HOLD_UNLOCK") or task is None or task.name != "celery.chord_unlock":
        return
    if state == states.SUCCESS and data().set(key("held", "unlock"), str(task_id), nx=True, ex=600):
        event("unlocked", task_id, 0, os.getpid())
        wait_released(str(task_id), 0)
