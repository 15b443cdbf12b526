"""An app with the classic re-delivery traps, for the doctor to find.

Redis broker with a 60 s visibility_timeout, an acks_late task without a time
limit, a retry delay above the visibility_timeout, a RedisGate on a Redis
without persistence, a plain Redis result backend, and a ZooKeeper source on
one host whose session timeout (3 s) is below fencing_timeout.

CFT_REDIS Redis URL (broker, backend, gate), CFT_ZOOKEEPER ZooKeeper hosts.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery

from celery_fencing.celery import FencedTask, install
from celery_fencing.gates.redis import RedisGate

app = install(Celery("risky", broker=os.environ["CFT_REDIS"], backend=os.environ["CFT_REDIS"]))
app.conf.update(
    broker_transport_options={"visibility_timeout": 60},
    task_acks_late=True,
    fencing_source=f"zookeeper://{os.environ['CFT_ZOOKEEPER']}/doctor-risky?session_timeout=3",
    fencing_retry_max_delay=120,
)


def gates() -> list[Any]:
    return [RedisGate(redis.Redis.from_url(os.environ["CFT_REDIS"]), prefix="risky")]


@app.task(base=FencedTask, fencing_resource="report:{name}", fencing_gates=gates)
def build_report(name: str) -> None:
    """A long fenced job: acks_late from the app, no time limit."""


@app.task(base=FencedTask)
def cleanup(name: str) -> None:
    """A fenced job that claims no gate at start."""
