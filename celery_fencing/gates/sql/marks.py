"""The mark table's statements for one gate (:mod:`celery_fencing.gates.mark_sql`'s), built once; its grantor column.

The conditional upsert (with the grantor check, and without it for a table
made before grantor ids), the reads of the mark, and the operator's reset,
as SQLAlchemy ``text()`` with typed parameters. Built once: SQLAlchemy
memoises a statement's cache key, so reusing the object skips compilation
and cache-key generation on every call.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import BigInteger, Table, bindparam, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Dialect, Engine

from ..mark_sql import mark_statements
from .errors import unavailable
from .schema import MYSQL_FAMILY, always_quoted, always_quoted_table, grantor_column_ddl, has_grantor_column

__all__ = ["MarkTable"]

# One logger for the whole package, named as the module was before it became one.
log = logging.getLogger(__package__)


class MarkTable:
    """The mark table of one gate on one dialect: its statements, and what is known of its columns.

    ``upsert`` and ``legacy_upsert`` (the table without the grantor column)
    take the parameters ``resource``, ``token`` (and ``grantor``); they are
    refused as :meth:`refused` tells. Each statement keyed by a bool is the
    one for a table with (``True``) or without the grantor column.
    Thread-safe: the only state is whether the grantor column exists, looked
    at once.
    """

    def __init__(self, table: Table, dialect: Dialect) -> None:
        self.table = table
        self.dialect = dialect
        #: MySQL or MariaDB: refusal is told by the insert id (``LAST_INSERT_ID(token)``), not the rowcount.
        self.mysql = dialect.name in MYSQL_FAMILY
        t = table
        resource = bindparam("resource", type_=t.c.resource.type)
        token = bindparam("token", type_=t.c.token.type)
        grantor = bindparam("grantor", type_=t.c.grantor.type)
        expected_token = bindparam("expected_token", type_=BigInteger)
        expected = (expected_token, bindparam("expected_grantor", type_=t.c.grantor.type))

        def statement(sql: str, *params: Any) -> Any:
            # preserve_rowcount: SQLAlchemy reports an INSERT's rowcount only when asked.
            return text(sql).bindparams(*params).execution_options(preserve_rowcount=True)

        sql = {
            with_grantor: mark_statements(
                dialect.name,
                always_quoted_table(dialect, t),
                resource=always_quoted(dialect, t.c.resource.name),
                token=always_quoted(dialect, t.c.token.name),
                grantor=always_quoted(dialect, t.c.grantor.name) if with_grantor else None,
                param=lambda name: f":{name}",
            )
            for with_grantor in (True, False)
        }
        self.upsert = statement(sql[True].upsert, resource, token, grantor)
        self.legacy_upsert = statement(sql[False].upsert, resource, token)
        #: PostgreSQL: the upserts with ``RETURNING 1`` (a row when the mark passed), for a data-modifying CTE.
        self.upsert_returning = {
            True: text(f"{sql[True].upsert} RETURNING 1").bindparams(resource, token, grantor),
            False: text(f"{sql[False].upsert} RETURNING 1").bindparams(resource, token),
        }
        # Typed result columns: on MySQL/MariaDB the grantor comes back as bytes otherwise.
        #: (resource): the mark, and ``NULL`` (the first column is the mark on any table).
        self.select_mark = statement(sql[False].select, resource).columns(t.c.token, t.c.grantor)
        #: (resource): the mark and its grantor.
        self.select_mark_grantor = statement(sql[True].select, resource).columns(t.c.token, t.c.grantor)
        #: (resource, token[, grantor]): a mark where there is none; rowcount 0 if there was one.
        self.insert_if_absent = {
            True: statement(sql[True].insert_if_absent, resource, token, grantor),
            False: statement(sql[False].insert_if_absent, resource, token),
        }
        #: (token[, grantor], resource, expected_token[, expected_grantor]): the operator's compare-and-set.
        self.reset = {
            True: statement(sql[True].reset, token, grantor, resource, *expected),
            False: statement(sql[False].reset, token, resource, expected_token),
        }
        #: ``reset`` of a mark whose grantor is expected ``NULL``.
        self.reset_null_grantor = statement(sql[True].reset_null_grantor, token, grantor, resource, expected_token)
        # Whether the table has the grantor column: None until first looked at.
        self._grantor_column: bool | None = None

    def refused(self, result: Any) -> bool:
        """Whether the upsert that gave *result* refused the token."""
        # MySQL: LAST_INSERT_ID(token) ran only on refusal, so the insert id is not 0.
        # Others: the DO UPDATE ... WHERE refused, and the row is locked (ON CONFLICT
        # locks the conflicting row even when WHERE fails).
        return bool(result.lastrowid) if self.mysql else result.rowcount == 0

    # The grantor column --------------------------------------------------------

    def grantor_column_ddl(self) -> str:
        """The ``ALTER TABLE ... ADD COLUMN grantor ...`` that migrates a mark table made before grantor ids."""
        return grantor_column_ddl(self.dialect, self.table)

    def uses_grantor(self, conn: Connection) -> bool:
        """Whether the mark table has the grantor column: looked at once, on the caller's connection."""
        known = self._grantor_column
        if known is None:
            try:
                known = has_grantor_column(conn, self.table)
            except sa_exc.NoSuchTableError:
                return True  # the upsert then fails as it always did: the table is missing
            if not known:
                log.warning(
                    "mark table %s has no grantor column: tokens of another grantor (a wiped or different "
                    "ZooKeeper) are not detected at this gate. Migrate with SQLGate.create_schema() or: %s",
                    self.table.name,
                    self.grantor_column_ddl(),
                )
            self._grantor_column = known
        return known

    def add_grantor_column(self, engine: Engine) -> None:
        """Add the grantor column if the table lacks it (idempotent, also when run concurrently), and look again.

        :raises GateUnavailableError: the column is still missing after a failure.
        """
        try:
            with engine.begin() as conn:
                if not has_grantor_column(conn, self.table):
                    conn.exec_driver_sql(self.grantor_column_ddl())
                    log.warning("added the grantor column to the mark table %s", self.table.name)
        except sa_exc.SQLAlchemyError as exc:
            with engine.connect() as conn:
                if not has_grantor_column(conn, self.table):
                    unavailable(exc, "adding the grantor column")
        self._grantor_column = None
