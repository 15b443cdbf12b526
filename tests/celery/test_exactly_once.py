"""Exactly once per task id, with real workers: the quickstart's re-delivery, on Redis and on RabbitMQ, and a chain.

The timeline of every test: w1 reads and is frozen (SIGSTOP) past the
broker's re-delivery point (the Redis visibility timeout, or RabbitMQ after
its connection is cut); the broker hands the message to w2, which runs the
copy to its end; then w1 resumes and goes on from its read. With
exactly-once (the default), w1's write finds the task applied by w2 and ends
as done: the effect happens once. The negative control in each test pair is
the same task with ``fencing_once=False``: fencing refuses w1's stale write,
the policy retries, the retry re-reads and applies the task a second time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from celery import chain, states

from tests.rabbitmq.proxy import TcpProxy

from .conftest import Scenario
from .test_rabbitmq_redelivery import rabbit  # noqa: F401  (fixture)
from .workers import WorkerProcess, wait_for

USER = 7


@dataclass
class Redelivery:
    task_id: str
    w1: WorkerProcess
    w2: WorkerProcess

    def logs(self) -> str:
        return self.w1.log() + self.w2.log()

    def successes(self) -> int:
        return self.logs().count(f"[{self.task_id}] succeeded")


def _starts(scenario: Scenario, task_id: str) -> list[list[str]]:
    return scenario.events_of("start", task_id)


def pause_and_redeliver(
    scenario: Scenario, send: Callable[[], str], *, cut: Callable[[], None] | None = None, direct_broker: str = ""
) -> Redelivery:
    """Run the timeline above for the task that *send* sends (it returns the id of the task w1 pauses in).

    On Redis the visibility timeout re-delivers; for RabbitMQ, *cut* drops
    w1's broker connection (w1 then talks through a proxy) and w2 connects to
    *direct_broker*.
    """
    if cut is None:
        scenario.env["FT_VISIBILITY_TIMEOUT"] = "2"
    w1 = scenario.worker("w1")
    if direct_broker:
        scenario.env["FT_BROKER"] = direct_broker
    task_id = send()
    first = wait_for(lambda: _starts(scenario, task_id), 60, "w1 to read")[0]  # type: ignore[index]
    w1.pause()
    if cut is not None:
        cut()
    w2 = scenario.worker("w2")
    wait_for(lambda: len(_starts(scenario, task_id)) >= 2, 60, "the broker to re-deliver the task to w2")
    second = _starts(scenario, task_id)[1]
    assert second[3] != first[3], "the copy must run in the other worker"
    scenario.release(task_id, second[2])
    wait_for(lambda: f"[{task_id}] succeeded" in w2.log(), 60, "w2 to finish the re-delivered copy")
    w1.resume()
    scenario.release(task_id, first[2])
    run = Redelivery(task_id, w1, w2)
    wait_for(lambda: f"[{task_id}] ignored" in w1.log() or run.successes() >= 2, 60, "w1 to end its copy")
    return run


def _points(scenario: Scenario) -> int:
    return int(scenario.redis.get(scenario.key("points", USER)) or 0)


def _check_applied_once(scenario: Scenario, run: Redelivery) -> None:
    """One apply, logged as a duplicate prevented, and the stored result is the applying execution's."""
    assert _points(scenario) == 1
    assert run.successes() == 1
    assert f"[{run.task_id}] already applied on 'user:{USER}' by another execution (at body)" in run.w1.log()
    result = scenario.client.AsyncResult(run.task_id)
    assert result.state == states.SUCCESS
    record = scenario.redis.get(scenario.key("fence", "applied", f"user:{USER}", run.task_id))  # "<token>:<id>"
    applied_by = record.split(":", 1)[1] if record else None
    sealed_by = scenario.redis.hget(f"celery-task-fence-{run.task_id}", "done")
    assert applied_by is not None and sealed_by == applied_by, "the result must be the applying execution's"


def _check_applied_twice(scenario: Scenario, run: Redelivery) -> None:
    wait_for(lambda: _points(scenario) == 2, 60, "the retry of the refused copy to add again")
    assert run.successes() == 2, "one message, two successful executions"


def _send_add_points(scenario: Scenario, task: str) -> Callable[[], str]:
    return lambda: str(scenario.send(task, USER, 1).id)


@pytest.mark.slow
def test_redis_redelivery_applies_the_quickstart_task_once(scenario: Scenario) -> None:
    """Redis broker: the paused copy resumes after its re-delivered copy added the points; it adds nothing."""
    run = pause_and_redeliver(scenario, _send_add_points(scenario, "add_points"))
    _check_applied_once(scenario, run)


@pytest.mark.slow
def test_redis_redelivery_without_once_applies_twice(scenario: Scenario) -> None:
    """Negative control: fencing alone refuses the stale write, and the retry adds the points a second time."""
    run = pause_and_redeliver(scenario, _send_add_points(scenario, "add_points_repeatable"))
    _check_applied_twice(scenario, run)


def _rabbit_redelivery(setup: tuple[Scenario, TcpProxy, str], task: str) -> tuple[Scenario, Redelivery]:
    scenario, proxy, broker_url = setup
    scenario.env["FT_BROKER"] = proxy.url()

    def cut() -> None:
        assert proxy.cut() >= 1, "w1 had no connection through the proxy"

    scenario.client.conf.broker_url = broker_url
    run = pause_and_redeliver(scenario, _send_add_points(scenario, task), cut=cut, direct_broker=broker_url)
    return scenario, run


