"""A gate in the Django ORM: the mark is a row of a model, advanced inside ``transaction.atomic()``.

The same story as :mod:`celery_fencing.gates.sql`, for Django code::

    t=0   A holds token 33 for "account:42": it claims (the mark goes to 33),
          reads the balance (100), and pauses
    t=30  B gets token 34: it claims (mark 34) and writes 110 in
          ``with gate.transaction(token):``, which commits data and mark together
    t=41  A resumes and opens ``gate.transaction(33)``: the upsert refuses it
          (33 < 34), the block never runs, and A gets StaleTokenError(high_water=34)

It mirrors :class:`~celery_fencing.SQLGate` exactly; only the plumbing is Django's.

* **Transaction mode** (:meth:`DjangoGate.transaction`, :meth:`DjangoGate.guard`):
  the first statement of the atomic block is one conditional upsert of the
  resource's row in the mark table
  (``INSERT ... ON CONFLICT (resource) DO UPDATE SET token = excluded.token,
  grantor = COALESCE(excluded.grantor, fencing_high_water.grantor) WHERE
  fencing_high_water.token <= excluded.token AND <the grantors agree>``;
  rowcount 0 means refused).
  It takes the row's lock, which serialises every writer of the resource until
  the outermost block commits, so your ORM writes in the block commit
  atomically with the mark, and a refused token rolls back with them.
* **Column mode** (:func:`fenced_update`): for a one-row write on your own
  model, a ``fence`` field on that row is the mark, checked and advanced by the
  queryset's single ``UPDATE ... SET ..., fence = :t WHERE ... AND (fence IS
  NULL OR fence <= :t)``.

Grantors: the upsert compares the token's grantor id with the mark's in the
same statement. A token of another grantor raises
:class:`~celery_fencing.GrantorMismatchError` naming both ids and changes
nothing; a mark whose grantor is NULL (written by tokens without one, or before
migration ``0002_highwatermark_grantor``) adopts the first grantor that passes
it; a token without a grantor is compared by value only. Until that migration
has run, the gate's statements fail (``GateUnavailableError``: the column is
missing) rather than skip the check. Column mode checks grantors when given a
``grantor_field``.

The mark model is :class:`celery_fencing.contrib.django.models.HighWaterMark`
(table ``fencing_high_water``, the same table SQLGate uses): add
``"celery_fencing.contrib.django"`` to ``INSTALLED_APPS`` and ``migrate``.

Databases: PostgreSQL and SQLite (3.24+ for the upsert). MySQL and MariaDB are
refused for now: their default collations compare ``"Acct"``, ``"acct"`` and
``"acct "`` equal, which would merge resources, and the model would need a
binary column there (SQLGate has one). On SQLite the whole database is the
lock: writers of all resources serialise.

Origin checks: ``DjangoGate(verifier=...)`` (a
:class:`~celery_fencing.signing.TokenSigner` for signed mode, a
:class:`~celery_fencing.signing.PlausibilityBound`, or both with
:class:`~celery_fencing.signing.AllOf`) checks every token of ``claim``,
``transaction``, ``guard`` and :meth:`DjangoGate.fenced_update` before any
query, as the other gates do: a refused token raises
:class:`~celery_fencing.ForgedTokenError` and changes nothing. The
module-level :func:`fenced_update` belongs to no gate and verifies nothing.

Errors: bad input raises :class:`~celery_fencing.InvalidTokenError` before any
I/O. Failures of the gate's own statements (connection refused, lock timeout,
deadlock, a missing mark table) raise :class:`~celery_fencing.GateUnavailableError`
with Django's exception chained; bound them with the database's own timeouts
(``OPTIONS``: ``connect_timeout`` and ``options="-c lock_timeout=5000"`` on
PostgreSQL, ``timeout`` on SQLite). Exceptions raised by your own statements in
a block are not wrapped; they roll it back and propagate unchanged.

Thread and fork safety: Django's connections are per thread; a gate holds no
connection of its own and may be shared. After ``fork()`` close inherited
connections (``django.db.connections.close_all()``), as Celery's Django fixup
does in ``worker_process_init``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

from django.core.exceptions import FieldDoesNotExist
from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.db.models import Q, QuerySet

from ..context import AppliedRecord, applied_record, resolve_token
from ..exceptions import (
    FencingConfigurationError,
    GateUnavailableError,
    InvalidArgumentError,
    StaleTokenError,
)
from ..protocols import TokenVerifier
from ..token import FencingToken, Mark, check_grantor, validate_resource
from .applied_sql import (
    AppliedStatements,
    already_applied,
    applied_statements,
    missing_table_message,
    retention_seconds,
)
from .refusal import raise_why_refused

__all__ = ["SUPPORTED_VENDORS", "DjangoGate", "fenced_update"]

log = logging.getLogger(__name__)

#: Django database vendors the gate supports.
SUPPORTED_VENDORS = frozenset({"postgresql", "sqlite"})

# Connection-level failures of statements that are not the gate's own (column mode).
_UNAVAILABLE = (OperationalError, InterfaceError)


class _AppliedTable:
    """Exactly once: the applied-record table of one model, on whichever database alias a write uses.

    The SQL is :mod:`celery_fencing.gates.applied_sql`'s, the same SQLGate runs.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self._sql: dict[str, AppliedStatements] = {}
        self._exists: set[str] = set()

    def statements(self, alias: str) -> AppliedStatements:
        sql = self._sql.get(alias)
        if sql is None:
            connection = connections[alias]
            quote = connection.ops.quote_name
            table = quote(self.model._meta.db_table)
            sql = self._sql[alias] = applied_statements(connection.vendor, table, quote=quote, param=lambda name: "%s")
        return sql

    def check(self, alias: str, cursor: Any) -> None:
        """Fail closed, once per alias, when the table is missing: name the migration."""
        if alias in self._exists:
            return
        table = self.model._meta.db_table
        if table not in connections[alias].introspection.table_names(cursor):
            raise GateUnavailableError(
                missing_table_message(
                    table, f"run 'manage.py migrate celery_fencing' (migration 0003) on database {alias!r}"
                ),
                gate="DjangoGate",
            )
        self._exists.add(alias)

    @staticmethod
    def params(token: FencingToken, record: AppliedRecord) -> list[Any]:
        """The record's parameters, in the statements' order."""
        return [token.resource, record.task_id, record.execution_id, token.value, retention_seconds(record.retention)]

    def record(self, alias: str, cursor: Any, token: FencingToken, record: AppliedRecord) -> bool:
        """Write or refresh the record; ``False`` when a live record of another execution refused it."""
        cursor.execute(self.statements(alias).record, self.params(token, record))
        return bool(cursor.rowcount != 0)

    def find_row(self, alias: str, cursor: Any, resource: str, task_id: str) -> tuple[str, int | None] | None:
        """The execution id and token of the live record, or ``None``."""
        cursor.execute(self.statements(alias).select, [resource, task_id])
        row = cursor.fetchone()
        return None if row is None else (str(row[0]), None if row[1] is None else int(row[1]))

    def find(self, alias: str, cursor: Any, resource: str, task_id: str) -> str | None:
        """The execution id of the live record, or ``None``."""
        found = self.find_row(alias, cursor, resource, task_id)
        return None if found is None else found[0]

    def other(self, alias: str, cursor: Any, token: FencingToken, record: AppliedRecord) -> tuple[bool, int | None]:
        """(whether a live record names another execution of the task, its token): the refusal path."""
        found = self.find_row(alias, cursor, token.resource, record.task_id)
        if found is None or found[0] == record.execution_id:
            return False, None
        return True, found[1]


