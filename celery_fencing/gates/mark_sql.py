"""The mark table's SQL, shared by SQLGate, DjangoGate and the fenced database result backends, with no driver import.

A mark row is (resource, token[, grantor]): the highest token the resource
has accepted, and the grantor that minted it. The statements, with their
parameters in the order a ``%s`` cursor takes them:

* ``upsert`` (resource, token[, grantor]): raise the mark to the token unless
  it is above it, or (with the grantor column) of another grantor; a mark
  without a grantor adopts the token's, a token without one is compared by
  value. PostgreSQL, SQLite: ``INSERT ... ON CONFLICT (resource) DO UPDATE
  ... WHERE <accepted>``, refused when the row count is 0; the conflicting
  row is locked even then. MySQL, MariaDB: ``ON DUPLICATE KEY UPDATE`` that
  keeps the row as it is when it refuses, through ``LAST_INSERT_ID(token)``,
  so the statement's insert id is non-zero exactly then. Either way the
  upsert's row lock holds off every other writer of the resource until the
  transaction ends.
* ``select`` (resource): the mark and its grantor (``NULL`` without the column).
* ``insert_if_absent`` (resource, token[, grantor]): a mark where there is
  none; row count 0 if there was one (the operator's reset of a missing mark).
* ``reset`` (token[, grantor], resource, expected token[, expected grantor])
  and ``reset_null_grantor`` (the expected grantor ``NULL``): the operator's
  compare-and-set of a mark, lower or not.

Each caller quotes the names for its connection and spells parameters its
own way (``:name`` for SQLAlchemy's ``text()``, ``%s`` for Django's cursor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..exceptions import FencingConfigurationError
from .applied_sql import MYSQL_FAMILY

__all__ = ["MarkStatements", "mark_statements"]

_ON_CONFLICT = frozenset({"postgresql", "sqlite"})


@dataclass(frozen=True)
class MarkStatements:
    """The mark table's SQL for one table on one database, with the caller's quoting and parameter style."""

    #: (resource, token[, grantor]): the conditional upsert; refused as ``refused_by_insert_id`` says.
    upsert: str
    #: (resource,): the mark, and its grantor (``NULL`` for a table without the column).
    select: str
    #: (resource, token[, grantor]): a mark where there is none; row count 0 if there was one.
    insert_if_absent: str
    #: (token[, grantor], resource, expected token[, expected grantor]): the operator's compare-and-set.
    reset: str
    #: ``reset`` with the expected grantor ``NULL`` (no expected grantor parameter).
    reset_null_grantor: str
    #: MySQL/MariaDB: a refused ``upsert`` reports a non-zero insert id; elsewhere its row count is 0.
    refused_by_insert_id: bool


def mark_statements(
    vendor: str,
    table: str,
    *,
    resource: str,
    token: str,
    grantor: str | None,
    param: Callable[[str], str],
) -> MarkStatements:
    """Build the statements for *vendor* (``postgresql``, ``mysql``, ``mariadb``, ``sqlite``).

    *table* and the column names *resource*, *token* and *grantor* come
    quoted; *grantor* is ``None`` for a table made before grantor ids (the
    upsert then compares values only). *param* spells a parameter by name.
    """
    mysql = vendor in MYSQL_FAMILY
    if not mysql and vendor not in _ON_CONFLICT:
        raise FencingConfigurationError(f"no mark-table SQL for {vendor!r}")
    names = [resource, token] if grantor is None else [resource, token, grantor]
    columns = ", ".join(names)
    values = ", ".join(param(name) for name in ("resource", "token", "grantor")[: len(names)])
    insert = f"INSERT INTO {table} ({columns}) VALUES ({values})"
    if mysql:
        # MySQL assigns left to right and later expressions see earlier results: the grantor
        # first, and the acceptance still holds after it (an adopted grantor equals the token's).
        accept = f"{table}.{token} <= VALUES({token})"
        keep_token = f"{token} = IF({accept}{{agree}}, VALUES({token}), LAST_INSERT_ID({table}.{token}))"
        if grantor is None:
            upsert = f"{insert} ON DUPLICATE KEY UPDATE {keep_token.format(agree='')}"
        else:
            agree = (
                f" AND ({table}.{grantor} IS NULL OR VALUES({grantor}) IS NULL "
                f"OR {table}.{grantor} = VALUES({grantor}))"
            )
            upsert = (
                f"{insert} ON DUPLICATE KEY UPDATE "
                f"{grantor} = IF({accept}{agree}, COALESCE(VALUES({grantor}), {table}.{grantor}), {table}.{grantor}), "
                f"{keep_token.format(agree=agree)}"
            )
        insert_if_absent = insert.replace("INSERT INTO", "INSERT IGNORE INTO", 1)
    else:
        accept = f"{table}.{token} <= excluded.{token}"
        if grantor is None:
            upsert = f"{insert} ON CONFLICT ({resource}) DO UPDATE SET {token} = excluded.{token} WHERE {accept}"
        else:
            upsert = (
                f"{insert} ON CONFLICT ({resource}) DO UPDATE SET {token} = excluded.{token}, "
                f"{grantor} = COALESCE(excluded.{grantor}, {table}.{grantor}) "
                f"WHERE {accept} AND ({table}.{grantor} IS NULL OR excluded.{grantor} IS NULL "
                f"OR {table}.{grantor} = excluded.{grantor})"
            )
        insert_if_absent = f"{insert} ON CONFLICT ({resource}) DO NOTHING"
    stored_grantor = "NULL" if grantor is None else grantor
    set_grantor = "" if grantor is None else f", {grantor} = {param('grantor')}"
    reset = (
        f"UPDATE {table} SET {token} = {param('token')}{set_grantor} "
        f"WHERE {resource} = {param('resource')} AND {token} = {param('expected_token')}"
    )
    return MarkStatements(
        upsert=upsert,
        select=f"SELECT {token}, {stored_grantor} FROM {table} WHERE {resource} = {param('resource')}",
        insert_if_absent=insert_if_absent,
        reset=reset if grantor is None else f"{reset} AND {grantor} = {param('expected_grantor')}",
        reset_null_grantor=reset if grantor is None else f"{reset} AND {grantor} IS NULL",
        refused_by_insert_id=mysql,
    )
