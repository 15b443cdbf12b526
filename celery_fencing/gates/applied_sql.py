"""The applied-record table and its SQL, shared by SQLGate and DjangoGate, with no driver import.

Exactly once: with the effect of an execution of task T on resource R, the
gate writes the row (R, T, execution id, token, expiry) in the same
transaction, so a later execution of T (a re-delivered copy, a retry) finds it
and does not apply again. The table (``fencing_applied`` by default)::

    resource    VARCHAR(200) NOT NULL   (VARBINARY(800) on MySQL/MariaDB)
    task_id     VARCHAR(200) NOT NULL   (VARBINARY(800) on MySQL/MariaDB)
    execution   VARCHAR(64)  NOT NULL
    token       BIGINT       NOT NULL   the token value of that execution on R
    expires_at  BIGINT       NOT NULL   epoch seconds, on the database's clock
    PRIMARY KEY (resource, task_id)

The token tells an execution that meets the record whether the one that
applied is newer (its token is above: ``superseded``, that one finishes the
task) or older. The resource's mark cannot tell it: on a resource shared by
many tasks it may belong to another task.

Resource and task id are binary on MySQL/MariaDB for the reason the mark
table's resource is (see :mod:`celery_fencing.gates.sql`): their default
collations would merge ``"T"``, ``"t"`` and ``"t "``.

Expiry is computed and compared by the database (``now()`` on PostgreSQL,
``UNIX_TIMESTAMP()`` on MySQL/MariaDB, ``strftime('%s','now')`` on SQLite),
never by the workers' clocks. An expired row counts as absent; rows are
removed by :meth:`AppliedStatements.prune`'s bounded ``DELETE``
(``prune_applied()`` on the gates).

The statements, in the order a gate runs them, with their parameters:

* ``record`` (resource, task id, execution id, token, retention in whole
  seconds): one upsert that writes the row, or refreshes it when it is
  expired or this execution's own, and otherwise changes nothing. PostgreSQL, SQLite:
  ``INSERT ... ON CONFLICT (resource, task_id) DO UPDATE SET ... WHERE
  <expired> OR execution = excluded.execution``, refused when the row count
  is 0. MySQL, MariaDB: ``ON DUPLICATE KEY UPDATE`` that stores the live
  row's expiry with ``LAST_INSERT_ID(expires_at)`` when it refuses, so the
  statement's insert id is non-zero exactly then (the mark upsert's trick).
* ``select`` (resource, task id): the live row's execution id and token, for
  the refusal path and for ``applied()``.
* ``prune`` (limit): delete at most *limit* expired rows.

A gate runs ``record`` after its mark upsert (or, in column mode, after its
``UPDATE``): the row lock that statement takes serialises the writers of the
resource (of the row), so the check and the write of the record cannot
interleave with another execution's.

On PostgreSQL with psycopg, SQLGate's transaction mode (``transaction()``, ``guard()``)
sends no statement of its own for the record: ``record_after`` is the same
upsert as an ``INSERT ... SELECT`` fed by a data-modifying CTE, the mark
upsert is that CTE, and ``FOLDED_COUNTS`` are the statement's columns::

    WITH celery_fencing_effect AS (<mark upsert or UPDATE> RETURNING 1),
         celery_fencing_record AS (INSERT INTO fencing_applied (...)
             SELECT <resource>, <task id>, <execution>, <token>, now + <retention>
             FROM (SELECT count(*) AS n FROM celery_fencing_effect) AS effect WHERE effect.n > 0
             ON CONFLICT (resource, task_id) DO UPDATE SET ... WHERE <expired or own> RETURNING 1)
    SELECT (SELECT count(*) FROM celery_fencing_effect), (SELECT count(*) FROM celery_fencing_record)

The record reads the effect's output, so PostgreSQL runs the effect first:
``count(*)`` consumes all of it, so every row lock it takes (the mark's, or
the updated rows') is held before the record is checked, as with two
statements. A refused effect returns no row, so nothing is recorded; a
refused record (counts 1, 0) leaves the effect in the transaction, which the
gate's refusal rolls back, as with two statements. SQLite (no
data-modifying CTE, no ``RETURNING`` in a subquery) and MySQL/MariaDB
(neither) have no sound one-statement form, and run two statements.

The fold pays only where the statement is prepared once and reused, as
SQLAlchemy's psycopg dialect does (psycopg prepares a statement run five
times): measured on a local server, the mark upsert and record take 410 us
folded against 463 us as two statements when prepared, but 652 us against
616 us when PostgreSQL plans each call. So the rest run two statements:
SQLGate on another PostgreSQL driver (psycopg2, pg8000 prepare nothing),
DjangoGate (Django binds parameters client-side, nothing is prepared), and
column mode of both gates, whose ``UPDATE`` is the caller's, built on each
call: SQLAlchemy would build the CTE around it and its cache key each time,
which cost more (about 130 us) than the round trip saved (about 50 us).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..exceptions import AlreadyAppliedError, FencingConfigurationError, InvalidArgumentError
from ..token import MAX_RESOURCE_LENGTH

__all__ = [
    "APPLIED_COLUMNS",
    "DEFAULT_APPLIED_TABLE",
    "EFFECT_CTE",
    "EXECUTION_ID_LENGTH",
    "FOLDED_COUNTS",
    "MAX_TASK_ID_LENGTH",
    "MYSQL_FAMILY",
    "RECORD_CTE",
    "AppliedStatements",
    "already_applied",
    "applied_statements",
    "check_prune_limit",
    "create_table_sql",
    "missing_table_message",
    "other_execution",
    "retention_seconds",
]

DEFAULT_APPLIED_TABLE = "fencing_applied"
#: Longest task id a record holds (Celery's are 36-character UUIDs).
MAX_TASK_ID_LENGTH = 200
EXECUTION_ID_LENGTH = 64
APPLIED_COLUMNS = ("resource", "task_id", "execution", "token", "expires_at")
#: Names of the folded statement's CTEs (PostgreSQL): the effect, then the record.
EFFECT_CTE = "celery_fencing_effect"
RECORD_CTE = "celery_fencing_record"
#: The folded statement's result columns: rows the effect changed, records written.
FOLDED_COUNTS = tuple(f"(SELECT count(*) FROM {cte})" for cte in (EFFECT_CTE, RECORD_CTE))

#: The dialect names of MySQL and MariaDB, which share one SQL form (``ON DUPLICATE KEY``, ``LAST_INSERT_ID``).
MYSQL_FAMILY = frozenset({"mysql", "mariadb"})

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
    family = "mysql" if vendor in MYSQL_FAMILY else vendor
    if family not in _NOW:
        raise FencingConfigurationError(f"no applied-record SQL for {vendor!r}")
    return family


@dataclass(frozen=True)
class AppliedStatements:
    """The applied-record SQL for one table on one database, with the caller's parameter style."""

    #: (resource, task_id, execution, token, retention): write or refresh the record; see ``refused_by_insert_id``.
    record: str
    #: (resource, task_id): the execution id and token of the live record, no row when there is none.
    select: str
    #: (limit,): delete at most *limit* expired rows.
    prune: str
    #: MySQL/MariaDB: a refused ``record`` reports a non-zero insert id; elsewhere its row count is 0.
    refused_by_insert_id: bool
    #: PostgreSQL only (else ``None``): ``record`` fed by the CTE ``EFFECT_CTE``, to be the CTE
    #: ``RECORD_CTE`` of the folded statement; parameters as ``record``'s, ``RETURNING 1`` when it recorded.
    record_after: str | None = None


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
    resource, task_id, execution, token, expires_at = (quote(column) for column in APPLIED_COLUMNS)
    columns = f"INSERT INTO {table} ({resource}, {task_id}, {execution}, {token}, {expires_at})"
    values = (
        f"{param('resource')}, {param('task_id')}, {param('execution')}, {param('token')}, {now} + {param('retention')}"
    )
    record_after = None
    if family == "mysql":
        # Left to right, later assignments see earlier ones: after the first,
        # execution equals the new one exactly when the record was taken.
        record = (
            f"{columns} VALUES ({values}) ON DUPLICATE KEY UPDATE "
            f"{execution} = IF({expires_at} <= {now} OR {execution} = VALUES({execution}), "
            f"VALUES({execution}), {execution}), "
            f"{token} = IF({execution} = VALUES({execution}), VALUES({token}), {token}), "
            f"{expires_at} = IF({execution} = VALUES({execution}), VALUES({expires_at}), "
            f"LAST_INSERT_ID({expires_at}))"
        )
        prune = f"DELETE FROM {table} WHERE {expires_at} <= {now} LIMIT {param('limit')}"
    else:
        upsert = (
            f"ON CONFLICT ({resource}, {task_id}) DO UPDATE SET {execution} = excluded.{execution}, "
            f"{token} = excluded.{token}, {expires_at} = excluded.{expires_at} "
            f"WHERE {table}.{expires_at} <= {now} OR {table}.{execution} = excluded.{execution}"
        )
        record = f"{columns} VALUES ({values}) {upsert}"
        if family == "postgresql":
            # The casts: in INSERT ... SELECT an untyped parameter would be text, not the column's type.
            typed = (
                f"{param('resource')}, {param('task_id')}, {param('execution')}, CAST({param('token')} AS BIGINT), "
                f"{now} + CAST({param('retention')} AS BIGINT)"
            )
            record_after = (
                f"{columns} SELECT {typed} FROM (SELECT count(*) AS n FROM {EFFECT_CTE}) AS effect "
                f"WHERE effect.n > 0 {upsert} RETURNING 1"
            )
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
        f"SELECT {execution}, {token} FROM {table} WHERE {resource} = {param('resource')} "
        f"AND {task_id} = {param('task_id')} AND {expires_at} > {now}"
    )
    return AppliedStatements(record, select, prune, refused_by_insert_id=family == "mysql", record_after=record_after)


