"""Grantor ids at DjangoGate beyond the shared contract, on PostgreSQL and SQLite: guard(), tokens without a
grantor, column mode's ``grantor_field``, one statement per check, SQLGate sharing the column, a custom model
without one, and migration 0002 run forward over a table made by 0001 alone."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import sqlalchemy as sa
from django.db import connections, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from celery_fencing import (
    FencingConfigurationError,
    FencingToken,
    GrantorMismatchError,
    SQLGate,
    StaleTokenError,
)
from celery_fencing.gates.django import DjangoGate, fenced_update
from celery_fencing.token import Mark

from .adapters import DjangoAdapter, sqlalchemy_engine
from .migration_runs import run_migration_scenario, sa_connect_args

T = FencingToken
OLD, NEW = "zk-0123456789abcdef0123456789abcdef", "zk-fedcba9876543210fedcba9876543210"


def _mark_statements(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries.captured_queries if "fencing_high_water" in query["sql"]]


# Transaction mode ----------------------------------------------------------------------


def test_guard_refuses_another_grantor_and_dooms_the_block(adapter: DjangoAdapter) -> None:
    """guard() with another grantor's token, however large, raises naming both ids; the block cannot commit."""
    adapter.gate.claim(T("acct", 100, OLD))
    with transaction.atomic(using=adapter.alias):
        with pytest.raises(GrantorMismatchError) as caught:
            adapter.gate.guard(T("acct", 2**62, NEW))
        with pytest.raises(TransactionManagementError):
            adapter.items.create(key="k", value=1)
    assert (caught.value.token_grantor, caught.value.expected_grantor) == (NEW, OLD)
    assert OLD in str(caught.value) and NEW in str(caught.value)
    assert adapter.read("k") is None
    assert adapter.gate.mark("acct") == Mark("acct", 100, OLD)
    # Negative control: the mark's own grantor passes in the same kind of block.
    with transaction.atomic(using=adapter.alias):
        adapter.gate.guard(T("acct", 101, OLD))
        adapter.items.create(key="k", value=1)
    assert (adapter.read("k"), adapter.gate.mark("acct")) == (1, Mark("acct", 101, OLD))


def test_token_without_grantor_is_compared_by_value(adapter: DjangoAdapter) -> None:
    """A token without a grantor passes any grantor's mark by value alone and leaves the grantor as it was."""
    adapter.gate.claim(T("acct", 5, OLD))
    adapter.write(T("acct", 6), "k", 6)
    assert adapter.gate.mark("acct") == Mark("acct", 6, OLD)
    with pytest.raises(StaleTokenError) as caught:
        adapter.claim(T("acct", 4))
    assert caught.value.high_water == 6
    adapter.claim(T("fresh", 3))
    assert adapter.gate.mark("fresh") == Mark("fresh", 3, None)
    assert adapter.gate.mark("never") is None
    assert (adapter.read("k"), adapter.high_water("acct")) == (6, 6)


def test_grantor_is_checked_in_the_upsert_itself(adapter: DjangoAdapter) -> None:
    """An accepted claim touches the mark table with one statement, which compares and sets the grantor."""
    adapter.gate.claim(T("acct", 5))
    with CaptureQueriesContext(connections[adapter.alias]) as queries:
        adapter.gate.claim(T("acct", 6, OLD))
    (upsert,) = _mark_statements(queries)
    assert upsert.upper().startswith("INSERT") and upsert.count("grantor") >= 4, upsert
    with CaptureQueriesContext(connections[adapter.alias]) as queries, pytest.raises(GrantorMismatchError):
        adapter.gate.claim(T("acct", 7, NEW))
    # The refused upsert, then the read of the refusing mark under its row lock.
    assert len(_mark_statements(queries)) == 2
    assert adapter.gate.mark("acct") == Mark("acct", 6, OLD)


