"""``fenced+db+<SQLAlchemy URL>``: Celery's SQLAlchemy result backend, the result's fence in the result's transaction.

Configure with ``result_backend = "fenced+db+postgresql+psycopg://user@host/db"``
(any URL Celery's ``db+`` backend takes: PostgreSQL, MySQL/MariaDB, SQLite).
Celery finds it through the ``celery.result_backends`` entry point named
``fenced`` (:func:`celery_fencing.celery.backends.FencedBackend` picks the
class by the rest of the URL).

Beside Celery's ``celery_taskmeta`` it keeps the fence table
``celery_taskfence`` (:func:`~celery_fencing.gates.sql.schema.result_fence_table`;
rename it with ``database_table_names={"fence": ...}``, schema with
``database_table_schemas``), created on first use as Celery creates its own.
Each claim, seal and result write is one transaction of the mark upsert, the
rules of :mod:`celery_fencing.celery.db_fence` and, for a write, the result
row: a refused write changes nothing and is dropped and reported, never raised.

Fence rows expire (:func:`~celery_fencing.celery.db_fence.fence_retention`):
each accepted claim, seal and write sets the row's ``expires_at`` to the
database's clock plus the retention. ``cleanup()`` (Celery's
``celery.backend_cleanup`` task, which beat runs daily when
``result_expires`` is set) deletes the expired rows with the expired
results; ``forget()`` deletes the row with the result. A table made before
the column existed gets it on first use (``ALTER TABLE ... ADD COLUMN
expires_at BIGINT NULL``); a database user who may not alter it keeps the
old behaviour (its rows expire only with their results), with a warning
naming that statement, and ``celery-fencing doctor`` reports it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, NoReturn

from celery.backends.database import DatabaseBackend, session_cleanup
from celery.utils.time import maybe_timedelta
from sqlalchemy import BigInteger, Column, MetaData, Table, bindparam, delete, inspect, literal_column, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from ..gates.sql.errors import unavailable
from ..gates.sql.marks import MarkTable
from ..gates.sql.schema import DEFAULT_RESULT_FENCE_TABLE, create_tables, result_fence_table
from ..token import FencingToken
from .db_fence import EXPIRES_COLUMN, FencedResultRows, FenceRow, FenceRows, FenceTableState, database_now

__all__ = ["FencedDatabaseBackend", "expiry_column_ddl", "fence_table", "has_expiry_column"]

logger = logging.getLogger("celery_fencing")


def fence_table(metadata: MetaData, name: str = DEFAULT_RESULT_FENCE_TABLE, *, schema: str | None = None) -> Table:
    """Define the backend's fence table in *metadata*: :func:`result_fence_table`'s columns and ``expires_at``.

    ``expires_at`` (BIGINT NULL) is epoch seconds on the database's clock
    after which ``cleanup()`` deletes the row; NULL keeps it for good.
    """
    table = result_fence_table(metadata, name, schema=schema)
    if EXPIRES_COLUMN not in table.c:
        table.append_column(Column(EXPIRES_COLUMN, BigInteger, nullable=True))
    return table


def expiry_column_ddl(engine: Engine, table: Table) -> str:
    """The ``ALTER TABLE`` that adds ``expires_at`` to a fence table made before it."""
    name = engine.dialect.identifier_preparer.format_table(table)
    return f"ALTER TABLE {name} ADD COLUMN {EXPIRES_COLUMN} BIGINT NULL"


def has_expiry_column(conn: Connection, table: Table) -> bool:
    """Whether the fence table, as it is in the database, has the ``expires_at`` column."""
    columns = inspect(conn).get_columns(table.name, schema=table.schema)
    return any(column["name"] == EXPIRES_COLUMN for column in columns)


class _FenceStatements:
    """The fence table's statements on one engine's dialect, built once, and whether the table has its expiry.

    ``read`` is ``UPDATE ... SET expires_at ... RETURNING`` where the dialect
    has it (PostgreSQL, SQLite 3.35+): one statement, as the ``SELECT ... FOR
    UPDATE`` it replaces; elsewhere (MySQL, MariaDB) that ``SELECT`` and then
    ``refresh``.
    """

    def __init__(self, table: Table, engine: Engine, *, expiring: bool) -> None:
        t = table
        self.marks = MarkTable(t, engine.dialect)
        self.expiring = expiring
        key = bindparam("task_id", type_=t.c.resource.type)
        columns = (t.c.token, t.c.grantor, t.c.owner, t.c.done)
        self.select = select(*columns).where(t.c.resource == key).with_for_update()
        self.refresh: Any = None
        self.read: Any = None
        self.expired: Any = None
        if expiring:
            now = literal_column(database_now(engine.dialect.name), BigInteger)
            # NULL retention (for good) makes the sum NULL.
            expiry = now + bindparam("retention", type_=BigInteger)
            self.refresh = update(t).where(t.c.resource == key).values({EXPIRES_COLUMN: expiry})
            if engine.dialect.update_returning:
                self.read = self.refresh.returning(*columns)
            self.expired = delete(t).where(t.c[EXPIRES_COLUMN] <= now)


class _SessionFence:
    """The fence statements of :class:`FencedDatabaseBackend`, on one session's transaction."""

    def __init__(self, backend: FencedDatabaseBackend, session: Session) -> None:
        self.backend = backend
        self.session = session

    def advance(self, task_id: str, token: FencingToken) -> None:
        marks = self.backend.marks(self.session)
        conn = self.session.connection()
        params: dict[str, Any] = {"resource": task_id, "token": token.value, "grantor": token.grantor}
        conn.execute(marks.upsert, params)

    def read(self, task_id: str) -> FenceRow | None:
        # A tokenless write may come first: the table must exist.
        statements = self.backend.fence_statements(self.session)
        conn = self.session.connection()
        key = {"task_id": task_id}
        if statements.read is not None:
            found = conn.execute(statements.read, {**key, "retention": self.backend.fence_retention()})
        else:
            found = conn.execute(statements.select, key)
        row = found.one_or_none()
        if row is not None and statements.read is None and statements.refresh is not None:
            conn.execute(statements.refresh, {**key, "retention": self.backend.fence_retention()})
        return None if row is None else FenceRow(int(row[0]), row[1], row[2], row[3])

    def adopt(self, task_id: str, owner: str, done: str | None) -> None:
        t = self.backend.fence_table
        values: dict[str, Any] = {"owner": owner}
        if done is not None:
            values["done"] = done
        self.session.connection().execute(update(t).where(t.c.resource == task_id).values(**values))

    def status(self, task_id: str) -> str | None:
        task = self.backend.query_result_row(self.session, task_id)
        return task.status if task else None


