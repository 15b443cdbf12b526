"""The checker: reads one side's history and final state, and says what went wrong. O(n log n).

Input (:class:`Observation`): the tasks the harness submitted, the side's JSONL
events, the PostgreSQL audit rows and balances, the Redis state, the faults.
Output (:class:`Figures`): the counts below, and whether any safety or
completeness rule was broken.

Rules (each a count; the fenced side must have 0 of every one):

``stale_accepted``
    An accepted write (an audit row) whose attempt began after an execution
    of the same resource with a higher token had already claimed it (its
    ``invoke`` event, logged after its claims committed, precedes the ``write``
    event, logged before the transaction opened). Events of all processes are
    ordered by the system-wide monotonic clock.
``non_monotonic``
    Per resource, in commit order (audit ``seq``, taken under the row lock),
    a token not strictly above every token accepted before it.
``lost_updates``
    Per resource, accepted writes minus the final balance: increments that
    some later write, based on an older read, overwrote.
``duplicate_effects``
    Audit rows beyond the first of a task id (a task applied twice). The
    fenced side relies on the library's exactly-once (the gates' applied
    records); the control has none, so a task re-delivered or retried after
    its commit applies again there and is counted here.
``missing`` / ``unsubmitted``
    Submitted tasks never applied; applied task ids nobody submitted. A task
    counts as applied by its audit row only: an execution that the library
    ended as done (``duplicate``) says another execution applied, which the
    audit table must confirm.
``balance_mismatch``
    A final balance that is not the last audit row's new value (a write
    without its audit row, or the reverse).
``unanswered``
    A rejection whose action was ``retry`` or ``defer``, or a storage error, not followed
    by a later attempt of the same task id, nor by a later ``duplicate``
    (the library saying the task was applied: nothing left to retry). (A
    drop through ``ignore``, ``reject`` or ``raise`` is documented by the
    rejection event itself; a dropped task shows up in ``missing``.) An
    execution that ends with ``duplicate`` has its outcome: it needs no
    retry and is not an unknown outcome.
``redis_*``
    Redis and PostgreSQL must agree per resource and the Redis log must carry
    strictly increasing tokens. Agree means: the Redis balance is the number of
    task ids Redis applied, each of them applied in PostgreSQL too; and, for a
    Redis that never lost its state, the same task ids and balance as
    PostgreSQL. A Redis that lost its state (restart without persistence, seen
    as a new ``epoch``) starts again from nothing, so only the first part can
    hold: it is what a stale writer accepted across the loss breaks (it writes
    a balance read before the loss). The losses are reported as
    ``redis_state_losses``, and the writes accepted in a later epoch with a
    token below one accepted in an earlier epoch as ``redis_stale_after_loss``:
    the gate must refuse every such write (its floor), so both that count and
    the disagreements are safety violations.

Figures: tasks, attempts (executions: one per minted token), faults injected
and proven, overlap windows (an execution starting while another execution of
the same resource is live), stale writes attempted (the ``stale_accepted`` rule
applied to every write attempt), rejections by phase, unknown outcomes
(executions that ended in an error after their write was sent, or with no
outcome at all, e.g. killed) and how the audit table resolved them, and
recovery time (from the end of a fault to the next commit), and duplicates
prevented: executions the library ended as done because another execution of
the task applied (``duplicate``, the ``duplicate_prevented`` signal), with the
store writes the newest execution skipped as already applied before going on
to the next store (``pg-dup``, ``redis-dup``).
"""

from __future__ import annotations

import bisect
import heapq
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["AuditRow", "Fault", "Figures", "Observation", "RedisState", "check", "format_table"]

TERMINAL = frozenset({"ok", "duplicate", "rejected", "unknown", "error"})
# Rejections that mean "try again later", not "a newer execution exists".
UNAVAILABLE = frozenset({"TokenUnavailableError", "GateUnavailableError"})
EXECUTION_EVENTS = frozenset(
    {
        "minted",
        "invoke",
        "write",
        "pg-ok",
        "pg-dup",
        "redis-ok",
        "redis-dup",
        "ok",
        "duplicate",
        "rejected",
        "unknown",
        "error",
    }
)


@dataclass(frozen=True)
class AuditRow:
    seq: int
    task_id: str
    resource: str
    token: int
    read_value: int
    new_value: int
    attempt: int = 0
    pid: int = 0
    worker: str = ""


