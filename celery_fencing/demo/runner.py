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
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO
from urllib.parse import urlsplit

from ..exceptions import FencingConfigurationError, FencingError
from ..sources import token_source_from_url
from .events import EventLog
from .processes import DemoWorker
from .settings import DemoSettings
from .store import AccountStore, describe_url, store_from_url
from .tasks import DEPOSIT, DEPOSIT_UNFENCED, RETRY_COUNTDOWN

__all__ = ["DemoFailedError", "DemoOptions", "run_demo"]

ACCOUNT = 42
OPENING_BALANCE = 100
FIRST_DEPOSIT = 10  # by W1, which is frozen between its read and its write
SECOND_DEPOSIT = 20  # by W2, while W1 is frozen
EXPECTED = OPENING_BALANCE + FIRST_DEPOSIT + SECOND_DEPOSIT
WORKERS = ("W1", "W2")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class DemoOptions:
    """The demo's command-line options: each server flag swaps one embedded component for a real one."""

    zookeeper: str | None = None
    redis: str | None = None
    postgres: str | None = None
    broker: str | None = None
    keep: bool = False
    wait_timeout: float = 40.0


class DemoFailedError(Exception):
    """The story could not be played to its end (a worker died, a wait timed out)."""


class _Interrupted(BaseException):
    """SIGTERM or SIGHUP: handled like Ctrl-C."""


@dataclass
class Row:
    t: float
    worker: str
    action: str
    token: str
    outcome: str


@dataclass
class RunResult:
    fenced: bool
    rows: list[Row]
    balance: int
    refused: int
    retried: int

    @property
    def lost(self) -> int:
        return EXPECTED - self.balance