class FencedDatabaseBackend(FencedResultRows, DatabaseBackend):  # type: ignore[misc]
    """Celery's SQLAlchemy result backend whose writes are checked against the task's fencing token."""

    def __init__(self, *args: Any, url: str | None = None, **kwargs: Any) -> None:
        if url is not None and url.startswith("db+"):
            url = url[len("db+") :]  # Celery strips its own 'db+'; 'fenced+' left it on
        super().__init__(*args, url=url, **kwargs)
        conf = self.app.conf
        name = (conf.database_table_names or {}).get("fence") or DEFAULT_RESULT_FENCE_TABLE
        schema = (conf.database_table_schemas or {}).get("fence")
        self.fence_table: Table = fence_table(MetaData(), name, schema=schema)
        self._statements: _FenceStatements | None = None

    def fence_statements(self, session: Session) -> _FenceStatements:
        """The fence table's statements for the session's database; the table (and its expiry) made on first use."""
        if self._statements is None:
            engine = session.get_bind()
            assert isinstance(engine, Engine)  # the backend's sessions are bound to its engine
            create_tables(engine, ((self.fence_table, "the result fence table"),), unavailable)
            expiring = self._add_expiry_column(engine)
            self._statements = _FenceStatements(self.fence_table, engine, expiring=expiring)
        return self._statements

    def marks(self, session: Session) -> MarkTable:
        """The fence table's mark upsert for the session's database; the table is created on first use."""
        return self.fence_statements(session).marks

    def _add_expiry_column(self, engine: Engine) -> bool:
        """Give a fence table made before ``expires_at`` the column; whether it has it now.

        Idempotent, also when several workers try at once. A database user
        who may not alter the table keeps the rows without expiry (they go
        with their results in ``cleanup()``, as before), warned once.
        """
        table = self.fence_table
        try:
            with engine.begin() as conn:
                if has_expiry_column(conn, table):
                    return True
                conn.exec_driver_sql(expiry_column_ddl(engine, table))
            logger.warning("added the %s column to the result fence table %s", EXPIRES_COLUMN, table.name)
            return True
        except sa_exc.SQLAlchemyError as exc:
            try:
                with engine.connect() as conn:
                    if has_expiry_column(conn, table):
                        return True  # another worker added it meanwhile
            except sa_exc.SQLAlchemyError:
                pass
            logger.warning(
                "the result fence table %s has no %s column and adding it failed (%s): its rows of tasks that "
                "never stored a result are kept until forget(). Add it as its owner with: %s",
                table.name,
                EXPIRES_COLUMN,
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                expiry_column_ddl(engine, table),
            )
            return False

    def inspect_fence_table(self) -> FenceTableState:
        """The fence table as it is (exists, has ``expires_at``), read without creating or altering anything.

        :raises GateUnavailableError: the database cannot be reached.
        """
        table = self.fence_table
        # Not ResultSession(): it creates Celery's own tables.
        engine = self.session_manager.get_engine(self.url, **self.engine_options)
        where = f"{table.name} at {engine.url.render_as_string(hide_password=True)}"
        try:
            with engine.connect() as conn:
                if not inspect(conn).has_table(table.name, schema=table.schema):
                    return FenceTableState(where, exists=False, expiring=False)
                if has_expiry_column(conn, table):
                    return FenceTableState(where, exists=True, expiring=True)
        except sa_exc.SQLAlchemyError as exc:
            unavailable(exc, "looking at the result fence table")
        finally:
            if not self.session_manager.forked:
                engine.dispose()  # a NullPool engine of its own
        return FenceTableState(where, exists=True, expiring=False, fix=expiry_column_ddl(engine, table))

    @contextmanager
    def fence_transaction(self) -> Iterator[FenceRows]:
        """A session whose transaction holds the fence row and the result row: committed on a normal exit."""
        session = self.ResultSession()
        with session_cleanup(session):
            try:
                yield _SessionFence(self, session)
            except BaseException:
                session.rollback()
                raise
            session.commit()

    database_errors = (sa_exc.SQLAlchemyError,)

    def fence_unavailable(self, exc: Exception) -> NoReturn:
        unavailable(exc, "claiming the result's fence")  # type: ignore[arg-type]

    def query_result_row(self, session: Session, task_id: str) -> Any:
        """The task's result row, locked (``FOR UPDATE`` where the database has it), or ``None``."""
        task = self._query_task(session, task_id)
        # As Celery does: only an existing row is locked (a missing one would take a gap lock on MySQL).
        return self._query_task(session, task_id, for_update=True) if task else None

    def write_result_row(
        self, rows: FenceRows, task_id: str, result: Any, state: str, traceback: Any, request: Any, **kwargs: Any
    ) -> None:
        """Celery's write of the result row, in the fence's transaction (the fence judged SUCCESS already)."""
        assert isinstance(rows, _SessionFence)
        session = rows.session
        task = self.query_result_row(session, task_id)
        if not task:
            task = self.task_cls(task_id)
            task.task_id = task_id
            session.add(task)
            session.flush()
        self._update_result(task, result, state, traceback=traceback, request=request)
        flag_modified(task, "status")

    def _forget(self, task_id: str) -> None:
        """``AsyncResult.forget()``: the fence row goes with the result, so the id can be stored again."""
        with self.fence_transaction() as rows:
            assert isinstance(rows, _SessionFence)
            session = rows.session
            session.query(self.task_cls).filter(self.task_cls.task_id == task_id).delete()
            session.connection().execute(delete(self.fence_table).where(self.fence_table.c.resource == task_id))

    def _cleanup(self) -> None:
        """Delete the expired fence rows (and, of rows without an expiry, those of expired results), then the results.

        A fence row's expiry is set and compared on the database's clock; the
        results' (Celery's ``date_done``) on the workers'. Without
        ``result_expires`` no result expires, and only rows with an expiry go.
        """
        with self.fence_transaction() as rows:
            assert isinstance(rows, _SessionFence)
            session = rows.session
            statements = self.fence_statements(session)
            conn = session.connection()
            t = self.fence_table
            if statements.expired is not None:
                conn.execute(statements.expired)
            if self.expires:
                # Rows without an expiry (written before the column, or kept for good while
                # result_expires was unset) go with their results, as before the column.
                cutoff = datetime.now(timezone.utc) - maybe_timedelta(self.expires)
                expired = select(self.task_cls.task_id).where(self.task_cls.date_done < cutoff)
                of_expired = delete(t).where(t.c.resource.in_(expired))
                if statements.expiring:
                    of_expired = of_expired.where(t.c[EXPIRES_COLUMN].is_(None))
                conn.execute(of_expired)
        if self.expires:
            super()._cleanup()
