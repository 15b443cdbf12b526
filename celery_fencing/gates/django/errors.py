"""Which Django database errors mean the database is unavailable, and the GateUnavailableError they become.

The gate's own statements wrap every ``DatabaseError``; around the caller's
statements (the block's, column mode's queryset) only :data:`UNAVAILABLE` is
wrapped, so the caller's constraint violations propagate unchanged.
"""

from __future__ import annotations

from typing import NoReturn

from django.db import InterfaceError, OperationalError

from ...exceptions import GateUnavailableError

__all__ = ["UNAVAILABLE", "unavailable"]

# Connection-level failures of statements that are not the gate's own (column mode).
UNAVAILABLE = (OperationalError, InterfaceError)


def unavailable(exc: Exception, doing: str) -> NoReturn:
    """Raise :class:`~celery_fencing.GateUnavailableError` for *exc*, met while *doing*, with *exc* chained."""
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    raise GateUnavailableError(
        f"Django gate failed while {doing}: {type(exc).__name__}: {first_line}", gate="DjangoGate"
    ) from exc
