"""Transaction mode: the mark upsert as the first statement of a transaction, the record under its row lock.

:meth:`TransactionMode.advance` runs in the caller's transaction
(:meth:`SQLGate.guard <celery_fencing.SQLGate.guard>`) or in one of
:class:`FencedTransaction`'s (:meth:`SQLGate.transaction
<celery_fencing.SQLGate.transaction>`, ``claim``). The upsert's row lock
serialises every writer of the resource until COMMIT, so the record is checked
and written with no other writer of the resource in between, and a refusal
(stale, another grantor, already applied) raises with the transaction still
open, for the caller (or :class:`FencedTransaction`) to roll back.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from ...context import AppliedRecord
from ...exceptions import StaleTokenError
from ...token import FencingToken, check_grantor
from ..applied_sql import already_applied
from .applied import PARAM_PREFIX, AppliedRecords
from .errors import is_unavailable, unavailable
from .marks import MarkTable

__all__ = ["FencedTransaction", "TransactionMode"]


class TransactionMode:
    """Advances marks of one mark table inside transactions, recording applied effects in the same one."""

    def __init__(self, marks: MarkTable, applied: AppliedRecords) -> None:
        self.marks = marks
        self.applied = applied
        # PostgreSQL, exactly once: the mark upsert and the record in one statement, by grantor column.
        self._folded: dict[bool, Any] = {}
        if applied.record_cte is not None:
            self._folded = {grantor: applied.folded(upsert) for grantor, upsert in marks.upsert_returning.items()}

    def advance(self, conn: Connection, token: FencingToken, record: AppliedRecord | None) -> None:
        """Raise the mark to *token* on *conn*, in its transaction, and record *record* if given.

        :raises StaleTokenError: the mark is above the token.
        :raises AlreadyAppliedError: another execution of the task applied on the resource.
        :raises GrantorMismatchError: the mark belongs to another grantor.
        :raises GateUnavailableError: the database failed, or the applied-record table is missing.
        """
        marks, applied = self.marks, self.applied
        params: dict[str, Any] = {"resource": token.resource, "token": token.value}
        if record is not None:
            applied.check_table(conn)
        try:
            with_grantor = marks.uses_grantor(conn)
            if with_grantor:
                params["grantor"] = token.grantor
            folded = self._folded.get(with_grantor) if record is not None else None
            if folded is not None and record is not None:
                # PostgreSQL: the upsert and the record in one statement; the record only when the mark passed.
                folded_params = {**params, **applied.params(token, record, PARAM_PREFIX)}
                marked, recorded = conn.execute(folded, folded_params).one()
                if marked and recorded:
                    return
                if marked:
                    raise applied.refused(conn, token, record)
                refused = True
            else:
                result = conn.execute(marks.upsert if with_grantor else marks.legacy_upsert, params)
                refused = marks.refused(result)
            if not refused:
                # Under the mark's row lock: no other writer of the resource checks or writes records now.
                if record is None or applied.record(conn, token, record):
                    return
                raise applied.refused(conn, token, record)
            # Read the mark (and grantor) that refused us, under the row lock.
            if with_grantor:
                mark, grantor = conn.execute(marks.select_mark_grantor, params).one()
            else:
                mark, grantor = conn.execute(marks.select_mark, params).scalar_one(), None
            check_grantor(token, grantor)
            if record is not None:
                other, applied_token = applied.other(conn, token, record)
                if other:
                    raise already_applied(token.resource, record.task_id, token.value, applied_token, mark)
        except sa_exc.SQLAlchemyError as exc:
            unavailable(exc, "advancing the mark")
        raise StaleTokenError(resource=token.resource, token=token.value, high_water=mark)


class FencedTransaction(AbstractContextManager[Connection]):
    """The context manager behind :meth:`SQLGate.transaction <celery_fencing.SQLGate.transaction>`. Single use."""

    def __init__(
        self, engine: Engine, mode: TransactionMode, token: FencingToken, record: AppliedRecord | None
    ) -> None:
        self._engine = engine
        self._mode = mode
        self._token = token
        self._record = record
        self._conn: Connection | None = None

    def __enter__(self) -> Connection:
        try:
            conn = self._engine.connect()
        except sa_exc.SQLAlchemyError as exc:
            unavailable(exc, "connecting")
        self._conn = conn
        try:
            conn.begin()
            self._mode.advance(conn, self._token, self._record)
        except BaseException:
            self._abort()
            raise
        return conn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn = self._conn
        if conn is None:
            return
        if exc_type is not None:
            self._abort()
            return
        try:
            conn.commit()
        except sa_exc.SQLAlchemyError as commit_error:
            self._abort()
            if is_unavailable(commit_error):
                unavailable(commit_error, "committing")
            raise
        finally:
            conn.close()

    def _abort(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            conn.rollback()
        except sa_exc.SQLAlchemyError:
            # The connection is gone (killed backend, network): the server has
            # rolled the transaction back already, and the original error says more.
            pass
        finally:
            conn.close()
