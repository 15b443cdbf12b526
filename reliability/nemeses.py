"""The faults. Each *round* injects one fault, bounded in time, records it, and undoes it.

Process faults hit both sides at the same moment with the same parameters
(one pool process of the fenced fleet, one of the control fleet). Server faults
(ZooKeeper, Redis, PostgreSQL) hit the one server both sides share, so they are
recorded once, for ``both``. Every fault is *proven* before it counts as
proven: a paused process is seen in state ``T`` in /proc, a killed one gone,
a killed ZooKeeper leader replaced by another, a restarted server back with a
new run id or start time, a partitioned worker's session seen SUSPENDED or
LOST in its own history, a clock jump seen in the worker's own wall clock.

A *lane* runs rounds one after another until the phase's deadline: a named
round again and again, or, for ``process-chaos`` and ``server-chaos`` (the
soak), a round drawn at random each time. Rounds only signal processes the
world started, and only talk to loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .checker import Fault
from .services import WorkerProcess
from .world import SIDES, zk_mode

if TYPE_CHECKING:
    from .world import PhaseSpec, World

__all__ = ["PROCESS_ROUNDS", "ROUNDS", "SERVER_ROUNDS", "Context", "run_lane"]

STOPPED = ("T", "t")
REDIS_OUTCOMES = ("redis-ok", "redis-dup", "duplicate", "rejected", "unknown")
GONE = ("", "Z", "X")


@dataclass
class Context:
    world: World
    rng: random.Random
    deadline: float
    faults: list[Fault]
    spec: PhaseSpec
    scope: str = ""

    def add(self, kind: str, side: str, target: str, start: float, proven: bool, proof: str) -> None:
        self.faults.append(Fault(kind, side, target, start, time.monotonic(), proven, proof))

    def in_scope(self, event: dict[str, Any]) -> bool:
        return str(event.get("resource", "")).startswith(f"acct:{self.scope}:")

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


def _pool_pid(ctx: Context, side: str, pick: float) -> tuple[WorkerProcess, int] | None:
    """A pool process of *side*, preferring one in the middle of an execution; *pick* in [0, 1) chooses."""
    candidates = [(w, pid) for w in ctx.world.workers[side] for pid in ctx.world.pool_pids(w)]
    if not candidates:
        return None
    busy = set(ctx.world.tracker.busy([pid for _, pid in candidates]))
    chosen = [c for c in candidates if c[1] in busy] or candidates
    return chosen[int(pick * len(chosen)) % len(chosen)]


async def _pause(ctx: Context, kind: str, side: str, target: str, pid: int, hold: float, why: str) -> None:
    start = time.monotonic()
    if not _signal(pid, signal.SIGSTOP):
        return
    try:
        proven = await ctx.world.wait_state(pid, STOPPED, 2.0)
        await asyncio.sleep(hold)  # the fault's duration
    finally:
        _signal(pid, signal.SIGCONT)
    ctx.add(kind, side, target, start, proven, f"{why}; /proc state T seen: {proven}; held {hold:.1f}s")


# Process rounds --------------------------------------------------------------------------------


async def pause_past_session(ctx: Context) -> None:
    """SIGSTOP one pool process per side for longer than the ZooKeeper session and the visibility timeout."""
    config = ctx.world.config
    hold = ctx.rng.uniform(
        max(config.session_timeout, config.visibility_timeout) + 1.0,
        max(config.session_timeout, config.visibility_timeout) + 2.5,
    )
    pick = ctx.rng.random()

    async def one(side: str) -> None:
        found = _pool_pid(ctx, side, pick)
        if found is not None:
            worker, pid = found
            await _pause(ctx, "pause-past-session", side, f"{worker.name}:{pid}", pid, hold, "pool process")

    await asyncio.gather(*(one(side) for side in SIDES))


async def pause_claim_write(ctx: Context) -> None:
    """SIGSTOP the process of the next execution to start, between its claim and its write."""
    hold = ctx.rng.uniform(0.8, 2.5)

    async def one(side: str) -> None:
        event = await ctx.world.tracker.next_event(
            lambda e: e.get("mode") == side and e["ev"] == "invoke" and ctx.in_scope(e), min(5.0, ctx.left() + 1)
        )
        if event is not None:
            why = f"after the claim of task {event['task']} token {event['token']}, before its write"
            target = f"{event['worker']}:{event['pid']}"
            await _pause(ctx, "pause-claim-write", side, target, event["pid"], hold, why)

    await asyncio.gather(*(one(side) for side in SIDES))


async def _kill_on(ctx: Context, kind: str, trigger: str, when: str) -> None:
    async def one(side: str) -> None:
        event = await ctx.world.tracker.next_event(
            lambda e: e.get("mode") == side and e["ev"] == trigger and ctx.in_scope(e), min(5.0, ctx.left() + 1)
        )
        if event is None:
            return
        start = time.monotonic()
        pid = event["pid"]
        if not _signal(pid, signal.SIGKILL):
            return
        proven = await ctx.world.wait_state(pid, GONE, 5.0)
        proof = f"SIGKILL {when} (task {event['task']} token {event['token']}); gone from /proc: {proven}"
        ctx.add(kind, side, f"{event['worker']}:{pid}", start, proven, proof)

    await asyncio.gather(*(one(side) for side in SIDES))


async def kill_before_commit(ctx: Context) -> None:
    """kill -9 the process of an execution right after its claim, before its write (acks_late re-delivers)."""
    await _kill_on(ctx, "kill-before-commit", "invoke", "after the claim, before the commit")


async def kill_after_commit(ctx: Context) -> None:
    """kill -9 the process of an execution right after its commit, before the ack (acks_late re-delivers)."""
    await _kill_on(ctx, "kill-after-commit", "pg-ok", "after the commit, before the ack")


async def clock_jump(ctx: Context) -> None:
    """Move the wall clock of one worker per side (both the same way), proven by the worker's own events."""
    # Forward jumps stay short: a worker whose clock is ahead by more than the
    # visibility timeout makes kombu re-deliver every message in flight, and its
    # retries carry ETAs that far ahead, which kombu re-delivers every timeout
    # until they are due. Backward jumps only delay what that worker holds.
    vt = ctx.world.config.visibility_timeout
    forward = ctx.rng.random() < 0.5
    offset = ctx.rng.uniform(vt + 1, 4 * vt) if forward else -ctx.rng.uniform(5.0, 30.0)
    hold = ctx.rng.uniform(2.0, 4.0)

    async def one(side: str) -> None:
        worker = next((w for w in ctx.world.workers[side] if w.faketime_file is not None), None)
        if worker is None:
            return
        base = time.time() - time.monotonic()
        start = time.monotonic()
        worker.set_clock_offset(offset)
        try:
            seen = await ctx.world.tracker.next_event(
                lambda e: (
                    e.get("worker") == worker.name and e["t"] > start and abs(e["wall"] - e["t"] - base - offset) < 2.0
                ),
                hold + 3.0,
            )
            await asyncio.sleep(max(0.0, start + hold - time.monotonic()))
        finally:
            worker.set_clock_offset(0)
        proof = f"wall clock {offset:+.0f}s; seen in the worker's own events: {seen is not None}"
        ctx.add("clock-jump", side, f"{worker.name}:{offset:+.0f}s", start, seen is not None, proof)

    await asyncio.gather(*(one(side) for side in SIDES))


