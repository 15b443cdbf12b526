"""Helpers for the command-line tests: run ``celery-fencing`` as a user would, a throwaway Redis."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli_command() -> list[str]:
    """The installed console script, as a new user runs it (next to this interpreter)."""
    script = Path(sys.executable).with_name("celery-fencing")
    assert script.exists(), f"{script} is missing: install the package (pip install -e '.[all]')"
    return [str(script)]


@dataclass
class Done:
    code: int
    out: str
    err: str
    seconds: float


def run_cli(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 180) -> Done:
    """Run ``celery-fencing ARGS`` from the repository root and capture everything."""
    started = time.monotonic()
    done = subprocess.run(
        [*cli_command(), *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Done(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def demo_pids(stderr: str) -> list[int]:
    """The worker pids the demo announced on its progress line."""
    return [int(pid) for pid in re.findall(r"started W\d \(pid (\d+)\)", stderr)]


def demo_directory(stderr: str) -> Path:
    match = re.search(r"working in (\S+)", stderr)
    assert match, stderr
    return Path(match.group(1))


def process_gone(pid: int) -> bool:
    """True when *pid* no longer runs a demo worker (gone, or reused by something else)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return True
    return b"celery_fencing.demo.app" not in cmdline


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def persistent_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway redis-server with AOF persistence on a free port (the shared one has none)."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is needed (scripts/test installs it)"
    directory = tmp_path_factory.mktemp("redis-aof")
    port = _free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--appendonly",
            "yes",
            "--save",
            "",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            if sock.recv(16).startswith(b"+PONG"):
                break
        assert proc.poll() is None, "redis-server exited at start"
        assert time.monotonic() < deadline, "redis-server did not answer within 30s"
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
