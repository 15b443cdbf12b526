"""The exactly-once contract suite (tests/gates/test_applied_contract.py), run against DjangoGate on PostgreSQL
and SQLite, with a Django version of its cross-process test; then DjangoGate's own: prune_applied, column mode,
the table missing before migration 0003, and SQLGate and DjangoGate sharing one table."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from celery_fencing import AlreadyAppliedError, FencingToken, SQLGate
from celery_fencing.context import Execution, token_context
from celery_fencing.gates.django import DjangoGate, fenced_update
from tests.gates.test_applied_contract import (
    RESOURCE,
    check_concurrent_executions_apply_once,
    executing,
    test_a_stale_copy_of_an_unapplied_task_is_stale_not_applied,
    test_different_task_ids_each_apply,
    test_explicit_token_outside_its_execution_records_nothing,
    test_on_a_shared_resource_the_newest_copy_is_not_superseded_by_another_task,
    test_one_execution_may_write_many_times,
    test_records_expire,
    test_same_task_id_twice_applies_once,
    test_the_paused_copy_is_refused_as_superseded,
    test_without_once_the_second_execution_applies_again,
)

from .adapters import DjangoAdapter, child_apply
from .migration_runs import run_migration_scenario, sa_connect_args

__all__ = [
    "test_a_stale_copy_of_an_unapplied_task_is_stale_not_applied",
    "test_concurrent_executions_in_processes_apply_once",
    "test_different_task_ids_each_apply",
    "test_explicit_token_outside_its_execution_records_nothing",
    "test_on_a_shared_resource_the_newest_copy_is_not_superseded_by_another_task",
    "test_one_execution_may_write_many_times",
    "test_records_expire",
    "test_same_task_id_twice_applies_once",
    "test_the_paused_copy_is_refused_as_superseded",
    "test_without_once_the_second_execution_applies_again",
]


def test_concurrent_executions_in_processes_apply_once(adapter: DjangoAdapter) -> None:
    """Six processes with their own Django connections run executions of one task id at once: exactly one applies."""
    check_concurrent_executions_apply_once(adapter, child_apply, adapter.alias)


def test_prune_applied_deletes_expired_records_and_keeps_live_ones(adapter: DjangoAdapter) -> None:
    """Expired rows go (at most limit per call), live ones stay."""
    for number in range(4):
        with executing(number + 1, f"old-{number}") as token:
            adapter.append(token, "log", number)
    with executing(10, "live") as token:
        adapter.append(token, "log", 10)
    with connections[adapter.alias].cursor() as cursor:
        cursor.execute("UPDATE fencing_applied SET expires_at = expires_at - 3600 WHERE task_id LIKE %s", ["old-%"])
    assert adapter.applied(RESOURCE, "old-0") is None
    assert adapter.gate.prune_applied(limit=3) == 3
    assert adapter.gate.prune_applied(limit=3) == 1
    assert adapter.gate.prune_applied() == 0
    with connections[adapter.alias].cursor() as cursor:
        cursor.execute("SELECT task_id FROM fencing_applied")
        assert cursor.fetchall() == [("live",)]


def test_column_mode_records_in_the_block(adapter: DjangoAdapter) -> None:
    """fenced_update records in the atomic block; another execution is refused and its UPDATE rolled back."""
    adapter.items.create(key="k", value=1, resource=RESOURCE)
    rows = adapter.items.filter(key="k")
    with executing(5) as token, transaction.atomic(using=adapter.alias):
        assert fenced_update(rows, token, resource_field="resource", value=2) == 1
    with executing(6) as token, pytest.raises(AlreadyAppliedError) as refused, transaction.atomic(using=adapter.alias):
        adapter.gate.fenced_update(rows, token, resource_field="resource", value=3)
    assert refused.value.superseded is False and refused.value.applied_token == 5
    with executing(4) as token, pytest.raises(AlreadyAppliedError) as sup, transaction.atomic(using=adapter.alias):
        fenced_update(rows, token, resource_field="resource", value=4)
    assert sup.value.superseded is True and sup.value.applied_token == 5 and sup.value.high_water == 5
    assert list(rows.values_list("value", "fence")) == [(2, 5)]
    # In autocommit the UPDATE and its record commit together in a block of their own.
    with executing(7, "other") as token:
        assert fenced_update(rows, token, resource_field="resource", value=5) == 1
    with executing(8, "other") as token, pytest.raises(AlreadyAppliedError):
        fenced_update(rows, token, resource_field="resource", value=6)
    assert list(rows.values_list("value", "fence")) == [(5, 7)]


def test_a_refused_record_names_the_recorded_token(adapter: DjangoAdapter) -> None:
    """The mark upsert and the record are two statements (on PostgreSQL too: see applied_sql). A refused record
    (an older execution of the task applied) leaves the mark as it was and names the recorded token."""
    queries = CaptureQueriesContext(connections[adapter.alias])
    with executing(5) as token, queries, adapter.gate.transaction(token):
        pass
    assert len([q["sql"] for q in queries.captured_queries if "INSERT" in q["sql"].upper()]) == 2
    with executing(7) as token, pytest.raises(AlreadyAppliedError) as refused, adapter.gate.transaction(token):
        pass
    assert refused.value.superseded is False and refused.value.applied_token == 5
    assert adapter.gate.high_water(RESOURCE) == 5


def migration_scenario(scenario: str, alias: str, environ: dict[str, str]) -> dict[str, Any]:
    """One migration scenario on a fresh database, in a child process (tests.django.migration_runs)."""
    from django.core.management import call_command

    seen: dict[str, Any] = {}
    once = Execution(FencingToken("acct", 5), task_id="t", once=True)
    gate = DjangoGate(alias)
    if scenario == "missing":
        call_command("migrate", "celery_fencing", "0002", database=alias, verbosity=0)
        try:
            with token_context(once), gate.transaction():
                pass
        except Exception as exc:
            seen["before"] = f"{type(exc).__name__}: {exc}"
        seen["mark_before"] = gate.high_water("acct")
        with token_context(Execution(FencingToken("acct", 4), task_id="t", once=False)), gate.transaction():
            pass  # without exactly-once the gate needs no record table
        call_command("migrate", "celery_fencing", database=alias, verbosity=0)
    else:  # "sqlgate-first": SQLGate made both tables and recorded; Django adopts them
        engine = sa.create_engine(environ["SQLALCHEMY_URL"], connect_args=sa_connect_args(environ))
        sql_gate = SQLGate(engine)
        sql_gate.create_schema()
        with token_context(once), sql_gate.transaction():
            pass
        engine.dispose()
        call_command("migrate", "celery_fencing", database=alias, fake_initial=True, verbosity=0)
        try:
            with token_context(Execution(FencingToken("acct", 6), task_id="t", once=True)), gate.transaction():
                pass
        except AlreadyAppliedError as exc:
            seen["second"] = type(exc).__name__
    with token_context(once), gate.transaction():
        pass
    seen["applied"] = gate.applied("acct", "t") == once.execution_id
    return seen


def test_missing_applied_table_fails_closed_until_migrated(fresh_database: tuple[str, dict[str, str]]) -> None:
    """At 0002, a write with exactly-once is refused naming the migration (nothing changes); after 0003 it works."""
    seen = run_migration_scenario(migration_scenario, "missing", *fresh_database)
    assert seen["before"].startswith("GateUnavailableError") and "manage.py migrate celery_fencing" in seen["before"]
    assert seen["mark_before"] is None
    assert seen["applied"] is True


def test_sqlgate_and_djangogate_share_the_applied_table(fresh_database: tuple[str, dict[str, str]]) -> None:
    """Migration 0003 adopts the table SQLGate made; a record SQLGate wrote refuses another execution at DjangoGate."""
    seen = run_migration_scenario(migration_scenario, "sqlgate-first", *fresh_database)
    assert seen["second"] == "AlreadyAppliedError"
    assert seen["applied"] is True
