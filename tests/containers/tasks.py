"""The tasks the container scenarios run inside fenced worker containers (copied into /app by the kit).

Configured from the container's environment: ``SCENARIO_REDIS_URL`` (task data,
events and the gate's store). Imports only what the worker image has.
"""

from __future__ import annotations

import os
import socket
import time
from functools import cache
from typing import Any

import redis
from celery import Task, shared_task

from celery_fencing import FencingError, RedisGate
from celery_fencing.celery import FencedTask, signals


@cache
def data() -> redis.Redis:
    # Built in the pool process that calls it first (cache after fork: one client per process).
    return redis.Redis.from_url(os.environ["SCENARIO_REDIS_URL"], decode_responses=True)


@cache
def gate() -> RedisGate:
    return RedisGate(data(), prefix="scenario:fence")


def gates() -> list[Any]:
    return [gate()]


def event(*fields: object) -> None:
    """One line of the scenario's event log (a plain list: what happened, in order)."""
    data().rpush("scenario:events", " ".join(map(str, fields)))


def session_changed(sender: Any = None, state: str = "", task_ids: Any = (), **_: Any) -> None:
    """The token source's ZooKeeper session was suspended or lost while these tasks held tokens."""
    for task_id in task_ids:
        event("session", task_id, state, socket.gethostname())


signals.session_state_changed.connect(session_changed, weak=False)


@shared_task(bind=True, base=FencedTask, acks_late=True, fencing_resource="record:{name}", fencing_gates=gates)
def write_record(self: Task, name: str, fenced: bool = True) -> str:
    """Claim *name*, stop at the pause point (first attempt of each delivery), then write host@token to it."""
    token = self.request.fencing_token.value
    host = socket.gethostname()
    event("start", self.request.id, token, host)
    if not self.request.retries:
        # The pause point: wait until the test releases this execution (task id + token).
        while not data().exists(f"scenario:release:{self.request.id}:{token}"):
            time.sleep(0.02)
    value = f"{host}@{token}"
    try:
        if fenced:
            gate().set(None, f"scenario:record:{name}", value)
        else:
            data().set(f"scenario:record:{name}", value)
    except FencingError as exc:
        event("refused", self.request.id, token, host, type(exc).__name__)
        raise
    event("wrote", self.request.id, token, host)
    return value
