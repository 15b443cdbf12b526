"""The checker on hand-made histories: clean ones pass, each kind of violation is flagged and counted."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from reliability.checker import AuditRow, Fault, Observation, RedisState, check, format_table

R = "acct:s:0"


@dataclass
class Build:
    """Writes a side's history, audit table and final state the way the workload does."""

    side: str = "fenced"
    t: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    audit: list[AuditRow] = field(default_factory=list)
    balances: dict[str, int] = field(default_factory=dict)
    submitted: dict[str, str] = field(default_factory=dict)
    redis: dict[str, RedisState] = field(default_factory=dict)

    def at(self, t: float) -> Build:
        self.t = t
        return self

    def ev(self, ev: str, task: str, token: int | None, resource: str = R, **extra: Any) -> None:
        self.t += 0.01
        self.events.append({"ev": ev, "t": self.t, "task": task, "token": token, "resource": resource, **extra})

    def submit(self, task: str, resource: str = R) -> None:
        self.submitted[task] = resource
        self.balances.setdefault(resource, 0)
        self.redis.setdefault(resource, RedisState(balance=None, epoch="e1"))

    def start(self, task: str, token: int, resource: str = R) -> None:
        self.ev("minted", task, token, resource)
        self.ev("invoke", task, token, resource)

    def commit(self, task: str, token: int, read: int, resource: str = R, *, redis: bool = True) -> None:
        self.write_pg(task, token, read, resource)
        if redis:
            self.write_redis(task, token, read, resource)
        self.ev("ok", task, token, resource)

    def write_pg(self, task: str, token: int, read: int, resource: str = R) -> None:
        """The PostgreSQL half alone, committed (``pg-ok``): a kill may follow."""
        self.ev("write", task, token, resource, read=read)
        seq = len(self.audit) + 1
        self.audit.append(AuditRow(seq, task, resource, token, read, read + 1))
        self.balances[resource] = read + 1
        self.ev("pg-ok", task, token, resource, seq=seq)

    def write_redis(self, task: str, token: int, read: int, resource: str = R) -> None:
        state = self.redis.setdefault(resource, RedisState(epoch="e1"))
        state.balance = read + 1
        state.applied.add(task)
        state.log.append((task, token, len(state.log) + 1))
        self.ev("redis-ok", task, token, resource, epoch=state.epoch, seq=len(state.log))

    def resume(self, task: str, token: int, read: int, resource: str = R) -> None:
        """The newest execution meets the task applied at PostgreSQL (``pg-dup``) and goes on to Redis."""
        self.ev("write", task, token, resource, read=read)
        self.ev("pg-dup", task, token, resource, superseded=False, high_water=None)
        self.write_redis(task, token, self.redis[resource].balance or 0, resource)
        self.ev("ok", task, token, resource)

    def refuse(self, task: str, token: int, high: int, resource: str = R, *, phase: str = "body") -> None:
        if phase == "body":
            self.ev("write", task, token, resource, read=0)
        stale = {"action": "retry", "high_water": high, "error": "StaleTokenError"}
        self.ev("rejected", task, token, resource, phase=phase, **stale)

    def observe(self, faults: list[Fault] | None = None, *, redis: bool = True) -> Observation:
        return Observation(
            side=self.side,
            submitted=self.submitted,
            events=self.events,
            audit=self.audit,
            balances=self.balances,
            redis=self.redis if redis else None,
            faults=faults or [],
            started=0.0,
            ended=self.t + 1,
        )


def sequential(n: int = 3) -> Build:
    b = Build()
    for i in range(n):
        b.submit(f"t{i}")
        b.start(f"t{i}", 10 + i)
        b.commit(f"t{i}", 10 + i, read=i)
    return b


def test_sequential_history_passes() -> None:
    """Three tasks one after another: applied once each, nothing flagged, final value = writes = tasks."""
    fig = check(sequential().observe())
    assert fig.ok and fig.safety_violations == 0
    assert (fig.tasks, fig.applied, fig.accepted_writes, fig.final_value) == (3, 3, 3, 3)
    assert fig.overlap_windows == 0 and fig.stale_writes_attempted == 0 and fig.unknown_outcomes == 0


