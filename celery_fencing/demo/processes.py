"""Real ``celery worker`` subprocesses for the demo: start, freeze, thaw, stop.

Each worker runs in its own session, so a Ctrl-C in the terminal reaches only
the runner, which then stops the workers itself (in order, SIGCONT first: a
frozen process cannot act on SIGTERM). Where ``setpriv --pdeathsig`` exists,
a worker is also killed by the kernel if the runner dies without cleaning up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from ..testing.processes import PDEATHSIG, spawn

__all__ = ["DemoWorker", "process_state"]

APP_MODULE = "celery_fencing.demo.app"
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def process_state(pid: int) -> str:
    """The one-letter scheduler state of *pid* (R, S, T for stopped, Z...), '' if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ""
    except OSError:
        stat = ""
    if stat:
        return stat.rsplit(")", 1)[1].split()[0]
    # No /proc (macOS): ask ps.
    done = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, check=False)
    return done.stdout.strip()[:1]


class DemoWorker:
    """One ``celery -A celery_fencing.demo.app worker --pool solo`` process, logging to a file."""

    def __init__(self, name: str, queue: str, env: Mapping[str, str], directory: Path) -> None:
        self.name = name
        self.log_path = directory / f"{name}.log"
        self.directory = directory
        self.args = [
            *PDEATHSIG,
            sys.executable,
            "-m",
            "celery",
            "-A",
            APP_MODULE,
            "worker",
            "-n",
            f"{name}@%h",
            "-Q",
            queue,
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        python_path = os.pathsep.join(p for p in (_PACKAGE_PARENT, os.environ.get("PYTHONPATH", "")) if p)
        self.env = {**os.environ, **env, "CELERY_FENCING_DEMO_WORKER": name, "PYTHONPATH": python_path}
        self.proc: subprocess.Popen[bytes] | None = None
        self.frozen = False

    def start(self) -> None:
        """Start the process (readiness is reported through the event log)."""
        self.proc = spawn(self.args, self.log_path, cwd=self.directory, env=self.env)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "worker not started"
        return self.proc.pid

    def exit_code(self) -> int | None:
        """The exit code if the process ended, else ``None``."""
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def freeze(self, timeout: float = 10.0) -> None:
        """SIGSTOP the worker and wait until the kernel reports it stopped."""
        os.kill(self.pid, signal.SIGSTOP)
        self.frozen = True
        deadline = time.monotonic() + timeout
        while process_state(self.pid) not in ("T", "t"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} (pid {self.pid}) did not stop within {timeout:.0f}s")
            time.sleep(0.005)

    def thaw(self) -> None:
        """SIGCONT the worker."""
        os.kill(self.pid, signal.SIGCONT)
        self.frozen = False

    def send_stop(self) -> None:
        """Ask for a warm shutdown (SIGCONT first: a stopped process cannot act on SIGTERM)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGTERM)

    def wait_stopped(self, grace: float) -> None:
        """Wait *grace* seconds for the process to end, then SIGKILL its whole process group."""
        if self.proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(grace)
        if self.proc.poll() is None:
            # Still unreaped, so its pid (and group id) cannot have been reused.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