def test_sqlgate_shares_the_grantor_column(pg: DjangoAdapter) -> None:
    """SQLGate on the same PostgreSQL schema sees the grantor DjangoGate stored, and refuses another grantor."""
    pg.gate.claim(T("acct", 40, OLD))
    engine = sqlalchemy_engine(pg.alias)
    try:
        sql_gate = SQLGate(engine)
        assert sql_gate.mark("acct") == Mark("acct", 40, OLD)
        with pytest.raises(GrantorMismatchError):
            sql_gate.claim(T("acct", 41, NEW))
        sql_gate.reset_mark(T("acct", 3, NEW), expected=Mark("acct", 40, OLD))
        assert pg.gate.mark("acct") == Mark("acct", 3, NEW)
        with pytest.raises(GrantorMismatchError):
            pg.gate.claim(T("acct", 41, OLD))
    finally:
        engine.dispose()


def test_model_without_a_grantor_field_checks_values_only(
    adapter: DjangoAdapter, caplog: pytest.LogCaptureFixture
) -> None:
    """A custom mark model without ``grantor`` keeps working by value, and the gate warns that it cannot check."""
    from tests.django.testapp.models import LegacyMark

    LegacyMark.objects.using(adapter.alias).all().delete()
    with caplog.at_level(logging.WARNING, logger="celery_fencing.gates.django"):
        gate = DjangoGate(adapter.alias, model=LegacyMark)
    assert any("grantor" in record.getMessage() for record in caplog.records)
    gate.claim(T("acct", 5, OLD))
    gate.claim(T("acct", 6, NEW))  # no grantor stored: another grantor's token passes by value
    assert gate.mark("acct") == Mark("acct", 6, None)
    with pytest.raises(StaleTokenError):
        gate.claim(T("acct", 5, NEW))


# Column mode ---------------------------------------------------------------------------


def _deposit(adapter: DjangoAdapter, token: FencingToken, value: int) -> int:
    return fenced_update(
        adapter.items.filter(key="acct"), token, resource_field="resource", grantor_field="fence_grantor", value=value
    )


def _row(adapter: DjangoAdapter) -> tuple[int, int | None, str | None]:
    row = adapter.items.get(key="acct")
    return row.value, row.fence, row.fence_grantor


def test_fenced_update_refuses_another_grantor(adapter: DjangoAdapter) -> None:
    """The row adopts the first grantor; another grantor's token, even 2**63-1, raises and changes nothing."""
    adapter.items.create(key="acct", value=100, resource="acct")
    assert _deposit(adapter, T("acct", 10, OLD), 110) == 1
    assert _row(adapter) == (110, 10, OLD)
    with pytest.raises(GrantorMismatchError) as caught:
        _deposit(adapter, T("acct", 2**63 - 1, NEW), 0)
    assert (caught.value.token_grantor, caught.value.expected_grantor) == (NEW, OLD)
    assert OLD in str(caught.value) and NEW in str(caught.value)
    assert _row(adapter) == (110, 10, OLD)
    with pytest.raises(StaleTokenError):
        _deposit(adapter, T("acct", 9, OLD), 0)
    assert _deposit(adapter, T("acct", 11), 120) == 1  # no grantor: by value only, the grantor stays
    assert _row(adapter) == (120, 11, OLD)
    # Negative control: without grantor_field the same foreign token writes the row.
    assert fenced_update(adapter.items.filter(key="acct"), T("acct", 2**63 - 1, NEW), value=0) == 1
    assert adapter.read("acct") == 0


def test_fenced_update_with_grantor_is_one_update(adapter: DjangoAdapter) -> None:
    """The grantor check and adoption are part of the one UPDATE; bad grantor options are configuration errors."""
    adapter.items.create(key="acct", value=100, resource="acct")
    with CaptureQueriesContext(connections[adapter.alias]) as queries:
        assert _deposit(adapter, T("acct", 5, OLD), 105) == 1
    (update,) = [query["sql"] for query in queries.captured_queries]
    assert update.upper().startswith("UPDATE") and "fence_grantor" in update
    row = adapter.items.filter(key="acct")
    with pytest.raises(FencingConfigurationError):
        fenced_update(row, T("acct", 6, OLD), grantor_field="fence_grantor", fence_grantor=NEW)
    with pytest.raises(FencingConfigurationError):
        fenced_update(row, T("acct", 6, OLD), grantor_field="nope", value=1)
    assert _row(adapter) == (105, 5, OLD)


