"""Each on-stale policy, shown with a real worker of each pool kind (solo, prefork, threads).

The task body stands in for a newer execution: it mints a newer token for its own
resource and claims it on the gate, then tries its own gated write.
"""

from __future__ import annotations

import uuid

import pytest
from celery import states

from .conftest import Scenario
from .workers import wait_for


def _name() -> str:
    return uuid.uuid4().hex[:8]


def _attempts(world: Scenario, task_id: str) -> list[list[str]]:
    return [e for e in world.events() if e[0] == "attempt" and e[1] == task_id]


def check_the_retry_lands_with_a_newer_token(world: Scenario) -> None:
    """Run ``policy_retry`` on the world's worker: its fenced-out attempt is retried once, and the retry's larger
    token lands the write."""
    name = _name()
    result = world.send("policy_retry", name)
    outcome = result.get(timeout=60)
    attempts = _attempts(world, result.id)
    assert [a[2] for a in attempts] == ["0", "1"]
    assert int(attempts[1][3]) > int(attempts[0][3])
    assert outcome == {"retries": 1, "token": int(attempts[1][3])}
    assert world.redis.get(world.key("policy", name)) == attempts[1][3]


def test_retry_redoes_the_work_with_a_newer_token(pooled_worker: Scenario) -> None:
    """'retry': the fenced-out attempt is retried; the retry's larger token lands the write."""
    check_the_retry_lands_with_a_newer_token(pooled_worker)


def test_retry_gives_up_after_max_retries(pooled_worker: Scenario) -> None:
    """'retry' with fencing_max_retries=2: three attempts, then the task fails with StaleTokenError."""
    result = pooled_worker.send("policy_retry_limited", _name(), always=True)
    with pytest.raises(Exception) as info:
        result.get(timeout=60)
    assert type(info.value).__name__ == "StaleTokenError"
    assert [a[2] for a in _attempts(pooled_worker, result.id)] == ["0", "1", "2"]


def test_ignore_drops_the_execution(pooled_worker: Scenario) -> None:
    """'ignore': the execution ends without writing data or a result; the log says why."""
    name = _name()
    result = pooled_worker.send("policy_ignore", name)
    worker = pooled_worker.workers[0]
    wait_for(lambda: f"[{result.id}] ignored" in worker.log(), 60, "the task to be ignored")
    assert result.state == states.PENDING
    assert pooled_worker.redis.get(pooled_worker.key("policy", name)) is None
    assert f"fenced out at body on 'policy:{name}'" in worker.log() and "-> ignore" in worker.log()


def test_reject_hands_the_message_to_the_broker(pooled_worker: Scenario) -> None:
    """'reject': the message is rejected without requeue, so it is not run again."""
    name = _name()
    result = pooled_worker.send("policy_reject", name)
    worker = pooled_worker.workers[0]
    wait_for(lambda: f"fenced out at body on 'policy:{name}'" in worker.log(), 60, "the rejection")
    wait_for(
        lambda: f"[{result.id}]" in worker.log().split(f"fenced out at body on 'policy:{name}'")[1], 30, "Celery's log"
    )
    assert "-> reject" in worker.log()
    assert len(_attempts(pooled_worker, result.id)) == 1
    assert pooled_worker.redis.llen(pooled_worker.name) == 0, "a rejected message must not be requeued"


def test_raise_fails_the_task(pooled_worker: Scenario) -> None:
    """'raise': the task fails at once with the StaleTokenError, carrying resource, token and mark."""
    result = pooled_worker.send("policy_raise", _name())
    with pytest.raises(Exception) as info:
        result.get(timeout=60)
    assert type(info.value).__name__ == "StaleTokenError"
    assert result.state == states.FAILURE
    assert len(_attempts(pooled_worker, result.id)) == 1
