"""Celery's own integration tests, plain and fenced: ``scripts/celery-integration`` runs this.

It fetches the source distribution of the installed Celery (``pip download
--no-binary :all: celery==<version>``) into ``.cache/celery-src/``, extracts its
``t/`` and ``pyproject.toml`` (not its ``celery/`` package: the tests run
against the installed Celery), and runs ``t/integration/test_canvas.py`` and
``t/integration/test_tasks.py`` three times, each in its own pytest process and
against its own throwaway ``redis-server`` (the tests write fixed key names in
db 0, list every pub/sub channel of the server, and must never touch the
machine's shared Redis):

* ``plain``: the Redis broker and Celery's ``redis://`` result backend;
* ``backend``: the same with ``fenced+redis://``, ``install(app)`` and a SQLite
  token source;
* ``task``: as ``backend``, and every task a ``FencedTask``
  (``Celery(task_cls="celery_fencing.celery:FencedTask")``).

How the configuration gets into Celery's suite without editing its files: this
module is also a pytest plugin (``-p celery_integration``). A hook wrapper
around ``pytest_fixture_setup`` amends what Celery's own fixtures return:
``celery_config`` (``fencing_source``), ``celery_parameters`` (the loader, and
``task_cls``) and the two apps, ``celery_session_app`` (the app of the suite's
one in-process prefork worker) and ``celery_app`` (the app each test sends
from), which it passes to ``install()``. Overriding the fixtures instead would
depend on the order in which pytest registers plugins and conftests; amending
their values does not. The plugin checks that it took (each app's backend
class and task base) and fails the run otherwise.

The fenced runs keep ``result_backend = "redis://..."`` and get the fenced
class through Celery's own hook for that, the loader's ``override_backends``
(``{"redis": FencedRedisBackend}``): 78 of the tests skip themselves unless
``app.conf.result_backend`` starts with ``redis``, and one is an ``xfail`` on
``TEST_BACKEND`` starting with ``redis://``. The backend is the object
``fenced+redis://<same URL>`` builds (Celery passes both the same
``redis://`` URL); only the string in ``app.conf`` differs.

Output: a table of passed/failed/error/skipped/xfailed counts and wall time per
run (from pytest's ``--junitxml``), each fenced run's wall time over plain's,
and the tests that pass plain but fail, error or skip in a fenced run. The exit
code is 1 when any test passes plain and fails (or errors) fenced, or a ratio
exceeds ``--max-ratio`` (1.3); the tests in :data:`BY_DESIGN` (they assert
what exactly-once refuses) are listed with their reason and do not count. Arguments after ``--`` go to every pytest run
(``-- -k chord``); ``--configs plain,task`` runs a subset.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

CONFIGS = ("plain", "backend", "task")
TEST_FILES = ("t/integration/test_canvas.py", "t/integration/test_tasks.py")
MODE_VAR = "CELERY_FENCING_UPSTREAM_MODE"
SOURCE_VAR = "CELERY_FENCING_UPSTREAM_SOURCE"
REPO = Path(__file__).resolve().parents[1]

#: Tests that assert what fencing refuses on purpose, per configuration: they are
#: listed with the reason and do not fail the command. Exactly once per task id
#: (``fencing_once``, the default) ends a second execution of a task id that
#: another execution finished as done, before its body, whatever sent it.
BY_DESIGN = {
    "task": {
        "t.integration.test_canvas.test_chord::test_reapplying_frozen_chord_dispatches_body_again": (
            "applies one frozen chord twice: the second run's tasks have the first run's task ids, "
            "so exactly once ends them as done (the body runs once); passes with fencing_once=False"
        ),
    },
}


# The pytest plugin ----------------------------------------------------------------------
#
# Imported by pytest (-p celery_integration) in each run's process; inactive
# unless the driver below set MODE_VAR.

try:
    import pytest
except ImportError:  # the driver itself does not need pytest
    pytest = None  # type: ignore[assignment]


def _mode() -> str | None:
    mode = os.environ.get(MODE_VAR)
    if mode is not None and mode not in CONFIGS:
        raise SystemExit(f"{MODE_VAR}={mode!r}: expected one of {', '.join(CONFIGS)}")
    return mode


if pytest is not None:

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(fixturedef: Any, request: Any) -> Any:
        """Amend the values of Celery's app fixtures for the fenced runs."""
        value = yield
        mode = _mode()
        if mode in (None, "plain"):
            return value
        name = fixturedef.argname
        if name == "celery_config":
            backend = value["result_backend"]
            if not backend.startswith("redis://"):
                raise pytest.UsageError(f"celery_config result_backend={backend!r}: expected a redis:// URL")
            value["fencing_source"] = os.environ[SOURCE_VAR]
        elif name == "celery_parameters":
            value["loader"] = f"{__name__}:FencedRedisLoader"
            if mode == "task":
                value["task_cls"] = "celery_fencing.celery:FencedTask"
        elif name in ("celery_session_app", "celery_app"):
            from celery_fencing.celery import install, uninstall

            install(value)
            _check_app(value, mode)
            if name == "celery_app":
                # One app per test: drop its process-init handlers with it.
                fixturedef.addfinalizer(lambda app=value: uninstall(app))
        return value

    def pytest_report_header(config: Any) -> str:
        return f"celery-fencing upstream configuration: {_mode() or 'none (plugin inactive)'}"


