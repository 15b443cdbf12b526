"""The mark model's SQL for one connection's vendor (the statements of :mod:`celery_fencing.gates.mark_sql`).

Raw SQL with Django's ``%s`` parameters (the ORM has no conditional upsert),
quoted with the connection's operations. With a ``grantor`` field the upsert
also compares grantors, in the same statement: a mark without a grantor
adopts the token's, a token without one is compared by value.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import connections

from ..mark_sql import MarkStatements
from ..mark_sql import mark_statements as build_mark_statements

__all__ = ["MarkStatements", "has_field", "mark_statements"]


def mark_statements(using: str, model: Any, *, with_grantor: bool) -> MarkStatements:
    """Build the statements of the mark *model* for the connection of the alias *using* (no query is sent)."""
    connection = connections[using]
    quote = connection.ops.quote_name
    meta = model._meta
    return build_mark_statements(
        connection.vendor,
        quote(meta.db_table),
        resource=quote(meta.get_field("resource").column),
        token=quote(meta.get_field("token").column),
        grantor=quote(meta.get_field("grantor").column) if with_grantor else None,
        param=lambda name: "%s",
    )


def has_field(model: Any, name: str) -> bool:
    """Whether *model* has a field named *name*."""
    try:
        model._meta.get_field(name)
    except FieldDoesNotExist:
        return False
    return True
