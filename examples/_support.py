"""What every example's ``__main__`` needs: real ``celery worker`` processes, polling with a deadline, cleanup.

Not part of the library: a few lines each example would otherwise repeat. The worker processes are the
library's testing kit's (:class:`celery_fencing.testing.workers.WorkerProcess`): their own process group,
killed with the run if it dies.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from celery_fencing.testing.workers import WorkerProcess, worker_options

ROOT = Path(__file__).resolve().parents[1]


def unique(prefix: str) -> str:
    """A name no other run uses: queues, keys and tables on shared servers carry it."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Poll *predicate* until it is true; raise naming *what* after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def worker(app: str, name: str, queue: str, log_dir: Path, pool: str, concurrency: int) -> WorkerProcess:
    """One ``celery -A <app> worker`` process, logging to ``<log_dir>/<name>.log`` (not started yet)."""
    args = [sys.executable, "-m", "celery", "-A", app, "worker", "-n", f"{name}@%h", "-Q", queue]
    args += worker_options(pool, concurrency)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return WorkerProcess(args, name=name, log_path=log_dir / f"{name}.log", env=env, cwd=ROOT)


@contextlib.contextmanager
def workers(
    app: str, names: Sequence[str], *, queue: str, log_dir: Path, pool: str = "solo", concurrency: int = 1
) -> Iterator[list[WorkerProcess]]:
    """Start one worker per name, wait until all are ready, and stop them all on the way out."""
    started = [worker(app, name, queue, log_dir, pool, concurrency) for name in names]
    try:
        for each in started:
            each.launch()
        for each in started:
            each.wait_ready(timeout=90)
        yield started
    finally:
        for each in started:
            each.stop(timeout=5)


@contextlib.contextmanager
def example_run(name: str) -> Iterator[tuple[str, Path]]:
    """One run of an example: a namespace no other run uses and a temporary directory, yielded as a pair.

    The namespace goes to ``EXAMPLE_NAMESPACE``, which the example's ``tasks.py`` reads when it is imported
    (after this, here and in the workers); the directory holds the worker logs and, unless
    ``FENCING_SOURCE`` is set, the SQLite token file.
    """
    namespace = unique(name)
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        os.environ.setdefault("FENCING_SOURCE", f"sqlite:///{Path(tmp) / 'tokens.db'}")
        os.environ["EXAMPLE_NAMESPACE"] = namespace
        yield namespace, Path(tmp)


def delete_queues(broker_url: str, namespace: str) -> None:
    """Remove the run's queues and kombu bindings from a Redis broker (with another broker, leave them)."""
    if broker_url.startswith("redis"):
        delete_redis_keys(broker_url, f"*{namespace}*")


def delete_redis_keys(url: str, pattern: str) -> None:
    """Remove what a run left in a shared Redis (queues, kombu bindings, data)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(pattern))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
