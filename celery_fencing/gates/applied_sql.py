"""The applied-record table and its SQL, shared by SQLGate and DjangoGate, with no driver import.

Exactly once: with the effect of an execution of task T on resource R, the
gate writes the row (R, T, execution id, expiry) in the same transaction, so
a later execution of T (a re-delivered copy, a retry) finds it and does not
apply again. The table (``fencing_applied`` by default)::

    resource    VARCHAR(200) NOT NULL   (VARBINARY(800) on MySQL/MariaDB)
    task_id     VARCHAR(200) NOT NULL   (VARBINARY(800) on MySQL/MariaDB)
    execution   VARCHAR(64)  NOT NULL
    expires_at  BIGINT       NOT NULL   epoch seconds, on the database's clock
    PRIMARY KEY (resource, task_id)

Resource and task id are binary on MySQL/MariaDB for the reason the mark
table's resource is (see :mod:`celery_fencing.gates.sql`): their default
collations would merge ``"T"``, ``"t"`` and ``"t "``.

Expiry is computed and compared by the database (``now()`` on PostgreSQL,
``UNIX_TIMESTAMP()`` on MySQL/MariaDB, ``strftime('%s','now')`` on SQLite),
never by the workers' clocks. An expired row counts as absent; rows are
removed by :meth:`AppliedStatements.prune`'s bounded ``DELETE``
(``prune_applied()`` on the gates).

The statements, in the order a gate runs them, with their parameters:

* ``record`` (resource, task id, execution id, retention in whole seconds):
  one upsert that writes the row, or refreshes it when it is expired or this
  execution's own, and otherwise changes nothing. PostgreSQL, SQLite:
  ``INSERT ... ON CONFLICT (resource, task_id) DO UPDATE SET ... WHERE
  <expired> OR execution = excluded.execution``, refused when the row count
  is 0. MySQL, MariaDB: ``ON DUPLICATE KEY UPDATE`` that stores the live
  row's expiry with ``LAST_INSERT_ID(expires_at)`` when it refuses, so the
  statement's insert id is non-zero exactly then (the mark upsert's trick).
* ``select`` (resource, task id): the live row's execution id, for the
  refusal path and for ``applied()``.
* ``prune`` (limit): delete at most *limit* expired rows.

A gate runs ``record`` after its mark upsert: the mark row's lock serialises
the writers of the resource, so the check and the write of the record cannot
interleave with another execution's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..exceptions import FencingConfigurationError
from ..token import MAX_RESOURCE_LENGTH

__all__ = [
    "APPLIED_COLUMNS",
    "DEFAULT_APPLIED_TABLE",
    "EXECUTION_ID_LENGTH",
    "MAX_TASK_ID_LENGTH",
    "AppliedStatements",
    "applied_statements",
    "create_table_sql",
    "missing_table_message",
    "retention_seconds",
]

DEFAULT_APPLIED_TABLE = "fencing_applied"
#: Longest task id a record holds (Celery's are 36-character UUIDs).
MAX_TASK_ID_LENGTH = 200
EXECUTION_ID_LENGTH = 64
APPLIED_COLUMNS = ("resource", "task_id", "execution", "expires_at")

_MYSQL_FAMILY = frozenset({"mysql", "mariadb"})

# The database's clock, in whole epoch seconds.
_NOW = {
    "postgresql": "CAST(FLOOR(EXTRACT(EPOCH FROM now())) AS BIGINT)",
    "mysql": "UNIX_TIMESTAMP()",
    "sqlite": "CAST(strftime('%s','now') AS INTEGER)",
}


def retention_seconds(retention: float) -> int:
    """A record's retention in the whole seconds the table counts in: rounded up, at least 1."""
    return max(1, math.ceil(retention))


def _family(vendor: str) -> str:
    family = "mysql" if vendor in _MYSQL_FAMILY else vendor
    if family not in _NOW:
        raise FencingConfigurationError(f"no applied-record SQL for {vendor!r}")
    return family


@dataclass(frozen=True)
class AppliedStatements:
    """The applied-record SQL for one table on one database, with the caller's parameter style."""

    #: (resource, task_id, execution, retention): write or refresh the record; see ``refused_by_insert_id``.
    record: str
    #: (resource, task_id): the execution id of the live record, no row when there is none.
    select: str
    #: (limit,): delete at most *limit* expired rows.
    prune: str
    #: MySQL/MariaDB: a refused ``record`` reports a non-zero insert id; elsewhere its row count is 0.
    refused_by_insert_id: bool


