"""Per-process fencing state of one Celery app: its token source and task gates.

A token source holds connections (a ZooKeeper session, SQLite handles) that
must never cross ``fork()``. The runtime therefore builds the source lazily in
the process that uses it and rebuilds it when it notices a new pid: a prefork
child never uses its parent's client. ``worker_process_init`` opens it early,
so connection problems show in the log at start rather than at the first task.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..context import Execution
from ..exceptions import FencingConfigurationError
from ..protocols import Gate, TokenSource
from ..sources import token_source_from_url
from . import signals
from .settings import FencingSettings, read_settings

__all__ = ["FencingRuntime", "runtime_for", "task_option"]

logger = logging.getLogger("celery_fencing")


class FencingRuntime:
    """The token source and gates one app uses in the current process. Thread-safe."""

    def __init__(self, app: Any) -> None:
        self._app = weakref.ref(app)
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._source: TokenSource | None = None
        self._owns_source = False
        self._gates: dict[int, Sequence[Gate]] = {}
        self._settings: FencingSettings | None = None
        self._executions: dict[int, Execution] = {}

    @property
    def app(self) -> Any:
        app = self._app()
        if app is None:  # pragma: no cover - the app outlives its tasks
            raise FencingConfigurationError("the Celery app of this fencing runtime is gone")
        return app

    def _check_pid(self) -> None:
        # Caller holds the lock. After fork the inherited objects belong to the
        # parent: forget them without closing (closing would touch the parent's
        # sockets), and build new ones on first use.
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._source = None
            self._owns_source = False
            self._gates.clear()
            self._executions.clear()

    def settings(self) -> FencingSettings:
        """The app's validated settings, read once per process."""
        with self._lock:
            self._check_pid()
            if self._settings is None:
                self._settings = read_settings(self.app.conf)
            return self._settings

    def reload_settings(self) -> FencingSettings:
        """Read the settings again (after a worker flag changed ``app.conf``)."""
        with self._lock:
            self._settings = None
            return self.settings()

    def source(self) -> TokenSource:
        """The token source of this process, built on first use.

        :raises FencingConfigurationError: no source configured, or a volatile
            one without ``fencing_allow_volatile_source``.
        """
        with self._lock:
            self._check_pid()
            if self._source is None:
                self._source, self._owns_source = self._build_source(self.settings())
            return self._source

    def _build_source(self, settings: FencingSettings) -> tuple[TokenSource, bool]:
        configured = settings.source
        if configured is None:
            raise FencingConfigurationError(
                "no token source: set fencing_source (e.g. 'zookeeper://127.0.0.1:2181/fencing') "
                "or start the worker with --fencing-source URL"
            )
        owns = True
        if isinstance(configured, str):
            source = token_source_from_url(configured)
        elif hasattr(configured, "mint"):
            source, owns = configured, False
        else:
            source = configured()
        if getattr(source, "volatile", False) and not settings.allow_volatile_source:
            if owns:
                source.close()
            raise FencingConfigurationError(
                f"{type(source).__name__} is volatile (it forgets its counter on restart) and cannot protect data; "
                "use zookeeper:// or sqlite://, or set fencing_allow_volatile_source=True in tests"
            )
        listen = getattr(source, "add_state_listener", None)
        if listen is not None:
            listen(self._on_source_state)
        logger.info("fencing token source ready in process %d: %r", os.getpid(), source)
        return source, owns

    # Executions in progress, told when the grantor session behind their tokens is lost.

    def track(self, execution: Execution) -> None:
        with self._lock:
            self._executions[id(execution)] = execution

    def untrack(self, execution: Execution) -> None:
        with self._lock:
            self._executions.pop(id(execution), None)

    def _on_source_state(self, state: str) -> None:
        # Runs on the driver's connection thread: set flags only, never block there.
        if state not in ("SUSPENDED", "LOST"):
            return
        with self._lock:
            executions = list(self._executions.values())
        for execution in executions:
            execution.session_lost.set()
        task_ids = [execution.task_id for execution in executions]
        if executions:
            logger.warning(
                "ZooKeeper session %s while %d fenced task(s) held tokens: %s; their writes will be refused "
                "if a newer execution claims the resource",
                state,
                len(executions),
                ", ".join(map(str, task_ids)),
            )
        # Signal receivers may block: send from a thread of our own, not the driver's.
        threading.Thread(
            target=signals.session_state_changed.send,
            kwargs={"sender": self._source, "state": state, "task_ids": task_ids},
            name="fencing-session-signal",
            daemon=True,
        ).start()

    def gates(self, task: Any) -> Sequence[Gate]:
        """The gates a task claims on, built once per process from ``task.fencing_gates``."""
        spec: Sequence[Gate] | Callable[[], Sequence[Gate]] = task_option(task, "fencing_gates") or ()
        if not callable(spec):
            return spec
        with self._lock:
            self._check_pid()
            key = id(spec)
            if key not in self._gates:
                gates = spec()
                if not isinstance(gates, Sequence) or isinstance(gates, str | bytes):
                    gates = (gates,)  # type: ignore[assignment,unused-ignore]
                self._gates[key] = tuple(gates)
            return self._gates[key]

    def close(self) -> None:
        """Close the source this runtime built in this process. Idempotent."""
        with self._lock:
            self._check_pid()
            source, owns = self._source, self._owns_source
            self._source, self._owns_source = None, False
            self._gates.clear()
        if source is not None and owns:
            try:
                source.close()
            except Exception:  # closing must not mask a shutdown in progress
                logger.exception("closing the fencing token source failed")


def task_option(task: Any, name: str) -> Any:
    """Read a task option without binding it: a plain function given as
    ``@app.task(fencing_gates=make_gates)`` becomes a class attribute, and plain
    attribute access would turn it into a method of the task."""
    value = inspect.getattr_static(task, name, None)
    if isinstance(value, staticmethod | classmethod):
        return value.__get__(None, type(task))
    return value


_runtimes: weakref.WeakKeyDictionary[Any, FencingRuntime] = weakref.WeakKeyDictionary()
_runtimes_lock = threading.Lock()


def runtime_for(app: Any) -> FencingRuntime:
    """The fencing runtime of *app* (one per app, shared by its tasks)."""
    with _runtimes_lock:
        runtime = _runtimes.get(app)
        if runtime is None:
            runtime = _runtimes[app] = FencingRuntime(app)
        return runtime
