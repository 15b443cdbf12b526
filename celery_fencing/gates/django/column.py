"""Column mode in Django: a ``fence`` field on the caller's own row is its mark, advanced by one ``UPDATE``.

``queryset.filter(<fence IS NULL OR fence <= t>[, resource][, grantor]).update(**values,
fence=t)``; when it changes nothing, the rows it aimed at are read to tell why
(:func:`~celery_fencing.gates.refusal.raise_why_refused`). The mark table plays
no part. :func:`fenced_update` belongs to no gate and verifies no token's
origin; :meth:`DjangoGate.fenced_update <celery_fencing.DjangoGate.fenced_update>`
verifies first, then runs :func:`update_fenced`.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, transaction
from django.db.models import Q, QuerySet

from ...context import applied_record, resolve_token
from ...exceptions import FencingConfigurationError, StaleTokenError
from ...token import FencingToken
from ..applied_sql import already_applied
from ..refusal import raise_why_refused
from .applied import AppliedTable, default_applied_table
from .errors import UNAVAILABLE, unavailable
from .marks import has_field

__all__ = ["fenced_update", "update_fenced"]


def fenced_update(
    queryset: QuerySet[Any],
    token: FencingToken | None,
    *,
    fence_field: str = "fence",
    resource_field: str | None = None,
    grantor_field: str | None = None,
    **values: Any,
) -> int:
    """``queryset.update(**values, fence=t)`` where the fence allows it: one conditional UPDATE.

    Issues ``UPDATE ... SET <values>, fence = :t WHERE <queryset's filter> AND
    (fence IS NULL OR fence <= :t)``: the row's *fence_field* (a nullable
    ``BigIntegerField``; NULL means never fenced) is its mark, and a token
    below it changes nothing. With *resource_field*, the row must also belong
    to ``token.resource`` (``AND <resource_field> = :resource``), so a token
    of another resource, however large, cannot write it. *values* may hold
    expressions, so ``balance=F("balance") + 10`` is a fenced deposit in one
    statement.

    With *grantor_field* (a nullable ``CharField``), the row's fence belongs to
    a grantor, checked and set in the same UPDATE (``AND (<grantor_field> IS
    NULL OR <grantor_field> = :grantor)``, ``SET <grantor_field> = :grantor``): a
    token of another grantor raises :class:`~celery_fencing.GrantorMismatchError`
    and changes nothing, and a row whose grantor is NULL takes the token's. A
    token without a grantor is checked by its value only and leaves the field
    as it is.

    The queryset should select one row (its primary key): each matched row is
    fenced by its own column. To claim a row before reading it, call this with
    no *values*: it raises the fence alone. Column mode does not consult the
    mark table (``DjangoGate.claim`` does not fence these rows, nor the other
    way round). It belongs to no gate, so it verifies no token's origin: with
    a verifier, call :meth:`DjangoGate.fenced_update`, which checks it first.

    Exactly once: inside a fenced execution with ``once`` on, an UPDATE with
    *values* (not a claim) that changed rows is followed by the applied-record upsert (table
    ``fencing_applied``, see :class:`DjangoGate`) on the queryset's
    database, in the caller's ``transaction.atomic(using=...)`` block (in
    autocommit, in an atomic block of its own around both). When the record
    refuses (``AlreadyAppliedError``) the UPDATE has run: the block is marked
    for rollback; let the exception leave it.

    :returns: the number of rows updated; 0 when no row matches the queryset.
    :raises StaleTokenError: a matching row's fence is above the token
        (``high_water`` is that fence; nothing changed).
    :raises AlreadyAppliedError: another execution of this task id applied on
        the resource (``superseded`` when its recorded token, ``applied_token``,
        is above this one; ``high_water`` is the row's fence when the UPDATE was refused).
    :raises ResourceMismatchError: a matching row belongs to another resource.
    :raises GrantorMismatchError: a matching row's fence belongs to another grantor.
    :raises InvalidTokenError: bad token, before any I/O.
    :raises FencingConfigurationError: no such field, or *values* sets the fence or grantor field.
    :raises GateUnavailableError: the connection failed, or the applied-record
        table is missing; other database errors (your constraints) propagate unchanged.
    """
    return update_fenced(
        queryset,
        resolve_token(token),
        default_applied_table(),
        fence_field=fence_field,
        resource_field=resource_field,
        grantor_field=grantor_field,
        **values,
    )


def update_fenced(
    queryset: QuerySet[Any],
    checked: FencingToken,
    applied: AppliedTable,
    *,
    fence_field: str = "fence",
    resource_field: str | None = None,
    grantor_field: str | None = None,
    **values: Any,
) -> int:
    """:func:`fenced_update` for a token already resolved (and verified), recording in *applied*."""
    for name in (fence_field, grantor_field):
        if name is not None and name in values:
            raise FencingConfigurationError(f"values must not set the field {name!r}: the gate sets it")
    meta = queryset.model._meta
    for name in (fence_field, resource_field, grantor_field):
        if name is not None and not has_field(queryset.model, name):
            raise FencingConfigurationError(f"model {meta.label} has no field {name!r}")
    condition = Q(**{f"{fence_field}__isnull": True}) | Q(**{f"{fence_field}__lte": checked.value})
    if resource_field is not None:
        condition &= Q(**{resource_field: checked.resource})
    assignments = {**values, fence_field: checked.value}
    if grantor_field is not None and checked.grantor is not None:
        # Only with a grantor: a token without one is checked by value, as before grantor ids.
        condition &= Q(**{f"{grantor_field}__isnull": True}) | Q(**{grantor_field: checked.grantor})
        assignments[grantor_field] = checked.grantor
    alias = queryset.db
    connection = connections[alias]
    # No values is a claim of the row, not an effect: it neither records nor checks, as claim() does.
    record = applied_record(checked) if values else None
    if record is not None and not connection.in_atomic_block:
        # In autocommit the UPDATE would commit before its record: one block of its own holds both.
        try:
            with transaction.atomic(using=alias):
                return update_fenced(
                    queryset,
                    checked,
                    applied,
                    fence_field=fence_field,
                    resource_field=resource_field,
                    grantor_field=grantor_field,
                    **values,
                )
        except UNAVAILABLE as exc:
            unavailable(exc, "committing a fenced update")
    try:
        # The UPDATE before the applied table's existence check, as in _advance: on SQLite
        # a block that read first cannot upgrade to a writer while another process writes
        # ("database is locked" at once). A missing table still fails before any commit.
        count: int = queryset.filter(condition).update(**assignments)
        if record is not None:
            with connection.cursor() as cursor:
                applied.check(alias, cursor)
        if count:
            if record is None:
                return count
            with connection.cursor() as cursor:
                if applied.record(alias, cursor, checked, record):
                    return count
                _, applied_token = applied.other(alias, cursor, checked, record)
            transaction.set_rollback(True, using=alias)
            raise already_applied(checked.resource, record.task_id, checked.value, applied_token)
        # Nothing updated: tell "no such row" from "stale", "another resource's row" and
        # "another grantor's fence". In a block, FOR UPDATE reads the latest committed row
        # rather than a snapshot.
        probe = queryset.select_for_update() if connection.in_atomic_block else queryset
        rows = list(probe.values_list(fence_field, resource_field or fence_field, grantor_field or fence_field))
        try:
            raise_why_refused(
                checked, rows, check_owner=resource_field is not None, check_grantors=grantor_field is not None
            )
        except StaleTokenError as stale:
            if record is None:
                raise
            with connection.cursor() as cursor:
                other, applied_token = applied.other(alias, cursor, checked, record)
            if not other:
                raise
            raise already_applied(
                checked.resource, record.task_id, checked.value, applied_token, stale.high_water
            ) from None
    except UNAVAILABLE as exc:
        unavailable(exc, "fenced update")
    return 0