def already_applied(
    resource: str, task_id: str, token: int, applied_token: int | None, high_water: int | None = None
) -> AlreadyAppliedError:
    """The refusal of an execution holding *token* by the live record of another, holding *applied_token*.

    ``superseded`` when the one that applied is newer (its token is above);
    the resource's mark (*high_water*) plays no part.
    """
    return AlreadyAppliedError(
        resource=resource,
        task_id=task_id,
        superseded=applied_token is not None and applied_token > token,
        applied_token=applied_token,
        high_water=high_water,
    )


def other_execution(row: Sequence[Any] | None, execution_id: str) -> tuple[bool, int | None]:
    """(whether the live record *row* names another execution than *execution_id*, that one's token).

    *row* is what ``select`` returned: (execution id, token), or ``None``
    when there is no live record. The refusal path of both SQL gates.
    """
    if row is None or row[0] == execution_id:
        return False, None
    return True, None if row[1] is None else int(row[1])


def check_prune_limit(limit: object) -> int:
    """*limit* of ``prune_applied()``, checked: a positive int.

    :raises InvalidArgumentError: it is not one.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgumentError(f"limit must be a positive int, not {limit!r:.60}")
    return limit


def create_table_sql(vendor: str, table: str, *, quote: Callable[[str], str]) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for the table (Django's migration runs it; SQLGate builds the same table)."""
    family = _family(vendor)
    key = f"VARBINARY({MAX_RESOURCE_LENGTH * 4})" if family == "mysql" else f"VARCHAR({MAX_RESOURCE_LENGTH})"
    task = f"VARBINARY({MAX_TASK_ID_LENGTH * 4})" if family == "mysql" else f"VARCHAR({MAX_TASK_ID_LENGTH})"
    resource, task_id, execution, token, expires_at = (quote(column) for column in APPLIED_COLUMNS)
    return (
        f"CREATE TABLE IF NOT EXISTS {table} ({resource} {key} NOT NULL, {task_id} {task} NOT NULL, "
        f"{execution} VARCHAR({EXECUTION_ID_LENGTH}) NOT NULL, {token} BIGINT NOT NULL, "
        f"{expires_at} BIGINT NOT NULL, "
        f"PRIMARY KEY ({resource}, {task_id}))"
    )


def missing_table_message(table: str, how: str) -> str:
    """The error of a gate with exactly-once on whose applied-record table does not exist."""
    return (
        f"the applied-record table {table} does not exist, so this gate cannot record exactly-once "
        f"effects and refuses to write (it fails closed): {how}"
    )
