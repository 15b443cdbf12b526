"""``python -m <module>`` in a subprocess from the repository root, as the docs tell a user to run it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_module(
    module: str, *args: str, env: Mapping[str, str], timeout: float, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module *args`` in the repository root with this environment plus *env*; output as text.

    :raises subprocess.CalledProcessError: with *check*, when it exits non-zero.
    :raises subprocess.TimeoutExpired: after *timeout* seconds.
    """
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )
