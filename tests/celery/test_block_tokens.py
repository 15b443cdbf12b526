"""Token blocks on real workers: the re-delivered copy draws the *lower* token, and the task is still applied once.

The timeline (Redis broker, ``acks_late``, a 4 s visibility timeout, the
SQLite source with its default blocks of 1,024): worker A reserves its block
first (a warm-up task); A is frozen; worker B (prefork, two processes)
reserves newer blocks, takes task T and is held at T's pause point; a canary
task is held in B's other process. A resumes, and the broker re-delivers T
(and the canary) to it. A's next token comes from A's older block: **below**
B's, though handed out later.

By default B's copy, T's first delivery, does not claim (exactly once makes
that claim redundant): A's re-delivered copy claims with its lower token,
passes, and applies T; B, released, meets A's record at its write and ends as
done. With ``fencing_claim_first_delivery`` B claims T's task id with its
token before its body, so A's claim is refused, and B is SIGKILLed at the
point (the newer copy dies):

* With blocks declared (the library): a refusal of a block token proves
  nothing, so A mints fresh (a new block, above every token handed out
  before), claims, and applies T once.
* Negative control: the same source with its block tokens passed off as fresh
  (``BlocksPassedOffAsFresh`` in app_under_test.py), and ``ignore`` for the
  refused copy, the rule the protocol model (tests/model/protocol.py) shows
  losing a task: A takes the refusal at its word, acks and drops T; its ack
  removes B's unacked entry too (one delivery tag per message on kombu's
  Redis transport), B dies, and T is never applied.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from celery import states

from celery_fencing.testing.pause import PausePoints

from .conftest import Scenario
from .test_dropped_copies import (
    VISIBILITY_TIMEOUT,
    _arrivals_of,
    _count,
    _kill,
    _messages_of,
    points,  # noqa: F401  (fixture)
)
from .workers import WorkerProcess, wait_for


@dataclass
class Timeline:
    result: Any  # T's AsyncResult
    canary: Any
    a: WorkerProcess
    b: WorkerProcess
    a_warm: int  # the first token of A's block


def newer_copy_holds_a_newer_block(
    scenario: Scenario,
    points: PausePoints,  # noqa: F811
    held: int,
    *,
    claim_first_delivery: bool = True,
) -> Timeline:
    """Run the timeline up to the re-delivery of T to A (holding the first *held* arrivals at the pause point)."""
    scenario.env.update(points.env)
    scenario.env["FT_VISIBILITY_TIMEOUT"] = str(VISIBILITY_TIMEOUT)
    unacked = {f"unacked{suffix}_key": scenario.key(f"unacked{suffix}") for suffix in ("", "_index", "_mutex")}
    conf = {"broker_transport_options": unacked, "fencing_claim_first_delivery": claim_first_delivery}
    scenario.env["FT_CONF"] = json.dumps(conf)
    a = scenario.worker("a")
    a_warm = int(scenario.send("task_id_token").get(timeout=60))  # A reserves its block now
    # ...and arms the stores (the gate too) with floors below B's tokens: no floor gets in the way.
    assert scenario.send("count_once_ignore", "warm-up").get(timeout=60) == 1
    a.pause()
    # Paused while idle, A may have a BRPOP outstanding, and Redis hands it the next message even so
    # (it then sits in A's socket, in no unacked set, until A resumes): a decoy takes that place.
    scenario.send("send_receipt", "decoy", 0)
    b = scenario.worker("b", pool="prefork", concurrency=2)
    b_warm = int(scenario.send("task_id_token").get(timeout=60))
    assert b_warm > a_warm, "B's block is newer than A's"
    points.hold("count", times=held)
    result = scenario.send("count_once_ignore", "t")
    in_b = points.wait("count", 2, timeout=60)  # the first arrival was A's warm-up
    assert in_b.task_id == result.id and in_b.token is not None and in_b.token > a_warm
    canary = scenario.send("count_once_ignore", "canary")
    assert points.wait("count", 3, timeout=60).task_id == canary.id
    a.resume()  # the visibility timeout re-delivers T to A, whose block is the older one
    return Timeline(result, canary, a, b, a_warm)


@pytest.mark.slow
def test_the_redelivered_copy_with_the_lower_block_token_applies_once_over_an_unclaimed_first_delivery(
    scenario: Scenario,
    points: PausePoints,  # noqa: F811
) -> None:
    """B's first delivery claims nothing; A's re-delivered copy applies T with its lower token; B ends as done."""
    run = newer_copy_holds_a_newer_block(scenario, points, held=2, claim_first_delivery=False)
    wait_for(lambda: len(_arrivals_of(points, run.result.id)) >= 2, 60, "the broker to re-deliver T to A")
    in_b, in_a = _arrivals_of(points, run.result.id)[:2]
    assert in_a.pid != in_b.pid and in_a.token is not None and in_b.token is not None
    # A drew from its older block, below B's token, and nothing refused it: B had claimed nothing.
    assert in_a.token < in_b.token, (in_a.token, in_b.token)
    assert run.result.get(timeout=60) == 1
    in_b.release()
    wait_for(
        lambda: f"[{run.result.id}] already applied on '{run.result.id}'" in run.b.log(),
        60,
        "B's copy to meet A's record at its write",
    )
    assert _count(scenario, "t") == 1, "T applied once, by A"
    assert run.result.get(timeout=60) == 1 and run.result.state == states.SUCCESS, "A's result stands"
    assert len(_arrivals_of(points, run.result.id)) == 2
    wait_for(lambda: _messages_of(scenario, run.result.id) == [], 60, "both copies to be acknowledged")


@pytest.mark.slow
def test_the_copy_with_the_lower_block_token_mints_fresh_and_applies_once(
    scenario: Scenario,
    points: PausePoints,  # noqa: F811
) -> None:
    """A's block token is refused; A mints fresh, claims above B, and applies T once; B dies."""
    run = newer_copy_holds_a_newer_block(scenario, points, held=2)  # T in B, the canary
    in_b = _arrivals_of(points, run.result.id)[0]
    # The canary comes back to A too (its visibility timeout passes as well): find T's arrival in A.
    wait_for(lambda: len(_arrivals_of(points, run.result.id)) >= 2, 60, "the broker to re-deliver T to A")
    in_a = _arrivals_of(points, run.result.id)[1]
    assert in_a.pid != in_b.pid and in_a.token is not None and in_b.token is not None
    # A's old block still had tokens just above its warm-up ones; A claimed with a fresh block's, above B's.
    assert in_a.token > in_b.token > run.a_warm + 2, (run.a_warm, in_b.token, in_a.token)
    _kill(run.b)
    assert run.result.get(timeout=60) == 1
    assert run.result.state == states.SUCCESS
    assert run.canary.get(timeout=60) == 1, "the canary was re-delivered to A and applied there"
    assert _count(scenario, "t") == 1 and _count(scenario, "canary") == 1
    assert len(_arrivals_of(points, run.result.id)) == 2, "T ran in B (held, then killed) and once in A"
    assert _messages_of(scenario, run.result.id) == []


@pytest.mark.slow
def test_block_tokens_passed_off_as_fresh_lose_the_task_when_the_newer_copy_dies(
    scenario: Scenario,
    points: PausePoints,  # noqa: F811
) -> None:
    """Negative control: A takes its block token's refusal at its word and drops T; B dies; T is never applied."""
    scenario.env["FT_BLOCKS_PASSED_OFF_AS_FRESH"] = "1"
    run = newer_copy_holds_a_newer_block(scenario, points, held=2)  # T in B, the canary
    wait_for(lambda: f"[{run.result.id}] ignored" in run.a.log(), 60, "A to drop its refused copy")
    assert f"fenced out at claim on '{run.result.id}'" in run.a.log()
    _kill(run.b)
    # The sweep ran: B's younger entry, the canary's, came back to A, which dropped it the same way.
    wait_for(lambda: f"[{run.canary.id}] ignored" in run.a.log(), 60, "the canary to come back to A")
    assert _count(scenario, "t") == 0 and _count(scenario, "canary") == 0
    assert len(_arrivals_of(points, run.result.id)) == 1, "nothing ran T again"
    assert _messages_of(scenario, run.result.id) == []
    assert scenario.client.AsyncResult(run.result.id).state == states.PENDING
