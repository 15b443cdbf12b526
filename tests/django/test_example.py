"""examples/django runs as documented: ``python -m examples.django``, with real workers, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from kombu import Connection

ROOT = Path(__file__).resolve().parents[2]


def _run(env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "examples.django"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "examples.django.settings", **env},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _check(output: str) -> None:
    assert re.search(r"transaction mode\s+465\s+30\s+exact", output), output
    assert re.search(r"column mode\s+465\s+30\s+exact", output), output
    # Negative control: the unfenced account, same schedule, lost deposits.
    assert re.search(r"unfenced\s+\d+\s+30\s+\d+ lost", output), output
    assert "fenced books balance" in output


@pytest.mark.slow
def test_example_runs_with_no_server(tmp_path: Path) -> None:
    """With no settings at all (SQLite, filesystem broker) the fenced accounts balance and the unfenced one does not."""
    _check(_run({"EXAMPLE_DIR": str(tmp_path)}))


@pytest.mark.slow
def test_example_runs_on_postgresql_and_rabbitmq(tmp_path: Path, postgres_url: str, rabbitmq_url: str) -> None:
    """The same run with PostgreSQL as Django's database and RabbitMQ as the broker."""
    plain = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    schema = "djex_" + uuid.uuid4().hex[:12]
    queue = f"ledger-{schema}"
    with psycopg.connect(plain, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        output = _run(
            {
                "EXAMPLE_DIR": str(tmp_path),
                "EXAMPLE_DATABASE_URL": f"{plain}?options=-c%20search_path%3D{schema}",
                "EXAMPLE_BROKER": rabbitmq_url,
                "EXAMPLE_QUEUE": queue,
            }
        )
    finally:
        with Connection(rabbitmq_url, connect_timeout=5) as broker:
            broker.default_channel.queue_delete(queue)
        with psycopg.connect(plain, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    _check(output)
