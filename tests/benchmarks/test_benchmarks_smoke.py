"""Quick runs of every benchmark behind ``python -m benchmarks``, so none can rot; no figure is checked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"\d+\.\d+"
CELERY_VARIANTS = ("plain", "singleton", "fenced-zk", "fenced-sqlite", "exclusive-zk", "exclusive-reuse-zk")
CHARTS = ("celery-tasks-per-second.png", "celery-worker-cpu-per-task.png")
CeleryRun = tuple[subprocess.CompletedProcess[str], Path]


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _progress(stderr: str, pattern: str) -> list[str]:
    """The progress lines (``HH:MM:SS message`` on stderr) whose message matches *pattern*."""
    return re.findall(rf"^\d\d:\d\d:\d\d {pattern}$", stderr, re.MULTILINE)


def test_minting_scale_and_gates_sections_print_medians_ratios_memory_and_progress(
    redis_url: str, postgres_url: str, mariadb_url: str
) -> None:
    """The one entry point runs the minting, scale and gates sections quickly and prints every comparison
    on stdout, and one progress line per subject and round (per round and group of gates) on stderr."""
    result = _run("benchmarks", "--only", "minting,scale,gates", "--quick")
    out = result.stdout
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
    assert re.search(r"^redis: RedisGate.set vs SET\s+" + NUMBER, out, re.MULTILINE), out
    err = result.stderr
    assert len(_progress(err, rf"minting round 1/1: .+ {NUMBER} tokens/s")) == 6, err
    assert len(_progress(err, rf"scale round 1/1: mint\(\) among \d+ resource\(s\) {NUMBER} us median")) == 2, err
    for store in ("redis (1/1)", "postgres (1/2)", "postgres (2/2)", "mariadb (1/2)", "sqlite (2/2)"):
        assert _progress(err, rf"gates {re.escape(store)} round 1/1: .+ us"), err
    assert len(_progress(err, r"section \w+ \(\d/3\), \d+ s in")) == 3, err
    assert not re.search(r"^\d\d:\d\d:\d\d ", out, re.MULTILINE), "progress lines must stay off stdout"


@pytest.fixture(scope="module")
def celery_run(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> CeleryRun:
    out = tmp_path_factory.mktemp("charts")
    return _run("benchmarks", "--only", "celery", "--quick", "--out", str(out)), out


def test_celery_end_to_end_runs_every_variant_in_real_workers(celery_run: CeleryRun) -> None:
    """The end-to-end benchmark starts a real worker per variant, completes its tasks and reports
    tasks/s, ratios to plain, worker RSS and CPU per task; on stderr one line per worker, variant and round."""
    result, _ = celery_run
    out, err = result.stdout, result.stderr
    for key in (*CELERY_VARIANTS, "floor-zk-write", "floor-serial"):
        assert re.search(rf"\[{key}\]\s+{NUMBER}", out), out
        assert _progress(err, rf"celery: worker of {key} ready in {NUMBER} s"), err
        assert _progress(err, rf"celery round 1/1: {key} {NUMBER} tasks/s"), err
    ratios = ("fenced-zk / plain", "fenced-zk / singleton", "exclusive-reuse-zk / plain")
    for ratio in (*ratios, "fenced-zk / floor-zk-write", "exclusive-reuse-zk / floor-serial"):
        assert re.search(rf"^ratio {ratio}\s+{NUMBER}", out, re.MULTILINE), out
    assert re.search(r"fencing overhead per process \[fenced-zk\]: [+-]\d+\.\d MiB", out), out
    assert "CPU time per task" in out
    assert not re.search(r"^\d\d:\d\d:\d\d ", out, re.MULTILINE), "progress lines must stay off stdout"


def test_celery_section_draws_its_bar_charts(celery_run: CeleryRun) -> None:
    """With matplotlib installed, the celery section writes both bar charts into --out and names them."""
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    result, out = celery_run
    for name in CHARTS:
        path = out / name
        assert f"chart: {path}" in result.stdout
        height, width, _ = imread(path).shape
        assert width > 800 and height > 400


def test_charts_say_in_one_line_that_matplotlib_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without matplotlib, drawing raises ImportError with one line naming the extra to install."""
    from benchmarks import plots

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"^matplotlib is not installed: pip install 'celery-fencing\[plots\]'"):
        plots.new_figure()
