"""``fenced_task``: the decorator shortcut for ``@app.task(base=FencedTask, fencing_resource=..., ...)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..policies import Policy
from ..protocols import Gate
from .task import FencedTask

__all__ = ["fenced_task"]


def fenced_task(
    app: Any = None,
    *,
    resource: str | Callable[..., str] | None = None,
    on_stale: str | Policy | None = None,
    gates: Sequence[Gate] | Callable[[], Sequence[Gate]] = (),
    mode: str | None = None,
    **task_options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorator shortcut for ``@app.task(base=FencedTask, fencing_resource=..., ...)``.

    With no *app*, registers a shared task (``celery.shared_task``).
    """
    options = {
        "base": task_options.pop("base", FencedTask),
        "fencing_resource": resource,
        "fencing_on_stale": on_stale,
        "fencing_gates": gates,
        "fencing_mode": mode,
        **task_options,
    }

    def decorate(fun: Callable[..., Any]) -> Any:
        if app is None:
            from celery import shared_task

            return shared_task(**options)(fun)
        return app.task(**options)(fun)

    return decorate
