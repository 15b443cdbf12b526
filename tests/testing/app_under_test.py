"""The Celery app the kit's own tests run in real workers: a task with a pause point, fenced on a resource.

Configured from the environment: ``KIT_REDIS_URL`` (data, gate), ``KIT_BROKER``
(default the Redis URL), ``KIT_QUEUE``.
"""

from __future__ import annotations

import os
from functools import cache

import redis
from celery import Celery

from celery_fencing import RedisGate
from celery_fencing.celery import FencedTask, install
from celery_fencing.testing import pause_point

REDIS_URL = os.environ.get("KIT_REDIS_URL", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("KIT_QUEUE", "kit")

app = install(Celery("kit", broker=os.environ.get("KIT_BROKER") or REDIS_URL))
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    fencing_retry_countdown=0.05,
)


@cache
def gate() -> RedisGate:
    return RedisGate(redis.Redis.from_url(REDIS_URL, decode_responses=True), prefix=f"{QUEUE}:fence")


@app.task(name="kit.write", base=FencedTask, fencing_resource="item:{item}", fencing_gates=lambda: [gate()])
def write(item: str, value: str) -> str:
    """Pause at "before-write", then write *value* to the item through the gate."""
    pause_point("before-write")
    gate().set(None, f"{QUEUE}:item:{item}", value)
    return value
