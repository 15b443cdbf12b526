"""The demo's Celery app: one read-modify-write task, fenced and unfenced.

``build_app(settings)`` is used both by the workers (through
:mod:`celery_fencing.demo.app`) and by the runner, which sends the tasks.

The tasks report each step to the event log. A task sent with ``hold=True``
stops after its read until the runner creates its "go" file: the runner
freezes the worker (SIGSTOP) in that window, so the pause lands between the
read and the write on every run. The freeze is real; the hold only makes
its timing deterministic.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery, Task
from celery.signals import worker_ready

from ..exceptions import StaleTokenError
from ..token import FencingToken
from .events import EventLog
from .settings import DemoSettings
from .store import AccountStore, store_from_url

__all__ = ["DEPOSIT", "DEPOSIT_UNFENCED", "RETRY_COUNTDOWN", "build_app"]

DEPOSIT = "celery_fencing.demo.deposit"
DEPOSIT_UNFENCED = "celery_fencing.demo.deposit_unfenced"
#: Seconds before a fenced-out deposit is tried again (no jitter: the timeline stays readable).
RETRY_COUNTDOWN = 0.2
#: How long a held task waits for its go file before giving up.
HOLD_LIMIT = 60.0


def build_app(settings: DemoSettings) -> Any:
    """Return the demo's Celery app for *settings* (broker, result files, token source, store)."""
    from ..celery import FencedTask, install, signals

    app = install(Celery("celery_fencing_demo", broker=settings.broker, backend=settings.results_url))
    transport_options: dict[str, Any] = {}
    if settings.broker.startswith("filesystem:"):
        broker_dir = os.path.join(settings.directory, "broker")
        transport_options = {
            "data_folder_in": os.path.join(broker_dir, "queue"),
            "data_folder_out": os.path.join(broker_dir, "queue"),
            "control_folder": os.path.join(broker_dir, "control"),
            # Keep consumed messages inside the run directory (kombu's default is the system temp dir).
            "store_processed": True,
            "processed_folder": os.path.join(broker_dir, "processed"),
            "polling_interval": 0.05,
        }
    app.conf.update(
        # Message files written whole before they are visible (kombu's own write races its consumers).
        broker_transport=(
            "celery_fencing.demo.transport:AtomicFilesystemTransport"
            if settings.broker.startswith("filesystem:")
            else None
        ),
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=5,
        task_default_queue=settings.queue("default"),
        worker_prefetch_multiplier=1,
        # No pidbox queues left on a shared broker, no control traffic in the folders.
        worker_enable_remote_control=False,
        result_expires=None,
        fencing_source=settings.source,
        fencing_timeout=10.0,
    )
    log = EventLog(settings.events_path)
    stores: dict[int, AccountStore] = {}

    def store() -> AccountStore:
        # One store per process: its connections must not cross fork().
        pid = os.getpid()
        if pid not in stores:
            stores[pid] = store_from_url(settings.store, settings.namespace)
        return stores[pid]

    def gates() -> list[Any]:
        return [store().gate()]

    worker_name = os.environ.get("CELERY_FENCING_DEMO_WORKER", "?")

    def emit(kind: str, **fields: Any) -> None:
        log.emit(kind, worker=worker_name, **fields)

    def hold_until_released(task_id: str) -> None:
        # The runner freezes this process while it waits here, then lets it go on.
        go = settings.go_path(task_id)
        deadline = time.monotonic() + HOLD_LIMIT
        while not go.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the demo runner never released task {task_id}")
            time.sleep(0.01)

    def deposit_body(task: Any, account_id: int, amount: int, hold: bool, token: FencingToken | None) -> int:
        request = task.request
        fields = {"task_id": request.id, "amount": amount, "attempt": int(request.retries or 0)}
        value = None if token is None else token.value
        mark = None if token is None else store().high_water(token.resource)
        emit("start", token=value, mark=mark, **fields)
        balance = store().read(account_id)
        emit("read", token=value, balance=balance, **fields)
        if hold and not request.retries:
            emit("hold", token=value, **fields)
            hold_until_released(request.id)
        new_balance = balance + amount
        if token is None:
            store().write_unchecked(account_id, new_balance)
        else:
            try:
                store().write_fenced(token, account_id, new_balance)
            except StaleTokenError as exc:
                emit("refused", token=value, balance=new_balance, mark=exc.high_water, **fields)
                raise
        emit("wrote", token=value, balance=new_balance, checked=token is not None, **fields)
        return new_balance

    def deposit_unfenced(self: Task, account_id: int, amount: int, hold: bool = False) -> int:
        """Read the balance, add *amount*, write it back: nothing checks who writes."""
        return deposit_body(self, account_id, amount, hold, None)

    def deposit(self: Task, account_id: int, amount: int, hold: bool = False) -> int:
        """The same read-modify-write, fenced: claimed at start, the write goes through the gate."""
        return deposit_body(self, account_id, amount, hold, self.request.fencing_token)

    app.task(name=DEPOSIT_UNFENCED, bind=True)(deposit_unfenced)
    app.task(
        name=DEPOSIT,
        bind=True,
        base=FencedTask,
        fencing_resource="account:{account_id}",
        fencing_gates=gates,
        fencing_on_stale="retry",
        fencing_retry_countdown=RETRY_COUNTDOWN,
        fencing_retry_jitter=0,
        fencing_max_retries=5,
    )(deposit)

    def on_rejected(sender: Any, task_id: str, token: Any, high_water: Any, action: str, phase: str, **_: Any) -> None:
        emit("fenced_out", task_id=task_id, token=token, mark=high_water, action=action, phase=phase)

    def on_ready(sender: Any = None, **_: Any) -> None:
        emit("ready")

    signals.fencing_rejected.connect(on_rejected, weak=False)
    worker_ready.connect(on_ready, weak=False)
    app.demo_settings = settings
    return app
