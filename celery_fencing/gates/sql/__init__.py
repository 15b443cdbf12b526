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

One role per module:

* :mod:`.gate`: :class:`SQLGate`, the facade: the Gate protocol, reads, the operator's reset;
* :mod:`.transaction`: transaction mode, the upsert as a transaction's first statement;
* :mod:`.column`: column mode, the ``fence`` column of the caller's row;
* :mod:`.marks`: the mark table's statements, built once per gate, and its grantor column;
* :mod:`.applied`: exactly once, the applied-record statements of
  :mod:`celery_fencing.gates.applied_sql` bound for SQLAlchemy;
* :mod:`.schema`: the two tables' layout, for your ``MetaData`` and for ``create_schema()``;
* :mod:`.errors`: which SQLAlchemy failures mean the database is unavailable.
"""

from __future__ import annotations

from ..applied_sql import DEFAULT_APPLIED_TABLE
from .gate import SQLGate
from .schema import DEFAULT_TABLE, Utf8VarBinary, applied_table, high_water_table

__all__ = ["DEFAULT_APPLIED_TABLE", "DEFAULT_TABLE", "SQLGate", "Utf8VarBinary", "applied_table", "high_water_table"]
