"""Celery end to end: tasks per second and latency of plain, celery-singleton and fenced tasks, A/B in rounds.

Usage::

    python -m benchmarks.celery_e2e [--rounds 3] [--tasks 2000] [--variants a,b,...] [--no-fsync]
                                    [--pace 0.5] [--paced-tasks 1000]
                                    [--profile VARIANT ...] [--profile-seconds 8] [--profile-slices 2]
                                    [--profile-dir DIR]

Every variant gets its own real ``celery worker`` (Redis broker, prefork pool,
concurrency 2, ``acks_late``), all started before the first round and kept
running. A run sends *tasks* short tasks (each does one Redis write and
returns a result) and waits until every result is stored; tasks/s is *tasks*
over the time from the first send to the last result. Each round runs every
variant once, the order rotating from round to round; the table shows the
median of the rounds and the ratios to plain. The fenced variants mint from a
throwaway ZooKeeper (fsync on) or a SQLite file. Two floor variants measure
what any design with the same guarantee pays at least: ``floor-zk-write``
(the plain task plus one raw ZooKeeper write) and ``floor-serial`` (the plain
task at concurrency 1, one execution at a time).

Latency, per task, is end to end: from the producer's clock just before
``apply_async()`` to the ``date_done`` of the stored result (the worker's
result backend takes it as it writes the result; same host, same clock). The
flood rounds give each variant's p50 and p99 too, but there latency is mostly
time queued. Then come the paced rounds (``--pace``, 0 for none): every
variant gets ``--paced-tasks`` tasks, sent one by one at a fixed rate,
*pace* times plain's median flood rate, with the order rotating as above;
below a variant's capacity, latency is each task's own path. The latency
tables show the median over the rounds of each round's p50 and p99, and
their ratios to plain (p99 target of fenced token mode: 1.5x plain's).

After the rounds it prints the peak RSS (VmHWM) of every worker's pool
processes, and the overhead of fencing per worker process against plain.

``--profile VARIANT`` (repeatable) runs more batches of each variant named,
after the rounds, under ``py-spy`` attached to the worker's parent and pool
processes, and prints the CPU per task of ``celery_fencing``'s functions and
the differences from plain (benchmarks/hotpath.py).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import redis

from benchmarks.common import (
    PROGRESS,
    REDIS_URL,
    ROOT,
    LatencyTable,
    Table,
    alternate,
    cpu_seconds,
    machine,
    peak_rss_mib,
    percentile,
    pid_of,
    rss_mib,
    show_progress,
)


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    variant: str
    source: str | None = None  # "zookeeper" or "sqlite"
    lease_reuse: float | None = None
    concurrency: int = 2


VARIANTS = {
    v.key: v
    for v in (
        Variant("plain", "plain task, plain SET, redis backend", "plain"),
        Variant("singleton", "celery-singleton", "singleton"),
        Variant("fenced-zk", "fenced, token mode, ZooKeeper", "fenced", "zookeeper"),
        Variant("fenced-sqlite", "fenced, token mode, SQLite", "fenced", "sqlite"),
        Variant("exclusive-zk", "fenced, exclusive, hot resource, no reuse", "exclusive", "zookeeper", 0.0),
        Variant("exclusive-reuse-zk", "fenced, exclusive, hot resource, lease reuse", "exclusive", "zookeeper", 1.0),
        # The floors the targets are measured against: what any token-minting design
        # pays (one quorum write per task), and what any mutual exclusion on one hot
        # resource allows (one execution at a time: a worker of concurrency 1).
        Variant("floor-zk-write", "floor: plain task + one raw ZooKeeper write", "zk-write", "zookeeper"),
        Variant("floor-serial", "floor: plain task, one at a time (-c 1)", "plain", concurrency=1),
    )
}
TARGETS = {"fenced-zk": 0.75, "exclusive-reuse-zk": 0.9}
#: The floor each variant is compared with (what any design with its guarantee pays).
FLOORS = {"fenced-zk": "floor-zk-write", "exclusive-reuse-zk": "floor-serial"}
RSS_TARGET_MIB = 15.0
#: The paced rounds send at this fraction of plain's flood throughput: below every token-mode variant's capacity.
PACE = 0.5
#: A paced run that finishes (its last result stored) at under this fraction of the pace fell behind it.
BEHIND = 0.9
#: Paced p99 latency targets, as a ratio to plain's p99 (issue 15).
P99_TARGETS = {"fenced-zk": 1.5, "fenced-sqlite": 1.5}


@dataclass
class EndToEnd:
    """What :func:`run` measured: the printed tables and notes, and the samples the charts draw."""

    tables: list[Table | LatencyTable]
    notes: list[str]
    #: Variant key -> tasks/s, one sample per round.
    rates: dict[str, list[float]]
    #: Variant key -> process role (worker, producer, redis, zookeeper) -> CPU us per task, one per round.
    cpu: dict[str, dict[str, list[float]]]
    #: Variant key -> (p50, p99) end-to-end latency in ms, one per flood round.
    flood_latency: dict[str, list[tuple[float, float]]]
    #: Variant key -> (p50, p99) end-to-end latency in ms, one per paced round (empty without pacing).
    paced_latency: dict[str, list[tuple[float, float]]]


class BenchWorker:
    """A ``celery worker`` subprocess running one variant; ready when its ``worker_ready`` key appears."""

    def __init__(self, variant: Variant, env: dict[str, str], log_dir: Path, redis_client: redis.Redis) -> None:
        from tests.celery.workers import WorkerProcess

        self.variant = variant
        self.prefix = env["BENCH_PREFIX"]
        self.redis = redis_client
        self.process = WorkerProcess(
            "benchmarks.celery_app",
            name=env["BENCH_QUEUE"],
            queue=env["BENCH_QUEUE"],
            env=env,
            log_dir=log_dir,
            pool="prefork",
            concurrency=variant.concurrency,
            extra_args=("--loglevel", "WARNING"),
        )

    def start(self, timeout: float = 120) -> None:
        from tests.celery.workers import wait_for

        process = self.process
        log = process.log_path.open("ab")
        process.proc = subprocess.Popen(
            process.args, cwd=ROOT, env=process.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

        def ready() -> bool:
            if process.proc is not None and process.proc.poll() is not None:
                raise RuntimeError(f"worker {process.name} exited:\n{process.log()[-3000:]}")
            ready = self.redis.exists(f"{self.prefix}:ready")
            return bool(ready) and len(process.pool_pids()) >= self.variant.concurrency

        wait_for(ready, timeout, f"worker {process.name} (log: {process.log_path})")

    def pool_pids(self) -> list[int]:
        return self.process.pool_pids()

    def stop(self) -> None:
        self.process.stop()


class Producer:
    """Sends one variant's tasks and waits for their results."""

    def __init__(
        self, variant: Variant, env: dict[str, str], redis_client: redis.Redis, watched: dict[str, list[int]]
    ) -> None:
        from benchmarks.celery_app import TASK, make_app

        #: Processes whose CPU time is charged to this variant's runs, by role.
        self.watched = watched
        self.cpu: dict[str, list[float]] = {role: [] for role in watched}
        self.variant = variant
        self.prefix = env["BENCH_PREFIX"]
        self.redis = redis_client
        self.app = make_app(
            variant.variant,
            broker=env["BENCH_BROKER"],
            redis_url=env["BENCH_REDIS"],
            prefix=self.prefix,
            queue=env["BENCH_QUEUE"],
            producer=True,
        )
        self.task = self.app.tasks[TASK]
        self.next_arg = 0
        #: End-to-end latency of each task of the last run, in seconds.
        self.latencies: list[float] = []
        self.log_path = Path(env["BENCH_LOG_DIR"]) / f"{env['BENCH_QUEUE']}.log"

    def run(self, count: int, timeout: float = 600, pace: float | None = None) -> float:
        """Send *count* tasks, wait for every result; return tasks per second.

        Without *pace* the tasks are sent back to back (a flood) and the run's
        CPU time per task is recorded; with it, one task every ``1 / pace``
        seconds. Either way :attr:`latencies` then holds each task's end-to-end
        latency in seconds (see :meth:`_check_and_clean`).
        """
        first = self.next_arg
        self.next_arg += count
        cpu_before = {role: sum(cpu_seconds(pid) for pid in pids) for role, pids in self.watched.items()}
        started = time.perf_counter()
        ids, sent = self._send(range(first, first + count), pace)
        keys = [f"celery-task-meta-{task_id}" for task_id in ids]
        deadline = time.monotonic() + timeout
        pending = keys
        while pending:
            # Drop the keys already present from the front, then look at the rest.
            present = self.redis.exists(*pending[:500])
            if present == len(pending[:500]):
                pending = pending[500:]
                continue
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.variant.key}: {len(pending)} results missing after {timeout}s")
            time.sleep(0.005)
        elapsed = time.perf_counter() - started
        if pace is None:
            for role, pids in self.watched.items():
                used = sum(cpu_seconds(pid) for pid in pids) - cpu_before[role]
                self.cpu[role].append(used / count * 1e6)
        self.latencies = self._check_and_clean(ids, sent, first, count)
        return count / elapsed

    def _send(self, args: range, pace: float | None) -> tuple[list[str], list[float]]:
        """Send one task per argument (every ``1 / pace`` s, or back to back); return the ids and send times.

        A send that falls behind its schedule goes at once, and the next ones
        keep to the schedule (no slowing down to hide a stall: an open loop).
        """
        apply, ids, sent = self.task.apply_async, [], []
        interval = 1.0 / pace if pace else 0.0
        start = time.perf_counter()
        for n, i in enumerate(args):
            if interval:
                delay = start + n * interval - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            sent.append(time.time())
            ids.append(apply(args=(i,)).id)
        return ids, sent

    def _check_and_clean(self, ids: list[str], sent: list[float], first: int, count: int) -> list[float]:
        """Check every result is a SUCCESS, delete the run's keys; return each task's latency in seconds.

        The latency is from *sent* (this process's clock just before the task's
        ``apply_async``) to the result's ``date_done``, which the worker's result
        backend takes as it stores the result (the same host, so the same clock):
        broker, queue, the pool, the task with its fencing, and all but the result
        write's own round trip.
        """
        metas = [
            json.loads(meta) for meta in self.redis.mget([f"celery-task-meta-{task_id}" for task_id in ids]) if meta
        ]
        states = collections.Counter(meta["status"] for meta in metas)
        if states != {"SUCCESS": count}:
            raise RuntimeError(f"{self.variant.key}: results {dict(states)} (worker log: {self.log_path})")
        done = [datetime.fromisoformat(meta["date_done"]).timestamp() for meta in metas]
        latencies = [finished - began for finished, began in zip(done, sent, strict=True)]
        keys = [f"celery-task-meta-{task_id}" for task_id in ids] + [f"celery-task-fence-{task_id}" for task_id in ids]
        keys += [f"{self.prefix}:k:{i}" for i in range(first, first + count)]
        pipe = self.redis.pipeline(transaction=False)
        for start in range(0, len(keys), 1000):
            pipe.unlink(*keys[start : start + 1000])
        floor = f"{self.prefix}:fence:floor"  # the store's, not a task's: deleting it is amnesia (re-armed, refused)
        for key in self.redis.scan_iter(f"{self.prefix}:fence:*", count=1000):
            if key not in (floor, floor.encode()):
                pipe.unlink(key)
        pipe.execute()
        return latencies


