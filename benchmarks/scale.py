"""Scale: mint latency and ZooKeeper memory as the number of distinct resources grows; then pruning.

Usage::

    python -m benchmarks.scale [--sizes 1,1000,100000] [--rounds 7] [--count 300] [--no-fsync]

One throwaway ZooKeeper server per size, each populated with that many
resource znodes through ``mint_many`` (pipelined, 1,000 per batch; the first
mint of a resource creates its znode). Each round then times *count*
sequential ``mint()`` calls on random resources of every server, the order
of servers rotating from round to round, so the servers see the same load on
the machine. Memory per server: ``mntr``'s ``zk_approximate_data_size`` and
``zk_znode_count``, and the JVM's resident set. Last, the largest server's
resources are pruned (``prune(older_than=...)``), timing it, and memory is
read again. Target: latency at the largest size within 1.5x of the smallest.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from contextlib import ExitStack

from benchmarks.common import PROGRESS, Table, alternate, machine, peak_rss_mib, rss_mib, show_progress
from celery_fencing import ZooKeeperTokenSource

LATENCY_TARGET = 1.5
BATCH = 1000


def _mntr(port: int) -> dict[str, str]:
    from tests.fixtures.zookeeper import four_letter_word

    return dict(line.split("\t", 1) for line in four_letter_word(port, "mntr").splitlines() if "\t" in line)


def memory_line(label: str, server: object) -> str:
    mntr = _mntr(server.port)  # type: ignore[attr-defined]
    pid = server.node.pid or 0  # type: ignore[attr-defined]
    return (
        f"{label:34} znodes {int(mntr.get('zk_znode_count', 0)):>8}  approximate data size "
        f"{int(mntr.get('zk_approximate_data_size', 0)) / 2**20:8.2f} MiB  JVM RSS {rss_mib(pid):7.1f} MiB"
    )


def run(sizes: list[int], rounds: int, count: int, fsync: bool) -> tuple[list[Table], list[str]]:
    from tests.fixtures.zookeeper import ZooKeeperServer

    notes: list[str] = []
    with ExitStack() as stack:
        servers = {}
        sources = {}
        names = {}
        populate = ["== Populating (mint_many, pipelined, 1,000 resources per call)"]
        for size in sizes:
            server = stack.enter_context(ZooKeeperServer(force_sync=fsync, heap="512m"))
            source = ZooKeeperTokenSource(server.hosts, root="/scale", timeout=60)
            stack.callback(source.close)
            resources = [f"r{n}" for n in range(size)]
            started = time.perf_counter()
            for start in range(0, size, BATCH):
                source.mint_many(resources[start : start + BATCH])
            elapsed = time.perf_counter() - started
            populate.append(f"{size:>8} resources created in {elapsed:7.2f} s ({size / elapsed:8.0f} znodes/s)")
            PROGRESS.info("scale: %s", populate[-1].strip())
            servers[size], sources[size], names[size] = server, source, resources
        notes.append("\n".join(populate))
        notes.append(
            "== ZooKeeper memory after populating\n"
            + "\n".join(memory_line(f"{size} resource(s)", servers[size]) for size in sizes)
        )
        rng = random.Random(7)

        def latency(size: int) -> float:
            source, resources = sources[size], names[size]
            samples = []
            for _ in range(count):
                resource = resources[rng.randrange(len(resources))]
                started = time.perf_counter_ns()
                source.mint(resource)
                samples.append(time.perf_counter_ns() - started)
            samples.sort()
            return samples[len(samples) // 2] / 1000

        for size in sizes:  # warm-up
            latency(size)
        subjects = {f"mint() among {size} resource(s)": (lambda s=size: latency(s)) for size in sizes}
        samples = alternate(subjects, rounds, section="scale", unit="us median")
        labels = list(samples)
        table = Table(
            f"mint() latency by number of resources, {rounds} rounds x {count} calls (each round's median); "
            f"ZooKeeper forceSync={'yes' if fsync else 'no'}",
            "us",
            samples,
            [(f"{sizes[-1]} / {sizes[0]} resource(s)", labels[-1], labels[0], LATENCY_TARGET)],
            higher_is_better=False,
        )
        largest = sizes[-1]
        time.sleep(1.5)
        source = sources[largest]
        recent = source.mint(names[largest][0])  # minted just now: prune keeps it
        highest = recent.value
        PROGRESS.info("scale: pruning the %d-resource server", largest)
        started = time.perf_counter()
        pruned = source.prune(older_than=1.0, window=BATCH, timeout=1800)
        elapsed = time.perf_counter() - started
        again = source.mint(names[largest][1])
        verdict = "ok" if again.value > highest else "WRONG"
        notes.append(
            f"== Pruning the {largest}-resource server: prune(older_than=1.0) deleted {pruned} znodes in "
            f"{elapsed:.2f} s; a pruned resource minted again got {again.value} > {highest} (highest before): "
            f"{verdict}\n" + memory_line(f"{largest} after pruning", servers[largest])
        )
    return [table], notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,1000,100000", help="comma-separated resource counts, smallest first")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--count", type=int, default=300, help="mint() calls per server per round")
    parser.add_argument("--no-fsync", action="store_true", help="run ZooKeeper with forceSync=no")
    args = parser.parse_args(argv)
    try:
        sizes = sorted(int(size) for size in args.sizes.split(",") if size)
    except ValueError:
        parser.error("--sizes must be comma-separated integers")
    if not sizes or sizes[0] < 1 or args.rounds < 1 or args.count < 1:
        parser.error("--sizes must be >= 1; --rounds and --count >= 1")
    show_progress()
    print(machine())
    tables, notes = run(sizes, args.rounds, args.count, not args.no_fsync)
    for note in notes[:2]:
        print(note)
    for table in tables:
        print(table.render())
    for note in notes[2:]:
        print(note)
    print(f"peak RSS of this process: {peak_rss_mib():.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
