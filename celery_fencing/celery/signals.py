"""Signals for metrics and alerting. They observe; they cannot stop a task.

Receivers run synchronously in the worker process; an exception in a receiver
is logged by Celery and swallowed. Connect with ``weak=False`` for receivers
defined inside functions.

=========================  ==========================================================
signal                     sent with
=========================  ==========================================================
``token_minted``           ``sender`` task, ``task_id``, ``token``, ``mode``,
                           ``duration`` (seconds the mint or lease took)
``fencing_rejected``       ``sender`` task, ``task_id``, ``resource``, ``token``,
                           ``high_water``, ``error``, ``action`` (retry, defer,
                           ignore, reject, raise),
                           ``phase`` (mint, claim or body)
``duplicate_prevented``    ``sender`` task (the backend for phase result), ``task_id``,
                           ``resource``, ``phase`` (claim, body, seal, or result: a
                           sealing result write came second), ``action`` (ignore, or done for
                           the newest execution, which finishes the task),
                           ``error`` (the :class:`~celery_fencing.AlreadyAppliedError`)
``result_dropped``         ``sender`` backend, ``task_id``, ``state``, ``token``,
                           ``high_water``, ``reason``
``session_state_changed``  ``sender`` token source, ``state`` (CONNECTED,
                           SUSPENDED, LOST), ``task_ids`` holding tokens then
=========================  ==========================================================
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = ["duplicate_prevented", "fencing_rejected", "result_dropped", "session_state_changed", "token_minted"]

token_minted = Signal(name="token_minted", providing_args={"task_id", "token", "mode", "duration"})
fencing_rejected = Signal(
    name="fencing_rejected",
    providing_args={"task_id", "resource", "token", "high_water", "error", "action", "phase"},
)
duplicate_prevented = Signal(
    name="duplicate_prevented", providing_args={"task_id", "resource", "phase", "action", "error"}
)
result_dropped = Signal(name="result_dropped", providing_args={"task_id", "state", "token", "high_water", "reason"})
session_state_changed = Signal(name="session_state_changed", providing_args={"state", "task_ids"})
