"""When a run's tasks were submitted, applied and done, and when its violations happened.

What the soak's progress lines count (:func:`so_far`: the checker itself, on the
history written so far) and what its chart (:mod:`reliability.plots`) draws.
Pure functions of the history (:mod:`reliability.history`), the audit rows and
the submission times; nothing here reads a server.

The chart puts a violation in time for each rule that one write breaks, at that
write (:func:`violation_marks`):

``stale_accepted``     the accepted write's ``write`` event, when a higher token had
                       claimed the resource before it;
``non_monotonic``      the commit of a row whose token is not above every token
                       committed before it on the resource;
``duplicate_effects``  the commit of each row beyond the first of a task id;
``lost_updates``       the commit of a row that read less than the row before it
                       wrote: it overwrote that many increments (``count``).

The first three count what the checker counts (a test pins it). The checker
counts lost updates as the increments missing from the final balance; a later
write that read a newer value than an overwrite can bring some back, so the
marks' ``count`` adds up to at least the checker's figure, and to more than 0
exactly when it is. The rules about the final state (balance mismatches,
Redis/PostgreSQL agreement) have no time: the chart states the checker's count
of every rule (:func:`safety_counts`) beside the lanes.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .checker import SAFETY_RULES, AuditRow, Fault, Figures, Observation, check

__all__ = [
    "Mark",
    "SideTimeline",
    "Timeline",
    "committed_rows",
    "safety_counts",
    "side_timeline",
    "so_far",
    "violation_marks",
]

DONE = ("ok", "duplicate")
#: The checker's safety rules (the terms of ``Figures.safety_violations``) as the chart names them.


@dataclass(frozen=True)
class Mark:
    """One violation: when (``t``, the monotonic clock), which rule, where, and how many it counts for."""

    t: float
    rule: str
    resource: str
    task: str
    count: int = 1


@dataclass
class SideTimeline:
    """One side's tasks as ``(submitted, applied, done)`` times (``None``: never), and its violations."""

    side: str
    tasks: list[tuple[float, float | None, float | None]] = field(default_factory=list)
    #: The violations of single writes, in time.
    marks: list[Mark] = field(default_factory=list)
    #: The checker's final count of each safety rule broken (:func:`safety_counts`).
    violations: dict[str, int] = field(default_factory=dict)


@dataclass
class Timeline:
    """Everything the soak's chart draws; times are seconds of the monotonic clock, ``origin`` the first submission."""

    title: str
    origin: float
    faults_until: float
    ended: float
    faults: list[Fault]
    sides: list[SideTimeline]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timeline:
        sides = [
            SideTimeline(
                side["side"],
                [(s, a, d) for s, a, d in side["tasks"]],
                [Mark(**mark) for mark in side["marks"]],
                side["violations"],
            )
            for side in data["sides"]
        ]
        faults = [Fault(**fault) for fault in data["faults"]]
        return cls(data["title"], data["origin"], data["faults_until"], data["ended"], faults, sides)


def committed_rows(events: Iterable[dict[str, Any]]) -> list[AuditRow]:
    """The audit rows the history reports committed (``pg-ok``): what the progress lines use mid-run.

    The audit table itself is only read at the end; a commit whose ``pg-ok``
    was never logged (an unknown outcome) is missing here until then.
    """
    return [
        AuditRow(
            seq=int(e["seq"]),
            task_id=e["task"],
            resource=e["resource"],
            token=int(e["token"]),
            read_value=int(e["new"]) - 1,
            new_value=int(e["new"]),
        )
        for e in events
        if e["ev"] == "pg-ok"
    ]


def violation_marks(events: Sequence[dict[str, Any]], audit: Sequence[AuditRow]) -> list[Mark]:
    """Every violation of one side that a single write commits, in time order; see the module docstring."""
    claims: dict[str, list[tuple[float, int]]] = defaultdict(list)
    writes: list[dict[str, Any]] = []
    for event in events:
        if event["ev"] == "write":
            writes.append(event)
        elif event["ev"] == "invoke":
            claims[event["resource"]].append((event["t"], int(event["token"])))
    marks = _stale_accepted(writes, claims, {(row.task_id, row.token) for row in audit})
    commits = _commit_times(events, audit)
    seen: set[str] = set()
    highest: dict[str, int] = defaultdict(int)
    previous: dict[str, int] = defaultdict(int)  # the value the row before wrote
    for row in sorted(audit, key=lambda r: r.seq):
        t = commits[row.task_id, row.token]
        if row.token <= highest[row.resource]:
            marks.append(Mark(t, "non_monotonic", row.resource, row.task_id))
        highest[row.resource] = max(highest[row.resource], row.token)
        if previous[row.resource] > row.read_value:
            marks.append(Mark(t, "lost_updates", row.resource, row.task_id, previous[row.resource] - row.read_value))
        previous[row.resource] = row.new_value
        if row.task_id in seen:
            marks.append(Mark(t, "duplicate_effects", row.resource, row.task_id))
        seen.add(row.task_id)
    return sorted(marks, key=lambda m: m.t)


