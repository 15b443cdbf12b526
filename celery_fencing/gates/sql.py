"""A gate in SQL: a high-water mark table advanced inside the transaction that writes the data.

The story it prevents::

    t=0   A holds token 33 for "account:42": BEGIN, the mark goes to 33, A reads
          the balance (100), pauses before COMMIT, or dies and is replaced
    t=30  B gets token 34: BEGIN, the mark goes to 34, B writes 110, COMMIT
    t=41  A (or A's retry with its old token) opens a new transaction with 33:
          the upsert refuses it (33 < 34), the transaction rolls back, and A
          gets StaleTokenError(high_water=34)

Two modes, both on SQLAlchemy Core, on PostgreSQL, MySQL/MariaDB and SQLite:

* **Transaction mode** (:meth:`SQLGate.transaction`, :meth:`SQLGate.guard`):
  the first statement of the transaction is one conditional upsert of the
  resource's row in the mark table. It takes the row's lock, which serialises
  every writer of the resource until COMMIT, so the caller's writes commit
  atomically with the mark, and a refused token rolls back with them.
* **Column mode** (:meth:`SQLGate.fenced_update`): for a single-row write on
  your own table, a ``fence`` column on that row is the mark, checked and
  advanced by the ``UPDATE`` itself (``... WHERE <where> AND fence <= :t``).

The mark table (``fencing_high_water`` by default; :func:`high_water_table`
builds it into your own ``MetaData`` for migrations)::

    resource  VARCHAR(200) PRIMARY KEY   (VARBINARY(800) on MySQL/MariaDB)
    token     BIGINT NOT NULL  CHECK (token >= 1 AND token <= 9223372036854775807)
    grantor   VARCHAR(64) NULL           (VARBINARY(64) on MySQL/MariaDB)

On MySQL and MariaDB the resource and grantor columns are binary: their
default collations ignore case and trailing spaces, which would make
``"Acct"``, ``"acct"`` and ``"acct "`` share one mark.

Grantors: the upsert also compares the token's grantor id with the row's
(exactly, in the same statement): a token of another grantor is refused with
:class:`~celery_fencing.GrantorMismatchError`, and a row whose grantor is
NULL (written by tokens without one, or by an older version) adopts the
first grantor that passes it. A mark table created before the ``grantor``
column existed keeps working without the grantor check (the gate looks once,
and logs a warning naming the migration): ``create_schema()`` adds the column,
or run ``ALTER TABLE fencing_high_water ADD COLUMN grantor VARCHAR(64)``
(``VARBINARY(64)`` on MySQL/MariaDB). Column mode checks grantors when given
a ``grantor_column`` (see :meth:`SQLGate.fenced_update`).

The upsert, per dialect (rowcount 0, or a non-zero insert id on MySQL, means stale):

* PostgreSQL, SQLite: ``INSERT ... ON CONFLICT (resource) DO UPDATE SET token =
  excluded.token WHERE <table>.token <= excluded.token``.
* MySQL, MariaDB: ``INSERT ... ON DUPLICATE KEY UPDATE token = IF(token <=
  VALUES(token), VALUES(token), LAST_INSERT_ID(token))``. MySQL's affected-row
  count cannot tell stale from accepted (with ``CLIENT_FOUND_ROWS``, which
  SQLAlchemy sets, an insert, an unchanged equal token and a refused token all
  report 1), so the refusal stores the mark with ``LAST_INSERT_ID(expr)``,
  which the server returns as the statement's insert id: 0 for an insert or an
  accepted update (the table has no AUTO_INCREMENT column), the mark when
  refused. One round trip either way.

Errors: bad input raises :class:`~celery_fencing.InvalidTokenError` before any
I/O. Failures of the gate's own statements (connection refused, lock timeout,
deadlock, a missing mark table) raise :class:`~celery_fencing.GateUnavailableError`
with the SQLAlchemy exception chained; their duration is bounded by the
driver's timeouts (``connect_timeout``, ``lock_timeout``,
``innodb_lock_wait_timeout``, SQLite's ``timeout``), set through the engine.
Exceptions raised by your own statements inside a transaction are not
wrapped; they roll the transaction back and propagate unchanged.

Thread and fork safety: a gate holds no connection of its own; it is as safe
as its engine (share one engine between threads; dispose of it after ``fork()``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, NoReturn

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    ColumnElement,
    MetaData,
    String,
    Table,
    TypeDecorator,
    and_,
    bindparam,
    func,
    inspect,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect, Engine

from ..context import AppliedRecord, applied_record, resolve_token
from ..exceptions import (
    AlreadyAppliedError,
    FencingConfigurationError,
    GateUnavailableError,
    InvalidArgumentError,
    StaleTokenError,
)
from ..protocols import TokenVerifier
from ..token import (
    MAX_GRANTOR_LENGTH,
    MAX_RESOURCE_LENGTH,
    MAX_TOKEN_VALUE,
    FencingToken,
    Mark,
    check_grantor,
    validate_resource,
)
from .applied_sql import (
    DEFAULT_APPLIED_TABLE,
    EFFECT_CTE,
    EXECUTION_ID_LENGTH,
    FOLDED_COUNTS,
    MAX_TASK_ID_LENGTH,
    RECORD_CTE,
    already_applied,
    applied_statements,
    missing_table_message,
    retention_seconds,
)
from .refusal import raise_why_refused

__all__ = ["DEFAULT_APPLIED_TABLE", "DEFAULT_TABLE", "SQLGate", "Utf8VarBinary", "applied_table", "high_water_table"]

log = logging.getLogger(__name__)

DEFAULT_TABLE = "fencing_high_water"

_MYSQL_FAMILY = frozenset({"mysql", "mariadb"})
_SUPPORTED = frozenset({"postgresql", "sqlite"}) | _MYSQL_FAMILY

# Connection-level failures: the storage could not be reached or gave up
# (timeouts, deadlocks, serialisation failures are OperationalError too).
_UNAVAILABLE = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError, sa_exc.TimeoutError)


class Utf8VarBinary(TypeDecorator[str]):
    """Text kept as its UTF-8 bytes in a ``VARBINARY`` column, so it compares byte for byte.

    The DDL is plain ``VARBINARY(n)``; Python sees ``str`` both ways.
    """

    impl = mysql.VARBINARY
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | None:
        return None if value is None else value.encode("utf-8")

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else bytes(value).decode("utf-8")


def high_water_table(metadata: MetaData, name: str = DEFAULT_TABLE, *, schema: str | None = None) -> Table:
    """Define the mark table in *metadata* (your application's, for Alembic autogenerate).

    If *metadata* already holds a table of that name, it is returned as is.
    """
    return _table(
        metadata,
        name,
        schema,
        Column("resource", _binary_on_mysql(MAX_RESOURCE_LENGTH), primary_key=True),
        Column("token", BigInteger, nullable=False),
        Column("grantor", _grantor_type(), nullable=True),
        CheckConstraint(f"token >= 1 AND token <= {MAX_TOKEN_VALUE}", name=f"{name[:48]}_token_range"),
    )


def applied_table(metadata: MetaData, name: str = DEFAULT_APPLIED_TABLE, *, schema: str | None = None) -> Table:
    """Define the applied-record table (exactly once) in *metadata*, for your migrations.

    The layout is :mod:`celery_fencing.gates.applied_sql`'s: ``resource`` and
    ``task_id`` (binary on MySQL/MariaDB), ``execution``, ``token`` (the
    execution's token value), ``expires_at`` (epoch seconds), primary key
    (resource, task_id). If *metadata* already
    holds a table of that name, it is returned as is.
    """
    return _table(
        metadata,
        name,
        schema,
        Column("resource", _binary_on_mysql(MAX_RESOURCE_LENGTH), primary_key=True),
        Column("task_id", _binary_on_mysql(MAX_TASK_ID_LENGTH), primary_key=True),
        Column("execution", String(EXECUTION_ID_LENGTH), nullable=False),
        Column("token", BigInteger, nullable=False),
        Column("expires_at", BigInteger, nullable=False),
    )


def _table(metadata: MetaData, name: str, schema: str | None, *parts: Any) -> Table:
    """The table *name* of *metadata* if it holds one, else a new one of *parts*."""
    existing = metadata.tables.get(f"{schema}.{name}" if schema else name)
    return existing if existing is not None else Table(name, metadata, *parts, schema=schema)


# SQLGate's parameter of the same name hides the function inside __init__.
_applied_table = applied_table


def _binary_on_mysql(length: int) -> Any:
    # Binary on MySQL/MariaDB: their default collations compare case- and
    # trailing-space-insensitively, which would merge resources (and task ids).
    return String(length).with_variant(Utf8VarBinary(length * 4), "mysql", "mariadb")


def _grantor_type() -> Any:
    return String(MAX_GRANTOR_LENGTH).with_variant(Utf8VarBinary(MAX_GRANTOR_LENGTH), "mysql", "mariadb")


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
        dialect = engine.dialect.name
        if dialect not in _SUPPORTED:
            raise FencingConfigurationError(f"SQLGate supports PostgreSQL, MySQL, MariaDB and SQLite, not {dialect!r}")
        self.engine = engine
        self.verifier = verifier
        self._dialect = dialect
        self._mysql = dialect in _MYSQL_FAMILY
        metadata = metadata if metadata is not None else MetaData()
        self._table = high_water_table(metadata, table, schema=schema)
        self._applied = _applied_table(metadata, applied_table, schema=schema)
        # Whether the applied-record table exists: looked at once, on first use with a record.
        self._applied_exists = False
        preparer = engine.dialect.identifier_preparer
        a = self._applied
        applied_sql = applied_statements(
            dialect, preparer.format_table(a), quote=preparer.quote, param=lambda name: f":{name}"
        )
        self._applied_refused_by_insert_id = applied_sql.refused_by_insert_id
        keys = (bindparam("resource", type_=a.c.resource.type), bindparam("task_id", type_=a.c.task_id.type))
        record_params = (
            *keys,
            bindparam("execution", type_=a.c.execution.type),
            bindparam("token", type_=BigInteger),
            bindparam("retention", type_=BigInteger),
        )
        self._record_applied = (
            text(applied_sql.record).bindparams(*record_params).execution_options(preserve_rowcount=True)
        )
        # PostgreSQL: the record as a CTE fed by the mark upsert's (see _folded); its parameters
        # prefixed, like column mode's, so that they can never meet another statement's. Only
        # with psycopg (3), which prepares a statement run five times: planned on every call
        # (psycopg2, pg8000), the folded statement costs more than the round trip it saves.
        self._record_cte: Any = None
        if dialect == "postgresql" and engine.dialect.driver == "psycopg":
            prefixed = applied_statements(
                dialect, preparer.format_table(a), quote=preparer.quote, param=lambda name: f":{_PREFIX}{name}"
            )
            assert prefixed.record_after is not None
            self._record_cte = (
                text(prefixed.record_after)
                .bindparams(*(bindparam(f"{_PREFIX}{p.key}", type_=p.type) for p in record_params))
                .columns(_ONE)
                .cte(RECORD_CTE)
            )
        self._select_applied = text(applied_sql.select).bindparams(*keys)
        self._prune_applied = text(applied_sql.prune).bindparams(bindparam("limit", type_=BigInteger))
        self._fence_clauses: dict[tuple[Table, str, str | None, str | None], _FenceClauses] = {}
        t = self._table
        resource = bindparam("resource", type_=t.c.resource.type)
        token = bindparam("token", type_=t.c.token.type)
        grantor = bindparam("grantor", type_=t.c.grantor.type)
        # Built once: SQLAlchemy memoises a statement's cache key, so reusing the
        # object skips compilation and cache-key generation on every call.
        self._select_mark = select(t.c.token).where(t.c.resource == resource)
        self._select_mark_grantor = select(t.c.token, t.c.grantor).where(t.c.resource == resource)
        # Whether the table has the grantor column: None until first looked at.
        self._grantor_column: bool | None = None
        if self._mysql:
            my = mysql.insert(t).values(resource=resource, token=token)
            self._legacy_upsert: Any = my.on_duplicate_key_update(
                token=func.if_(t.c.token <= my.inserted.token, my.inserted.token, func.last_insert_id(t.c.token))
            )
            myg = mysql.insert(t).values(resource=resource, token=token, grantor=grantor)
            accept = and_(
                t.c.token <= myg.inserted.token,
                or_(t.c.grantor.is_(None), myg.inserted.grantor.is_(None), t.c.grantor == myg.inserted.grantor),
            )
            # MySQL assigns left to right and later expressions see earlier results: grantor
            # first, and `accept` still holds after it (an adopted grantor equals the token's).
            self._upsert: Any = myg.on_duplicate_key_update(
                [
                    ("grantor", func.if_(accept, func.coalesce(myg.inserted.grantor, t.c.grantor), t.c.grantor)),
                    ("token", func.if_(accept, myg.inserted.token, func.last_insert_id(t.c.token))),
                ]
            )
        else:
            insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
            ins = insert(t).values(resource=resource, token=token)
            # preserve_rowcount: SQLAlchemy reports an INSERT's rowcount only when asked.
            self._legacy_upsert = ins.on_conflict_do_update(
                index_elements=[t.c.resource],
                set_={"token": ins.excluded.token},
                where=t.c.token <= ins.excluded.token,
            ).execution_options(preserve_rowcount=True)
            insg = insert(t).values(resource=resource, token=token, grantor=grantor)
            self._upsert = insg.on_conflict_do_update(
                index_elements=[t.c.resource],
                set_={"token": insg.excluded.token, "grantor": func.coalesce(insg.excluded.grantor, t.c.grantor)},
                where=and_(
                    t.c.token <= insg.excluded.token,
                    or_(t.c.grantor.is_(None), insg.excluded.grantor.is_(None), t.c.grantor == insg.excluded.grantor),
                ),
            ).execution_options(preserve_rowcount=True)
        # PostgreSQL, exactly once: the mark upsert and the record in one statement, by grantor column.
        self._folded_advance: dict[bool, Any] = {}
        if self._record_cte is not None:
            self._folded_advance = {True: self._folded(self._upsert), False: self._folded(self._legacy_upsert)}

    @property
    def table(self) -> Table:
        """The mark table, for ``create_all`` or your migrations."""
        return self._table

    @property
    def applied_table(self) -> Table:
        """The applied-record table (exactly once), for ``create_all`` or your migrations."""
        return self._applied

    def create_schema(self) -> None:
        """Create the mark and applied-record tables if they do not exist; add ``grantor`` to an older mark table.

        Idempotent, also when run concurrently.

        :raises GateUnavailableError: the database failed or could not be reached.
        """
        for table, what in ((self._table, "the mark table"), (self._applied, "the applied-record table")):
            try:
                table.create(self.engine, checkfirst=True)
            except sa_exc.SQLAlchemyError as exc:
                # Another process may have created it between the check and CREATE.
                try:
                    exists = inspect(self.engine).has_table(table.name, schema=table.schema)
                except sa_exc.SQLAlchemyError:
                    exists = False
                if not exists:
                    _unavailable(exc, f"creating {what}")
        try:
            with self.engine.begin() as conn:
                if not self._table_has_grantor(conn):
                    conn.exec_driver_sql(self.grantor_column_ddl())
                    log.warning("added the grantor column to the mark table %s", self._table.name)
        except sa_exc.SQLAlchemyError as exc:
            with self.engine.connect() as conn:
                if not self._table_has_grantor(conn):
                    _unavailable(exc, "adding the grantor column")
        self._grantor_column = None

    def grantor_column_ddl(self) -> str:
        """The ``ALTER TABLE ... ADD COLUMN grantor ...`` that migrates a mark table made before grantor ids."""
        preparer = self.engine.dialect.identifier_preparer
        column_type = self._table.c.grantor.type.compile(dialect=self.engine.dialect)
        return f"ALTER TABLE {preparer.format_table(self._table)} ADD COLUMN grantor {column_type} NULL"

    def _table_has_grantor(self, conn: Connection) -> bool:
        columns = inspect(conn).get_columns(self._table.name, schema=self._table.schema)
        return any(column["name"] == "grantor" for column in columns)

    def _uses_grantor(self, conn: Connection) -> bool:
        """Whether the mark table has the grantor column: looked at once, on the caller's connection."""
        known = self._grantor_column
        if known is None:
            try:
                known = self._table_has_grantor(conn)
            except sa_exc.NoSuchTableError:
                return True  # the upsert then fails as it always did: the table is missing
            if not known:
                log.warning(
                    "mark table %s has no grantor column: tokens of another grantor (a wiped or different "
                    "ZooKeeper) are not detected at this gate. Migrate with SQLGate.create_schema() or: %s",
                    self._table.name,
                    self.grantor_column_ddl(),
                )
            self._grantor_column = known
        return known

    # Gate protocol ------------------------------------------------------------

    def claim(self, token: FencingToken | None = None) -> None:
        """Raise the mark of ``token.resource`` to ``token.value``, in a transaction of its own.

        :raises StaleTokenError: the mark is above the token (nothing changed).
        :raises GrantorMismatchError: the mark belongs to another grantor (nothing changed).
        :raises InvalidTokenError: bad token, before any I/O.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        with _FencedTransaction(self, self._checked(token), None):
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
        try:
            with self.engine.connect() as conn:
                value = conn.execute(self._select_applied, {"resource": resource, "task_id": task_id}).scalar()
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, "reading an applied record")
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
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgumentError(f"limit must be a positive int, not {limit!r:.60}")
        try:
            with self.engine.begin() as conn:
                count: int = conn.execute(self._prune_applied, {"limit": limit}).rowcount
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, "pruning applied records")
        return count

    def high_water(self, resource: str) -> int | None:
        """Return the resource's committed mark, or ``None`` if it was never claimed.

        :raises InvalidTokenError: bad resource name.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        validate_resource(resource)
        try:
            with self.engine.connect() as conn:
                value: int | None = conn.execute(self._select_mark, {"resource": resource}).scalar_one_or_none()
                return value
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, "reading the mark")

    def mark(self, resource: str) -> Mark | None:
        """Return the resource's committed mark with its grantor, or ``None`` if it was never claimed.

        :raises InvalidTokenError: bad resource name.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        validate_resource(resource)
        try:
            with self.engine.connect() as conn:
                if not self._uses_grantor(conn):
                    value = conn.execute(self._select_mark, {"resource": resource}).scalar_one_or_none()
                    return None if value is None else Mark(resource, int(value))
                row = conn.execute(self._select_mark_grantor, {"resource": resource}).one_or_none()
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, "reading the mark")
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
        t = self._table
        try:
            with self.engine.begin() as conn:
                with_grantor = self._uses_grantor(conn)
                values: dict[str, Any] = {"token": checked.value}
                if with_grantor:
                    values["grantor"] = checked.grantor
                if expected is None:
                    count = conn.execute(self._insert_if_absent(checked.resource, values)).rowcount
                else:
                    condition = and_(t.c.resource == checked.resource, t.c.token == expected.value)
                    if with_grantor:
                        condition = and_(
                            condition,
                            t.c.grantor.is_(None) if expected.grantor is None else t.c.grantor == expected.grantor,
                        )
                    count = conn.execute(update(t).where(condition).values(**values)).rowcount
                if count != 1:
                    current = conn.execute(self._select_mark, {"resource": checked.resource}).scalar_one_or_none()
                    raise StaleTokenError(
                        f"the mark of {checked.resource!r} changed since it was read (expected {expected}, "
                        f"now {current}); nothing was reset",
                        resource=checked.resource,
                        token=checked.value,
                        high_water=current,
                    )
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, "resetting the mark")

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
        return _FencedTransaction(self, checked, applied_record(checked))

    def _insert_if_absent(self, resource: str, values: dict[str, Any]) -> Any:
        t = self._table
        if self._mysql:
            return mysql.insert(t).values(resource=resource, **values).prefix_with("IGNORE")
        insert = postgresql.insert if self._dialect == "postgresql" else sqlite.insert
        statement = insert(t).values(resource=resource, **values).on_conflict_do_nothing(index_elements=[t.c.resource])
        return statement.execution_options(preserve_rowcount=True)

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
        self._advance(connection, checked, applied_record(checked))

    def _check_applied_table(self, conn: Connection) -> None:
        """Fail closed, once, when exactly-once is on and its table is missing (a clear error, not a driver's)."""
        if self._applied_exists:
            return
        a = self._applied
        try:
            exists = inspect(conn).has_table(a.name, schema=a.schema)
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, "looking for the applied-record table")
        if not exists:
            raise GateUnavailableError(
                missing_table_message(
                    a.name, "create it with SQLGate.create_schema() or applied_table() in your migrations"
                ),
                gate="SQLGate",
            )
        self._applied_exists = True

    def _folded(self, effect: Any) -> Any:
        """PostgreSQL: *effect* (a mark upsert) and the record in one statement (the form in ``applied_sql``).

        One row: (rows the effect changed, records written). The record's
        parameters are :meth:`_record_params` of the prefixed names.
        """
        return select(*_FOLDED_COUNTS).add_cte(effect.returning(_ONE).cte(EFFECT_CTE), self._record_cte)

    @staticmethod
    def _record_params(token: FencingToken, record: AppliedRecord, prefix: str = "") -> dict[str, Any]:
        return {
            f"{prefix}resource": token.resource,
            f"{prefix}task_id": record.task_id,
            f"{prefix}execution": record.execution_id,
            f"{prefix}token": token.value,
            f"{prefix}retention": retention_seconds(record.retention),
        }

    def _record(self, conn: Connection, token: FencingToken, record: AppliedRecord) -> bool:
        """Write or refresh the record; ``False`` when a live record of another execution refused it."""
        result = conn.execute(self._record_applied, self._record_params(token, record))
        return not result.lastrowid if self._applied_refused_by_insert_id else result.rowcount != 0

    def _other_record(self, conn: Connection, token: FencingToken, record: AppliedRecord) -> tuple[bool, int | None]:
        """(whether a live record names another execution of the task, its token): the refusal path."""
        params = {"resource": token.resource, "task_id": record.task_id}
        found = conn.execute(self._select_applied, params).one_or_none()
        if found is None or found[0] == record.execution_id:
            return False, None
        return True, None if found[1] is None else int(found[1])

    def _refused_record(
        self, conn: Connection, token: FencingToken, record: AppliedRecord, high_water: int | None = None
    ) -> AlreadyAppliedError:
        """The error of a record refused after the effect passed (the record that refused is read for its token)."""
        _, applied_token = self._other_record(conn, token, record)
        return already_applied(token.resource, record.task_id, token.value, applied_token, high_water)

    def _advance(self, conn: Connection, token: FencingToken, record: AppliedRecord | None) -> None:
        params: dict[str, Any] = {"resource": token.resource, "token": token.value}
        if record is not None:
            self._check_applied_table(conn)
        try:
            with_grantor = self._uses_grantor(conn)
            if with_grantor:
                # Only then: Core would add an execution parameter named like a column to the INSERT.
                params["grantor"] = token.grantor
            folded = self._folded_advance.get(with_grantor) if record is not None else None
            if folded is not None and record is not None:
                # PostgreSQL: the upsert and the record in one statement; the record only when the mark passed.
                folded_params = {**params, **self._record_params(token, record, _PREFIX)}
                marked, recorded = conn.execute(folded, folded_params).one()
                if marked and recorded:
                    return
                if marked:
                    raise self._refused_record(conn, token, record)
                refused = True
            else:
                result = conn.execute(self._upsert if with_grantor else self._legacy_upsert, params)
                # MySQL: LAST_INSERT_ID(token) ran only on refusal, so the insert id is not 0.
                # Others: the DO UPDATE ... WHERE refused, and the row is locked (ON CONFLICT
                # locks the conflicting row even when WHERE fails).
                refused = bool(result.lastrowid) if self._mysql else result.rowcount == 0
            if not refused:
                # Under the mark's row lock: no other writer of the resource checks or writes records now.
                if record is None or self._record(conn, token, record):
                    return
                raise self._refused_record(conn, token, record)
            # Read the mark (and grantor) that refused us, under the row lock.
            if with_grantor:
                mark, grantor = conn.execute(self._select_mark_grantor, params).one()
            else:
                mark, grantor = conn.execute(self._select_mark, params).scalar_one(), None
            check_grantor(token, grantor)
            if record is not None:
                other, applied_token = self._other_record(conn, token, record)
                if other:
                    raise already_applied(token.resource, record.task_id, token.value, applied_token, mark)
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, "advancing the mark")
        raise StaleTokenError(resource=token.resource, token=token.value, high_water=mark)

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
        checked = self._checked(token)
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
            self._check_applied_table(connection)
        key = (table, fence_column, resource_column, grantor_column)
        clauses = self._fence_clauses.get(key)
        if clauses is None:
            clauses = self._fence_clauses[key] = _FenceClauses(table, fence_column, resource_column, grantor_column)
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
                if record is None or self._record(connection, checked, record):
                    return count
                raise self._refused_record(connection, checked, record)
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
                other, applied_token = self._other_record(connection, checked, record)
                if not other:
                    raise
                raise already_applied(
                    checked.resource, record.task_id, checked.value, applied_token, stale.high_water
                ) from None
        except sa_exc.SQLAlchemyError as exc:
            if isinstance(exc, _UNAVAILABLE) or getattr(exc, "connection_invalidated", False):
                _unavailable(exc, "fenced update")
            raise
        return 0

    def __repr__(self) -> str:
        return f"SQLGate({self.engine!r}, table={self._table.name!r})"


