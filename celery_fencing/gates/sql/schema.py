"""The SQL gate's two tables: their layout per dialect, their creation, and the mark table's grantor column.

:func:`high_water_table` and :func:`applied_table` define them in a
``MetaData`` (yours, for migrations); :func:`create_tables` creates what is
missing, tolerating another process creating it at the same time. The
``grantor`` column of a mark table made before grantor ids is found with
:func:`has_grantor_column` and added with :func:`grantor_column_ddl`.
:func:`define_table` and :func:`create_tables` serve the SQL idempotency
store's table as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from sqlalchemy import BigInteger, CheckConstraint, Column, MetaData, String, Table, TypeDecorator, inspect
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection, Dialect, Engine

from ...exceptions import FencingConfigurationError
from ...token import MAX_GRANTOR_LENGTH, MAX_RESOURCE_LENGTH, MAX_TOKEN_VALUE
from ..applied_sql import DEFAULT_APPLIED_TABLE, EXECUTION_ID_LENGTH, MAX_TASK_ID_LENGTH, MYSQL_FAMILY

__all__ = [
    "DEFAULT_RESULT_FENCE_TABLE",
    "DEFAULT_TABLE",
    "MYSQL_FAMILY",
    "SUPPORTED_DIALECTS",
    "Utf8VarBinary",
    "always_quoted",
    "always_quoted_table",
    "applied_table",
    "create_tables",
    "define_table",
    "grantor_column_ddl",
    "has_grantor_column",
    "high_water_table",
    "result_fence_table",
    "supported_dialect",
]

DEFAULT_TABLE = "fencing_high_water"
#: The fenced database result backend's fence table (one row per task id).
DEFAULT_RESULT_FENCE_TABLE = "celery_taskfence"

SUPPORTED_DIALECTS = frozenset({"postgresql", "sqlite"}) | MYSQL_FAMILY
#: The databases by name, in the order messages list them.
_DATABASE_NAMES = {"postgresql": "PostgreSQL", "mysql": "MySQL", "mariadb": "MariaDB", "sqlite": "SQLite"}


def always_quoted(dialect: Dialect, name: str) -> str:
    """*name* quoted for *dialect*, whether or not the dialect takes it for a reserved word.

    For SQL text built before the engine first connects: SQLAlchemy learns
    that a ``mysql://`` engine talks to MariaDB, whose reserved words are
    more (``offset``, ``returning``), only on connecting, so a name quoted
    only when reserved could be left bare, and every statement would fail.
    """
    return dialect.identifier_preparer.quote_identifier(name)


def always_quoted_table(dialect: Dialect, table: Table) -> str:
    """*table*'s name, with its schema, each part quoted (see :func:`always_quoted`)."""
    parts = [table.schema, table.name] if table.schema else [table.name]
    return ".".join(always_quoted(dialect, part) for part in parts)


def supported_dialect(engine: Engine, supported: frozenset[str], store: str) -> str:
    """The name of *engine*'s dialect, one of the databases the SQL *store* (its class name) supports.

    :raises FencingConfigurationError: another database, named with the ones *store* supports.
    """
    dialect: str = engine.dialect.name
    if dialect not in supported:
        *most, last = [name for key, name in _DATABASE_NAMES.items() if key in supported]
        listed = f"{', '.join(most)} and {last}" if most else last
        raise FencingConfigurationError(f"{store} supports {listed}, not {dialect!r}")
    return dialect


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
    return define_table(metadata, name, schema, *_mark_columns(name))


def _mark_columns(name: str) -> tuple[Any, ...]:
    """The columns the mark upsert reads and writes (``resource``, ``token``, ``grantor``) and the token's range."""
    return (
        Column("resource", _binary_on_mysql(MAX_RESOURCE_LENGTH), primary_key=True),
        Column("token", BigInteger, nullable=False),
        Column("grantor", _grantor_type(), nullable=True),
        CheckConstraint(f"token >= 1 AND token <= {MAX_TOKEN_VALUE}", name=f"{name[:48]}_token_range"),
    )


