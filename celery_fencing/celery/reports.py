"""What a fenced task says when an execution is fenced out or found to be a duplicate: one log line and a signal.

Each fact once, at a level that fits: a retry under contention is normal
operation (INFO), and so is a deferral to a newer copy of the same task (a
re-delivery made harmless); dropped or failed work is not (WARNING), an
outage of the grantor or a gate's store is a WARNING worth its own words, and
a duplicate made harmless by exactly-once is INFO. Every line names the task, its id,
the phase and the resource; the signals carry the same facts for metrics.
"""

from __future__ import annotations

import logging
from typing import Any

from ..exceptions import (
    AlreadyAppliedError,
    FencingError,
    GateUnavailableError,
    StaleTokenError,
    TokenUnavailableError,
)
from ..policies import Decision
from ..token import FencingToken
from . import signals

__all__ = ["report_duplicate", "report_fenced_out"]

logger = logging.getLogger("celery_fencing")


def report_fenced_out(task: Any, exc: FencingError, resource: str, phase: str, decision: Decision) -> None:
    """Log and signal that *task*'s current execution was fenced out at *phase*, and what the policy decided."""
    request = task.request
    token = getattr(exc, "token", None)
    high_water = getattr(exc, "high_water", None)
    if token is None:
        current: FencingToken | None = request.get("fencing_token")
        token = current.value if current is not None else None
    outcome = decision.action + (f" in {decision.countdown:.2f}s" if decision.countdown is not None else "")
    if decision.action == "defer":
        outcome += " (a newer execution of this task holds it: the retry finds the task applied, or applies it)"
    if isinstance(exc, (TokenUnavailableError, GateUnavailableError)):
        # Not a newer execution: an outage (grantor or gate store down) is worth a warning.
        logger.warning(
            "task %s[%s] %s on %r (%s unavailable: %s) -> %s",
            task.name,
            request.id,
            "got no token" if phase == "mint" else f"could not {phase}",
            resource,
            "grantor" if isinstance(exc, TokenUnavailableError) else "storage",
            exc,
            outcome,
        )
    else:
        # The token and the mark are in the line, so a stale-token error's default
        # message (which repeats them) is left out; any other message is kept.
        said = "" if _says_only_token_and_mark(exc) else f": {exc}"
        logger.log(
            logging.INFO if decision.action in ("retry", "defer") else logging.WARNING,
            "task %s[%s] fenced out at %s on %r (token %s, high-water mark %s)%s -> %s",
            task.name,
            request.id,
            phase,
            resource,
            token,
            high_water,
            said,
            outcome,
        )
    signals.fencing_rejected.send(
        sender=task,
        task_id=request.id,
        resource=resource,
        token=token,
        high_water=high_water,
        error=exc,
        action=decision.action,
        phase=phase,
    )


def report_duplicate(task: Any, exc: AlreadyAppliedError, resource: str, phase: str, action: str) -> None:
    """Log and signal that *task*'s current execution found its task id applied by another execution."""
    request = task.request
    logger.info(
        "task %s[%s] already applied on %r by another execution (at %s): not applied again -> %s",
        task.name,
        request.id,
        resource,
        phase,
        action,
    )
    signals.duplicate_prevented.send(
        sender=task, task_id=request.id, resource=resource, phase=phase, action=action, error=exc
    )


def _says_only_token_and_mark(exc: FencingError) -> bool:
    """Whether *exc* is a StaleTokenError whose message is the default one: resource, token and mark."""
    if type(exc) is not StaleTokenError:
        return False
    default = StaleTokenError(resource=exc.resource, token=exc.token, high_water=exc.high_water)
    return str(exc) == str(default)
