"""docs/quickstart.md, followed as a new user would: its fenced task and commands, run as written."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
BIN = Path(sys.executable).parent


def section(title: str) -> str:
    return QUICKSTART.read_text().split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def wait_until(predicate: object, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextlib.contextmanager
def worker(command: str, cwd: Path, env: dict[str, str], queue: str) -> Iterator[Path]:
    """The quickstart's worker command, run in *cwd*, on the test's own queue."""
    log = cwd / "worker.log"
    args = [str(BIN / "celery"), *command.split()[1:], "-Q", queue, "--without-gossip", "--without-mingle"]
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: proc.poll() is None and " ready." in log.read_text(), "the worker to start", 90)
        yield log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.slow
def test_quickstart_fences_the_task_as_written(tmp_path: Path, redis_url: str, unique_name: str) -> None:
    """The quickstart's fenced task runs in a real worker, its burst command ends at exactly 100 points, and its
    doctor and inspect commands report what the page says they report."""
    fenced = code_blocks(section("2. The task, fenced"), "python")[0]
    # The test's own servers and names; nothing else in the code changes.
    code = (
        fenced.replace("redis://127.0.0.1:6379/0", redis_url)
        .replace("redis.Redis()", f"redis.Redis.from_url({redis_url!r})")
        .replace("sqlite:///shop-tokens.db", f"sqlite:///{tmp_path / 'shop-tokens.db'}")
        .replace('prefix="shop"', f'prefix="{unique_name}"')
        .replace('f"points:{user_id}"', f'f"{unique_name}:points:{{user_id}}"')
    )
    assert code.count(unique_name) == 3, "the quickstart code changed: update this test's substitutions"
    code += f"\napp.conf.task_default_queue = {unique_name!r}\n"
    (tmp_path / "tasks.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    commands = code_blocks(section("3. Run it"), "bash")
    client = redis.Redis.from_url(redis_url)
    try:
        with worker(commands[0].strip(), tmp_path, env, unique_name) as log:
            burst = commands[1].strip()
            assert burst.startswith('python -c "')
            subprocess.run([sys.executable, "-c", burst[len('python -c "') : -1]], cwd=tmp_path, env=env, check=True)
            wait_until(lambda: log.read_text().count("succeeded in") == 100, "100 tasks to succeed")
            assert int(client.get(f"{unique_name}:points:7") or 0) == 100

        doctor, inspect = (block.strip() for block in code_blocks(section("4. Check the setup"), "bash"))
        done = subprocess.run(doctor.split(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "no persistence" in done.stdout
        assert "add_points" in done.stdout and "visibility_timeout" in done.stdout

        args = inspect.replace("sqlite:///shop-tokens.db", f"sqlite:///{tmp_path / 'shop-tokens.db'}")
        args = args.replace("redis://127.0.0.1:6379/0", redis_url).replace("--redis-prefix shop", "--redis-prefix X")
        argv = [part if part != "X" else unique_name for part in args.split()]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        row = next(line for line in done.stdout.splitlines() if line.startswith("user:7"))
        last, mark = row.split()[1:3]
        assert int(last) >= 100 and int(mark) <= int(last)
    finally:
        keys = list(client.scan_iter(f"*{unique_name}*"))
        if keys:
            client.delete(*keys)
        client.close()