@pytest.mark.slow
def test_rabbitmq_redelivery_applies_the_quickstart_task_once(rabbit: Any) -> None:  # noqa: F811
    """RabbitMQ: after w1's connection is cut the message goes to w2; resumed, w1 adds nothing."""
    scenario, run = _rabbit_redelivery(rabbit, "add_points")
    _check_applied_once(scenario, run)


@pytest.mark.slow
def test_rabbitmq_redelivery_without_once_applies_twice(rabbit: Any) -> None:  # noqa: F811
    """Negative control on RabbitMQ: without exactly-once the refused copy retries and adds again."""
    scenario, run = _rabbit_redelivery(rabbit, "add_points_repeatable")
    _check_applied_twice(scenario, run)


def _send_chain(scenario: Scenario, first: str, order: int) -> Callable[[], str]:
    def send() -> str:
        app = scenario.client
        steps = chain(
            app.signature(f"tests.celery.app_under_test.{first}", args=(order,), queue=scenario.name),
            app.signature("tests.celery.app_under_test.send_receipt", args=(order,), queue=scenario.name),
        )
        return str(steps.apply_async().parent.id)

    return send


def _receipts(scenario: Scenario, order: int) -> int:
    return int(scenario.redis.llen(scenario.key("receipts", order)))


@pytest.mark.slow
def test_chain_runs_its_next_step_once(scenario: Scenario) -> None:
    """charge | send_receipt, with charge re-delivered while paused: one charge, one receipt."""
    run = pause_and_redeliver(scenario, _send_chain(scenario, "charge", 1))
    wait_for(lambda: _receipts(scenario, 1) >= 1, 60, "the receipt")
    assert f"[{run.task_id}] ignored" in run.w1.log()
    assert int(scenario.redis.get(scenario.key("charged", 1)) or 0) == 1
    assert _receipts(scenario, 1) == 1


@pytest.mark.slow
def test_chain_without_once_runs_its_next_step_twice(scenario: Scenario) -> None:
    """Negative control: both executions of the first step succeed, and the receipt is sent twice."""
    pause_and_redeliver(scenario, _send_chain(scenario, "charge_repeatable", 1))
    wait_for(lambda: _receipts(scenario, 1) >= 2, 60, "the second receipt")
    assert int(scenario.redis.get(scenario.key("charged", 1)) or 0) == 2


def _linger_and_redeliver(scenario: Scenario, conf: dict[str, Any]) -> tuple[Redelivery, int]:
    """w1 charges and lingers after its write (before its seal); the copy re-delivered to w2 meets w1's record.

    Returns the run and w1's token, which its result holds.
    """
    scenario.env["FT_VISIBILITY_TIMEOUT"] = "2"
    scenario.env["FT_CONF"] = json.dumps(conf)
    w1 = scenario.worker("w1")
    task_id = str(scenario.send("charge_and_linger", 3).id)
    first = wait_for(lambda: _starts(scenario, task_id), 60, "w1 to write and linger")[0]  # type: ignore[index]
    w2 = scenario.worker("w2")
    waiting = f"[{task_id}]: an older execution applied the task and has not sealed it"
    wait_for(lambda: waiting in w2.log(), 60, "the copy re-delivered to w2 to meet w1's record")
    return Redelivery(task_id, w1, w2), int(first[2])


@pytest.mark.slow
def test_copy_that_meets_a_running_executions_record_waits_for_its_seal(scenario: Scenario) -> None:
    """w1 applied and still runs: w2's copy waits for w1's seal and ends as done; w1's result stands."""
    run, w1_token = _linger_and_redeliver(scenario, {})
    scenario.release(run.task_id, w1_token)
    wait_for(lambda: f"[{run.task_id}] ignored" in run.w2.log(), 60, "w2's copy to end as done")
    wait_for(lambda: f"[{run.task_id}] succeeded" in run.w1.log(), 60, "w1 to finish")
    assert int(scenario.redis.get(scenario.key("charged", 3)) or 0) == 1
    assert scenario.client.AsyncResult(run.task_id).get(timeout=10) == w1_token, "the applying execution's result"
    assert "-> ignore" in run.w2.log()


@pytest.mark.slow
def test_copy_that_stops_waiting_too_soon_stores_its_empty_result(scenario: Scenario) -> None:
    """Control: a wait shorter than w1's linger; w2's copy finishes the task first, and None stands for w1's result."""
    run, w1_token = _linger_and_redeliver(scenario, {"fencing_timeout": 0.1})
    wait_for(lambda: f"[{run.task_id}] succeeded" in run.w2.log(), 60, "w2's copy to finish the task")
    scenario.release(run.task_id, w1_token)
    dropped = f"task {run.task_id} already applied by another execution: its SUCCESS result is not stored again"
    wait_for(lambda: dropped in run.w1.log(), 60, "w1's result (its seal) to be refused")
    assert int(scenario.redis.get(scenario.key("charged", 3)) or 0) == 1
    assert scenario.client.AsyncResult(run.task_id).get(timeout=10) is None, "the copy's empty result stood"