# Names of the parameters column mode binds at execution. Long and prefixed so
# they cannot meet a parameter of the caller's WHERE.
_PREFIX = "celery_fencing_"
_ONE: ColumnElement[Any] = literal_column("1")
_FOLDED_COUNTS: tuple[ColumnElement[Any], ...] = tuple(literal_column(count) for count in FOLDED_COUNTS)
_TOKEN_PARAM = f"{_PREFIX}token"
_RESOURCE_PARAM = f"{_PREFIX}resource"
_GRANTOR_PARAM = f"{_PREFIX}grantor"


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


class _FencedTransaction(AbstractContextManager[Connection]):
    """The context manager behind :meth:`SQLGate.transaction`. Single use."""

    def __init__(self, gate: SQLGate, token: FencingToken, record: AppliedRecord | None) -> None:
        self._gate = gate
        self._token = token
        self._record = record
        self._conn: Connection | None = None

    def __enter__(self) -> Connection:
        try:
            conn = self._gate.engine.connect()
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, "connecting")
        self._conn = conn
        try:
            conn.begin()
            self._gate._advance(conn, self._token, self._record)
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
            if isinstance(commit_error, _UNAVAILABLE) or getattr(commit_error, "connection_invalidated", False):
                _unavailable(commit_error, "committing")
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


def _column(table: Table, name: str) -> Column[Any]:
    try:
        return table.c[name]
    except KeyError:
        raise FencingConfigurationError(f"table {table.name!r} has no column {name!r}") from None


def _unavailable(exc: sa_exc.SQLAlchemyError, doing: str) -> NoReturn:
    raise GateUnavailableError(
        f"SQL gate failed while {doing}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
        gate="SQLGate",
    ) from exc
