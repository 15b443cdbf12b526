"""What the soak shows while and after it runs: progress lines, the violations put in time, its chart.

The timeline's violation marks are checked against the checker on simulated
unfenced histories; then one short soak (a few seconds of faults on one worker
per side) must print its progress lines on stderr and, with matplotlib, draw
its chart next to report.md.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reliability.checker import AuditRow, Figures, Observation, check
from reliability.plots import draw_soak
from reliability.timeline import Timeline, committed_rows, safety_counts, so_far, violation_marks

ROOT = Path(__file__).resolve().parents[2]
RULES = ("stale_accepted", "non_monotonic", "lost_updates", "duplicate_effects")
SOAK_SECONDS = 8
SOAK_RATE = 2


def simulate(
    seed: int, tasks: int = 80, accounts: int = 3, *, overlap: float = 0.5, again: float = 0.1
) -> tuple[list[dict[str, Any]], Observation]:
    """An unfenced read-modify-write history: an execution starts while others run (*overlap*), and ends
    in random order; a committed task runs again (*again*)."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    audit: list[AuditRow] = []
    balances = {f"acct:s:{n}": 0 for n in range(accounts)}
    submitted = {f"t{n}": f"acct:s:{rng.randrange(accounts)}" for n in range(tasks)}
    queue, running, token = list(submitted), [], 0

    def emit(ev: str, task: str, token: int, resource: str, **fields: Any) -> None:
        events.append(
            {
                "ev": ev,
                "t": len(events) * 0.01,
                "mode": "control",
                "task": task,
                "token": token,
                "resource": resource,
                **fields,
            }
        )

    while queue or running:
        if queue and (not running or rng.random() < overlap):
            task = queue.pop(0)
            token += 1
            resource = submitted[task]
            emit("minted", task, token, resource)
            emit("invoke", task, token, resource)
            running.append((task, token, resource, balances[resource]))
            continue
        task, token_, resource, read = running.pop(rng.randrange(len(running)))
        emit("write", task, token_, resource, read=read)
        audit.append(AuditRow(len(audit) + 1, task, resource, token_, read, read + 1))
        balances[resource] = read + 1
        emit("pg-ok", task, token_, resource, seq=len(audit), new=read + 1)
        emit("ok", task, token_, resource)
        if rng.random() < again:
            queue.append(task)  # re-delivered after its commit: it applies again
    observation = Observation("control", submitted, events, audit, balances, ended=events[-1]["t"])
    return events, observation


@pytest.mark.parametrize("seed", range(5))
def test_violation_marks_count_what_the_checker_counts(seed: int) -> None:
    """Each write rule's marks add up to the checker's count of it (lost updates: at least, and > 0 when it is),
    and the history alone gives the checker's figures (what the progress lines print)."""
    events, observation = simulate(seed)
    figures = check(observation)
    assert figures.balance_mismatch == 0 and figures.lost_updates > 0 and figures.duplicate_effects > 0
    marks = violation_marks(events, observation.audit)
    assert marks == sorted(marks, key=lambda m: m.t)
    counts = {rule: sum(m.count for m in marks if m.rule == rule) for rule in RULES}
    for rule in ("stale_accepted", "non_monotonic", "duplicate_effects"):
        assert counts[rule] == getattr(figures, rule), rule
    assert counts["lost_updates"] >= figures.lost_updates > 0
    assert committed_rows(events) == observation.audit
    live = so_far(events, "control", observation.submitted)
    assert (live.applied, live.safety_violations) == (figures.applied, figures.safety_violations)
    assert so_far(events, "fenced", {}).safety_violations == 0


@pytest.mark.parametrize("losses", [0, 1])
def test_safety_counts_add_up_to_the_checkers_safety_violations(losses: int) -> None:
    """The chart's count of each safety rule covers every term of Figures.safety_violations, and no other."""
    names = [name for name in vars(Figures()) if isinstance(getattr(Figures(), name), int)]
    figures = Figures(**{name: 1 + n for n, name in enumerate(names)})
    figures.redis_state_losses = losses
    assert sum(safety_counts(figures).values()) == figures.safety_violations > 0
    assert safety_counts(Figures()) == {}


def test_a_serial_history_has_no_marks() -> None:
    """One execution at a time, each task once: the checker passes it and there is nothing to mark."""
    events, observation = simulate(0, overlap=0.0, again=0.0)
    assert check(observation).ok
    assert violation_marks(events, observation.audit) == []


def test_chart_says_in_one_line_that_matplotlib_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without matplotlib, drawing raises ImportError with one line naming the extra to install."""
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"^matplotlib is not installed: pip install 'celery-fencing\[plots\]'"):
        draw_soak(Timeline("empty", 0.0, 1.0, 2.0, [], []), tmp_path / "soak.png")


@pytest.fixture(scope="module")
def soak(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("soak")
    args = ["--duration", str(SOAK_SECONDS), "--seed", "18", "--rate", str(SOAK_RATE), "--workers", "1"]
    args += ["--concurrency", "1", "--drain-timeout", "60", "--progress", "2", "--out", str(out)]
    result = subprocess.run(
        [sys.executable, "-m", "reliability.soak", *args],
        cwd=ROOT,
        env={**os.environ, "FENCING_TEST_REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert (out / "report.md").exists(), result.stdout[-3000:] + result.stderr[-3000:]
    return result, out


LINE = re.compile(
    r"^\d\d:\d\d:\d\d reliability\.soak +(?P<elapsed>\d+)s (of \d+s|\(healed, draining\)): "
    r"fenced submitted (?P<fs>\d+) applied (?P<fa>\d+) faults (?P<faults>\d+) \(\d+ proven\) violations \d+; "
    r"control submitted (?P<cs>\d+) applied (?P<ca>\d+) faults \d+ \(\d+ proven\) violations \d+$",
    re.MULTILINE,
)


@pytest.mark.slow
def test_soak_prints_progress_lines_on_stderr(soak: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """Every --progress seconds a line on stderr: the time so far, per side submitted, applied, faults, violations."""
    result, _ = soak
    lines = [match.groupdict() for match in LINE.finditer(result.stderr)]
    assert len(lines) >= SOAK_SECONDS // 2, result.stderr[-3000:]
    elapsed = [int(line["elapsed"]) for line in lines]
    assert elapsed == sorted(elapsed) and elapsed[0] <= 3
    last = lines[-1]
    assert int(last["fs"]) == int(last["cs"]) == SOAK_SECONDS * SOAK_RATE, last
    assert 0 < int(last["fa"]) <= int(last["fs"]) and int(last["faults"]) > 0, last
    assert "soak" in result.stdout and not LINE.search(result.stdout), "progress lines stay off stdout"


@pytest.mark.slow
def test_soak_draws_its_chart_next_to_the_report(soak: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """With matplotlib, soak.png is written next to report.md (which embeds it), from timeline.json."""
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    result, out = soak
    height, width, _ = imread(out / "soak.png").shape
    assert width >= 1200 and height >= 900, (width, height)
    assert "](soak.png)" in (out / "report.md").read_text() and f"chart in {out / 'soak.png'}" in result.stdout
    timeline = Timeline.from_json(json.loads((out / "timeline.json").read_text()))
    assert [side.side for side in timeline.sides] == ["fenced", "control"]
    assert all(len(side.tasks) == SOAK_SECONDS * SOAK_RATE for side in timeline.sides)
    assert timeline.faults and timeline.origin < timeline.faults_until < timeline.ended
