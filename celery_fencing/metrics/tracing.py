"""The OpenTelemetry backend: fencing facts as attributes and events of the current span.

``opentelemetry-api`` is imported when the backend is built
(:func:`~celery_fencing.metrics.enable_opentelemetry`), not with this module.
"""

from __future__ import annotations

from typing import Any

from ..token import FencingToken
from .observers import Observer

__all__ = ["OpenTelemetrySpans"]


class OpenTelemetrySpans(Observer):
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
