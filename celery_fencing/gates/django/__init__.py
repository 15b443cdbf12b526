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

One role per module, as in :mod:`celery_fencing.gates.sql`:

* :mod:`.gate`: :class:`DjangoGate`: the Gate protocol, transaction mode, reads, the operator's reset;
* :mod:`.column`: column mode, :func:`fenced_update` of a queryset;
* :mod:`.marks`: the mark model's SQL, quoted for one connection;
* :mod:`.applied`: exactly once, :mod:`celery_fencing.gates.applied_sql`'s SQL on a Django cursor;
* :mod:`.errors`: which Django failures mean the database is unavailable.
"""

from __future__ import annotations

from .column import fenced_update
from .gate import SUPPORTED_VENDORS, DjangoGate

__all__ = ["SUPPORTED_VENDORS", "DjangoGate", "fenced_update"]