def _commit_times(events: Iterable[dict[str, Any]], audit: Iterable[AuditRow]) -> dict[tuple[str, int], float]:
    """When each audit row committed: its ``pg-ok``, else (an unknown outcome) its ``write``, else the last event."""
    logged: dict[tuple[str, int], float] = {}
    last = 0.0
    for event in events:
        last = max(last, event["t"])
        if event["ev"] in ("write", "pg-ok") and event.get("token") is not None:
            key = (event["task"], int(event["token"]))
            if event["ev"] == "pg-ok" or key not in logged:
                logged[key] = event["t"]
    return {(row.task_id, row.token): logged.get((row.task_id, row.token), last) for row in audit}


def _stale_accepted(
    writes: Sequence[dict[str, Any]], claims: dict[str, list[tuple[float, int]]], accepted: set[tuple[str, int]]
) -> list[Mark]:
    tops: dict[str, tuple[list[float], list[int]]] = {}
    for resource, claimed in claims.items():
        claimed.sort()
        running: list[int] = []
        for _, token in claimed:
            running.append(max(token, running[-1]) if running else token)
        tops[resource] = ([t for t, _ in claimed], running)
    marks = []
    for write in writes:
        key = (write["task"], int(write["token"]))
        times, running = tops.get(write["resource"], ([], []))
        i = bisect.bisect_left(times, write["t"])
        if key in accepted and i and running[i - 1] > key[1]:
            marks.append(Mark(write["t"], "stale_accepted", write["resource"], key[0]))
    return marks


def so_far(
    events: Iterable[dict[str, Any]], side: str, submitted: dict[str, str], faults: Sequence[Fault] = ()
) -> Figures:
    """The checker's figures of *side* on the history so far: what the progress lines print.

    The audit rows are those the history reports committed (:func:`committed_rows`),
    each balance its last row's value, and Redis is not read: of the safety rules,
    those about writes count (stale writes accepted, non-increasing tokens, lost
    updates, duplicate effects), and the end-state ones wait for the final table.
    *faults* are those injected so far (``faults_injected``, ``faults_proven``).
    """
    mine = [e for e in events if e.get("mode") == side and e.get("task") in submitted]
    rows = committed_rows(mine)
    balances = {row.resource: row.new_value for row in sorted(rows, key=lambda r: r.seq)}
    return check(Observation(side, dict(submitted), mine, rows, balances, faults=list(faults)))


def safety_counts(figures: Figures) -> dict[str, int]:
    """The safety rules *figures* breaks, by label, with their counts: they add up to ``safety_violations``."""
    counts = {label: getattr(figures, name) for name, label in SAFETY_RULES}
    return {label: n for label, n in counts.items() if n}


def side_timeline(
    side: str,
    events: Sequence[dict[str, Any]],
    audit: Sequence[AuditRow],
    submitted_at: dict[str, float],
    figures: Figures | None = None,
) -> SideTimeline:
    """One side's timeline: each submitted task's first commit (by the audit rows) and first result, and its marks."""
    applied: dict[str, float] = {}
    for (task, _), t in _commit_times(events, audit).items():
        applied[task] = min(t, applied.get(task, t))
    done: dict[str, float] = {}
    for event in sorted(events, key=lambda e: e["t"]):
        if event["ev"] in DONE:
            done.setdefault(event.get("task", ""), event["t"])
    tasks = [(t, applied.get(task), done.get(task)) for task, t in sorted(submitted_at.items(), key=lambda x: x[1])]
    violations = safety_counts(figures) if figures is not None else {}
    return SideTimeline(side, tasks, violation_marks(events, audit), violations)
