"""Exactly once in SQLAlchemy: the applied-record statements of one gate, and the checks around them.

The SQL is :mod:`celery_fencing.gates.applied_sql`'s (the same DjangoGate
runs), bound here as ``text()`` statements, built once per gate. On
PostgreSQL with psycopg the record is also a CTE that the mark upsert feeds,
so that transaction mode sends one statement (see :meth:`AppliedRecords.folded`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Table, bindparam, inspect, literal_column, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from ...context import AppliedRecord
from ...exceptions import AlreadyAppliedError, GateUnavailableError
from ...token import FencingToken
from ..applied_sql import (
    EFFECT_CTE,
    FOLDED_COUNTS,
    RECORD_CTE,
    already_applied,
    applied_statements,
    missing_table_message,
    other_execution,
    retention_seconds,
)
from .errors import unavailable
from .schema import always_quoted, always_quoted_table

__all__ = ["PARAM_PREFIX", "AppliedRecords"]

#: Prefix of the parameters the gate binds into statements around SQL that is not its own
#: (the folded CTE, column mode's UPDATE): long, so they cannot meet a parameter of the caller's.
PARAM_PREFIX = "celery_fencing_"
_ONE: ColumnElement[Any] = literal_column("1")
_FOLDED_COUNTS: tuple[ColumnElement[Any], ...] = tuple(literal_column(count) for count in FOLDED_COUNTS)


class AppliedRecords:
    """The applied-record table of one gate: its statements, and whether the table exists (looked at once).

    The record is written under the mark's row lock (or column mode's
    updated rows' locks), so no other writer of the resource checks or
    writes records meanwhile.
    """

    def __init__(self, table: Table, engine: Engine) -> None:
        self.table = table
        dialect = engine.dialect.name
        # Whether the applied-record table exists: looked at once, on first use with a record.
        self._exists = False
        a = table
        # Quoted whatever the dialect's reserved words: the engine may not have connected yet.
        quoted_table = always_quoted_table(engine.dialect, a)

        def quote(name: str) -> str:
            return always_quoted(engine.dialect, name)

        applied_sql = applied_statements(dialect, quoted_table, quote=quote, param=lambda name: f":{name}")
        self._refused_by_insert_id = applied_sql.refused_by_insert_id
        keys = (bindparam("resource", type_=a.c.resource.type), bindparam("task_id", type_=a.c.task_id.type))
        record_params = (
            *keys,
            bindparam("execution", type_=a.c.execution.type),
            bindparam("token", type_=BigInteger),
            bindparam("retention", type_=BigInteger),
        )
        self._record = text(applied_sql.record).bindparams(*record_params).execution_options(preserve_rowcount=True)
        # PostgreSQL: the record as a CTE fed by the mark upsert's (see folded); its parameters
        # prefixed, like column mode's, so that they can never meet another statement's. Only
        # with psycopg (3), which prepares a statement run five times: planned on every call
        # (psycopg2, pg8000), the folded statement costs more than the round trip it saves.
        self.record_cte: Any = None
        if dialect == "postgresql" and engine.dialect.driver == "psycopg":
            prefixed = applied_statements(
                dialect, quoted_table, quote=quote, param=lambda name: f":{PARAM_PREFIX}{name}"
            )
            assert prefixed.record_after is not None
            self.record_cte = (
                text(prefixed.record_after)
                .bindparams(*(bindparam(f"{PARAM_PREFIX}{p.key}", type_=p.type) for p in record_params))
                .columns(_ONE)
                .cte(RECORD_CTE)
            )
        #: (resource, task_id): the execution id and token of the live record.
        self.select = text(applied_sql.select).bindparams(*keys)
        #: (limit): delete at most *limit* expired records.
        self.prune = text(applied_sql.prune).bindparams(bindparam("limit", type_=BigInteger))

    def check_table(self, conn: Connection) -> None:
        """Fail closed, once, when exactly-once is on and its table is missing (a clear error, not a driver's)."""
        if self._exists:
            return
        a = self.table
        try:
            exists = inspect(conn).has_table(a.name, schema=a.schema)
        except sa_exc.SQLAlchemyError as exc:
            unavailable(exc, "looking for the applied-record table")
        if not exists:
            raise GateUnavailableError(
                missing_table_message(
                    a.name, "create it with SQLGate.create_schema() or applied_table() in your migrations"
                ),
                gate="SQLGate",
            )
        self._exists = True

    def folded(self, effect: Any) -> Any:
        """PostgreSQL: *effect* (a mark upsert's ``text()`` ending ``RETURNING 1``) and the record in one statement.

        The form is ``applied_sql``'s.

        One row: (rows the effect changed, records written). The record's
        parameters are :meth:`params` of the prefixed names.
        """
        return select(*_FOLDED_COUNTS).add_cte(effect.columns(_ONE).cte(EFFECT_CTE), self.record_cte)

    @staticmethod
    def params(token: FencingToken, record: AppliedRecord, prefix: str = "") -> dict[str, Any]:
        """The record's parameters, named with *prefix*."""
        return {
            f"{prefix}resource": token.resource,
            f"{prefix}task_id": record.task_id,
            f"{prefix}execution": record.execution_id,
            f"{prefix}token": token.value,
            f"{prefix}retention": retention_seconds(record.retention),
        }

    def record(self, conn: Connection, token: FencingToken, record: AppliedRecord) -> bool:
        """Write or refresh the record; ``False`` when a live record of another execution refused it."""
        result = conn.execute(self._record, self.params(token, record))
        return not result.lastrowid if self._refused_by_insert_id else result.rowcount != 0

    def other(self, conn: Connection, token: FencingToken, record: AppliedRecord) -> tuple[bool, int | None]:
        """(whether a live record names another execution of the task, its token): the refusal path."""
        params = {"resource": token.resource, "task_id": record.task_id}
        return other_execution(conn.execute(self.select, params).one_or_none(), record.execution_id)

    def refused(
        self, conn: Connection, token: FencingToken, record: AppliedRecord, high_water: int | None = None
    ) -> AlreadyAppliedError:
        """The error of a record refused after the effect passed (the record that refused is read for its token)."""
        _, applied_token = self.other(conn, token, record)
        return already_applied(token.resource, record.task_id, token.value, applied_token, high_water)
