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
  (``INSERT ... ON CONFLICT (resource) DO UPDATE SET token = excluded.token
  WHERE fencing_high_water.token <= excluded.token``; rowcount 0 means stale).
  It takes the row's lock, which serialises every writer of the resource until
  the outermost block commits, so your ORM writes in the block commit
  atomically with the mark, and a refused token rolls back with them.
* **Column mode** (:func:`fenced_update`): for a one-row write on your own
  model, a ``fence`` field on that row is the mark, checked and advanced by the
  queryset's single ``UPDATE ... SET ..., fence = :t WHERE ... AND (fence IS
  NULL OR fence <= :t)``.

The mark model is :class:`celery_fencing.contrib.django.models.HighWaterMark`
(table ``fencing_high_water``, the same table SQLGate uses): add
``"celery_fencing.contrib.django"`` to ``INSTALLED_APPS`` and ``migrate``.

Databases: PostgreSQL and SQLite (3.24+ for the upsert). MySQL and MariaDB are
refused for now: their default collations compare ``"Acct"``, ``"acct"`` and
``"acct "`` equal, which would merge resources, and the model would need a
binary column there (SQLGate has one). On SQLite the whole database is the
lock: writers of all resources serialise.

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

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, NoReturn

from django.core.exceptions import FieldDoesNotExist
from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.db.models import Q, QuerySet

from ..context import resolve_token
from ..exceptions import FencingConfigurationError, GateUnavailableError, ResourceMismatchError, StaleTokenError
from ..token import FencingToken, validate_resource

__all__ = ["SUPPORTED_VENDORS", "DjangoGate", "fenced_update"]

#: Django database vendors the gate supports.
SUPPORTED_VENDORS = frozenset({"postgresql", "sqlite"})

