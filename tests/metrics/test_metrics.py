"""Metrics in one process: zero cost when off, optional resource labels, OpenTelemetry span attributes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from celery_fencing import FencingToken, MemoryGate, StaleTokenError
from celery_fencing.celery import FencedTask, signals
from celery_fencing.metrics import (
    MeteredGate,
    disable_opentelemetry,
    disable_prometheus,
    enable_opentelemetry,
    enable_prometheus,
)
from tests.eager_app import eager_app


@pytest.fixture
def app() -> Iterator[Celery]:
    with eager_app("metrics-unit", task_eager_propagates=True, fencing_on_stale="raise") as app:
        yield app
        disable_prometheus()
        disable_opentelemetry()


def _ours(signal: Any) -> int:
    return sum(1 for _, receiver in signal.receivers if getattr(receiver, "__module__", "") == "celery_fencing.metrics")


def test_nothing_is_connected_until_enabled_and_after_disabled() -> None:
    """Off means no receiver on any fencing signal and no counting by MeteredGate."""
    all_signals = [
        signals.token_minted,
        signals.fencing_rejected,
        signals.duplicate_prevented,
        signals.result_dropped,
        signals.session_state_changed,
    ]
    assert sum(_ours(s) for s in all_signals) == 0
    registry = CollectorRegistry()
    metrics = enable_prometheus(registry)
    assert all(_ours(s) >= 1 for s in all_signals)
    disable_prometheus()
    assert sum(_ours(s) for s in all_signals) == 0
    gate = MeteredGate(MemoryGate())
    gate.claim(FencingToken("r", 1))
    assert (
        registry.get_sample_value(
            "celery_fencing_gate_operations_total",
            {"task": "none", "gate": "MemoryGate", "operation": "claim", "outcome": "accepted"},
        )
        is None
    )
    assert metrics.registry is registry


def test_eager_task_counts_mints_and_rejections(app: Celery) -> None:
    """A fenced task's mint and its refused claim are counted per task, without resource labels by default."""
    registry = CollectorRegistry()
    enable_prometheus(registry)
    gate = MemoryGate()

    @app.task(base=FencedTask, fencing_resource="acct:{n}", fencing_gates=[MeteredGate(gate)], shared=False)
    def work(n: int) -> int:
        return n

    work.delay(1).get()
    gate.claim(FencingToken("acct:2", 10**9))
    with pytest.raises(StaleTokenError):
        work.delay(2).get()
    name = work.name
    assert registry.get_sample_value("celery_fencing_tokens_minted_total", {"task": name, "mode": "token"}) == 2
    assert (
        registry.get_sample_value(
            "celery_fencing_rejections_total", {"task": name, "phase": "claim", "action": "raise"}
        )
        == 1
    )
    labels = {"task": name, "gate": "MemoryGate", "operation": "claim"}
    assert registry.get_sample_value("celery_fencing_gate_operations_total", {**labels, "outcome": "accepted"}) == 1
    assert registry.get_sample_value("celery_fencing_gate_operations_total", {**labels, "outcome": "rejected"}) == 1


def test_duplicates_prevented_are_counted_apart_from_rejections(app: Celery) -> None:
    """A second execution of one task id is counted as a duplicate prevented and an already_applied gate write."""
    registry = CollectorRegistry()
    enable_prometheus(registry)
    gate = MeteredGate(MemoryGate())

    @app.task(base=FencedTask, fencing_resource="acct:{n}", fencing_gates=[gate], shared=False)
    def work(n: int) -> int:
        gate.set(None, f"acct:{n}", n)
        return n

    assert work.apply((1,), task_id="same-task").get() == 1
    # The same task id again, with a newer token: its write finds the task applied and it ends as done.
    assert work.apply((1,), task_id="same-task").get() is None
    name = work.name
    labels = {"task": name, "phase": "body", "action": "done"}
    assert registry.get_sample_value("celery_fencing_duplicates_prevented_total", labels) == 1
    assert registry.get_sample_value("celery_fencing_rejections_total", {**labels, "action": "retry"}) is None
    gate_labels = {"task": name, "gate": "MemoryGate", "operation": "set", "outcome": "already_applied"}
    assert registry.get_sample_value("celery_fencing_gate_operations_total", gate_labels) == 1


def test_resource_labels_are_opt_in(app: Celery) -> None:
    """resource_labels=True adds the resource to the minted and gate counters."""
    registry = CollectorRegistry()
    enable_prometheus(registry, resource_labels=True)
    gate = MeteredGate(MemoryGate(), name="ledger")
    gate.set(FencingToken("acct:7", 3), "k", 1)
    value = registry.get_sample_value(
        "celery_fencing_gate_operations_total",
        {"task": "none", "gate": "ledger", "operation": "set", "outcome": "accepted", "resource": "acct:7"},
    )
    assert value == 1


def test_opentelemetry_annotates_the_current_span(app: Celery) -> None:
    """Inside a recording span, the token, mode, mint duration and a refused claim become attributes and an event."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    enable_opentelemetry()
    gate = MemoryGate()
    gate.claim(FencingToken("acct:3", 10**9))

    @app.task(base=FencedTask, fencing_resource="acct:{n}", fencing_gates=[gate], shared=False)
    def work(n: int) -> int:
        return n

    with tracer.start_as_current_span("task"), pytest.raises(StaleTokenError):
        work.delay(3).get()
    (span,) = exporter.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert attributes["fencing.mode"] == "token"
    assert isinstance(attributes["fencing.token"], int)
    assert attributes["fencing.mint_duration_s"] >= 0
    assert attributes["fencing.resource"] == "acct:3"
    assert attributes["fencing.rejected"] is True
    assert attributes["fencing.phase"] == "claim"
    (event,) = [e for e in span.events if e.name == "fencing.rejected"]
    assert dict(event.attributes or {})["fencing.high_water"] == 10**9
