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

Every ``--progress`` seconds it logs a line on stderr: the time so far and,
per side, the tasks submitted and applied, the faults so far (injected and
proven) and the violations so far. The violations so far are those a single
write commits (stale writes accepted, non-increasing tokens, lost updates,
duplicate effects; :mod:`reliability.timeline`), counted from the history as
it is written; the final table adds the rules about the final state.

Writes ``report.md`` (the table, the faults by kind, the command, the chart),
``figures.json``, ``faults.jsonl``, ``timeline.json``, the histories and, with
matplotlib installed (the ``plots`` extra), ``soak.png`` (:mod:`reliability.plots`)
into ``--out``. Exit status: 0 when the fenced side broke no rule and the
control did show violations, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import shlex
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from celery.signals import after_task_publish

from .checker import Fault, Figures
from .collect import read_audit, scope_events
from .history import HistoryTail, read_history
from .timeline import Timeline, side_timeline, so_far
from .world import SIDES, PhaseResult, PhaseSpec, World, WorldConfig

PROGRESS = logging.getLogger("reliability.soak")


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
    parser.add_argument("--progress", type=float, default=20.0, help="seconds between progress lines (default 20)")
    args = parser.parse_args(argv)
    if args.progress <= 0:
        parser.error("--progress must be > 0")
    if args.out is not None and any((args.out / "history").glob("*.jsonl")):
        # Its phase would have the same scope as the old run's, and the old histories would count.
        parser.error(f"--out {args.out} holds the histories of an earlier soak: give a new directory")
    return args


class SoakWorld(World):
    """The world, with the soak's progress lines in place of the world's own."""

    async def _progress(
        self, spec: PhaseSpec, started: float, submitted: dict[str, dict[str, str]], faults: list[Fault]
    ) -> None:
        tail = HistoryTail(self.history_dir)
        events: list[dict[str, Any]] = []
        while True:
            await asyncio.sleep(spec.progress)
            # Copied on the loop, whose tasks add to them; the history is read and checked off it.
            snapshot = {side: dict(submitted[side]) for side in SIDES}
            injected = list(faults)
            # The line is stamped with the snapshot's time, not with when the check (which may
            # take seconds on a loaded machine) is done: the figures are as of the snapshot.
            elapsed = time.monotonic() - started
            events.extend(await asyncio.to_thread(tail.poll))
            figures = await asyncio.to_thread(_check_sides, events, snapshot, injected)
            phase = f"of {spec.duration:.0f}s" if elapsed < spec.duration else "(healed, draining)"
            sides = "; ".join(
                f"{side} submitted {len(snapshot[side])} applied {f.applied} "
                f"faults {f.faults_injected} ({f.faults_proven} proven) violations {f.safety_violations}"
                for side, f in figures.items()
            )
            PROGRESS.info("%5.0fs %s: %s", elapsed, phase, sides)


def _check_sides(
    events: list[dict[str, Any]], submitted: dict[str, dict[str, str]], faults: list[Fault]
) -> dict[str, Figures]:
    return {side: so_far(events, side, submitted[side], faults) for side in SIDES}


class Submissions:
    """When each task was published, by task id, and to which queue (Celery's ``after_task_publish``)."""

    def __init__(self) -> None:
        self.at: dict[str, tuple[str, float]] = {}

    def __enter__(self) -> Submissions:
        after_task_publish.connect(self._published, weak=False)
        return self

    def __exit__(self, *exc: object) -> None:
        after_task_publish.disconnect(self._published)

    def _published(self, headers: dict[str, Any] | None = None, routing_key: str = "", **_: Any) -> None:
        if headers and "id" in headers:
            self.at[headers["id"]] = (routing_key, time.monotonic())

    def of_queue(self, queue: str) -> dict[str, float]:
        return {task: t for task, (key, t) in self.at.items() if key == queue}


