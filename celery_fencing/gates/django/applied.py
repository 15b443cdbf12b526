"""Exactly once in Django: the applied-record table of one model, on whichever database alias a write uses.

The SQL is :mod:`celery_fencing.gates.applied_sql`'s, the same SQLGate runs,
with Django's ``%s`` parameters, quoted per connection and built on first
use. The record is a statement of its own after the mark upsert (or column
mode's ``UPDATE``), on PostgreSQL too (see ``applied_sql`` for why).
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from ...context import AppliedRecord
from ...exceptions import GateUnavailableError
from ...token import FencingToken
from ..applied_sql import (
    AppliedStatements,
    applied_statements,
    missing_table_message,
    other_execution,
    retention_seconds,
)

__all__ = ["AppliedTable", "default_applied_table"]


class AppliedTable:
    """The applied-record table of one model: its statements per alias, and whether it exists (checked once)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._sql: dict[str, AppliedStatements] = {}
        self._exists: set[str] = set()

    def statements(self, alias: str) -> AppliedStatements:
        sql = self._sql.get(alias)
        if sql is None:
            connection = connections[alias]
            quote = connection.ops.quote_name
            table = quote(self.model._meta.db_table)
            sql = self._sql[alias] = applied_statements(connection.vendor, table, quote=quote, param=lambda name: "%s")
        return sql

    def check(self, alias: str, cursor: Any) -> None:
        """Fail closed, once per alias, when the table is missing: name the migration."""
        if alias in self._exists:
            return
        table = self.model._meta.db_table
        if table not in connections[alias].introspection.table_names(cursor):
            raise GateUnavailableError(
                missing_table_message(
                    table, f"run 'manage.py migrate celery_fencing' (migration 0003) on database {alias!r}"
                ),
                gate="DjangoGate",
            )
        self._exists.add(alias)

    @staticmethod
    def params(token: FencingToken, record: AppliedRecord) -> list[Any]:
        """The record's parameters, in the statements' order."""
        return [token.resource, record.task_id, record.execution_id, token.value, retention_seconds(record.retention)]

    def record(self, alias: str, cursor: Any, token: FencingToken, record: AppliedRecord) -> bool:
        """Write or refresh the record; ``False`` when a live record of another execution refused it."""
        cursor.execute(self.statements(alias).record, self.params(token, record))
        return bool(cursor.rowcount != 0)

    def find_row(self, alias: str, cursor: Any, resource: str, task_id: str) -> tuple[str, int | None] | None:
        """The execution id and token of the live record, or ``None``."""
        cursor.execute(self.statements(alias).select, [resource, task_id])
        row = cursor.fetchone()
        return None if row is None else (str(row[0]), None if row[1] is None else int(row[1]))

    def find(self, alias: str, cursor: Any, resource: str, task_id: str) -> str | None:
        """The execution id of the live record, or ``None``."""
        found = self.find_row(alias, cursor, resource, task_id)
        return None if found is None else found[0]

    def other(self, alias: str, cursor: Any, token: FencingToken, record: AppliedRecord) -> tuple[bool, int | None]:
        """(whether a live record names another execution of the task, its token): the refusal path."""
        return other_execution(self.find_row(alias, cursor, token.resource, record.task_id), record.execution_id)


_default_applied: AppliedTable | None = None


def default_applied_table() -> AppliedTable:
    """The applied-record table of the ``celery_fencing.contrib.django`` app (built once, on first use)."""
    global _default_applied
    if _default_applied is None:
        from ...contrib.django.models import AppliedRecord as AppliedRecordModel

        _default_applied = AppliedTable(AppliedRecordModel)
    return _default_applied