@dataclass
class RedisState:
    """One resource's Redis state at the end: balance, epoch, applied task ids, log ``(task, token, seq)``."""

    balance: int | None = None
    epoch: str | None = None
    applied: set[str] = field(default_factory=set)
    log: list[tuple[str, int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class Fault:
    """One injected fault. ``proven``: the harness saw its effect (a process in state T, a new leader, ...)."""

    kind: str
    side: str  # "fenced", "control" or "both"
    target: str
    start: float
    end: float
    proven: bool
    proof: str = ""


@dataclass
class Observation:
    """Everything the checker looks at, for one side."""

    side: str
    submitted: dict[str, str]
    events: list[dict[str, Any]]
    audit: list[AuditRow]
    balances: dict[str, int]
    redis: dict[str, RedisState] | None = None
    faults: list[Fault] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0


#: The safety rules, as the Figures field that counts each and its label in reports and charts.
SAFETY_RULES = (
    ("stale_accepted", "stale accepted"),
    ("non_monotonic", "non-increasing token"),
    ("lost_updates", "lost updates"),
    ("duplicate_effects", "duplicate effects"),
    ("balance_mismatch", "balance mismatches"),
    ("redis_non_monotonic", "Redis non-increasing"),
    ("redis_duplicates", "Redis duplicates"),
    ("redis_disagreements", "Redis/PG disagreements"),
    ("redis_stale_after_loss", "Redis stale after a loss"),
)


@dataclass
class Figures:
    side: str = ""
    tasks: int = 0
    applied: int = 0
    attempts: int = 0
    unavailable_retries: int = 0
    faults_injected: int = 0
    faults_proven: int = 0
    faults_by_kind: dict[str, int] = field(default_factory=dict)
    overlap_windows: int = 0
    stale_writes_attempted: int = 0
    rejected_at_claim: int = 0
    rejected_at_write: int = 0
    stale_accepted: int = 0
    non_monotonic: int = 0
    lost_updates: int = 0
    duplicate_effects: int = 0
    duplicates_prevented: int = 0
    duplicate_writes_skipped: int = 0
    missing: int = 0
    unsubmitted: int = 0
    balance_mismatch: int = 0
    unanswered: int = 0
    unknown_outcomes: int = 0
    unknown_committed: int = 0
    reminted: int = 0
    unobserved_writes: int = 0
    results_dropped: int = 0
    final_value: int = 0
    accepted_writes: int = 0
    redis_checked: bool = False
    redis_state_losses: int = 0
    redis_disagreements: int = 0
    redis_non_monotonic: int = 0
    redis_duplicates: int = 0
    redis_stale_after_loss: int = 0
    recovery_max: float | None = None
    recovery_median: float | None = None
    duration: float = 0.0
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def safety_violations(self) -> int:
        """Broken safety rules (:data:`SAFETY_RULES`): what fencing exists to prevent."""
        return sum(getattr(self, name) for name, _ in SAFETY_RULES)

    @property
    def completeness_violations(self) -> int:
        return self.missing + self.unsubmitted + self.unanswered

    @property
    def ok(self) -> bool:
        return self.safety_violations == 0 and self.completeness_violations == 0

    def example(self, rule: str, text: str) -> None:
        bucket = self.examples.setdefault(rule, [])
        if len(bucket) < 5:
            bucket.append(text)


def check(obs: Observation) -> Figures:
    """Apply every rule to *obs*; see the module docstring."""
    fig = Figures(side=obs.side, tasks=len(obs.submitted), duration=max(0.0, obs.ended - obs.started))
    events = sorted(obs.events, key=lambda e: e["t"])
    accepted = {(row.task_id, row.token) for row in obs.audit}
    executions = _executions(events)
    fig.attempts = len(executions)
    for event in events:
        if event["ev"] != "rejected":
            continue
        if event.get("error") in UNAVAILABLE:
            fig.unavailable_retries += 1
        elif event.get("phase") == "claim":
            fig.rejected_at_claim += 1
        elif event.get("phase") == "body":
            fig.rejected_at_write += 1
    fig.results_dropped = sum(1 for e in events if e["ev"] == "result-dropped")
    fig.duplicates_prevented = sum(1 for e in events if e["ev"] == "duplicate")
    fig.duplicate_writes_skipped = sum(1 for e in events if e["ev"] in ("pg-dup", "redis-dup"))
    _faults(obs, fig)
    fig.overlap_windows = _overlaps(executions)
    _stale_writes(events, accepted, obs.audit, fig)
    _audit_rules(obs, fig)
    _unanswered(events, fig)
    _unknown(executions, accepted, fig)
    if obs.redis is not None:
        _redis_rules(obs, events, fig)
    _recovery(obs, events, fig)
    return fig


# Executions --------------------------------------------------------------------------


@dataclass
class _Execution:
    task: str
    token: int
    resource: str
    start: float
    end: float
    kinds: set[str]
    pid: object = None


def _executions(events: Iterable[dict[str, Any]]) -> dict[tuple[str, int], _Execution]:
    found: dict[tuple[str, int], _Execution] = {}
    for event in events:
        token = event.get("token")
        if event["ev"] not in EXECUTION_EVENTS or token is None or event.get("task") is None:
            continue
        key = (event["task"], int(token))
        execution = found.get(key)
        if execution is None:
            found[key] = _Execution(
                event["task"], int(token), event.get("resource", ""), event["t"], event["t"], set(), event.get("pid")
            )
            execution = found[key]
        execution.start = min(execution.start, event["t"])
        execution.end = max(execution.end, event["t"])
        execution.kinds.add(event["ev"])
    return found


def _overlaps(executions: dict[tuple[str, int], _Execution]) -> int:
    """Executions that began while another execution of the same resource was live (sweep, O(n log n))."""
    by_resource: dict[str, list[_Execution]] = defaultdict(list)
    for execution in executions.values():
        by_resource[execution.resource].append(execution)
    count = 0
    for group in by_resource.values():
        group.sort(key=lambda x: x.start)
        live: list[float] = []
        for execution in group:
            while live and live[0] < execution.start:
                heapq.heappop(live)
            if live:
                count += 1
            heapq.heappush(live, execution.end)
    return count


# Rules ----------------------------------------------------------------------------------


def _stale_writes(
    events: Sequence[dict[str, Any]], accepted: set[tuple[str, int]], audit: Sequence[AuditRow], fig: Figures
) -> None:
    claims: dict[str, list[tuple[float, int]]] = defaultdict(list)
    writes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        if event["ev"] == "invoke":
            claims[event["resource"]].append((event["t"], int(event["token"])))
        elif event["ev"] == "write":
            writes[event["resource"]].append(event)
    observed: set[tuple[str, int]] = set()
    for resource, group in writes.items():
        claimed = sorted(claims.get(resource, []))
        times = [t for t, _ in claimed]
        highest: list[int] = []
        for _, token in claimed:
            highest.append(max(token, highest[-1]) if highest else token)
        for write in group:
            key = (write["task"], int(write["token"]))
            observed.add(key)
            i = bisect.bisect_left(times, write["t"])
            above = highest[i - 1] if i else 0
            if above > key[1]:
                fig.stale_writes_attempted += 1
                if key in accepted:
                    fig.stale_accepted += 1
                    fig.example(
                        "stale_accepted", f"{resource}: task {key[0]} token {key[1]} accepted after {above} claimed"
                    )
    fig.unobserved_writes = sum(1 for row in audit if (row.task_id, row.token) not in observed)


def _audit_rules(obs: Observation, fig: Figures) -> None:
    rows_by_resource: dict[str, list[AuditRow]] = defaultdict(list)
    for row in obs.audit:
        rows_by_resource[row.resource].append(row)
    fig.accepted_writes = len(obs.audit)
    fig.final_value = sum(obs.balances.values())
    for resource in sorted(set(rows_by_resource) | set(obs.balances)):
        rows = sorted(rows_by_resource.get(resource, []), key=lambda r: r.seq)
        highest = 0
        for row in rows:
            if row.token <= highest:
                fig.non_monotonic += 1
                fig.example("non_monotonic", f"{resource}: seq {row.seq} token {row.token} after {highest}")
            highest = max(highest, row.token)
        balance = obs.balances.get(resource, 0)
        lost = len(rows) - balance
        if lost > 0:
            fig.lost_updates += lost
            fig.example("lost_updates", f"{resource}: {len(rows)} accepted writes, balance {balance}")
        last = rows[-1].new_value if rows else 0
        if balance != last:
            fig.balance_mismatch += 1
            fig.example("balance_mismatch", f"{resource}: balance {balance}, last audit row says {last}")
    counts = Counter(row.task_id for row in obs.audit)
    for task_id, count in counts.items():
        if count > 1:
            fig.duplicate_effects += count - 1
            fig.example("duplicate_effects", f"task {task_id} applied {count} times")
    applied = set(counts)
    fig.applied = len(applied & set(obs.submitted))
    missing = set(obs.submitted) - applied
    fig.missing = len(missing)
    for task_id in sorted(missing)[:5]:
        fig.example("missing", f"task {task_id} ({obs.submitted[task_id]}) never applied")
    fig.unsubmitted = len(applied - set(obs.submitted))


def _unanswered(events: Sequence[dict[str, Any]], fig: Figures) -> None:
    starts: dict[str, list[float]] = defaultdict(list)
    for event in events:
        # A later attempt answers, and so does the library saying the task was applied.
        attempt_start = event["ev"] in ("minted", "duplicate") or (
            event["ev"] == "rejected" and event.get("phase") == "mint"
        )
        if attempt_start and event.get("task"):
            starts[event["task"]].append(event["t"])
    for event in events:
        needs_retry = (event["ev"] == "rejected" and event.get("action") in ("retry", "defer")) or event["ev"] in (
            "unknown",
            "error",
        )
        if not needs_retry or not event.get("task"):
            continue
        later = starts.get(event["task"], [])
        if bisect.bisect_right(later, event["t"]) == len(later):
            fig.unanswered += 1
            fig.example("unanswered", f"task {event['task']}: {event['ev']} at {event['t']:.3f} with no later attempt")


def _unknown(executions: dict[tuple[str, int], _Execution], accepted: set[tuple[str, int]], fig: Figures) -> None:
    # A token minted and then nothing, followed by another mint of the same task in the same process:
    # the library drew a fresh token before its claim (a block's token refused, or one below a
    # store's floor). That token was never used: not an unknown outcome.
    mints: dict[tuple[str, object], list[float]] = {}
    for execution in executions.values():
        mints.setdefault((execution.task, execution.pid), []).append(execution.start)
    for key, execution in executions.items():
        later = [start for start in mints[(execution.task, execution.pid)] if start > execution.start]
        if execution.kinds == {"minted"} and later:
            fig.reminted += 1
            continue
        if "unknown" in execution.kinds or not execution.kinds & TERMINAL:
            fig.unknown_outcomes += 1
            if key in accepted:
                fig.unknown_committed += 1


def _redis_rules(obs: Observation, events: Sequence[dict[str, Any]], fig: Figures) -> None:
    assert obs.redis is not None
    fig.redis_checked = True
    redis_writes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        if event["ev"] == "redis-ok":  # a skipped write (redis-dup) ran no script: no epoch
            redis_writes[event["resource"]].append(event)
    audit_tasks: dict[str, set[str]] = defaultdict(set)
    for row in obs.audit:
        audit_tasks[row.resource].add(row.task_id)
    for resource in sorted(set(obs.balances) | set(obs.redis)):
        state = obs.redis.get(resource, RedisState())
        # Epochs in the order they were first seen, then the one the store holds now.
        writes = redis_writes.get(resource, [])
        epochs: list[str] = []
        for event in writes:
            if event["epoch"] not in epochs:
                epochs.append(event["epoch"])
        if state.epoch is not None and state.epoch not in epochs:
            epochs.append(state.epoch)
        lost_at_end = bool(writes) and state.epoch is None
        losses = max(0, len(epochs) - 1) + (1 if lost_at_end else 0)
        fig.redis_state_losses += losses
        # Writes accepted in a later epoch with a token below one accepted in an earlier epoch.
        index = {epoch: i for i, epoch in enumerate(epochs)}
        top = [0] * len(epochs)
        for event in writes:
            i = index[event["epoch"]]
            top[i] = max(top[i], int(event["token"]))
        below = [0] * len(epochs)
        for i in range(1, len(epochs)):
            below[i] = max(below[i - 1], top[i - 1])
        for event in writes:
            if int(event["token"]) < below[index[event["epoch"]]]:
                fig.redis_stale_after_loss += 1
        # The log of the current epoch: strictly increasing tokens, each task once.
        highest = 0
        seen: set[str] = set()
        for task_id, token, _seq in state.log:
            if token <= highest:
                fig.redis_non_monotonic += 1
                fig.example("redis_non_monotonic", f"{resource}: token {token} after {highest}")
            highest = max(highest, token)
            if task_id in seen:
                fig.redis_duplicates += 1
            seen.add(task_id)
        pg_balance = obs.balances.get(resource, 0)
        pg_applied = audit_tasks.get(resource, set())
        if losses:
            # Redis started again from nothing: its balance counts its own epoch's effects,
            # each of which PostgreSQL has too.
            agree = (state.balance or 0) == len(state.applied) and state.applied <= pg_applied
        else:
            agree = (state.balance or 0) == pg_balance and state.applied == pg_applied
        if not agree:
            fig.redis_disagreements += 1
            fig.example(
                "redis_disagreements",
                f"{resource}: redis balance {state.balance} applied {len(state.applied)}, "
                f"postgres balance {pg_balance} applied {len(audit_tasks.get(resource, set()))}"
                + (f" (redis lost its state {losses}x)" if losses else ""),
            )


def _faults(obs: Observation, fig: Figures) -> None:
    mine = [f for f in obs.faults if f.side in (obs.side, "both")]
    fig.faults_injected = len(mine)
    fig.faults_proven = sum(1 for f in mine if f.proven)
    fig.faults_by_kind = dict(sorted(Counter(f.kind for f in mine).items()))


def _recovery(obs: Observation, events: Sequence[dict[str, Any]], fig: Figures) -> None:
    commits = sorted(e["t"] for e in events if e["ev"] == "pg-ok")
    delays: list[float] = []
    for fault in obs.faults:
        if fault.side not in (obs.side, "both"):
            continue
        i = bisect.bisect_right(commits, fault.end)
        if i < len(commits):
            delays.append(commits[i] - fault.end)
        elif obs.ended > fault.end:
            delays.append(obs.ended - fault.end)  # no commit after it at all: the whole rest of the run
    if delays:
        fig.recovery_max = max(delays)
        fig.recovery_median = statistics.median(delays)


# Presentation ---------------------------------------------------------------------------

ROWS: tuple[tuple[str, str], ...] = (
    ("tasks", "tasks submitted"),
    ("applied", "tasks applied"),
    ("attempts", "attempts (executions with a token)"),
    ("unavailable_retries", "retries: grantor or gate store unavailable"),
    ("faults_injected", "faults injected"),
    ("faults_proven", "faults proven"),
    ("overlap_windows", "overlap windows (2 executions of 1 resource live)"),
    ("stale_writes_attempted", "stale writes attempted"),
    ("rejected_at_claim", "stale claims refused"),
    ("rejected_at_write", "stale writes refused"),
    ("stale_accepted", "stale writes accepted"),
    ("non_monotonic", "commits with a non-increasing token"),
    ("lost_updates", "lost updates"),
    ("duplicate_effects", "duplicate effects"),
    ("duplicates_prevented", "duplicates prevented (store writes skipped)"),
    ("missing", "tasks never applied"),
    ("unanswered", "rejections/errors with no retry"),
    ("unknown_outcomes", "unknown outcomes (resolved committed)"),
    ("reminted", "tokens re-minted fresh before their claim"),
    ("results_dropped", "stale results dropped by the backend"),
    ("final_value", "final value (sum of balances)"),
    ("accepted_writes", "accepted writes"),
    ("redis_disagreements", "Redis/PostgreSQL disagreements"),
    ("redis_state_losses", "Redis state losses (no persistence)"),
    ("redis_stale_after_loss", "Redis writes below a pre-loss token"),
    ("recovery_max", "recovery time, max s (median)"),
    ("duration", "duration s"),
)


def _cell(fig: Figures, name: str) -> str:
    value = getattr(fig, name)
    if name == "unknown_outcomes":
        return f"{value} ({fig.unknown_committed})"
    if name == "duplicates_prevented":
        return f"{value} ({fig.duplicate_writes_skipped})"
    if name == "faults_proven":
        return f"{value}"
    if name == "recovery_max":
        return "-" if value is None else f"{value:.2f} ({fig.recovery_median:.2f})"
    if name == "duration":
        return f"{value:.0f}"
    return str(value)


def format_table(columns: Sequence[Figures], *, markdown: bool = False) -> str:
    """The figures of one or more sides, one row per figure."""
    header = ["", *(f.side for f in columns)]
    body = [[label, *(_cell(f, name) for f in columns)] for name, label in ROWS]
    body.append(["safety violations", *(str(f.safety_violations) for f in columns)])
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in [header, *body])


def figure_names() -> list[str]:
    return [f.name for f in fields(Figures)]
