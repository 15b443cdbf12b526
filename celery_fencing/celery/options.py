"""The task options of FencedTask, checked when a task is defined: a mistake fails then, not at every message.

Celery turns the keyword arguments of ``@app.task(base=FencedTask, ...)`` into
class attributes of the task's class, and creates the class as the worker
starts (or at the first use of a lazy app). :func:`check_task_options` runs
from ``FencedTask.__init_subclass__``.

Task options (class attributes, or keyword arguments of ``@app.task``):

``fencing_resource``
    ``"account:{account_id}"`` (formatted with the task's bound arguments), a
    callable taking the task's arguments, or ``None`` for the task id.
``fencing_on_stale``
    ``"retry"``, ``"defer"``, ``"ignore"``, ``"reject"``, ``"raise"`` or a
    policy object (:mod:`celery_fencing.policies`). Default: ``fencing_on_stale``
    setting, else ``"defer"`` for task-id resources and ``"retry"`` otherwise.
``fencing_gates``
    Gates to claim on at start: a sequence, or a zero-argument callable
    called once per worker process (for clients that must not cross fork).
``fencing_mode``
    ``"token"`` or ``"exclusive"`` (hold a ZooKeeper lease for the run).
``fencing_lock_delay``
    Exclusive mode: seconds the resource stays un-grantable after a holder
    failed instead of releasing it (Chubby's lock-delay; default: the
    ``fencing_lock_delay`` setting, 0). The task waits it out in place: its
    lease timeout is ``fencing_timeout`` plus the delay.
``fencing_once``
    ``True`` (default: the ``fencing_once`` setting, on) to apply each task id
    once; ``False`` for tasks whose effects are meant to repeat when the same
    message runs again.
``fencing_max_retries``, ``fencing_retry_countdown``, ``fencing_retry_backoff_factor``,
``fencing_retry_max_delay``, ``fencing_retry_jitter``
    Per-task overrides of the settings of the same name.
"""

from __future__ import annotations

import difflib
import inspect
import re
import string
import weakref
from collections.abc import Sequence
from typing import Any

from ..exceptions import FencingConfigurationError, InvalidTokenError
from ..policies import policy_from_setting
from ..token import validate_resource
from .settings import MODES

__all__ = ["TASK_OPTIONS", "check_task_options", "resource_for"]

#: The task options FencedTask understands; any other ``fencing_*`` attribute is a typo.
TASK_OPTIONS = frozenset(
    {
        "fencing_resource",
        "fencing_on_stale",
        "fencing_gates",
        "fencing_mode",
        "fencing_lock_delay",
        "fencing_once",
        "fencing_max_retries",
        "fencing_retry_countdown",
        "fencing_retry_backoff_factor",
        "fencing_retry_max_delay",
        "fencing_retry_jitter",
    }
)


def check_task_options(cls: type) -> None:
    """Refuse a task class whose fencing options cannot work.

    :raises FencingConfigurationError: an unknown ``fencing_*`` option, a bad
        mode or on-stale policy, or a resource template the task's arguments
        cannot fill.
    """
    # @app.task(base=FencedTask, fencing_resorce=...) would silently become an unused attribute.
    unknown = sorted(name for name in vars(cls) if name.startswith("fencing_") and name not in TASK_OPTIONS)
    if unknown:
        raise FencingConfigurationError(
            f"task {cls.__name__}: unknown option(s) {', '.join(unknown)}; "
            f"known options: {', '.join(sorted(TASK_OPTIONS))}"
        )
    mode = getattr(cls, "fencing_mode", None)
    if mode is not None and mode not in MODES:
        raise FencingConfigurationError(f"task {cls.__name__}: fencing_mode={mode!r} is not one of {', '.join(MODES)}")
    on_stale = getattr(cls, "fencing_on_stale", None)
    if on_stale is not None:
        policy_from_setting(on_stale, what=f"{cls.__name__}.fencing_on_stale")
    template = cls.__dict__.get("fencing_resource")
    if isinstance(template, str):
        _check_template(cls, template)


def _check_template(cls: type, template: str) -> None:
    """Refuse, when the task is defined, a resource template that names an argument the task does not take.

    Otherwise every message of the task would fail at run time. Fields may
    reach into an argument (``{order.id}``, ``{items[0]}``); positional fields
    (``{0}``, ``{}``) are refused, since the template is formatted by name.
    """
    run = cls.__dict__.get("run")
    if run is None:
        return
    function = run.__func__ if isinstance(run, staticmethod) else run
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return  # a builtin or a C function: nothing to check against
    if not isinstance(run, staticmethod) and parameters:
        parameters = parameters[1:]  # bound tasks (bind=True) and class-defined run() take self first
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    names = {p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL}
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as exc:
        raise FencingConfigurationError(
            f"task {cls.__name__}: fencing_resource={template!r} is malformed: {exc}"
        ) from None
    for field in fields:
        root = re.split(r"[.\[]", field, maxsplit=1)[0]
        if not root or root.isdigit():
            raise FencingConfigurationError(
                f"task {cls.__name__}: fencing_resource={template!r} has a positional field {{{field}}}; "
                "name the argument instead"
            )
        if root not in names:
            close = difflib.get_close_matches(root, sorted(names), n=1)
            hint = f"; did you mean {{{close[0]}}}?" if close else ""
            raise FencingConfigurationError(
                f"task {cls.__name__}: fencing_resource={template!r} names {{{root}}}, which the task does not "
                f"take (it takes: {', '.join(sorted(names)) or 'nothing'}){hint}"
            )


#: The signature of each task class's ``run``, made once: inspect.signature costs more than a fenced write.
_signatures: weakref.WeakKeyDictionary[type, inspect.Signature] = weakref.WeakKeyDictionary()


def _run_signature(task: Any) -> inspect.Signature:
    signature = _signatures.get(type(task))
    if signature is None:
        signature = _signatures[type(task)] = inspect.signature(task.run)
    return signature


def resource_for(task: Any, spec: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """The resource an execution of *task* is fenced on: its ``fencing_resource`` *spec* applied to its arguments.

    *spec* is a template (formatted with the bound arguments, defaults
    applied), a callable taking the arguments, or ``None`` for the task id.

    :raises FencingConfigurationError: no task id (``None``), or the template
        names an argument the task does not take, or yields an invalid resource.
    :raises TypeError: the arguments do not fit the task (Celery's own error).
    """
    if spec is None:
        task_id = task.request.id
        if not task_id:
            raise FencingConfigurationError(f"task {task.name}: no task id to fence on")
        return str(task_id)
    if isinstance(spec, str) and "{" not in spec and "}" not in spec:
        return validate_resource(spec)  # a fixed resource: nothing to format (the body checks the arguments)
    if not callable(spec):
        # Wrong arguments raise Celery's own TypeError here, as the body would.
        bound = _run_signature(task).bind(*args, **kwargs)
        bound.apply_defaults()
    try:
        resource = spec(*args, **kwargs) if callable(spec) else spec.format_map(bound.arguments)
        return validate_resource(resource)
    except (KeyError, IndexError, AttributeError, TypeError, ValueError, InvalidTokenError) as exc:
        # The arguments' values stay out of the message: it is logged, and they may be personal data.
        raise FencingConfigurationError(
            f"task {task.name}: cannot build the fencing resource from {spec!r} "
            f"({len(args)} positional and {len(kwargs)} keyword arguments: {', '.join(sorted(kwargs)) or '-'}): "
            f"{type(exc).__name__}"
        ) from exc
