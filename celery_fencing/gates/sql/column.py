"""Column mode: a ``fence`` column on the caller's own row is its mark, checked and advanced by one ``UPDATE``.

``UPDATE <table> SET <values>, fence = :t WHERE <where> AND (fence IS NULL OR
fence <= :t) [AND <resource column> = :resource] [AND (<grantor column> IS NULL
OR <grantor column> = :grantor)]``; when it changes nothing, the rows it aimed
at are read to tell why (:func:`~celery_fencing.gates.refusal.raise_why_refused`).
The mark table plays no part. The guarantees and errors are those of
:meth:`SQLGate.fenced_update <celery_fencing.SQLGate.fenced_update>`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Column, ColumnElement, Table, and_, bindparam, or_, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from ...context import applied_record
from ...exceptions import FencingConfigurationError, StaleTokenError
from ...token import FencingToken
from ..applied_sql import already_applied
from ..refusal import raise_why_refused
from .applied import PARAM_PREFIX, AppliedRecords
from .errors import is_unavailable, unavailable

__all__ = ["ColumnMode"]

# Names of the parameters column mode binds at execution, prefixed so they cannot meet a
# parameter of the caller's WHERE.
_TOKEN_PARAM = f"{PARAM_PREFIX}token"
_RESOURCE_PARAM = f"{PARAM_PREFIX}resource"
_GRANTOR_PARAM = f"{PARAM_PREFIX}grantor"


class ColumnMode:
    """Fenced one-statement updates of the caller's tables, with one gate's applied records (exactly once)."""

    def __init__(self, applied: AppliedRecords) -> None:
        self.applied = applied
        self._clauses: dict[tuple[Table, str, str | None, str | None], _FenceClauses] = {}

    def update(
        self,
        connection: Connection,
        table: Table,
        checked: FencingToken,
        *,
        where: ColumnElement[bool],
        values: Mapping[str, Any],
        fence_column: str,
        resource_column: str | None,
        grantor_column: str | None,
    ) -> int:
        """The body of :meth:`SQLGate.fenced_update <celery_fencing.SQLGate.fenced_update>`, for a checked token."""
        applied = self.applied
        for column in (fence_column, grantor_column):
            if column is not None and column in values:
                raise FencingConfigurationError(f"values must not set the column {column!r}: the gate sets it")
        # values={} is a claim of the row, not an effect: it neither records nor checks, as claim() does.
        record = applied_record(checked) if values else None
        if record is not None:
            if connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
                raise FencingConfigurationError(
                    "fenced_update() with exactly-once needs a transaction, not AUTOCOMMIT: the applied "
                    "record must commit (or roll back) with the UPDATE"
                )
            applied.check_table(connection)
        key = (table, fence_column, resource_column, grantor_column)
        clauses = self._clauses.get(key)
        if clauses is None:
            clauses = self._clauses[key] = _FenceClauses(table, fence_column, resource_column, grantor_column)
        params = {_TOKEN_PARAM: checked.value, _RESOURCE_PARAM: checked.resource}
        assignments = {**values, fence_column: clauses.token}
        condition = clauses.condition
        grantor = clauses.grantor
        if grantor is not None and checked.grantor is not None:
            # Only with a grantor: a token without one is checked by value, as before grantor ids.
            condition = and_(condition, clauses.grantor_condition)
            assignments[grantor.name] = clauses.grantor_param
            params[_GRANTOR_PARAM] = checked.grantor
        stmt = update(table).where(where, condition).values(assignments)
        fence, owner = clauses.fence, clauses.owner
        try:
            # Two statements on every database: folding the record into the UPDATE (as transaction
            # mode does on PostgreSQL) would mean building the CTE around the caller's UPDATE on each
            # call, and its construction and cache key cost more than the round trip it saves.
            count = connection.execute(stmt, params).rowcount
            if count:
                if record is None or applied.record(connection, checked, record):
                    return count
                raise applied.refused(connection, checked, record)
            # Nothing updated: tell "no such row" from "stale", "another
            # resource's row" and "another grantor's fence". FOR UPDATE reads the
            # latest committed row, not a REPEATABLE READ snapshot.
            columns = [fence, owner if owner is not None else fence, grantor if grantor is not None else fence]
            rows = connection.execute(select(*columns).where(where).with_for_update()).all()
            try:
                raise_why_refused(checked, rows, check_owner=owner is not None, check_grantors=grantor is not None)
            except StaleTokenError as stale:
                if record is None:
                    raise
                other, applied_token = applied.other(connection, checked, record)
                if not other:
                    raise
                raise already_applied(
                    checked.resource, record.task_id, checked.value, applied_token, stale.high_water
                ) from None
        except sa_exc.SQLAlchemyError as exc:
            if is_unavailable(exc):
                unavailable(exc, "fenced update")
            raise
        return 0


class _FenceClauses:
    """Column mode's part of the UPDATE for one (table, fence column, resource column).

    Built once per gate and reused: SQLAlchemy's Python-side cost of building a
    statement and its cache key grows with its size, and rebuilding these
    clauses on every call cost more than the database's own work for them.
    The token and resource are bound at execution.
    """

    def __init__(
        self, table: Table, fence_column: str, resource_column: str | None, grantor_column: str | None = None
    ) -> None:
        self.fence = _column(table, fence_column)
        self.token = bindparam(_TOKEN_PARAM, type_=self.fence.type)
        # NULL is "never fenced": rows that predate the fence column stay writable.
        condition = or_(self.fence.is_(None), self.fence <= self.token)
        self.owner: Column[Any] | None = None
        if resource_column is not None:
            self.owner = _column(table, resource_column)
            condition = and_(condition, self.owner == bindparam(_RESOURCE_PARAM, type_=self.owner.type))
        self.condition: ColumnElement[bool] = condition
        self.grantor: Column[Any] | None = None
        if grantor_column is not None:
            self.grantor = _column(table, grantor_column)
            self.grantor_param = bindparam(_GRANTOR_PARAM, type_=self.grantor.type)
            self.grantor_condition: ColumnElement[bool] = or_(
                self.grantor.is_(None), self.grantor == self.grantor_param
            )


def _column(table: Table, name: str) -> Column[Any]:
    try:
        return table.c[name]
    except KeyError:
        raise FencingConfigurationError(f"table {table.name!r} has no column {name!r}") from None
