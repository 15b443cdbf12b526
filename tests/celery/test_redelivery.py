"""The canonical Celery failure: acks_late + the Redis visibility timeout re-deliver a task
while its first execution is paused (SIGSTOP). Each test runs the scenario with fencing and,
as its negative control, without, and asserts the failure shows only without."""

from __future__ import annotations

from dataclasses import dataclass

from .conftest import Scenario
from .workers import WorkerProcess, wait_for


@dataclass
class Run:
    task_id: str
    stale_token: str
    newer_token: str
    stale_pid: str
    newer_pid: str
    w1: WorkerProcess
    w2: WorkerProcess


def _starts(scenario: Scenario, task_id: str) -> list[list[str]]:
    return [e for e in scenario.events() if e[0] == "start" and e[1] == task_id]


def _finished(worker: WorkerProcess, task_id: str) -> bool:
    log = worker.log()
    return any(f"[{task_id}] {outcome}" in log for outcome in ("succeeded", "ignored", "raised"))


def redeliver_while_paused(scenario: Scenario, task: str, *args: object, stale_finishes_first: bool) -> Run:
    """w1 starts *task* and is SIGSTOPped; the broker re-delivers it to w2; then both finish.

    With *stale_finishes_first*, w1 is resumed and finishes before w2 does;
    otherwise w2 finishes first and w1 resumes afterwards.
    """
    scenario.env["FT_VISIBILITY_TIMEOUT"] = "2"
    w1 = scenario.worker("w1")
    result = scenario.send(task, *args)
    first = wait_for(lambda: _starts(scenario, result.id), 30, "w1 to start the task")[0]  # type: ignore[index]
    w1.pause()
    w2 = scenario.worker("w2")
    wait_for(lambda: len(_starts(scenario, result.id)) >= 2, 60, "the broker to re-deliver the task to w2")
    second = _starts(scenario, result.id)[1]
    run = Run(result.id, first[2], second[2], first[3], second[3], w1, w2)
    order = [(w1, run.stale_token), (w2, run.newer_token)]
    if not stale_finishes_first:
        order.reverse()
    for worker, token in order:
        if worker is w1:
            w1.resume()
        scenario.release(result.id, token)
        wait_for(lambda w=worker: _finished(w, result.id), 60, f"{worker.name} to finish the task")
    return run


def check_the_stale_gated_write_was_refused(scenario: Scenario, run: Run) -> None:
    """After a ``gated_job("j", "v")`` re-delivered while w1 was paused: the newer execution's write stands, and
    the paused one, resumed, was refused and ended as done."""
    assert int(run.newer_token) > int(run.stale_token)
    assert run.stale_pid != run.newer_pid
    assert scenario.redis.get(scenario.key("job", "j")) == f"v@{run.newer_token}"
    # The newer execution applied the task: the resumed one is refused as a duplicate and ends as done.
    assert f"[{run.task_id}] already applied on '{run.task_id}' by another execution (at body)" in run.w1.log()
    assert f"[{run.task_id}] ignored" in run.w1.log()
    assert scenario.client.AsyncResult(run.task_id).get(timeout=10) == f"v@{run.newer_token}"


def test_stale_gated_write_is_rejected(scenario: Scenario) -> None:
    """After SIGCONT, the paused execution's gated write is rejected and it is dropped (ignore policy)."""
    run = redeliver_while_paused(scenario, "gated_job", "j", "v", stale_finishes_first=False)
    check_the_stale_gated_write_was_refused(scenario, run)


def test_without_fencing_the_stale_write_overwrites(scenario: Scenario) -> None:
    """Negative control: the same schedule with plain writes lets the paused execution destroy the newer write."""
    run = redeliver_while_paused(scenario, "gated_job", "j", "v", False, stale_finishes_first=False)
    assert scenario.redis.get(scenario.key("job", "j")) == f"v@{run.stale_token}"


def test_stale_result_write_is_dropped(scenario: Scenario) -> None:
    """Without exactly-once, the paused execution's result write is dropped and logged; the newer one's stands."""
    run = redeliver_while_paused(scenario, "result_only_job_repeatable", "v", stale_finishes_first=True)
    assert "dropped SUCCESS result of task " + run.task_id in run.w1.log()
    stored = scenario.client.AsyncResult(run.task_id).get(timeout=10)
    assert stored == f"v@{run.newer_token}@{run.newer_pid}"


def test_first_execution_to_finish_seals_the_task(scenario: Scenario) -> None:
    """With exactly-once, the execution that finishes first seals the task: its result stands, the other ends as done.

    Here the paused execution resumes and finishes first; the newer one then
    finds the task sealed and its result is not stored. The task has no
    callbacks, so the seal rides on the result write itself.
    """
    run = redeliver_while_paused(scenario, "result_only_job", "v", stale_finishes_first=True)
    stored = scenario.client.AsyncResult(run.task_id).get(timeout=10)
    assert stored == f"v@{run.stale_token}@{run.stale_pid}"
    assert f"task {run.task_id} already applied by another execution: its SUCCESS result" in run.w2.log()
    assert "dropped SUCCESS result" not in run.w1.log() + run.w2.log()


def test_without_fenced_backend_the_stale_result_wins(scenario: Scenario) -> None:
    """Negative control: with the plain Redis backend the stale execution's result is the one stored."""
    scenario.env["FT_BACKEND"] = scenario.env["FT_BACKEND"].removeprefix("fenced+")
    run = redeliver_while_paused(scenario, "result_only_job_repeatable", "v", stale_finishes_first=True)
    stored = scenario.client.AsyncResult(run.task_id).get(timeout=10)
    assert stored == f"v@{run.stale_token}@{run.stale_pid}"