@contextmanager
def _zookeeper(fsync: bool, needed: bool) -> Iterator[Any]:
    if not needed:
        yield None
        return
    from tests.fixtures.zookeeper import ZooKeeperServer

    with ZooKeeperServer(force_sync=fsync, heap="256m") as server:
        yield server


def profile(
    workers: dict[str, BenchWorker],
    producers: dict[str, Producer],
    keys: list[str],
    tasks: int,
    seconds: float,
    out_dir: Path,
    slices: int = 2,
) -> str:
    """Profile each of *keys* with py-spy for *seconds* in all, in *slices*; summarise.

    Each slice profiles every variant once, the order rotating from slice to
    slice as in the rounds, so that the machine's drift hits them alike.
    """
    from benchmarks import hotpath

    profiles: dict[str, hotpath.Profile] = {}
    for slice_no in range(slices):
        shift = slice_no % len(keys)
        for key in keys[shift:] + keys[:shift]:
            worker, producer = workers[key], producers[key]
            PROGRESS.info("celery: profiling %s, slice %d/%d, %.0f s", key, slice_no + 1, slices, seconds / slices)

            def batch(producer: Producer = producer) -> int:
                producer.run(tasks)
                return tasks

            out = out_dir / f"slice{slice_no + 1}"
            recorded = hotpath.record(key, worker.process.pid, worker.pool_pids(), batch, seconds / slices, out)
            profiles[key] = profiles[key].merge(recorded) if key in profiles else recorded
    return hotpath.report(profiles.values())


