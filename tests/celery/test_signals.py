"""Signals and logs for users' metrics, from an embedded worker (celery.contrib.testing) in this process."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_fencing import RedisGate
from celery_fencing.celery import FencedTask, signals
from celery_fencing.celery.runtime import runtime_for
from tests.fixtures.services import armed

from .conftest import embedded_app
from .workers import wait_for


@pytest.fixture
def app(redis_url: str, tmp_path: Path, unique_name: str) -> Iterator[Celery]:
    with embedded_app("signals-test", redis_url, tmp_path, unique_name) as app:
        app.conf.fencing_on_stale = "raise"
        yield app


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_signals_report_mint_rejection_and_dropped_result(app: Celery, redis_url: str, unique_name: str) -> None:
    """token_minted, fencing_rejected (with phase and fields) and result_dropped fire, and the rejection is logged."""
    # A gate the task does not declare (fencing_gates), so the worker does not arm it: the test does.
    gate = armed(RedisGate(redis.Redis.from_url(redis_url), prefix=f"{unique_name}:fence"))
    seen: dict[str, list[dict[str, Any]]] = {"minted": [], "rejected": [], "dropped": []}

    def receiver(name: str) -> Any:
        def receive(sender: Any, **kwargs: Any) -> None:
            seen[name].append(kwargs)

        return receive

    receivers = {
        signals.token_minted: receiver("minted"),
        signals.fencing_rejected: receiver("rejected"),
        signals.result_dropped: receiver("dropped"),
    }
    for signal, function in receivers.items():
        signal.connect(function, weak=False)

    @app.task(bind=True, base=FencedTask, fencing_resource="acct:{n}", shared=False)
    def job(self: Any, n: int) -> None:
        newer = runtime_for(app).source().mint(self.request.fencing_resource)
        gate.claim(newer)  # a newer execution claims the resource
        app.backend.claim_result(self.request.id, newer)  # ... and its result
        gate.set(None, f"{unique_name}:k", "stale")

    # The embedded worker sets the root logger to ERROR and takes it over: listen on ours directly.
    records = _Records()
    ours = logging.getLogger("celery_fencing")
    ours.addHandler(records)
    ours.setLevel(logging.WARNING)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False):
            result = job.delay(1)
            # The stale execution's FAILURE is dropped (the newer claim owns the result): wait for the signal.
            wait_for(lambda: seen["dropped"], 30, "the result_dropped signal")
    finally:
        ours.removeHandler(records)
        ours.setLevel(logging.NOTSET)
        for signal, function in receivers.items():
            signal.disconnect(function)
    assert [m["token"].resource for m in seen["minted"]] == ["acct:1"]
    (rejected,) = seen["rejected"]
    assert rejected["phase"] == "body" and rejected["action"] == "raise"
    assert rejected["resource"] == "acct:1" and rejected["high_water"] > rejected["token"]
    (dropped,) = seen["dropped"]
    assert dropped["task_id"] == result.id and dropped["state"] == "FAILURE"
    assert any("fenced out at body on 'acct:1'" in message for message in records.messages)
    assert any(f"dropped FAILURE result of task {result.id}" in message for message in records.messages)
    assert gate.get(f"{unique_name}:k") is None