def applied_statements(
    vendor: str, table: str, *, quote: Callable[[str], str], param: Callable[[str], str]
) -> AppliedStatements:
    """Build the statements for *vendor* (``postgresql``, ``mysql``, ``mariadb``, ``sqlite``).

    *table* is the table's name, already quoted (with its schema); *quote*
    quotes a column name. *param* spells a parameter by name: ``lambda n:
    f":{n}"`` for SQLAlchemy's ``text()``, ``lambda n: "%s"`` for a DB-API
    ``format`` cursor such as Django's (the parameters then go in the order
    documented on :class:`AppliedStatements`); with ``%s`` a literal ``%`` is
    doubled.
    """
    family = _family(vendor)
    now = _NOW[family]
    if param("x") == "%s":
        now, table = now.replace("%", "%%"), table.replace("%", "%%")
    resource, task_id, execution, expires_at = (quote(column) for column in APPLIED_COLUMNS)
    values = f"{param('resource')}, {param('task_id')}, {param('execution')}, {now} + {param('retention')}"
    insert = f"INSERT INTO {table} ({resource}, {task_id}, {execution}, {expires_at}) VALUES ({values})"
    if family == "mysql":
        # Left to right, later assignments see earlier ones: after the first,
        # execution equals the new one exactly when the record was taken.
        record = (
            f"{insert} ON DUPLICATE KEY UPDATE "
            f"{execution} = IF({expires_at} <= {now} OR {execution} = VALUES({execution}), "
            f"VALUES({execution}), {execution}), "
            f"{expires_at} = IF({execution} = VALUES({execution}), VALUES({expires_at}), "
            f"LAST_INSERT_ID({expires_at}))"
        )
        prune = f"DELETE FROM {table} WHERE {expires_at} <= {now} LIMIT {param('limit')}"
    else:
        record = (
            f"{insert} ON CONFLICT ({resource}, {task_id}) DO UPDATE SET "
            f"{execution} = excluded.{execution}, {expires_at} = excluded.{expires_at} "
            f"WHERE {table}.{expires_at} <= {now} OR {table}.{execution} = excluded.{execution}"
        )
        if family == "postgresql":
            # SKIP LOCKED: rows a writer is refreshing are left for the next prune.
            prune = (
                f"DELETE FROM {table} WHERE {expires_at} <= {now} AND ({resource}, {task_id}) IN "
                f"(SELECT {resource}, {task_id} FROM {table} WHERE {expires_at} <= {now} "
                f"LIMIT {param('limit')} FOR UPDATE SKIP LOCKED)"
            )
        else:
            prune = (
                f"DELETE FROM {table} WHERE rowid IN "
                f"(SELECT rowid FROM {table} WHERE {expires_at} <= {now} LIMIT {param('limit')})"
            )
    select = (
        f"SELECT {execution} FROM {table} WHERE {resource} = {param('resource')} "
        f"AND {task_id} = {param('task_id')} AND {expires_at} > {now}"
    )
    return AppliedStatements(record, select, prune, refused_by_insert_id=family == "mysql")


def create_table_sql(vendor: str, table: str, *, quote: Callable[[str], str]) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for the table (Django's migration runs it; SQLGate builds the same table)."""
    family = _family(vendor)
    key = f"VARBINARY({MAX_RESOURCE_LENGTH * 4})" if family == "mysql" else f"VARCHAR({MAX_RESOURCE_LENGTH})"
    task = f"VARBINARY({MAX_TASK_ID_LENGTH * 4})" if family == "mysql" else f"VARCHAR({MAX_TASK_ID_LENGTH})"
    resource, task_id, execution, expires_at = (quote(column) for column in APPLIED_COLUMNS)
    return (
        f"CREATE TABLE IF NOT EXISTS {table} ({resource} {key} NOT NULL, {task_id} {task} NOT NULL, "
        f"{execution} VARCHAR({EXECUTION_ID_LENGTH}) NOT NULL, {expires_at} BIGINT NOT NULL, "
        f"PRIMARY KEY ({resource}, {task_id}))"
    )


def missing_table_message(table: str, how: str) -> str:
    """The error of a gate with exactly-once on whose applied-record table does not exist."""
    return (
        f"the applied-record table {table} does not exist, so this gate cannot record exactly-once "
        f"effects and refuses to write (it fails closed): {how}"
    )
