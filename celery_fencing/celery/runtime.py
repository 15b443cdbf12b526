"""Per-process fencing state of one Celery app: its token source and task gates.

A token source holds connections (a ZooKeeper session, SQLite handles) that
must never cross ``fork()``. The runtime therefore builds the source lazily in
the process that uses it and rebuilds it when it notices a new pid: a prefork
child never uses its parent's client. ``worker_process_init`` opens it early,
so connection problems show in the log at start rather than at the first task.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from ..context import Execution
from ..exceptions import FencingConfigurationError, FencingError
from ..protocols import BlockSource, Gate, TokenSource
from ..sources import token_source_from_url
from . import signals
from .settings import FencingSettings, read_settings

__all__ = ["FencingRuntime", "HeldLease", "runtime_for", "task_option"]

logger = logging.getLogger("celery_fencing")


@dataclass
class HeldLease:
    """An exclusive lease an execution holds: the source's context manager, the lease, when it was taken."""

    manager: AbstractContextManager[Any]
    lease: Any
    taken_at: float
    #: Until when (time.monotonic) the lease may be kept for the next task of its resource.
    keep_until: float
    #: When it was last put back between tasks (time.monotonic); read only while it is kept.
    idle_since: float = 0.0
    #: Whether someone else queues for the lock (see ``ZooKeeperLease.on_contended``).
    contended: bool = False
    #: Whether the runtime asked the lease to report contention (once per lease).
    watching: bool = False
    #: The gates (by id) on which the lease's token was claimed, by this task or an earlier one.
    claimed: set[int] = field(default_factory=set)
    #: The execution that holds the lease now (an :class:`~celery_fencing.context.Execution`).
    execution: Any = None

    def on_lease_lost(self, _lease: Any) -> None:
        """The lease's ``on_lost`` callback, registered once per lease (not per task that reuses it).

        A lost lease (lock node gone, session lost) means the same to the
        execution holding it as a lost session.
        """
        execution = self.execution
        if execution is not None:
            execution.session_lost.set()

    def unclaimed(self, gates: Sequence[Gate]) -> Sequence[Gate]:
        """The *gates* the lease's token still has to be claimed on.

        A kept lease hands its token to the next task: its claims raised the
        marks to that token already, so every older writer is refused there.
        Claiming it again would only learn sooner what the next write learns
        anyway (a newer holder, after this lease was lost unnoticed): the write
        is refused, and the task retried.
        """
        return [gate for gate in gates if id(gate) not in self.claimed]

    def claimed_on(self, gates: Sequence[Gate]) -> None:
        """Note that the lease's token was claimed on *gates*."""
        self.claimed.update(id(gate) for gate in gates)

    def release(self) -> None:
        """Leave the lease's context: its lock node is deleted. Never raises."""
        try:
            self.manager.__exit__(None, None, None)
        except Exception:  # a release must not fail a task or a shutdown
            logger.exception("releasing the fencing lease on %r failed", getattr(self.lease, "resource", "?"))


