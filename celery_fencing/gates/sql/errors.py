"""Which SQLAlchemy failures mean the database is unavailable, and the GateUnavailableError they become.

The gate's own statements wrap every SQLAlchemy error; statements that are
partly the caller's (column mode's ``UPDATE``, the caller's COMMIT) wrap only
the failures in :data:`UNAVAILABLE`, so the caller's constraint violations
propagate unchanged.
"""

from __future__ import annotations

from typing import NoReturn

from sqlalchemy import exc as sa_exc

from ..unavailable import unavailable_error

__all__ = ["UNAVAILABLE", "is_unavailable", "unavailable"]

# Connection-level failures: the storage could not be reached or gave up
# (timeouts, deadlocks, serialisation failures are OperationalError too).
UNAVAILABLE = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError, sa_exc.TimeoutError)


def is_unavailable(exc: sa_exc.SQLAlchemyError) -> bool:
    """Whether *exc* says the database failed, rather than refused a statement of the caller's."""
    return isinstance(exc, UNAVAILABLE) or bool(getattr(exc, "connection_invalidated", False))


def unavailable(exc: sa_exc.SQLAlchemyError, doing: str) -> NoReturn:
    """Raise :class:`~celery_fencing.GateUnavailableError` for *exc*, met while *doing*, with *exc* chained."""
    raise unavailable_error(exc, doing, store="SQL gate", gate="SQLGate") from exc
