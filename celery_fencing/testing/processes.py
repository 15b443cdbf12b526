"""Processes a test starts: free loopback ports, polling with a deadline, and no child outliving the test run.

Every process the kit starts (ZooKeeper JVMs, ``celery worker`` processes) is
registered here: an ``atexit`` hook kills whatever is left, and on Linux each
child runs under ``setpriv --pdeathsig KILL``, so even a SIGKILLed pytest takes
them along. The parent-death signal fires when the *thread* that started the
child exits, so start children from a long-lived thread (the main thread, as
pytest fixtures do), never from a short-lived helper thread.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

__all__ = [
    "HOST",
    "PDEATHSIG",
    "Deadline",
    "accepts_connections",
    "children_of",
    "forget",
    "free_ports",
    "process_state",
    "register",
    "spawn",
    "wait_for",
]

#: Every server and worker the kit starts listens on loopback only.
HOST = "127.0.0.1"

_T = TypeVar("_T")
_live: set[subprocess.Popen[bytes]] = set()
_live_lock = threading.Lock()


def free_ports(count: int) -> list[int]:
    """Return *count* distinct loopback ports that were free a moment ago.

    All sockets are held open until every port is picked, so the ports are
    distinct; another process may still grab one before the child binds it,
    which is why servers retry with fresh ports when a bind fails.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((HOST, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class Deadline:
    """*timeout* seconds from now, for *what*: a polling loop calls :meth:`check` between its tries.

    :param error: what :meth:`check` raises once the deadline has passed.
    """

    def __init__(self, timeout: float, what: str, error: type[Exception] = AssertionError) -> None:
        self.timeout = timeout
        self.what = what
        self.error = error
        self._at = time.monotonic() + timeout

    def check(self) -> None:
        """Raise :attr:`error`, naming what was waited for, if the deadline has passed."""
        if time.monotonic() >= self._at:
            raise self.error(f"timed out after {self.timeout:g}s waiting for {self.what}")


def wait_for(predicate: Callable[[], _T], timeout: float, what: str, interval: float = 0.02) -> _T:
    """Poll *predicate* until it returns something truthy and return it; after *timeout* seconds
    raise :class:`AssertionError` naming *what*.

    The interval is a polling period, not a guess at how long something takes:
    the loop re-checks until the condition holds.
    """
    deadline = Deadline(timeout, what)
    while not (value := predicate()):
        deadline.check()
        time.sleep(interval)
    return value


def accepts_connections(port: int, host: str = HOST) -> bool:
    """Whether something accepts a TCP connection on *host*:*port* (within a second)."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def children_of(pid: int) -> list[int]:
    """The direct children of *pid* (Linux ``/proc``; empty elsewhere or when *pid* is gone)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def process_state(pid: int) -> str:
    """The one-letter state of *pid* from ``/proc`` (``R``, ``S``, ``T`` when stopped, ``Z``), ``''`` if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


def _pdeathsig_prefix() -> list[str]:
    # setpriv (util-linux) sets the parent-death signal in C before exec, which
    # is safe in a multi-threaded parent (unlike a Python preexec_fn).
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return []
    help_text = subprocess.run([setpriv, "--help"], capture_output=True, text=True, check=False).stdout
    return [setpriv, "--pdeathsig", "KILL"] if "--pdeathsig" in help_text else []


#: The command prefix that kills a child when the thread that started it dies ([] where unsupported).
PDEATHSIG = _pdeathsig_prefix()


def spawn(
    command: Sequence[str], log_path: Path, *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start *command* in a session of its own, stdin closed, stdout and stderr appended to *log_path*.

    In a session of its own, a terminal's Ctrl-C reaches only the parent,
    which then stops the child in order. Prefix :data:`PDEATHSIG` and
    :func:`register` the process where it must not outlive the parent.
    """
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(command),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def register(process: subprocess.Popen[bytes]) -> None:
    """Kill *process* at interpreter exit unless :func:`forget` is called for it first."""
    with _live_lock:
        _live.add(process)


def forget(process: subprocess.Popen[bytes]) -> None:
    """*process* ended (or its owner stops it): the exit hook no longer needs to."""
    with _live_lock:
        _live.discard(process)


def _kill_leftovers() -> None:
    with _live_lock:
        procs = list(_live)
        _live.clear()
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


atexit.register(_kill_leftovers)
