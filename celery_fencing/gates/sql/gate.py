"""SQLGate: the facade over the mark table, transaction mode, column mode and the applied records.

It checks what it is given (tokens, with the verifier, before any I/O; the
caller's connection), opens the connections and transactions of its own
calls, turns database failures into
:class:`~celery_fencing.GateUnavailableError`, and hands the statements to
:mod:`.transaction`, :mod:`.column`, :mod:`.marks` and :mod:`.applied`. The
package docstring tells the story, the upsert per dialect and the errors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sqlalchemy import ColumnElement, MetaData, Table
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from ...context import applied_record, resolve_token
from ...exceptions import FencingConfigurationError, InvalidArgumentError, StaleTokenError
from ...protocols import TokenVerifier
from ...token import FencingToken, Mark, validate_resource
from ..applied_sql import DEFAULT_APPLIED_TABLE, check_prune_limit
from .applied import AppliedRecords
from .column import ColumnMode
from .errors import unavailable
from .marks import MarkTable
from .schema import DEFAULT_TABLE, SUPPORTED_DIALECTS, create_tables, high_water_table, supported_dialect
from .schema import applied_table as define_applied_table
from .transaction import FencedTransaction, TransactionMode

__all__ = ["SQLGate"]


class SQLGate:
    """Checks fencing tokens in a SQL database, in the same transaction as the data writes.

    Semantics (see :class:`~celery_fencing.Gate`): ``claim`` raises the mark
    to the token unless the mark is above it; a guarded transaction accepts
    ``token >= mark`` and is refused, and rolled back, for a lower token; a
    refused or failed transaction leaves neither data nor mark changed.

    Data binding: in transaction mode the data a transaction writes is yours
    to choose, so bind it to the resource in your schema (one resource per
    account row, and so on); column mode checks it for you with
    ``resource_column``.

    :param engine: a SQLAlchemy ``Engine`` for PostgreSQL (psycopg), MySQL or
        MariaDB (PyMySQL, mysqlclient) or SQLite.
    :param table: name of the mark table.
    :param schema: schema of the mark table.
    :param metadata: ``MetaData`` to define the table in (default: a private one).
    :param verifier: checks every token's origin before it is used (signed
        mode, plausibility bound), before any I/O; see :mod:`celery_fencing.signing`.
    :param applied_table: name of the applied-record table (exactly once; same *schema*).
    :raises FencingConfigurationError: for an unsupported database.

    Exactly once: inside a fenced execution with ``once`` on, every effect of
    the execution's own token (:meth:`transaction`, :meth:`guard`,
    :meth:`fenced_update`; not :meth:`claim`) also writes the row "task id T
    applied on resource R by execution E, holding token t" of the
    applied-record table, in the same transaction as the effect. Another
    execution of T is then refused with
    :class:`~celery_fencing.AlreadyAppliedError` (nothing of it commits) until
    the row expires, after the execution's retention on the database's clock;
    ``superseded`` when the row's token is above its own (a newer execution
    applied). The check runs after the mark upsert, whose row lock serialises
    the resource's writers; on PostgreSQL with psycopg, in transaction mode,
    both are one statement (a data-modifying CTE, see
    :mod:`celery_fencing.gates.applied_sql`).
    :meth:`prune_applied` deletes expired rows.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        table: str = DEFAULT_TABLE,
        schema: str | None = None,
        metadata: MetaData | None = None,
        verifier: TokenVerifier | None = None,
        applied_table: str = DEFAULT_APPLIED_TABLE,
    ) -> None:
        dialect = supported_dialect(engine, SUPPORTED_DIALECTS, "SQLGate")
        self.engine = engine
        self.verifier = verifier
        self._dialect = dialect
        metadata = metadata if metadata is not None else MetaData()
        self._table = high_water_table(metadata, table, schema=schema)
        self._marks = MarkTable(self._table, engine.dialect)
        self._applied = AppliedRecords(define_applied_table(metadata, applied_table, schema=schema), engine)
        self._transactions = TransactionMode(self._marks, self._applied)
        self._columns = ColumnMode(self._applied)

    @property
    def table(self) -> Table:
        """The mark table, for ``create_all`` or your migrations."""
        return self._table

    @property
    def applied_table(self) -> Table:
        """The applied-record table (exactly once), for ``create_all`` or your migrations."""
        return self._applied.table

    def create_schema(self) -> None:
        """Create the mark and applied-record tables if they do not exist; add ``grantor`` to an older mark table.

        Idempotent, also when run concurrently.

        :raises GateUnavailableError: the database failed or could not be reached.
        """
        create_tables(
            self.engine,
            ((self._table, "the mark table"), (self._applied.table, "the applied-record table")),
            unavailable,
        )
        self._marks.add_grantor_column(self.engine)

    def grantor_column_ddl(self) -> str:
        """The ``ALTER TABLE ... ADD COLUMN grantor ...`` that migrates a mark table made before grantor ids."""
        return self._marks.grantor_column_ddl()

    @contextmanager
    def _connected(self, doing: str, *, begin: bool = False) -> Iterator[Connection]:
        """A connection of the gate's own (in a transaction of its own with *begin*): its failures are the gate's."""
        try:
            with self.engine.begin() if begin else self.engine.connect() as conn:
                yield conn
        except sa_exc.SQLAlchemyError as exc:
            unavailable(exc, doing)

    def _read(self, doing: str, statement: Any, **params: Any) -> Any:
        """The one value *statement* selects (``None`` for no row), on a connection of the gate's own."""
        with self._connected(doing) as conn:
            return conn.execute(statement, params).scalar_one_or_none()

    # Gate protocol ------------------------------------------------------------

    def claim(self, token: FencingToken | None = None) -> None:
        """Raise the mark of ``token.resource`` to ``token.value``, in a transaction of its own.

        :raises StaleTokenError: the mark is above the token (nothing changed).
        :raises GrantorMismatchError: the mark belongs to another grantor (nothing changed).
        :raises InvalidTokenError: bad token, before any I/O.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        with FencedTransaction(self.engine, self._transactions, self._checked(token), None):
            pass

    def applied(self, resource: str, task_id: str) -> str | None:
        """Return the id of the execution of *task_id* that applied on *resource*, or ``None``.

        ``None`` when no execution of the task wrote through this gate with
        exactly-once, or its record expired (on the database's clock).

        :raises InvalidTokenError: bad resource name.
        :raises GateUnavailableError: the database failed or could not be reached,
            or the applied-record table is missing.
        """
        validate_resource(resource)
        value = self._read("reading an applied record", self._applied.select, resource=resource, task_id=task_id)
        return None if value is None else str(value)

    def prune_applied(self, limit: int = 1000) -> int:
        """Delete at most *limit* expired applied records, in a transaction of its own; return how many.

        Expired records already count as absent; pruning only bounds the
        table's size. Run it periodically (a Celery beat task, cron), in a
        loop while it returns *limit*. It finds expired rows by scanning the
        table (there is no index on ``expires_at``, which every write would pay for).

        :raises InvalidArgumentError: *limit* is not a positive int.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        params = {"limit": check_prune_limit(limit)}
        with self._connected("pruning applied records", begin=True) as conn:
            count: int = conn.execute(self._applied.prune, params).rowcount
        return count

    def high_water(self, resource: str) -> int | None:
        """Return the resource's committed mark, or ``None`` if it was never claimed.

        :raises InvalidTokenError: bad resource name.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        validate_resource(resource)
        value = self._read("reading the mark", self._marks.select_mark, resource=resource)
        return None if value is None else int(value)

    def mark(self, resource: str) -> Mark | None:
        """Return the resource's committed mark with its grantor, or ``None`` if it was never claimed.

        :raises InvalidTokenError: bad resource name.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        validate_resource(resource)
        with self._connected("reading the mark") as conn:
            if not self._marks.uses_grantor(conn):
                value = conn.execute(self._marks.select_mark, {"resource": resource}).scalar_one_or_none()
                return None if value is None else Mark(resource, int(value))
            row = conn.execute(self._marks.select_mark_grantor, {"resource": resource}).one_or_none()
        return None if row is None else Mark(resource, int(row[0]), row[1])

    def reset_mark(self, token: FencingToken, *, expected: Mark | None) -> None:
        """Operator repair: set the mark to *token* (value and grantor), lower or not, if it is still *expected*.

        For ``celery-fencing rebase`` and ``repair`` only: it bypasses the
        ordering, in one conditional statement (an ``UPDATE`` matching the
        expected value and grantor, or an ``INSERT`` when there was no mark).
        The token is not verified. On a table without the grantor column only
        the value is reset.

        :raises StaleTokenError: the mark is no longer *expected* (nothing changed).
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        checked = resolve_token(token)
        marks = self._marks
        params = {"resource": checked.resource, "token": checked.value, "grantor": checked.grantor}
        with self._connected("resetting the mark", begin=True) as conn:
            with_grantor = marks.uses_grantor(conn)
            if expected is None:
                count = conn.execute(marks.insert_if_absent[with_grantor], params).rowcount
            else:
                params.update(expected_token=expected.value, expected_grantor=expected.grantor)
                if with_grantor and expected.grantor is None:
                    reset = marks.reset_null_grantor
                else:
                    reset = marks.reset[with_grantor]
                count = conn.execute(reset, params).rowcount
            if count != 1:
                current = conn.execute(self._marks.select_mark, {"resource": checked.resource}).scalar_one_or_none()
                raise StaleTokenError(
                    f"the mark of {checked.resource!r} changed since it was read (expected {expected}, "
                    f"now {current}); nothing was reset",
                    resource=checked.resource,
                    token=checked.value,
                    high_water=current,
                )

    # Transaction mode ---------------------------------------------------------

    def transaction(self, token: FencingToken | None = None) -> AbstractContextManager[Connection]:
        """A transaction fenced by *token*: ``with gate.transaction(token) as conn: ...``.

        Entering opens a connection and a transaction and advances the mark
        with one conditional upsert, whose row lock holds off every other
        writer of the resource until this transaction ends. The block gets the
        connection for its writes. Leaving normally commits data and mark
        together; any exception rolls both back and propagates.

        The token is checked when this method is called, before any I/O.

        Inside a fenced execution with exactly-once on, entering also records
        the execution's task id on the resource (see :class:`SQLGate`), in
        this transaction.

        :raises StaleTokenError: on entering, for a token below the mark (rolled back).
        :raises AlreadyAppliedError: on entering, another execution of this
            task id applied on the resource (rolled back).
        :raises GrantorMismatchError: on entering, for a token of another grantor (rolled back).
        :raises InvalidTokenError: bad token, before any I/O.
        :raises GateUnavailableError: the database failed or could not be
            reached, on entering or at COMMIT.
        """
        checked = self._checked(token)
        return FencedTransaction(self.engine, self._transactions, checked, applied_record(checked))

    def _checked(self, token: FencingToken | None) -> FencingToken:
        return resolve_token(token, verifier=self.verifier)

    def guard(self, connection: Connection, token: FencingToken | None = None) -> None:
        """Advance the mark inside a transaction the caller already holds on *connection*.

        Call it first in the transaction, before the writes it protects. On
        ``StaleTokenError`` the transaction must be rolled back, never
        committed: letting the exception leave ``with engine.begin()`` (or
        ``session.begin()``) does that. The caller's COMMIT makes the new mark
        visible; until then, the row lock holds off other writers.

        With exactly-once on, it also records the execution's task id (see
        :class:`SQLGate`); on ``AlreadyAppliedError`` too the transaction
        must be rolled back (the mark upsert before the refusal is in it).

        :raises StaleTokenError: the token is below the mark.
        :raises AlreadyAppliedError: another execution of this task id applied on the resource.
        :raises GrantorMismatchError: the mark belongs to another grantor.
        :raises InvalidTokenError: bad token, before any I/O.
        :raises FencingConfigurationError: *connection* is not in a
            transaction, or belongs to another kind of database.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        checked = self._checked(token)
        if not isinstance(connection, Connection):
            raise InvalidArgumentError(f"guard() needs a sqlalchemy Connection, not {type(connection).__name__}")
        if not connection.in_transaction():
            raise FencingConfigurationError(
                "guard() needs a connection inside a transaction (engine.begin(), connection.begin(), "
                "session.connection()): without one the mark would be committed apart from the data"
            )
        if connection.dialect.name != self._dialect:
            raise FencingConfigurationError(
                f"connection is to {connection.dialect.name!r}, the gate was built for {self._dialect!r}"
            )
        self._transactions.advance(connection, checked, applied_record(checked))

    # Column mode --------------------------------------------------------------

    def fenced_update(
        self,
        connection: Connection,
        table: Table,
        token: FencingToken | None,
        *,
        where: ColumnElement[bool],
        values: Mapping[str, Any],
        fence_column: str = "fence",
        resource_column: str | None = None,
        grantor_column: str | None = None,
    ) -> int:
        """``UPDATE table SET <values>, fence = :t WHERE <where> AND fence <= :t``, one statement.

        The row's *fence_column* (a nullable or ``NOT NULL`` BIGINT; NULL means
        never fenced) is its mark: a token below it changes nothing. With
        *resource_column*, the row must also belong to ``token.resource``
        (``AND <resource_column> = :resource``), so a token of another
        resource, however large, cannot write it.

        With *grantor_column* (a nullable string column), the row's fence
        belongs to a grantor: a token of another grantor raises
        :class:`~celery_fencing.GrantorMismatchError` and changes nothing, and
        a row whose grantor is NULL takes the token's. A token without a
        grantor is checked by its value only.

        *where* should select one row (its primary key): each matched row is
        fenced by its own column. To claim a row before reading it, call this
        with ``values={}``: it raises the fence alone.

        Column mode does not consult the mark table: ``claim`` and
        :meth:`transaction` do not fence these rows, and the other way round.

        Counting relies on matched-row counts, which SQLAlchemy's MySQL
        dialects enable (``CLIENT_FOUND_ROWS``) and the other databases give.

        Exactly once: inside a fenced execution with ``once`` on, an UPDATE
        that changed rows is followed, on *connection*, by the applied-record
        upsert (see :class:`SQLGate`; not for ``values={}``, a claim), so *connection* must be in a
        transaction you commit after this call (``engine.begin()``), never in
        ``AUTOCOMMIT``. When the record refuses (``AlreadyAppliedError``), the
        UPDATE has run in that transaction: let the exception roll it back.

        :returns: the number of rows updated; 0 when no row matches *where*.
        :raises StaleTokenError: a matching row's fence is above the token
            (``high_water`` is that fence; nothing changed).
        :raises AlreadyAppliedError: another execution of this task id applied
            on the resource (``superseded`` when its recorded token,
            ``applied_token``, is above this one; ``high_water`` is the row's
            fence when the UPDATE was refused; roll the transaction back).
        :raises ResourceMismatchError: a matching row belongs to another resource.
        :raises GrantorMismatchError: a matching row's fence belongs to another grantor.
        :raises InvalidTokenError: bad token (or one the verifier refuses), before any I/O.
        :raises FencingConfigurationError: no such column, or *values* sets the fence or grantor.
        :raises GateUnavailableError: the connection failed; other database
            errors (your constraints) propagate unchanged.
        """
        return self._columns.update(
            connection,
            table,
            self._checked(token),
            where=where,
            values=values,
            fence_column=fence_column,
            resource_column=resource_column,
            grantor_column=grantor_column,
        )

    def __repr__(self) -> str:
        return f"SQLGate({self.engine!r}, table={self._table.name!r})"
