"""``python -m benchmarks``: every benchmark of celery-fencing in one run, each comparison A/B in rounds.

Usage::

    python -m benchmarks [--only minting,celery,scale,mint-latency,gates] [--quick] [--check] [--out DIR]

Sections (in this order):

``minting``       mint() vs raw kazoo set(); mint_many vs raw pipelined set_async();
                  SQLite source vs a plain UPDATE (benchmarks/minting.py)
``celery``        end to end, 2,000 tasks per run: plain, celery-singleton, fenced
                  (ZooKeeper and SQLite), exclusive on a hot resource with and
                  without lease reuse, and two floors (plain + one ZooKeeper write,
                  plain one at a time); p50 and p99 task latency in that flood and
                  in paced runs (1,000 tasks at half plain's rate); worker RSS and
                  CPU per task (benchmarks/celery_e2e.py)
``scale``         mint latency and ZooKeeper memory at 1, 1k and 100k resources; pruning
                  (benchmarks/scale.py)
``mint-latency``  median and p90 latency of each source (benchmarks/mint.py)
``gates``         gated writes against plain writes, Redis, PostgreSQL, MariaDB, SQLite
                  (benchmarks/gates.py)

``--quick`` runs each with tiny counts (what the smoke tests run: it proves the
benchmarks work, its figures mean nothing). ``--check`` exits 1 when a target
of issue 7 (or the paced p99 latency target of issue 15) is missed.

The tables go to stdout; progress (one line per subject and round, per worker
started, per section) goes to stderr. The ``celery`` section also draws two bar
charts into ``--out`` (tasks/s and worker CPU per task by variant, the floors
drawn; benchmarks/plots.py), when matplotlib is installed (the ``plots`` extra).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import celery_e2e, minting, scale
from benchmarks.common import PROGRESS, LatencyTable, Table, machine, peak_rss_mib, show_progress

SECTIONS = ("minting", "celery", "scale", "mint-latency", "gates")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated subset of the sections")
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke run, not a measurement")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--no-fsync", action="store_true", help="run ZooKeeper with forceSync=no")
    parser.add_argument("--out", type=Path, default=None, help="directory for the charts (default: a new temp dir)")
    args = parser.parse_args(argv)
    sections = [name for name in args.only.split(",") if name]
    if not sections or not set(sections) <= set(SECTIONS):
        parser.error(f"--only takes a subset of {','.join(SECTIONS)}")
    fsync = not args.no_fsync
    quick = args.quick
    show_progress()
    charts: list[Path] = []
    print(f"python -m benchmarks {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(machine())
    missed: list[str] = []
    started = time.monotonic()
    tables: Sequence[Table | LatencyTable]
    for number, section in enumerate(sections, 1):
        print(f"\n##### {section}", flush=True)
        PROGRESS.info("section %s (%d/%d), %.0f s in", section, number, len(sections), time.monotonic() - started)
        if section == "minting":
            tables = minting.run(1 if quick else 9, 5 if quick else 500, 5 if quick else 100, fsync)
            notes: list[str] = []
        elif section == "celery":
            rounds, count, paced = (1, 20, 20) if quick else (3, 2000, 1000)
            result = celery_e2e.run(rounds, count, list(celery_e2e.VARIANTS), fsync, paced_tasks=paced)
            tables, notes = result.tables, result.notes
            charts += _draw(result, args.out or Path(tempfile.mkdtemp(prefix="fencing-bench-charts-")))
        elif section == "scale":
            sizes = [1, 50] if quick else [1, 1000, 100_000]
            tables, notes = scale.run(sizes, 1 if quick else 7, 5 if quick else 300, fsync)
        elif section == "mint-latency":
            from benchmarks import mint

            mint.main(["--rounds", "1", "--count", "5"] if quick else [*(("--no-fsync",) if not fsync else ())])
            continue
        else:
            from benchmarks import gates

            gates.main(["--rounds", "1", "--count", "3", "--warmup", "1"] if quick else [])
            continue
        for table in tables:
            print(table.render())
            missed += table.missed()
        for note in notes:
            print(note)
            missed += [line for line in note.splitlines() if line.endswith("MISSED")]
        sys.stdout.flush()
    print(f"\nall sections in {time.monotonic() - started:.0f} s; peak RSS of this process {peak_rss_mib():.1f} MiB")
    print(machine())
    for chart in charts:
        print(f"chart: {chart}")
    if missed:
        print("targets missed: " + "; ".join(missed))
    return 1 if args.check and missed else 0


def _draw(result: celery_e2e.EndToEnd, out: Path) -> list[Path]:
    try:
        from benchmarks import plots

        return plots.draw_celery(result, out)
    except ImportError as exc:
        print(f"charts not drawn: {exc}", file=sys.stderr)
        return []


if __name__ == "__main__":
    sys.exit(main())
