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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from .celery import signals
from .exceptions import (
    AlreadyAppliedError,
    GateUnavailableError,
    LeaseLostError,
    ResourceMismatchError,
    StaleTokenError,
)
from .token import FencingToken

__all__ = [
    "MeteredGate",
    "PrometheusMetrics",
    "disable_opentelemetry",
    "disable_prometheus",
    "enable_opentelemetry",
    "enable_prometheus",
]

#: Gate methods :class:`MeteredGate` counts as writes (when the wrapped gate has them).
WRITE_METHODS = frozenset({"set", "hset", "delete", "eval", "guard", "fenced_update", "transaction"})

_NO_TASK = "none"


class _Observer:
    """What a metrics backend receives; every method must return quickly and never raise."""

    def minted(self, task: str, mode: str, resource: str, duration: float | None) -> None: ...

    def rejected(self, task: str, phase: str, action: str, resource: str, error: BaseException | None) -> None: ...

    def duplicate(self, task: str, phase: str, action: str) -> None: ...

    def dropped(self, task: str, state: str, reason: str) -> None: ...

    def session(self, state: str) -> None: ...

    def gate(self, task: str, gate: str, operation: str, outcome: str, resource: str) -> None: ...


_lock = threading.Lock()
_observers: dict[str, _Observer] = {}
_receivers: list[tuple[Any, Callable[..., None]]] = []


def _task_name(sender: Any) -> str:
    name = getattr(sender, "name", None)
    return name if isinstance(name, str) else _NO_TASK


def _each(call: Callable[[_Observer], None]) -> None:
    for observer in list(_observers.values()):
        call(observer)


def _on_minted(sender: Any = None, token: Any = None, mode: Any = None, duration: Any = None, **_: Any) -> None:
    resource = token.resource if isinstance(token, FencingToken) else ""
    seconds = float(duration) if isinstance(duration, (int, float)) else None
    _each(lambda o: o.minted(_task_name(sender), str(mode or "token"), resource, seconds))


def _on_rejected(
    sender: Any = None, resource: Any = None, phase: Any = None, action: Any = None, error: Any = None, **_: Any
) -> None:
    _each(lambda o: o.rejected(_task_name(sender), str(phase), str(action), str(resource or ""), error))


def _on_duplicate(sender: Any = None, phase: Any = None, action: Any = None, **_: Any) -> None:
    # The result backend sends it too (phase "result"): the task's name is then the current task's.
    task = _task_name(sender)
    if task == _NO_TASK:
        task = _current_task_name()
    _each(lambda o: o.duplicate(task, str(phase), str(action)))


def _on_dropped(sender: Any = None, task_id: Any = None, state: Any = None, reason: Any = None, **_: Any) -> None:
    # The sender is the backend; the task's name is known only inside the task.
    task = _current_task_name()
    _each(lambda o: o.dropped(task, str(state), str(reason or "")))


def _on_session(sender: Any = None, state: Any = None, **_: Any) -> None:
    _each(lambda o: o.session(str(state)))


def _connect_signals() -> None:
    # Caller holds _lock. Connected once, whatever the number of observers.
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
    # Caller holds _lock.
    if _observers:
        return
    for signal, receiver in _receivers:
        signal.disconnect(receiver)
    _receivers.clear()


def _current_task_name() -> str:
    from celery import current_task

    task = current_task
    name = getattr(task, "name", None) if task else None
    return name if isinstance(name, str) else _NO_TASK


# Prometheus ----------------------------------------------------------------------------