def run(
    rounds: int,
    tasks: int,
    keys: list[str],
    fsync: bool,
    profile_keys: Sequence[str] = (),
    profile_seconds: float = 8.0,
    profile_dir: Path | None = None,
    profile_slices: int = 2,
    pace: float = PACE,
    paced_tasks: int | None = None,
) -> EndToEnd:
    """Run every variant's flood rounds, then (with *pace* > 0) its paced rounds; return the tables and notes.

    The paced rounds send *paced_tasks* per run (default: half of *tasks*) at
    *pace* times plain's median flood rate (of the first variant's, without plain).
    """
    variants = [VARIANTS[key] for key in keys]
    run_id = "bench" + uuid.uuid4().hex[:8]
    client = redis.Redis.from_url(REDIS_URL)
    notes: list[str] = []
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fencing-bench-")))
        zk = stack.enter_context(_zookeeper(fsync, any(v.source == "zookeeper" for v in variants)))
        workers: dict[str, BenchWorker] = {}
        producers: dict[str, Producer] = {}
        stack.callback(_cleanup, client, run_id)
        for variant in variants:
            queue = f"{run_id}-{variant.key}"
            env = {
                "BENCH_VARIANT": variant.variant,
                "BENCH_BROKER": REDIS_URL,
                "BENCH_REDIS": REDIS_URL,
                "BENCH_PREFIX": queue,
                "BENCH_QUEUE": queue,
                "BENCH_LOG_DIR": str(tmp),
            }
            if variant.source == "zookeeper":
                env["BENCH_SOURCE"] = zk.url(f"/{queue}", timeout=10)
            elif variant.source == "sqlite":
                env["BENCH_SOURCE"] = f"sqlite:///{tmp / (queue + '.db')}"
            if variant.lease_reuse is not None:
                env["BENCH_LEASE_REUSE"] = str(variant.lease_reuse)
            worker = BenchWorker(variant, env, tmp, client)
            stack.callback(worker.stop)
            began = time.monotonic()
            worker.start()
            PROGRESS.info("celery: worker of %s ready in %.1f s", variant.key, time.monotonic() - began)
            workers[variant.key] = worker
            watched = {"worker": [worker.process.pid, *worker.pool_pids()], "producer": [os.getpid()]}
            redis_pid = pid_of("redis-server")
            if redis_pid is not None:
                watched["redis"] = [redis_pid]
            if variant.source == "zookeeper" and zk.node.pid is not None:
                watched["zookeeper"] = [zk.node.pid]
            producers[variant.key] = Producer(variant, env, client, watched)
        for key, producer in producers.items():  # warm-up: connections, scripts, znodes, imports
            PROGRESS.info("celery: warm-up of %s, %.1f tasks/s", key, producer.run(max(50, tasks // 10)))
            for values in producer.cpu.values():
                values.clear()
        flood_latency: dict[str, list[tuple[float, float]]] = {v.key: [] for v in variants}

        def flood(key: str) -> float:
            value = producers[key].run(tasks)
            flood_latency[key].append(_p50_p99(producers[key].latencies))
            return value

        subjects: dict[str, Callable[[], float]] = {v.key: functools.partial(flood, v.key) for v in variants}
        samples = alternate(subjects, rounds, section="celery", unit="tasks/s")
        paced_latency: dict[str, list[tuple[float, float]]] = {v.key: [] for v in variants}
        #: Variant key -> the rate at which its paced runs that fell behind the pace finished.
        behind: dict[str, list[float]] = {v.key: [] for v in variants}
        rate = 0.0
        if pace > 0:
            base = "plain" if "plain" in samples else variants[0].key
            rate = pace * statistics.median(samples[base])
            count = paced_tasks or max(1, tasks // 2)

            def paced(key: str) -> float:
                finished = producers[key].run(count, pace=rate)  # tasks over the time to the last result
                if finished < BEHIND * rate:
                    behind[key].append(finished)
                paced_latency[key].append(_p50_p99(producers[key].latencies))
                return paced_latency[key][-1][1]

            PROGRESS.info("celery: paced rounds, %d tasks per run at %.0f tasks/s", count, rate)
            subjects = {v.key: functools.partial(paced, v.key) for v in variants}
            alternate(subjects, rounds, section="celery paced", unit="ms p99")
        producers_cpu = {key: {role: list(v) for role, v in p.cpu.items()} for key, p in producers.items()}
        rss = {key: [peak_rss_mib(pid) for pid in worker.pool_pids()] for key, worker in workers.items()}
        rss_now = {key: [rss_mib(pid) for pid in worker.pool_pids()] for key, worker in workers.items()}
        if profile_keys:
            notes.append(
                profile(
                    workers,
                    producers,
                    list(profile_keys),
                    tasks,
                    profile_seconds,
                    profile_dir or tmp / "py-spy",
                    profile_slices,
                )
            )
        if zk is not None:
            from tests.fixtures.zookeeper import four_letter_word

            mntr = dict(line.split("\t", 1) for line in four_letter_word(zk.port, "mntr").splitlines() if "\t" in line)
            notes.append(
                f"ZooKeeper after the run: znodes {mntr.get('zk_znode_count')}, approximate data size "
                f"{mntr.get('zk_approximate_data_size')} bytes, JVM RSS {rss_mib(zk.node.pid or 0):.0f} MiB"
            )
    labelled = {VARIANTS[key].label + f" [{key}]": values for key, values in samples.items()}
    label = {key: VARIANTS[key].label + f" [{key}]" for key in samples}
    ratios: list[tuple[str, str, str, float | None]] = []
    if "plain" in samples:
        for key in samples:
            if key != "plain":
                ratios.append((f"{key} / plain", label[key], label["plain"], TARGETS.get(key)))
    if "singleton" in samples:
        for key in ("fenced-zk", "fenced-sqlite"):
            if key in samples:
                ratios.append((f"{key} / singleton", label[key], label["singleton"], 1.0))
    for key, floor in FLOORS.items():
        if key in samples and floor in samples:
            ratios.append((f"{key} / {floor}", label[key], label[floor], None))
    if "exclusive-zk" in samples and "exclusive-reuse-zk" in samples:
        ratios.append(("exclusive reuse / no reuse", label["exclusive-reuse-zk"], label["exclusive-zk"], None))
    table = Table(
        f"Celery end to end: {tasks} tasks per run, prefork -c 2, Redis broker, {rounds} rounds; "
        f"ZooKeeper forceSync={'yes' if fsync else 'no'}",
        "tasks/s",
        labelled,
        ratios,
    )
    tables: list[Table | LatencyTable] = [table]
    clocks = (
        "end to end: from the producer's clock just before apply_async() to the date_done of the task's stored result "
        "(taken by the worker's result backend as it writes it; same host, same clock): broker, queue, pool, the task "
        "with its fencing, all but the result write's round trip"
    )
    latency_ratios: list[tuple[str, str, str, float | None]] = [
        (f"{key} / plain", label[key], label["plain"], None) for key in samples if "plain" in samples and key != "plain"
    ]
    latency_ratios += [
        (f"{key} / {floor}", label[key], label[floor], None)
        for key, floor in FLOORS.items()
        if key in samples and floor in samples
    ]
    tables.append(
        LatencyTable(
            f"Celery latency in the flood: the same runs as above ({tasks} tasks sent back to back), {rounds} rounds",
            [
                clocks,
                "each round's p50 and p99 over its tasks, the median of the rounds; in a flood, latency is mostly "
                "time queued behind the other tasks (p99 ~ the run's length); the paced table shows per-task cost",
            ],
            {label[key]: values for key, values in flood_latency.items()},
            latency_ratios,
            name="flood latency",
        )
    )
    if pace > 0:
        over: dict[str, str] = {}
        for key in samples:
            remarks = []
            if statistics.median(samples[key]) < rate:
                remarks.append(f"over capacity: {statistics.median(samples[key]):.0f} tasks/s in the flood")
            if behind[key]:
                remarks.append(
                    f"fell behind the pace in {len(behind[key])}/{rounds} round(s), "
                    f"finishing at {min(behind[key]):.0f} tasks/s"
                )
            if remarks:
                over[label[key]] = "; ".join(remarks)
        tables.append(
            LatencyTable(
                f"Celery latency, paced: {count} tasks per run sent at {rate:.0f} tasks/s ({pace:.2f}x {base}'s flood "
                f"median, one every {1000 / rate:.2f} ms), {rounds} rounds",
                [
                    "end to end as in the flood; each round's p50 and p99 over its tasks, the median of the rounds; "
                    f"p99 targets: {', '.join(f'{key} <= {t:.2f}x plain' for key, t in P99_TARGETS.items())}",
                    "below capacity, latency is each task's own path plus little queueing; a variant marked over "
                    "capacity (its flood rate is below the pace) or that fell behind (its run finished at under "
                    f"{BEHIND:.0%} of the pace: a busy machine) queues, and its latency grows with the run's length",
                ],
                {label[key]: values for key, values in paced_latency.items()},
                [
                    (name, num, den, P99_TARGETS.get(name.split(" / ")[0]) if den == label.get("plain") else None)
                    for name, num, den, _ in latency_ratios
                ],
                remarks=over,
                name="paced latency",
            )
        )
    rss_lines = [f"== Worker pool processes after the rounds, MiB (target: fencing adds <= {RSS_TARGET_MIB:.0f} MiB)"]
    for key in samples:
        peaks, now = rss[key], rss_now[key]
        rss_lines.append(
            f"{VARIANTS[key].label + ' [' + key + ']':64} peak {max(peaks):6.1f}  now "
            f"{statistics.mean(now):6.1f} (mean of {len(now)})"
        )
    if "plain" in rss:
        for key in samples:
            if VARIANTS[key].variant in ("fenced", "exclusive"):
                overhead = max(rss[key]) - max(rss["plain"])
                verdict = "met" if overhead <= RSS_TARGET_MIB else "MISSED"
                rss_lines.append(f"fencing overhead per process [{key}]: {overhead:+.1f} MiB peak: {verdict}")
    cpu_lines = ["== CPU time per task, microseconds (median of the rounds), by process"]
    for key in samples:
        cpu = producers_cpu[key]
        parts = "  ".join(f"{role} {statistics.median(values):7.0f}" for role, values in cpu.items() if values)
        cpu_lines.append(f"{VARIANTS[key].label + ' [' + key + ']':64} {parts}")
    notes.insert(0, "\n".join(rss_lines))
    notes.insert(1, "\n".join(cpu_lines))
    return EndToEnd(tables, notes, samples, producers_cpu, flood_latency, paced_latency)


def _p50_p99(latencies: list[float]) -> tuple[float, float]:
    """The p50 and p99 of one run's latencies (seconds), in milliseconds."""
    return percentile(latencies, 0.50) * 1e3, percentile(latencies, 0.99) * 1e3


def _cleanup(client: redis.Redis, run_id: str) -> None:
    keys = list(client.scan_iter(f"{run_id}*", count=1000)) + list(client.scan_iter(f"*{run_id}*", count=1000))
    for start in range(0, len(keys), 1000):
        client.unlink(*keys[start : start + 1000])
    client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per run")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of the variants")
    parser.add_argument("--no-fsync", action="store_true", help="run ZooKeeper with forceSync=no")
    parser.add_argument(
        "--pace", type=float, default=PACE, help="paced rounds at this fraction of plain's flood rate (0: none)"
    )
    parser.add_argument("--paced-tasks", type=int, default=None, help="tasks per paced run (default: half of --tasks)")
    parser.add_argument(
        "--profile",
        choices=list(VARIANTS),
        action="append",
        default=[],
        help="profile this variant's worker with py-spy after the rounds (repeat for several)",
    )
    parser.add_argument("--profile-seconds", type=float, default=8.0, help="per profiled variant, in all")
    parser.add_argument("--profile-slices", type=int, default=2, help="the variants' profiles alternate in slices")
    parser.add_argument("--profile-dir", default=None, help="keep py-spy's raw output here (default: discarded)")
    args = parser.parse_args(argv)
    keys = [key for key in args.variants.split(",") if key]
    if args.rounds < 1 or args.tasks < 1 or not keys or not set(keys) <= set(VARIANTS):
        parser.error(f"--rounds and --tasks must be >= 1; --variants a subset of {','.join(VARIANTS)}")
    if args.pace < 0 or (args.paced_tasks is not None and args.paced_tasks < 1) or args.profile_slices < 1:
        parser.error("--pace must be >= 0 (0: no paced rounds), --paced-tasks and --profile-slices >= 1")
    keys += [key for key in dict.fromkeys(args.profile) if key not in keys]
    show_progress()
    print(machine())
    profile_dir = Path(args.profile_dir) if args.profile_dir else None
    result = run(
        args.rounds,
        args.tasks,
        keys,
        not args.no_fsync,
        args.profile,
        args.profile_seconds,
        profile_dir,
        pace=args.pace,
        paced_tasks=args.paced_tasks,
        profile_slices=args.profile_slices,
    )
    for table in result.tables:
        print(table.render())
    for note in result.notes:
        print(note)
    print(f"peak RSS of this process: {peak_rss_mib():.1f} MiB; load average now {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
