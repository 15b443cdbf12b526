"""The Prometheus backend: the counters and the histogram of :func:`~celery_fencing.metrics.enable_prometheus`.

``prometheus_client`` is imported when the metrics are built, not with this module.
"""

from __future__ import annotations

from typing import Any

from .observers import Observer

__all__ = ["PrometheusMetrics"]


class PrometheusMetrics(Observer):
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