class PrometheusMetrics(_Observer):
    """The Prometheus metrics of :func:`enable_prometheus`, registered in *registry*.

    Attributes are the ``prometheus_client`` objects, for tests and dashboards.
    """

    def __init__(self, registry: Any, *, resource_labels: bool, namespace: str) -> None:
        from prometheus_client import Counter, Histogram

        self.resource_labels = resource_labels
        extra = ("resource",) if resource_labels else ()
        common = {"namespace": namespace, "registry": registry}
        self.tokens_minted = Counter(
            "tokens_minted", "Fencing tokens minted (or leased) by fenced tasks.", ("task", "mode", *extra), **common
        )
        self.mint_duration = Histogram(
            "mint_duration_seconds",
            "Seconds a fenced task waited for its token (a mint, or a lease in exclusive mode).",
            ("task", "mode"),
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            **common,
        )
        self.rejections = Counter(
            "rejections",
            "Fenced task executions fenced out: a refused claim or write, or no token to be had.",
            ("task", "phase", "action", *extra),
            **common,
        )
        self.duplicates_prevented = Counter(
            "duplicates_prevented",
            "Executions that found their task id already applied and applied nothing again (exactly once).",
            ("task", "phase", "action"),
            **common,
        )
        self.results_dropped = Counter(
            "results_dropped", "Result writes the fenced result backend dropped.", ("task", "state"), **common
        )
        self.session_state_changes = Counter(
            "session_state_changes",
            "Grantor session state changes seen by workers (SUSPENDED, LOST).",
            ("state",),
            **common,
        )
        self.gate_operations = Counter(
            "gate_operations",
            "Claims and writes through MeteredGate wrappers, by outcome.",
            ("task", "gate", "operation", "outcome", *extra),
            **common,
        )
        self._collectors = [
            self.tokens_minted,
            self.mint_duration,
            self.rejections,
            self.duplicates_prevented,
            self.results_dropped,
            self.session_state_changes,
            self.gate_operations,
        ]
        self.registry = registry

    def _extra(self, resource: str) -> tuple[str, ...]:
        return (resource,) if self.resource_labels else ()

    def minted(self, task: str, mode: str, resource: str, duration: float | None) -> None:
        self.tokens_minted.labels(task, mode, *self._extra(resource)).inc()
        if duration is not None:
            self.mint_duration.labels(task, mode).observe(duration)

    def rejected(self, task: str, phase: str, action: str, resource: str, error: BaseException | None) -> None:
        self.rejections.labels(task, phase, action, *self._extra(resource)).inc()

    def duplicate(self, task: str, phase: str, action: str) -> None:
        self.duplicates_prevented.labels(task, phase, action).inc()

    def dropped(self, task: str, state: str, reason: str) -> None:
        self.results_dropped.labels(task, state).inc()

    def session(self, state: str) -> None:
        self.session_state_changes.labels(state).inc()

    def gate(self, task: str, gate: str, operation: str, outcome: str, resource: str) -> None:
        self.gate_operations.labels(task, gate, operation, outcome, *self._extra(resource)).inc()

    def unregister(self) -> None:
        for collector in self._collectors:
            self.registry.unregister(collector)


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
    with _lock:
        _observers["prometheus"] = metrics
        _connect_signals()
    return metrics


def disable_prometheus() -> None:
    """Stop counting and unregister the metrics; signals are disconnected when nothing else listens."""
    with _lock:
        metrics = _observers.pop("prometheus", None)
        _disconnect_signals()
    if isinstance(metrics, PrometheusMetrics):
        metrics.unregister()


# OpenTelemetry -------------------------------------------------------------------------


class _OpenTelemetry(_Observer):
    """Puts fencing facts on the current span (the task's span, under opentelemetry-instrumentation-celery)."""

    def __init__(self, *, resource_attributes: bool) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.resource_attributes = resource_attributes

    def _span(self) -> Any:
        span = self._trace.get_current_span()
        return span if span.is_recording() else None

    def minted(self, task: str, mode: str, resource: str, duration: float | None) -> None:
        span = self._span()
        if span is None:
            return
        span.set_attribute("fencing.mode", mode)
        if duration is not None:
            span.set_attribute("fencing.mint_duration_s", duration)
        if self.resource_attributes and resource:
            span.set_attribute("fencing.resource", resource)

    def token(self, token: Any) -> None:
        span = self._span()
        if span is not None and isinstance(token, FencingToken):
            span.set_attribute("fencing.token", token.value)

    def rejected(self, task: str, phase: str, action: str, resource: str, error: BaseException | None) -> None:
        span = self._span()
        if span is None:
            return
        attributes: dict[str, Any] = {"fencing.phase": phase, "fencing.action": action}
        high_water = getattr(error, "high_water", None)
        if isinstance(high_water, int):
            attributes["fencing.high_water"] = high_water
        if self.resource_attributes and resource:
            attributes["fencing.resource"] = resource
        span.set_attribute("fencing.rejected", True)
        span.set_attribute("fencing.phase", phase)
        span.add_event("fencing.rejected", attributes)

    def duplicate(self, task: str, phase: str, action: str) -> None:
        span = self._span()
        if span is not None:
            span.add_event("fencing.duplicate_prevented", {"fencing.phase": phase, "fencing.action": action})

    def dropped(self, task: str, state: str, reason: str) -> None:
        span = self._span()
        if span is not None:
            span.add_event("fencing.result_dropped", {"fencing.state": state, "fencing.reason": reason})

    def session(self, state: str) -> None:
        # Sent from a thread of the runtime, outside any task's span: nothing to annotate.
        return

    def gate(self, task: str, gate: str, operation: str, outcome: str, resource: str) -> None:
        span = self._span()
        if span is not None and outcome != "accepted":
            span.add_event("fencing.gate", {"fencing.gate": gate, "fencing.operation": operation, "outcome": outcome})


