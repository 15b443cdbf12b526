"""Assertions on what fenced executions did, read from the library's own signals (:class:`FencingEvents`).

Both assertions speak about *executions*: one delivery or retry of a task id,
named by the token it was minted. They say what fencing saw; a test should
also check the data itself (the balance, the rows), which is what users care
about.
"""

from __future__ import annotations

from .events import FencingEvent, FencingEvents

__all__ = ["assert_applied_once", "assert_fenced_out", "describe_executions"]

# A refusal at these phases is the storage saying no to an execution's claim or write;
# "result" is the fenced result backend dropping a result, and "mint" an outage.
_STORAGE_PHASES = ("claim", "body", "seal")


def describe_executions(events: FencingEvents, task_id: str) -> str:
    """One line per recorded event of *task_id*: what an assertion's failure message shows."""
    lines = [
        f"  pid {e.pid} {e.kind} token={e.token} phase={e.phase} action={e.action} state={e.state} error={e.error}"
        for e in events.of(task_id=task_id)
    ]
    return "\n".join(lines) or "  (nothing recorded: is the worker recording events, and is the task fenced?)"


def assert_fenced_out(
    events: FencingEvents, task_id: str, *, pid: int | None = None, token: int | None = None
) -> FencingEvent:
    """Assert that an execution of *task_id* had a claim or write refused by a gate; return the refusal.

    A refusal is a ``fencing_rejected`` (a newer token holds the resource) or a
    ``duplicate_prevented`` (a newer execution of the same task id already
    applied the effect) at a claim, a gated write or the seal. *pid* and
    *token* narrow it to one worker process or one execution.

    :raises AssertionError: when no such refusal was recorded, listing what was.
    """
    for event in events.all():
        if (
            event.task_id == task_id
            and event.kind in ("rejected", "duplicate")
            and event.phase in _STORAGE_PHASES
            and (pid is None or event.pid == pid)
            and (token is None or event.token == token)
        ):
            return event
    which = "".join([f" in pid {pid}" if pid is not None else "", f" with token {token}" if token is not None else ""])
    raise AssertionError(
        f"no execution of task {task_id}{which} was fenced out; recorded:\n{describe_executions(events, task_id)}"
    )


def assert_applied_once(events: FencingEvents, task_id: str) -> FencingEvent:
    """Assert that exactly one execution of *task_id* ran its body to success without being refused; return
    that execution's ``finished`` event.

    An execution counts as applied when it was minted a token, finished in
    state ``SUCCESS``, and no refusal or duplicate was recorded for its token
    (a duplicate that ends as ``done`` finishes in ``SUCCESS`` without applying).

    :raises AssertionError: when none or several did, listing every event of the task.
    """
    recorded = events.of(task_id=task_id)
    minted = {e.token for e in recorded if e.kind == "minted"}
    refused = {e.token for e in recorded if e.kind in ("rejected", "duplicate")}
    applied = [
        e
        for e in recorded
        if e.kind == "finished" and e.state == "SUCCESS" and e.token in minted and e.token not in refused
    ]
    if len(applied) != 1:
        raise AssertionError(
            f"task {task_id} was applied by {len(applied)} executions, not once; recorded:\n"
            + describe_executions(events, task_id)
        )
    return applied[0]
