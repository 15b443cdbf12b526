"""Workers of every pool for the real-worker tests, and the processes their tasks run in."""

from __future__ import annotations

import json

from .conftest import Scenario
from .workers import WorkerProcess

#: The pools that run several executions side by side in one process.
IN_PROCESS_POOLS = ("gevent", "threads")


def start_pool_worker(scenario: Scenario, name: str, pool: str, concurrency: int) -> WorkerProcess:
    """Start a worker of *pool* for *scenario*.

    gevent, Redis broker, ``task_acks_late`` and a prefetch multiplier of 1:
    Celery's synloop waits out its 2 s drain timeout between rounds of tasks,
    fenced or not (40 tasks on 2 greenlets took 38 s); a multiplier of 4 keeps
    the worker busy (0.5 s).
    """
    if pool in ("gevent", "eventlet"):
        conf = json.loads(scenario.env.get("FT_CONF", "{}"))
        scenario.env["FT_CONF"] = json.dumps({"worker_prefetch_multiplier": 4, **conf})
    return scenario.worker(name, pool=pool, concurrency=concurrency)


def task_processes(worker: WorkerProcess, pool: str) -> list[int]:
    """The processes that run *worker*'s tasks: prefork's children, else the worker itself."""
    return worker.pool_pids() if pool == "prefork" else [worker.pid]