def _on_minted_token(sender: Any = None, token: Any = None, **_: Any) -> None:
    observer = _observers.get("opentelemetry")
    if isinstance(observer, _OpenTelemetry):
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
    observer = _OpenTelemetry(resource_attributes=resource_attributes)
    with _lock:
        _observers["opentelemetry"] = observer
        _connect_signals()
        signals.token_minted.connect(_on_minted_token, weak=False)


def disable_opentelemetry() -> None:
    """Stop annotating spans."""
    with _lock:
        _observers.pop("opentelemetry", None)
        signals.token_minted.disconnect(_on_minted_token)
        _disconnect_signals()


# Gate wrapper ------------------------------------------------------------------------


class MeteredGate:
    """A gate that counts its claims and writes, and otherwise behaves exactly as the gate it wraps.

    ``claim`` and the wrapped gate's write methods (:data:`WRITE_METHODS`:
    ``set``, ``hset``, ``delete``, ``eval``, ``guard``, ``fenced_update``,
    ``transaction``) are counted by outcome: ``accepted``, ``rejected``
    (:class:`StaleTokenError`, :class:`ResourceMismatchError`, a lost lease) or
    ``unavailable``; bad input (:class:`InvalidTokenError`) is not counted.
    Everything else is passed through. Exceptions propagate unchanged. With no
    metrics enabled the cost is one dictionary lookup per operation.

    :param gate: any gate.
    :param name: the ``gate`` label (default: the gate's class name).
    """

    def __init__(self, gate: Any, *, name: str | None = None) -> None:
        self.gate = gate
        self.name = name or type(gate).__name__

    def claim(self, token: FencingToken | None = None) -> None:
        """The wrapped gate's ``claim``, counted."""
        with self._observe("claim", (token,), {}):
            self.gate.claim(token)

    def high_water(self, resource: str) -> int | None:
        """The wrapped gate's ``high_water`` (not counted: a read)."""
        value: int | None = self.gate.high_water(resource)
        return value

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.gate, name)
        if name not in WRITE_METHODS or not callable(attribute):
            return attribute
        if name == "transaction":
            return lambda *args, **kwargs: _MeteredTransaction(self, attribute, args, kwargs)

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._observe(name, args, kwargs):
                return attribute(*args, **kwargs)

        return counted

    @contextmanager
    def _observe(self, operation: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[None]:
        if not _observers:
            yield
            return
        try:
            yield
        except BaseException as exc:
            self._count_error(operation, exc, args, kwargs)
            raise
        self._record(operation, "accepted", _token_resource(args, kwargs))

    def _count_error(self, operation: str, exc: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not _observers:
            return
        if isinstance(exc, (StaleTokenError, LeaseLostError, ResourceMismatchError)):
            resource = getattr(exc, "resource", None) or _token_resource(args, kwargs)
            self._record(operation, "rejected", resource)
        elif isinstance(exc, AlreadyAppliedError):
            self._record(operation, "already_applied", exc.resource or _token_resource(args, kwargs))
        elif isinstance(exc, GateUnavailableError):
            self._record(operation, "unavailable", _token_resource(args, kwargs))
        # Bad input, and the caller's own errors, are not the gate's verdict: not counted.

    def _record(self, operation: str, outcome: str, resource: str) -> None:
        task = _current_task_name()
        _each(lambda o: o.gate(task, self.name, operation, outcome, resource))

    def __repr__(self) -> str:
        return f"MeteredGate({self.gate!r})"


class _MeteredTransaction(AbstractContextManager[Any]):
    """``gate.transaction(token)`` counted: rejected on entering, accepted once the block commits."""

    def __init__(self, owner: MeteredGate, method: Callable[..., Any], args: tuple[Any, ...], kwargs: Any) -> None:
        self._owner = owner
        self._args = args
        self._kwargs = kwargs
        # Bad tokens are refused here, by the gate itself, before any I/O.
        self._inner = method(*args, **kwargs)

    def __enter__(self) -> Any:
        try:
            return self._inner.__enter__()
        except BaseException as exc:
            self._owner._count_error("transaction", exc, self._args, self._kwargs)
            raise

    def __exit__(self, *exc_info: Any) -> bool | None:
        try:
            result = self._inner.__exit__(*exc_info)
        except BaseException as error:
            if error is not exc_info[1]:
                # Raised by the gate at COMMIT, not the block's own error passing through.
                self._owner._count_error("transaction", error, self._args, self._kwargs)
            raise
        if exc_info[0] is None and _observers:
            self._owner._record("transaction", "accepted", _token_resource(self._args, self._kwargs))
        return bool(result)


def _token_resource(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    for value in (*args, *kwargs.values()):
        if isinstance(value, FencingToken):
            return value.resource
    from .context import current_token

    token = current_token()
    return token.resource if token is not None else ""
