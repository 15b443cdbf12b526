"""Seals: the first execution of a task id to seal it is the one whose result stands and whose chain goes on.

Sealing happens when the body has returned, before Celery sends the task's
callbacks; where nothing is sent in between, the result write itself seals.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import states

from ..context import Execution
from ..exceptions import AlreadyAppliedError, BelowFloorError, FencingError, StaleTokenError, TokenUnavailableError
from ..protocols import FencedResultStore, conforms
from ..token import FencingToken
from .claims import remint_unclaimed

__all__ = ["AppliedResult", "applied_result", "seal", "seal_awaited", "sealed_by_another"]

logger = logging.getLogger("celery_fencing")

#: How often :func:`sealed_by_another` asks the result store while it waits.
SEAL_POLL_INTERVAL = 0.05


def seal(backend: Any, request: Any, execution: Execution, timeout: float) -> None:
    """Seal the task of *execution* on *backend* (when it is a fenced result store), before its callbacks are sent.

    *timeout* bounds the mint of a fresh token, for a seal refused below the
    store's floor.

    :raises AlreadyAppliedError: another execution of the task sealed first; its result stands.
    """
    if not execution.once or not execution.task_id or not conforms(backend, FencedResultStore):
        return
    if not (request.callbacks or request.chain or request.chord or request.errbacks or request.ignore_result):
        # Nothing is sent between the body and the result write: that write seals (first wins).
        execution.seals_with_result = True
        return
    try:
        backend.seal_result(execution.task_id, execution)
    except BelowFloorError as exc:
        # Unclaimed, the seal is the result store's first sight of the token.
        try:
            fresh = remint_unclaimed(execution, exc, timeout)
        except TokenUnavailableError:
            # No fresh token: the refusal stands, taken for what it is (not a newer
            # execution): a retry, which finds the body's effects applied.
            raise exc from None
        if fresh is None:
            raise
        execution.fresh_result_token = fresh
        try:
            backend.seal_result(execution.task_id, execution)
        except BaseException:
            # Only a seal that went through makes the fresh token the result's: a
            # FAILURE written with it would pass a newer execution's claim.
            execution.fresh_result_token = None
            raise


def sealed_by_another(backend: Any, task_id: str, token: FencingToken, timeout: float) -> bool:
    """Whether another execution seals the task on *backend* within *timeout* seconds.

    For an execution whose gated write found its task id applied by an older
    execution: that one is gone (it failed after its write, or died before
    its acknowledgement) or it is still running, between its write and its
    seal. A running one seals in moments and its result must stand; a gone
    one never will, and this execution finishes the task instead. Each poll
    re-claims the result with this execution's own token, which changes
    nothing (the mark already holds it, or a newer one) and is refused as
    ``applied`` once another execution has sealed, also when the token is
    below the store's floor. ``False`` when the store cannot be asked. *backend* is a :class:`FencedResultStore`.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            backend.claim_result(task_id, token)
        except AlreadyAppliedError:
            return True
        except FencingError as exc:
            # A newer copy claimed (it will meet the record too) or the store is
            # out of reach: keep waiting only on the former.
            if not isinstance(exc, StaleTokenError):
                return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(SEAL_POLL_INTERVAL)


def seal_awaited(task: Any, execution: Execution, timeout: float) -> bool:
    """Whether another execution seals the task of *task*'s current *execution* within *timeout* seconds.

    For an execution whose gated write met an older execution's applied
    record (see :func:`sealed_by_another`); ``False`` at once where there is
    no seal to wait for (exactly once off, results ignored, a backend that is
    no fenced result store): then this execution finishes the task.
    """
    backend = task.backend
    if not (execution.once and execution.task_id) or task.request.ignore_result:
        return False
    if not conforms(backend, FencedResultStore):
        return False
    logger.info(
        "task %s[%s]: an older execution applied the task and has not sealed it; "
        "waiting up to %gs for it to finish before finishing the task here",
        task.name,
        execution.task_id,
        timeout,
    )
    return sealed_by_another(backend, execution.task_id, execution.token, timeout)


class AppliedResult(Exception):
    """Ends an eager execution (``apply()``) with the result of the execution that sealed its task id.

    A worker's execution that finds its task id sealed ends as ``Ignore``: the
    stored result stands and Celery sends no callback again. An eager one
    returns to its caller, who would otherwise get ``None``; it gets what
    ``AsyncResult(task_id).get()`` gives, without its body running again.
    """

    def __init__(self, result: Any) -> None:
        super().__init__("another execution applied and sealed the task id")
        self.result = result


def applied_result(backend: Any, task_id: str) -> AppliedResult | None:
    """The successful result stored for *task_id* on *backend*, or ``None``: no SUCCESS, or no fenced result store."""
    if not conforms(backend, FencedResultStore):
        return None  # nothing seals there: the result it holds, if any, may be any execution's
    meta = backend.get_task_meta(task_id)
    if meta.get("status") != states.SUCCESS:
        return None
    return AppliedResult(meta.get("result"))
