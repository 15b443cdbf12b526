"""The README's quickstart is real code: it runs, as written, in a real worker."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import redis

from tests.fixtures.zookeeper import ZooKeeperServer

from .workers import ROOT, WorkerProcess


def _quickstart() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Fence a Celery task", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README quickstart has no python block"
    return match.group(1)


def test_quickstart_is_short() -> None:
    """The quickstart fences a task in under 20 lines."""
    assert len([line for line in _quickstart().splitlines() if line.strip()]) < 20


def test_quickstart_runs_in_a_worker(
    tmp_path: Path, zookeeper_server: ZooKeeperServer, redis_url: str, unique_name: str
) -> None:
    """The quickstart's deposit task, run 30 times by a prefork worker, leaves the exact balance."""
    code = _quickstart()
    # Point it at this test's servers and keys; nothing else changes.
    code = code.replace("zookeeper://127.0.0.1:2181/fencing", zookeeper_server.url(f"/{unique_name}"))
    code = code.replace('prefix="bank"', f'prefix="{unique_name}"')
    code = code.replace('f"balance:{account_id}"', f'f"{unique_name}:balance:{{account_id}}"')
    code += f"\napp.conf.task_default_queue = {unique_name!r}\n"
    (tmp_path / "bank.py").write_text(code)
    worker = WorkerProcess(
        "bank",
        name="quickstart",
        queue=unique_name,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}"},
        log_dir=tmp_path,
        pool="prefork",
        concurrency=2,
    )
    worker.start()
    client = redis.Redis.from_url(redis_url)
    try:
        spec = importlib.util.spec_from_file_location("bank", tmp_path / "bank.py")
        assert spec and spec.loader
        bank = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bank)
        results = [bank.deposit.delay(7, 1) for _ in range(30)]
        for result in results:
            result.get(timeout=120)
        assert int(client.get(f"{unique_name}:balance:7")) == 30
    finally:
        worker.stop()
        keys = list(client.scan_iter(f"*{unique_name}*"))
        if keys:
            client.delete(*keys)
