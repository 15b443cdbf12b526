"""Plays the paused-writer story twice (fencing off, fencing on) and prints what happened.

The runner never sleeps to let something happen: it follows the workers'
event log and polls process states, with a deadline on every wait, and a
progress line on stderr says what it is waiting for.

Exit codes: 0 when the fenced run lost nothing *and* the unfenced run lost an
update (otherwise the demo proved nothing); 1 when either failed to show that;
2 for bad options or unreachable servers; 130 when interrupted.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from ..exceptions import FencingConfigurationError, FencingError
from ..sources import token_source_from_url
from .events import EventLog
from .options import DemoOptions, check_options, settings_for
from .processes import DemoWorker
from .progress import Progress
from .store import describe_url, store_from_url
from .story import ACCOUNT, EXPECTED, FIRST_DEPOSIT, OPENING_BALANCE, SECOND_DEPOSIT, WORKERS, Row, RunResult
from .tasks import DEPOSIT, DEPOSIT_UNFENCED
from .timeline import EXIT_FAILED, conclude, render_table, row_of, verdict
from .timeline import EXIT_OK as EXIT_OK  # with the other exit codes, as before the split
from .world import World, check_broker, check_zookeeper, delete_queues, delete_znodes, describe, preflight

__all__ = ["DemoFailedError", "DemoOptions", "run_demo"]

# The exit codes of a demo that did not reach its conclusion (timeline has EXIT_OK and EXIT_FAILED).
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class DemoFailedError(Exception):
    """The story could not be played to its end (a worker died, a wait timed out)."""


class _Interrupted(BaseException):
    """SIGTERM or SIGHUP: handled like Ctrl-C."""


class DemoRunner:
    """Owns one demo invocation: its temp dir, workers, server-side state and output."""

    def __init__(self, options: DemoOptions, out: TextIO, err: TextIO) -> None:
        self.options = options
        self.out = out
        self.progress = Progress(err)
        self.world: World | None = None
        self.directory: Path | None = None  # set as soon as it exists, so cleanup finds it
        self.log: EventLog | None = None
        self.events: list[dict[str, Any]] = []

    # Setup -----------------------------------------------------------------

    def prepare(self) -> World:
        check_options(self.options)
        directory = self.directory = Path(tempfile.mkdtemp(prefix="celery-fencing-demo-"))
        self.progress.show(f"working in {directory}")
        settings, zookeeper_root = settings_for(self.options, directory)
        self.progress.show(f"names on servers start with {settings.namespace}")
        world = self.world = World(directory, settings, zookeeper_root=zookeeper_root)
        (directory / "results").mkdir()
        for sub in ("queue", "control", "processed"):
            (directory / "broker" / sub).mkdir(parents=True)
        self.log = EventLog(settings.events_path)

        self.progress.show("preparing the account store")
        world.store = store_from_url(settings.store, settings.namespace)
        preflight("the account store", settings.store, world.store.setup)
        if settings.source.startswith("sqlite:"):
            # Create the counter file (and its grantor id) once, here, rather
            # than in both workers as they start.
            self.progress.show("creating the token counter file")
            preflight("the token source", settings.source, lambda: token_source_from_url(settings.source).close())
        if zookeeper_root is not None:
            self.progress.show(f"connecting to ZooKeeper at {zookeeper_root[0]}")
            preflight("ZooKeeper", settings.source, lambda: check_zookeeper(settings.source))

        from .tasks import build_app

        world.app = build_app(settings)
        if not settings.broker.startswith("filesystem:"):
            self.progress.show(f"connecting to the broker at {describe_url(settings.broker)}")
            preflight("the broker", settings.broker, lambda: check_broker(world.app))
        return world

    def start_workers(self) -> None:
        world = self._world()
        env = world.settings.to_env()
        for name in WORKERS:
            worker = DemoWorker(name, world.settings.queue(name), env, world.directory)
            world.workers.append(worker)
            worker.start()
            self.progress.show(f"started {name} (pid {worker.pid}): celery worker --pool solo")
        names = " and ".join(WORKERS)
        self.wait_for(
            lambda: {e["worker"] for e in self.events if e["kind"] == "ready"} >= set(WORKERS),
            f"{names} (celery worker processes) to start",
            timeout=max(self.options.wait_timeout, 60.0),
        )

    # Waiting ---------------------------------------------------------------

    def _world(self) -> World:
        assert self.world is not None
        return self.world

    def pump(self) -> None:
        assert self.log is not None
        self.events.extend(self.log.read_new())
        for worker in self._world().workers:
            code = worker.exit_code()
            if code is not None:
                raise DemoFailedError(
                    f"worker {worker.name} exited with code {code}; its log ends with:\n{worker.log_tail()}"
                )

    def wait_for(self, predicate: Callable[[], object], what: str, timeout: float | None = None) -> None:
        limit = self.options.wait_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            self.pump()
            if predicate():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                tails = "\n".join(f"--- {w.name} log ---\n{w.log_tail()}" for w in self._world().workers)
                raise DemoFailedError(f"timed out after {limit:.0f}s waiting for {what}\n{tails}")
            self.progress.show(f"waiting for {what}", f"({remaining:.0f}s left)")
            time.sleep(0.02)

    def _event(self, kind: str, task_id: str) -> Callable[[], bool]:
        return lambda: any(e["kind"] == kind and e.get("task_id") == task_id for e in self.events)

    # The story -------------------------------------------------------------

    def play(self, fenced: bool) -> RunResult:
        world = self._world()
        assert world.store is not None
        w1 = world.workers[0]
        task = DEPOSIT if fenced else DEPOSIT_UNFENCED
        label = "fencing on" if fenced else "fencing off"
        world.store.reset(ACCOUNT, OPENING_BALANCE)
        own: list[Row] = []
        first_event = len(self.events)
        start = time.monotonic()

        first = world.app.send_task(
            task, args=(ACCOUNT, FIRST_DEPOSIT), kwargs={"hold": True}, queue=world.settings.queue("W1")
        )
        self.wait_for(self._event("hold", first.id), f"W1 to read the balance ({label})")
        own.append(Row(time.monotonic() - start, "demo", "freezes W1 with SIGSTOP (a GC pause, a VM freeze)", "", ""))
        w1.freeze()
        world.settings.go_path(first.id).touch()  # W1 may go on once it is thawed

        second = world.app.send_task(task, args=(ACCOUNT, SECOND_DEPOSIT), queue=world.settings.queue("W2"))
        self.wait_for(self._event("wrote", second.id), f"W2 to deposit {SECOND_DEPOSIT} while W1 is frozen ({label})")
        own.append(Row(time.monotonic() - start, "demo", "resumes W1 with SIGCONT", "", ""))
        w1.thaw()
        self.wait_for(self._event("wrote", first.id), f"W1 to finish its deposit of {FIRST_DEPOSIT} ({label})")
        self.wait_for(
            lambda: first.ready() and second.ready(), f"Celery to store both task results ({label})", timeout=15
        )
        balance = world.store.read(ACCOUNT)
        mine = [e for e in self.events[first_event:] if e.get("task_id") in (first.id, second.id)]
        rows = sorted([row_of(e, start) for e in mine if e["kind"] != "hold"] + own, key=lambda r: r.t)
        refused = sum(1 for e in mine if e["kind"] == "refused")
        retried = sum(1 for e in mine if e["kind"] == "start" and e.get("attempt"))
        return RunResult(fenced, rows, balance, refused, retried)

    # Output ----------------------------------------------------------------

    def print_header(self) -> None:
        world = self._world()
        assert world.store is not None
        lines = ["celery-fencing demo: the paused-writer race, played by real celery workers", ""]
        width = 14
        for name, value in describe(world.settings, world.store):
            lines.append(f"  {name:<{width}}{value}")
        pids = ", ".join(f"{w.name} (pid {w.pid})" for w in world.workers)
        lines.append(f"  {'workers':<{width}}{pids}: celery worker --pool solo")
        lines.append("")
        lines.append(
            f"Story: account {ACCOUNT} holds {OPENING_BALANCE}. W1 deposits {FIRST_DEPOSIT} and is frozen between "
            f"its read and its write;"
        )
        lines.append(f"meanwhile W2 deposits {SECOND_DEPOSIT}. A correct ending is {EXPECTED}.")
        self.out.write("\n".join(lines) + "\n")
        self.out.flush()

    def print_run(self, result: RunResult) -> None:
        title = "fencing on" if result.fenced else "fencing off"
        self.out.write(f"\nRun {2 if result.fenced else 1}: {title}\n\n")
        self.out.write(render_table(result.rows) + "\n\n")
        self.out.write(verdict(result) + "\n")
        self.out.flush()

    def run(self) -> int:
        self.prepare()
        self.start_workers()
        self.progress.clear()
        self.print_header()
        unfenced = self.play(fenced=False)
        self.progress.clear()
        self.print_run(unfenced)
        fenced = self.play(fenced=True)
        self.progress.clear()
        self.print_run(fenced)
        return conclude(unfenced, fenced, self.out)

    # Cleanup ---------------------------------------------------------------

    def cleanup(self) -> None:
        """Stop every worker, undo server-side state, delete the temp dir. Never raises."""
        world = self.world
        if world is None:
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
            return
        self.progress.show("cleaning up: stopping workers")
        for worker in world.workers:
            worker.send_stop()
        for worker in world.workers:
            # Short grace: an idle worker on RabbitMQ notices SIGTERM only at its next broker
            # event, which may be minutes away; these workers hold nothing worth waiting for.
            worker.wait_stopped(grace=3)
        if world.app is not None:
            with contextlib.suppress(Exception):
                delete_queues(world.app, world.settings)
            with contextlib.suppress(Exception):
                world.app.close()
        if world.store is not None:
            self.progress.show("cleaning up: the account store")
            with contextlib.suppress(Exception):
                world.store.teardown()
            with contextlib.suppress(Exception):
                world.store.close()
        if world.zookeeper_root is not None:
            self.progress.show("cleaning up: ZooKeeper znodes")
            with contextlib.suppress(Exception):
                delete_znodes(*world.zookeeper_root)
        if self.options.keep:
            self.progress.clear()
            sys.stderr.write(f"kept the demo's files (logs, events, databases) in {world.directory}\n")
        else:
            shutil.rmtree(world.directory, ignore_errors=True)
        self.progress.clear()


@contextlib.contextmanager
def _interrupts_as_exceptions() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def _uninterruptible() -> Iterator[None]:
    # Cleanup must finish: a second Ctrl-C would leave workers and files behind.
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in sigs}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_demo(options: DemoOptions, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Play the demo; return the process exit code. Cleans up everything it started, on every path."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    runner = DemoRunner(options, out, err)
    code = EXIT_FAILED
    try:
        with _interrupts_as_exceptions():
            code = runner.run()
    except (KeyboardInterrupt, _Interrupted):
        runner.progress.clear()
        err.write("interrupted: stopping the workers and removing the demo's files\n")
        code = EXIT_INTERRUPTED
    except FencingConfigurationError as exc:
        runner.progress.clear()
        err.write(f"celery-fencing demo: {exc}\n")
        code = EXIT_USAGE
    except (DemoFailedError, FencingError, TimeoutError) as exc:
        runner.progress.clear()
        err.write(f"celery-fencing demo failed: {exc}\n")
        code = EXIT_FAILED
    finally:
        with _uninterruptible():
            runner.cleanup()
    return code
