"""Metrics: Prometheus counters and OpenTelemetry span attributes, fed by the library's own signals.

Off unless enabled, and free when off: nothing is connected to a signal, and
no metric object exists, until :func:`enable_prometheus` or
:func:`enable_opentelemetry` is called (in each worker process; a prefork
child inherits what its parent enabled before forking). ``prometheus_client``
and ``opentelemetry-api`` are imported only by those calls (the ``[metrics]`` extra).

What is observed, and where from:

========================================  =====================================================
``tokens_minted_total{task,mode}``        ``token_minted``
``mint_duration_seconds{task,mode}``      ``token_minted`` (its ``duration``)
``rejections_total{task,phase,action}``   ``fencing_rejected``: a fenced task's claim
                                          (``phase="claim"``) or write (``"body"``) was
                                          refused, or no token could be had (``"mint"``);
                                          ``action`` is what the policy did
``duplicates_prevented_total{task,phase,  ``duplicate_prevented``: an execution found its
action}``                                 task id already applied (exactly once) at its
                                          claim, a write (``"body"``) or its seal, and
                                          applied nothing again; ``action`` is ``ignore``
                                          or ``done`` (the newest execution finished it)
``results_dropped_total{task,state}``     ``result_dropped`` (the fenced result backend)
``session_state_changes_total{state}``    ``session_state_changed`` (SUSPENDED, LOST)
``gate_operations_total{task,gate,        gates wrapped in :class:`MeteredGate`: every
operation,outcome}``                      claim and write, ``accepted``, ``rejected``
                                          (stale or another resource's token),
                                          ``already_applied`` (exactly once) or
                                          ``unavailable``
========================================  =====================================================

Accepted claims and writes have no signal (a gate does not know about Celery):
wrap the gates whose traffic you want counted, ``fencing_gates=[MeteredGate(gate)]``,
and write through the wrapper.

Label cardinality is bounded: ``task`` is a task name, the others are small
enumerations. Resources (``account:{id}``) are unbounded, one time series per
account would grow the worker's memory and Prometheus's without limit, so the
``resource`` label is off by default; ``resource_labels=True`` adds it to
``tokens_minted_total``, ``rejections_total`` and ``gate_operations_total``,
for deployments with a few, fixed resources.

Prefork workers: signals fire in the pool processes, so expose metrics with
``prometheus_client``'s multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set
before the worker starts, a ``MultiProcessCollector`` in the exporter); solo
and threads pools can serve the default registry with ``start_http_server``.

This module wires the library's signals to the enabled backends (the
receivers, and the ``enable_*``/``disable_*`` functions that connect and
disconnect them); the rest, one role per module:

* :mod:`.observers`: what a backend is told, and the registry of enabled backends;
* :mod:`.prometheus`: :class:`PrometheusMetrics`;
* :mod:`.tracing`: span attributes and events for OpenTelemetry;
* :mod:`.gate`: :class:`MeteredGate`, which counts a gate's claims and writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..celery import signals
from ..token import FencingToken
from .gate import WRITE_METHODS as WRITE_METHODS  # public before the module became a package
from .gate import MeteredGate
from .observers import NO_TASK, current_task_name, each, enabled, lock
from .prometheus import PrometheusMetrics
from .tracing import OpenTelemetrySpans

__all__ = [
    "MeteredGate",
    "PrometheusMetrics",
    "disable_opentelemetry",
    "disable_prometheus",
    "enable_opentelemetry",
    "enable_prometheus",
]


# The signals and receivers connected while any backend is enabled.
_receivers: list[tuple[Any, Callable[..., None]]] = []


def _task_name(sender: Any) -> str:
    name = getattr(sender, "name", None)
    return name if isinstance(name, str) else NO_TASK


def _on_minted(sender: Any = None, token: Any = None, mode: Any = None, duration: Any = None, **_: Any) -> None:
    resource = token.resource if isinstance(token, FencingToken) else ""
    seconds = float(duration) if isinstance(duration, (int, float)) else None
    each(lambda o: o.minted(_task_name(sender), str(mode or "token"), resource, seconds))


def _on_rejected(
    sender: Any = None, resource: Any = None, phase: Any = None, action: Any = None, error: Any = None, **_: Any
) -> None:
    each(lambda o: o.rejected(_task_name(sender), str(phase), str(action), str(resource or ""), error))


def _on_duplicate(sender: Any = None, phase: Any = None, action: Any = None, **_: Any) -> None:
    # The result backend sends it too (phase "result"): the task's name is then the current task's.
    task = _task_name(sender)
    if task == NO_TASK:
        task = current_task_name()
    each(lambda o: o.duplicate(task, str(phase), str(action)))


def _on_dropped(sender: Any = None, task_id: Any = None, state: Any = None, reason: Any = None, **_: Any) -> None:
    # The sender is the backend; the task's name is known only inside the task.
    task = current_task_name()
    each(lambda o: o.dropped(task, str(state), str(reason or "")))


def _on_session(sender: Any = None, state: Any = None, **_: Any) -> None:
    each(lambda o: o.session(str(state)))


def _connect_signals() -> None:
    # Caller holds the lock. Connected once, whatever the number of observers.
    if _receivers:
        return
    for signal, receiver in (
        (signals.token_minted, _on_minted),
        (signals.fencing_rejected, _on_rejected),
        (signals.duplicate_prevented, _on_duplicate),
        (signals.result_dropped, _on_dropped),
        (signals.session_state_changed, _on_session),
    ):
        signal.connect(receiver, weak=False)
        _receivers.append((signal, receiver))


def _disconnect_signals() -> None:
    # Caller holds the lock.
    if enabled:
        return
    for signal, receiver in _receivers:
        signal.disconnect(receiver)
    _receivers.clear()


def enable_prometheus(
    registry: Any = None, *, resource_labels: bool = False, namespace: str = "celery_fencing"
) -> PrometheusMetrics:
    """Count fencing events in Prometheus metrics registered in *registry* (default: the global one).

    Call it once per process that runs fenced tasks (before a prefork pool
    forks, or in ``worker_process_init``); serving the registry is yours
    (``prometheus_client.start_http_server``, or its multiprocess mode for
    prefork). Enabling again replaces the previous metrics.

    :param resource_labels: add a ``resource`` label (unbounded cardinality: see the module doc).
    :raises ImportError: ``prometheus_client`` is not installed (``pip install 'celery-fencing[metrics]'``).
    """
    from prometheus_client import REGISTRY

    disable_prometheus()
    metrics = PrometheusMetrics(
        REGISTRY if registry is None else registry, resource_labels=resource_labels, namespace=namespace
    )
    with lock:
        enabled["prometheus"] = metrics
        _connect_signals()
    return metrics


def disable_prometheus() -> None:
    """Stop counting and unregister the metrics; signals are disconnected when nothing else listens."""
    with lock:
        metrics = enabled.pop("prometheus", None)
        _disconnect_signals()
    if isinstance(metrics, PrometheusMetrics):
        metrics.unregister()


def _on_minted_token(sender: Any = None, token: Any = None, **_: Any) -> None:
    observer = enabled.get("opentelemetry")
    if isinstance(observer, OpenTelemetrySpans):
        observer.token(token)


def enable_opentelemetry(*, resource_attributes: bool = True) -> None:
    """Set fencing attributes and events on the current span of each fenced task.

    ``fencing.token``, ``fencing.mode``, ``fencing.mint_duration_s`` (and
    ``fencing.resource``) when the token is minted; ``fencing.rejected``,
    ``fencing.phase`` and a ``fencing.rejected`` event when the execution is
    fenced out; a ``fencing.result_dropped`` event. Spans are per execution, so
    the resource attribute is on by default (traces sample; metrics do not).
    Spans come from your tracing (e.g. opentelemetry-instrumentation-celery);
    without a recording span nothing is done.

    :raises ImportError: ``opentelemetry-api`` is not installed.
    """
    observer = OpenTelemetrySpans(resource_attributes=resource_attributes)
    with lock:
        enabled["opentelemetry"] = observer
        _connect_signals()
        signals.token_minted.connect(_on_minted_token, weak=False)


def disable_opentelemetry() -> None:
    """Stop annotating spans."""
    with lock:
        enabled.pop("opentelemetry", None)
        signals.token_minted.disconnect(_on_minted_token)
        _disconnect_signals()
