"""What fenced executions did, recorded from the library's signals into a JSON-lines file any process appends to.

The signals of :mod:`celery_fencing.celery.signals` fire in the process that
runs the task: a real worker, not the test. :func:`record_events` connects
receivers that append one line per signal to a file (one ``write`` of an
``O_APPEND`` file per line, so lines from several processes never interleave);
:class:`FencingEvents` reads the file back in the test. Worker processes
started by :class:`~celery_fencing.testing.FencedWorker` record into the file
named by :data:`ENV_VAR`; the ``fencing_events`` fixture also records the
test's own process (embedded workers).

Recorded kinds: ``minted`` (``token_minted``), ``rejected``
(``fencing_rejected``), ``duplicate`` (``duplicate_prevented``), ``dropped``
(``result_dropped``), and ``finished`` (Celery's ``task_postrun``, with the
execution's token and final state), so that an assertion can tell which
executions ran their body to the end unrefused.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["ENV_VAR", "FencingEvent", "FencingEvents", "record_events"]

#: The environment variable naming the events file in worker processes.
ENV_VAR = "CELERY_FENCING_EVENTS"


@dataclass(frozen=True)
class FencingEvent:
    """One signal, as one process saw it. Fields a signal does not carry are ``None``."""

    kind: str
    task_id: str | None
    pid: int
    task: str | None = None
    token: int | None = None
    resource: str | None = None
    phase: str | None = None
    action: str | None = None
    high_water: int | None = None
    state: str | None = None
    error: str | None = None
    reason: str | None = None


def _token_value(token: Any) -> int | None:
    value = getattr(token, "value", token)
    return value if isinstance(value, int) else None


def _execution_token(sender: Any) -> int | None:
    """The token of the execution *sender* (a task) is running, if it is a fenced one."""
    request = getattr(sender, "request", None)
    getter = getattr(request, "get", None)
    return _token_value(getter("fencing_token")) if callable(getter) else None


def _task_name(sender: Any) -> str | None:
    name = getattr(sender, "name", None)
    return name if isinstance(name, str) else None


def record_events(path: Path | str) -> Callable[[], None]:
    """Append every fencing signal (and every task's end) fired in this process to *path*; return a disconnect.

    Receivers are connected with ``weak=False`` and never raise into the
    signal (a recording failure must not change what a task does).
    """
    from celery import signals as celery_signals

    from ..celery import signals

    target = str(path)

    def write(kind: str, task_id: Any, sender: Any, **fields: Any) -> None:
        event = FencingEvent(kind=kind, task_id=task_id, pid=os.getpid(), task=_task_name(sender), **fields)
        line = (json.dumps(asdict(event)) + "\n").encode()
        descriptor = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)

    def minted(sender: Any = None, task_id: Any = None, token: Any = None, **_: Any) -> None:
        write("minted", task_id, sender, token=_token_value(token), resource=getattr(token, "resource", None))

    def refused(kind: str, task_id: Any, sender: Any, kw: dict[str, Any], **fields: Any) -> None:
        """A refusal (``rejected``, ``duplicate``): where and how it was refused, and the error's class."""
        error = kw.get("error")
        write(
            kind,
            task_id,
            sender,
            resource=kw.get("resource"),
            phase=kw.get("phase"),
            action=kw.get("action"),
            error=type(error).__name__ if error is not None else None,
            **fields,
        )

    def rejected(sender: Any = None, task_id: Any = None, **kw: Any) -> None:
        token = _token_value(kw.get("token")) or _execution_token(sender)
        refused("rejected", task_id, sender, kw, token=token, high_water=_token_value(kw.get("high_water")))

    def duplicate(sender: Any = None, task_id: Any = None, **kw: Any) -> None:
        refused("duplicate", task_id, sender, kw, token=_execution_token(sender))

    def dropped(sender: Any = None, task_id: Any = None, **kw: Any) -> None:
        write(
            "dropped",
            task_id,
            None,
            token=_token_value(kw.get("token")),
            high_water=_token_value(kw.get("high_water")),
            state=kw.get("state"),
            reason=kw.get("reason"),
        )

    def finished(sender: Any = None, task_id: Any = None, state: Any = None, **_: Any) -> None:
        write("finished", task_id, sender, token=_execution_token(sender), state=state)

    connections = [
        (signals.token_minted, minted),
        (signals.fencing_rejected, rejected),
        (signals.duplicate_prevented, duplicate),
        (signals.result_dropped, dropped),
        (celery_signals.task_postrun, finished),
    ]
    for signal, receiver in connections:
        signal.connect(_never_raising(receiver), weak=False, dispatch_uid=f"celery-fencing-testing:{target}:{signal}")

    def disconnect() -> None:
        for signal, _receiver in connections:
            signal.disconnect(dispatch_uid=f"celery-fencing-testing:{target}:{signal}")

    return disconnect


def _never_raising(receiver: Callable[..., None]) -> Callable[..., None]:
    def receive(*args: Any, **kwargs: Any) -> None:
        try:
            receiver(*args, **kwargs)
        except Exception:  # a recording failure must not reach the task
            return

    return receive


class FencingEvents:
    """The events recorded in one file, read back in the test.

    :param path: the JSON-lines file (created empty if missing).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()

    @property
    def env(self) -> dict[str, str]:
        """The environment a worker process needs to record into this file."""
        return {ENV_VAR: str(self.path)}

    def all(self) -> list[FencingEvent]:
        """Every event recorded so far, in file order (each process's own events in the order they fired)."""
        lines = self.path.read_text().splitlines()
        return [FencingEvent(**json.loads(line)) for line in lines if line.strip()]

    def of(self, kind: str | None = None, *, task_id: str | None = None, pid: int | None = None) -> list[FencingEvent]:
        """The events of *kind* (any kind if ``None``), of one task id and/or one process."""
        return [
            event
            for event in self.all()
            if (kind is None or event.kind == kind)
            and (task_id is None or event.task_id == task_id)
            and (pid is None or event.pid == pid)
        ]

    def ended(self, task_id: str, *, pid: int | None = None) -> list[FencingEvent]:
        """The executions of *task_id* that ended for good: finished in any state but ``RETRY``.

        Each delivery of a message ends once, after its retries (a retry is a
        new execution of the same delivery), so this counts deliveries done.
        """
        return [event for event in self.of("finished", task_id=task_id, pid=pid) if event.state != "RETRY"]

    def wait_ended(self, task_id: str, count: int = 1, *, pid: int | None = None, timeout: float = 60.0) -> None:
        """Wait until *count* deliveries of *task_id* ended for good (see :meth:`ended`).

        :raises AssertionError: after *timeout* seconds, listing what was recorded for the task.
        """
        self._wait(
            lambda: len(self.ended(task_id, pid=pid)) >= count, f"{count} end(s) of task {task_id}", task_id, timeout
        )

    def wait_for(
        self,
        kind: str,
        *,
        task_id: str | None = None,
        pid: int | None = None,
        count: int = 1,
        timeout: float = 60.0,
    ) -> list[FencingEvent]:
        """Wait until at least *count* events match (as :meth:`of`); return them.

        :raises AssertionError: after *timeout* seconds, listing what was recorded for the task.
        """
        what = f"{count} {kind!r} event(s) (task {task_id}, pid {pid})"
        self._wait(lambda: len(self.of(kind, task_id=task_id, pid=pid)) >= count, what, task_id, timeout)
        return self.of(kind, task_id=task_id, pid=pid)

    def _wait(self, done: Callable[[], bool], what: str, task_id: str | None, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() >= deadline:
                seen = self.of(task_id=task_id) if task_id else self.all()
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; recorded: {seen}")
            time.sleep(0.02)  # polling the file: the loop re-checks
