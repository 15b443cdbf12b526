"""Quick runs of every benchmark behind ``python -m benchmarks``, so none can rot; no figure is checked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"\d+\.\d+"


def _run(*args: str, timeout: float = 600) -> str:
    result = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_minting_and_scale_sections_print_medians_ratios_and_memory(redis_url: str) -> None:
    """The one entry point runs the minting and scale sections quickly and prints every comparison."""
    out = _run("benchmarks", "--only", "minting,scale", "--quick")
    for ratio in (
        r"mint\(\) / raw set\(\)",
        r"mint_many\(5\) / raw set_async\(\) x5",
        r"SQLite mint\(\) / plain UPDATE",
        r"50 / 1 resource\(s\)",
    ):
        assert re.search(rf"^ratio {ratio}\s+{NUMBER}", out, re.MULTILINE), out
    assert re.search(r"^zk: ZooKeeperTokenSource.mint\(\)\s+" + NUMBER, out, re.MULTILINE), out
    assert "approximate data size" in out and "JVM RSS" in out
    assert re.search(r"prune\(older_than=1.0\) deleted 49 znodes .*: ok$", out, re.MULTILINE), out
    assert "peak RSS of this process" in out


def test_celery_end_to_end_runs_every_variant_in_real_workers(redis_url: str) -> None:
    """The end-to-end benchmark starts a real worker per variant, completes its tasks and reports
    tasks/s, ratios to plain, worker RSS and CPU per task."""
    out = _run("benchmarks.celery_e2e", "--rounds", "1", "--tasks", "20")
    keys = ("plain", "singleton", "fenced-zk", "fenced-sqlite", "exclusive-zk", "exclusive-reuse-zk")
    for key in (*keys, "floor-zk-write", "floor-serial"):
        assert re.search(rf"\[{key}\]\s+{NUMBER}", out), out
    ratios = ("fenced-zk / plain", "fenced-zk / singleton", "exclusive-reuse-zk / plain")
    for ratio in (*ratios, "fenced-zk / floor-zk-write", "exclusive-reuse-zk / floor-serial"):
        assert re.search(rf"^ratio {ratio}\s+{NUMBER}", out, re.MULTILINE), out
    assert re.search(r"fencing overhead per process \[fenced-zk\]: [+-]\d+\.\d MiB", out), out
    assert "CPU time per task" in out
