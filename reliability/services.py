"""Processes the reliability harness owns: throwaway Redis and PostgreSQL servers, Celery workers.

Everything here is started by the harness, on free loopback ports, in its own
temporary directory; nothing looks at, stops or reconfigures a server the
machine already runs. Processes are signalled only by the pid this module
started, and run under ``setpriv --pdeathsig KILL``: they die with the thread
that started them (the world's loop thread), so even a SIGKILLed harness
leaves nothing behind. Start them from a long-lived thread only.

Waiting is done by polling with deadlines (``wait_until``), never by sleeping
a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from celery_fencing.testing.processes import Deadline, children_of, process_state

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"


def _newest(pattern: str, default: str) -> str:
    found = sorted(glob.glob(pattern), key=lambda p: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", p)])
    return found[-1] if found else default


#: PostgreSQL's server binaries (Debian: /usr/lib/postgresql/<version>/bin, the newest installed).
PG_BIN = Path(
    os.environ.get("RELIABILITY_PG_BIN") or _newest("/usr/lib/postgresql/*/bin", "/usr/lib/postgresql/15/bin")
)
#: libfaketime (Debian package faketime).
FAKETIME_LIB = Path(
    os.environ.get("RELIABILITY_FAKETIME_LIB")
    or _newest("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
)
SHIM_DIR = Path(__file__).resolve().parent / "faketime"

__all__ = [
    "ThrowawayPostgres",
    "ThrowawayRedis",
    "WorkerProcess",
    "children_of",
    "free_port",
    "process_state",
    "wait_until",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


async def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll *predicate* (sync) until truthy, sleeping in the loop; raise TimeoutError naming *what* after *timeout*."""
    deadline = Deadline(timeout, what, TimeoutError)
    while not (value := predicate()):
        deadline.check()
        await asyncio.sleep(interval)
    return value


def _pdeathsig() -> list[str]:
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