# Migration -----------------------------------------------------------------------------


def _columns(alias: str) -> list[str]:
    connection = connections[alias]
    with connection.cursor() as cursor:
        return [column.name for column in connection.introspection.get_table_description(cursor, "fencing_high_water")]


def _outcome(call: Any) -> str:
    try:
        call()
    except Exception as exc:
        return type(exc).__name__
    return "accepted"


def migration_scenario(scenario: str, alias: str, environ: dict[str, str]) -> dict[str, Any]:
    """One migration scenario on a fresh database, in a child process (tests.django.migration_runs)."""
    from django.core.management import call_command

    seen: dict[str, Any] = {}
    gate = DjangoGate(alias)
    if scenario == "forward":
        call_command("migrate", "celery_fencing", "0001", database=alias, verbosity=0)
        seen["columns_at_0001"] = _columns(alias)
        with connections[alias].cursor() as cursor:
            cursor.execute("INSERT INTO fencing_high_water (resource, token) VALUES (%s, %s)", ["acct", 10])
        seen["before_migrating"] = _outcome(lambda: gate.claim(T("acct", 11, OLD)))
        call_command("migrate", "celery_fencing", database=alias, verbosity=0)
    else:  # "fake-initial": SQLGate made the table (with grantor), Django adopts it
        sql_gate = SQLGate(sa.create_engine(environ["SQLALCHEMY_URL"], connect_args=sa_connect_args(environ)))
        sql_gate.create_schema()
        sql_gate.claim(T("acct", 10))
        sql_gate.engine.dispose()
        call_command("migrate", "celery_fencing", database=alias, fake_initial=True, verbosity=0)
    seen["columns"] = _columns(alias)
    seen["old_mark"] = gate.mark("acct")
    seen["stale"] = _outcome(lambda: gate.claim(T("acct", 9, OLD)))
    seen["adopt"] = _outcome(lambda: gate.claim(T("acct", 11, OLD)))
    seen["adopted_mark"] = gate.mark("acct")
    seen["other_grantor"] = _outcome(lambda: gate.claim(T("acct", 12, NEW)))
    seen["final_mark"] = gate.mark("acct")
    return seen


def _check_migrated(seen: dict[str, Any]) -> None:
    """The old mark (10, no grantor) survived: lower refused, the first grantor adopted, another refused."""
    assert seen["columns"] == ["resource", "token", "grantor"]
    assert seen["old_mark"] == Mark("acct", 10, None)
    assert (seen["stale"], seen["adopt"], seen["other_grantor"]) == (
        "StaleTokenError",
        "accepted",
        "GrantorMismatchError",
    )
    assert seen["adopted_mark"] == seen["final_mark"] == Mark("acct", 11, OLD)


def test_migration_adds_the_grantor_column_to_a_table_of_0001(fresh_database: tuple[str, dict[str, str]]) -> None:
    """Migrate to 0001, store a mark, migrate forward: the old mark keeps its value and adopts the first grantor.

    Before migrating, the gate refuses to run without its grantor column (it fails closed).
    """
    alias, environ = fresh_database
    seen = run_migration_scenario(migration_scenario, "forward", alias, environ)
    assert seen["columns_at_0001"] == ["resource", "token"]
    assert seen["before_migrating"] == "GateUnavailableError"
    _check_migrated(seen)


def test_fake_initial_adopts_a_table_made_by_sqlgate(fresh_database: tuple[str, dict[str, str]]) -> None:
    """``migrate --fake-initial`` adopts SQLGate's table, grantor column included, and the gate checks grantors."""
    alias, environ = fresh_database
    seen = run_migration_scenario(migration_scenario, "fake-initial", alias, environ)
    _check_migrated(seen)
