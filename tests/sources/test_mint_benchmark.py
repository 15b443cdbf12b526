"""The mint latency benchmark still runs (a smoke test, so the script cannot rot)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mint.py"


def test_mint_benchmark_runs_and_reports_every_subject(tmp_path: Path) -> None:
    """benchmarks/mint.py starts its own ZooKeeper and prints median and p90 for each subject and the ratios."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "1", "--count", "20"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for subject in ("ZooKeeperTokenSource.mint", "SQLiteTokenSource.mint", r"kazoo set\(\) \(raw\)"):
        assert re.search(rf"^{subject}\s+20\s+\d+\.\d+\s+\d+\.\d+$", result.stdout, re.MULTILINE), result.stdout
    assert "ratio ZooKeeper mint / SQLite mint (median)" in result.stdout
