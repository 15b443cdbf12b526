"""What a fenced task raises to carry out its policy's decision: Celery's retry, a deferral, Ignore, Reject, the error.

Out of :class:`~celery_fencing.celery.FencedTask`, which keeps the
execution's lifecycle and raises what :func:`enact` returns.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import Ignore, Reject

from ..exceptions import FencingError
from ..policies import Decision

__all__ = ["enact"]


def enact(task: Any, decision: Decision, exc: FencingError) -> BaseException:
    """The exception that carries out *decision* for *task*'s current execution, fenced out by *exc*.

    ``defer`` publishes the retry (a new message, with a delivery tag of its
    own) and then ends this copy like an ignored one: acknowledged, with no
    result written. Not Celery's ``Retry``, whose RETRY state write would
    land over the newer copy's result on a backend that does not fence (a
    fenced one drops it, as stale, with a warning).
    """
    # Celery's exceptions are untyped: each is named as a BaseException for mypy.
    if decision.action in ("retry", "defer"):
        retry = _retry(task, decision.countdown, exc)
        if decision.action == "retry" or task.request.is_eager:
            # Eager (apply()): Celery runs the retry inline only when the Retry is the outcome.
            return retry
        deferred: BaseException = Ignore(f"deferred to a newer execution of the task ({exc})")
        return deferred
    if decision.action == "ignore":
        ignore: BaseException = Ignore(str(exc))
        return ignore
    if decision.action == "reject":
        reject: BaseException = Reject(exc, requeue=False)
        return reject
    return exc


def _retry(task: Any, countdown: float | None, exc: FencingError) -> BaseException:
    """Publish the task's retry in *countdown* seconds (eager: prepare it); return Celery's ``Retry``."""
    # The policy already counted the retries: let Celery's own limit pass.
    retries = int(task.request.retries or 0)
    retry: BaseException = task.retry(exc=exc, countdown=countdown, max_retries=retries + 1, throw=False)
    # retry() leaves max_retries on the shared task object for autoretry_for
    # to pick up; ours is not the task's own limit, so take it back.
    task.__dict__.pop("override_max_retries", None)
    return retry
