"""What a metrics backend is told, and which backends are enabled: the registry the signals and MeteredGate feed.

A backend is an :class:`Observer` registered in :data:`enabled` under its
name (``"prometheus"``, ``"opentelemetry"``) by the ``enable_*`` functions of
:mod:`celery_fencing.metrics`, which hold :data:`lock` while they change it.
Nothing is registered until one of them is called.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["NO_TASK", "Observer", "current_task_name", "each", "enabled", "lock"]

#: The ``task`` label outside any task.
NO_TASK = "none"


class Observer:
    """What a metrics backend receives; every method must return quickly and never raise."""

    def minted(self, task: str, mode: str, resource: str, duration: float | None) -> None: ...

    def rejected(self, task: str, phase: str, action: str, resource: str, error: BaseException | None) -> None: ...

    def duplicate(self, task: str, phase: str, action: str) -> None: ...

    def dropped(self, task: str, state: str, reason: str) -> None: ...

    def session(self, state: str) -> None: ...

    def gate(self, task: str, gate: str, operation: str, outcome: str, resource: str) -> None: ...


#: Guards changes to :data:`enabled` (and to the signal receivers); reads need no lock.
lock = threading.Lock()
#: The enabled backends, by name. Changed in place only, never rebound: modules hold a reference.
enabled: dict[str, Observer] = {}


def each(call: Callable[[Observer], None]) -> None:
    """Tell every enabled backend, with *call*."""
    for observer in list(enabled.values()):
        call(observer)


def current_task_name() -> str:
    """The name of the task this thread runs, or :data:`NO_TASK`."""
    from celery import current_task

    task = current_task
    name = getattr(task, "name", None) if task else None
    return name if isinstance(name, str) else NO_TASK
