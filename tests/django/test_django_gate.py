"""DjangoGate and fenced_update beyond the shared contract: atomic blocks, one UPDATE, row locks, errors."""

from __future__ import annotations

import contextlib
import threading

import pytest
from django.core.management import call_command
from django.db import connections, transaction
from django.db.models import F
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from celery_fencing import (
    FencingConfigurationError,
    FencingToken,
    GateUnavailableError,
    ResourceMismatchError,
    SQLGate,
    StaleTokenError,
    token_context,
)
from celery_fencing.gates.django import DjangoGate, fenced_update
from tests.celery.workers import wait_for

from .adapters import DjangoAdapter, sqlalchemy_engine

T = FencingToken


# Transaction mode ----------------------------------------------------------------------


def test_guard_outside_an_atomic_block_is_refused(adapter: DjangoAdapter) -> None:
    """guard() in autocommit raises FencingConfigurationError and writes no mark."""
    with pytest.raises(FencingConfigurationError, match="atomic"):
        adapter.gate.guard(T("acct", 5))
    assert adapter.gate.high_water("acct") is None


def test_guard_inside_the_callers_atomic_block_commits_with_it(adapter: DjangoAdapter) -> None:
    """guard() first in the caller's atomic block: the mark and the data commit together, or neither."""
    with transaction.atomic(using=adapter.alias):
        adapter.gate.guard(T("acct", 5))
        adapter.items.create(key="k", value=1)
    assert (adapter.gate.high_water("acct"), adapter.read("k")) == (5, 1)
    with pytest.raises(RuntimeError), transaction.atomic(using=adapter.alias):
        adapter.gate.guard(T("acct", 9))
        adapter.items.filter(key="k").update(value=2)
        raise RuntimeError("the task failed before COMMIT")
    assert (adapter.gate.high_water("acct"), adapter.read("k")) == (5, 1)


def test_stale_guard_dooms_the_block_even_when_the_error_is_swallowed(adapter: DjangoAdapter) -> None:
    """A caught StaleTokenError still rolls the block back and refuses further queries in it."""
    adapter.gate.claim(T("acct", 10))
    with transaction.atomic(using=adapter.alias):
        # The mistake this test is about: carrying on after a refusal.
        with contextlib.suppress(StaleTokenError):
            adapter.gate.guard(T("acct", 7))
        with pytest.raises(TransactionManagementError):
            adapter.items.create(key="k", value=1)
    assert adapter.read("k") is None
    assert adapter.gate.high_water("acct") == 10

    # Negative control: the same swallowed refusal without the gate's rollback flag commits the write.
    with transaction.atomic(using=adapter.alias):
        with contextlib.suppress(StaleTokenError):
            raise StaleTokenError(resource="acct", token=7, high_water=10)
        adapter.items.create(key="k", value=1)
    assert adapter.read("k") == 1


def test_transaction_yields_the_connection_and_nests_as_a_savepoint(adapter: DjangoAdapter) -> None:
    """gate.transaction() gives the alias's connection; nested in the caller's block, it commits with it."""
    with transaction.atomic(using=adapter.alias):
        with adapter.gate.transaction(T("acct", 3)) as connection:
            assert connection is connections[adapter.alias]
            adapter.items.create(key="k", value=1)
        adapter.items.create(key="k2", value=2)
    assert (adapter.read("k"), adapter.read("k2"), adapter.gate.high_water("acct")) == (1, 2, 3)


def test_row_lock_serialises_writers_of_one_resource(pg: DjangoAdapter) -> None:
    """On PostgreSQL, B's guard waits on A's open block (pg_stat_activity shows the lock) until A commits."""
    order: list[str] = []
    a_open = threading.Event()
    release_a = threading.Event()
    errors: list[BaseException] = []

    def writer_a() -> None:
        try:
            with pg.gate.transaction(T("acct", 5)):
                a_open.set()
                release_a.wait(60)
                order.append("a-commit")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections[pg.alias].close()

    def writer_b() -> None:
        try:
            with pg.gate.transaction(T("acct", 6)):
                order.append("b-in")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections[pg.alias].close()

    a = threading.Thread(target=writer_a)
    a.start()
    assert a_open.wait(30)
    b = threading.Thread(target=writer_b)
    b.start()

    def b_waits_on_a_lock() -> bool:
        with connections[pg.alias].cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                ["INSERT INTO %fencing_high_water%"],
            )
            return bool(cursor.fetchone()[0])

    wait_for(b_waits_on_a_lock, 30, "B to wait on A's row lock")
    assert order == []
    release_a.set()
    a.join(30)
    b.join(30)
    assert not errors, errors
    assert order == ["a-commit", "b-in"]
    assert pg.gate.high_water("acct") == 6