def _loader_base() -> Any:
    try:
        from celery.loaders.app import AppLoader
    except ImportError:  # the driver runs without Celery
        return object
    return AppLoader


class FencedRedisLoader(_loader_base()):  # type: ignore[misc]
    """Celery's app loader, with ``redis://`` result backends built as ``fenced+redis://`` builds them."""

    override_backends: ClassVar[dict[str, str]] = {"redis": "celery_fencing.celery.backend:FencedRedisBackend"}


def _check_app(app: Any, mode: str) -> None:
    """Fail the run when the configuration did not take, rather than measure the plain one twice."""
    from celery_fencing.celery import FencedTask
    from celery_fencing.celery.backend import FencedRedisBackend

    if not isinstance(app.backend, FencedRedisBackend):
        raise RuntimeError(f"configuration {mode}: the app's backend is {type(app.backend).__name__}")
    if (mode == "task") != issubclass(app.Task, FencedTask):
        raise RuntimeError(f"configuration {mode}: the app's task base is {app.Task.__mro__[1:3]}")


# The driver -----------------------------------------------------------------------------


@dataclass
class Run:
    config: str
    wall: float
    exit_code: int
    load_before: str
    load_after: str
    outcomes: dict[str, str] = field(default_factory=dict)  # test id -> passed/failed/error/skipped/xfailed/xpassed

    def count(self, outcome: str) -> int:
        return sum(1 for value in self.outcomes.values() if value == outcome)


def fetch_tests(version: str, cache: Path) -> Path:
    """Download Celery's sdist once and extract its tests; return the directory to run pytest in."""
    root = cache / "celery-src" / f"celery-{version}"
    if (root / "t" / "integration" / "conftest.py").is_file():
        return root
    download = cache / "celery-src" / "download"
    download.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"celery=={version}",
            "-d",
            str(download),
        ],
        check=True,
    )
    archive = download / f"celery-{version}.tar.gz"
    if not archive.is_file():
        raise SystemExit(f"pip download left no {archive.name} in {download}")
    staging = Path(tempfile.mkdtemp(dir=cache / "celery-src"))
    prefix = f"celery-{version}/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith((prefix + "t/", prefix + "pyproject.toml"))]
        tar.extractall(staging, members=members, filter="data")
    if root.exists():
        shutil.rmtree(root)
    (staging / f"celery-{version}").rename(root)
    staging.rmdir()
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A throwaway redis-server on a free loopback port, with no persistence."""
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server not found: install Debian's redis-server package")
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=(workdir / "redis.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"redis-server exited with {proc.returncode}: see {workdir / 'redis.log'}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"redis-server on port {port} did not answer PING within 10 s")


def read_junit(path: Path) -> dict[str, str]:
    """Each test's final outcome from pytest's junit XML (a rerun's last report wins)."""
    outcomes: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag: child for child in case}
        if "error" in tags:
            outcome = "error"
        elif "failure" in tags:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "xfailed" if tags["skipped"].get("type") == "pytest.xfail" else "skipped"
        else:
            outcome = "passed"
        # A test that passed and then errored at teardown has two entries: keep the worse one.
        if outcomes.get(test_id) not in ("error", "failed"):
            outcomes[test_id] = outcome
    return outcomes