class FencingRuntime:
    """The token source and gates one app uses in the current process. Thread-safe.

    It also keeps the exclusive leases that ``fencing_lease_reuse`` lets a
    finished task leave for the next task of the same resource (see
    :meth:`keep_lease`), and releases them when they expire.
    """

    def __init__(self, app: Any) -> None:
        self._app = weakref.ref(app)
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._source: TokenSource | None = None
        self._owns_source = False
        # (source, whether it hands out tokens by the block), asked once per source.
        self._blocks: tuple[object, bool] | None = None
        self._gates: dict[int, Sequence[Gate]] = {}
        self._settings: FencingSettings | None = None
        self._executions: dict[int, Execution] = {}
        # Leases kept between tasks, by resource; one per resource, never shared by two executions.
        self._kept: dict[str, HeldLease] = {}
        # Executions of this process waiting for a resource's lease (threads pools): never keep
        # a lease one of them waits for, it would only make it wait longer.
        self._lease_waiters: dict[str, int] = {}
        self._reaper: threading.Thread | None = None
        self._reaper_wake = threading.Condition(self._lock)
        # When the reaper wakes by itself next (time.monotonic; None: not before it is woken).
        self._reaper_wakes_at: float | None = None

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
            # The parent's leases belong to its ZooKeeper session, and its reaper did not survive.
            self._kept = {}
            self._lease_waiters = {}
            self._reaper = None
            self._reaper_wake = threading.Condition(self._lock)
            self._reaper_wakes_at = None

    def settings(self) -> FencingSettings:
        """The app's validated settings, read once per process."""
        settings = self._settings
        if settings is not None and self._pid == os.getpid():
            return settings  # every execution asks: no lock once they are read in this process
        with self._lock:
            self._check_pid()
            if self._settings is None:
                self._settings = read_settings(self.app.conf)
            return self._settings

    def draws_from_blocks(self, source: object) -> bool:
        """Whether *source* (this runtime's) hands out tokens by the block (a :class:`BlockSource` with blocks on)."""
        known = self._blocks
        if known is None or known[0] is not source:
            known = self._blocks = (source, isinstance(source, BlockSource) and source.block_size > 1)
        return known[1]

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
        source = self._source
        if source is not None and self._pid == os.getpid():
            return source
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

    # Leases kept between tasks (fencing_lease_reuse) --------------------------------------
    #
    # Why reusing a lease's token for the next task of the same resource is safe:
    #
    # * Within the process, a kept lease is handed to one execution at a time
    #   (take_lease pops it): two executions never hold the same token at once.
    # * Across processes, the ZooKeeper lock is held the whole time, so no other
    #   process mints for the resource under a lease; and if this lease was lost
    #   without this process noticing yet (paused past its session), the next
    #   holder's token is larger and its claims raise the marks: our claim with the
    #   old token is refused at the start of the next task, before its body runs.
    # * Claims accept token >= mark, so the next task's claim with the same token
    #   passes only if nobody newer claimed meanwhile: exactly the check a fresh
    #   token gets. Results are fenced per task id, each claimed at its task's start.
    # * A lease is not kept after any fencing error: a token a gate refused once
    #   would be refused again, and a task must retry with a new lease and token.
    # * What changes: a token no longer names one execution but a run of
    #   consecutive executions in one process. Work an execution leaves running
    #   after it returns (a thread writing later) is not fenced against the next
    #   execution in the same process, as it would be with a fresh token.

    def enter_lease(self, source: Any, resource: str, reuse: float, **options: Any) -> HeldLease:
        """Take *resource*'s lease from *source* (a :class:`LeasingSource`), kept up to *reuse* seconds.

        The execution counts as waiting for the lease meanwhile, so a lease
        this process keeps for the resource goes to it (see :meth:`keep_lease`).
        """
        manager: AbstractContextManager[Any] = source.lease(resource, **options)
        self.wait_for_lease(resource, +1)
        try:
            lease = manager.__enter__()
        finally:
            self.wait_for_lease(resource, -1)
        now = time.monotonic()
        held = HeldLease(manager, lease, taken_at=now, keep_until=now + reuse)
        lease.on_lost(held.on_lease_lost)
        return held

    def take_lease(self, resource: str) -> HeldLease | None:
        """Hand the lease kept for *resource* to the calling execution, if one is kept and still good."""
        with self._lock:
            self._check_pid()
            held = self._kept.pop(resource, None)
        if held is None:
            return None
        if held.lease.lost or time.monotonic() >= held.keep_until:
            held.release()
            return None
        try:
            held.lease.check()
        except FencingError:
            held.release()
            return None
        return held

    def wait_for_lease(self, resource: str, delta: int) -> None:
        """Count executions of this process that are waiting for *resource*'s lease (+1 before, -1 after)."""
        with self._lock:
            count = self._lease_waiters.get(resource, 0) + delta
            if count > 0:
                self._lease_waiters[resource] = count
            else:
                self._lease_waiters.pop(resource, None)

    def keep_lease(self, resource: str, held: HeldLease) -> bool:
        """Keep *held* for the next task of *resource*; False (the caller releases) when it must go.

        It goes when it expired (``keep_until``), was lost, another execution
        of this process waits for it, or a lease of the resource is kept already.
        """
        if held.lease.lost or time.monotonic() >= held.keep_until:
            return False
        with self._lock:
            self._check_pid()
            if resource in self._kept or self._lease_waiters.get(resource):
                return False
            self._kept[resource] = held
            held.idle_since = time.monotonic()
            watch, held.watching = not held.watching, True
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="fencing-lease-reaper", daemon=True)
                self._reaper.start()
            # A lease kept task after task would wake the reaper every time: only when it is due sooner.
            wakes_at = self._reaper_wakes_at
            if wakes_at is None or _release_at(held) < wakes_at:
                self._reaper_wake.notify()
        on_contended = getattr(held.lease, "on_contended", None) if watch else None
        if on_contended is not None:
            on_contended(lambda _lease: self._contended(held))
        return True

    def _contended(self, held: HeldLease) -> None:
        # Another process or worker queued for the lock: the reaper hands a kept
        # lease over once it has been idle for CONTENDED_IDLE, not at keep_until.
        with self._lock:
            held.contended = True
            self._reaper_wake.notify()

    def release_kept_leases(self) -> None:
        """Release every kept lease now (worker shutdown, closing the runtime)."""
        with self._lock:
            self._check_pid()
            kept, self._kept = list(self._kept.values()), {}
            self._reaper_wake.notify()
        for held in kept:
            held.release()

    def _reap(self) -> None:
        # One thread per process: releases kept leases when they expire, so an idle
        # worker does not hold a resource that another process waits for.
        pid = os.getpid()
        while True:
            with self._lock:
                if self._pid != pid:
                    return
                now = time.monotonic()
                expired = [resource for resource, held in self._kept.items() if _release_at(held) <= now]
                due = [self._kept.pop(resource) for resource in expired]
                if not due:
                    wake_at = min((_release_at(held) for held in self._kept.values()), default=None)
                    self._reaper_wakes_at = wake_at
                    self._reaper_wake.wait(None if wake_at is None else max(0.001, wake_at - now))
                    self._reaper_wakes_at = None
                    continue
            for held in due:
                held.release()

    def gates(self, task: Any) -> Sequence[Gate]:
        """The gates a task claims on, built once per process from ``task.fencing_gates``."""
        spec: Sequence[Gate] | Callable[[], Sequence[Gate]] = task_option(task, "fencing_gates") or ()
        if not callable(spec):
            return spec
        built = self._gates.get(id(spec))
        if built is not None and self._pid == os.getpid():
            return built
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
        """Release kept leases and close the source this runtime built in this process. Idempotent."""
        self.release_kept_leases()
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


#: Seconds a kept lease that someone else queues for may stay idle before it is
#: handed over. Long enough to span the gap between two tasks of a busy pool
#: process (so a hot resource is not passed back and forth on every task), short
#: enough that a waiter is not held up by an idle process for the reuse window.
CONTENDED_IDLE = 0.05


def _release_at(held: HeldLease) -> float:
    """When the reaper releases a kept lease: at the end of its reuse window, or sooner when contended."""
    if held.contended:
        return min(held.keep_until, held.idle_since + CONTENDED_IDLE)
    return held.keep_until


def task_option(task: Any, name: str) -> Any:
    """Read a task option without binding it: a plain function given as
    ``@app.task(fencing_gates=make_gates)`` becomes a class attribute, and plain
    attribute access would turn it into a method of the task.

    What ``inspect.getattr_static`` does for a task (the instance's own
    attribute, else the first class of the MRO that has it), at a tenth of its
    cost: every execution reads a few options.
    """
    own = getattr(task, "__dict__", None)
    if own is not None and name in own:
        value = own[name]
    else:
        for klass in type(task).__mro__:
            if name in klass.__dict__:
                value = klass.__dict__[name]
                break
        else:
            return None
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
