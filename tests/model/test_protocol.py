"""The protocol model (tests/model/protocol.py): what it finds in the rules today, with blocks, and in the fixed rules.

Each world is small enough to explore whole in a second or two; the deeper
worlds run with ``python -m tests.model.protocol`` (a minute or so).
"""

from __future__ import annotations

import pytest

from tests.model.protocol import Config, Protocol, explore

TODAY = Protocol(ignore_refused_claim=True)
FIXED = Protocol()


def test_refused_claim_ignored_loses_a_task_with_blocks_after_one_crash() -> None:
    """With token blocks, "a refused claim means a newer execution exists" drops the re-delivered copy of a dead one.

    One fault is enough: the newer copy claims with a token of a new block and
    dies; its message comes back to a process holding an older block, whose
    lower token is refused and ignored. Nobody applies the task.
    """
    result = explore(Config(block_size=2, redeliveries=0), TODAY)
    assert result.lost, "the model should find the lost task"
    trace = " | ".join(result.lost)
    assert "crashes" in trace and "refused" in trace and "ignore" in trace
    assert not result.applied_twice


def test_refused_claim_ignored_is_safe_without_blocks_when_only_crashes_redeliver() -> None:
    """Today's rule with a token per task (K=1) and re-delivery only after a crash: every task applied once."""
    result = explore(Config(block_size=1, redeliveries=0), TODAY)
    assert result.final > 0
    assert not result.lost and not result.applied_twice


def test_refused_claim_ignored_loses_a_task_without_blocks_on_pause_and_crash() -> None:
    """Today's rule, a token per task: a paused copy whose message was re-delivered, then the newer copy dies.

    The paused copy's claim is refused, it acks and drops; the ack removes the
    unacked entry that every delivery of the message shares (kombu's Redis
    transport keys it by the delivery tag, which a restored message keeps), so
    the newer copy's death brings nothing back.
    """
    result = explore(Config(block_size=1), TODAY)
    assert result.lost
    trace = " | ".join(result.lost)
    assert "re-delivered while its holder is paused" in trace and "crashes" in trace and "ignore" in trace


@pytest.mark.parametrize(
    "config",
    [
        Config(block_size=1),
        Config(block_size=2),
        Config(block_size=3, max_blocks=5),
        Config(block_size=2, resources=("acct", "acct")),
    ],
    ids=["token-per-task", "blocks-of-2", "blocks-of-3", "shared-resource"],
)
def test_fixed_protocol_applies_every_task_exactly_once(config: Config) -> None:
    """Re-mint fresh before concluding, and defer (retry later) instead of dropping: nothing lost, nothing twice."""
    result = explore(config, FIXED)
    assert result.final > 100, "the search should reach many final states"
    assert not result.lost, " | ".join(result.lost)
    assert not result.applied_twice, " | ".join(result.applied_twice)


def test_without_exactly_once_records_a_redelivered_task_applies_twice() -> None:
    """The control for "at most once": fencing alone lets the re-delivered copy apply the task again."""
    result = explore(Config(block_size=2), Protocol(exactly_once=False))
    assert result.applied_twice
    assert "re-delivered" in " | ".join(result.applied_twice)


@pytest.mark.parametrize(
    ("config", "skip"),
    [
        (Config(block_size=2), "first"),
        (Config(block_size=3, max_blocks=5), "first"),
        (Config(block_size=2), "unflagged"),
    ],
    ids=["blocks-of-2", "blocks-of-3", "blocks-of-2-unflagged"],
)
def test_first_delivery_without_a_claim_still_applies_every_task_once(config: Config, skip: str) -> None:
    """The library's rule (issue 15): a first delivery of a task fenced on its own id skips its claim.

    The records at the write keep every task applied exactly once, also when
    the broker never flags a re-delivery (``unflagged``: every delivery of
    the task's message skips its claim). The claim is most of what a fenced
    task costs per execution; see docs/performance.md for what else the claim
    did and where the library keeps it.
    """
    result = explore(config, Protocol(skip_claim=skip))
    assert result.final > 100, "the search should reach many final states"
    assert not result.lost, " | ".join(result.lost)
    assert not result.applied_twice, " | ".join(result.applied_twice)
    assert result.states != explore(config, FIXED).states, "skipping the claim must change what the search explores"
