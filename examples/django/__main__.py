"""Run the Django example: ``python -m examples.django`` from the repository root.

Needs no server: SQLite for the Django database and the tokens, kombu's
filesystem transport as the broker (set ``EXAMPLE_DATABASE_URL`` for
PostgreSQL, ``EXAMPLE_BROKER`` for Redis or RabbitMQ). It migrates, starts two
real ``celery worker`` processes (prefork, two children each), sends 30
deposits to each of three accounts at once, one account per mode (transaction
mode, column mode, unfenced), and prints the books. Exits 0 when both fenced
accounts hold the exact sum with one ledger entry per deposit.

Django management commands work too: ``python -m examples.django migrate``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AMOUNTS = list(range(1, 31))
MODES = [("deposit", "transaction mode"), ("deposit_column", "column mode"), ("deposit_unfenced", "unfenced")]


@contextlib.contextmanager
def workers(names: list[str], log_dir: Path) -> Iterator[list[Path]]:
    """Real ``celery worker`` processes in their own process groups, stopped (all of them) on exit."""
    procs, logs = [], []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        for name in names:
            log = log_dir / f"{name}.log"
            logs.append(log)
            # The node name carries the run's queue: workers of two runs on one RabbitMQ never share a pidbox.
            node = f"{name}.{os.environ['EXAMPLE_QUEUE']}@%h"
            args = [sys.executable, "-m", "celery", "-A", "examples.django.tasks", "worker", "-n", node,
                    "-Q", os.environ["EXAMPLE_QUEUE"], "--pool", "prefork", "--concurrency", "2",
                    "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
            with log.open("ab") as out:
                procs.append(
                    subprocess.Popen(
                        args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        for proc, log in zip(procs, logs, strict=True):
            wait_until(lambda p=proc, lg=log: _ready(p, lg), f"worker log {log}", 120)
        yield logs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _ready(proc: subprocess.Popen[bytes], log: Path) -> bool:
    text = log.read_text(errors="replace") if log.exists() else ""
    if proc.poll() is not None:
        raise RuntimeError(f"worker exited with {proc.returncode}:\n{text[-3000:]}")
    return " ready." in text


def wait_until(predicate: object, what: str, timeout: float) -> None:
    """Poll *predicate* until true; raise naming *what* after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)  # polling interval


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="django-example-") as tmp:
        os.environ.setdefault("EXAMPLE_DIR", tmp)
        os.environ.setdefault("FENCING_SOURCE", f"sqlite:///{Path(tmp) / 'tokens.db'}")
        os.environ.setdefault("EXAMPLE_QUEUE", f"ledger-{uuid.uuid4().hex[:8]}")
        from django.core.management import call_command

        from examples.django import tasks
        from examples.django.ledger.models import Account, Entry

        call_command("migrate", verbosity=0)
        accounts = {task: Account.objects.create(balance=0).pk for task, _ in MODES}
        expected = sum(AMOUNTS)
        print(f"30 deposits (1..30, sum {expected}) per account, on 2 workers x 2 processes, all at once")
        with workers(["w1", "w2"], Path(tmp)) as logs:
            for amount in AMOUNTS:
                for task, _ in MODES:
                    getattr(tasks, task).delay(accounts[task], amount)

            def all_applied() -> bool:
                return all(Entry.objects.filter(account_id=pk).count() >= len(AMOUNTS) for pk in accounts.values())

            wait_until(all_applied, "every deposit to be applied", 300)
            fenced_out = sum(log.read_text(errors="replace").count("fenced out at") for log in logs)
        ok = True
        print(f"{'mode':<18} {'balance':>8} {'entries':>8}  verdict")
        for task, label in MODES:
            balance = Account.objects.get(pk=accounts[task]).balance
            entries = Entry.objects.filter(account_id=accounts[task]).count()
            lost = expected - balance
            verdict = "exact" if lost == 0 else f"{lost} lost to overwritten deposits"
            print(f"{label:<18} {balance:>8} {entries:>8}  {verdict}")
            if task != "deposit_unfenced":
                ok = ok and balance == expected and entries == len(AMOUNTS)
        print(f"stale attempts fenced out and retried: {fenced_out}")
        print("fenced books balance" if ok else "FENCED BOOKS DO NOT BALANCE")
        return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django.settings")
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
    else:
        sys.exit(main())