def _faults_by_kind(result: PhaseResult) -> str:
    rows = []
    kinds = sorted({f.kind for f in result.faults})
    for kind in kinds:
        same = [f for f in result.faults if f.kind == kind]
        by_side = Counter(f.side for f in same)
        proven = sum(1 for f in same if f.proven)
        rows.append(f"| {kind} | {', '.join(f'{s} {n}' for s, n in sorted(by_side.items()))} | {proven}/{len(same)} |")
    return "| fault | injected (side) | proven |\n|---|---|---|\n" + "\n".join(rows)


def report(result: PhaseResult, command: str, seed: int, chart: str | None = None) -> str:
    return (
        f"# Soak, seed {seed}\n\n`{command}`\n\n"
        f"Faults for {result.spec.duration:.0f} s, then heal and drain: {result.wall:.0f} s in all; "
        f"drained: {result.drained}.\n\n{result.table(markdown=True)}\n\n{_faults_by_kind(result)}\n\n"
        + (f"![Latency, throughput, faults and violations over time]({chart})\n\n" if chart else "")
        + f"Fenced examples: {result.fenced.examples}\n\nControl examples: {result.control.examples}\n"
    )


def timeline(world: World, result: PhaseResult, submissions: Submissions, seed: int) -> Timeline:
    """The run in time, read while the world is still up (the audit rows live in its PostgreSQL)."""
    events = read_history(world.history_dir)
    sides = []
    for figures in (result.fenced, result.control):
        side = figures.side
        submitted_at = submissions.of_queue(world.queues[side])
        audit, _ = read_audit(world.names[side], result.scope, world.postgres.url)
        mine = scope_events(events, side, result.scope, set(submitted_at))
        sides.append(side_timeline(side, mine, audit, submitted_at, figures))
    origin = min((t for _, t in submissions.at.values()), default=time.monotonic() - result.wall)
    title = (
        f"Soak, seed {seed}: {result.spec.duration:.0f} s of faults ({result.fenced.faults_injected} per side), "
        f"{result.fenced.tasks} tasks per side; safety violations: "
        + ", ".join(f"{f.side} {f.safety_violations}" for f in (result.fenced, result.control))
    )
    return Timeline(title, origin, origin + result.spec.duration, origin + result.wall, list(result.faults), sides)


def draw(timeline: Timeline, out: Path) -> str | None:
    """Draw ``soak.png`` into *out*; its file name, or ``None`` (said in one line) without matplotlib."""
    from . import plots

    try:
        return plots.draw_soak(timeline, out / "soak.png").name
    except ImportError as exc:
        print(f"soak: no chart: {exc}; then: python -m reliability.plots {out}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    from tests.fixtures.zookeeper import ZooKeeperEnsemble

    args = parse_args(argv)
    # Lines on stderr, stamped: the progress (INFO) and any library's warnings; stdout keeps the table.
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    PROGRESS.setLevel(logging.INFO)
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
        progress=args.progress,
    )
    with ZooKeeperEnsemble() as ensemble, Submissions() as submissions:
        config = WorldConfig(root=out, seed=args.seed, workers_per_side=args.workers, concurrency=args.concurrency)
        world = SoakWorld(config, ensemble).start()
        try:
            print(f"soak: world up in {time.monotonic() - began:.0f}s", flush=True)
            result = world.run_phase(spec)
            run = timeline(world, result, submissions, args.seed)
        finally:
            world.close()
    (out / "timeline.json").write_text(json.dumps(dataclasses.asdict(run)))
    chart = draw(run, out)
    text = report(result, command, args.seed, chart)
    (out / "report.md").write_text(text)
    figures: dict[str, object] = {}
    for fig in (result.fenced, result.control):
        figures[fig.side] = {**dataclasses.asdict(fig), "safety_violations": fig.safety_violations}
    (out / "figures.json").write_text(json.dumps(figures, indent=2, default=str))
    print(result.table())
    print(_faults_by_kind(result))
    print(f"soak: {time.monotonic() - began:.0f}s in all; report in {out / 'report.md'}")
    if chart:
        print(f"soak: chart in {out / chart}")
    return 0 if _passed(result.fenced, result.control) else 1


def _passed(fenced: Figures, control: Figures) -> bool:
    return fenced.ok and control.safety_violations > 0


if __name__ == "__main__":
    raise SystemExit(main())
