"""Tasks of the canvas tests (tests/celery/test_canvas.py), imported by the workers through ``imports``.

A group or chord member charges an order (a gated read-modify-write) and
returns the token of the execution that ran it; the chord's callback, a plain
task, records what it was called with, once per call.
"""

from __future__ import annotations

import json

from celery import Task

from celery_fencing.celery import FencedTask

from .app_under_test import _pause_point, app, data, gates, key


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
