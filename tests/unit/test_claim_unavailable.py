"""FencedTask when a gate's store is down at claim time: retried like a grantor outage, never failed.

The reliability suite found it on real workers: a Redis or PostgreSQL restart
made every fenced task that started meanwhile FAIL (GateUnavailableError from
the claim in before_start, out of reach of autoretry_for), and acks_late then
acknowledged it: the task was lost, while the unfenced control simply retried.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_fencing import GateUnavailableError, MemoryGate
from celery_fencing.celery import FencedTask, signals
from celery_fencing.token import FencingToken
from tests.eager_app import eager_app


class FlakyGate(MemoryGate):
    """A memory gate whose first *failures* claims fail as a store that is down would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def claim(self, token: FencingToken | None = None) -> None:
        if self.failures:
            self.failures -= 1
            raise GateUnavailableError("store restarting", gate="FlakyGate")
        super().claim(token)


@pytest.fixture
def app() -> Iterator[Celery]:
    with eager_app("unit", fencing_retry_countdown=0) as app:
        yield app


def test_unavailable_gate_at_claim_is_retried(app: Celery) -> None:
    """A claim failing with GateUnavailableError retries the task (new token); the body then runs once."""
    gate = FlakyGate(failures=2)
    runs: list[int] = []
    rejected: list[dict[str, Any]] = []

    def on_rejected(sender: Any, **kwargs: Any) -> None:
        rejected.append(kwargs)

    signals.fencing_rejected.connect(on_rejected, weak=False)
    try:

        @app.task(bind=True, base=FencedTask, fencing_resource="acct", fencing_gates=[gate], shared=False)
        def job(self: Any) -> int:
            runs.append(self.request.fencing_token.value)
            return len(runs)

        # Eager mode runs a retry inline only when errors do not propagate (throw=False).
        assert job.apply(throw=False).get() == 1
    finally:
        signals.fencing_rejected.disconnect(on_rejected)
    assert len(runs) == 1, "the body runs only once a claim succeeded"
    assert [(r["phase"], r["action"]) for r in rejected] == [("claim", "retry"), ("claim", "retry")]
    assert gate.high_water("acct") == runs[0]


def test_unavailable_gate_at_claim_with_raise_policy_still_retries(app: Celery) -> None:
    """An unavailable store is not a newer execution: the retry happens whatever the stale policy says."""
    gate = FlakyGate(failures=1)

    @app.task(base=FencedTask, fencing_resource="acct", fencing_on_stale="raise", fencing_gates=[gate], shared=False)
    def job() -> str:
        return "done"

    assert job.apply(throw=False).get() == "done"
