"""A database's failure as GateUnavailableError, in the same words for every SQL store; no driver import.

SQLGate, DjangoGate and SQLIdempotencyStore each decide which of their
driver's errors mean "unavailable" (their ``errors`` modules); the error they
raise, with the driver's exception chained, is built here.
"""

from __future__ import annotations

from ..exceptions import GateUnavailableError

__all__ = ["unavailable_error"]


def unavailable_error(exc: BaseException, doing: str, *, store: str, gate: str) -> GateUnavailableError:
    """The error of *store* (``"SQL gate"``) that met *exc* while *doing*: raise it ``from exc``.

    The message names the driver's exception and its first line only: a
    driver's later lines (the SQL, its parameters) stay in the chained one.
    """
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return GateUnavailableError(f"{store} failed while {doing}: {type(exc).__name__}: {first_line}", gate=gate)
