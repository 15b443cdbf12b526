"""tests/xdist_groups.py makes ``--dist loadgroup`` send the tests of one ``xdist_group`` to one worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GROUPED = """
import pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    pass

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
"""


def _workers_of_grouped_tests(tmp_path: Path, *plugin: str) -> dict[str, set[str]]:
    """Run two modules of grouped and free tests on three workers; the workers each grouped test ran on."""
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text(GROUPED)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *plugin, "-n", "3", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_ADDOPTS": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    ran = re.findall(r"^\[(gw\d+)\] .*PASSED (test_\w\.py::test_grouped\S*)", result.stdout, re.MULTILINE)
    assert len(ran) == 12, result.stdout
    return {"workers": {worker for worker, _ in ran}, "ids": {nodeid for _, nodeid in ran}}


def test_the_tests_of_one_group_run_on_one_worker(tmp_path: Path) -> None:
    seen = _workers_of_grouped_tests(tmp_path, "-p", "tests.xdist_groups")
    assert len(seen["workers"]) == 1, seen
    assert all(nodeid.endswith("@one") for nodeid in seen["ids"]), seen


def test_without_the_plugin_pytest_9_spreads_the_group(tmp_path: Path) -> None:
    """The control: what pytest-xdist 3.8 does alone under pytest 9 (pytest-dev/pytest-xdist#1386)."""
    if int(pytest.__version__.split(".")[0]) < 9:
        pytest.skip("pytest 8 reads the id xdist tags: no plugin needed")
    seen = _workers_of_grouped_tests(tmp_path)
    assert not any(nodeid.endswith("@one") for nodeid in seen["ids"]), seen
    assert len(seen["workers"]) > 1, seen
