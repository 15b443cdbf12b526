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

``forget()`` deletes the fence row with the result; ``cleanup()`` (Celery's
``backend_cleanup`` task) deletes the fence rows of the results it expires.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, NoReturn

from celery.backends.database import DatabaseBackend, session_cleanup
from celery.utils.time import maybe_timedelta
from sqlalchemy import MetaData, Table, delete, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from ..gates.sql.errors import unavailable
from ..gates.sql.marks import MarkTable
from ..gates.sql.schema import DEFAULT_RESULT_FENCE_TABLE, create_tables, result_fence_table
from ..token import FencingToken
from .db_fence import FencedResultRows, FenceRow, FenceRows

__all__ = ["FencedDatabaseBackend"]


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
        self.backend.marks(self.session)  # a tokenless write may come first: the table must exist
        t = self.backend.fence_table
        found = self.session.connection().execute(
            select(t.c.token, t.c.grantor, t.c.owner, t.c.done).where(t.c.resource == task_id).with_for_update()
        )
        row = found.one_or_none()
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
        self.fence_table: Table = result_fence_table(MetaData(), name, schema=schema)
        self._marks: MarkTable | None = None

    def marks(self, session: Session) -> MarkTable:
        """The fence table's mark upsert for the session's database; the table is created on first use."""
        if self._marks is None:
            engine = session.get_bind()
            assert isinstance(engine, Engine)  # the backend's sessions are bound to its engine
            create_tables(engine, ((self.fence_table, "the result fence table"),), unavailable)
            self._marks = MarkTable(self.fence_table, engine.dialect)
        return self._marks

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
        """Delete the fence rows of expired results, then (Celery) the results."""
        expires = maybe_timedelta(self.expires)
        expired = select(self.task_cls.task_id).where(self.task_cls.date_done < datetime.now(timezone.utc) - expires)
        with self.fence_transaction() as rows:
            assert isinstance(rows, _SessionFence)
            session = rows.session
            self.marks(session)
            session.connection().execute(delete(self.fence_table).where(self.fence_table.c.resource.in_(expired)))
        super()._cleanup()