def test_fenced_out_write_then_retry_passes() -> None:
    """A stale write refused by the gate and retried with a newer token is counted, not flagged."""
    b = Build()
    b.submit("a")
    b.submit("b")
    b.start("a", 10)
    b.start("b", 11)  # b claims while a thinks
    b.commit("b", 11, read=0)
    b.refuse("a", 10, high=11)
    b.start("a", 12)  # the retry
    b.commit("a", 12, read=1)
    fig = check(b.observe())
    assert fig.ok, fig.examples
    assert fig.overlap_windows == 1
    assert fig.stale_writes_attempted == 1 and fig.stale_accepted == 0 and fig.rejected_at_write == 1
    assert fig.attempts == 3


def test_lost_update_is_flagged() -> None:
    """Two overlapping read-modify-writes that both read 0 lose one update; the older write is stale."""
    b = Build(side="control")
    b.submit("a")
    b.submit("b")
    b.start("a", 10)
    b.start("b", 11)
    b.commit("b", 11, read=0)
    b.commit("a", 10, read=0)  # accepted although token 11 was claimed before: stale, lost update
    fig = check(b.observe())
    assert fig.lost_updates == 1
    assert fig.stale_accepted == 1 and fig.stale_writes_attempted == 1
    assert fig.non_monotonic == 1
    assert not fig.ok and fig.safety_violations >= 3
    assert "lost_updates" in fig.examples and "stale_accepted" in fig.examples


def test_non_monotonic_commit_order_is_flagged_without_timing_evidence() -> None:
    """Tokens that go down in commit order are flagged even when the events cannot show staleness."""
    b = Build()
    b.submit("a")
    b.submit("b")
    b.start("a", 10)
    b.commit("a", 10, read=0)
    b.audit[-1] = AuditRow(1, "a", R, 20, 0, 1)  # the audit says a committed token 20
    b.start("b", 11)
    b.commit("b", 11, read=1)
    fig = check(b.observe())
    assert fig.non_monotonic == 1 and fig.stale_accepted == 0


def test_duplicate_effect_is_flagged() -> None:
    """A task id with two audit rows is a duplicate effect, and the balance counts it twice."""
    b = sequential(1)
    b.start("t0", 20)  # a re-delivered copy that did not see the first commit
    b.commit("t0", 20, read=1)
    fig = check(b.observe())
    assert fig.duplicate_effects == 1 and not fig.ok
    assert fig.applied == 1 and fig.accepted_writes == 2


def test_missing_and_unsubmitted_tasks_are_flagged() -> None:
    """A submitted task never applied, and an applied task nobody submitted, both break completeness."""
    b = sequential(2)
    b.submit("never")
    b.start("ghost", 30)
    b.commit("ghost", 30, read=2)
    fig = check(b.observe())
    assert fig.missing == 1 and fig.unsubmitted == 1
    assert fig.safety_violations == 0 and fig.completeness_violations == 2


def test_rejection_without_a_later_attempt_is_flagged() -> None:
    """A rejection whose action is retry must be followed by a later attempt of the same task, or a duplicate."""
    b = Build()
    b.submit("a")
    b.start("a", 10)
    b.refuse("a", 10, high=11)
    fig = check(b.observe())
    assert fig.unanswered == 1 and fig.missing == 1
    # The library ending an execution of the task as done (another one applied) answers it too, ...
    b.ev("duplicate", "a", 11, phase="seal", action="ignore", superseded=False, high_water=None)
    fig = check(b.observe())
    assert fig.unanswered == 0 and fig.unknown_outcomes == 0
    # ... but never stands in for the audit row it implies.
    assert fig.missing == 1 and not fig.ok


@pytest.mark.parametrize(("action", "unanswered"), [("defer", 1), ("retry", 1), ("ignore", 0)])
def test_a_deferral_promises_a_later_attempt_as_a_retry_does(action: str, unanswered: int) -> None:
    """``defer`` publishes a retry: with no later attempt it is unanswered; ``ignore`` is a drop, shown as missing."""
    b = Build()
    b.submit("a")
    b.start("a", 10)
    b.ev("rejected", "a", 10, phase="claim", action=action, high_water=11, error="StaleTokenError")
    fig = check(b.observe())
    assert fig.unanswered == unanswered and fig.missing == 1


