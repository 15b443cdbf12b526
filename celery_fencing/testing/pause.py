"""Pause points: a named place in a task body where a test can freeze that execution, across processes.

Put ``pause_point("after-read")`` in a task, between its read and its write::

    @app.task(base=FencedTask, fencing_resource="account:{account_id}", fencing_gates=gates)
    def deposit(account_id, amount):
        balance = read_balance(account_id)
        pause_point("after-read")
        gate.set(None, f"balance:{account_id}", balance + amount)

In production it does nothing: the module reads one environment variable
(:data:`ENV_VAR`) once, at import, and each call is one comparison of a module
global with ``None`` (tens of nanoseconds; no I/O, no environment lookup).

In a test, :class:`PausePoints` owns a directory and names it in
:data:`ENV_VAR` for the worker processes it helps start (and sets it in the
test's own process for embedded workers). Then:

* an execution that reaches a point the test *holds* (:meth:`PausePoints.hold`)
  records its arrival and waits until the test releases it;
* an execution that reaches a point nobody holds records its arrival and goes on.

The test waits for arrivals (:meth:`PausePoints.wait`), which say who arrived
(pid, task id, token, retries), and releases them (:meth:`Arrival.release`):
"freeze this execution between its read and its write" needs no sleep.

The protocol is files, so it works between any processes that share the
directory: an arrival is ``arrivals/<point>/<n>.json`` (``n`` counts from 1,
claimed atomically by ``link``), a hold is a slot file the arriving execution
claims by ``rename`` (exactly one claimant wins each slot), and a release is
``releases/<point>/<n>``. The waiting side polls for its release file every
10 ms, up to :data:`HOLD_LIMIT` seconds, then raises
:class:`PausePointTimeoutError` in the task (a test that forgot to release
fails instead of hanging).

The name: ``pause_point`` says what the call does in a test (pause here), and
does not start with ``test``, so pytest never collects it when a test module
imports it; ``checkpoint`` already means a resumable step in the examples,
and ``breakpoint`` is Python's debugger hook.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_VAR",
    "HOLD_LIMIT",
    "Arrival",
    "PausePointTimeoutError",
    "PausePoints",
    "pause_point",
]

#: The environment variable that names the pause directory in worker processes.
ENV_VAR = "CELERY_FENCING_PAUSE_DIR"
#: Seconds a held execution waits for its release before it raises.
HOLD_LIMIT = 300.0
_POLL = 0.01
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")

# Read once: a production process that never sets the variable pays one None check per call.
_directory: str | None = os.environ.get(ENV_VAR) or None


class PausePointTimeoutError(RuntimeError):
    """A held execution was not released within :data:`HOLD_LIMIT` seconds.

    A test failure, not a library error: it derives from RuntimeError, not
    :class:`~celery_fencing.FencingError`, so a task that handles fencing
    errors never mistakes it for a refusal.
    """


def pause_point(name: str) -> None:
    """Mark a place in a task body where a test may freeze this execution; a no-op outside such a test.

    :param name: the point's name (letters, digits, ``_.:-``; up to 100).
    :raises PausePointTimeoutError: in a test, when the execution is held and
        not released within :data:`HOLD_LIMIT` seconds.
    """
    if _directory is None:
        return
    _arrive(Path(_directory), name)


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"a pause point name is 1 to 100 of letters, digits and _.:- , not {name!r}")
    return name


def _who() -> dict[str, Any]:
    """The execution at the point: its task id, retries and fencing token, when there is one."""
    from ..context import current_execution

    fields: dict[str, Any] = {"pid": os.getpid(), "thread": threading.current_thread().name}
    execution = current_execution()
    if execution is not None:
        fields.update(token=execution.token.value, resource=execution.token.resource, task_id=execution.task_id)
    try:
        from celery import current_task
    except ImportError:  # a pause point outside Celery
        return fields
    request = getattr(current_task, "request", None)
    if request is not None and getattr(request, "id", None):
        fields.setdefault("task_id", request.id)
        fields["retries"] = request.retries or 0
    return fields


def _arrive(directory: Path, name: str) -> None:
    _check_name(name)
    held = _claim_hold(directory, name)
    record = {"name": name, "held": held, **_who()}
    index = _record_arrival(directory / "arrivals" / name, record)
    if not held:
        return
    release = directory / "releases" / name / str(index)
    everything = directory / "released-all"
    deadline = time.monotonic() + HOLD_LIMIT
    while not (release.exists() or everything.exists()):
        if time.monotonic() >= deadline:
            raise PausePointTimeoutError(f"pause point {name!r} (arrival {index}) was not released in {HOLD_LIMIT:g}s")
        time.sleep(_POLL)  # polling for the release file: the loop re-checks


def _claim_hold(directory: Path, name: str) -> bool:
    holds = directory / "holds" / name
    if (directory / "released-all").exists():
        return False
    if (holds / "always").exists():
        return True
    claimed = directory / "claimed"
    with contextlib.suppress(FileNotFoundError):
        for slot in sorted(holds.glob("*.slot")):
            try:
                slot.rename(claimed / f"{name}-{uuid.uuid4().hex}")
            except FileNotFoundError:
                continue  # another execution claimed this slot first
            return True
    return False


def _record_arrival(arrivals: Path, record: dict[str, Any]) -> int:
    """Write *record* as the next numbered arrival, atomically with its content; return its number."""
    arrivals.mkdir(parents=True, exist_ok=True)
    draft = arrivals / f".{uuid.uuid4().hex}.tmp"
    index = len(list(arrivals.glob("*.json"))) + 1
    try:
        while True:
            draft.write_text(json.dumps({**record, "index": index}))
            try:
                os.link(draft, arrivals / f"{index}.json")
                return index
            except FileExistsError:
                index += 1
    finally:
        draft.unlink(missing_ok=True)


@dataclass(frozen=True)
class Arrival:
    """One execution that reached a pause point: who it is, and whether it is held there."""

    name: str
    index: int
    held: bool
    pid: int
    task_id: str | None
    token: int | None
    resource: str | None
    retries: int | None
    directory: Path

    def release(self) -> None:
        """Let this execution go on (a no-op for one that was not held, or was released already)."""
        release = self.directory / "releases" / self.name / str(self.index)
        release.parent.mkdir(parents=True, exist_ok=True)
        release.touch()


class PausePoints:
    """The test's side of :func:`pause_point`: hold points, wait for arrivals, release them.

    ::

        points = PausePoints(tmp_path / "pauses")
        points.activate()                  # embedded workers in this process
        worker_env = points.env            # real worker processes
        points.hold("after-read")          # the next execution to arrive waits there
        first = points.wait("after-read")  # it arrived: pid, task_id, token
        ...
        first.release()
        points.close()                     # releases everything; pause_point is a no-op again

    Thread-safe; any number of processes may share the directory.
    """

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        for part in ("arrivals", "holds", "releases", "claimed"):
            (self.directory / part).mkdir(parents=True, exist_ok=True)

    @property
    def env(self) -> dict[str, str]:
        """The environment a worker process needs for its pause points to answer to this object."""
        return {ENV_VAR: str(self.directory)}

    def activate(self) -> None:
        """Make :func:`pause_point` in *this* process answer to this object (for embedded workers)."""
        global _directory
        _directory = str(self.directory)

    def deactivate(self) -> None:
        """Make :func:`pause_point` in this process a no-op again (when this object activated it)."""
        global _directory
        if _directory == str(self.directory):
            _directory = None

    def hold(self, name: str, times: int | None = 1) -> None:
        """Hold the next *times* executions that reach point *name* (``None``: every one, until released)."""
        holds = self.directory / "holds" / _check_name(name)
        holds.mkdir(parents=True, exist_ok=True)
        if times is None:
            (holds / "always").touch()
            return
        if not isinstance(times, int) or isinstance(times, bool) or times < 1:
            raise ValueError(f"times must be a whole number >= 1 or None, not {times!r}")
        for _ in range(times):
            (holds / f"{uuid.uuid4().hex}.slot").touch()

    def arrivals(self, name: str) -> list[Arrival]:
        """Every arrival at point *name* so far, in order."""
        folder = self.directory / "arrivals" / _check_name(name)
        found = []
        for path in folder.glob("*.json"):
            record = json.loads(path.read_text())
            found.append(
                Arrival(
                    name=name,
                    index=record["index"],
                    held=record["held"],
                    pid=record["pid"],
                    task_id=record.get("task_id"),
                    token=record.get("token"),
                    resource=record.get("resource"),
                    retries=record.get("retries"),
                    directory=self.directory,
                )
            )
        return sorted(found, key=lambda arrival: arrival.index)

    def wait(self, name: str, count: int = 1, *, timeout: float = 60.0) -> Arrival:
        """Wait until *count* executions have arrived at point *name*; return the *count*-th.

        :raises AssertionError: after *timeout* seconds, naming the point and the arrivals seen.
        """
        deadline = time.monotonic() + timeout
        while True:
            seen = self.arrivals(name)
            if len(seen) >= count:
                return seen[count - 1]
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"timed out after {timeout:g}s waiting for arrival {count} at pause point {name!r}; seen: {seen}"
                )
            time.sleep(_POLL)  # polling the arrivals directory: the loop re-checks

    def release_all(self) -> None:
        """Release every held execution, now and later: no execution waits at any point from now on."""
        (self.directory / "released-all").touch()

    def close(self) -> None:
        """Release everything and deactivate (what the ``fencing_pause_points`` fixture does after a test)."""
        self.release_all()
        self.deactivate()
