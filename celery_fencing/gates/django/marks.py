"""The mark model's SQL for one connection's vendor: the conditional upsert, the read, the operator's reset.

Raw SQL with Django's ``%s`` parameters (the ORM has no conditional upsert),
quoted with the connection's operations. With a ``grantor`` field the upsert
also compares grantors, in the same statement: a mark without a grantor
adopts the token's, a token without one is compared by value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import connections

__all__ = ["MarkStatements", "has_field", "mark_statements"]


@dataclass(frozen=True)
class MarkStatements:
    """The gate's SQL for one mark model, quoted for one connection's vendor."""

    #: (resource, token[, grantor]): the conditional upsert; rowcount 0 means refused.
    upsert: str
    #: (resource,): the mark, and its grantor (NULL for a model without one).
    select: str
    #: (resource, token[, grantor]): insert a mark where there is none; rowcount 0 if there was one.
    insert_if_absent: str
    #: (token[, grantor], resource, expected token[, expected grantor]): reset_mark's compare-and-set.
    reset: str
    #: reset with the expected grantor NULL.
    reset_null_grantor: str


def mark_statements(using: str, model: Any, *, with_grantor: bool) -> MarkStatements:
    """Build the statements of the mark *model* for the connection of the alias *using* (no query is sent)."""
    quote = connections[using].ops.quote_name
    meta = model._meta
    table = quote(meta.db_table)
    resource = quote(meta.get_field("resource").column)
    token = quote(meta.get_field("token").column)
    if with_grantor:
        grantor = quote(meta.get_field("grantor").column)
        columns, values = f"{resource}, {token}, {grantor}", "%s, %s, %s"
        set_grantor = f", {grantor} = COALESCE(excluded.{grantor}, {table}.{grantor})"
        # A mark without a grantor adopts; a token without one is compared by value.
        agree = (
            f" AND ({table}.{grantor} IS NULL OR excluded.{grantor} IS NULL OR {table}.{grantor} = excluded.{grantor})"
        )
        stored_grantor, reset_grantor = grantor, f", {grantor} = %s"
        expect, expect_null = f" AND {grantor} = %s", f" AND {grantor} IS NULL"
    else:
        columns, values, set_grantor, agree = f"{resource}, {token}", "%s, %s", "", ""
        stored_grantor, reset_grantor, expect, expect_null = "NULL", "", "", ""
    reset = f"UPDATE {table} SET {token} = %s{reset_grantor} WHERE {resource} = %s AND {token} = %s"
    return MarkStatements(
        upsert=(
            f"INSERT INTO {table} ({columns}) VALUES ({values}) "
            f"ON CONFLICT ({resource}) DO UPDATE SET {token} = excluded.{token}{set_grantor} "
            f"WHERE {table}.{token} <= excluded.{token}{agree}"
        ),
        select=f"SELECT {token}, {stored_grantor} FROM {table} WHERE {resource} = %s",
        insert_if_absent=(f"INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT ({resource}) DO NOTHING"),
        reset=reset + expect,
        reset_null_grantor=reset + expect_null,
    )


def has_field(model: Any, name: str) -> bool:
    """Whether *model* has a field named *name*."""
    try:
        model._meta.get_field(name)
    except FieldDoesNotExist:
        return False
    return True