def result_fence_table(
    metadata: MetaData, name: str = DEFAULT_RESULT_FENCE_TABLE, *, schema: str | None = None
) -> Table:
    """Define the fenced result backend's fence table: the mark table's columns, keyed by task id, and two more.

    ``resource`` (the task id), ``token`` and ``grantor`` as in
    :func:`high_water_table`, so the mark upsert advances it; ``owner`` (the
    resource of the tokens that fence the result) and ``done`` (the id of the
    execution that sealed the task). See :mod:`celery_fencing.celery.db_fence`.
    """
    return define_table(
        metadata,
        name,
        schema,
        # resource: the task id (MAX_TASK_ID_LENGTH, the same 200 characters as a resource).
        *_mark_columns(name),
        Column("owner", _binary_on_mysql(MAX_RESOURCE_LENGTH), nullable=True),
        Column("done", String(EXECUTION_ID_LENGTH), nullable=True),
    )


def applied_table(metadata: MetaData, name: str = DEFAULT_APPLIED_TABLE, *, schema: str | None = None) -> Table:
    """Define the applied-record table (exactly once) in *metadata*, for your migrations.

    The layout is :mod:`celery_fencing.gates.applied_sql`'s: ``resource`` and
    ``task_id`` (binary on MySQL/MariaDB), ``execution``, ``token`` (the
    execution's token value), ``expires_at`` (epoch seconds), primary key
    (resource, task_id). If *metadata* already
    holds a table of that name, it is returned as is.
    """
    return define_table(
        metadata,
        name,
        schema,
        Column("resource", _binary_on_mysql(MAX_RESOURCE_LENGTH), primary_key=True),
        Column("task_id", _binary_on_mysql(MAX_TASK_ID_LENGTH), primary_key=True),
        Column("execution", String(EXECUTION_ID_LENGTH), nullable=False),
        Column("token", BigInteger, nullable=False),
        Column("expires_at", BigInteger, nullable=False),
    )


def define_table(metadata: MetaData, name: str, schema: str | None, *parts: Any) -> Table:
    """The table *name* of *metadata* if it holds one, else a new one of *parts*."""
    existing = metadata.tables.get(f"{schema}.{name}" if schema else name)
    return existing if existing is not None else Table(name, metadata, *parts, schema=schema)


def create_tables(
    engine: Engine,
    tables: Iterable[tuple[Table, str]],
    unavailable: Callable[[sa_exc.SQLAlchemyError, str], NoReturn],
) -> None:
    """Create each ``(table, what it is)`` that does not exist yet; idempotent, also when run concurrently.

    A failed ``CREATE`` is passed to *unavailable* (with ``"creating <what>"``)
    unless the table exists after all.
    """
    for table, what in tables:
        try:
            table.create(engine, checkfirst=True)
        except sa_exc.SQLAlchemyError as exc:
            # Another process may have created it between the check and CREATE.
            try:
                exists = inspect(engine).has_table(table.name, schema=table.schema)
            except sa_exc.SQLAlchemyError:
                exists = False
            if not exists:
                unavailable(exc, f"creating {what}")


def has_grantor_column(conn: Connection, table: Table) -> bool:
    """Whether the mark table *table*, as it is in the database, has the ``grantor`` column."""
    columns = inspect(conn).get_columns(table.name, schema=table.schema)
    return any(column["name"] == "grantor" for column in columns)


def grantor_column_ddl(dialect: Dialect, table: Table) -> str:
    """The ``ALTER TABLE ... ADD COLUMN grantor ...`` that migrates a mark table made before grantor ids."""
    column_type = table.c.grantor.type.compile(dialect=dialect)
    return f"ALTER TABLE {dialect.identifier_preparer.format_table(table)} ADD COLUMN grantor {column_type} NULL"


def _binary_on_mysql(length: int) -> Any:
    # Binary on MySQL/MariaDB: their default collations compare case- and
    # trailing-space-insensitively, which would merge resources (and task ids).
    return String(length).with_variant(Utf8VarBinary(length * 4), "mysql", "mariadb")


def _grantor_type() -> Any:
    return String(MAX_GRANTOR_LENGTH).with_variant(Utf8VarBinary(MAX_GRANTOR_LENGTH), "mysql", "mariadb")
