"""A Celery app with Prometheus metrics on, run by ``celery worker`` in the metrics test.

Environment: FT_BROKER, FT_BACKEND, FT_REDIS, FT_PREFIX, FT_SOURCE (as in
tests/celery/app_under_test.py), and FT_METRICS_PORT: the worker serves
``/metrics`` there once it is ready.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery, Task
from celery.signals import worker_ready
from prometheus_client import start_http_server

from celery_fencing import RedisGate
from celery_fencing.celery import FencedTask, install
from celery_fencing.celery.runtime import runtime_for
from celery_fencing.metrics import MeteredGate, enable_prometheus

PREFIX = os.environ.get("FT_PREFIX", "ft")

app = install(Celery("app_metrics", broker=os.environ.get("FT_BROKER"), backend=os.environ.get("FT_BACKEND")))
app.conf.update(
    task_default_queue=PREFIX,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    fencing_source=os.environ.get("FT_SOURCE"),
    fencing_retry_countdown=0.05,
    fencing_retry_max_delay=0.2,
    result_expires=600,
)
enable_prometheus()

_gate: list[Any] = []


def gates() -> list[Any]:
    """One metered Redis gate per process."""
    if not _gate:
        _gate.append(MeteredGate(RedisGate(redis.Redis.from_url(os.environ["FT_REDIS"]), prefix=f"{PREFIX}:fence")))
    return _gate


@worker_ready.connect
def _serve(**_: Any) -> None:
    start_http_server(int(os.environ["FT_METRICS_PORT"]), addr="127.0.0.1")


@app.task(bind=True, base=FencedTask, fencing_resource="m:{name}", fencing_gates=gates)
def fenced_once(self: Task, name: str) -> int:
    """On its first attempt a newer execution claims the resource first, so its write is refused; the retry lands."""
    token = self.request.fencing_token
    if not self.request.retries:
        gates()[0].claim(runtime_for(app).source().mint(token.resource))
    gates()[0].set(None, f"{PREFIX}:data:{name}", token.value)
    return int(token.value)


@app.task(bind=True, base=FencedTask, fencing_resource="c:{name}", fencing_gates=gates, fencing_on_stale="raise")
def claim_refused(self: Task, name: str) -> None:
    """Never runs its body: the test raised the resource's mark above any token first."""


@app.task(bind=True, base=FencedTask, fencing_once=False)
def drop_result(self: Task) -> str:
    """A newer execution claims this task's result while it runs, so its own result write is dropped.

    Without exactly-once: with it, this execution would seal the task first and its result would stand.
    """
    newer = runtime_for(app).source().mint(self.request.fencing_resource)
    self.backend.claim_result(self.request.id, newer)
    return "dropped"
