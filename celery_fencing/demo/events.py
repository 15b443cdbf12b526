"""An append-only JSON-lines log through which demo workers report what they do.

Each event is one ``write()`` of one line to a file opened with ``O_APPEND``, so
lines from several processes never interleave (they are far below ``PIPE_BUF``).
The demo runner follows the file to synchronise with the workers: it waits for
events, never for a fixed time.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["EventLog"]


class EventLog:
    """Writes events to, and reads new events from, one file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def emit(self, kind: str, **fields: Any) -> None:
        """Append one event: ``{"kind": kind, "t": <time.monotonic()>, "pid": <pid>, **fields}``.

        The monotonic clock is system-wide, so times from the workers and the
        runner (all on one host) compare, and a wall-clock jump cannot reorder them.
        """
        record = {"kind": kind, "t": time.monotonic(), "pid": os.getpid(), **fields}
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def read_new(self) -> list[dict[str, Any]]:
        """Return the events appended since the previous call (complete lines only)."""
        try:
            with self.path.open("rb") as file:
                file.seek(self._offset)
                chunk = file.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return [json.loads(line) for line in lines if line.strip()]