async def zk_partition(ctx: Context, mode: str | None = None) -> None:
    """Cut one worker per side off from ZooKeeper through its proxies: blackhole, reset or delay."""
    if mode is None:
        mode = ctx.rng.choices(("blackhole", "reset", "delay"), weights=(2, 1, 1))[0]
    session = ctx.world.config.session_timeout
    hold = {
        "blackhole": ctx.rng.uniform(2 * session + 1.0, 2 * session + 2.5),
        "reset": ctx.rng.uniform(0.5, 1.5),
        "delay": ctx.rng.uniform(2.0, 4.0),
    }[mode]
    delay = ctx.rng.uniform(0.2, 0.6)
    index = ctx.rng.randrange(ctx.world.config.workers_per_side)

    async def one(side: str) -> None:
        worker = ctx.world.workers[side][index]
        proxies = ctx.world.proxies[worker.name]
        tracker = ctx.world.tracker
        start = time.monotonic()
        resets = sum(p.stats.resets for p in proxies)
        delayed = sum(p.stats.delayed for p in proxies)

        def session_event(states: tuple[str, ...]) -> Callable[[dict[str, Any]], bool]:
            return lambda e: e["ev"] == "session" and e.get("worker") == worker.name and e.get("state") in states

        for proxy in proxies:
            proxy.set_mode(mode, delay)
        try:
            seen = await tracker.next_event(session_event(("SUSPENDED", "LOST")), hold)
            await asyncio.sleep(max(0.0, start + hold - time.monotonic()))
        finally:
            for proxy in proxies:
                proxy.set_mode("pass")
        if mode == "blackhole":
            # Cut off longer than the session: once connected again, the session is found expired.
            lost = await tracker.next_event(session_event(("LOST",)), 2 * session + 4)
            proven = seen is not None and lost is not None
            proof = f"blackhole {hold:.1f}s > session {session:g}s; SUSPENDED seen: {seen is not None}, LOST: {proven}"
        elif mode == "reset":
            proven = sum(p.stats.resets for p in proxies) > resets
            proof = f"connections reset; session event seen: {seen is not None}"
        else:
            proven = sum(p.stats.delayed for p in proxies) > delayed
            proof = f"{delay:.2f}s per chunk for {hold:.1f}s; bytes delayed: {proven}"
        ctx.add(f"zk-{mode}", side, worker.name, start, proven, proof)

    await asyncio.gather(*(one(side) for side in SIDES))


