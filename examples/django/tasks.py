"""The Celery app of the example: three ways to deposit into a Django model.

* ``deposit``: transaction mode. FencedTask claims the token on the DjangoGate
  when the task starts (before the body reads), and the write happens in
  ``gate.transaction()``, which checks the token again in the same transaction.
* ``deposit_column``: column mode. The body claims the account row itself with
  ``fenced_update(row, None)`` (no values: it raises the row's fence), reads,
  then writes with ``fenced_update(row, None, balance=...)``: one UPDATE.
* ``deposit_unfenced``: the same read-modify-write with a plain ``update()``.

A stale attempt (a newer deposit on the account started since it claimed) gets
StaleTokenError, and FencedTask retries it with a new token: it re-reads.
"""

from __future__ import annotations

import os
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django.settings")
django.setup()

from celery import Celery  # noqa: E402
from celery.signals import worker_process_init  # noqa: E402
from django.db import connections  # noqa: E402

from celery_fencing import DjangoGate  # noqa: E402
from celery_fencing.celery import FencedTask, install  # noqa: E402
from celery_fencing.gates.django import fenced_update  # noqa: E402
from examples.django.ledger.models import Account, Entry  # noqa: E402

app = install(Celery("ledger", broker=os.environ.get("EXAMPLE_BROKER", "filesystem://")))
if app.conf.broker_url.startswith("filesystem://"):
    folder = os.path.join(os.environ.get("EXAMPLE_DIR", "."), "broker")
    os.makedirs(folder, exist_ok=True)
    # kombu's filesystem transport, but each message file written whole before a worker can take it
    # (kombu's own write races its consumers: celery_fencing/demo/transport.py).
    app.conf.broker_transport = "celery_fencing.demo.transport:AtomicFilesystemTransport"
    # control_folder too: kombu's default is ./control, which would litter the working directory.
    app.conf.broker_transport_options = {
        "data_folder_in": folder,
        "data_folder_out": folder,
        "control_folder": os.path.join(folder, "control"),
        "polling_interval": 0.1,
    }
app.conf.update(
    task_default_queue=os.environ.get("EXAMPLE_QUEUE", "ledger"),
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    fencing_source=os.environ.get("FENCING_SOURCE", "sqlite:///tokens.db"),
    fencing_retry_countdown=0.05,
    fencing_retry_max_delay=0.5,
    fencing_max_retries=100,
)
gate = DjangoGate()
THINK = float(os.environ.get("EXAMPLE_THINK", "0.05"))  # time between read and write: where races happen


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # Database connections must not cross fork(): each pool process opens its own.
    connections.close_all()


@app.task(bind=True, base=FencedTask, fencing_resource="account:{account_id}", fencing_gates=[gate])
def deposit(self: FencedTask, account_id: int, amount: int) -> int:
    """Transaction mode: claimed at start, written in a fenced transaction."""
    seen = Account.objects.get(pk=account_id).balance
    time.sleep(THINK)
    with gate.transaction():  # the current task's token; StaleTokenError if a newer deposit claimed
        Account.objects.filter(pk=account_id).update(balance=seen + amount)
        Entry.objects.create(account_id=account_id, amount=amount, task_id=self.request.id)
    return seen + amount


@app.task(bind=True, base=FencedTask, fencing_resource="account:{account_id}")
def deposit_column(self: FencedTask, account_id: int, amount: int) -> int:
    """Column mode: the row's own fence column, claimed and checked by single UPDATEs."""
    row = Account.objects.filter(pk=account_id)
    fenced_update(row, None)  # claim the row before reading it
    seen = row.get().balance
    time.sleep(THINK)
    fenced_update(row, None, balance=seen + amount)
    Entry.objects.create(account_id=account_id, amount=amount, task_id=self.request.id)
    return seen + amount


@app.task(bind=True)
def deposit_unfenced(self: FencedTask, account_id: int, amount: int) -> int:
    """The negative control: the same read-modify-write, unfenced."""
    seen = Account.objects.get(pk=account_id).balance
    time.sleep(THINK)
    Account.objects.filter(pk=account_id).update(balance=seen + amount)
    Entry.objects.create(account_id=account_id, amount=amount, task_id=self.request.id)
    return seen + amount
