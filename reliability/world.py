"""A world: the servers, proxies and twin worker fleets one reliability run uses, and its phases.

A :class:`World` owns, on loopback only:

* a throwaway Redis with AOF (``appendfsync always``): gate data and results;
* a throwaway Redis without persistence: gate data of ``deposit_volatile``;
* a throwaway PostgreSQL cluster: accounts, audit rows, SQL marks;
* per worker, one TCP proxy per ZooKeeper node: kazoo sees only the proxies;
* two fleets of prefork ``celery worker`` processes, *fenced* and *control*,
  the first worker of each under libfaketime (wall clock only), the workers
  of each drawing tokens from blocks of different sizes (``WorldConfig.blocks``);

and uses a ZooKeeper ensemble it is given, and the machine's Redis as broker
(under a key prefix of its own, never flushed, never restarted).

A *phase* (:class:`PhaseSpec`) submits tasks to both fleets at the same pace
and on the same accounts, runs its nemeses against both at the same moments,
heals everything, waits until every task is done and the broker is quiet, and
then checks each side (:func:`reliability.checker.check`).

The world's asyncio loop runs in a thread of its own, and every process the
world starts is started from that thread: processes run under
``--pdeathsig KILL`` and die with it, so closing the world (or the harness
dying) takes them all along.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
from celery import Celery
from sqlalchemy import create_engine
from sqlalchemy.dialects.postgresql import insert as pg_insert

from .checker import Fault, Figures, check, format_table
from .collect import collect
from .history import HistoryTail, read_history
from .proxy import TcpProxy
from .schema import Names, create_tables
from .services import HOST, ThrowawayPostgres, ThrowawayRedis, WorkerProcess, process_state, wait_until

__all__ = ["SIDES", "PhaseResult", "PhaseSpec", "World", "WorldConfig", "zk_mode"]

SIDES = ("fenced", "control")
TERMINAL = frozenset({"ok", "duplicate", "rejected", "unknown", "error"})
T = TypeVar("T")


@dataclass
class WorldConfig:
    root: Path
    seed: int = 0
    workers_per_side: int = 2
    concurrency: int = 2
    visibility_timeout: float = 3.0
    session_timeout: float = 2.0
    think_ms: tuple[float, float] = (50.0, 500.0)
    # Token blocks per worker (by index): a large block and a small one, so the processes
    # sharing the hot accounts hold blocks of different ages, and a copy re-delivered to a
    # process with an older block draws the lower token (see celery_fencing.blocks).
    blocks: tuple[int, ...] = (1024, 3)
    broker_url: str = field(
        default_factory=lambda: os.environ.get("FENCING_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    )


@dataclass
class PhaseSpec:
    """One phase: which nemeses, for how long, at what task rate (per side).

    Every ``1/rate`` seconds, ``burst`` tasks for one account (drawn by the
    seed) are sent to each side at once: a burst makes executions of one
    account overlap for sure, which is what fencing has to sort out.
    """

    name: str
    nemeses: tuple[str, ...]
    duration: float
    rate: float = 2.0
    accounts: int = 4
    burst: int = 1
    store: str = "aof"
    drain_timeout: float = 90.0
    max_rounds: int = 10_000
    progress: float = 0.0  # seconds between progress lines on stderr (0: none)

    def store_of(self, account: int) -> str:
        """The Redis gate store of an account: ``store``, or for ``"mixed"`` the last account volatile."""
        if self.store == "mixed":
            return "volatile" if account == self.accounts - 1 else "aof"
        return self.store


@dataclass
class PhaseResult:
    spec: PhaseSpec
    scope: str
    fenced: Figures
    control: Figures
    faults: list[Fault]
    wall: float
    drained: bool

    def table(self, *, markdown: bool = False) -> str:
        return format_table([self.fenced, self.control], markdown=markdown)


async def zk_mode(port: int, timeout: float = 0.5) -> str | None:
    """'leader', 'follower' or 'standalone' from the ``srvr`` four-letter word, ``None`` if it does not answer."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return None
    try:
        writer.write(b"srvr")
        data = await asyncio.wait_for(reader.read(), timeout)
    except (OSError, asyncio.TimeoutError):
        return None
    finally:
        writer.close()
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