class Progress:
    """One status line on stderr: rewritten in place on a terminal, one line per change otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = ""

    def show(self, message: str, detail: str = "") -> None:
        """Show *message*; *detail* (a countdown) is shown on a terminal only, so logs stay short."""
        if self.tty:
            line = f"... {message} {detail}".rstrip()
            # One terminal row at most: \r cannot go back over a wrapped line.
            line = line[: max(20, shutil.get_terminal_size().columns - 1)]
            if line != self.last:
                self.stream.write("\r\033[K" + line)
                self.last = line
        elif message != self.last:
            self.stream.write("... " + message + "\n")
            self.last = message
        self.stream.flush()

    def clear(self) -> None:
        if self.tty and self.last:
            self.stream.write("\r\033[K")
            self.stream.flush()
        self.last = ""


@dataclass
class _World:
    """Everything one demo invocation created, so that cleanup can undo it."""

    directory: Path
    settings: DemoSettings
    store: AccountStore | None = None
    app: Any = None
    workers: list[DemoWorker] = field(default_factory=list)
    zookeeper_root: tuple[str, str] | None = None  # (hosts, root) to delete at the end


def _normalise_postgres(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme in ("postgresql", "postgres"):
        return parts._replace(scheme="postgresql+psycopg").geturl()
    if not parts.scheme.startswith("postgresql+"):
        raise FencingConfigurationError(f"--postgres needs a postgresql:// URL, got {describe_url(url)!r}")
    return url


def _check_options(options: DemoOptions) -> None:
    if options.redis and options.postgres:
        raise FencingConfigurationError(
            "--redis and --postgres both choose where the account lives: give one of them (the demo has one gate)"
        )
    if options.redis and urlsplit(options.redis).scheme not in ("redis", "rediss"):
        raise FencingConfigurationError(f"--redis needs a redis:// URL, got {describe_url(options.redis)!r}")
    if options.postgres:
        _normalise_postgres(options.postgres)
    if options.broker is not None and "://" not in options.broker:
        raise FencingConfigurationError(f"--broker needs a broker URL like redis://host:6379/0, got {options.broker!r}")


def _settings_for(options: DemoOptions, directory: Path) -> tuple[DemoSettings, tuple[str, str] | None]:
    namespace = "cfdemo" + uuid.uuid4().hex[:10]
    zookeeper_root = None
    if options.zookeeper:
        hosts = options.zookeeper.removeprefix("zookeeper://").rstrip("/")
        root = f"/celery-fencing-demo-{namespace}"
        source = f"zookeeper://{hosts}{root}"
        zookeeper_root = (hosts, root)
    else:
        source = f"sqlite:///{directory / 'tokens.db'}"
    if options.redis:
        store = options.redis
    elif options.postgres:
        store = _normalise_postgres(options.postgres)
    else:
        store = f"sqlite:///{directory / 'bank.db'}"
    broker = options.broker or "filesystem://"
    settings = DemoSettings(str(directory), namespace, broker, source, store)
    return settings, zookeeper_root


def _describe(settings: DemoSettings, store: AccountStore) -> list[tuple[str, str]]:
    if settings.source.startswith("zookeeper://"):
        source = f"ZooKeeper {urlsplit(settings.source).netloc} (token = zxid of a write)"
    else:
        source = "SQLite counter file (embedded, durable)"
    if settings.broker.startswith("filesystem:"):
        broker = "kombu filesystem transport (files in a temp dir)"
    else:
        broker = describe_url(settings.broker)
    return [
        ("token source", source),
        ("storage", f"account {ACCOUNT} behind {store.description}"),
        ("broker", broker),
        ("results", "Celery file:// backend"),
    ]


class DemoRunner:
    """Owns one demo invocation: its temp dir, workers, server-side state and output."""

    def __init__(self, options: DemoOptions, out: TextIO, err: TextIO) -> None:
        self.options = options
        self.out = out
        self.progress = Progress(err)
        self.world: _World | None = None
        self.directory: Path | None = None  # set as soon as it exists, so cleanup finds it
        self.log: EventLog | None = None
        self.events: list[dict[str, Any]] = []

    # Setup -----------------------------------------------------------------

    def prepare(self) -> _World:
        _check_options(self.options)
        directory = self.directory = Path(tempfile.mkdtemp(prefix="celery-fencing-demo-"))
        self.progress.show(f"working in {directory}")
        settings, zookeeper_root = _settings_for(self.options, directory)
        self.progress.show(f"names on servers start with {settings.namespace}")
        world = self.world = _World(directory, settings, zookeeper_root=zookeeper_root)
        (directory / "results").mkdir()
        for sub in ("queue", "control", "processed"):
            (directory / "broker" / sub).mkdir(parents=True)
        self.log = EventLog(settings.events_path)

        self.progress.show("preparing the account store")
        world.store = store_from_url(settings.store, settings.namespace)
        _preflight("the account store", settings.store, world.store.setup)
        if settings.source.startswith("sqlite:"):
            # Create the counter file (and its grantor id) once, here, rather
            # than in both workers as they start.
            self.progress.show("creating the token counter file")
            _preflight("the token source", settings.source, lambda: token_source_from_url(settings.source).close())
        if zookeeper_root is not None:
            self.progress.show(f"connecting to ZooKeeper at {zookeeper_root[0]}")
            _preflight("ZooKeeper", settings.source, lambda: _check_zookeeper(settings.source))

        from .tasks import build_app

        world.app = build_app(settings)
        if not settings.broker.startswith("filesystem:"):
            self.progress.show(f"connecting to the broker at {describe_url(settings.broker)}")
            _preflight("the broker", settings.broker, lambda: _check_broker(world.app))
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

    def _world(self) -> _World:
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
        rows = sorted([_row(e, start) for e in mine if e["kind"] != "hold"] + own, key=lambda r: r.t)
        refused = sum(1 for e in mine if e["kind"] == "refused")
        retried = sum(1 for e in mine if e["kind"] == "start" and e.get("attempt"))
        return RunResult(fenced, rows, balance, refused, retried)

    # Output ----------------------------------------------------------------

    def print_header(self) -> None:
        world = self._world()
        assert world.store is not None
        lines = ["celery-fencing demo: the paused-writer race, played by real celery workers", ""]
        width = 14
        for name, value in _describe(world.settings, world.store):
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
                _delete_queues(world.app, world.settings)
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
                _delete_znodes(*world.zookeeper_root)
        if self.options.keep:
            self.progress.clear()
            sys.stderr.write(f"kept the demo's files (logs, events, databases) in {world.directory}\n")
        else:
            shutil.rmtree(world.directory, ignore_errors=True)
        self.progress.clear()


def _preflight(what: str, url: str, check: Callable[[], object]) -> None:
    try:
        check()
    except FencingConfigurationError:
        raise
    except Exception as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FencingConfigurationError(f"cannot reach {what} at {describe_url(url)}: {detail}") from exc


def _check_zookeeper(url: str) -> None:
    from ..sources import token_source_from_url

    source = token_source_from_url(url)
    try:
        connect = getattr(source, "connect", None)
        if connect is not None:
            connect(timeout=5)
    finally:
        source.close()


def _check_broker(app: Any) -> None:
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=5)


def _delete_queues(app: Any, settings: DemoSettings) -> None:
    if settings.broker.startswith("filesystem:"):
        return  # the folders go with the temp dir
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for name in WORKERS:
            # Declared first: a virtual transport (Redis) deletes only the bindings it knows of.
            queue = app.amqp.queues[settings.queue(name)].bind(channel)
            queue.declare()
            queue.delete()


def _delete_znodes(hosts: str, root: str) -> None:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=5)
    client.start(timeout=5)
    try:
        client.delete(root, recursive=True)
    finally:
        client.stop()
        client.close()


# Rendering ---------------------------------------------------------------------


def _token(event: dict[str, Any]) -> str:
    value = event.get("token")
    return "-" if value is None else str(value)


def _row(event: dict[str, Any], start: float) -> Row:
    kind = event["kind"]
    t = event["t"] - start
    worker = event.get("worker", "?")
    amount = event.get("amount")
    token = _token(event)
    fenced = event.get("token") is not None
    if kind == "start":
        again = f" again (retry {event['attempt']})" if event.get("attempt") else ""
        if fenced:
            return Row(
                t, worker, f"deposit {amount} starts{again}: mints, claims", token, f"claimed, mark {event['mark']}"
            )
        return Row(t, worker, f"deposit {amount} starts{again}", token, "")
    if kind == "read":
        return Row(t, worker, "reads the balance", token, f"balance {event['balance']}")
    if kind == "wrote":
        outcome = "accepted (token >= mark)" if event.get("checked") else "written: nothing checks"
        return Row(t, worker, f"writes balance {event['balance']}", token, outcome)
    if kind == "refused":
        return Row(
            t, worker, f"writes balance {event['balance']}", token, f"REFUSED: token {token} < mark {event['mark']}"
        )
    if kind == "fenced_out":
        then = f"retry in {RETRY_COUNTDOWN:g}s with a new token" if event["action"] == "retry" else event["action"]
        return Row(t, worker, f"fenced out ({event['phase']}): {then}", token, "")
    return Row(t, worker, kind, token, "")


def render_table(rows: list[Row]) -> str:
    """The timeline as a fixed-width text table."""
    header = Row(0.0, "worker", "action", "token", "storage outcome")
    cells = [(f"{r.t:6.2f}s", r.worker, r.action, r.token, r.outcome) for r in rows]
    titles = ("  time", header.worker, header.action, header.token, header.outcome)
    widths = [max(len(titles[i]), *(len(c[i]) for c in cells)) for i in range(5)]
    lines = ["  ".join(t.ljust(w) for t, w in zip(titles, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for c in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
    return "\n".join("  " + line for line in lines)


def verdict(result: RunResult) -> str:
    if not result.fenced:
        if result.lost > 0:
            return (
                f"fencing off: 1 update lost (balance {result.balance}, expected {EXPECTED}: W1's stale write "
                f"destroyed W2's deposit of {result.lost}, and nobody was told)"
            )
        return f"fencing off: nothing lost (balance {result.balance}): the race did not happen"
    if result.lost == 0 and result.refused and result.retried:
        return (
            f"fencing on: stale write rejected, task retried, nothing lost "
            f"(balance {result.balance} = {OPENING_BALANCE} + {FIRST_DEPOSIT} + {SECOND_DEPOSIT})"
        )
    if result.lost == 0:
        return f"fencing on: nothing lost (balance {result.balance}), but no stale write was rejected"
    return f"fencing on: FAILED, balance {result.balance}, expected {EXPECTED}"


def conclude(unfenced: RunResult, fenced: RunResult, out: TextIO) -> int:
    """Print the overall result and return the exit code."""
    if fenced.lost != 0:
        out.write(f"\nFAILED: the fenced run lost an update (balance {fenced.balance}, expected {EXPECTED}).\n")
        return EXIT_FAILED
    if unfenced.lost == 0 or not fenced.refused:
        out.write(
            "\nThe demo proved nothing: the unfenced run should have lost an update and the fenced run should "
            "have refused a stale write.\nRun it again; if this repeats, please report it.\n"
        )
        return EXIT_FAILED
    out.write(
        "\nThe same race, the same workers: without fencing an update vanished silently; with fencing the storage\n"
        "refused the stale write and the task redid its work on fresh data.\n"
        "Fence your own tasks next: see docs/quickstart.md.\n"
    )
    return EXIT_OK


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