# Connection-level failures of statements that are not the gate's own (column mode).
_UNAVAILABLE = (OperationalError, InterfaceError)


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
        same two fields, ``resource`` (primary key) and ``token``.
    :raises FencingConfigurationError: an unknown alias or an unsupported database.
    """

    def __init__(self, using: str = DEFAULT_DB_ALIAS, *, model: Any = None) -> None:
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
        self._vendor = vendor
        self._upsert: str | None = None
        self._select: str | None = None

    def _statements(self) -> tuple[str, str]:
        # Built on first use: quoting needs the connection's operations, not a connection.
        if self._upsert is None or self._select is None:
            quote = connections[self.using].ops.quote_name
            meta = self.model._meta
            table = quote(meta.db_table)
            resource = quote(meta.get_field("resource").column)
            token = quote(meta.get_field("token").column)
            self._upsert = (
                f"INSERT INTO {table} ({resource}, {token}) VALUES (%s, %s) "
                f"ON CONFLICT ({resource}) DO UPDATE SET {token} = excluded.{token} "
                f"WHERE {table}.{token} <= excluded.{token}"
            )
            self._select = f"SELECT {token} FROM {table} WHERE {resource} = %s"
        return self._upsert, self._select

    # Gate protocol ------------------------------------------------------------

    def claim(self, token: FencingToken | None = None) -> None:
        """Raise the mark of ``token.resource`` to ``token.value``, in an atomic block of its own.

        Inside an enclosing ``atomic()`` block the new mark commits with it.

        :raises StaleTokenError: the mark is above the token (nothing changed).
        :raises InvalidTokenError: bad token, before any I/O.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        with self.transaction(token):
            pass

    def high_water(self, resource: str) -> int | None:
        """Return the resource's mark, or ``None`` if it was never claimed.

        :raises InvalidTokenError: bad resource name.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        validate_resource(resource)
        _, select = self._statements()
        try:
            with connections[self.using].cursor() as cursor:
                cursor.execute(select, [resource])
                row = cursor.fetchone()
        except DatabaseError as exc:
            _unavailable(exc, "reading the mark")
        return None if row is None else int(row[0])

    # Transaction mode ---------------------------------------------------------

    def transaction(self, token: FencingToken | None = None) -> AbstractContextManager[Any]:
        """An atomic block fenced by *token*: ``with gate.transaction(token): ...ORM writes...``.

        Entering opens ``transaction.atomic(using=...)`` and advances the mark
        with one conditional upsert, whose row lock holds off every other
        writer of the resource until the outermost block ends. Leaving
        normally commits data and mark together (or releases the savepoint,
        when nested in your own ``atomic()``); any exception rolls both back
        and propagates. The block gets the database connection (for raw SQL).

        The token is checked when this method is called, before any I/O.

        :raises StaleTokenError: on entering, for a token below the mark (rolled back).
        :raises InvalidTokenError: bad token, before any I/O.
        :raises GateUnavailableError: the database failed or could not be
            reached, on entering or at COMMIT.
        """
        return self._transaction(resolve_token(token))

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
        ``StaleTokenError`` the innermost block is marked for rollback (Django
        rolls it back when it ends, even if the error is caught inside it,
        and refuses further queries in it): stale writes can never commit.

        :raises StaleTokenError: the token is below the mark.
        :raises InvalidTokenError: bad token, before any I/O.
        :raises FencingConfigurationError: not inside ``transaction.atomic(using=...)``:
            in autocommit the mark would be committed apart from the data.
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        checked = resolve_token(token)
        connection = connections[self.using]
        if not connection.in_atomic_block:
            raise FencingConfigurationError(
                f"guard() needs an atomic block on database {self.using!r} (with transaction.atomic(using=...)): "
                "without one the mark would be committed apart from the data"
            )
        self._advance(connection, checked)

    def _advance(self, connection: Any, token: FencingToken) -> None:
        upsert, select = self._statements()
        try:
            with connection.cursor() as cursor:
                cursor.execute(upsert, [token.resource, token.value])
                if cursor.rowcount != 0:
                    return
                # The DO UPDATE ... WHERE refused. The row is locked (ON CONFLICT locks
                # the conflicting row even when WHERE fails): this reads the refusing mark.
                cursor.execute(select, [token.resource])
                row = cursor.fetchone()
        except DatabaseError as exc:
            _unavailable(exc, "advancing the mark")
        transaction.set_rollback(True, using=self.using)
        raise StaleTokenError(resource=token.resource, token=token.value, high_water=None if row is None else row[0])

    def __repr__(self) -> str:
        return f"DjangoGate(using={self.using!r}, model={self.model.__name__})"


def fenced_update(
    queryset: QuerySet[Any],
    token: FencingToken | None,
    *,
    fence_field: str = "fence",
    resource_field: str | None = None,
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

    The queryset should select one row (its primary key): each matched row is
    fenced by its own column. To claim a row before reading it, call this with
    no *values*: it raises the fence alone. Column mode does not consult the
    mark table (``DjangoGate.claim`` does not fence these rows, nor the other
    way round).

    :returns: the number of rows updated; 0 when no row matches the queryset.
    :raises StaleTokenError: a matching row's fence is above the token
        (``high_water`` is that fence; nothing changed).
    :raises ResourceMismatchError: a matching row belongs to another resource.
    :raises InvalidTokenError: bad token, before any I/O.
    :raises FencingConfigurationError: no such field, or *values* sets the fence.
    :raises GateUnavailableError: the connection failed; other database errors
        (your constraints) propagate unchanged.
    """
    checked = resolve_token(token)
    if fence_field in values:
        raise FencingConfigurationError(f"values must not set the fence field {fence_field!r}: the gate sets it")
    meta = queryset.model._meta
    for name in (fence_field, resource_field):
        if name is not None:
            try:
                meta.get_field(name)
            except FieldDoesNotExist:
                raise FencingConfigurationError(f"model {meta.label} has no field {name!r}") from None
    condition = Q(**{f"{fence_field}__isnull": True}) | Q(**{f"{fence_field}__lte": checked.value})
    if resource_field is not None:
        condition &= Q(**{resource_field: checked.resource})
    try:
        count: int = queryset.filter(condition).update(**values, **{fence_field: checked.value})
        if count:
            return count
        # Nothing updated: tell "no such row" from "stale" and "another resource's row".
        # In a block, FOR UPDATE reads the latest committed row rather than a snapshot.
        connection = connections[queryset.db]
        probe = queryset.select_for_update() if connection.in_atomic_block else queryset
        fields = [fence_field] if resource_field is None else [fence_field, resource_field]
        rows = list(probe.values_list(*fields))
    except _UNAVAILABLE as exc:
        _unavailable(exc, "fenced update")
    if resource_field is not None:
        for row in rows:
            if row[1] != checked.resource:
                raise ResourceMismatchError(
                    f"row belongs to resource {row[1]!r}, not {checked.resource!r}",
                    token_resource=checked.resource,
                    expected_resource=row[1],
                )
    fences = [row[0] for row in rows if row[0] is not None and row[0] > checked.value]
    if fences:
        raise StaleTokenError(resource=checked.resource, token=checked.value, high_water=max(fences))
    return 0


def _unavailable(exc: Exception, doing: str) -> NoReturn:
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    raise GateUnavailableError(
        f"Django gate failed while {doing}: {type(exc).__name__}: {first_line}", gate="DjangoGate"
    ) from exc
