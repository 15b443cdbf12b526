"""Celery end to end: tasks per second of plain, celery-singleton and fenced tasks, A/B in rounds.

Usage::

    python -m benchmarks.celery_e2e [--rounds 3] [--tasks 2000] [--variants a,b,...] [--no-fsync]
                                    [--profile VARIANT] [--profile-seconds 8]

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

After the rounds it prints the peak RSS (VmHWM) of every worker's pool
processes, and the overhead of fencing per worker process against plain.

``--profile VARIANT`` runs one more batch of that variant under ``py-spy``
(attached to the pool processes) and prints the functions that take the most
samples, inclusive and exclusive.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from benchmarks.common import (
    PROGRESS,
    REDIS_URL,
    ROOT,
    Table,
    alternate,
    cpu_seconds,
    machine,
    peak_rss_mib,
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


@dataclass
class EndToEnd:
    """What :func:`run` measured: the printed tables and notes, and the samples the charts draw."""

    tables: list[Table]
    notes: list[str]
    #: Variant key -> tasks/s, one sample per round.
    rates: dict[str, list[float]]
    #: Variant key -> process role (worker, producer, redis, zookeeper) -> CPU us per task, one per round.
    cpu: dict[str, dict[str, list[float]]]


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
        self.log_path = Path(env["BENCH_LOG_DIR"]) / f"{env['BENCH_QUEUE']}.log"

    def run(self, count: int, timeout: float = 600) -> float:
        """Send *count* tasks, wait for every result; return tasks per second."""
        first = self.next_arg
        self.next_arg += count
        cpu_before = {role: sum(cpu_seconds(pid) for pid in pids) for role, pids in self.watched.items()}
        started = time.perf_counter()
        ids = [self.task.apply_async(args=(i,)).id for i in range(first, first + count)]
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
        for role, pids in self.watched.items():
            used = sum(cpu_seconds(pid) for pid in pids) - cpu_before[role]
            self.cpu[role].append(used / count * 1e6)
        self._check_and_clean(ids, first, count)
        return count / elapsed

    def _check_and_clean(self, ids: list[str], first: int, count: int) -> None:
        metas = self.redis.mget([f"celery-task-meta-{task_id}" for task_id in ids])
        states = collections.Counter(json.loads(meta)["status"] for meta in metas if meta is not None)
        if states != {"SUCCESS": count}:
            raise RuntimeError(f"{self.variant.key}: results {dict(states)} (worker log: {self.log_path})")
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


@contextmanager
def _zookeeper(fsync: bool, needed: bool) -> Iterator[Any]:
    if not needed:
        yield None
        return
    from tests.fixtures.zookeeper import ZooKeeperServer

    with ZooKeeperServer(force_sync=fsync, heap="256m") as server:
        yield server


def profile(worker: BenchWorker, producer: Producer, tasks: int, seconds: float, out_dir: Path) -> str:
    """Run one batch under py-spy attached to the pool processes; summarise the samples."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    outputs, spies = [], []
    out_dir.mkdir(parents=True, exist_ok=True)
    for pid in worker.pool_pids():
        out = out_dir / f"pyspy-{worker.variant.key}-{pid}.txt"
        outputs.append(out)
        spies.append(
            subprocess.Popen(
                [
                    *(spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250"),
                    *("--format", "raw", "--output", str(out), "--nonblocking"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    time.sleep(0.5)
    batches = 0
    finish = time.monotonic() + seconds - 1
    while time.monotonic() < finish:
        producer.run(tasks)
        batches += 1
    for proc in spies:
        proc.wait(60)
    return summarise_raw(outputs, f"py-spy, {worker.variant.label}, {batches} batch(es) of {tasks}")


def summarise_raw(paths: list[Path], title: str, top: int = 18, thread: str = "Worker.workloop") -> str:
    """Inclusive and exclusive sample counts per function from py-spy's raw (collapsed) output.

    Only stacks through *thread* count (by default the pool process's main
    thread, which runs the tasks): kazoo's and redis-py's background threads
    mostly wait, and would drown the task's own path.
    """
    inclusive: collections.Counter[str] = collections.Counter()
    exclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for path in paths:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [frame for frame in stack.split(";") if frame and not frame.startswith("process ")]
            frames = [frame.replace(str(ROOT) + "/", "").split("/site-packages/")[-1] for frame in frames]
            if thread and not any(frame.startswith(thread) for frame in frames):
                continue
            total += count
            if frames:
                exclusive[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
    if not total:
        return f"== {title}: no samples (is py-spy installed? pip install 'celery-fencing[bench]')"
    lines = [f"== {title}: {total} samples", "inclusive %  function"]
    lines += [f"{100 * n / total:10.1f}  {name}" for name, n in inclusive.most_common(top)]
    lines += ["exclusive %  function"]
    lines += [f"{100 * n / total:10.1f}  {name}" for name, n in exclusive.most_common(top)]
    return "\n".join(lines)


def run(
    rounds: int,
    tasks: int,
    keys: list[str],
    fsync: bool,
    profile_key: str | None = None,
    profile_seconds: float = 8.0,
    profile_dir: Path | None = None,
) -> EndToEnd:
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
        subjects = {v.key: (lambda p=producers[v.key]: p.run(tasks)) for v in variants}
        samples = alternate(subjects, rounds, section="celery", unit="tasks/s")
        producers_cpu = {key: {role: list(v) for role, v in p.cpu.items()} for key, p in producers.items()}
        rss = {key: [peak_rss_mib(pid) for pid in worker.pool_pids()] for key, worker in workers.items()}
        rss_now = {key: [rss_mib(pid) for pid in worker.pool_pids()] for key, worker in workers.items()}
        if profile_key is not None:
            PROGRESS.info("celery: profiling %s for %.0f s", profile_key, profile_seconds)
            notes.append(
                profile(workers[profile_key], producers[profile_key], tasks, profile_seconds, profile_dir or tmp)
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
    return EndToEnd([table], notes, samples, producers_cpu)


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
    parser.add_argument("--profile", choices=list(VARIANTS), help="profile one variant with py-spy after the rounds")
    parser.add_argument("--profile-seconds", type=float, default=8.0)
    parser.add_argument("--profile-dir", default=None, help="keep py-spy's raw output here (default: discarded)")
    args = parser.parse_args(argv)
    keys = [key for key in args.variants.split(",") if key]
    if args.rounds < 1 or args.tasks < 1 or not keys or not set(keys) <= set(VARIANTS):
        parser.error(f"--rounds and --tasks must be >= 1; --variants a subset of {','.join(VARIANTS)}")
    if args.profile and args.profile not in keys:
        keys.append(args.profile)
    show_progress()
    print(machine())
    profile_dir = Path(args.profile_dir) if args.profile_dir else None
    result = run(args.rounds, args.tasks, keys, not args.no_fsync, args.profile, args.profile_seconds, profile_dir)
    for table in result.tables:
        print(table.render())
    for note in result.notes:
        print(note)
    print(f"peak RSS of this process: {peak_rss_mib():.1f} MiB; load average now {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