# Server rounds -----------------------------------------------------------------------------------


async def _leader(ctx: Context, exclude: Any = None) -> Any:
    nodes = [n for n in ctx.world.ensemble.nodes if n is not exclude and n.running and not n.paused]
    modes = await asyncio.gather(*(zk_mode(n.client_port) for n in nodes))
    leaders = [n for n, mode in zip(nodes, modes, strict=True) if mode == "leader"]
    return leaders[0] if len(leaders) == 1 else None


async def _await_leader(ctx: Context, exclude: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = await _leader(ctx, exclude)
        if leader is not None:
            return leader
        await asyncio.sleep(0.1)
    return None


async def zk_leader_kill(ctx: Context) -> None:
    """kill -9 the ZooKeeper leader; the others elect a new one; restart it."""
    leader = await _leader(ctx)
    if leader is None:
        return
    start = time.monotonic()
    leader.kill()
    successor = await _await_leader(ctx, leader, 30)
    await asyncio.sleep(ctx.rng.uniform(0.5, 2.0))  # the node stays dead a while
    if not leader.running:
        leader.launch()
    with contextlib.suppress(TimeoutError):
        await ctx.world.heal_ensemble(60)
    proven = successor is not None and successor is not leader
    who = getattr(successor, "server_id", None)
    ctx.add("zk-leader-kill", "both", f"zk{leader.server_id}", start, proven, f"SIGKILL; zk{who} elected")


async def zk_leader_stop(ctx: Context) -> None:
    """SIGSTOP the ZooKeeper leader past the followers' patience, then SIGCONT it."""
    leader = await _leader(ctx)
    if leader is None or leader.pid is None:
        return
    pid = leader.pid
    start = time.monotonic()
    hold = ctx.rng.uniform(3.0, 5.0)
    leader.pause()
    try:
        stopped = await ctx.world.wait_state(pid, STOPPED, 2.0)
        successor = await _await_leader(ctx, leader, hold)
        await asyncio.sleep(max(0.0, start + hold - time.monotonic()))
    finally:
        leader.resume()
    with contextlib.suppress(TimeoutError):
        await ctx.world.heal_ensemble(60)
    who = getattr(successor, "server_id", None)
    ctx.add(
        "zk-leader-stop", "both", f"zk{leader.server_id}", start, stopped, f"state T: {stopped}; zk{who} led meanwhile"
    )


async def _redis_kill(ctx: Context, store: str) -> None:
    server = ctx.world.redis[store]
    before = await asyncio.to_thread(server.run_id)
    start = time.monotonic()
    server.kill()
    gone = not server.running
    await asyncio.sleep(ctx.rng.uniform(0.5, 2.0))  # down for a while
    await server.start()
    after = await asyncio.to_thread(server.run_id)
    proven = gone and after is not None and after != before
    persistence = "AOF appendfsync always" if server.aof else "no persistence"
    ctx.add(f"redis-kill-{store}", "both", f"redis:{server.port}", start, proven, f"SIGKILL, restart ({persistence})")


async def redis_kill(ctx: Context) -> None:
    """kill -9 the gate store of the phase's tasks and restart it (with AOF, or without persistence)."""
    store = ctx.spec.store
    if store == "mixed":
        store = "volatile" if ctx.rng.random() < 0.2 else "aof"
    await _redis_kill(ctx, store)


async def redis_stale_writer(ctx: Context) -> None:
    """Show what a gate store without persistence does: a writer paused across its restart.

    On each side, the process of an execution that has claimed is SIGSTOPped
    until a newer execution of the same resource has written Redis. Then every
    other pool process of the side is paused too, the store is killed and
    restarted (forgetting marks and data), and the stale writer resumes first,
    alone, so that no newer claim re-creates the mark before its write: its
    Redis write carries a token below the forgotten mark. The others resume
    once its outcome is seen (or after 5 s).
    """
    hold_limit = 8.0

    async def pause(side: str) -> tuple[int, int, str, bool] | None:
        event = await ctx.world.tracker.next_event(
            lambda e: e.get("mode") == side and e["ev"] == "invoke" and ctx.in_scope(e), min(5.0, ctx.left() + 1)
        )
        if event is None or not _signal(event["pid"], signal.SIGSTOP):
            return None
        pid, token, resource = event["pid"], int(event["token"]), event["resource"]
        stopped = await ctx.world.wait_state(pid, STOPPED, 2.0)
        newer = await ctx.world.tracker.next_event(
            lambda e: (
                e.get("mode") == side
                and e["ev"] == "redis-ok"
                and e["resource"] == resource
                and int(e["token"]) > token
            ),
            hold_limit,
        )
        return pid, token, resource, stopped and newer is not None

    start = time.monotonic()
    paused = dict(zip(SIDES, await asyncio.gather(*(pause(side) for side in SIDES)), strict=True))
    writers = {held[0] for held in paused.values() if held is not None}
    frozen = [
        pid
        for side in SIDES
        for worker in ctx.world.workers[side]
        for pid in ctx.world.pool_pids(worker)
        if pid not in writers and _signal(pid, signal.SIGSTOP)
    ]
    try:
        try:
            await _redis_kill(ctx, "volatile")
        finally:
            for pid in writers:
                _signal(pid, signal.SIGCONT)

        async def outcome(side: str) -> None:
            held = paused[side]
            if held is None:
                return
            pid, token, resource, proven = held
            after = await ctx.world.tracker.next_event(
                lambda e: e.get("pid") == pid and e.get("token") == token and e["ev"] in REDIS_OUTCOMES, 5.0
            )
            what = "nothing" if after is None else after["ev"]
            proof = f"token {token} held across the restart after a newer Redis write; then, alone: {what}"
            ctx.add("redis-stale-writer", side, f"{resource}:{pid}", start, proven, proof)

        await asyncio.gather(*(outcome(side) for side in SIDES))
    finally:
        for pid in frozen:
            _signal(pid, signal.SIGCONT)


async def pg_restart(ctx: Context) -> None:
    """Immediate shutdown of PostgreSQL (a crash: recovery at the next start), then start it again."""
    postgres = ctx.world.postgres
    before = await asyncio.to_thread(postgres.start_time)
    start = time.monotonic()
    await postgres.shutdown_immediate()
    await asyncio.sleep(ctx.rng.uniform(0.3, 1.5))  # down for a while
    await postgres.start()
    after = await asyncio.to_thread(postgres.start_time)
    proven = after is not None and after != before
    ctx.add("pg-restart", "both", f"postgres:{postgres.port}", start, proven, f"start time {before} -> {after}")


ROUNDS: dict[str, Callable[[Context], Awaitable[None]]] = {
    "pause-past-session": pause_past_session,
    "pause-claim-write": pause_claim_write,
    "kill-before-commit": kill_before_commit,
    "kill-after-commit": kill_after_commit,
    "clock-jump": clock_jump,
    "zk-partition": zk_partition,
    "zk-blackhole": functools.partial(zk_partition, mode="blackhole"),
    "zk-reset": functools.partial(zk_partition, mode="reset"),
    "zk-delay": functools.partial(zk_partition, mode="delay"),
    "zk-leader-kill": zk_leader_kill,
    "zk-leader-stop": zk_leader_stop,
    "redis-kill": redis_kill,
    "redis-stale-writer": redis_stale_writer,
    "pg-restart": pg_restart,
}
PROCESS_ROUNDS = ("pause-past-session", "pause-claim-write", "kill-before-commit", "kill-after-commit", "clock-jump")
PROCESS_ROUNDS += ("zk-partition",)
SERVER_ROUNDS = ("zk-leader-kill", "zk-leader-stop", "redis-kill", "pg-restart")
#: Lanes that draw a round at random each time (the soak).
LANES = {"process-chaos": PROCESS_ROUNDS, "server-chaos": SERVER_ROUNDS}
#: Lanes that go through their rounds in order, again and again (the CI profile: each kind at least once).
CYCLES = {
    "kill": ("kill-before-commit", "kill-after-commit"),
    "zk-leader": ("zk-leader-kill", "zk-leader-stop"),
    "zk-cut": ("zk-blackhole", "zk-reset", "zk-delay"),
    "volatile": ("redis-stale-writer", "redis-kill"),
}


async def run_lane(ctx: Context, lane: str) -> None:
    """Run rounds of *lane* until the deadline (or ``max_rounds``), with a short random gap between them."""
    choices = LANES.get(lane) or CYCLES.get(lane) or (lane,)
    for name in choices:
        if name not in ROUNDS:
            raise ValueError(f"unknown nemesis {name!r}; known: {', '.join([*ROUNDS, *LANES, *CYCLES])}")
    rounds = 0
    gap = (1.0, 4.0) if lane == "server-chaos" else (0.3, 1.5)
    while time.monotonic() < ctx.deadline and rounds < ctx.spec.max_rounds:
        name = ctx.rng.choice(choices) if lane in LANES else choices[rounds % len(choices)]
        await ROUNDS[name](ctx)
        rounds += 1
        await asyncio.sleep(min(ctx.rng.uniform(*gap), ctx.left()))
