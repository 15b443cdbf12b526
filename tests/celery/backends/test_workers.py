"""The contract's core on real ``celery worker`` processes, over every store: a stale execution's result is dropped.

The timeline of test_redelivery: w1 starts the task and is frozen (SIGSTOP)
past the Redis visibility timeout; the broker re-delivers it to w2, which
claims the result with a newer token; both finish, in the order that lets
the plain backend of the store keep the stale result: the stale one first
where the plain backend keeps the first SUCCESS (Redis, SQLAlchemy), last
where it keeps the last write (django-celery-results). With the fenced
backend the stale write is dropped and logged, and the newer result stands.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import Scenario
from ..test_redelivery import redeliver_while_paused
from .stores import Store

#: Stores whose plain backend keeps the last write (the others keep the first SUCCESS).
LAST_WRITE_WINS = frozenset({"django-postgresql", "django-sqlite"})


@pytest.fixture
def world(store: Store, redis_url: str, tmp_path: Path, unique_name: str) -> Iterator[Scenario]:
    """Workers on the Redis broker whose results go to *store*."""
    scenario = Scenario(unique_name, redis_url, tmp_path)
    scenario.env.update(store.worker_env())
    if store.kind in LAST_WRITE_WINS:
        scenario.app_module = "tests.celery.backends.django_worker"
    yield scenario
    scenario.close()


def _use_backend(scenario: Scenario, store: Store, *, fenced: bool) -> None:
    scenario.env["FT_BACKEND"] = store.fenced_url if fenced else store.plain_url
    client = store.app(fenced=fenced)
    client.conf.broker_url = scenario.env["FT_BROKER"]
    client.conf.task_default_queue = scenario.name
    scenario._client = client


@pytest.mark.slow
@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "control"])
def test_stale_result_is_dropped_on_real_workers(world: Scenario, store: Store, fenced: bool) -> None:
    """Fenced: the paused execution's result write is dropped and logged. Control: the plain backend stores it."""
    _use_backend(world, store, fenced=fenced)
    stale_first = store.kind not in LAST_WRITE_WINS
    run = redeliver_while_paused(world, "result_only_job_repeatable", "v", stale_finishes_first=stale_first)
    assert int(run.newer_token) > int(run.stale_token)
    stored = world.client.AsyncResult(run.task_id).get(timeout=20)
    if fenced:
        assert "dropped SUCCESS result of task " + run.task_id in run.w1.log()
        assert stored == f"v@{run.newer_token}@{run.newer_pid}"
    else:
        assert stored == f"v@{run.stale_token}@{run.stale_pid}"
