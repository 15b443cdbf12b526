"""examples/testing/, a user's test suite for a fenced task, passes with fencing and fails without it.

Each example test file runs in its own pytest process, as a user runs it,
twice: as written (it must pass) and with ``EXAMPLE_FENCING=off`` (the app's
task becomes a plain read-modify-write, and the same test must fail on the
lost update). The third route, pytest-celery in containers
(``examples/testing/test_pytest_celery.py``), runs the same way from
tests/containers/test_pytest_celery_example.py, which needs Docker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]


def run_example_tests(
    name: str, redis_url: str | None, *, fencing: bool, plugins: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``pytest examples/testing/<name>`` from the repository root, in a namespace of its own on *redis_url*
    (``None``: the example keeps its data in containers of its own, and nothing is left to clean here),
    with *plugins* named by ``-p`` too."""
    namespace = f"exampletesting{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        **({"EXAMPLE_REDIS_URL": redis_url} if redis_url else {}),
        "EXAMPLE_NAMESPACE": namespace,
        "EXAMPLE_FENCING": "on" if fencing else "off",
    }
    try:
        return subprocess.run(
            [
                *(sys.executable, "-m", "pytest", f"examples/testing/{name}", "-q", "-p", "no:cacheprovider"),
                *(arg for plugin in plugins for arg in ("-p", plugin)),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        if redis_url:
            client = redis.Redis.from_url(redis_url)
            keys = list(client.scan_iter(f"{namespace}*"))
            if keys:
                client.delete(*keys)
            client.close()


@pytest.mark.parametrize(
    ("name", "lost_update"),
    [("test_in_process.py", "assert 110 == 130"), ("test_real_workers.py", "assert 110 == 115")],
)
def test_the_example_passes_with_fencing_and_fails_on_the_lost_update_without(
    name: str, lost_update: str, redis_url: str
) -> None:
    """Fenced, the example's test passes; unfenced, it fails on its balance assertion (the stale write landed)."""
    fenced = run_example_tests(name, redis_url, fencing=True)
    assert fenced.returncode == 0, fenced.stdout + fenced.stderr
    assert "1 passed" in fenced.stdout
    unfenced = run_example_tests(name, redis_url, fencing=False)
    assert unfenced.returncode == 1, unfenced.stdout + unfenced.stderr
    assert "1 failed" in unfenced.stdout
    assert lost_update in unfenced.stdout, unfenced.stdout
