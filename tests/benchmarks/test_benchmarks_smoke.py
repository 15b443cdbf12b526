"""Quick runs of every benchmark behind ``python -m benchmarks``, so none can rot; no figure is checked."""

from __future__ import annotations

import os
import re
import shutil
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


def test_celery_section_prints_latency_in_the_flood_and_paced(celery_run: CeleryRun) -> None:
    """The celery section prints p50 and p99 latency per variant for its flood rounds and its paced rounds,
    with the ratios to plain (the paced fenced ones against their target), and one progress line per paced round."""
    result, _ = celery_run
    out, err = result.stdout, result.stderr
    flood = out.index("== Celery latency in the flood")
    paced = out.index("== Celery latency, paced: 20 tasks per run sent at ")
    assert flood < paced, out
    tables = {"flood": out[flood:paced], "paced": out[paced : out.index("== Worker pool processes")]}
    legend = " ".join(tables["flood"].split())  # the legend is wrapped
    assert "from the producer's clock just before apply_async() to the date_done of the task's stored result" in legend
    for table in tables.values():
        for key in (*CELERY_VARIANTS, "floor-zk-write", "floor-serial"):
            assert re.search(rf"\[{key}\]\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+1\b", table), table
        for ratio in ("fenced-zk / plain", "fenced-sqlite / plain", "fenced-zk / floor-zk-write"):
            assert re.search(rf"^ratio {ratio}, p99\s+{NUMBER}  p50 {NUMBER}", table, re.MULTILINE), table
    for key in ("fenced-zk", "fenced-sqlite"):
        target = rf"^ratio {key} / plain, p99\s+{NUMBER}  p50 {NUMBER}  target <= 1.50x: (met|MISSED)$"
        assert re.search(target, tables["paced"], re.MULTILINE), tables["paced"]
    assert _progress(err, r"celery: paced rounds, 20 tasks per run at \d+ tasks/s"), err
    for key in (*CELERY_VARIANTS, "floor-zk-write", "floor-serial"):
        assert _progress(err, rf"celery paced round 1/1: {key} {NUMBER} ms p99"), err


def test_latency_table_takes_medians_of_round_percentiles_and_checks_p99_ratios() -> None:
    """A latency table's p50 and p99 are medians over the rounds, and its targets bound the p99 ratio from above."""
    from benchmarks.common import LatencyTable, percentile

    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError, match="percentile of no values"):
        percentile([], 0.5)
    samples = {"a": [(1.0, 2.0), (1.0, 4.0), (9.0, 3.0)], "b": [(2.0, 4.0), (2.0, 5.0), (2.0, 6.0)]}
    table = LatencyTable("t", ["legend"], samples, [("b / a", "b", "a", 1.5), ("a / b", "a", "b", None)], name="x")
    assert (table.p50("a"), table.p99("a")) == (1.0, 3.0)
    assert table.missed() == ["x: b / a, p99"]  # 5 / 3 > 1.5
    assert re.search(r"^ratio b / a, p99\s+1.667  p50 2.000  target <= 1.50x: MISSED$", table.render(), re.MULTILINE)


def _may_profile() -> bool:
    """Whether py-spy can attach to this user's processes here (root, or ptrace not restricted by Yama)."""
    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        return False
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    return os.geteuid() == 0 or not scope.exists() or scope.read_text().strip() == "0"


@pytest.mark.skipif(not _may_profile(), reason="py-spy missing or not allowed to attach here")
def test_celery_profile_prints_the_task_path_and_fencing_cost_per_task(redis_url: str, tmp_path: Path) -> None:
    """--profile records py-spy on the workers of plain and fenced-sqlite and prints each one's measured CPU,
    its task path in us per task, celery_fencing's cost by function and the landmarks against plain."""
    result = _run(
        "benchmarks.celery_e2e",
        *("--variants", "plain,fenced-sqlite", "--rounds", "1", "--tasks", "20", "--pace", "0"),
        *("--profile", "plain", "--profile", "fenced-sqlite", "--profile-seconds", "3", "--profile-slices", "1"),
        *("--profile-dir", str(tmp_path)),
    )
    out = result.stdout
    for key in ("plain", "fenced-sqlite"):
        assert re.search(rf"^== py-spy, {key}: \d+ tasks; measured per task:$", out, re.MULTILINE), out
    assert re.search(rf"^\s+{NUMBER} build_tracer.<locals>.trace_task \(celery/app/trace.py\)$", out, re.MULTILINE), out
    assert re.search(rf"^\s+{NUMBER}\s+{NUMBER}%  FencedTask\._\w+ \(celery_fencing/celery/task.py\)$", out, re.M), out
    landmark = rf"^\s+{NUMBER}\s+{NUMBER}\s+[+-]{NUMBER}  FencedTask.before_start: arm, mint, claim$"
    assert re.search(landmark, out, re.MULTILINE), out
    assert sorted(path.name.split("-")[-2] for path in tmp_path.glob("slice1/pyspy-plain-*.txt")) == [
        "parent",
        "pool",
        "pool",
    ]


def test_profile_charges_each_sample_to_its_innermost_fencing_frame_and_scales_by_user_cpu(tmp_path: Path) -> None:
    """A profile turns py-spy's raw stacks into us per task: a frame's share of the samples times the
    measured user CPU per task, each sample charged once, to the innermost celery_fencing frame of its stack."""
    from benchmarks import hotpath

    trace = "build_tracer.<locals>.trace_task (celery/app/trace.py)"
    start = "FencedTask.before_start (celery_fencing/celery/task.py)"
    claim = "claim_stores (celery_fencing/celery/claims.py)"
    raw = tmp_path / "pool.txt"
    main = "thread (1): MainThread;Worker.workloop (billiard/pool.py)"
    raw.write_text(
        f"{main};{trace};{start};{claim};Pipeline.execute (redis/client.py) 30\n"
        f"{main};{trace};{start} 10\n"
        f"{main};{trace} 40\n"
        "thread (2): kazoo;Thread.run (threading.py);ConnectionHandler.zk_loop (kazoo/protocol/connection.py) 20\n"
    )
    pool = hotpath.Samples()
    hotpath.read_raw(raw, pool)
    assert (pool.total, pool.threads) == (100, 20)
    profile = hotpath.Profile(
        "fenced",
        10,
        100,
        True,
        {"pool": pool, "parent": hotpath.Samples()},
        {
            "pool": (0.002, 0.001),  # 200 us of user CPU per task, 100 of system
            "parent": (0.0, 0.0),
        },
    )
    assert profile.cpu_us("pool") == pytest.approx(300) and profile.us("pool", 50) == pytest.approx(100)
    assert pool.fencing() == {claim: 30, start: 10, "-": 60}
    text = hotpath.report([profile])
    assert re.search(rf"^\s+160.0 {re.escape(trace)}$", text, re.MULTILINE), text
    assert re.search(rf"^\s+80.0   {re.escape(start)}$", text, re.MULTILINE), text
    assert re.search(rf"^\s+60.0\s+30.0%  {re.escape(claim)}$", text, re.MULTILINE), text


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
