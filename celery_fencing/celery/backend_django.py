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

``forget()`` deletes the fence row with the ``TaskResult``; ``cleanup()``
(Celery's ``backend_cleanup`` task) deletes the fence rows of the results it
expires.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
from .db_fence import FencedResultRows, FenceRow, FenceRows

__all__ = ["FencedDjangoBackend"]


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
        self._lock = " FOR UPDATE" if connection.features.has_select_for_update else ""

    def advance(self, task_id: str, token: FencingToken) -> None:
        upsert = mark_statements(self.alias, ResultFence, with_grantor=True).upsert
        self.cursor.execute(upsert, [task_id, token.value, token.grantor])

    def read(self, task_id: str) -> FenceRow | None:
        c = self._column
        self.cursor.execute(
            f"SELECT {c['token']}, {c['grantor']}, {c['owner']}, {c['done']} FROM {self._table} "
            f"WHERE {c['resource']} = %s{self._lock}",
            [task_id],
        )
        row = self.cursor.fetchone()
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

    def cleanup(self) -> None:
        """Delete the fence rows of expired results, then (django-celery-results) the results."""
        if self.expires:
            alias = self._alias()
            manager = self.TaskModel._default_manager.using(alias)
            expired = manager.filter(date_done__lt=now() - maybe_timedelta(self.expires)).values("task_id")
            ResultFence.objects.using(alias).filter(resource__in=expired).delete()
        super().cleanup()