def test_unreachable_database_raises_gate_unavailable(django_project: None) -> None:
    """A gate whose database refuses connections raises GateUnavailableError with Django's error chained."""
    gate = DjangoGate("unreachable")
    with pytest.raises(GateUnavailableError) as info:
        gate.claim(T("acct", 1))
    assert info.value.__cause__ is not None
    with pytest.raises(GateUnavailableError):
        gate.high_water("acct")


def test_unknown_alias_is_refused(django_project: None) -> None:
    """A database alias missing from settings.DATABASES is a FencingConfigurationError."""
    with pytest.raises(FencingConfigurationError):
        DjangoGate("nope")


# Column mode ---------------------------------------------------------------------------


def test_fenced_update_is_one_update_statement(adapter: DjangoAdapter) -> None:
    """An accepted fenced_update with an F() expression issues exactly one UPDATE."""
    adapter.items.create(key="acct", value=100, resource="acct")
    with CaptureQueriesContext(connections[adapter.alias]) as queries:
        count = fenced_update(adapter.items.filter(key="acct"), T("acct", 5), value=F("value") + 10)
    assert count == 1
    assert len(queries.captured_queries) == 1
    assert queries.captured_queries[0]["sql"].upper().startswith("UPDATE")
    row = adapter.items.get(key="acct")
    assert (row.value, row.fence) == (110, 5)


def test_fenced_update_paused_writer_race(adapter: DjangoAdapter) -> None:
    """A claims the row (no values) and reads; B claims and deposits; A's deposit is refused; plain updates lose B's."""
    adapter.items.create(key="acct", value=100, resource="acct")
    row = adapter.items.filter(key="acct")
    a, b = T("acct", 33), T("acct", 34)
    fenced_update(row, a, resource_field="resource")  # A claims, reads 100, pauses
    a_seen = adapter.read("acct")
    fenced_update(row, b, resource_field="resource")
    b_seen = adapter.read("acct")
    assert a_seen == b_seen == 100
    fenced_update(row, b, resource_field="resource", value=b_seen + 10)
    with pytest.raises(StaleTokenError) as info:
        fenced_update(row, a, resource_field="resource", value=a_seen + 5)
    assert (info.value.token, info.value.high_water) == (33, 34)
    assert adapter.read("acct") == 110

    # Negative control: the same schedule through plain queryset updates destroys B's deposit.
    adapter.items.create(key="plain", value=100)
    plain = adapter.items.filter(key="plain")
    a_seen = b_seen = adapter.read("plain")
    assert a_seen is not None and b_seen is not None
    plain.update(value=b_seen + 10)
    plain.update(value=a_seen + 5)
    assert adapter.read("plain") == 105


def test_fenced_update_reports_mismatch_missing_row_and_bad_options(adapter: DjangoAdapter) -> None:
    """Another resource's row raises ResourceMismatchError; no row returns 0; bad fields are configuration errors."""
    adapter.items.create(key="b-row", value=1, resource="b", fence=5)
    with pytest.raises(ResourceMismatchError):
        fenced_update(adapter.items.filter(key="b-row"), T("a", 1000), resource_field="resource", value=2)
    assert adapter.items.get(key="b-row").value == 1
    assert fenced_update(adapter.items.filter(key="none"), T("a", 1), value=2) == 0
    with pytest.raises(FencingConfigurationError):
        fenced_update(adapter.items.filter(key="b-row"), T("b", 6), fence=7)
    with pytest.raises(FencingConfigurationError):
        fenced_update(adapter.items.filter(key="b-row"), T("b", 6), fence_field="nope", value=2)
    with token_context(T("b", 6)):
        assert fenced_update(adapter.items.filter(key="b-row"), None, resource_field="resource", value=3) == 1
    assert adapter.items.get(key="b-row").fence == 6


# Schema ------------------------------------------------------------------------------


def test_migration_matches_the_model(django_project: None) -> None:
    """makemigrations finds nothing to do for the celery_fencing app: the shipped migration is complete."""
    call_command("makemigrations", "celery_fencing", check=True, dry_run=True, verbosity=0)


def test_sqlgate_shares_the_mark_table(pg: DjangoAdapter) -> None:
    """SQLGate on the same PostgreSQL schema reads and refuses by the marks DjangoGate wrote: one table, one mark."""
    pg.gate.claim(T("acct", 40))
    engine = sqlalchemy_engine(pg.alias)
    try:
        sql_gate = SQLGate(engine)
        assert sql_gate.high_water("acct") == 40
        with pytest.raises(StaleTokenError):
            sql_gate.claim(T("acct", 39))
        sql_gate.claim(T("acct", 41))
        assert pg.gate.high_water("acct") == 41
    finally:
        engine.dispose()
