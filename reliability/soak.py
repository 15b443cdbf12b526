"""The soak: every nemesis, mixed at random, for a long time, on the fenced fleet and the control at once.

::

    python -m reliability.soak --duration 1200 --seed 7

Starts its own 3-node ZooKeeper ensemble, throwaway Redis and PostgreSQL
servers and both worker fleets (nothing shared is touched but a key prefix
in the broker Redis), runs one phase with two lanes of faults drawn at random
by the seed, one for processes (pauses, kills around the commit, clock jumps,
ZooKeeper partitions) and one for servers (ZooKeeper leader kill and stop,
Redis kill and restart with or without persistence, PostgreSQL immediate
restart), then heals, drains and prints both sides' figures. The last account
keeps its Redis data in the store without persistence.

Writes ``report.md`` (the table, the faults by kind, the command),
``figures.json``, ``faults.jsonl`` and the histories into ``--out``.
Exit status: 0 when the fenced side broke no rule and the control did show
violations, 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from .checker import Figures
from .world import PhaseResult, PhaseSpec, World, WorldConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m reliability.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, required=True, help="seconds of faults (then heal and drain)")
    parser.add_argument("--seed", type=int, required=True, help="seed of the schedule (faults and task accounts)")
    parser.add_argument("--rate", type=float, default=2.0, help="tasks per second per side (default 2)")
    parser.add_argument("--accounts", type=int, default=5, help="accounts (rows) the tasks share (default 5)")
    parser.add_argument("--workers", type=int, default=2, help="celery worker processes per side (default 2)")
    parser.add_argument("--concurrency", type=int, default=2, help="prefork pool size per worker (default 2)")
    parser.add_argument("--drain-timeout", type=float, default=600.0, help="seconds to wait for the last tasks")
    parser.add_argument("--out", type=Path, default=None, help="directory for the report (default: a new temp dir)")
    return parser.parse_args(argv)


def _faults_by_kind(result: PhaseResult) -> str:
    rows = []
    kinds = sorted({f.kind for f in result.faults})
    for kind in kinds:
        same = [f for f in result.faults if f.kind == kind]
        by_side = Counter(f.side for f in same)
        proven = sum(1 for f in same if f.proven)
        rows.append(f"| {kind} | {', '.join(f'{s} {n}' for s, n in sorted(by_side.items()))} | {proven}/{len(same)} |")
    return "| fault | injected (side) | proven |\n|---|---|---|\n" + "\n".join(rows)


def report(result: PhaseResult, command: str, seed: int) -> str:
    return (
        f"# Soak, seed {seed}\n\n`{command}`\n\n"
        f"Faults for {result.spec.duration:.0f} s, then heal and drain: {result.wall:.0f} s in all; "
        f"drained: {result.drained}.\n\n{result.table(markdown=True)}\n\n{_faults_by_kind(result)}\n\n"
        f"Fenced examples: {result.fenced.examples}\n\nControl examples: {result.control.examples}\n"
    )


def main(argv: list[str] | None = None) -> int:
    from tests.fixtures.zookeeper import ZooKeeperEnsemble

    args = parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="reliability-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m reliability.soak " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"soak: {command}\nsoak: writing to {out}", flush=True)
    began = time.monotonic()
    spec = PhaseSpec(
        "soak",
        ("process-chaos", "server-chaos"),
        args.duration,
        rate=args.rate,
        accounts=args.accounts,
        store="mixed",
        drain_timeout=args.drain_timeout,
        progress=60.0,
    )
    with ZooKeeperEnsemble() as ensemble:
        config = WorldConfig(root=out, seed=args.seed, workers_per_side=args.workers, concurrency=args.concurrency)
        world = World(config, ensemble).start()
        try:
            print(f"soak: world up in {time.monotonic() - began:.0f}s", flush=True)
            result = world.run_phase(spec)
        finally:
            world.close()
    text = report(result, command, args.seed)
    (out / "report.md").write_text(text)
    figures: dict[str, object] = {}
    for fig in (result.fenced, result.control):
        figures[fig.side] = {**dataclasses.asdict(fig), "safety_violations": fig.safety_violations}
    (out / "figures.json").write_text(json.dumps(figures, indent=2, default=str))
    print(result.table())
    print(_faults_by_kind(result))
    print(f"soak: {time.monotonic() - began:.0f}s in all; report in {out / 'report.md'}")
    return 0 if _passed(result.fenced, result.control) else 1


def _passed(fenced: Figures, control: Figures) -> bool:
    return fenced.ok and control.safety_violations > 0


if __name__ == "__main__":
    raise SystemExit(main())