def run_config(config: str, tests: Path, work: Path, pytest_args: list[str]) -> Run:
    work.mkdir(parents=True, exist_ok=True)
    redis_proc, port = start_redis(work)
    junit = work / "junit.xml"
    junit.unlink(missing_ok=True)
    source_db = work / "tokens.db"
    source_db.unlink(missing_ok=True)
    url = f"redis://127.0.0.1:{port}/0"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", MODE_VAR, SOURCE_VAR)}
    env.update(
        TEST_BROKER=url,
        TEST_BACKEND=url,
        REDIS_HOST="127.0.0.1",
        REDIS_PORT=str(port),
        PYTHONPATH=str(Path(__file__).resolve().parent),
        PYTHONDONTWRITEBYTECODE="1",
    )
    env[MODE_VAR] = config
    env[SOURCE_VAR] = f"sqlite:///{source_db}"
    command = [
        sys.executable,
        "-m",
        "pytest",
        *TEST_FILES,
        # Celery's fixtures: its conftest imports three of them and leaves the rest
        # (celery_parameters, ...) to the plugin that pytest-celery would register.
        "-p",
        "celery.contrib.pytest",
        "-p",
        "celery_integration",
        "-p",
        "no:cacheprovider",
        "--timeout=300",
        f"--junitxml={junit}",
        "-rfE",
        *pytest_args,
    ]
    log = work / "pytest.log"
    load_before = Path("/proc/loadavg").read_text().split(" ", 3)[:3]
    print(f"[{config}] running pytest (log: {log}, redis port {port}) ...", flush=True)
    started = time.monotonic()
    try:
        with log.open("wb") as out:
            code = subprocess.call(command, cwd=tests, env=env, stdout=out, stderr=subprocess.STDOUT)
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
    wall = time.monotonic() - started
    load_after = Path("/proc/loadavg").read_text().split(" ", 3)[:3]
    lines = log.read_text(errors="replace").strip().splitlines()
    print(f"[{config}] exit {code} in {wall:.0f} s: {lines[-1] if lines else '(no output)'}", flush=True)
    if not junit.is_file():
        raise SystemExit(f"[{config}] pytest wrote no {junit}: see {log}")
    return Run(config, wall, code, " ".join(load_before), " ".join(load_after), read_junit(junit))


def report(runs: list[Run], max_ratio: float) -> int:
    columns = ("passed", "failed", "error", "skipped", "xfailed")
    print()
    header = f"{'configuration':<14}" + "".join(f"{c:>9}" for c in columns)
    print(header + f"{'wall s':>9}{'ratio':>8}  load before/after")
    plain = next((run for run in runs if run.config == "plain"), None)
    problems = 0
    for run in runs:
        ratio = run.wall / plain.wall if plain else float("nan")
        ratio_text = "-" if run is plain or plain is None else f"{ratio:.2f}"
        print(
            f"{run.config:<14}"
            + "".join(f"{run.count(c):>9}" for c in columns)
            + f"{run.wall:>9.0f}{ratio_text:>8}  {run.load_before} / {run.load_after}"
        )
        if plain is not None and run is not plain and ratio > max_ratio:
            print(f"  {run.config}: wall time {ratio:.2f}x plain's, above {max_ratio}")
            problems += 1
    if plain is None:
        return 1 if problems else 0
    for run in runs:
        if run is plain:
            continue
        lost = sorted(t for t, o in plain.outcomes.items() if o == "passed" and run.outcomes.get(t) != "passed")
        by_design = BY_DESIGN.get(run.config, {})
        failing = [t for t in lost if run.outcomes.get(t) in ("failed", "error", None)]
        expected = [t for t in failing if t in by_design]
        failing = [t for t in failing if t not in by_design]
        print(f"\n{run.config}: {len(failing)} test(s) pass plain and fail fenced" + (":" if failing else ""))
        for test in failing:
            print(f"  {run.outcomes.get(test, 'not run')}: {test}")
        if expected:
            print(f"{run.config}: {len(expected)} test(s) pass plain and fail fenced by design:")
            for test in expected:
                print(f"  {run.outcomes.get(test, 'not run')}: {test}\n    {by_design[test]}")
        others = [t for t in lost if t not in failing and t not in expected]
        if others:
            print(f"{run.config}: {len(others)} test(s) pass plain and do not run fenced:")
            for test in others:
                print(f"  {run.outcomes[test]}: {test}")
        problems += len(failing)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, pytest_args = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="scripts/celery-integration")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of plain,backend,task")
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache", help="where the sdist and the runs go")
    parser.add_argument("--max-ratio", type=float, default=1.3, help="largest fenced/plain wall time ratio")
    args = parser.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        parser.error(f"--configs {args.configs!r}: expected a comma-separated subset of {','.join(CONFIGS)}")
    version = importlib.metadata.version("celery")
    tests = fetch_tests(version, args.cache_dir)
    print(f"Celery {version}: {', '.join(TEST_FILES)} in {tests}", flush=True)
    runs = [run_config(c, tests, args.cache_dir / "celery-integration-runs" / c, pytest_args) for c in configs]
    return report(runs, args.max_ratio)


if __name__ == "__main__":
    sys.exit(main())
