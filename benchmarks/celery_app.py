"""The Celery app of the end-to-end benchmark: one short task, in four variants.

Each task does one Redis write and returns a result. The variants:

``plain``
    a plain task, a plain ``SET``, Celery's Redis result backend.
``singleton``
    the plain task under celery-singleton (a Redis lock per task's arguments,
    taken when the task is sent and released when it ends): a benchmark-only
    dependency, ``pip install 'celery-fencing[bench]'``.
``fenced``
    ``FencedTask`` in token mode, fenced on its task id (the default), the
    write through ``RedisGate.set``, results through ``fenced+redis://``.
``exclusive``
    ``FencedTask`` in exclusive mode, every task on one hot resource, the
    write through ``RedisGate.set``, results through ``fenced+redis://``.
``zk-write``
    the physical floor of token mode: the plain task plus one raw kazoo
    ``set()`` (one quorum write, what a token costs at least) per task on
    its process's own znode; no gate, the plain backend.

Workers run it as ``celery -A benchmarks.celery_app worker`` configured from
the environment: BENCH_VARIANT, BENCH_BROKER, BENCH_REDIS (task data and
results), BENCH_PREFIX (key prefix), BENCH_QUEUE, BENCH_SOURCE (token source
URL of the fenced variants), BENCH_LEASE_REUSE (``fencing_lease_reuse``).
The producer builds the same app with :func:`make_app`.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery
from celery.signals import worker_ready

TASK = "bench.work"
VARIANTS = ("plain", "singleton", "fenced", "exclusive", "zk-write")

_data: redis.Redis | None = None


def data(url: str) -> redis.Redis:
    """This process's Redis client for task data (redis-py rebuilds its pool after fork)."""
    global _data
    if _data is None:
        _data = redis.Redis.from_url(url)
    return _data


def make_app(
    variant: str,
    *,
    broker: str,
    redis_url: str,
    prefix: str,
    queue: str,
    source: str | None = None,
    lease_reuse: float | None = None,
    producer: bool = False,
) -> Celery:
    """Build the benchmark app of *variant*.

    The producer's app has no result backend: it sends tasks, and the
    benchmark polls the result keys in Redis, so the producer does not
    subscribe to every result (which would load the CPU the worker needs).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    fenced = variant in ("fenced", "exclusive")
    backend = None if producer else ("fenced+" + redis_url if fenced else redis_url)
    app = Celery(f"bench_{variant}", broker=broker, backend=backend)
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        broker_connection_retry_on_startup=True,
        result_expires=600,
        singleton_backend_url=redis_url,
        singleton_key_prefix=f"{prefix}:singleton:",
        fencing_timeout=10,
        fencing_retry_countdown=0.05,
        fencing_retry_max_delay=0.5,
    )
    if source is not None:
        app.conf.fencing_source = source
    if lease_reuse is not None:
        app.conf.fencing_lease_reuse = lease_reuse

    if fenced and not producer:
        from celery_fencing.celery import install

        install(app)

    built: list[Any] = []

    def gates() -> list[Any]:
        # One gate per process, built on first use (its client must not cross fork).
        if not built:
            from celery_fencing.gates.redis import RedisGate

            built.append(RedisGate(data(redis_url), prefix=f"{prefix}:fence"))
        return built

    if variant == "plain":

        @app.task(name=TASK, shared=False)
        def work(i: int) -> int:
            data(redis_url).set(f"{prefix}:k:{i}", i)
            return i

    elif variant == "zk-write":
        zk = _ZooKeeperWrite(source or "")

        @app.task(name=TASK, shared=False)
        def work(i: int) -> int:
            zk.write()
            data(redis_url).set(f"{prefix}:k:{i}", i)
            return i

    elif variant == "singleton":
        from celery_singleton import Singleton

        @app.task(name=TASK, base=Singleton, shared=False)
        def work(i: int) -> int:
            data(redis_url).set(f"{prefix}:k:{i}", i)
            return i

    elif variant == "fenced":
        from celery_fencing.celery import FencedTask

        @app.task(name=TASK, base=FencedTask, fencing_gates=gates, shared=False)
        def work(i: int) -> int:
            gates()[0].set(None, f"{prefix}:k:{i}", i)
            return i

    else:
        from celery_fencing.celery import FencedTask

        @app.task(
            name=TASK,
            base=FencedTask,
            fencing_gates=gates,
            fencing_mode="exclusive",
            fencing_resource=f"{prefix}:hot",
            shared=False,
        )
        def work(i: int) -> int:
            gates()[0].set(None, f"{prefix}:k:{i}", i)
            return i

    if not producer:

        def ready(**_: Any) -> None:
            data(redis_url).set(f"{prefix}:ready", os.getpid(), ex=600)

        worker_ready.connect(ready, weak=False)
    return app


class _ZooKeeperWrite:
    """One kazoo client per process (started after fork), writing its own znode."""

    def __init__(self, url: str) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.hosts, self.root = parts.netloc, parts.path or "/bench-floor"
        self._client: Any = None
        self._path = ""

    def write(self) -> None:
        if self._client is None:
            from kazoo.client import KazooClient

            self._client = KazooClient(self.hosts, timeout=10)
            self._client.start(30)
            self._path = f"{self.root}/floor-{os.getpid()}"
            self._client.ensure_path(self._path)
        self._client.set(self._path, b"")


if os.environ.get("BENCH_VARIANT"):
    reuse = os.environ.get("BENCH_LEASE_REUSE")
    app = make_app(
        os.environ["BENCH_VARIANT"],
        broker=os.environ["BENCH_BROKER"],
        redis_url=os.environ["BENCH_REDIS"],
        prefix=os.environ["BENCH_PREFIX"],
        queue=os.environ["BENCH_QUEUE"],
        source=os.environ.get("BENCH_SOURCE") or None,
        lease_reuse=float(reuse) if reuse else None,
    )
