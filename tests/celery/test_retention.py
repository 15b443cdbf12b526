"""Nothing fencing stores lives forever: a task id's fence state, records and result fence expire with its result.

1,000 tasks fenced on their task id (the default) run on a real worker with the
fenced result backend and one gated write each; with ``result_expires`` at 2 s
(and the Redis visibility timeout at 2 s, the horizon the records may not go
below), every key fencing wrote for them is counted while they live, and is
gone once the expiry has passed, on Redis's own clock. What stays is one key
per store, not per task: the gate's and the backend's floor, which are what
make a Redis that lost its data refuse every older token.
"""

from __future__ import annotations

import json
import time

import pytest

from .conftest import Scenario

TASKS = 1000


def _fencing_keys(scenario: Scenario, task_ids: set[str]) -> dict[str, int]:
    """Keys the gate (its prefix) and the fenced backend (its fence hashes) hold for *task_ids*, by kind.

    ``floor`` counts the gate's floor key and the backend's: one per store, whatever the tasks.
    """
    counts = {"mark": 0, "grantor": 0, "owner": 0, "applied": 0, "result fence": 0}
    for raw in scenario.redis.scan_iter(scenario.key("fence", "*"), count=5000):
        kind = raw.split(":")[2]
        counts[kind] = counts.get(kind, 0) + 1
    for raw in scenario.redis.scan_iter("celery-task-fence-*", count=5000):
        if raw.removeprefix("celery-task-fence-") in task_ids:
            counts["result fence"] += 1
    counts["floor"] = counts.get("floor", 0) + scenario.redis.exists("celery-task-fence:floor")
    return counts


def _per_task(counts: dict[str, int]) -> int:
    return sum(count for kind, count in counts.items() if kind != "floor")


@pytest.mark.slow
def test_fence_state_of_task_ids_expires_with_the_results(scenario: Scenario) -> None:
    """While the tasks' results live, each task left its mark, owner, applied record and result fence; after
    the expiry none of them is left."""
    scenario.env["FT_VISIBILITY_TIMEOUT"] = "2"
    scenario.env["FT_CONF"] = json.dumps({"result_expires": 2})
    scenario.worker("w", pool="prefork", concurrency=2)
    results = [scenario.send("small_job", n) for n in range(TASKS)]
    assert [result.get(timeout=120) for result in results] == list(range(TASKS))
    task_ids = {result.id for result in results}
    while_alive = _fencing_keys(scenario, task_ids)
    print(f"\nfencing keys of {TASKS} tasks while their results live: {while_alive}")
    # Keys written up to 2 s ago are still there: most of the run's, and the last ones surely.
    assert while_alive["mark"] > 0 and while_alive["applied"] > 0 and while_alive["result fence"] > 0
    deadline = time.monotonic() + 30
    while _per_task(_fencing_keys(scenario, task_ids)):
        assert time.monotonic() < deadline, f"fencing keys left after the expiry: {_fencing_keys(scenario, task_ids)}"
        time.sleep(0.2)
    assert not any(scenario.redis.exists(f"celery-task-meta-{task_id}") for task_id in list(task_ids)[:50])
    assert _fencing_keys(scenario, task_ids)["floor"] == 2, "the gate's and the backend's floor stay, one each"