class _Server:
    process: subprocess.Popen[bytes] | None = None
    log_path: Path

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _spawn(self, args: Sequence[str], log: Path, **kwargs: Any) -> None:
        with log.open("ab") as handle:
            self.process = subprocess.Popen(
                [*_pdeathsig(), *args], stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT, **kwargs
            )

    async def _wait_serving(self, answers: Callable[[], bool], timeout: float, name: str) -> None:
        """Poll *answers* until it holds; raise RuntimeError pointing at the log if the server *name* exits first."""

        def serving() -> bool:
            if not self.running:
                raise RuntimeError(f"{name} exited; see {self.log_path}")
            return answers()

        await wait_until(serving, timeout, name)

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL (SIGCONT first is not needed: SIGKILL ends a stopped process too) and reap."""
        if self.process is None:
            return
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


class ThrowawayRedis(_Server):
    """A ``redis-server`` on a free loopback port, with AOF (``appendfsync always``) or no persistence."""

    def __init__(self, directory: Path, *, aof: bool, port: int | None = None) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.aof = aof
        self.port = port or free_port()
        self.log_path = directory / "redis.log"
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def launch(self) -> None:
        args = [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.aof else "no",
            "--appendfsync",
            "always",
            "--protected-mode",
            "no",
        ]
        self._spawn(args, self.log_path)

    def ping(self) -> bool:
        import redis

        try:
            client = redis.Redis(host=HOST, port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except redis.RedisError:
            return False

    def run_id(self) -> str | None:
        import redis

        try:
            client = redis.Redis(host=HOST, port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
            try:
                return str(client.info("server")["run_id"])
            finally:
                client.close()
        except redis.RedisError:
            return None

    async def start(self, timeout: float = 20) -> None:
        self.launch()
        await self._wait_serving(self.ping, timeout, f"redis-server on port {self.port}")

    def stop(self) -> None:
        self.kill()


class ThrowawayPostgres(_Server):
    """A PostgreSQL 15 cluster in a temporary directory, run as the ``postgres`` user.

    ``initdb`` refuses to run as root, so every server process runs as
    *user* through ``setpriv``. ``fsync=off``: the nemeses crash the server
    processes, never the machine, and WAL written to the OS survives a crash
    of the processes, so commits stay durable for what is tested here.
    """

    def __init__(self, directory: Path | None = None, *, user: str = "postgres", port: int | None = None) -> None:
        # Its own directory directly under the temp dir: the server user must be able to reach it,
        # and the harness's own directories are private to root.
        self._owns_dir = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="reliability-pg-")) if directory is None else directory
        self.user = user
        self.port = port or free_port()
        self.data = self.directory / "data"
        self.socket_dir = self.directory / "sock"
        self.log_path = self.directory / "postgres.log"
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@{HOST}:{self.port}/postgres"

    def _as_user(self) -> list[str]:
        return ["setpriv", f"--reuid={self.user}", f"--regid={self.user}", "--init-groups"]

    def init(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        shutil.chown(self.directory, self.user, self.user)
        shutil.chown(self.socket_dir, self.user, self.user)
        done = subprocess.run(
            [*self._as_user(), "--", str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd="/",
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stderr.decode(errors='replace')}")

    def launch(self) -> None:
        args = [
            *self._as_user(),
            "--pdeathsig",
            "KILL",
            "--",
            str(PG_BIN / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-c",
            f"listen_addresses={HOST}",
            "-c",
            f"unix_socket_directories={self.socket_dir}",
            "-c",
            "fsync=off",
            "-c",
            "max_connections=200",
            "-c",
            "shared_buffers=32MB",
            "-c",
            "log_min_messages=warning",
        ]
        with self.log_path.open("ab") as handle:
            # setpriv already carries --pdeathsig (after the uid change, where it must be set).
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT, cwd="/"
            )

    def accepting(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(host=HOST, port=self.port, user="postgres", dbname="postgres", connect_timeout=1):
                return True
        except psycopg.Error:
            return False

    def start_time(self) -> str | None:
        import psycopg

        try:
            with psycopg.connect(
                host=HOST, port=self.port, user="postgres", dbname="postgres", connect_timeout=1
            ) as conn:
                row = conn.execute("select pg_postmaster_start_time()::text").fetchone()
                return None if row is None else str(row[0])
        except psycopg.Error:
            return None

    async def start(self, timeout: float = 60) -> None:
        if not (self.data / "PG_VERSION").exists():
            await asyncio.to_thread(self.init)
        self.launch()
        await self._wait_serving(self.accepting, timeout, f"postgres on port {self.port}")

    async def shutdown_immediate(self, timeout: float = 30) -> None:
        """Immediate shutdown (SIGQUIT, what ``pg_ctl -m immediate`` sends): a crash, recovered at next start."""
        self.signal(signal.SIGQUIT)
        await wait_until(lambda: not self.running, timeout, "postgres to shut down")

    def stop(self) -> None:
        if self.process is not None:
            self.signal(signal.SIGINT)  # fast shutdown
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._owns_dir:
            shutil.rmtree(self.directory, ignore_errors=True)


class WorkerProcess(_Server):
    """One ``celery -A reliability.workload worker`` (prefork) in its own process group.

    With *faketime_file*, the worker runs under libfaketime with only the wall
    clock faked: the offset is read from that file on every clock read, so a
    nemesis moves the clock by rewriting it.
    """

    def __init__(
        self,
        name: str,
        *,
        queue: str,
        env: dict[str, str],
        log_dir: Path,
        concurrency: int = 2,
        faketime_file: Path | None = None,
    ) -> None:
        self.name = name
        self.queue = queue
        self.concurrency = concurrency
        self.log_path = log_dir / f"{name}.log"
        self.faketime_file = faketime_file
        pythonpath = [str(ROOT)]
        self.env = {**os.environ, **env, "RW_WORKER": name}
        if faketime_file is not None:
            faketime_file.write_text("+0\n")
            # SHIM_DIR holds a sitecustomize that works around libfaketime 0.9.10's
            # clock_nanosleep bug with FAKETIME_DONT_FAKE_MONOTONIC (wolfcw/libfaketime#426).
            pythonpath.insert(0, str(SHIM_DIR))
            self.env.update(
                LD_PRELOAD=str(FAKETIME_LIB),
                FAKETIME_TIMESTAMP_FILE=str(faketime_file),
                FAKETIME_NO_CACHE="1",
                FAKETIME_DONT_FAKE_MONOTONIC="1",
            )
        self.env["PYTHONPATH"] = os.pathsep.join(pythonpath)
        self.starts = 0

    def launch(self) -> None:
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "reliability.workload",
            "worker",
            "-n",
            f"{self.name}@%h",
            "-Q",
            self.queue,
            "-P",
            "prefork",
            "-c",
            str(self.concurrency),
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        self.starts += 1
        self._spawn(args, self.log_path, env=self.env, cwd=ROOT, start_new_session=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def ready(self) -> bool:
        if not self.running:
            raise RuntimeError(f"worker {self.name} exited:\n{self.log()[-3000:]}")
        return " ready." in self.log()

    async def start(self, timeout: float = 90) -> None:
        self.launch()
        await wait_until(self.ready, timeout, f"worker {self.name} to be ready (log {self.log_path})", interval=0.1)

    def pool_pids(self) -> list[int]:
        pid = self.pid
        return [] if pid is None else children_of(pid)

    def pids(self) -> set[int]:
        pid = self.pid
        return set() if pid is None else {pid, *children_of(pid)}

    def set_clock_offset(self, seconds: float) -> None:
        if self.faketime_file is None:
            raise RuntimeError(f"worker {self.name} does not run under faketime")
        tmp = self.faketime_file.with_suffix(".tmp")
        tmp.write_text(f"{seconds:+.0f}s\n")
        tmp.replace(self.faketime_file)  # atomic: libfaketime never reads half a file

    def continue_all(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGCONT)

    async def stop(self, timeout: float = 30) -> None:
        """Warm shutdown (in-flight tasks finish), then SIGKILL of the whole process group."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            self.continue_all()
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await wait_until(lambda: process.poll() is not None, timeout, f"worker {self.name} to stop")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
