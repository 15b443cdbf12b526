"""A fenced test worker for the user's own app: a real ``celery worker`` process, with its ``--fencing-*`` flags.

Each :class:`FencedWorker` runs ``python -m celery_fencing.testing.launcher``
(``celery -A <app> worker`` with the test's settings applied) in its own
process group, logging to a file. A test can freeze the whole worker (SIGSTOP
of the group: a VM freeze or a long GC pause, ZooKeeper session included),
thaw it, stop it warmly or kill it; every process it started is gone when the
test run ends (see :mod:`celery_fencing.testing.processes`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from . import processes
from .events import FencingEvents
from .launcher import SETTINGS_ENV_VAR
from .pause import PausePoints

__all__ = ["FencedWorker", "WorkerProcess", "fencing_flags", "worker_options"]

_W = TypeVar("_W", bound="WorkerProcess")


def worker_options(pool: str, concurrency: int) -> list[str]:
    """``celery worker`` options of a test worker: its pool, and none of the cluster chatter a test has no use for."""
    return [
        "-P",
        pool,
        "-c",
        str(concurrency),
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]


def fencing_flags(fencing: Mapping[str, object]) -> list[str]:
    """``--fencing-*`` worker flags for *fencing*, a mapping of setting names (``"fencing_source"`` or
    ``"source"``) to values; ``True`` gives a bare flag for on/off settings.

    :raises ValueError: for a name that is no ``fencing_*`` setting (naming it).
    """
    from ..celery.settings import SETTINGS

    by_name = {setting.name: setting for setting in SETTINGS}
    flags: list[str] = []
    for key, value in fencing.items():
        name = key if key.startswith("fencing_") else f"fencing_{key}"
        setting = by_name.get(name)
        if setting is None:
            raise ValueError(f"{key!r} is not a fencing setting (known: {', '.join(sorted(by_name))})")
        if setting.is_flag:
            if value is True:
                flags.append(setting.flag)
            elif value is not False:
                raise ValueError(f"{name} is an on/off flag: pass True or False, not {value!r}")
        else:
            flags += [setting.flag, str(value)]
    return flags


class WorkerProcess:
    """A ``celery worker`` process a test started: its log in a file, a process group of its own.

    It runs under the parent-death signal and is registered for the exit
    hook, so it never outlives the test run (see :mod:`.processes`). A test
    can stop it warmly or kill it (the whole group: the pool's children too).

    :param args: the command line (``sys.executable -m celery ...``).
    :param name: how messages name it.
    :param log_path: where its stdout and stderr go (appended across restarts).
    :param env: its whole environment.
    :param cwd: its working directory (default: the test's).
    """

    def __init__(
        self, args: Sequence[str], *, name: str, log_path: Path, env: Mapping[str, str], cwd: Path | None = None
    ) -> None:
        self.args = list(args)
        self.name = name
        self.log_path = log_path
        self.env = dict(env)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self: _W, timeout: float = 60.0) -> _W:
        """Start the process and wait until the worker logs that it is ready; return self.

        :raises AssertionError: when it exits first or is not ready within *timeout* seconds
            (with the end of its log).
        """
        self.launch()
        self.wait_ready(timeout)
        return self

    def launch(self) -> None:
        """Start the process without waiting for it to be ready (then :meth:`wait_ready`).

        Call it from a long-lived thread: the parent-death signal fires when
        the thread that started the process exits.
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = processes.spawn([*processes.PDEATHSIG, *self.args], self.log_path, cwd=self.cwd, env=self.env)
        processes.register(self.proc)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the launched worker logs that it is ready (see :meth:`start`)."""
        processes.wait_for(self._ready, timeout, f"worker {self.name} to be ready (log: {self.log_path})")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"worker {self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        return " ready." in self.log()

    def log(self) -> str:
        """The worker's log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        """The pid of the worker's main process (the ``pid`` of its events and pause arrivals with ``solo``)."""
        if self.proc is None:
            raise RuntimeError(f"worker {self.name} was not started")
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pool_pids(self) -> list[int]:
        """The prefork pool's child processes (empty for solo and threads)."""
        return processes.children_of(self.pid)

    def stop(self, timeout: float = 20.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL of the whole process group if it does not end in *timeout* s."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGCONT)  # a frozen worker cannot act on SIGTERM
                os.kill(self.pid, signal.SIGTERM)
                proc.wait(timeout)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        self._kill_group()

    def kill(self) -> None:
        """SIGKILL the whole worker at once (a crash: no task is acknowledged)."""
        if self.proc is not None:
            self._kill_group()

    def _kill_group(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        processes.forget(self.proc)

    def __enter__(self: _W) -> _W:
        return self.start() if self.proc is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.name} {state}>"


class FencedWorker(WorkerProcess):
    """One ``celery -A <app> worker`` process of the user's app, for a test.

    :param app: what ``celery -A`` takes (``"proj.celery"`` or ``"proj.celery:app"``).
    :param name: the worker's node name (``<name>@<host>``) and log file name.
    :param log_dir: where ``<name>.log`` goes.
    :param queue: the queues to consume (``-Q``), default the app's.
    :param source: the token source URL (``--fencing-source``).
    :param fencing: more ``--fencing-*`` flags (see :func:`fencing_flags`).
    :param settings: app settings for this worker (JSON-serialisable; dicts are merged
        into the app's own), e.g. :func:`~celery_fencing.testing.redis_redelivery_settings`.
    :param pause_points: the test's pause points, which this worker's pause points answer to.
    :param events: the file this worker records its fencing signals into.
    :param env: more environment variables (the test's own environment is inherited).
    """

    def __init__(
        self,
        app: str,
        *,
        name: str,
        log_dir: Path | str,
        queue: str | None = None,
        source: str | None = None,
        fencing: Mapping[str, object] | None = None,
        settings: Mapping[str, Any] | None = None,
        pool: str = "solo",
        concurrency: int = 1,
        pause_points: PausePoints | None = None,
        events: FencingEvents | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.app = app
        options = dict(fencing or {})
        if source is not None:
            options["fencing_source"] = source
        args = [
            sys.executable,
            "-m",
            "celery_fencing.testing.launcher",
            app,
            "-n",
            # Unique on a shared broker: two workers of one node name share RabbitMQ's exclusive
            # pidbox queue, and the second one dies at start (RESOURCE_LOCKED).
            f"{name}-{uuid.uuid4().hex[:8]}@%h",
            *worker_options(pool, concurrency),
            *(["-Q", queue] if queue else []),
            *fencing_flags(options),
            *extra_args,
        ]
        environment: dict[str, str] = {**os.environ, SETTINGS_ENV_VAR: json.dumps(dict(settings or {}))}
        # The test's working directory on the path, as `celery -A` run there would have it.
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
        for extra in (pause_points.env if pause_points else {}, events.env if events else {}, env or {}):
            environment.update(extra)
        super().__init__(args, name=name, log_path=Path(log_dir) / f"{name}.log", env=environment)

    def freeze(self) -> None:
        """SIGSTOP the whole worker (main process and pool children), and wait until the kernel shows it stopped.

        A frozen worker answers nothing: no heartbeats, no ZooKeeper pings (its
        session expires), no broker traffic.
        """
        os.killpg(self.pid, signal.SIGSTOP)
        processes.wait_for(
            lambda: processes.process_state(self.pid) in ("T", "t", ""), 10, f"worker {self.name} to stop"
        )

    def thaw(self) -> None:
        """SIGCONT the whole worker after :meth:`freeze`."""
        os.killpg(self.pid, signal.SIGCONT)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<FencedWorker {self.name} {self.app} {state}>"
