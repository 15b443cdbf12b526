"""Fixtures for tests that run real ``celery worker`` processes."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_fencing.celery import install
from tests.fixtures.services import armed, delete_keys

from .workers import WorkerProcess, wait_for

APP_MODULE = "tests.celery.app_under_test"


class Scenario:
    """One test's world: a queue, a key prefix, a token source, workers, and a client app."""

    #: What :meth:`add_worker` builds.
    worker_class: type[WorkerProcess] = WorkerProcess

    def __init__(self, name: str, redis_url: str, tmp_path: Path, broker: str | None = None) -> None:
        self.name = name
        self.tmp_path = tmp_path
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.source_url = f"sqlite:///{tmp_path / 'tokens.db'}"
        self.env: dict[str, str] = {
            "FT_BROKER": broker or redis_url,
            "FT_BACKEND": "fenced+" + redis_url,
            "FT_REDIS": redis_url,
            "FT_PREFIX": name,
            "FT_QUEUE": name,
            "FT_SOURCE": self.source_url,
        }
        self.workers: list[WorkerProcess] = []
        self.pool = "solo"
        #: The module the workers load the app from (``celery -A``).
        self.app_module = APP_MODULE
        #: Where the tasks :meth:`send` names are defined (a backend's worker app imports them from here).
        self.task_module = APP_MODULE
        self._client: Celery | None = None

    @property
    def client(self) -> Celery:
        """A producer-side app: sends tasks by name and reads results through the fenced backend."""
        if self._client is None:
            self._client = Celery("client", broker=self.env["FT_BROKER"], backend=self.env["FT_BACKEND"])
            self._client.conf.task_default_queue = self.name
            if "FT_VISIBILITY_TIMEOUT" in self.env:
                self._client.conf.broker_transport_options = {
                    "visibility_timeout": float(self.env["FT_VISIBILITY_TIMEOUT"])
                }
        return self._client

    def send(self, task: str, *args: Any, task_id: str | None = None, **kwargs: Any) -> Any:
        """Send the task *task* of :attr:`task_module`, by name, to this scenario's queue."""
        name = f"{self.task_module}.{task}"
        return self.client.send_task(name, args=args, kwargs=kwargs, queue=self.name, task_id=task_id)

    def add_worker(
        self, name: str, *, pool: str = "solo", concurrency: int = 1, extra_args: tuple[str, ...] = ()
    ) -> WorkerProcess:
        """A worker (a :attr:`worker_class`) of :attr:`app_module` on this scenario's queue and environment,
        not started yet; :meth:`close` stops it."""
        process = self.worker_class(
            self.app_module,
            name=f"{self.name}-{name}",
            queue=self.name,
            env=self.env,
            log_dir=self.tmp_path,
            pool=pool,
            concurrency=concurrency,
            extra_args=extra_args,
        )
        self.workers.append(process)
        return process

    def worker(
        self, name: str, *, pool: str = "solo", concurrency: int = 1, extra_args: tuple[str, ...] = ()
    ) -> WorkerProcess:
        """:meth:`add_worker`, started (ready when this returns)."""
        return self.add_worker(name, pool=pool, concurrency=concurrency, extra_args=extra_args).start()

    def key(self, *parts: object) -> str:
        return ":".join([self.name, *map(str, parts)])

    def events(self) -> list[list[str]]:
        return [line.split() for line in self.redis.lrange(self.key("events"), 0, -1)]

    def events_of(self, kind: str, task_id: str) -> list[list[str]]:
        """The events of one kind recorded by the executions of *task_id*."""
        return [event for event in self.events() if event[0] == kind and event[1] == task_id]

    def check_exclusive_runs_one_at_a_time(self) -> None:
        """Two executions of one resource in exclusive mode (task ``exclusive_job`` on a prefork
        worker of concurrency 2): the second enters only after the first exits, with a larger token."""
        name = uuid.uuid4().hex[:6]
        first = self.send("exclusive_job", name)
        entered = wait_for(lambda: self.events_of("enter", first.id), 60, "the first execution to enter")
        second = self.send("exclusive_job", name)
        # The second is received by the free pool process and waits for the lease:
        # it must not enter while the first holds it.
        wait_for(lambda: f"[{second.id}] received" in self.workers[0].log(), 30, "the second task to be received")
        assert not self.events_of("enter", second.id)
        self.release(first.id, entered[0][2])  # type: ignore[index]
        first_token = first.get(timeout=60)
        second_enter = wait_for(lambda: self.events_of("enter", second.id), 60, "the second execution to enter")
        self.release(second.id, second_enter[0][2])  # type: ignore[index]
        second_token = second.get(timeout=60)
        assert second_token > first_token
        order = [event[0] for event in self.events() if event[0] in ("enter", "exit")]
        assert order == ["enter", "exit", "enter", "exit"]

    def release(self, task_id: str, token: int | str) -> None:
        """Let the execution of *task_id* holding *token* go on past its wait."""
        self.redis.set(self.key("release", task_id, token), 1, ex=600)

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        if self._client is not None:
            self._client.close()
        keys = list(self.redis.scan_iter(f"{self.name}*")) + list(self.redis.scan_iter(f"*{self.name}*"))
        if keys:
            self.redis.delete(*set(keys))
        self.redis.close()


@pytest.fixture(scope="module", params=["solo", "prefork", "threads", "gevent", "eventlet"])
def pooled_worker(
    request: pytest.FixtureRequest, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scenario]:
    """One worker per pool kind, shared by a module's tests (starting workers is the slow part)."""
    pool = request.param
    world = Scenario("t" + uuid.uuid4().hex[:12], redis_url, tmp_path_factory.mktemp(pool))
    world.pool = pool
    world.worker("w", pool=pool, concurrency=1 if pool == "solo" else 2)
    yield world
    world.close()


@pytest.fixture
def app(redis_url: str, unique_name: str) -> Iterator[Celery]:
    """A Celery app with the fenced+redis:// backend, its keys under this test's prefix (removed after)."""
    app = Celery("fenced-backend-test", backend="fenced+" + redis_url, set_as_current=False)
    app.conf.result_backend_transport_options = {"global_keyprefix": f"{unique_name}:"}
    armed(app.backend)  # the tests make their tokens by hand
    yield app
    keys = list(app.backend.client.scan_iter(f"{unique_name}:*"))
    if keys:
        app.backend.client.delete(*keys)
    app.close()


@contextlib.contextmanager
def embedded_app(name: str, redis_url: str, tmp_path: Path, unique_name: str, **options: Any) -> Iterator[Celery]:
    """An installed app for an embedded worker (celery.contrib.testing) in this process.

    The Redis broker on this test's queue, the fenced+redis:// backend under
    this test's key prefix, a SQLite source in *tmp_path*; its keys are
    removed after. *options* go to ``Celery()`` (``task_cls``, for one).
    """
    app = install(Celery(name, broker=redis_url, backend="fenced+" + redis_url, set_as_current=False, **options))
    app.conf.update(
        task_default_queue=unique_name,
        fencing_source=f"sqlite:///{tmp_path / 'tokens.db'}",
        result_backend_transport_options={"global_keyprefix": f"{unique_name}:"},
    )
    try:
        yield app
    finally:
        client = redis.Redis.from_url(redis_url)
        delete_keys(client, unique_name)
        client.close()
        app.close()


@pytest.fixture
def scenario(redis_url: str, tmp_path: Path, unique_name: str) -> Iterator[Scenario]:
    world = Scenario(unique_name, redis_url, tmp_path)
    yield world
    world.close()
