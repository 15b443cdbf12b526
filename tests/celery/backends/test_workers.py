"""The contract's core on real ``celery worker`` processes, over every store: a stale execution's result is dropped.

The timeline of test_redelivery: w1 starts the task and is frozen (SIGSTOP)
past the Redis visibility timeout; the broker re-delivers it to w2, which
claims the result with a newer token; both finish, in the order that lets
the plain backend of the store keep the stale result: the stale one first
where the plain backend keeps the first SUCCESS (Redis, SQLAlchemy), last
where it keeps the last write (django-celery-results). With the fenced
backend the stale write is dropped and logged, and the newer result stands.

Every store runs on solo workers, and the database backends on prefork,
threads and gevent too (:class:`.conftest.PoolScenario`: the pause stops the
processes that run the tasks, and on gevent the test sweeps the unacked
messages back, which a gevent worker does not do).
"""

from __future__ import annotations

import pytest

from ..conftest import Scenario
from ..test_redelivery import redeliver_while_paused
from .conftest import use_backend
from .stores import STORES, Store

#: Stores whose plain backend keeps the last write (the others keep the first SUCCESS).
LAST_WRITE_WINS = frozenset({"django-postgresql", "django-sqlite"})

#: (pool, store): every store on solo; on prefork, threads and gevent both database backends, the
#: SQLAlchemy one on PostgreSQL and the Django one on PostgreSQL (psycopg, as SQLAlchemy's) but on
#: threads on SQLite (Django's connection per thread, on a database with one writer at a time).
CASES = [("solo", kind) for kind in STORES] + [
    ("prefork", "postgresql"),
    ("prefork", "django-postgresql"),
    ("threads", "postgresql"),
    ("threads", "django-sqlite"),
    ("gevent", "postgresql"),
    ("gevent", "django-postgresql"),
]


@pytest.mark.slow
@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "control"])
@pytest.mark.parametrize(("pool", "store"), CASES, ids=["-".join(case) for case in CASES], indirect=["store"])
def test_stale_result_is_dropped_on_real_workers(world: Scenario, store: Store, pool: str, fenced: bool) -> None:
    """Fenced: the paused execution's result write is dropped and logged. Control: the plain backend stores it."""
    use_backend(world, store, fenced=fenced)
    stale_first = store.kind not in LAST_WRITE_WINS
    run = redeliver_while_paused(world, "result_only_job_repeatable", "v", stale_finishes_first=stale_first)
    assert int(run.newer_token) > int(run.stale_token)
    stored = world.client.AsyncResult(run.task_id).get(timeout=20)
    if fenced:
        assert "dropped SUCCESS result of task " + run.task_id in run.w1.log()
        assert stored == f"v@{run.newer_token}@{run.newer_pid}"
    else:
        assert stored == f"v@{run.stale_token}@{run.stale_pid}"
