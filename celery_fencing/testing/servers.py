"""A throwaway server process: started with its log in a file, and signalled only by the pid it started.

The common part of the kit's ZooKeeper nodes and the test suite's etcd
members (and any other server a test starts): the process runs under the
parent-death signal and is registered for the exit hook
(:mod:`.processes`), in a session of its own (a terminal's Ctrl-C reaches
pytest first, whose teardown stops it in order); a test may stop it, kill it
(a crash: no shutdown hooks), pause it (SIGSTOP: connections stay open, nothing
answers) and resume it. Subclasses say how to start it and when it serves.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

from . import processes

__all__ = ["STOP_TIMEOUT", "ServerProcess"]

#: Seconds a stop waits for the process after SIGTERM (then SIGKILL), and a kill for it to go.
STOP_TIMEOUT = 15.0


class ServerProcess:
    """One server process a test started: its directory, its log and its process.

    :param directory: the process's working directory (created if missing).
    :param log_path: where its stdout and stderr go (appended across restarts).
    """

    #: What a failure to start, serve or be signalled raises (subclasses name their own).
    error: ClassVar[type[Exception]] = RuntimeError

    def __init__(self, directory: Path, log_path: Path) -> None:
        self.directory = directory
        self.log_path = log_path
        directory.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    def describe(self) -> str:
        """How messages name this server (``"etcd m1"``, ``"ZooKeeper on port 2181"``)."""
        return type(self).__name__

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        """Whether the process is alive (it may be paused)."""
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _spawn(self, command: Sequence[str]) -> None:
        """Start *command* under the parent-death signal, its output in the log; raise if already running."""
        if self.running:
            raise self.error(f"{self.describe()} is already running")
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it; closed right after fork
        try:
            self.process = subprocess.Popen(
                [*processes.PDEATHSIG, *command],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,
            )
        finally:
            log.close()
        self.paused = False
        processes.register(self.process)

    def _wait_until(self, serving: Callable[[], bool], timeout: float) -> None:
        """Poll *serving* until it holds; raise :attr:`error` with the log's tail if the process exits or time is up."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            if not self.running:
                code = self.process.returncode if self.process is not None else None
                raise self.error(f"{self.describe()} exited (rc={code}):\n{self.log_tail()}")
            if serving():
                return
            if time.monotonic() >= deadline:
                raise self.error(f"{self.describe()} did not serve within {timeout}s:\n{self.log_tail()}")
            time.sleep(delay)  # polling interval, not synchronisation: the loop re-checks
            delay = min(delay * 1.5, 0.25)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop gracefully (SIGTERM), escalating to SIGKILL; a no-op when not running."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
                # A paused process handles SIGTERM only once it runs again.
                proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self._forget()

    def kill(self) -> None:
        """SIGKILL the process (a crash: no shutdown hooks run)."""
        proc = self.process
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(STOP_TIMEOUT)
        self._forget()

    def pause(self) -> None:
        """SIGSTOP the process: connections stay open but nothing answers (a partition, a GC pause)."""
        if self.process is None or not self.running:
            raise self.error(f"{self.describe()} is not running")
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT a paused process."""
        if self.process is not None and self.running:
            self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def _forget(self) -> None:
        if self.process is not None:
            processes.forget(self.process)
        self.process = None
        self.paused = False

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<{self.describe()} {state}>"
