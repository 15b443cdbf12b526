"""The backend contract suite's fixtures: one store per parameter (see :mod:`.stores`), and workers on it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from ..conftest import Scenario
from ..pools import IN_PROCESS_POOLS, task_processes
from ..workers import WorkerProcess
from .stores import STORES, Store, django_store, drop_postgresql_tables, postgresql_store, redis_store


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, unique_name: str) -> Iterator[Store]:
    """One result store, its fenced and plain apps closed and its keys or tables removed after the test."""
    kind = request.param
    built: Store
    if kind == "redis":
        built = redis_store(request.getfixturevalue("redis_url"), unique_name)
    elif kind == "postgresql":
        built = postgresql_store(request.getfixturevalue("postgres_url"), unique_name)
    else:
        request.getfixturevalue("django_project")
        built = django_store(kind)
    yield built
    for app in built.apps:
        _clean(built, app, unique_name)
        app.close()
    if kind == "postgresql":
        drop_postgresql_tables(request.getfixturevalue("postgres_url"), built)


def _clean(store: Store, app: Any, name: str) -> None:
    if store.kind == "redis":
        keys = list(app.backend.client.scan_iter(f"{name}:*"))
        if keys:
            app.backend.client.delete(*keys)


class PoolWorker(WorkerProcess):
    """A worker of any pool whose pause and resume stop the processes that run its tasks.

    Prefork's children (the parent goes on consuming, but a concurrency of 1
    lets it hold no message but the paused one), else the worker itself.
    """

    def __init__(self, *args: Any, pool: str, **kwargs: Any) -> None:
        super().__init__(*args, pool=pool, **kwargs)
        self.pool = pool

    def pause(self, pid: int | None = None) -> None:
        for target in [pid] if pid else task_processes(self, self.pool):
            super().pause(target)

    def resume(self, pid: int | None = None) -> None:
        for target in [pid] if pid else task_processes(self, self.pool):
            super().resume(target)


#: The pools whose workers run no event loop: kombu's Redis transport never sweeps their unacked
#: messages back to the queue (it sweeps from the loop's timer), so on them nothing is re-delivered
#: unless another worker, or the test, sweeps.
GREEN_POOLS = ("gevent", "eventlet")


class UnackedSweeper:
    """Puts a scenario's unacked messages back on their queue past the visibility timeout, as a worker's loop does.

    On the scenario's own unacked keys only, so it never re-delivers another test's messages.
    """

    def __init__(self, broker_url: str, options: dict[str, Any]) -> None:
        self.broker_url = broker_url
        self.options = options
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="unacked-sweeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with Connection(self.broker_url, transport_options=self.options) as connection:
            qos = connection.default_channel.qos
            while not self._stop.wait(0.25):
                qos.restore_visible(num=100, interval=1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class PoolScenario(Scenario):
    """A scenario whose workers run *pool* (one task at a time on prefork, two on the in-process pools).

    On gevent and eventlet its workers keep their unacked messages under keys
    of their own, and the test process sweeps them (see :data:`GREEN_POOLS`).
    """

    worker_class = PoolWorker

    def __init__(self, *args: Any, pool: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool = pool
        self.sweeper: UnackedSweeper | None = None

    def worker(
        self, name: str, *, pool: str | None = None, concurrency: int | None = None, extra_args: tuple[str, ...] = ()
    ) -> WorkerProcess:
        pool = pool or self.pool
        if pool in GREEN_POOLS and self.sweeper is None:
            self.sweeper = self._sweep()
        concurrency = concurrency or (2 if pool in IN_PROCESS_POOLS else 1)
        return super().worker(name, pool=pool, concurrency=concurrency, extra_args=extra_args)

    def _sweep(self) -> UnackedSweeper:
        own = {f"unacked{part}_key": self.key(f"unacked{part}") for part in ("", "_index", "_mutex")}
        conf = json.loads(self.env.get("FT_CONF", "{}"))
        conf["broker_transport_options"] = {**conf.get("broker_transport_options", {}), **own}
        self.env["FT_CONF"] = json.dumps(conf)
        visibility = float(self.env.get("FT_VISIBILITY_TIMEOUT", 3600))
        return UnackedSweeper(self.env["FT_BROKER"], {**own, "visibility_timeout": visibility})

    def close(self) -> None:
        """Stop the workers side by side (a gevent worker's warm shutdown takes about 5 s), then clean up."""
        stopping = [threading.Thread(target=worker.stop) for worker in self.workers]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()
        if self.sweeper is not None:
            self.sweeper.stop()
        super().close()


@pytest.fixture
def pool() -> str:
    """The pool of the workers of :func:`world` (tests parametrize it)."""
    return "solo"


@pytest.fixture
def world(store: Store, pool: str, redis_url: str, tmp_path: Path, unique_name: str) -> Iterator[Scenario]:
    """Workers of *pool* on the Redis broker whose results go to *store* (the Django stores: the Django worker app)."""
    scenario = PoolScenario(unique_name, redis_url, tmp_path, pool=pool)
    scenario.env.update(store.worker_env())
    scenario.app_module = store.worker_app
    yield scenario
    scenario.close()


def use_backend(scenario: Scenario, store: Store, *, fenced: bool = True) -> None:
    """Point *scenario*'s workers and client at *store*'s fenced backend (or at its plain one, the control)."""
    scenario.env["FT_BACKEND"] = store.fenced_url if fenced else store.plain_url
    client = store.app(fenced=fenced)
    client.conf.broker_url = scenario.env["FT_BROKER"]
    client.conf.task_default_queue = scenario.name
    scenario._client = client
