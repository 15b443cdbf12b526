"""A mark table made before grantor ids (no grantor column) keeps working, says so once, and
create_schema() migrates it; on PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from celery_fencing import FencingToken, GrantorMismatchError, SQLGate, StaleTokenError
from celery_fencing.token import Mark

from .adapters import make_engine


@pytest.fixture(params=["postgres", "mariadb", "sqlite"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'legacy.db'}"
    else:
        url = request.getfixturevalue(f"{request.param}_url")
    engine = make_engine(url)
    yield engine
    engine.dispose()


def test_legacy_table_works_and_create_schema_adds_the_grantor_column(
    engine: sa.Engine, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the column the gate fences by value and warns with the migration; create_schema() adds the check."""
    table = f"hw_legacy_{unique_name}"
    resource_type = "VARBINARY(800)" if engine.dialect.name in ("mysql", "mariadb") else "VARCHAR(200)"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (resource {resource_type} PRIMARY KEY, token BIGINT NOT NULL)")
    try:
        gate = SQLGate(engine, table=table)
        with caplog.at_level(logging.WARNING, logger="celery_fencing.gates.sql"):
            gate.claim(FencingToken("acct", 10, "zk-old"))
            gate.claim(FencingToken("acct", 11, "zk-new"))  # no column: not detected, by value only
        assert "ADD COLUMN grantor" in caplog.text
        assert gate.mark("acct") == Mark("acct", 11, None)
        with pytest.raises(StaleTokenError):
            gate.claim(FencingToken("acct", 9, "zk-new"))

        gate.create_schema()
        gate.create_schema()  # idempotent
        gate.claim(FencingToken("acct", 12, "zk-new"))
        assert gate.mark("acct") == Mark("acct", 12, "zk-new")
        with pytest.raises(GrantorMismatchError):
            gate.claim(FencingToken("acct", 13, "zk-old"))
        # A fresh gate object on the migrated table sees the column at once.
        with pytest.raises(GrantorMismatchError):
            SQLGate(engine, table=table).claim(FencingToken("acct", 14, "zk-old"))
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {table}")
