"""DjangoGate: the mark as a row of a model, advanced first in ``transaction.atomic()``; and its reads.

The gate checks its input (tokens, with the verifier, before any query; that
a guard runs in an atomic block), opens the atomic blocks of its own calls,
turns database failures into :class:`~celery_fencing.GateUnavailableError`,
and runs the SQL of :mod:`.marks` and :mod:`.applied`; column mode is
:mod:`.column`'s. The package docstring tells the story and the errors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.models import QuerySet

from ...context import AppliedRecord, applied_record, resolve_token
from ...exceptions import FencingConfigurationError, StaleTokenError
from ...protocols import TokenVerifier
from ...token import FencingToken, Mark, check_grantor, validate_resource
from ..applied_sql import already_applied, check_prune_limit
from .applied import AppliedTable, default_applied_table
from .column import update_fenced
from .errors import UNAVAILABLE, unavailable
from .marks import MarkStatements, has_field, mark_statements

__all__ = ["SUPPORTED_VENDORS", "DjangoGate"]

# One logger for the whole package, named as the module was before it became one.
log = logging.getLogger(__package__)

#: Django database vendors the gate supports.
SUPPORTED_VENDORS = frozenset({"postgresql", "sqlite"})


class DjangoGate:
    """Checks fencing tokens in a Django database, in the same transaction as your ORM writes.

    Semantics (see :class:`~celery_fencing.Gate`): ``claim`` raises the mark
    to the token unless the mark is above it; a guarded block accepts
    ``token >= mark`` and is refused, and rolled back, for a lower token; a
    refused or failed block leaves neither data nor mark changed.

    Data binding: in transaction mode the rows a block writes are yours to
    choose, so bind them to the resource in your schema (one resource per
    account row, and so on); column mode checks it for you with
    ``resource_field``.

    :param using: the database alias (``DATABASES`` key) of the marks and data.
    :param model: the mark model (default: ``HighWaterMark`` of the
        ``celery_fencing.contrib.django`` app); a model of your own needs the
        same fields, ``resource`` (primary key), ``token`` and ``grantor`` (a
        nullable ``CharField(max_length=64)``). Without ``grantor`` the gate
        compares values only and logs a warning: tokens of another grantor are
        not detected.
    :param verifier: checks every token's origin before it is used (signed
        mode, plausibility bound), before any I/O; see :mod:`celery_fencing.signing`.
    :param applied_model: the applied-record model (default: ``AppliedRecord``
        of the app, table ``fencing_applied``); only its table name is used.
    :raises FencingConfigurationError: an unknown alias or an unsupported database.

    Exactly once: inside a fenced execution with ``once`` on, every effect of
    the execution's own token (:meth:`transaction`, :meth:`guard`,
    :meth:`fenced_update`; not :meth:`claim`) also writes the row "task id T
    applied on resource R by execution E, holding token t" of the
    applied-record table, in the same transaction, with SQLGate's SQL.
    Another execution of T is refused with
    :class:`~celery_fencing.AlreadyAppliedError` (nothing of it commits) until
    the row expires, after the execution's retention on the database's clock;
    ``superseded`` when the row's token is above its own (a newer execution
    applied). The record is a statement of its own, after the mark upsert (or
    column mode's ``UPDATE``), on PostgreSQL too (see
    :mod:`celery_fencing.gates.applied_sql` for why). Until migration 0003 has made
    the table, such writes fail closed with ``GateUnavailableError`` naming
    ``manage.py migrate celery_fencing``.
    :meth:`prune_applied` deletes expired rows.
    """

    def __init__(
        self,
        using: str = DEFAULT_DB_ALIAS,
        *,
        model: Any = None,
        verifier: TokenVerifier | None = None,
        applied_model: Any = None,
    ) -> None:
        if not isinstance(using, str) or using not in connections.settings:
            raise FencingConfigurationError(f"no database alias {using!r} in settings.DATABASES")
        vendor = connections[using].vendor
        if vendor not in SUPPORTED_VENDORS:
            raise FencingConfigurationError(
                f"DjangoGate supports PostgreSQL and SQLite, not {vendor!r}; on MySQL/MariaDB use SQLGate, "
                "whose mark table compares resources byte for byte"
            )
        if model is None:
            from ...contrib.django.models import HighWaterMark

            model = HighWaterMark
        self.using = using
        self.model = model
        self.verifier = verifier
        self._vendor = vendor
        self._with_grantor = has_field(model, "grantor")
        if not self._with_grantor:
            log.warning(
                "mark model %s has no grantor field: tokens of another grantor (a wiped or different ZooKeeper) "
                "are not detected at this gate; add grantor = models.CharField(max_length=64, null=True)",
                model._meta.label,
            )
        self._sql: MarkStatements | None = None
        self._applied = default_applied_table() if applied_model is None else AppliedTable(applied_model)

    def _statements(self) -> MarkStatements:
        # Built on first use: quoting needs the connection's operations, not a connection.
        if self._sql is None:
            self._sql = mark_statements(self.using, self.model, with_grantor=self._with_grantor)
        return self._sql

    def _checked(self, token: FencingToken | None) -> FencingToken:
        return resolve_token(token, verifier=self.verifier)

    def _mark_params(self, token: FencingToken) -> list[Any]:
        params: list[Any] = [token.resource, token.value]
        if self._with_grantor:
            params.append(token.grantor)
        return params

    # Gate protocol ------------------------------------------------------------

    def claim(self, token: FencingToken | None = None) -> None:
        """Raise the mark of ``token.resource`` to ``token.value``, in an atomic block of its own.

        Inside an enclosing ``atomic()`` block the new mark commits with it.

        :raises StaleTokenError: the mark is above the token (nothing changed).
        :raises GrantorMismatchError: the mark belongs to another grantor (nothing changed).
        :raises InvalidTokenError: bad token (or one the verifier refuses), before any I/O.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        with self._transaction(self._checked(token), None):
            pass

    def applied(self, resource: str, task_id: str) -> str | None:
        """Return the id of the execution of *task_id* that applied on *resource*, or ``None``.

        ``None`` when no execution of the task wrote through this gate with
        exactly-once, or its record expired (on the database's clock).

        :raises InvalidTokenError: bad resource name.
        :raises GateUnavailableError: the database failed or could not be reached, or the table is missing.
        """
        validate_resource(resource)
        try:
            with connections[self.using].cursor() as cursor:
                return self._applied.find(self.using, cursor, resource, task_id)
        except DatabaseError as exc:
            unavailable(exc, "reading an applied record")

    def prune_applied(self, limit: int = 1000) -> int:
        """Delete at most *limit* expired applied records, in an atomic block of its own; return how many.

        Expired records already count as absent; pruning only bounds the
        table's size. Run it periodically (a Celery beat task, cron), in a
        loop while it returns *limit*. It finds expired rows by scanning the table.

        :raises InvalidArgumentError: *limit* is not a positive int.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        params = [check_prune_limit(limit)]
        prune = self._applied.statements(self.using).prune
        try:
            with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
                cursor.execute(prune, params)
                count: int = cursor.rowcount
        except DatabaseError as exc:
            unavailable(exc, "pruning applied records")
        return count

    def high_water(self, resource: str) -> int | None:
        """Return the resource's mark, or ``None`` if it was never claimed.

        :raises InvalidTokenError: bad resource name.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        found = self.mark(resource)
        return None if found is None else found.value

    def mark(self, resource: str) -> Mark | None:
        """Return the resource's mark with its grantor, or ``None`` if it was never claimed.

        :raises InvalidTokenError: bad resource name.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        validate_resource(resource)
        select = self._statements().select
        try:
            with connections[self.using].cursor() as cursor:
                cursor.execute(select, [resource])
                row = cursor.fetchone()
        except DatabaseError as exc:
            unavailable(exc, "reading the mark")
        return None if row is None else Mark(resource, int(row[0]), row[1])

    def reset_mark(self, token: FencingToken, *, expected: Mark | None) -> None:
        """Operator repair: set the mark to *token* (value and grantor), lower or not, if it is still *expected*.

        For ``celery-fencing rebase`` and ``repair`` only: it bypasses the
        ordering, in one conditional statement (an ``UPDATE`` matching the
        expected value and grantor, or an ``INSERT`` when there was no mark),
        in an atomic block of its own (or the caller's). The token is not
        verified. With a mark model without ``grantor`` only the value is reset.

        :raises StaleTokenError: the mark is no longer *expected* (nothing changed).
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        checked = resolve_token(token)
        sql = self._statements()
        new: list[Any] = [checked.value, checked.grantor] if self._with_grantor else [checked.value]
        try:
            with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
                if expected is None:
                    cursor.execute(sql.insert_if_absent, self._mark_params(checked))
                elif expected.grantor is None or not self._with_grantor:
                    cursor.execute(sql.reset_null_grantor, [*new, checked.resource, expected.value])
                else:
                    cursor.execute(sql.reset, [*new, checked.resource, expected.value, expected.grantor])
                if cursor.rowcount == 1:
                    return
                cursor.execute(sql.select, [checked.resource])
                row = cursor.fetchone()
        except DatabaseError as exc:
            unavailable(exc, "resetting the mark")
        current = None if row is None else Mark(checked.resource, int(row[0]), row[1])
        raise StaleTokenError(
            f"the mark of {checked.resource!r} changed since it was read ({expected} -> {current}); nothing was reset",
            resource=checked.resource,
            token=checked.value,
            high_water=None if current is None else current.value,
        )

    # Transaction mode ---------------------------------------------------------

    def transaction(self, token: FencingToken | None = None) -> AbstractContextManager[Any]:
        """An atomic block fenced by *token*: ``with gate.transaction(token): ...ORM writes...``.

        Entering opens ``transaction.atomic(using=...)`` and advances the mark
        with one conditional upsert, whose row lock holds off every other
        writer of the resource until the outermost block ends. Leaving
        normally commits data and mark together (or releases the savepoint,
        when nested in your own ``atomic()``); any exception rolls both back
        and propagates. The block gets the database connection (for raw SQL).

        The token is checked (and verified, with a verifier) when this method
        is called, before any I/O.

        With exactly-once on, entering also records the execution's task id
        (see :class:`DjangoGate`) in the block.

        :raises StaleTokenError: on entering, for a token below the mark (rolled back).
        :raises AlreadyAppliedError: on entering, another execution of this
            task id applied on the resource (rolled back).
        :raises GrantorMismatchError: on entering, for a token of another grantor (rolled back).
        :raises InvalidTokenError: bad token (or one the verifier refuses), before any I/O.
        :raises GateUnavailableError: the database failed or could not be
            reached, on entering or at COMMIT; or the applied-record table is
            missing (exactly-once on, migration 0003 not run).
        """
        checked = self._checked(token)
        return self._transaction(checked, applied_record(checked))

    @contextmanager
    def _transaction(self, token: FencingToken, record: AppliedRecord | None) -> Iterator[Any]:
        connection = connections[self.using]
        phase = "connecting"
        try:
            with transaction.atomic(using=self.using):
                phase = "advancing the mark"
                self._advance(connection, token, record)
                phase = "body"
                yield connection
                phase = "committing"
        except UNAVAILABLE as exc:
            # The caller's own statements fail as they fail; the gate's BEGIN and COMMIT are the gate's.
            if phase in ("connecting", "committing"):
                unavailable(exc, phase)
            raise

    def guard(self, token: FencingToken | None = None) -> None:
        """Advance the mark inside an ``atomic()`` block the caller already holds on the gate's database.

        Call it first in the block, before the writes it protects. On
        ``StaleTokenError`` (or ``GrantorMismatchError``) the innermost block is
        marked for rollback (Django rolls it back when it ends, even if the
        error is caught inside it, and refuses further queries in it): stale
        writes can never commit.

        With exactly-once on, it also records the execution's task id (see
        :class:`DjangoGate`); ``AlreadyAppliedError`` marks the block for
        rollback as well.

        :raises StaleTokenError: the token is below the mark.
        :raises AlreadyAppliedError: another execution of this task id applied on the resource.
        :raises GrantorMismatchError: the mark belongs to another grantor.
        :raises InvalidTokenError: bad token (or one the verifier refuses), before any I/O.
        :raises FencingConfigurationError: not inside ``transaction.atomic(using=...)``:
            in autocommit the mark would be committed apart from the data.
        :raises GateUnavailableError: the database failed or could not be reached,
            or the applied-record table is missing.
        """
        checked = self._checked(token)
        connection = connections[self.using]
        if not connection.in_atomic_block:
            raise FencingConfigurationError(
                f"guard() needs an atomic block on database {self.using!r} (with transaction.atomic(using=...)): "
                "without one the mark would be committed apart from the data"
            )
        self._advance(connection, checked, applied_record(checked))

    def _advance(self, connection: Any, token: FencingToken, record: AppliedRecord | None) -> None:
        sql = self._statements()
        applied = self._applied
        try:
            with connection.cursor() as cursor:
                # Two statements on PostgreSQL too: SQLGate folds the record into the upsert there,
                # but Django binds parameters client-side, so PostgreSQL would plan the larger
                # statement on every call, which costs more than the round trip it saves.
                # The upsert first: on SQLite a transaction that read first and then writes
                # fails at once with "database is locked" when another writer holds the lock
                # (no busy wait for a lock upgrade); a write first waits its turn.
                cursor.execute(sql.upsert, self._mark_params(token))
                accepted = cursor.rowcount != 0
                if record is not None:
                    applied.check(self.using, cursor)
                # Under the mark's row lock: no other writer of the resource checks or writes records now.
                written = accepted and (record is None or applied.record(self.using, cursor, token, record))
                if written:
                    return
                row = None
                if not accepted:
                    # The DO UPDATE ... WHERE refused. The row is locked (ON CONFLICT locks
                    # the conflicting row even when WHERE fails): this reads the refusing mark.
                    cursor.execute(sql.select, [token.resource])
                    row = cursor.fetchone()
                other, applied_token = False, None
                if record is not None:
                    other, applied_token = applied.other(self.using, cursor, token, record)
                    other = other or accepted  # the mark passed, so the record refused
        except DatabaseError as exc:
            unavailable(exc, "advancing the mark")
        transaction.set_rollback(True, using=self.using)
        high_water = None if row is None else row[0]
        if row is not None:
            check_grantor(token, row[1])  # another grantor's mark is the news, whatever the values
        if record is not None and other:
            raise already_applied(token.resource, record.task_id, token.value, applied_token, high_water)
        raise StaleTokenError(resource=token.resource, token=token.value, high_water=high_water)

    # Column mode --------------------------------------------------------------

    def fenced_update(self, queryset: QuerySet[Any], token: FencingToken | None, **options: Any) -> int:
        """:func:`fenced_update` with this gate's verifier: the token's origin is checked first, before any I/O.

        *options* (the fields and *values*), the result and the errors are
        those of :func:`fenced_update`. Column mode does not use the gate's
        database alias or mark table: the queryset's own database and the
        row's fence decide.

        With exactly-once on, the record goes to this gate's applied-record
        model's table on the queryset's database, in the same atomic block.

        :raises InvalidTokenError: bad token (or one the verifier refuses), before any I/O.
        """
        return update_fenced(queryset, self._checked(token), self._applied, **options)

    def __repr__(self) -> str:
        return f"DjangoGate(using={self.using!r}, model={self.model.__name__})"
