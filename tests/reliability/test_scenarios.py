"""The CI profile: every fault kind, briefly, on real workers, with fencing and (as the negative control) without.

Each test runs one phase of reliability.scenarios in the module's world. With
fencing, nothing may go wrong: no stale write accepted, no lost update, no
duplicate effect, every task applied exactly once, Redis agreeing with
PostgreSQL. Without fencing, on the same schedule, the checker must find
violations, or the phase would prove nothing. The faults must really have
happened (proven: a process seen stopped, a leader replaced, ...).

Run with ``-s`` to see each phase's figures; they are also appended to
``figures.txt`` in the world's directory, and one markdown row per phase to
``summary.md`` there (fenced / control in each cell).
"""

from __future__ import annotations

import pytest
import redis

from celery_fencing.operations.doctor import Doctor
from reliability.scenarios import ci_phase
from reliability.world import PhaseResult, World

pytestmark = pytest.mark.slow


def _report(world: World, result: PhaseResult) -> str:
    proofs = "\n".join(
        f"  {f.kind:<20} {f.side:<8} {f.target:<22} {'proven' if f.proven else 'NOT PROVEN'}: {f.proof}"
        for f in result.faults
    )
    text = (
        f"\n== {result.spec.name} ({result.wall:.0f}s, drained: {result.drained})\n{result.table()}\n"
        f"fenced examples: {result.fenced.examples}\ncontrol examples: {result.control.examples}\n"
        f"faults:\n{proofs}\n"
    )
    with (world.root / "figures.txt").open("a") as handle:
        handle.write(text)
    f, c = result.fenced, result.control
    row = (
        f"| {result.spec.name} | {f.faults_proven}/{f.faults_injected} | {f.tasks} | {f.attempts} / {c.attempts} "
        f"| {f.stale_writes_attempted} / {c.stale_writes_attempted} "
        f"| {f.stale_accepted} / {c.stale_accepted} | {f.lost_updates} / {c.lost_updates} "
        f"| {f.duplicate_effects} / {c.duplicate_effects} | {f.missing} / {c.missing} "
        f"| {f.safety_violations} / {c.safety_violations} | {result.wall:.0f} |\n"
    )
    with (world.root / "summary.md").open("a") as handle:
        handle.write(row)
    print(text)
    return text


def run_and_check(world: World, name: str, kinds: tuple[str, ...], *, control_must_fail: bool = True) -> PhaseResult:
    result = world.run_phase(ci_phase(name))
    report = _report(world, result)
    fenced, control = result.fenced, result.control
    for kind in kinds:
        proven = [f for f in result.faults if f.kind == kind and f.proven]
        assert proven, f"no proven {kind} fault: the phase did not do what it claims{report}"
    assert fenced.stale_accepted == 0 and fenced.lost_updates == 0 and fenced.duplicate_effects == 0, report
    assert fenced.ok, f"the fenced side broke a rule{report}"
    assert fenced.applied == fenced.tasks > 0 and fenced.final_value == fenced.accepted_writes == fenced.tasks, report
    if control_must_fail:
        assert control.safety_violations > 0, f"the unfenced control shows no violation: it tests nothing{report}"
    return result


def test_pause_past_session(world: World) -> None:
    """Pool processes SIGSTOPped past the ZooKeeper session and the visibility timeout are fenced out on resume."""
    result = run_and_check(world, "pause-past-session", ("pause-past-session",))
    assert result.fenced.stale_writes_attempted > 0 or result.fenced.rejected_at_claim > 0


def test_pause_between_claim_and_write(world: World) -> None:
    """A process paused between its claim and its write has that write refused once a newer execution claimed."""
    run_and_check(world, "pause-claim-write", ("pause-claim-write",))


def test_kill_before_and_after_commit(world: World) -> None:
    """kill -9 before or after the commit (acks_late, reject_on_worker_lost): re-delivered, applied exactly once."""
    result = run_and_check(world, "kill-around-commit", ("kill-before-commit", "kill-after-commit"))
    assert result.fenced.unknown_outcomes > 0, "killed executions end with no outcome: the checker must see them"


def test_zookeeper_leader_killed_and_paused(world: World) -> None:
    """kill -9 and SIGSTOP of the ZooKeeper leader in a loop: tokens keep increasing in commit order across failover."""
    run_and_check(world, "zk-leader", ("zk-leader-kill", "zk-leader-stop"))


def test_worker_cut_off_from_zookeeper(world: World) -> None:
    """A worker cut off from ZooKeeper past its session (blackhole), reset or slowed by its proxies stays safe."""
    run_and_check(world, "zk-partition", ("zk-blackhole", "zk-reset", "zk-delay"))


def test_redis_restart_with_aof(world: World) -> None:
    """kill -9 and restart of the gate store with AOF (fsync always): marks survive, Redis agrees with PostgreSQL."""
    result = run_and_check(world, "redis-restart-aof", ("redis-kill-aof",))
    assert result.fenced.redis_checked and result.fenced.redis_state_losses == 0
    assert result.fenced.redis_disagreements == 0


def test_redis_restart_without_persistence_fails_closed(world: World) -> None:
    """A gate store without persistence forgets its marks and its floor on restart: the paused writer's pre-loss
    token is refused (the store is armed again above it), and Redis agrees with PostgreSQL; the control, which
    has no floor, accepts it. The doctor still warns about the store."""
    result = run_and_check(world, "redis-restart-volatile", ("redis-kill-volatile", "redis-stale-writer"))
    assert result.fenced.redis_state_losses > 0, "the restarts lost the Redis state, and the checker must say so"
    assert result.fenced.redis_stale_after_loss == 0, "a token minted before the loss was accepted after it"
    assert result.fenced.redis_disagreements == 0
    assert result.control.redis_stale_after_loss > 0, "the control must show the paused writer's stale token accepted"
    client = redis.Redis.from_url(world.redis["volatile"].url)
    try:
        doctor = Doctor(None)
        doctor.check_redis_persistence("gate store", client)
    finally:
        client.close()
    warnings = [c for c in doctor.checks if c.area == "persistence" and c.status == "warning"]
    assert warnings and "no persistence" in warnings[0].message


def test_postgres_immediate_restart(world: World) -> None:
    """Immediate shutdowns of PostgreSQL mid-transaction: unknown outcomes resolve, every task applied exactly once."""
    run_and_check(world, "pg-restart", ("pg-restart",))


def test_worker_clock_jumps(world: World) -> None:
    """Wall-clock jumps on a worker (libfaketime) change nothing for fencing: tokens, not time, order the writes."""
    run_and_check(world, "clock-jump", ("clock-jump",))
