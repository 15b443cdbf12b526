"""The result fence of the database backends: one row per task id, judged in the transaction of the result row.

:class:`~celery_fencing.celery.backend_db.FencedDatabaseBackend`
(``fenced+db+...``, SQLAlchemy) and
:class:`~celery_fencing.celery.backend_django.FencedDjangoBackend`
(``fenced+django-db``) keep, beside the result table, a fence table with one
row per task id::

    resource  the task id (primary key; the mark table's layout, so the SQL
              gate's conditional upsert, per dialect, advances it)
    token     the highest token that claimed or wrote the result (its mark)
    grantor   that token's grantor id
    owner     the resource of the tokens that fence this result
    done      the id of the execution that sealed the task (exactly once)
    expires_at  epoch seconds on the database's clock after which cleanup
              may delete the row (NULL: for good); added by migration 0005
              (Django) or on first use (SQLAlchemy)

Every operation is one transaction on the result's database, in this order:

1. A write with a token starts with the mark upsert, whose row lock holds
   off every other writer of the task's result until COMMIT; a write without
   one (the worker parent's WorkerLost, time-limit and revoke writes) reads
   the row ``FOR UPDATE`` (on PostgreSQL; SQLite has one writer at a time).
2. The row, as it now is, is judged by :func:`judge_token` or
   :func:`judge_tokenless`, the rules of the Redis backend's scripts, in the
   same order: the owner, the execution that sealed, the grantor, the seal
   of another execution, the mark.
3. Refused: the transaction rolls back (a claim or seal raises, a result
   write is dropped and reported). Accepted: the owner (and the seal) are
   set, the result row is written, and all of it commits at once.

Retention (:func:`fence_retention`): every accepted claim, seal and write
sets the row's ``expires_at`` to the database's ``now`` plus the retention,
in the statement that reads the row (``UPDATE ... RETURNING`` where the
database has it), so a refused one, rolled back, leaves it as it was. The
retention is the Redis backend's fence TTL, ``result_expires``, but never
shorter than the exactly-once retention (``fencing_once_retention``, itself
never shorter than the broker's re-delivery horizon): a copy of the task
that can still be delivered finds the row. Without ``result_expires``
(results kept for good) the row is kept for good, as on Redis. An expired
row still fences until ``cleanup()`` (Celery's ``celery.backend_cleanup``
task) deletes it; after that a late write of the task id is a first write,
as on Redis once the fence hash's TTL ran out.

No floor: the SQL gate's stores have none yet, so a database restored from a
backup older than its results takes the tokens the restored marks are below.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn, Protocol

from celery import states

from ..context import Execution
from ..gates import applied_sql
from ..token import FencingToken
from .result_refusals import execution_of, refusal_error, report_refused_write, token_of
from .settings import read_settings

__all__ = [
    "EXPIRES_COLUMN",
    "FenceRow",
    "FenceRows",
    "FenceTableState",
    "FencedResultRows",
    "database_now",
    "fence_retention",
    "judge_token",
    "judge_tokenless",
]

#: The fence row's expiry column: epoch seconds on the database's clock, NULL for good.
EXPIRES_COLUMN = "expires_at"

#: A refusal: (kind, detail), as :mod:`celery_fencing.celery.result_refusals` reads it.
Refusal = tuple[str, str]


@dataclass(frozen=True)
class FenceRow:
    """A task id's fence row as it is in the transaction, after the mark upsert (if any) ran."""

    mark: int
    grantor: str | None
    owner: str | None
    done: str | None


def fence_retention(conf: Any, expires: Any) -> int | None:
    """Whole seconds a fence row is kept after its last accepted claim, seal or write; ``None``: for good.

    *expires* is the backend's ``result_expires`` (seconds or a timedelta):
    unset or 0 keeps the rows for good, as the Redis backend keeps its fence
    hashes without a TTL then. Otherwise ``result_expires``, never shorter
    than the once-retention of *conf* (``fencing_once_retention``, by default
    ``result_expires`` and never shorter than the broker's re-delivery
    horizon), so no copy of the task that the broker may still deliver finds
    the row gone.

    :raises FencingConfigurationError: a ``fencing_*`` setting of *conf* is invalid.
    """
    seconds = expires.total_seconds() if isinstance(expires, timedelta) else float(expires or 0)
    if seconds <= 0:
        return None
    return applied_sql.retention_seconds(max(seconds, read_settings(conf).once_retention))


def database_now(vendor: str) -> str:
    """The database's clock in whole epoch seconds, as SQL: the clock the applied records expire on too."""
    return applied_sql._NOW["mysql" if vendor in applied_sql.MYSQL_FAMILY else vendor]


@dataclass(frozen=True)
class FenceTableState:
    """A database backend's fence table as it is, looked at without changing it (for ``celery-fencing doctor``)."""

    #: The table and its database, password-free.
    where: str
    exists: bool
    #: The table has the ``expires_at`` column, so its rows expire.
    expiring: bool
    #: How to add what is missing ('' when nothing is).
    fix: str = ""


def judge_token(row: FenceRow, token: FencingToken, execution_id: str | None, *, ordered: bool) -> Refusal | None:
    """Whether *token* (of the execution *execution_id*, ``None`` for a claim) may claim, seal or write.

    *ordered* is False for a seal (the first execution to seal wins,
    whatever the tokens' order); the mark has then already been raised to
    the token if it was below (and the grantors agree).
    """
    if row.owner is not None and row.owner != token.resource:
        return "owner", row.owner
    if execution_id is not None and row.done == execution_id:
        # The execution that sealed the task writes its result whatever the mark.
        return None
    if row.grantor is not None and token.grantor is not None and row.grantor != token.grantor:
        return "grantor", row.grantor
    if row.done is not None:
        return "applied", "-"
    if ordered and row.mark > token.value:
        return "stale", str(row.mark)
    return None


