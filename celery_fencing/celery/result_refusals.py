"""What a fenced result backend does with a refusal: its words, the error a claim raises, the report of a dropped write.

Shared by the fenced result backends (Redis, SQLAlchemy, django-celery-results).
A refusal is a ``(kind, detail)`` pair, the kinds of
:mod:`celery_fencing.gates.redis_scripts`' table (``stale``, ``grantor``,
``owner``, ``applied``, ``superseded``, ``tokenless``, ``floor``, ...): the
Redis backend's Lua scripts return them, the database backends' Python rules
(:mod:`celery_fencing.celery.db_fence`) decide them.

A refused claim or seal raises (the task turns it into its stale policy); a
refused result write is dropped and reported, never raised: an exception
inside the backend would kill a solo worker or make the prefork parent write
FAILURE with no check.
"""

from __future__ import annotations

import logging
from typing import Any

from ..context import Execution
from ..exceptions import (
    AlreadyAppliedError,
    BelowFloorError,
    FencingError,
    GateUnavailableError,
    GrantorMismatchError,
    StaleTokenError,
)
from ..token import FencingToken
from . import signals

__all__ = ["execution_of", "refusal_error", "refusal_reason", "report_refused_write", "token_of"]

logger = logging.getLogger("celery_fencing")


def token_of(request: Any) -> FencingToken | None:
    """The fencing token a result write carries (set by FencedTask on the request), or ``None``."""
    token = getattr(request, "fencing_token", None) if request is not None else None
    return token if isinstance(token, FencingToken) else None


def execution_of(request: Any) -> Execution | None:
    """The fenced execution that writes (set by FencedTask on the request), or ``None``."""
    execution = getattr(request, "fencing_execution", None) if request is not None else None
    return execution if isinstance(execution, Execution) else None


def refusal_reason(kind: str, detail: str, token: FencingToken | None) -> str:
    """What a refusal of a result claim or write means, in words (for errors and logs)."""
    if kind == "tokenless":
        return f"tokenless write {detail}"
    if kind == "owner":
        return f"token of resource {token.resource if token else None} for a result of {detail}"
    if kind == "grantor":
        return f"token of grantor {token.grantor if token else None} for a result fenced by grantor {detail}"
    if kind in ("applied", "superseded"):
        return "another execution of the task sealed it"
    if kind == "corrupt":
        return (
            "the store's floor key holds no valid floor" if detail == "floor" else "the fence hash holds no valid mark"
        )
    if kind == "floor" and detail.isdigit():
        return (
            f"token below the store's floor {int(detail)} (the store lost its data, or was new, "
            "after the token was minted or its block reserved)"
        )
    if kind == "unarmed":
        return "the store holds no floor (new, or it lost its data)"
    return "stale token"


def refusal_error(kind: str, detail: str, task_id: str, token: FencingToken) -> FencingError:
    """The error a refused claim or seal of *task_id*'s result raises."""
    mark = int(detail) if detail.isdigit() else None
    if kind == "floor" and mark is not None:
        return BelowFloorError(resource=token.resource, token=token.value, floor=mark)
    if kind in ("applied", "superseded"):
        return AlreadyAppliedError(
            f"task {task_id} is done: another execution of it sealed its result",
            resource=token.resource,
            task_id=task_id,
            superseded=kind == "superseded",
            applied_token=mark,
        )
    reason = refusal_reason(kind, detail, token)
    if kind == "corrupt":
        # Not a newer execution: the store is unusable until an operator repairs it.
        return GateUnavailableError(f"result of task {task_id}: {reason}", gate="FencedRedisBackend")
    if kind == "grantor":
        return GrantorMismatchError(
            f"result of task {task_id}: {reason}",
            resource=token.resource,
            token_grantor=token.grantor,
            expected_grantor=detail,
        )
    return StaleTokenError(
        f"result of task {task_id} is fenced by a newer execution ({reason})",
        resource=token.resource,
        token=token.value,
        high_water=mark,
    )


def report_refused_write(
    backend: Any, task_id: str, state: str, token: FencingToken | None, kind: str, detail: str
) -> None:
    """Log and signal a result write that was not stored (it is never raised).

    ``applied``/``superseded``: a duplicate made harmless (``duplicate_prevented``,
    logged at INFO): the sealing execution's result stands. Any other kind: a
    dropped write (``result_dropped``, logged as a warning, counted by the metrics).
    """
    if kind in ("applied", "superseded"):
        logger.info("task %s already applied by another execution: its %s result is not stored again", task_id, state)
        signals.duplicate_prevented.send(
            sender=backend,
            task_id=task_id,
            resource=token.resource if token else None,
            phase="result",
            action="ignore",
            error=None,
        )
        return
    reason = refusal_reason(kind, detail, token)
    high_water = int(detail) if detail.isdigit() else None
    logger.warning(
        "dropped %s result of task %s: %s (token %s, high-water mark %s)",
        state,
        task_id,
        reason,
        token.value if token else None,
        high_water,
    )
    signals.result_dropped.send(
        sender=backend, task_id=task_id, state=state, token=token, high_water=high_water, reason=reason
    )
