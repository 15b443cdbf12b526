"""Real ``celery worker`` processes for the integration tests.

Each WorkerProcess is started in its own process group, so a test can pause or
kill the pool children as well as the parent, and cleanup reaches every
process it started, also when the test fails.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from celery_fencing.testing.processes import process_state, wait_for
from celery_fencing.testing.workers import WorkerProcess as KitWorkerProcess
from celery_fencing.testing.workers import worker_options

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess(KitWorkerProcess):
    """One ``celery -A <app> worker`` subprocess of the suite's apps, with its log captured to a file."""

    def __init__(
        self,
        app_module: str,
        *,
        name: str,
        queue: str,
        env: dict[str, str],
        log_dir: Path,
        pool: str = "solo",
        concurrency: int = 1,
        extra_args: Sequence[str] = (),
    ) -> None:
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app_module,
            "worker",
            "-n",
            f"{name}.{queue}@%h",  # unique on a shared RabbitMQ: one node name, one exclusive pidbox queue
            "-Q",
            queue,
            *worker_options(pool, concurrency),
            *extra_args,
        ]
        # The checkout first, then what the test process was given (a worker imports what the test does).
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        environment = {**os.environ, "PYTHONPATH": path, **env}
        super().__init__(args, name=name, log_path=log_dir / f"{name}.log", env=environment, cwd=ROOT)

    def pause(self, pid: int | None = None) -> None:
        """SIGSTOP one process (default: the worker itself) and wait until the kernel shows it stopped."""
        target = pid or self.pid
        os.kill(target, signal.SIGSTOP)
        wait_for(lambda: process_state(target) in ("T", "t", ""), 10, f"pid {target} to stop")

    def resume(self, pid: int | None = None) -> None:
        os.kill(pid or self.pid, signal.SIGCONT)
