"""The JSONL history: one line per event of every attempt, written by the workers.

Each worker process appends to its own file, ``<dir>/<worker>-<pid>.jsonl``,
with one ``write(2)`` per line on a file opened ``O_APPEND``: a process killed
with SIGKILL leaves at most its last line incomplete, and readers skip
incomplete lines.

Every event carries ``t``, the system-wide ``CLOCK_MONOTONIC`` (the same clock
in every process on the machine, so events of different processes can be
ordered), and ``wall``, the process's own wall clock, which a clock-jump
nemesis may have moved (the checker uses ``wall - t`` to prove the jump).

Event kinds (``ev``), in the order an execution produces them:

===============  =============================================================
``submit``       the harness sent a task (``side``, ``task``, ``resource``)
``minted``       a token was minted for an execution (``token``)
``invoke``       the body started: every claim succeeded (fenced) or, for the
                 control, the body simply started
``write``        the body is about to open its PostgreSQL write (``read``)
``pg-ok``        the write committed (``seq`` of the audit row)
``pg-dup``       the SQL gate found the task applied by another execution
                 (``AlreadyAppliedError``; ``superseded``, ``high_water``):
                 nothing written, the body goes on to the next store
``redis-ok``     the Redis write ran (``epoch``, ``seq``); ``redis-dup`` as
                 ``pg-dup``, at the Redis gate
``ok``           the body returned
``duplicate``    the library ended the execution as done: another execution
                 of the task applied (the ``duplicate_prevented`` signal:
                 ``phase`` claim, body or seal; ``action`` ignore or done;
                 ``superseded``, ``high_water``)
``rejected``     fenced out (``phase`` mint, claim or body; ``action``)
``unknown``      a storage error after the write was sent: outcome unknown
``error``        a storage error before anything was sent: nothing written
``failed``       Celery marked the task failed (``error``)
``session``      the ZooKeeper session of a process changed (``state``)
``result-dropped``  the fenced backend dropped a stale result write
===============  =============================================================
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["HistoryTail", "HistoryWriter", "read_history"]


class HistoryWriter:
    """Appends events to this process's history file. Fork-safe: a child opens its own file."""

    def __init__(self, directory: str | os.PathLike[str], worker: str, **common: Any) -> None:
        self.directory = Path(directory)
        self.worker = worker
        self.common = common
        self._fd: int | None = None
        self._pid = 0

    def _file(self) -> int:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:
            # After fork the parent's descriptor is shared: open our own, never close theirs.
            path = self.directory / f"{self.worker}-{pid}.jsonl"
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._pid = pid
        return self._fd

    def emit(self, ev: str, **fields: Any) -> None:
        record = {"ev": ev, "t": time.monotonic(), "wall": time.time(), "pid": os.getpid(), "worker": self.worker}
        record.update(self.common)
        record.update(fields)
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        os.write(self._file(), line)


def _parse_lines(data: bytes) -> Iterator[dict[str, Any]]:
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            continue  # a line cut short by SIGKILL
        if isinstance(record, dict) and "ev" in record and "t" in record:
            yield record


def read_history(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete event in every ``*.jsonl`` file of *directory*, sorted by ``t``."""
    events: list[dict[str, Any]] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        events.extend(_parse_lines(path.read_bytes()))
    events.sort(key=lambda e: e["t"])
    return events


class HistoryTail:
    """Reads the events appended to a history directory since the last call (for triggered nemeses).

    Cheap enough to call every few milliseconds: the directory is listed at most
    every ``rescan`` seconds, and a file is opened only when it grew.
    """

    def __init__(self, directory: str | os.PathLike[str], *, rescan: float = 0.25) -> None:
        self.directory = Path(directory)
        self.rescan = rescan
        self._paths: list[Path] = []
        self._listed = -1e9
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def poll(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        if now - self._listed >= self.rescan:
            self._paths = sorted(self.directory.glob("*.jsonl"))
            self._listed = now
        events: list[dict[str, Any]] = []
        for path in self._paths:
            offset = self._offsets.get(path, 0)
            try:
                if path.stat().st_size <= offset:
                    continue
                with path.open("rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
            except OSError:
                continue
            self._offsets[path] = offset + len(chunk)
            data = self._partial.pop(path, b"") + chunk
            complete, _, rest = data.rpartition(b"\n")
            if rest:
                self._partial[path] = rest
            events.extend(_parse_lines(complete))
        events.sort(key=lambda e: e["t"])
        return events
