"""The Celery app the sink tests run in real ``celery worker`` processes.

Configured from the environment, as tests/celery/app_under_test.py is:

FT_BROKER    broker URL                   FT_BACKEND  result backend URL
FT_REDIS     Redis URL for events/keys    FT_PREFIX   key prefix of this test
FT_QUEUE     queue name                   FT_SOURCE   token source URL
FT_SERVICE   base URL of the fake external service (tests/sinks/fake_services.py)
FT_VISIBILITY_TIMEOUT  broker visibility timeout in seconds (Redis broker)
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any

from celery import Task

from celery_fencing.celery import FencedTask
from celery_fencing.gates.http import ConditionalHTTPClient
from celery_fencing.idempotency import idempotent
from celery_fencing.idempotency.redis import RedisIdempotencyStore
from tests.worker_app import app_from_env, data, event, key, redelivery_from_env, wait_released

SERVICE = os.environ.get("FT_SERVICE", "http://127.0.0.1:9")

# fencing_timeout: generous, as a lease waits for a dead holder's session to expire on a loaded machine.
app = app_from_env("sinks_under_test", fencing_timeout=30, fencing_max_retries=60)
redelivery_from_env(app)

# Lock-delay ----------------------------------------------------------------------------------


def _hold(task: Task, name: str) -> int:
    token = task.request.fencing_token
    # Wall-clock time of entry: the test compares it with when the previous holder's lock node vanished.
    event("enter", task.request.id, token.value, os.getpid(), f"{time.time():.6f}")
    wait_released(task.request.id, token.value)
    event("exit", task.request.id, token.value, os.getpid(), f"{time.time():.6f}")
    return int(token.value)


@app.task(bind=True, base=FencedTask, fencing_resource="sink:{name}", fencing_mode="exclusive")
def exclusive_job(self: Task, name: str) -> int:
    """Holds the resource's lease for its whole run (lock-delay from the worker's --fencing-lock-delay)."""
    return _hold(self, name)


@app.task(bind=True, base=FencedTask, fencing_resource="sink:{name}", fencing_mode="exclusive", fencing_lock_delay=0)
def exclusive_job_without_delay(self: Task, name: str) -> int:
    """The same, with the task option turning the worker's lock-delay off: the negative control."""
    return _hold(self, name)


# Idempotency keys ----------------------------------------------------------------------------


def _post_charge(name: str, amount: int) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{SERVICE}/charges",
        data=json.dumps({"customer": name, "amount": amount}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        charge: dict[str, Any] = json.loads(response.read())
        return charge


charge_once = idempotent(lambda: RedisIdempotencyStore(data(), prefix=key("once")), "charge")(_post_charge)


@app.task(bind=True, base=FencedTask)
def charge_job(self: Task, name: str, amount: int, once: bool = True) -> str:
    """Charges through the external API (once per task with idempotency keys), then waits for the test."""
    token = self.request.fencing_token
    charge = charge_once(name, amount) if once else _post_charge(name, amount)
    event("charged", self.request.id, token.value, charge["id"], os.getpid(), self.request.retries)
    wait_released(self.request.id, token.value)
    return str(charge["id"])


# Conditional HTTP writes ---------------------------------------------------------------------


@app.task(bind=True, base=FencedTask, fencing_resource="doc:{name}")
def add_to_doc(self: Task, name: str, amount: int, conditional: bool = True) -> int:
    """Read-modify-write of a JSON document over HTTP: If-Match the ETag read (or, as a control, a blind PUT)."""
    token = self.request.fencing_token
    url = f"{SERVICE}/docs/{name}"
    client = ConditionalHTTPClient(timeout=10)
    document = client.get(url)
    assert document is not None
    total = int(document.json()["total"])
    event("read", self.request.id, token.value, self.request.retries, total)
    wait_released(self.request.id, token.value)
    if conditional:
        client.put_json(url, {"total": total + amount}, if_match=document.etag)
    else:
        blind = urllib.request.Request(url, data=json.dumps({"total": total + amount}).encode(), method="PUT")
        with urllib.request.urlopen(blind, timeout=10) as response:
            response.read()
    event("wrote", self.request.id, token.value, self.request.retries, total + amount)
    return total + amount