_default_applied: _AppliedTable | None = None


def _default_applied_table() -> _AppliedTable:
    global _default_applied
    if _default_applied is None:
        from ..contrib.django.models import AppliedRecord as AppliedRecordModel

        _default_applied = _AppliedTable(AppliedRecordModel)
    return _default_applied


@dataclass(frozen=True)
class _Statements:
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
            from ..contrib.django.models import HighWaterMark

            model = HighWaterMark
        self.using = using
        self.model = model
        self.verifier = verifier
        self._vendor = vendor
        self._with_grantor = _has_field(model, "grantor")
        if not self._with_grantor:
            log.warning(
                "mark model %s has no grantor field: tokens of another grantor (a wiped or different ZooKeeper) "
                "are not detected at this gate; add grantor = models.CharField(max_length=64, null=True)",
                model._meta.label,
            )
        self._sql: _Statements | None = None
        self._applied = _default_applied_table() if applied_model is None else _AppliedTable(applied_model)

    def _statements(self) -> _Statements:
        # Built on first use: quoting needs the connection's operations, not a connection.
        if self._sql is None:
            quote = connections[self.using].ops.quote_name
            meta = self.model._meta
            table = quote(meta.db_table)
            resource = quote(meta.get_field("resource").column)
            token = quote(meta.get_field("token").column)
            if self._with_grantor:
                grantor = quote(meta.get_field("grantor").column)
                columns, values = f"{resource}, {token}, {grantor}", "%s, %s, %s"
                set_grantor = f", {grantor} = COALESCE(excluded.{grantor}, {table}.{grantor})"
                # A mark without a grantor adopts; a token without one is compared by value.
                agree = (
                    f" AND ({table}.{grantor} IS NULL OR excluded.{grantor} IS NULL "
                    f"OR {table}.{grantor} = excluded.{grantor})"
                )
                stored_grantor, reset_grantor = grantor, f", {grantor} = %s"
                expect, expect_null = f" AND {grantor} = %s", f" AND {grantor} IS NULL"
            else:
                columns, values, set_grantor, agree = f"{resource}, {token}", "%s, %s", "", ""
                stored_grantor, reset_grantor, expect, expect_null = "NULL", "", "", ""
            reset = f"UPDATE {table} SET {token} = %s{reset_grantor} WHERE {resource} = %s AND {token} = %s"
            self._sql = _Statements(
                upsert=(
                    f"INSERT INTO {table} ({columns}) VALUES ({values}) "
                    f"ON CONFLICT ({resource}) DO UPDATE SET {token} = excluded.{token}{set_grantor} "
                    f"WHERE {table}.{token} <= excluded.{token}{agree}"
                ),
                select=f"SELECT {token}, {stored_grantor} FROM {table} WHERE {resource} = %s",
                insert_if_absent=(
                    f"INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT ({resource}) DO NOTHING"
                ),
                reset=reset + expect,
                reset_null_grantor=reset + expect_null,
            )
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
            _unavailable(exc, "reading an applied record")

    def prune_applied(self, limit: int = 1000) -> int:
        """Delete at most *limit* expired applied records, in an atomic block of its own; return how many.

        Expired records already count as absent; pruning only bounds the
        table's size. Run it periodically (a Celery beat task, cron), in a
        loop while it returns *limit*. It finds expired rows by scanning the table.

        :raises InvalidArgumentError: *limit* is not a positive int.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgumentError(f"limit must be a positive int, not {limit!r:.60}")
        prune = self._applied.statements(self.using).prune
        try:
            with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
                cursor.execute(prune, [limit])
                count: int = cursor.rowcount
        except DatabaseError as exc:
            _unavailable(exc, "pruning applied records")
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
            _unavailable(exc, "reading the mark")
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
            _unavailable(exc, "resetting the mark")
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
        except _UNAVAILABLE as exc:
            # The caller's own statements fail as they fail; the gate's BEGIN and COMMIT are the gate's.
            if phase in ("connecting", "committing"):
                _unavailable(exc, phase)
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
            _unavailable(exc, "advancing the mark")
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
        return _fenced_update(queryset, self._checked(token), self._applied, **options)

    def __repr__(self) -> str:
        return f"DjangoGate(using={self.using!r}, model={self.model.__name__})"


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
    return _fenced_update(
        queryset,
        resolve_token(token),
        _default_applied_table(),
        fence_field=fence_field,
        resource_field=resource_field,
        grantor_field=grantor_field,
        **values,
    )


def _fenced_update(
    queryset: QuerySet[Any],
    checked: FencingToken,
    applied: _AppliedTable,
    *,
    fence_field: str = "fence",
    resource_field: str | None = None,
    grantor_field: str | None = None,
    **values: Any,
) -> int:
    for name in (fence_field, grantor_field):
        if name is not None and name in values:
            raise FencingConfigurationError(f"values must not set the field {name!r}: the gate sets it")
    meta = queryset.model._meta
    for name in (fence_field, resource_field, grantor_field):
        if name is not None and not _has_field(queryset.model, name):
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
                return _fenced_update(
                    queryset,
                    checked,
                    applied,
                    fence_field=fence_field,
                    resource_field=resource_field,
                    grantor_field=grantor_field,
                    **values,
                )
        except _UNAVAILABLE as exc:
            _unavailable(exc, "committing a fenced update")
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
    except _UNAVAILABLE as exc:
        _unavailable(exc, "fenced update")
    return 0


def _has_field(model: Any, name: str) -> bool:
    try:
        model._meta.get_field(name)
    except FieldDoesNotExist:
        return False
    return True


def _unavailable(exc: Exception, doing: str) -> NoReturn:
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    raise GateUnavailableError(
        f"Django gate failed while {doing}: {type(exc).__name__}: {first_line}", gate="DjangoGate"
    ) from exc
