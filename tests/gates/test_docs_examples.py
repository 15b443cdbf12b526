"""The code in docs/gates.md runs: its examples against the real Redis and SQLite, its migration against the DDL."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from celery_fencing.gates.sql import high_water_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "gates.md"
BLOCK = re.compile(r"(?:<!-- docs-test: (?P<marker>[\w-]+) -->\n)?```python\n(?P<code>.*?)```", re.DOTALL)


def _blocks(marker: str | None) -> list[str]:
    return [m["code"] for m in BLOCK.finditer(DOC.read_text()) if m["marker"] == marker]


def test_examples_run(redis_url: str, unique_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every unmarked Python block of docs/gates.md runs, in order, against Redis and SQLite files."""
    monkeypatch.chdir(tmp_path)
    blocks = _blocks(None)
    assert len(blocks) >= 6
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    client = redis.Redis.from_url(redis_url)
    try:
        for code in blocks:
            # Private names on the shared Redis: the prefix and the hash tag.
            code = code.replace('prefix="bank"', f'prefix="{unique_name}"').replace("{42}", "{" + unique_name + "}")
            exec(compile(code, str(DOC), "exec"), namespace)
    finally:
        keys = list(client.scan_iter(match=f"*{unique_name}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
        for value in namespace.values():
            if isinstance(value, sa.Engine):
                value.dispose()


class _RecordingOp:
    """Stands in for alembic.op: records the tables and columns a migration creates."""

    def __init__(self) -> None:
        self.tables: dict[str, sa.Table] = {}
        self.added: list[tuple[str, sa.Column[Any]]] = []

    def create_table(self, name: str, *items: Any) -> sa.Table:
        self.tables[name] = sa.Table(name, sa.MetaData(), *items)
        return self.tables[name]

    def add_column(self, table: str, column: sa.Column[Any]) -> None:
        self.added.append((table, column))

    def drop_table(self, name: str) -> None:
        pass

    def drop_column(self, table: str, name: str) -> None:
        pass


def test_migration_creates_the_gates_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-written Alembic migration in the docs emits the same DDL as the gate's own table, on every dialect."""
    (code,) = _blocks("migration")
    op = _RecordingOp()
    alembic = types.ModuleType("alembic")
    alembic.op = op  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "alembic", alembic)
    namespace: dict[str, Any] = {"__name__": "migration"}
    exec(compile(code, str(DOC), "exec"), namespace)
    namespace["upgrade"]()
    namespace["downgrade"]()
    ours = high_water_table(sa.MetaData())
    for dialect in (postgresql.dialect(), mysql.dialect(), sqlite.dialect()):
        expected = str(sa.schema.CreateTable(ours).compile(dialect=dialect))
        assert str(sa.schema.CreateTable(op.tables["fencing_high_water"]).compile(dialect=dialect)) == expected
    ((table, column),) = op.added
    assert (table, column.name, column.nullable, type(column.type)) == ("accounts", "fence", True, sa.BigInteger)
