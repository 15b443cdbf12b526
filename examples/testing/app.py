"""The app under test: a bank deposit, a read-modify-write fenced on its account.

``deposit`` reads the balance, then writes balance + amount through a
``RedisGate``. The task claims its token on the gate when it starts, so an
execution that is paused between its read and its write (the
``pause_point("after-read")``) and meanwhile overtaken by a newer one is
refused when it writes; by default (exactly once per task id) a copy of a task
that another execution already applied does not apply it again.

``EXAMPLE_FENCING=off`` switches fencing off: the same body as a plain task
with a plain ``SET``, which the tests beside this file must catch.

Configuration (environment): ``EXAMPLE_REDIS_URL`` (data and broker),
``EXAMPLE_NAMESPACE`` (queue and key prefix), ``EXAMPLE_FENCING``.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

import redis
from celery import Celery

from celery_fencing import RedisGate
from celery_fencing.celery import FencedTask, install
from celery_fencing.testing import pause_point

FENCED = os.environ.get("EXAMPLE_FENCING", "on") != "off"
REDIS_URL = os.environ.get("EXAMPLE_REDIS_URL", "redis://127.0.0.1:6379/0")
NAMESPACE = os.environ.get("EXAMPLE_NAMESPACE", "bank")

app = install(Celery("bank", broker=REDIS_URL))
app.conf.update(
    task_default_queue=NAMESPACE,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    fencing_retry_countdown=0.05,
)


@cache
def store() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL, decode_responses=True)


@cache
def gate() -> RedisGate:
    return RedisGate(store(), prefix=f"{NAMESPACE}:fence")


def balance_key(account_id: int) -> str:
    return f"{NAMESPACE}:balance:{account_id}"


def _deposit(account_id: int, amount: int) -> int:
    balance = int(store().get(balance_key(account_id)) or 0)
    pause_point("after-read")  # where a test freezes this execution
    if FENCED:
        gate().set(None, balance_key(account_id), balance + amount)
    else:
        store().set(balance_key(account_id), balance + amount)
    return balance + amount


FENCING: dict[str, Any] = {
    "base": FencedTask,
    "fencing_resource": "account:{account_id}",
    "fencing_gates": lambda: [gate()],
}
deposit = app.task(name="bank.deposit", **(FENCING if FENCED else {}))(_deposit)
