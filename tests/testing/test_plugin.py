"""The pytest plugin: loaded once by entry point and with -p, blockable, no autouse, and no fixture clash
with celery.contrib.pytest or pytest-celery when a test uses them together (each run is a pytest subprocess)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

OURS = [
    "fencing_events",
    "fencing_pause_points",
    "fencing_sqlite_source",
    "fencing_tcp_proxy",
    "fencing_workers",
    "fencing_zookeeper",
    "fencing_zookeeper_ensemble",
]

REGISTERED_ONCE = """
import celery_fencing.testing as kit
from celery_fencing.testing import plugin

def test_registered_once(request):
    manager = request.config.pluginmanager
    assert manager.get_plugin("celery_fencing.testing") is kit
    assert manager.get_plugin("celery_fencing.testing.plugin") is plugin
    assert [p for p in manager.get_plugins() if p in (kit, plugin)].count(plugin) == 1

def test_nothing_is_autouse(request):
    assert not [name for name in request.fixturenames if name.startswith("fencing_")]
"""

NO_DRIVER = """
def test_loading_the_plugin_imported_no_driver():
    import sys
    assert not {"celery", "kazoo", "redis", "sqlalchemy", "kombu"} & set(sys.modules)
"""
# The runs about our plugin alone leave pytest-celery (and the docker plugin it brings) out: quicker to start.
ALONE = ("-p", "no:celery", "-p", "no:docker_tools")


def run_pytest(tmp_path: Path, source: str, *args: str, autoload: bool = True) -> subprocess.CompletedProcess[str]:
    """pytest in a directory of its own (no project conftest, no ini) on one test file."""
    (tmp_path / "test_user.py").write_text(source)
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
    if not autoload:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "test_user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _passed(done: subprocess.CompletedProcess[str], count: int) -> None:
    assert done.returncode == 0 and f"{count} passed" in done.stdout, done.stdout + done.stderr


def test_the_entry_point_loads_the_plugin_once(tmp_path: Path) -> None:
    """Installed, the plugin loads by itself, under its own two names, once; no fixture is autouse."""
    _passed(run_pytest(tmp_path, REGISTERED_ONCE, *ALONE), 2)


def test_dash_p_with_the_entry_point_installed_does_not_register_twice(tmp_path: Path) -> None:
    """-p celery_fencing.testing (and -p of its plugin module) beside the entry point: one registration each."""
    _passed(run_pytest(tmp_path, REGISTERED_ONCE, *ALONE, "-p", "celery_fencing.testing"), 2)
    _passed(run_pytest(tmp_path, REGISTERED_ONCE, *ALONE, "-p", "celery_fencing.testing.plugin"), 2)


def test_dash_p_loads_it_without_autoload_and_no_blocks_it(tmp_path: Path) -> None:
    """With autoload off, -p loads it; -p no:celery_fencing.testing keeps it out."""
    _passed(run_pytest(tmp_path, REGISTERED_ONCE, "-p", "celery_fencing.testing", autoload=False), 2)
    uses = "def test_uses(fencing_pause_points):\n    pass\n"
    for done in (
        run_pytest(tmp_path, uses, autoload=False),
        run_pytest(tmp_path, uses, "-p", "no:celery_fencing.testing"),
    ):
        assert done.returncode == 1 and "fixture 'fencing_pause_points' not found" in done.stdout, done.stdout


def _fixtures_by_plugin(tmp_path: Path, *args: str) -> dict[str, set[str]]:
    """Every fixture of one run, by the plugin that defines it (the file ``--fixtures -v`` names).

    celery.contrib.pytest and pytest-celery are listed in separate runs: they share names (``celery_worker``),
    and ``pytest --fixtures`` fails sorting two definitions of one name from two plugins.
    """
    done = run_pytest(tmp_path, "def test_nothing():\n    pass\n", "--fixtures", "-v", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    found: dict[str, set[str]] = {"ours": set(), "contrib": set(), "pytest_celery": set()}
    markers = {"ours": "celery_fencing/testing/", "contrib": "celery/contrib/", "pytest_celery": "pytest_celery/"}
    for name, where in re.findall(r"^(\w+)(?: \[\w+ scope\])? -- (\S+)", done.stdout, re.M):
        for key, marker in markers.items():
            if marker in where:
                found[key].add(name)
    return found


def test_our_fixtures_are_all_fencing_and_clash_with_neither_celery_plugin(tmp_path: Path) -> None:
    """Every fixture the plugin adds is fencing_*; none is a name celery.contrib.pytest or pytest-celery defines."""
    with_contrib = _fixtures_by_plugin(tmp_path, "-p", "no:celery", "-p", "celery.contrib.pytest")
    with_pytest_celery = _fixtures_by_plugin(tmp_path)
    ours = with_contrib["ours"]
    assert sorted(name for name in ours if not name.startswith("_")) == OURS
    assert all(name.lstrip("_").startswith("fencing_") for name in ours)
    assert with_pytest_celery["ours"] == ours
    assert {"celery_app", "celery_worker", "celery_config"} <= with_contrib["contrib"]
    assert {"celery_setup", "celery_worker", "default_worker_tasks"} <= with_pytest_celery["pytest_celery"]
    assert ours & (with_contrib["contrib"] | with_pytest_celery["pytest_celery"]) == set()


USES_CONTRIB_AND_OURS = """
from celery_fencing.testing import pause_point

def test_both(celery_app, celery_worker, fencing_pause_points, fencing_events):
    @celery_app.task(name="both.job")
    def job():
        pause_point("inside")
        return 1

    celery_worker.reload()
    fencing_pause_points.hold("inside")
    result = job.delay()
    fencing_pause_points.wait("inside").release()
    assert result.get(timeout=20) == 1
    assert [e.state for e in fencing_events.of("finished", task_id=result.id)] == ["SUCCESS"]
"""

USES_PYTEST_CELERY_AND_OURS = """
def test_both(default_worker_tasks, celery_worker_cluster_config, fencing_pause_points, fencing_sqlite_source):
    assert isinstance(default_worker_tasks, set) and fencing_sqlite_source.startswith("sqlite:///")
    assert fencing_pause_points.arrivals("none") == []
"""


def test_one_test_uses_celery_contrib_pytest_and_our_fixtures(tmp_path: Path) -> None:
    """celery.contrib.pytest's embedded worker runs a task held at our pause point, recorded by our events."""
    _passed(run_pytest(tmp_path, USES_CONTRIB_AND_OURS, "-p", "no:celery", "-p", "celery.contrib.pytest"), 1)


def test_one_test_uses_pytest_celery_and_our_fixtures(tmp_path: Path) -> None:
    """pytest-celery loaded by its entry point and ours with -p: a test asks for fixtures of both."""
    _passed(run_pytest(tmp_path, USES_PYTEST_CELERY_AND_OURS, "-p", "celery_fencing.testing"), 1)
