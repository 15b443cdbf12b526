"""How long does mint() take? ZooKeeper vs SQLite, with raw kazoo set() as the floor.

Usage::

    python benchmarks/mint.py [--rounds 5] [--count 200] [--no-fsync]

Starts its own throwaway standalone ZooKeeper (tests/fixtures/zookeeper.py) on
a free loopback port, and a SQLite token file in a temp directory. Each round
times ``count`` sequential calls of each subject; the order of subjects
alternates from round to round, so drift on a shared machine (other suites,
page cache, JIT warm-up) does not favour one side. The first round's first
calls are a warm-up and are not counted.

ZooKeeper fsyncs its transaction log on every commit by default, as SQLite does
with ``synchronous=FULL``: the comparison keeps both durable unless
``--no-fsync`` is given.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# Run as a script from anywhere: make the repository root importable for tests.fixtures.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kazoo.client import KazooClient  # noqa: E402

from celery_fencing import SQLiteTokenSource, ZooKeeperTokenSource  # noqa: E402
from tests.fixtures.zookeeper import ZooKeeperServer, four_letter_word  # noqa: E402

WARMUP = 50


def time_calls(call: Callable[[], object], count: int) -> list[float]:
    """Return the latency of *count* sequential calls, in milliseconds."""
    samples = []
    for _ in range(count):
        started = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - started) / 1e6)
    return samples


def p90(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=10)[8] if len(samples) > 1 else samples[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds, alternating the order of subjects")
    parser.add_argument("--count", type=int, default=200, help="timed calls per subject per round")
    parser.add_argument("--no-fsync", action="store_true", help="run ZooKeeper with forceSync=no")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.count < 2:
        parser.error("--rounds must be >= 1 and --count >= 2")

    server = ZooKeeperServer(force_sync=not args.no_fsync)
    with tempfile.TemporaryDirectory(prefix="fencing-bench-") as tmp, server as zk:
        zk_source = ZooKeeperTokenSource(zk.hosts, root="/bench", timeout=10)
        sqlite_source = SQLiteTokenSource(Path(tmp) / "tokens.db", timeout=10)
        raw = KazooClient(zk.hosts)
        raw.start(30)
        raw.ensure_path("/bench-raw/r")
        subjects: dict[str, Callable[[], object]] = {
            "ZooKeeperTokenSource.mint": lambda: zk_source.mint("bench"),
            "SQLiteTokenSource.mint": lambda: sqlite_source.mint("bench"),
            "kazoo set() (raw)": lambda: raw.set("/bench-raw/r", b""),
        }
        try:
            for call in subjects.values():
                time_calls(call, WARMUP)
            samples: dict[str, list[float]] = {name: [] for name in subjects}
            names = list(subjects)
            for round_no in range(args.rounds):
                order = names if round_no % 2 == 0 else names[::-1]
                for name in order:
                    samples[name].extend(time_calls(subjects[name], args.count))
            version = next(
                (line for line in four_letter_word(zk.port, "srvr").splitlines() if line.startswith("Zookeeper")),
                "Zookeeper version: unknown",
            )
        finally:
            raw.stop()
            raw.close()
            zk_source.close()
            sqlite_source.close()

    print(f"mint() latency, {args.rounds} round(s) x {args.count} calls per subject, order alternating by round")
    print(f"{version}; ZooKeeper forceSync={'no' if args.no_fsync else 'yes'}; SQLite WAL synchronous=FULL")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPU(s), loopback")
    print()
    print(f"{'subject':<28} {'n':>6} {'median ms':>10} {'p90 ms':>10}")
    medians = {}
    for name, values in samples.items():
        medians[name] = statistics.median(values)
        print(f"{name:<28} {len(values):>6} {medians[name]:>10.3f} {p90(values):>10.3f}")
    zk_median = medians["ZooKeeperTokenSource.mint"]
    print()
    print(f"ratio ZooKeeper mint / SQLite mint (median): {zk_median / medians['SQLiteTokenSource.mint']:.2f}")
    print(f"ratio ZooKeeper mint / raw kazoo set (median): {zk_median / medians['kazoo set() (raw)']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