def judge_tokenless(row: FenceRow | None, status: str | None) -> Refusal | None:
    """Whether a write without a token may replace the result whose state is *status* (``None``: no row)."""
    if row is not None and status in states.READY_STATES:
        return "tokenless", "over a final result written with a token"
    if status == states.SUCCESS:
        return "tokenless", "over SUCCESS"
    return None


class FenceRows(Protocol):
    """The fence statements of one backend, bound to one open transaction."""

    def advance(self, task_id: str, token: FencingToken) -> None:
        """Run the mark upsert: raise the mark to *token* unless it is above (or of another grantor); lock the row."""
        ...

    def read(self, task_id: str) -> FenceRow | None:
        """The fence row (locked, ``FOR UPDATE`` where the database has it), or ``None``.

        The row's expiry is set to the backend's retention from the database's
        ``now`` in the same breath: the transaction commits only if the
        operation is accepted, so only an accepted one extends it.
        """
        ...

    def adopt(self, task_id: str, owner: str, done: str | None) -> None:
        """Set the row's owner, and its seal when *done* is given."""
        ...

    def status(self, task_id: str) -> str | None:
        """The state of the stored result (its row locked where the database can), or ``None``."""
        ...


class _Refused(Exception):
    """Raised inside a fence transaction to roll it back; carries the refusal."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(*refusal)
        self.refusal = refusal


class FencedResultRows:
    """Mixin of a Celery database backend: claim, seal and store results under the fence row.

    The backend provides :meth:`fence_transaction` (a transaction on the
    result's database, yielding its :class:`FenceRows`; it commits on a normal
    exit, rolls back on an exception) and :meth:`write_result_row` (the
    plain backend's write of the result row, in that transaction).
    """

    #: The driver's errors that make a claim or seal raise :class:`~celery_fencing.GateUnavailableError`.
    database_errors: tuple[type[Exception], ...] = ()
    # fence_retention() of the backend's app, read once (after the worker's flags are on its conf).
    _retention: tuple[int | None] | None = None

    def fence_retention(self) -> int | None:
        """Seconds a fence row is kept after its last accepted claim, seal or write (``None``: for good).

        :raises FencingConfigurationError: a ``fencing_*`` setting is invalid.
        """
        if self._retention is None:
            backend: Any = self
            self._retention = (fence_retention(backend.app.conf, backend.expires),)
        return self._retention[0]

    def fence_unavailable(self, exc: Exception) -> NoReturn:
        raise NotImplementedError

    def fence_transaction(self) -> AbstractContextManager[FenceRows]:
        raise NotImplementedError

    def write_result_row(
        self, rows: FenceRows, task_id: str, result: Any, state: str, traceback: Any, request: Any, **kwargs: Any
    ) -> None:
        raise NotImplementedError

    def claim_result(self, task_id: str, token: FencingToken) -> None:
        """Raise the result's mark to *token* at the start of a fenced execution.

        :raises StaleTokenError: a newer execution of this task already claimed or wrote.
        :raises AlreadyAppliedError: another execution of this task sealed it: the task is done.
        :raises GrantorMismatchError: the result is fenced by another grantor's token.
        """
        self._judged(task_id, token, None, ordered=True, seal=False)

    def seal_result(self, task_id: str, execution: Execution) -> None:
        """Make *execution* the one whose result stands; the first execution of a task id to seal wins.

        :raises AlreadyAppliedError: another execution of this task sealed first.
        :raises GrantorMismatchError: the result is fenced by another grantor's token.
        """
        self._judged(task_id, execution.result_token, execution.execution_id, ordered=False, seal=True)

    def _judged(
        self, task_id: str, token: FencingToken, execution_id: str | None, *, ordered: bool, seal: bool
    ) -> None:
        try:
            with self.fence_transaction() as rows:
                self._admit(rows, task_id, token, execution_id, ordered=ordered, seal=seal)
        except _Refused as refused:
            raise refusal_error(*refused.refusal, task_id, token) from None
        except self.database_errors as exc:
            # A claim or seal runs outside Celery's retries: a failing database is unavailable to the task.
            self.fence_unavailable(exc)

    @staticmethod
    def _admit(
        rows: FenceRows, task_id: str, token: FencingToken, execution_id: str | None, *, ordered: bool, seal: bool
    ) -> None:
        """Advance and judge the fence row of *task_id* for *token*; set its owner (and seal), or raise ``_Refused``."""
        rows.advance(task_id, token)
        row = rows.read(task_id)
        assert row is not None, "the mark upsert leaves a row"
        refusal = judge_token(row, token, execution_id, ordered=ordered)
        if refusal is not None:
            raise _Refused(refusal)
        if row.owner != token.resource or (seal and row.done is None):
            rows.adopt(task_id, token.resource, execution_id if seal and row.done is None else None)

    def _store_result(
        self, task_id: str, result: Any, state: str, traceback: Any = None, request: Any = None, **kwargs: Any
    ) -> Any:
        token = token_of(request)
        execution = execution_of(request) if token else None
        try:
            with self.fence_transaction() as rows:
                if token is None:
                    refusal = judge_tokenless(rows.read(task_id), rows.status(task_id))
                    if refusal is not None:
                        raise _Refused(refusal)
                else:
                    seals = execution is not None and execution.seals_with_result and state == states.SUCCESS
                    execution_id = execution.execution_id if execution is not None else None
                    self._admit(rows, task_id, token, execution_id, ordered=not seals, seal=seals)
                self.write_result_row(rows, task_id, result, state, traceback, request, **kwargs)
        except _Refused as refused:
            report_refused_write(self, task_id, state, token, *refused.refusal)
        return result
