"""The gate latency benchmark still runs (a smoke test, so the script cannot rot)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gates.py"


def test_gates_benchmark_runs_and_reports_every_comparison(redis_url: str, postgres_url: str, mariadb_url: str) -> None:
    """benchmarks/gates.py prints medians and a ratio for every store and cleans up after itself."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "2", "--count", "3", "--warmup", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for name in [
        "redis: RedisGate.set vs SET",
        "postgres: fenced_update vs UPDATE",
        "postgres: gate.transaction vs engine.begin",
        "mariadb: fenced_update vs UPDATE",
        "mariadb: gate.transaction vs engine.begin",
        "sqlite: fenced_update vs UPDATE",
        "sqlite: gate.transaction vs engine.begin",
    ]:
        (line,) = [line for line in lines if line.startswith(name)]
        gated, plain, ratio = (float(field) for field in line[len(name) :].split()[:3])
        assert gated > 0 and plain > 0 and abs(ratio - gated / plain) < 0.01
