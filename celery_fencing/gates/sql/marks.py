"""The mark table's statements for one gate, built once, and whether the table has its grantor column.

The conditional upsert (with the grantor check, and without it for a table
made before grantor ids), per dialect as the package docstring shows; the
reads of the mark; and the insert-if-absent of the operator's reset. Built
once: SQLAlchemy memoises a statement's cache key, so reusing the object
skips compilation and cache-key generation on every call.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Table, and_, bindparam, func, or_, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect, Engine

from .errors import unavailable
from .schema import MYSQL_FAMILY, grantor_column_ddl, has_grantor_column

__all__ = ["MarkTable"]

# One logger for the whole package, named as the module was before it became one.
log = logging.getLogger(__package__)


class MarkTable:
    """The mark table of one gate on one dialect: its statements, and what is known of its columns.

    ``upsert`` and ``legacy_upsert`` take the parameters ``resource``,
    ``token`` (and ``grantor``); their rowcount is 0 when refused, or on
    MySQL/MariaDB their insert id is not 0. Thread-safe: the only state is
    whether the grantor column exists, looked at once.
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
        self.select_mark = select(t.c.token).where(t.c.resource == resource)
        self.select_mark_grantor = select(t.c.token, t.c.grantor).where(t.c.resource == resource)
        # Whether the table has the grantor column: None until first looked at.
        self._grantor_column: bool | None = None
        self.upsert: Any
        self.legacy_upsert: Any
        if self.mysql:
            my = mysql.insert(t).values(resource=resource, token=token)
            self.legacy_upsert = my.on_duplicate_key_update(
                token=func.if_(t.c.token <= my.inserted.token, my.inserted.token, func.last_insert_id(t.c.token))
            )
            myg = mysql.insert(t).values(resource=resource, token=token, grantor=grantor)
            accept = and_(
                t.c.token <= myg.inserted.token,
                or_(t.c.grantor.is_(None), myg.inserted.grantor.is_(None), t.c.grantor == myg.inserted.grantor),
            )
            # MySQL assigns left to right and later expressions see earlier results: grantor
            # first, and `accept` still holds after it (an adopted grantor equals the token's).
            self.upsert = myg.on_duplicate_key_update(
                [
                    ("grantor", func.if_(accept, func.coalesce(myg.inserted.grantor, t.c.grantor), t.c.grantor)),
                    ("token", func.if_(accept, myg.inserted.token, func.last_insert_id(t.c.token))),
                ]
            )
        else:
            insert = postgresql.insert if dialect.name == "postgresql" else sqlite.insert
            ins = insert(t).values(resource=resource, token=token)
            # preserve_rowcount: SQLAlchemy reports an INSERT's rowcount only when asked.
            self.legacy_upsert = ins.on_conflict_do_update(
                index_elements=[t.c.resource],
                set_={"token": ins.excluded.token},
                where=t.c.token <= ins.excluded.token,
            ).execution_options(preserve_rowcount=True)
            insg = insert(t).values(resource=resource, token=token, grantor=grantor)
            self.upsert = insg.on_conflict_do_update(
                index_elements=[t.c.resource],
                set_={"token": insg.excluded.token, "grantor": func.coalesce(insg.excluded.grantor, t.c.grantor)},
                where=and_(
                    t.c.token <= insg.excluded.token,
                    or_(t.c.grantor.is_(None), insg.excluded.grantor.is_(None), t.c.grantor == insg.excluded.grantor),
                ),
            ).execution_options(preserve_rowcount=True)

    def insert_if_absent(self, resource: str, values: dict[str, Any]) -> Any:
        """An ``INSERT`` of a mark where there is none; its rowcount is 0 if there was one."""
        t = self.table
        if self.mysql:
            return mysql.insert(t).values(resource=resource, **values).prefix_with("IGNORE")
        insert = postgresql.insert if self.dialect.name == "postgresql" else sqlite.insert
        statement = insert(t).values(resource=resource, **values).on_conflict_do_nothing(index_elements=[t.c.resource])
        return statement.execution_options(preserve_rowcount=True)

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
