"""Worker flags: listed by ``celery worker --help``, applied over settings, validated at start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from celery_fencing import SQLiteTokenSource
from celery_fencing.celery.settings import SETTINGS
from tests.run_module import run_module

from .conftest import APP_MODULE, Scenario
from .workers import ROOT


def _worker_help(scenario: Scenario) -> str:
    env = {**scenario.env, "PYTHONPATH": str(ROOT)}
    return run_module("celery", "-A", APP_MODULE, "worker", "--help", env=env, timeout=60, check=True).stdout


def test_help_lists_every_fencing_flag(scenario: Scenario) -> None:
    """`celery -A app worker --help` shows one --fencing-* flag per setting, under their own heading, in the
    settings table's order, the same on every run."""
    first, second = _worker_help(scenario), _worker_help(scenario)
    assert first == second, "the help must not change from run to run"
    section = first.split("Fencing Options", 1)[1]
    listed = [word for word in section.split() if word.startswith("--fencing-")]
    assert listed == [setting.flag for setting in SETTINGS]


def test_source_flag_overrides_the_setting(scenario: Scenario) -> None:
    """--fencing-source wins over fencing_source: tokens come from the flag's SQLite file."""
    flagged = scenario.tmp_path / "flagged.db"
    scenario.worker("w1", extra_args=("--fencing-source", f"sqlite:///{flagged}"))
    got = scenario.send("whoami", "f").get(timeout=30)
    source = SQLiteTokenSource(flagged)
    # The worker drew its token from a block of the flag's file: the file's counter covers it.
    assert 1 <= got["token"] <= source.ceiling("plain:f") < source.mint("plain:f").value
    source.close()
    assert not (scenario.tmp_path / "tokens.db").exists(), "the setting's source must not have been used"


@pytest.mark.parametrize(
    ("extra_args", "named"),
    [
        (("--fencing-timeout", "soon"), "fencing_timeout"),
        (("--fencing-on-stale", "panic"), "fencing_on_stale"),
        (("--fencing-mode", "shared"), "fencing_mode"),
        (("--fencing-source", "nosuch://x"), "unknown token source scheme"),
        (("--fencing-source", "memory://"), "is volatile"),
        (("--fencing-mode", "exclusive"), "fencing_mode='exclusive' needs a source with leases"),
        (("--fencing-lock-delay", "5"), "fencing_lock_delay=5 needs a source whose leases take a lock-delay"),
    ],
    ids=["timeout", "on-stale", "mode", "source", "volatile-source", "exclusive-without-leases", "lock-delay"],
)
def test_bad_flag_stops_the_worker_naming_it(scenario: Scenario, extra_args: tuple[str, ...], named: str) -> None:
    """A bad flag value, or one the configured source (SQLite here) cannot honour, makes the worker
    refuse to start, with an error naming the setting."""
    log = _log_of_a_refused_start(scenario, "bad", extra_args)
    assert named in log
    _assert_one_line_error(log)


def _log_of_a_refused_start(scenario: Scenario, name: str, extra_args: tuple[str, ...] = ()) -> str:
    """Start a worker of the scenario that must exit instead of becoming ready; return its log."""
    worker = scenario.add_worker(name, extra_args=extra_args)
    with pytest.raises(AssertionError, match="exited with"):
        worker.start(timeout=60)
    return worker.log()


def _assert_one_line_error(log: str) -> None:
    """The worker said why it cannot start in one line, without a traceback."""
    lines = [line for line in log.splitlines() if line.startswith("celery-fencing: the worker cannot start: ")]
    assert len(lines) == 1, log[-2000:]
    assert "Traceback" not in log


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"fencing_timout": 3}, "unknown setting fencing_timout; did you mean fencing_timeout?"),
        ({"fencing_max_retires": 3}, "unknown setting fencing_max_retires; did you mean fencing_max_retries?"),
        ({"FENCING_SOURCE": "sqlite:///x.db"}, "unknown setting FENCING_SOURCE; did you mean fencing_source?"),
    ],
    ids=["timeout", "max-retries", "upper-case"],
)
def test_misspelt_setting_stops_the_worker_with_a_hint(
    scenario: Scenario, settings: dict[str, object], message: str
) -> None:
    """A fencing_* setting that does not exist is refused at start, with the closest name, in one line."""
    scenario.env["FT_CONF"] = json.dumps(settings)
    log = _log_of_a_refused_start(scenario, "typo")
    assert message in log
    _assert_one_line_error(log)


def test_worker_without_source_refuses_to_start(scenario: Scenario) -> None:
    """With celery-fencing installed and no source configured, the worker does not start."""
    del scenario.env["FT_SOURCE"]
    log = _log_of_a_refused_start(scenario, "nosource")
    assert "no token source is configured" in log
    _assert_one_line_error(log)


def test_volatile_source_on_prefork_is_warned_about(scenario: Scenario) -> None:
    """memory:// on a prefork pool of several children: each child counts from zero, and the worker says so."""
    scenario.worker(
        "volatile",
        pool="prefork",
        concurrency=2,
        extra_args=("--fencing-source", "memory://", "--fencing-allow-volatile-source"),
    )
    log = scenario.workers[-1].log()
    assert "MemoryTokenSource with a prefork pool of 2 processes: every child counts from its own zero" in log


@pytest.mark.parametrize(
    ("task_options", "message"),
    [
        ('fencing_resorce="sku:{sku}"', "task reserve: unknown option(s) fencing_resorce"),
        ('fencing_resource="sku:{skuu}"', "names {skuu}, which the task does not take (it takes: qty, sku)"),
    ],
    ids=["option-typo", "bad-template"],
)
def test_task_definition_mistakes_stop_the_worker_in_one_line(
    tmp_path: Path, redis_url: str, task_options: str, message: str
) -> None:
    """A task-option typo or a template naming a missing argument: the worker exits 1 with one line, no traceback."""
    (tmp_path / "shop.py").write_text(
        "from celery import Celery\n"
        "from celery_fencing.celery import FencedTask, install\n"
        f"app = install(Celery('shop', broker={redis_url!r}))\n"
        f"app.conf.fencing_source = 'sqlite:///{tmp_path / 'tokens.db'}'\n"
        f"@app.task(base=FencedTask, {task_options})\n"
        "def reserve(sku, qty):\n"
        "    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "shop", "worker", "-P", "solo"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith("celery-fencing: ") and message in line
