"""Throwaway server processes: started with their logs in files, and signalled only by the pids they started.

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
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from . import processes

__all__ = ["START_TIMEOUT", "STOP_TIMEOUT", "ServerGroup", "ServerProcess", "source_url"]

#: Seconds a start may take: generous, as other suites may share a small machine's cores.
START_TIMEOUT = 60.0

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

    def launch(self) -> None:
        """Start the process without waiting for it to serve (subclasses: :meth:`_spawn` their command)."""
        raise NotImplementedError

    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        """Return once the server answers; raise :attr:`error` if it exits or *timeout* passes."""
        raise NotImplementedError

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
        self.process = processes.spawn([*processes.PDEATHSIG, *command], self.log_path, cwd=self.directory)
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


def source_url(scheme: str, hosts: str, path: str, params: Mapping[str, object]) -> str:
    """A token source URL naming a group's members: ``scheme://hosts/path``, with *params* as its query."""
    query = "&".join(f"{key}={value}" for key, value in params.items())
    return f"{scheme}://{hosts}{path}" + (f"?{query}" if query else "")


Member = TypeVar("Member", bound=ServerProcess)
Group = TypeVar("Group", bound="ServerGroup[Any]")


class ServerGroup(Generic[Member]):
    """Members that serve together under one leader (a ZooKeeper ensemble, an etcd cluster), in one directory.

    A standalone server is a group of one whose member leads itself.
    Subclasses make the members (:meth:`_make_members`, on fresh ports) and
    say which one leads (:meth:`_leads`). A test may stop, kill, pause or
    restart members; :meth:`ensure_serving` repairs the group for the next.

    :param directory: where the members keep their files (default: a new
        temporary directory, removed by :meth:`close`).
    :param prefix: the temporary directory's name prefix.
    """

    error: ClassVar[type[Exception]] = RuntimeError

    def __init__(self, directory: Path | None, prefix: str) -> None:
        self._owns_dir = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix=prefix)) if directory is None else Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.members: list[Member] = []

    def _make_members(self) -> list[Member]:
        raise NotImplementedError

    def _leads(self, member: Member) -> bool:
        raise NotImplementedError

    def _fresh(self) -> bool:
        """Whether the members hold no data yet: only then may a start move them to other ports."""
        return True

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start every member and wait until all serve under one leader; on fresh ports if one was taken meanwhile."""
        fresh = self._fresh()
        for attempt in range(3):
            for member in self.members:
                member.launch()
            try:
                self.wait_healthy(timeout)
                return
            except self.error:
                # Ports are picked free, but another process may bind one before the member does.
                bind_failed = any("address already in use" in m.log_tail(200).lower() for m in self.members)
                for member in self.members:
                    member.kill()
                if not (fresh and bind_failed) or attempt == 2:
                    raise
                for member in self.members:
                    shutil.rmtree(member.directory, ignore_errors=True)
                self.members = self._make_members()

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> Member:
        """Wait until every member serves and exactly one leads; return the leader."""
        deadline = time.monotonic() + timeout
        for member in self.members:
            member.wait_serving(max(0.1, deadline - time.monotonic()))
        return self.leader(timeout=max(0.1, deadline - time.monotonic()))

    def leader(self, *, timeout: float = START_TIMEOUT, exclude: Member | None = None) -> Member:
        """The member that leads, polling until exactly one does.

        *exclude* skips a member (the leader just killed, which may still be
        reported while it dies).
        """
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            leaders = [member for member in self.members if member is not exclude and self._leads(member)]
            if len(leaders) == 1:
                return leaders[0]
            if time.monotonic() >= deadline:
                raise self.error(f"no single leader within {timeout}s: {self.members!r}")
            time.sleep(delay)  # polling interval; the loop re-checks
            delay = min(delay * 1.5, 0.25)

    def kill_leader(self, *, timeout: float = START_TIMEOUT) -> Member:
        """SIGKILL the leader and wait until the others elect a new one; return the killed member."""
        old = self.leader(timeout=timeout)
        old.kill()
        self.leader(timeout=timeout, exclude=old)
        return old

    def ensure_serving(self, timeout: float = START_TIMEOUT) -> None:
        """Resume paused members, start stopped ones, and wait for a healthy group."""
        for member in self.members:
            if member.paused:
                member.resume()
        for member in self.members:
            if not member.running:
                member.launch()
        self.wait_healthy(timeout)

    def restart(self, timeout: float = START_TIMEOUT) -> None:
        """Stop every member and start them again, on the same ports and data."""
        for member in self.members:
            member.stop()
        for member in self.members:
            member.launch()
        self.wait_healthy(timeout)

    def close(self) -> None:
        """Stop every member and remove the directory (if this object created it)."""
        for member in self.members:
            member.stop()
        if self._owns_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self: Group) -> Group:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.members!r}>"
