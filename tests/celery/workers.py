"""Real ``celery worker`` processes for the integration tests.

Each WorkerProcess is started in its own process group, so a test can pause or
kill the pool children as well as the parent, and cleanup reaches every
process it started, also when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from celery_fencing.testing.processes import children_of, process_state, wait_for

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """One ``celery -A <app> worker`` subprocess with its log captured to a file."""

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
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.args = [
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
            "-P",
            pool,
            "-c",
            str(concurrency),
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            *extra_args,
        ]
        # The checkout first, then what the test process was given (a worker imports what the test does).
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.env = {**os.environ, "PYTHONPATH": path, **env}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> WorkerProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        wait_for(lambda: self._ready(), timeout, f"worker {self.name} to be ready (log: {self.log_path})")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"worker {self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        return " ready." in self.log()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def pool_pids(self) -> list[int]:
        """The prefork pool's child processes (empty for solo/threads)."""
        return children_of(self.pid)

    def pause(self, pid: int | None = None) -> None:
        """SIGSTOP one process (default: the worker itself) and wait until the kernel shows it stopped."""
        target = pid or self.pid
        os.kill(target, signal.SIGSTOP)
        wait_for(lambda: process_state(target) in ("T", "t", ""), 10, f"pid {target} to stop")

    def resume(self, pid: int | None = None) -> None:
        os.kill(pid or self.pid, signal.SIGCONT)

    def stop(self, timeout: float = 20) -> None:
        """Warm shutdown, then SIGKILL of the whole process group if it does not finish."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGTERM)
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait(10)
