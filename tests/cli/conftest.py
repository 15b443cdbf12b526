"""Helpers for the command-line tests: run ``celery-fencing`` as a user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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
