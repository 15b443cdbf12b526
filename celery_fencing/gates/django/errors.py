"""Which Django database errors mean the database is unavailable, and the GateUnavailableError they become.

The gate's own statements wrap every ``DatabaseError``; around the caller's
statements (the block's, column mode's queryset) only :data:`UNAVAILABLE` is
wrapped, so the caller's constraint violations propagate unchanged.
"""

from __future__ import annotations

from typing import NoReturn

from django.db import InterfaceError, OperationalError

from ..unavailable import unavailable_error

__all__ = ["UNAVAILABLE", "unavailable"]

# Connection-level failures of statements that are not the gate's own (column mode).
UNAVAILABLE = (OperationalError, InterfaceError)


def unavailable(exc: Exception, doing: str) -> NoReturn:
    """Raise :class:`~celery_fencing.GateUnavailableError` for *exc*, met while *doing*, with *exc* chained."""
    raise unavailable_error(exc, doing, store="Django gate", gate="DjangoGate") from exc