class Tracker:
    """Follows the history as it is written: tasks done per side, busy processes, event waiters."""

    def __init__(self, directory: Path) -> None:
        self.tail = HistoryTail(directory)
        self.ok: dict[str, set[str]] = defaultdict(set)
        self.last: dict[int, tuple[str, str, float]] = {}  # pid -> (side, ev, t)
        self.waiters: list[tuple[Any, asyncio.Future[dict[str, Any]]]] = []

    def poll(self) -> None:
        for event in self.tail.poll():
            side = event.get("mode", "")
            if event["ev"] == "ok":
                self.ok[side].add(event["task"])
            if event["ev"] in ("minted", "invoke", "write", "pg-ok", "pg-dup", "redis-ok", "redis-dup", *TERMINAL):
                self.last[event["pid"]] = (side, event["ev"], event["t"])
            for waiter in list(self.waiters):
                predicate, future = waiter
                if not future.done() and predicate(event):
                    future.set_result(event)
                    self.waiters.remove(waiter)

    async def run(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(0.01)  # polling interval of the tail

    async def next_event(self, predicate: Any, timeout: float) -> dict[str, Any] | None:
        """The next event (from now on) that satisfies *predicate*, or ``None`` after *timeout*."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        waiter = (predicate, future)
        self.waiters.append(waiter)
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            return None
        finally:
            if waiter in self.waiters:
                self.waiters.remove(waiter)

    def busy(self, pids: Sequence[int]) -> list[int]:
        """Of *pids*, those in the middle of an execution (last event not an outcome)."""
        return [pid for pid in pids if pid in self.last and self.last[pid][1] not in TERMINAL]


class World:
    """See the module docstring. Use :meth:`start`, :meth:`run_phase`, :meth:`close` from any thread."""

    def __init__(self, config: WorldConfig, ensemble: Any) -> None:
        self.config = config
        self.ensemble = ensemble
        self.id = uuid.uuid4().hex[:6]
        self.root = config.root
        self.history_dir = self.root / "history"
        self.log_dir = self.root / "logs"
        for directory in (self.history_dir, self.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.redis = {
            "aof": ThrowawayRedis(self.root / "redis-aof", aof=True),
            "volatile": ThrowawayRedis(self.root / "redis-volatile", aof=False),
        }
        self.postgres = ThrowawayPostgres()
        self.names = {side: Names(f"rel_{self.id}_{side}") for side in SIDES}
        self.queues = {side: f"rel-{self.id}-{side}" for side in SIDES}
        self.broker_prefix = f"rel-{self.id}:"
        self.workers: dict[str, list[WorkerProcess]] = {side: [] for side in SIDES}
        self.proxies: dict[str, list[TcpProxy]] = {}
        self.tracker = Tracker(self.history_dir)
        self.phases = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"reliability-world-{self.id}", daemon=True)
        self._tracker_task: asyncio.Task[None] | None = None
        self._producer: Celery | None = None
        self._faults_file = self.root / "faults.jsonl"
        self._submits_file = self.root / "submitted.jsonl"

    # Thread plumbing ----------------------------------------------------------------------

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run *coro* on the world's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> World:
        self._thread.start()
        try:
            self.call(self._start(), timeout=300)
        except BaseException:
            self.close()
            raise
        return self

    def run_phase(self, spec: PhaseSpec) -> PhaseResult:
        return self.call(self._run_phase(spec))

    def close(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self.call(self._close(), timeout=120)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)

    # Setup -------------------------------------------------------------------------------------

    @property
    def source_hosts(self) -> list[int]:
        return [node.client_port for node in self.ensemble.nodes]

    def broker_client(self) -> redis.Redis:
        return redis.Redis.from_url(self.config.broker_url, socket_timeout=10)

    async def _start(self) -> None:
        self._tracker_task = asyncio.ensure_future(self.tracker.run())
        await asyncio.gather(self.redis["aof"].start(), self.redis["volatile"].start(), self.postgres.start())
        engine = create_engine(self.postgres.url)
        try:
            for side in SIDES:
                await asyncio.to_thread(create_tables, engine, self.names[side])
        finally:
            engine.dispose()
        await self.heal_ensemble()
        starts = []
        for side in SIDES:
            for index in range(self.config.workers_per_side):
                name = f"{side}{index + 1}"
                proxies = [await TcpProxy((HOST, port)).start() for port in self.source_hosts]
                self.proxies[name] = proxies
                hosts = ",".join(p.address for p in proxies)
                block = self.config.blocks[index % len(self.config.blocks)]
                source = (
                    f"zookeeper://{hosts}/rel-{self.id}"
                    f"?session_timeout={self.config.session_timeout:g}&timeout=3&block={block}"
                )
                env = {
                    "RW_MODE": side,
                    "RW_PREFIX": self.names[side].prefix,
                    "RW_QUEUE": self.queues[side],
                    "RW_BROKER": self.config.broker_url,
                    "RW_BROKER_PREFIX": self.broker_prefix,
                    "RW_BACKEND": ("fenced+" if side == "fenced" else "") + self.redis["aof"].url,
                    "RW_REDIS": self.redis["aof"].url,
                    "RW_REDIS_VOLATILE": self.redis["volatile"].url,
                    "RW_PG": self.postgres.url,
                    "RW_SOURCE": source,
                    "RW_HISTORY": str(self.history_dir),
                    "RW_VISIBILITY_TIMEOUT": f"{self.config.visibility_timeout:g}",
                    "RW_THINK_MS": ",".join(f"{x:g}" for x in self.config.think_ms),
                }
                worker = WorkerProcess(
                    name,
                    queue=self.queues[side],
                    env=env,
                    log_dir=self.log_dir,
                    concurrency=self.config.concurrency,
                    faketime_file=self.root / f"{name}.faketime" if index == 0 else None,
                )
                self.workers[side].append(worker)
                starts.append(worker.start())
        await asyncio.gather(*starts)
        producer = Celery("reliability-producer", broker=self.config.broker_url)
        producer.conf.broker_transport_options = {"global_keyprefix": self.broker_prefix}
        self._producer = producer

    async def _close(self) -> None:
        await asyncio.gather(*(w.stop() for ws in self.workers.values() for w in ws), return_exceptions=True)
        for proxies in self.proxies.values():
            for proxy in proxies:
                await proxy.close()
        for server in self.redis.values():
            server.stop()
        self.postgres.stop()
        if self._tracker_task is not None:
            self._tracker_task.cancel()
        if self._producer is not None:
            self._producer.close()
        client = self.broker_client()
        try:
            keys = list(client.scan_iter(f"{self.broker_prefix}*"))
            if keys:
                client.delete(*keys)
        finally:
            client.close()

    # Healing ----------------------------------------------------------------------------------

    def all_workers(self) -> list[WorkerProcess]:
        return [w for ws in self.workers.values() for w in ws]

    async def heal_ensemble(self, timeout: float = 90) -> None:
        """Resume paused nodes, start stopped ones, wait for every node to serve with one leader."""
        for node in self.ensemble.nodes:
            if node.paused:
                node.resume()
            if not node.running:
                node.launch()

        async def healthy() -> bool:
            modes = await asyncio.gather(*(zk_mode(node.client_port) for node in self.ensemble.nodes))
            return all(modes) and modes.count("leader") == 1

        deadline = time.monotonic() + timeout
        while not await healthy():
            if time.monotonic() > deadline:
                raise TimeoutError("the ZooKeeper ensemble did not heal")
            await asyncio.sleep(0.2)

    async def heal(self) -> None:
        """Undo every fault: processes continued, clocks back, proxies passing, servers up."""
        for worker in self.all_workers():
            worker.continue_all()
            if worker.faketime_file is not None:
                worker.set_clock_offset(0)
            for proxy in self.proxies.get(worker.name, []):
                proxy.set_mode("pass")
        for server in self.redis.values():
            if not server.running:
                await server.start()
        if not self.postgres.running:
            await self.postgres.start()
        await self.heal_ensemble()
        for worker in self.all_workers():
            if not worker.running:
                await worker.start()

    # Phases ------------------------------------------------------------------------------------

    def record(self, fault: Fault) -> None:
        with self._faults_file.open("a") as handle:
            handle.write(json.dumps(asdict(fault)) + "\n")

    async def _run_phase(self, spec: PhaseSpec) -> PhaseResult:
        from . import nemeses

        self.phases += 1
        scope = f"{spec.name}-{self.phases}"
        resources = [f"acct:{scope}:{i}" for i in range(spec.accounts)]
        await asyncio.to_thread(self._create_accounts, resources)
        await self.heal()
        rng = random.Random(f"{self.config.seed}:{spec.name}")
        submitted: dict[str, dict[str, str]] = {side: {} for side in SIDES}
        faults: list[Fault] = []
        started = time.monotonic()
        deadline = started + spec.duration
        context = nemeses.Context(self, random.Random(rng.random()), deadline, faults, spec, scope)
        jobs = [self._submit(spec, scope, random.Random(rng.random()), submitted)]
        jobs += [nemeses.run_lane(context, lane) for lane in spec.nemeses]
        reporter = asyncio.ensure_future(self._progress(spec, started, submitted, faults)) if spec.progress else None
        try:
            await asyncio.gather(*jobs)
            await self.heal()
            drained = await self._drain(submitted, spec.drain_timeout)
        finally:
            if reporter is not None:
                reporter.cancel()
        ended = time.monotonic()
        for fault in faults:
            self.record(fault)
        events = await asyncio.to_thread(read_history, self.history_dir)
        figures = {}
        for side in SIDES:
            observation = await asyncio.to_thread(
                collect,
                side=side,
                names=self.names[side],
                scope=scope,
                submitted=submitted[side],
                events=events,
                pg_url=self.postgres.url,
                redis_urls={r: self.redis[spec.store_of(i)].url for i, r in enumerate(resources)},
                faults=faults,
                started=started,
                ended=ended,
            )
            figures[side] = check(observation)
        return PhaseResult(spec, scope, figures["fenced"], figures["control"], faults, ended - started, drained)

    def _create_accounts(self, resources: Sequence[str]) -> None:
        engine = create_engine(self.postgres.url)
        try:
            with engine.begin() as conn:
                for side in SIDES:
                    accounts, _ = self.names[side].tables()
                    conn.execute(
                        pg_insert(accounts)
                        .values([{"resource": r, "balance": 0} for r in resources])
                        .on_conflict_do_nothing()
                    )
        finally:
            engine.dispose()

    async def _submit(
        self,
        spec: PhaseSpec,
        scope: str,
        rng: random.Random,
        submitted: dict[str, dict[str, str]],
    ) -> None:
        """Send ``burst`` tasks per side every 1/rate seconds, the same account on both sides."""
        assert self._producer is not None
        start = time.monotonic()
        count = int(spec.rate * spec.duration)
        with self._submits_file.open("a") as log:
            for n in range(count):
                due = start + n / spec.rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                account = rng.randrange(spec.accounts)
                task = "reliability.deposit" if spec.store_of(account) == "aof" else "reliability.deposit_volatile"
                for side in [side for side in SIDES for _ in range(spec.burst)]:
                    task_id = str(uuid.uuid4())
                    submitted[side][task_id] = f"acct:{scope}:{account}"
                    await asyncio.to_thread(
                        self._producer.send_task, task, args=[scope, account], task_id=task_id, queue=self.queues[side]
                    )
                    log.write(json.dumps({"side": side, "task": task_id, "scope": scope, "account": account}) + "\n")

    async def _progress(
        self, spec: PhaseSpec, started: float, submitted: dict[str, dict[str, str]], faults: list[Fault]
    ) -> None:
        while True:
            await asyncio.sleep(spec.progress)
            done = ", ".join(f"{side} {len(set(submitted[side]) & self.tracker.ok[side])}" for side in SIDES)
            print(
                f"[{time.monotonic() - started:6.0f}s] {spec.name}: submitted {len(submitted['fenced'])} per side; "
                f"done: {done}; faults {len(faults)}",
                file=sys.stderr,
                flush=True,
            )

    def _broker_busy(self) -> int:
        client = self.broker_client()
        try:
            pending = int(client.hlen(f"{self.broker_prefix}unacked"))
            for queue in self.queues.values():
                for key in client.scan_iter(f"{self.broker_prefix}{queue}*"):
                    if client.type(key) == b"list":
                        pending += int(client.llen(key))
            return pending
        finally:
            client.close()

    async def _drain(self, submitted: dict[str, dict[str, str]], timeout: float) -> bool:
        """Wait until every submitted task returned on both sides, then until the broker is quiet."""
        deadline = time.monotonic() + timeout

        def done() -> bool:
            return all(set(submitted[side]) <= self.tracker.ok[side] for side in SIDES)

        drained = True
        while not done():
            if time.monotonic() > deadline:
                drained = False
                break
            await asyncio.sleep(0.1)
        # Quiet: nothing queued, nothing unacked (executing or held for an ETA), twice in a row.
        quiet = 0
        limit = time.monotonic() + max(15.0, deadline - time.monotonic())
        while quiet < 2 and time.monotonic() < limit:
            quiet = quiet + 1 if await asyncio.to_thread(self._broker_busy) == 0 else 0
            await asyncio.sleep(0.5)
        return drained and quiet >= 2

    # Helpers for nemeses --------------------------------------------------------------------------

    def pool_pids(self, worker: WorkerProcess) -> list[int]:
        return [pid for pid in worker.pool_pids() if process_state(pid) not in ("", "Z")]

    async def wait_state(self, pid: int, states: tuple[str, ...], timeout: float) -> bool:
        """Whether /proc shows *pid* in one of *states* within *timeout* ('' means gone)."""
        try:
            await wait_until(lambda: process_state(pid) in states, timeout, f"pid {pid} in state {states}", 0.005)
            return True
        except TimeoutError:
            return False
