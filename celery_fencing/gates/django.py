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

from ..context import resolve_token
from ..exceptions import FencingConfigurationError, GateUnavailableError, StaleTokenError
from ..protocols import TokenVerifier
from ..token import FencingToken, Mark, check_grantor, validate_resource
from .refusal import raise_why_refused

__all__ = ["SUPPORTED_VENDORS", "DjangoGate", "fenced_update"]

log = logging.getLogger(__name__)

#: Django database vendors the gate supports.
SUPPORTED_VENDORS = frozenset({"postgresql", "sqlite"})

# Connection-level failures of statements that are not the gate's own (column mode).
_UNAVAILABLE = (OperationalError, InterfaceError)


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
    :raises FencingConfigurationError: an unknown alias or an unsupported database.
    """

    def __init__(
        self, using: str = DEFAULT_DB_ALIAS, *, model: Any = None, verifier: TokenVerifier | None = None
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
        with self.transaction(token):
            pass

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

        :raises StaleTokenError: on entering, for a token below the mark (rolled back).
        :raises GrantorMismatchError: on entering, for a token of another grantor (rolled back).
        :raises InvalidTokenError: bad token (or one the verifier refuses), before any I/O.
        :raises GateUnavailableError: the database failed or could not be
            reached, on entering or at COMMIT.
        """
        return self._transaction(self._checked(token))

    @contextmanager
    def _transaction(self, token: FencingToken) -> Iterator[Any]:
        connection = connections[self.using]
        phase = "connecting"
        try:
            with transaction.atomic(using=self.using):
                phase = "advancing the mark"
                self._advance(connection, token)
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

        :raises StaleTokenError: the token is below the mark.
        :raises GrantorMismatchError: the mark belongs to another grantor.
        :raises InvalidTokenError: bad token (or one the verifier refuses), before any I/O.
        :raises FencingConfigurationError: not inside ``transaction.atomic(using=...)``:
            in autocommit the mark would be committed apart from the data.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        checked = self._checked(token)
        connection = connections[self.using]
        if not connection.in_atomic_block:
            raise FencingConfigurationError(
                f"guard() needs an atomic block on database {self.using!r} (with transaction.atomic(using=...)): "
                "without one the mark would be committed apart from the data"
            )
        self._advance(connection, checked)

    def _advance(self, connection: Any, token: FencingToken) -> None:
        sql = self._statements()
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql.upsert, self._mark_params(token))
                if cursor.rowcount != 0:
                    return
                # The DO UPDATE ... WHERE refused. The row is locked (ON CONFLICT locks
                # the conflicting row even when WHERE fails): this reads the refusing mark.
                cursor.execute(sql.select, [token.resource])
                row = cursor.fetchone()
        except DatabaseError as exc:
            _unavailable(exc, "advancing the mark")
        transaction.set_rollback(True, using=self.using)
        if row is not None:
            check_grantor(token, row[1])  # another grantor's mark is the news, whatever the values
        raise StaleTokenError(resource=token.resource, token=token.value, high_water=None if row is None else row[0])

    # Column mode --------------------------------------------------------------

    def fenced_update(self, queryset: QuerySet[Any], token: FencingToken | None, **options: Any) -> int:
        """:func:`fenced_update` with this gate's verifier: the token's origin is checked first, before any I/O.

        *options* (the fields and *values*), the result and the errors are
        those of :func:`fenced_update`. Column mode does not use the gate's
        database alias or mark table: the queryset's own database and the
        row's fence decide.

        :raises InvalidTokenError: bad token (or one the verifier refuses), before any I/O.
        """
        return fenced_update(queryset, self._checked(token), **options)

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

    :returns: the number of rows updated; 0 when no row matches the queryset.
    :raises StaleTokenError: a matching row's fence is above the token
        (``high_water`` is that fence; nothing changed).
    :raises ResourceMismatchError: a matching row belongs to another resource.
    :raises GrantorMismatchError: a matching row's fence belongs to another grantor.
    :raises InvalidTokenError: bad token, before any I/O.
    :raises FencingConfigurationError: no such field, or *values* sets the fence or grantor field.
    :raises GateUnavailableError: the connection failed; other database errors
        (your constraints) propagate unchanged.
    """
    checked = resolve_token(token)
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
    try:
        count: int = queryset.filter(condition).update(**assignments)
        if count:
            return count
        # Nothing updated: tell "no such row" from "stale", "another resource's row" and
        # "another grantor's fence". In a block, FOR UPDATE reads the latest committed row
        # rather than a snapshot.
        connection = connections[queryset.db]
        probe = queryset.select_for_update() if connection.in_atomic_block else queryset
        rows = list(probe.values_list(fence_field, resource_field or fence_field, grantor_field or fence_field))
    except _UNAVAILABLE as exc:
        _unavailable(exc, "fenced update")
    raise_why_refused(checked, rows, check_owner=resource_field is not None, check_grantors=grantor_field is not None)
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
