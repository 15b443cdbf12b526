"""Every example runs with its one documented command against real servers and checks its own result."""

from __future__ import annotations

import subprocess

import pytest

from tests.run_module import run_module


def run_example(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m examples.<name>`` from the repository root, as examples/README.md documents it."""
    return run_module(f"examples.{name}", env=env, timeout=240)


@pytest.mark.slow
def test_bank_ledger_balances_on_postgresql(postgres_url: str, redis_url: str) -> None:
    """Concurrent fenced deposits on PostgreSQL end with the exact sum and one ledger line each."""
    done = run_example("bank_ledger", {"EXAMPLE_DATABASE_URL": postgres_url, "EXAMPLE_BROKER": redis_url})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: the books balance" in done.stdout
    assert "final balance    465  (expected 465)" in done.stdout


@pytest.mark.slow
def test_inventory_never_oversells_on_redis(redis_url: str) -> None:
    """Concurrent fenced reservations through a RedisGate never oversell and answer every order once."""
    done = run_example("inventory", {"EXAMPLE_REDIS_URL": redis_url, "EXAMPLE_BROKER": redis_url})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: never oversold, nothing lost" in done.stdout


@pytest.mark.slow
def test_redelivered_job_is_fenced_out(redis_url: str) -> None:
    """A job re-delivered by the Redis visibility timeout runs twice, and the older execution is fenced out."""
    done = run_example("redelivery", {"EXAMPLE_REDIS_URL": redis_url, "EXAMPLE_BROKER": redis_url})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gets the re-delivered message, resumes at chunk" in done.stdout
    assert "REFUSED writing chunk" in done.stdout
