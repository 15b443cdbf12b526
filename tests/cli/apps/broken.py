"""An app that cannot work: install() forgotten, a bad setting, unreachable broker and gate.

CFT_SOURCE token source URL.
"""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery

from celery_fencing.celery import FencedTask
from celery_fencing.gates.redis import RedisGate

app = Celery("broken", broker="redis://127.0.0.1:1/0")
app.conf.fencing_timeout = "soon"


def gates() -> list[Any]:
    return [RedisGate(redis.Redis(port=1, socket_connect_timeout=2), prefix="broken")]


@app.task(base=FencedTask, fencing_gates=gates)
def job() -> None:
    """Never run."""
