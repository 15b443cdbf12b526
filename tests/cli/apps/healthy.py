"""A well-set-up app: SQLite source, a SQLGate and a RedisGate on a persistent Redis, fenced results, RabbitMQ.

CFT_BROKER broker URL, CFT_SOURCE token source URL, CFT_SQL database of the SQLGate,
CFT_REDIS a Redis with AOF persistence (gate and result backend).
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery
from sqlalchemy import create_engine

from celery_fencing.celery import FencedTask, install
from celery_fencing.gates.redis import RedisGate
from celery_fencing.gates.sql import SQLGate

app = install(Celery("healthy", broker=os.environ["CFT_BROKER"], backend="fenced+" + os.environ["CFT_REDIS"]))
app.conf.fencing_source = os.environ["CFT_SOURCE"]


def gates() -> list[Any]:
    return [
        SQLGate(create_engine(os.environ["CFT_SQL"])),
        RedisGate(redis.Redis.from_url(os.environ["CFT_REDIS"]), prefix="healthy"),
    ]


@app.task(base=FencedTask, fencing_resource="account:{account_id}", fencing_gates=gates)
def deposit(account_id: int, amount: int) -> None:
    """A fenced read-modify-write (never run by the doctor)."""
