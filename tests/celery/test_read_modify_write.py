"""Read-modify-write on one account under concurrency and random process pauses.

Two prefork workers (concurrency 2 each) run deposit tasks on one account while
a nemesis SIGSTOPs random pool processes. With fencing, the final balance is
the exact sum of the deposits; without (the negative control, same schedule),
updates are lost. Both are asserted, on the Redis broker and on RabbitMQ.

With re-delivery (a one-second visibility timeout and pauses longer than it),
messages run again while their first execution is paused: fencing with
exactly-once (the library's applied records, no check of the test's own) still
counts every deposit once; fencing alone (``fencing_once=False``) refuses the
stale writes, and their retries deposit a second time.
"""

from __future__ import annotations

import re

import pytest
from celery import states

from .conftest import Scenario
from .nemesis import PauseNemesis

DEPOSITS = 200


def _run_deposits(
    scenario: Scenario, task: str, *, pause: tuple[float, float] = (0.05, 0.6)
) -> tuple[int, int, PauseNemesis]:
    workers = [scenario.worker(f"w{n}", pool="prefork", concurrency=2) for n in (1, 2)]
    nemesis = PauseNemesis(lambda: [pid for w in workers for pid in w.pool_pids()], seed=7, pause=pause)
    nemesis.start()
    try:
        results = [scenario.send(task, 42, 1) for _ in range(DEPOSITS)]
        for result in results:
            result.get(timeout=300)
    finally:
        nemesis.stop()
    assert all(result.state == states.SUCCESS for result in results)
    balance = int(scenario.redis.get(scenario.key("balance", 42)) or 0)
    applied = scenario.redis.llen(scenario.key("applied", 42))
    return balance, applied, nemesis


def _rejections(scenario: Scenario) -> dict[str, int]:
    counts = {"claim": 0, "body": 0}
    for worker in scenario.workers:
        for phase in re.findall(r"fenced out at (\w+) on 'account:42'", worker.log()):
            counts[phase] += 1
    return counts


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_scenario(request: pytest.FixtureRequest, scenario: Scenario) -> Scenario:
    if request.param == "rabbitmq":
        scenario.env["FT_BROKER"] = request.getfixturevalue("rabbitmq_url")
    return scenario


@pytest.mark.slow
def test_fenced_deposits_lose_nothing(broker_scenario: Scenario) -> None:
    """With fencing, every deposit counts exactly once although stale attempts were fenced out."""
    balance, applied, nemesis = _run_deposits(broker_scenario, "deposit")
    rejected = _rejections(broker_scenario)
    print(
        f"\nfenced: balance={balance}/{DEPOSITS} applied={applied} pauses={nemesis.proven_pauses} "
        f"stale attempts rejected at claim={rejected['claim']} at write={rejected['body']}"
    )
    assert nemesis.proven_pauses > 0, "the nemesis must really have paused processes"
    assert rejected["claim"] + rejected["body"] > 0, "the schedule must have produced stale attempts"
    assert balance == DEPOSITS
    assert applied == DEPOSITS


@pytest.mark.slow
def test_unfenced_deposits_lose_updates(broker_scenario: Scenario) -> None:
    """Negative control: the same schedule with plain writes loses deposits."""
    balance, applied, nemesis = _run_deposits(broker_scenario, "deposit_unfenced")
    print(f"\nunfenced: balance={balance}/{DEPOSITS} lost updates={DEPOSITS - balance} pauses={nemesis.proven_pauses}")
    assert nemesis.proven_pauses > 0
    assert applied == DEPOSITS, "every task ran and wrote"
    assert balance < DEPOSITS, "without fencing, concurrent read-modify-writes must lose updates"


def _duplicates_prevented(scenario: Scenario) -> int:
    return sum(worker.log().count("already applied on 'account:42'") for worker in scenario.workers)


def _applied_records(scenario: Scenario) -> int:
    return sum(1 for _ in scenario.redis.scan_iter(scenario.key("fence", "applied", "account:42", "*"), count=1000))


@pytest.mark.slow
def test_redelivered_deposits_apply_once(scenario: Scenario) -> None:
    """Re-delivered while paused, each deposit still counts once: the copies find their task id applied."""
    scenario.env.update(FT_VISIBILITY_TIMEOUT="1", FT_THINK="0.05")
    balance, applied, nemesis = _run_deposits(scenario, "deposit", pause=(1.5, 3.0))
    duplicates = _duplicates_prevented(scenario)
    print(f"\nre-delivered, once: balance={balance}/{DEPOSITS} duplicates prevented={duplicates}")
    assert nemesis.proven_pauses > 0
    assert duplicates > 0, "the schedule must have re-delivered tasks that had applied"
    assert balance == DEPOSITS
    assert applied == DEPOSITS
    assert _applied_records(scenario) == DEPOSITS


@pytest.mark.slow
def test_redelivered_deposits_without_once_apply_twice(scenario: Scenario) -> None:
    """Negative control: fencing alone, same schedule; refused copies retry and deposit again."""
    scenario.env.update(FT_VISIBILITY_TIMEOUT="1", FT_THINK="0.05")
    balance, applied, nemesis = _run_deposits(scenario, "deposit_repeatable", pause=(1.5, 3.0))
    print(f"\nre-delivered, fencing only: balance={balance}/{DEPOSITS} double applies={balance - DEPOSITS}")
    assert nemesis.proven_pauses > 0
    assert balance > DEPOSITS, "without exactly-once, retried copies of applied tasks must deposit again"
    assert applied == balance
