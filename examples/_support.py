"""What every example's ``__main__`` needs: real ``celery worker`` processes, polling with a deadline, cleanup.

Not part of the library: a few lines each example would otherwise repeat.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

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


class Worker:
    """One ``celery -A <app> worker`` process, logging to a file."""

    def __init__(self, app: str, name: str, queue: str, log_dir: Path, pool: str, concurrency: int) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.args = [
            sys.executable, "-m", "celery", "-A", app, "worker", "-n", f"{name}@%h", "-Q", queue,
            "--pool", pool, "--concurrency", str(concurrency), "--loglevel", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker {self.name} exited with {self.proc.returncode}:\n{self.log()[-2000:]}")
        return " ready." in self.log()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGCONT)  # a paused worker cannot act on SIGTERM
            os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait(10)


@contextlib.contextmanager
def workers(
    app: str, names: Sequence[str], *, queue: str, log_dir: Path, pool: str = "solo", concurrency: int = 1
) -> Iterator[list[Worker]]:
    """Start one worker per name, wait until all are ready, and stop them all on the way out."""
    started = [Worker(app, name, queue, log_dir, pool, concurrency) for name in names]
    try:
        for worker in started:
            worker.start()
        wait_until(lambda: all(w.ready() for w in started), "the workers to start", timeout=90)
        yield started
    finally:
        for worker in started:
            worker.stop()


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