def test_storage_error_needs_a_retry_and_unknown_outcome_is_resolved() -> None:
    """An unknown outcome (error after the commit was sent) is followed by a retry and resolved by the audit."""
    b = Build()
    b.submit("a")
    b.start("a", 10)
    b.write_pg("a", 10, read=0)  # it did commit, ...
    b.events.pop()  # ... but the reply was lost
    b.ev("unknown", "a", 10, phase="pg", error="OperationalError")
    b.start("a", 11)
    b.resume("a", 11, read=1)
    fig = check(b.observe())
    assert fig.ok, fig.examples
    assert fig.unknown_outcomes == 1 and fig.unknown_committed == 1
    b.events = [e for e in b.events if e["token"] != 11]  # no retry at all
    assert check(b.observe()).unanswered == 1


def test_execution_ended_by_the_library_as_a_duplicate_is_answered() -> None:
    """An execution the library ended as done (``duplicate``) has its outcome: not unknown, not unanswered."""
    b = Build()
    b.submit("a")
    b.start("a", 10)  # paused past the visibility timeout after its claim
    b.start("a", 11)  # the re-delivered copy claims, applies and finishes
    b.commit("a", 11, read=0)
    b.ev("write", "a", 10, read=0)  # the paused one resumes: the SQL gate finds the record, superseded
    b.ev("duplicate", "a", 10, phase="body", action="ignore", superseded=True, high_water=11)
    fig = check(b.observe())
    assert fig.ok, fig.examples
    assert fig.duplicates_prevented == 1 and fig.duplicate_writes_skipped == 0
    assert fig.unknown_outcomes == 0 and fig.unanswered == 0 and fig.missing == 0
    assert fig.stale_writes_attempted == 1 and fig.stale_accepted == 0
    assert "duplicates prevented (store writes skipped)" in format_table([fig])


def test_newest_execution_resumes_past_the_store_already_applied() -> None:
    """Killed between its two stores, a task is finished by its re-delivered copy: pg-dup, then the Redis write."""
    b = Build()
    b.submit("a")
    b.start("a", 10)
    b.write_pg("a", 10, read=0)  # then kill -9, before the Redis write
    b.start("a", 11)
    b.resume("a", 11, read=1)
    assert b.redis[R].balance == 1 and b.redis[R].log == [("a", 11, 1)]
    fig = check(b.observe())
    assert fig.ok, fig.examples
    assert fig.duplicate_writes_skipped == 1 and fig.duplicates_prevented == 0
    assert fig.unknown_outcomes == 1 and fig.unknown_committed == 1


def test_token_re_minted_before_its_claim_is_no_unknown_outcome() -> None:
    """A token minted and then nothing, then a fresh mint of the task in the same process: re-minted, not unknown."""
    b = Build()
    b.submit("a")
    b.ev("minted", "a", 3, pid=7)  # a block's token, refused at the claim: the library mints fresh
    b.ev("minted", "a", 9, pid=7)
    b.ev("invoke", "a", 9, pid=7)
    b.ev("ok", "a", 9, pid=7)
    fig = check(b.observe())
    assert fig.reminted == 1 and fig.unknown_outcomes == 0
    # Another process's later mint (a re-delivered copy) does not explain a token: that one is unknown.
    b.ev("minted", "a", 2, pid=8)
    b.ev("minted", "a", 10, pid=9)
    assert check(b.observe()).unknown_outcomes >= 1


def test_killed_execution_is_an_unknown_outcome() -> None:
    """An execution with no outcome event at all (killed) counts as unknown; not committed here."""
    b = sequential(1)
    b.start("t0", 5)  # an earlier execution that was killed during its think time
    fig = check(b.observe())
    assert fig.unknown_outcomes == 1 and fig.unknown_committed == 0 and fig.ok


