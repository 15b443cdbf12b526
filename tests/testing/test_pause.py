"""Pause points in one process: inactive they cost nothing; active, a held execution waits for its release."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from celery_fencing.testing import PausePoints, PausePointTimeoutError, pause_point
from celery_fencing.testing import pause as pause


def test_an_inactive_pause_point_is_a_none_check_and_touches_no_file(tmp_path: Path) -> None:
    """Without the environment variable, a million calls take well under a second (measured: ~40 ns each)."""
    code = (
        "import os, timeit\n"
        "os.environ.pop('CELERY_FENCING_PAUSE_DIR', None)\n"
        "from celery_fencing.testing import pause_point\n"
        "print(min(timeit.repeat(lambda: pause_point('after-read'), number=1_000_000, repeat=3)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    per_call = float(done.stdout) / 1_000_000
    assert per_call < 1e-6, f"{per_call * 1e9:.0f} ns per call"
    assert list(tmp_path.iterdir()) == []


def test_a_held_thread_waits_until_released_and_others_pass(fencing_pause_points: PausePoints) -> None:
    """Only as many arrivals as held wait; the rest record their arrival and go on."""
    fencing_pause_points.hold("p", times=1)
    passed: list[str] = []

    def run(name: str) -> None:
        pause_point("p")
        passed.append(name)

    first = threading.Thread(target=run, args=("first",))
    first.start()
    arrival = fencing_pause_points.wait("p")
    second = threading.Thread(target=run, args=("second",))
    second.start()
    second.join(10)
    assert passed == ["second"] and first.is_alive()
    assert arrival.held and arrival.task_id is None
    arrival.release()
    first.join(10)
    assert passed == ["second", "first"]


def test_hold_every_arrival_until_release_all(fencing_pause_points: PausePoints) -> None:
    """times=None holds every arrival; release_all lets every one go."""
    fencing_pause_points.hold("q", times=None)
    threads = [threading.Thread(target=pause_point, args=("q",)) for _ in range(3)]
    for thread in threads:
        thread.start()
    fencing_pause_points.wait("q", 3)
    assert all(thread.is_alive() for thread in threads)
    fencing_pause_points.release_all()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)


def test_a_held_execution_never_released_fails_instead_of_hanging(
    fencing_pause_points: PausePoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the hold limit the execution raises PausePointTimeoutError, naming the point."""
    monkeypatch.setattr(pause, "HOLD_LIMIT", 0.2)
    fencing_pause_points.hold("r")
    with pytest.raises(PausePointTimeoutError, match="pause point 'r' \\(arrival 1\\) was not released"):
        pause_point("r")


def test_bad_names_and_counts_are_refused(fencing_pause_points: PausePoints) -> None:
    """A name outside the allowed characters, or a count below 1, is a one-line error."""
    with pytest.raises(ValueError, match="a pause point name is"):
        pause_point("after read")
    with pytest.raises(ValueError, match="times must be a whole number >= 1 or None"):
        fencing_pause_points.hold("p", times=0)


def test_after_the_fixture_pause_points_are_inactive_again(tmp_path: Path) -> None:
    """close() releases and deactivates: a later call is the no-op again."""
    points = PausePoints(tmp_path / "p")
    points.activate()
    points.hold("s", times=None)
    points.close()
    pause_point("s")  # released-all: passes
    assert pause._directory is None
