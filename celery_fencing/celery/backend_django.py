"""``fenced+django-db``: django-celery-results' backend, the result's fence in the ``TaskResult``'s transaction.

Configure with ``CELERY_RESULT_BACKEND = "fenced+django-db"`` (as
django-celery-results' own ``django-db``; ``fenced+django-db://`` works too),
with ``django_celery_results`` and ``celery_fencing.contrib.django`` in
``INSTALLED_APPS`` and ``manage.py migrate`` run: migration 0004 of
``celery_fencing`` makes the fence table ``celery_taskfence``
(:class:`~celery_fencing.contrib.django.models.ResultFence`).

The fence row lives on the database the ``TaskResult`` row is written to
(``router.db_for_write(TaskResult)``), and each claim, seal and result write
is one ``transaction.atomic()`` there: the mark upsert (DjangoGate's SQL, on
PostgreSQL and SQLite), the rules of :mod:`celery_fencing.celery.db_fence`
and, for a write, django-celery-results' own write of the row. A refused
write changes nothing and is dropped and reported, never raised.

Fence rows expire (:func:`~celery_fencing.celery.db_fence.fence_retention`):
each accepted claim, seal and write sets the row's ``expires_at`` (migration
0005) to the database's clock plus the retention; ``cleanup()`` (Celery's
``celery.backend_cleanup`` task, which beat runs daily when
``result_expires`` is set) deletes the expired rows with the expired
results, and ``forget()`` deletes the row with the ``TaskResult``. Before
migration 0005 is applied the backend works as before it (rows go with
their results in ``cleanup()``), with a warning naming the migration.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

from celery.utils.time import maybe_timedelta
from django.db import DatabaseError, connections, router, transaction
from django_celery_results.backends.database import DatabaseBackend  # type: ignore[import-untyped]
from django_celery_results.utils import now  # type: ignore[import-untyped]

from ..contrib.django.models import ResultFence
from ..exceptions import FencingConfigurationError
from ..gates.django.errors import unavailable
from ..gates.django.gate import SUPPORTED_VENDORS
from ..gates.django.marks import mark_statements
from ..token import FencingToken
from .db_fence import EXPIRES_COLUMN, FencedResultRows, FenceRow, FenceRows, FenceTableState, database_now

__all__ = ["FencedDjangoBackend"]

logger = logging.getLogger("celery_fencing")

#: The migration that gives the fence table its expiry.
EXPIRY_MIGRATION = "0005_resultfence_expires_at"


@dataclass(frozen=True)
class _FenceSql:
    """The fence table's statements on one alias, quoted for its vendor, and whether the table has its expiry.

    ``read`` takes (retention, task id) when ``read_refreshes`` (``UPDATE ...
    RETURNING``: PostgreSQL, SQLite 3.35+), else (task id,), and ``refresh``
    follows it; ``expired`` deletes the expired rows.
    """

    expiring: bool
    read: str
    read_refreshes: bool
    refresh: str | None
    expired: str | None


def _fence_sql(alias: str, cursor: Any) -> _FenceSql:
    connection = connections[alias]
    quote = connection.ops.quote_name
    meta = ResultFence._meta
    table = meta.db_table
    t = quote(table)
    c = {field.name: quote(field.column) for field in meta.fields}
    columns = f"{c['token']}, {c['grantor']}, {c['owner']}, {c['done']}"
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    select = f"SELECT {columns} FROM {t} WHERE {c['resource']} = %s{lock}"
    introspection = connection.introspection
    expiring = table not in introspection.table_names(cursor) or EXPIRES_COLUMN in {
        column.name for column in introspection.get_table_description(cursor, table)
    }
    if not expiring:
        logger.warning(
            "the result fence table %s on database %r has no %s column (migration celery_fencing %s is not "
            "applied): its rows of tasks that never stored a result are kept until forget(). "
            "Run: manage.py migrate celery_fencing --database %s",
            table,
            alias,
            EXPIRES_COLUMN,
            EXPIRY_MIGRATION,
            alias,
        )
        return _FenceSql(False, select, False, None, None)
    now = database_now(connection.vendor).replace("%", "%%")
    refresh = f"UPDATE {t} SET {c['expires_at']} = {now} + CAST(%s AS BIGINT) WHERE {c['resource']} = %s"
    expired = f"DELETE FROM {t} WHERE {c['expires_at']} <= {now}"
    returning = connection.vendor == "postgresql" or connection.Database.sqlite_version_info >= (3, 35)
    if returning:
        return _FenceSql(True, f"{refresh} RETURNING {columns}", True, None, expired)
    return _FenceSql(True, select, False, refresh, expired)


class _CursorFence:
    """The fence statements of :class:`FencedDjangoBackend`, on one alias inside ``transaction.atomic()``."""

    def __init__(self, backend: FencedDjangoBackend, alias: str, cursor: Any) -> None:
        self.backend = backend
        self.alias = alias
        self.cursor = cursor
        connection = connections[alias]
        quote = connection.ops.quote_name
        meta = ResultFence._meta
        self._table = quote(meta.db_table)
        self._column = {field.name: quote(field.column) for field in meta.fields}

    def advance(self, task_id: str, token: FencingToken) -> None:
        upsert = mark_statements(self.alias, ResultFence, with_grantor=True).upsert
        self.cursor.execute(upsert, [task_id, token.value, token.grantor])

    def read(self, task_id: str) -> FenceRow | None:
        sql = self.backend.fence_sql(self.alias, self.cursor)
        if sql.read_refreshes:
            self.cursor.execute(sql.read, [self.backend.fence_retention(), task_id])
        else:
            self.cursor.execute(sql.read, [task_id])
        row = self.cursor.fetchone()
        if row is not None and sql.refresh is not None:
            self.cursor.execute(sql.refresh, [self.backend.fence_retention(), task_id])
        return None if row is None else FenceRow(int(row[0]), row[1], row[2], row[3])

    def adopt(self, task_id: str, owner: str, done: str | None) -> None:
        c = self._column
        sets, params = f"{c['owner']} = %s", [owner]
        if done is not None:
            sets, params = f"{sets}, {c['done']} = %s", [owner, done]
        self.cursor.execute(f"UPDATE {self._table} SET {sets} WHERE {c['resource']} = %s", [*params, task_id])

    def status(self, task_id: str) -> str | None:
        rows = self.backend.TaskModel._default_manager.using(self.alias).select_for_update()
        status: str | None = rows.filter(task_id=task_id).values_list("status", flat=True).first()
        return status


class FencedDjangoBackend(FencedResultRows, DatabaseBackend):  # type: ignore[misc]
    """django-celery-results' result backend whose writes are checked against the task's fencing token."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fence_sql_by_alias: dict[str, _FenceSql] = {}

    def _alias(self) -> str:
        alias: str = router.db_for_write(self.TaskModel)
        vendor = connections[alias].vendor
        if vendor not in SUPPORTED_VENDORS:
            raise FencingConfigurationError(
                f"fenced+django-db supports PostgreSQL and SQLite, not {vendor!r} (database {alias!r})"
            )
        return alias

    @contextmanager
    def fence_transaction(self) -> Iterator[FenceRows]:
        """An atomic block on the ``TaskResult``'s database holding the fence row and the result row."""
        alias = self._alias()
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            yield _CursorFence(self, alias, cursor)

    database_errors = (DatabaseError,)

    def fence_unavailable(self, exc: Exception) -> NoReturn:
        unavailable(exc, "claiming the result's fence")

    def write_result_row(
        self, rows: FenceRows, task_id: str, result: Any, state: str, traceback: Any, request: Any, **kwargs: Any
    ) -> None:
        """django-celery-results' write of the ``TaskResult`` row, in the fence's atomic block."""
        assert isinstance(rows, _CursorFence)
        DatabaseBackend._store_result(self, task_id, result, state, traceback, request, using=rows.alias)

    def _forget(self, task_id: str) -> None:
        """``AsyncResult.forget()``: the fence row goes with the result, so the id can be stored again."""
        with self.fence_transaction() as rows:
            assert isinstance(rows, _CursorFence)
            self.TaskModel._default_manager.using(rows.alias).filter(task_id=task_id).delete()
            ResultFence.objects.using(rows.alias).filter(resource=task_id).delete()

    def fence_sql(self, alias: str, cursor: Any) -> _FenceSql:
        """The fence table's statements on *alias*; whether it has its expiry is looked at once, on *cursor*."""
        known = self._fence_sql_by_alias.get(alias)
        if known is None:
            known = self._fence_sql_by_alias[alias] = _fence_sql(alias, cursor)
        return known

    def inspect_fence_table(self) -> FenceTableState:
        """The fence table on the ``TaskResult``'s database as it is (exists, has ``expires_at``), changing nothing.

        :raises FencingConfigurationError: the database is not PostgreSQL or SQLite.
        :raises GateUnavailableError: it cannot be reached.
        """
        alias = self._alias()
        connection = connections[alias]
        table = ResultFence._meta.db_table
        where = f"{table} on database {alias!r} ({connection.vendor})"
        migrate = f"manage.py migrate celery_fencing --database {alias}"
        try:
            with connection.cursor() as cursor:
                introspection = connection.introspection
                if table not in introspection.table_names(cursor):
                    return FenceTableState(where, exists=False, expiring=False, fix=migrate)
                columns = {column.name for column in introspection.get_table_description(cursor, table)}
        except DatabaseError as exc:
            unavailable(exc, "looking at the result fence table")
        if EXPIRES_COLUMN in columns:
            return FenceTableState(where, exists=True, expiring=True)
        return FenceTableState(where, exists=True, expiring=False, fix=f"{migrate} (migration {EXPIRY_MIGRATION})")

    def cleanup(self) -> None:
        """Delete the expired fence rows (and, of rows without an expiry, those of expired results), then the results.

        A fence row's expiry is set and compared on the database's clock.
        Without ``result_expires`` no result expires, and only rows with an
        expiry go.
        """
        alias = self._alias()
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            sql = self.fence_sql(alias, cursor)
            if sql.expired is not None:
                cursor.execute(sql.expired, [])
            if self.expires:
                # Rows without an expiry (written before migration 0005, or kept for good while
                # result_expires was unset) go with their results, as before the column.
                manager = self.TaskModel._default_manager.using(alias)
                expired = manager.filter(date_done__lt=now() - maybe_timedelta(self.expires)).values("task_id")
                rows = ResultFence.objects.using(alias).filter(resource__in=expired)
                if sql.expiring:
                    rows = rows.filter(expires_at__isnull=True)
                rows.delete()
        super().cleanup()