def test_balance_without_its_audit_row_is_flagged() -> None:
    """A balance that is not the last audit row's new value means a write without its audit (or the reverse)."""
    b = sequential(2)
    b.balances[R] = 5
    b.redis[R].balance = 5
    fig = check(b.observe())
    assert fig.balance_mismatch == 1 and not fig.ok


def test_redis_disagreement_is_a_violation() -> None:
    """Redis and PostgreSQL must agree on balance and applied task ids when Redis kept its state."""
    b = sequential(2)
    b.redis[R].balance = 1
    fig = check(b.observe())
    assert fig.redis_disagreements == 1 and fig.redis_state_losses == 0
    assert fig.safety_violations == 1


def test_redis_state_loss_is_reported_with_stale_writes_across_it() -> None:
    """A Redis that lost its state (new epoch) is reported; a write below a pre-loss token is a violation."""
    b = sequential(2)  # tokens 10, 11 accepted in epoch e1
    b.submit("late")
    b.start("late", 9)  # minted before, claimed before the restart, writes after it
    b.ev("write", "late", 9, read=0)
    b.redis[R] = RedisState(balance=1, epoch="e2", applied={"late"}, log=[("late", 9, 1)])
    b.ev("redis-ok", "late", 9, epoch="e2", seq=1)
    b.ev("rejected", "late", 9, phase="body", action="retry", error="StaleTokenError")  # PostgreSQL refuses
    b.start("late", 12)
    b.commit("late", 12, read=2, redis=False)
    b.ev("redis-dup", "late", 12, epoch="e2", seq=0)
    fig = check(b.observe())
    assert fig.redis_state_losses == 1 and fig.redis_stale_after_loss == 1
    # The stale write carried a balance read before the loss: 1 applied since, but not what PostgreSQL applied.
    assert fig.redis_disagreements == 0, "after a loss, Redis agrees when its balance counts its own epoch"
    assert fig.safety_violations == 1, "a write below a pre-loss token accepted after the loss: the floor's job"


def test_redis_log_with_decreasing_tokens_is_flagged() -> None:
    """In one epoch, the Redis log must carry strictly increasing tokens, each task once."""
    b = sequential(2)
    b.redis[R].log = [("t0", 11, 1), ("t1", 10, 2), ("t1", 12, 3)]
    fig = check(b.observe())
    assert fig.redis_non_monotonic == 1 and fig.redis_duplicates == 1


def test_faults_and_recovery_time() -> None:
    """Faults count per side (server faults on both), with proofs; recovery is the time to the next commit."""
    b = Build()
    b.submit("a")
    b.at(10.0).start("a", 10)
    b.commit("a", 10, read=0)  # pg-ok at 10.04
    faults = [
        Fault("pause-past-session", "fenced", "w1:1", 1.0, 9.0, True),
        Fault("pause-past-session", "control", "w2:2", 1.0, 9.0, True),
        Fault("pg-restart", "both", "pg", 2.0, 8.0, False),
    ]
    fig = check(b.observe(faults))
    assert (fig.faults_injected, fig.faults_proven) == (2, 1)
    assert fig.faults_by_kind == {"pause-past-session": 1, "pg-restart": 1}
    assert fig.recovery_max is not None and abs(fig.recovery_max - 2.04) < 1e-6


def test_checker_scales_n_log_n() -> None:
    """100,000 events over 10 resources are checked in seconds (a quadratic rule would take minutes)."""
    b = Build()
    for i in range(20_000):
        resource = f"acct:s:{i % 10}"
        b.submit(f"t{i}", resource)
        b.start(f"t{i}", 100 + i, resource)
        b.commit(f"t{i}", 100 + i, read=b.balances[resource], resource=resource, redis=False)
    began = time.monotonic()
    fig = check(b.observe(redis=False))
    assert fig.ok and fig.tasks == 20_000
    assert time.monotonic() - began < 20


def test_table_lists_both_sides() -> None:
    """The printed table has one column per side and a safety-violation row."""
    fenced = check(sequential().observe())
    text = format_table([fenced, fenced])
    assert "stale writes accepted" in text and "safety violations" in text
    assert format_table([fenced], markdown=True).startswith("|  | fenced |")
