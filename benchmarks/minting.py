"""Minting throughput: each token source against the bare write it is built on, A/B in rounds.

Usage::

    python -m benchmarks.minting [--rounds 7] [--count 500] [--batch 100] [--no-fsync]

Comparisons (each a ratio of medians of tokens per second):

* ``ZooKeeperTokenSource.mint()`` against kazoo ``set()`` on a znode of the
  same server (sequential: one request in flight).
* ``ZooKeeperTokenSource.mint_many()`` of *batch* resources against the same
  number of kazoo ``set_async()`` sent back to back, then awaited.
* ``SQLiteTokenSource.mint()`` against a plain ``UPDATE ... SET value = value + 1``
  in a ``BEGIN IMMEDIATE`` transaction, with the same pragmas (WAL, ``synchronous=FULL``).

A throwaway standalone ZooKeeper is started (fsync on, ZooKeeper's default,
unless ``--no-fsync``). Every subject runs *count* calls per round; the order
of subjects rotates from round to round.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import PROGRESS, Table, alternate, machine, peak_rss_mib, rate, show_progress
from celery_fencing import SQLiteTokenSource, ZooKeeperTokenSource

TARGETS = {"mint": 0.8, "pipelined": 0.8}


def run(rounds: int, count: int, batch: int, fsync: bool) -> list[Table]:
    from kazoo.client import KazooClient

    from tests.fixtures.zookeeper import ZooKeeperServer

    with tempfile.TemporaryDirectory(prefix="fencing-bench-") as tmp, ZooKeeperServer(force_sync=fsync) as zk:
        source = ZooKeeperTokenSource(zk.hosts, root="/bench", timeout=30)
        raw = KazooClient(zk.hosts)
        raw.start(30)
        sqlite_source = SQLiteTokenSource(Path(tmp) / "tokens.db", timeout=30)
        plain = sqlite3.connect(Path(tmp) / "plain.db", isolation_level=None, timeout=30)
        try:
            plain.execute("PRAGMA journal_mode=WAL")
            plain.execute("PRAGMA synchronous=FULL")
            plain.execute("CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
            plain.execute("INSERT INTO counters VALUES ('bench', 0)")

            def plain_update() -> None:
                plain.execute("BEGIN IMMEDIATE")
                plain.execute("UPDATE counters SET value = value + 1 WHERE name = ?", ("bench",))
                plain.execute("COMMIT")

            names = [f"b{n}" for n in range(batch)]
            raw_paths = [f"/bench-raw/{name}" for name in names]
            for path in raw_paths:
                raw.ensure_path(path)

            def raw_pipelined() -> None:
                pending = [raw.set_async(path, b"") for path in raw_paths]
                for async_result in pending:
                    async_result.get(timeout=30)

            subjects: dict[str, Callable[[], object]] = {
                "zk: ZooKeeperTokenSource.mint()": lambda: source.mint("bench"),
                "zk: kazoo set()": lambda: raw.set("/bench-raw/b0", b""),
                f"zk: mint_many({batch})": lambda: source.mint_many(names),
                f"zk: {batch} x kazoo set_async()": raw_pipelined,
                "sqlite: SQLiteTokenSource.mint()": lambda: sqlite_source.mint("bench"),
                "sqlite: UPDATE in BEGIN IMMEDIATE": plain_update,
            }
            PROGRESS.info("minting: warm-up, %d subjects", len(subjects))
            for call in subjects.values():  # warm-up: connections, znodes, JIT, page cache
                for _ in range(20):
                    call()
            per_call = {f"zk: mint_many({batch})": batch, f"zk: {batch} x kazoo set_async()": batch}
            pipelined_count = max(1, count // batch)

            def measure(name: str, call: Callable[[], object]) -> Callable[[], float]:
                n = per_call.get(name, 1)
                return lambda: rate(call, pipelined_count if n > 1 else count, n)

            measured = {name: measure(name, call) for name, call in subjects.items()}
            samples = alternate(measured, rounds, section="minting", unit="tokens/s")
        finally:
            raw.stop()
            raw.close()
            source.close()
            sqlite_source.close()
            plain.close()
    names_ = list(samples)
    return [
        Table(
            f"Minting throughput, {rounds} rounds; ZooKeeper forceSync={'yes' if fsync else 'no'}, "
            f"SQLite WAL synchronous=FULL",
            "tokens/s",
            samples,
            [
                ("mint() / raw set()", names_[0], names_[1], TARGETS["mint"]),
                (f"mint_many({batch}) / raw set_async() x{batch}", names_[2], names_[3], TARGETS["pipelined"]),
                ("SQLite mint() / plain UPDATE", names_[4], names_[5], None),
                (f"mint_many({batch}) / mint()", names_[2], names_[0], None),
            ],
        )
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--count", type=int, default=500, help="sequential calls per subject per round")
    parser.add_argument("--batch", type=int, default=100, help="resources per pipelined batch")
    parser.add_argument("--no-fsync", action="store_true", help="run ZooKeeper with forceSync=no")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.count < 1 or args.batch < 1:
        parser.error("--rounds, --count and --batch must be >= 1")
    show_progress()
    print(machine())
    tables = run(args.rounds, args.count, args.batch, not args.no_fsync)
    for table in tables:
        print(table.render())
    print(f"peak RSS of this process: {peak_rss_mib():.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
