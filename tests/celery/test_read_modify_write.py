"""Read-modify-write on one account under concurrency and random process pauses.

Two workers (concurrency 2 each) run deposit tasks on one account while a
nemesis SIGSTOPs random processes that run them. With fencing, the final
balance is the exact sum of the deposits; without (the negative control, same
schedule), updates are lost. Both are asserted on prefork workers (the nemesis
pauses pool children), on the Redis broker and on RabbitMQ, and on gevent,
threads and solo workers on the Redis broker (the nemesis pauses a whole
worker: a gevent or threads worker's two executions stop together, each
mid-way and holding its own token).

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
from .pools import start_pool_worker, task_processes

DEPOSITS = 200


def _run_deposits(
    scenario: Scenario, task: str, *, pool: str = "prefork", pause: tuple[float, float] = (0.05, 0.6)
) -> tuple[int, int, PauseNemesis]:
    workers = [start_pool_worker(scenario, f"w{n}", pool, concurrency=2) for n in (1, 2)]
    nemesis = PauseNemesis(lambda: [pid for w in workers for pid in task_processes(w, pool)], seed=7, pause=pause)
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


# (broker, pool): prefork on both brokers; gevent, threads and solo on Redis (two solo workers
# run one deposit each at a time: the race is between the workers).
WORLDS = [
    ("redis", "prefork"),
    ("rabbitmq", "prefork"),
    ("redis", "gevent"),
    ("redis", "eventlet"),
    ("redis", "threads"),
    ("redis", "solo"),
]


@pytest.fixture(params=WORLDS, ids=["-".join(world) for world in WORLDS])
def world(request: pytest.FixtureRequest, scenario: Scenario) -> tuple[Scenario, str]:
    """A scenario on one broker, and the pool its workers run."""
    broker, pool = request.param
    if broker == "rabbitmq":
        scenario.env["FT_BROKER"] = request.getfixturevalue("rabbitmq_url")
    return scenario, pool


@pytest.mark.slow
def test_fenced_deposits_lose_nothing(world: tuple[Scenario, str]) -> None:
    """With fencing, every deposit counts exactly once although stale attempts were fenced out."""
    scenario, pool = world
    balance, applied, nemesis = _run_deposits(scenario, "deposit", pool=pool)
    rejected = _rejections(scenario)
    print(
        f"\nfenced, {pool}: balance={balance}/{DEPOSITS} applied={applied} pauses={nemesis.proven_pauses} "
        f"stale attempts rejected at claim={rejected['claim']} at write={rejected['body']}"
    )
    assert nemesis.proven_pauses > 0, "the nemesis must really have paused processes"
    assert rejected["claim"] + rejected["body"] > 0, "the schedule must have produced stale attempts"
    assert balance == DEPOSITS
    assert applied == DEPOSITS


@pytest.mark.slow
def test_unfenced_deposits_lose_updates(world: tuple[Scenario, str]) -> None:
    """Negative control: the same schedule with plain writes loses deposits."""
    scenario, pool = world
    balance, applied, nemesis = _run_deposits(scenario, "deposit_unfenced", pool=pool)
    print(
        f"\nunfenced, {pool}: balance={balance}/{DEPOSITS} lost updates={DEPOSITS - balance} "
        f"pauses={nemesis.proven_pauses}"
    )
    assert nemesis.proven_pauses > 0
    # Every task ran and wrote; a paused one the broker re-delivered may have written twice (nothing stops it here).
    assert applied >= DEPOSITS, "every task ran and wrote"
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
