"""The Celery app the integration tests run in real ``celery worker`` processes.

Configured entirely from the environment (each test gets its own queue, key
prefix and token source):

FT_BROKER    broker URL                   FT_BACKEND  result backend URL
FT_REDIS     Redis URL for the task data  FT_PREFIX   key prefix of this test
FT_QUEUE     queue name                   FT_SOURCE   token source URL (optional:
                                                      tests also pass --fencing-source)
FT_VISIBILITY_TIMEOUT  broker visibility timeout in seconds (Redis broker)
FT_CONF      more settings, as a JSON object
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Task

from celery_fencing import FencingToken, current_token
from celery_fencing.celery import FencedTask
from celery_fencing.celery.runtime import runtime_for
from celery_fencing.testing.pause import pause_point
from tests.worker_app import PREFIX, app_from_env, data, event, key, redelivery_from_env, wait_released

app = app_from_env("app_under_test", fencing_max_retries=int(os.environ.get("FT_MAX_RETRIES", "60")))


class BlocksPassedOffAsFresh:
    """A negative control: tokens drawn from blocks, but offered as fresh ones (no ``mint_in_block``).

    So a fenced task takes a refusal of a block token at its word, as it
    would without the rule "mint fresh before concluding" (tests/celery/test_block_tokens.py).
    """

    volatile = False

    def __init__(self, url: str) -> None:
        from celery_fencing import token_source_from_url

        self.inner: Any = token_source_from_url(url)

    def mint(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        token: FencingToken = self.inner.mint_in_block(resource, timeout=timeout)
        return token

    mint_transient = mint

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


if os.environ.get("FT_BLOCKS_PASSED_OFF_AS_FRESH"):
    app.conf.fencing_source = lambda: BlocksPassedOffAsFresh(os.environ["FT_SOURCE"])
if os.environ.get("FT_CONF"):
    app.conf.update(json.loads(os.environ["FT_CONF"]))  # extra settings of one test
redelivery_from_env(app)  # over FT_CONF's transport options (a test's own unacked keys)


def gates() -> list[Any]:
    """The gates of this process (built per process: the Redis client must not cross fork)."""
    from celery_fencing.gates.redis import RedisGate

    return [RedisGate(data(), prefix=f"{PREFIX}:fence")]


# Re-delivery ---------------------------------------------------------------------------


@app.task(bind=True, base=FencedTask, fencing_gates=gates)
def gated_job(self: Task, name: str, value: str, fenced: bool = True) -> str:
    """A long job fenced on its task id: records its start, waits, then writes (through the gate if fenced)."""
    token = self.request.fencing_token
    event("start", self.request.id, token.value, os.getpid())
    wait_released(self.request.id, token.value)
    written = f"{value}@{token.value}"
    if fenced:
        gates()[0].set(None, key("job", name), written)
    else:
        data().set(key("job", name), written)
    event("wrote", self.request.id, token.value, os.getpid())
    return written


@app.task(bind=True, base=FencedTask, fencing_gates=gates)
def small_job(self: Task, n: int) -> int:
    """A short job fenced on its task id (the default), with one gated write of a key of its own."""
    gates()[0].set(None, key("small", n), n)
    return n


@app.task(bind=True, base=FencedTask)
def task_id_token(self: Task) -> int:
    """A short job fenced on its task id (the default resource): returns its token."""
    token: FencingToken = self.request.fencing_token
    return token.value


def _result_only(task: Task, value: str) -> str:
    token = task.request.fencing_token
    event("start", task.request.id, token.value, os.getpid())
    wait_released(task.request.id, token.value)
    event("return", task.request.id, token.value, os.getpid())
    return f"{value}@{token.value}@{os.getpid()}"


@app.task(bind=True, base=FencedTask)
def result_only_job(self: Task, value: str) -> str:
    """A long job with no gate of its own: only its result is fenced (by the backend), and sealed once."""
    return _result_only(self, value)


@app.task(bind=True, base=FencedTask, fencing_once=False)
def result_only_job_repeatable(self: Task, value: str) -> str:
    """The same without exactly-once: the result write is fenced by token order alone."""
    return _result_only(self, value)


# Dropped copies: a refused copy of a task fenced on its id, whose newer copy dies --------


def _count(task: Task, name: str) -> int:
    # Read, pause (the test freezes or kills the execution here), gated write: the effect to apply once.
    count = int(data().get(key("count", name)) or 0)
    pause_point("count")
    gates()[0].set(None, key("count", name), count + 1)
    return count + 1


@app.task(bind=True, base=FencedTask, fencing_gates=gates)
def count_once(self: Task, name: str) -> int:
    """Fenced on its task id with the default policy: a refused copy defers to the newer one."""
    return _count(self, name)


@app.task(bind=True, base=FencedTask, fencing_gates=gates, fencing_on_stale="ignore")
def count_once_ignore(self: Task, name: str) -> int:
    """The same with ``ignore`` chosen: a refused copy is dropped (the rule before the defer policy)."""
    return _count(self, name)


# Exactly once: the quickstart's task, and a chain ---------------------------------------


def _pause_point(task: Task) -> None:
    """Between the read and the write: the first attempt of each delivery waits until the test releases it.

    Retries (a refused attempt redone) pass straight through, so the test
    needs to release only the deliveries it pauses and re-delivers.
    """
    token = task.request.fencing_token
    event("start", task.request.id, token.value, os.getpid())
    if not task.request.retries:
        wait_released(task.request.id, token.value)


def _add_points(task: Task, user_id: int, points: int) -> None:
    # docs/quickstart.md's add_points, with a pause point between its read and its write.
    total = int(data().get(key("points", user_id)) or 0)  # read after the claim on the gate
    _pause_point(task)
    gates()[0].set(None, key("points", user_id), total + points)
    event("applied", task.request.id, task.request.fencing_token.value, os.getpid())


@app.task(bind=True, acks_late=True, base=FencedTask, fencing_resource="user:{user_id}", fencing_gates=gates)
def add_points(self: Task, user_id: int, points: int) -> None:
    """The quickstart's task: exactly once per task id (the default)."""
    _add_points(self, user_id, points)


@app.task(
    bind=True,
    acks_late=True,
    base=FencedTask,
    fencing_resource="user:{user_id}",
    fencing_gates=gates,
    fencing_once=False,
)
def add_points_repeatable(self: Task, user_id: int, points: int) -> None:
    """The same with exactly-once off: fenced, but a refused copy retries, re-reads and adds again."""
    _add_points(self, user_id, points)


@app.task(bind=True, base=FencedTask, fencing_resource="order:{order_id}", fencing_gates=gates)
def charge(self: Task, order_id: int) -> str:
    """First step of a chain: charges an order (a gated read-modify-write of its total charged)."""
    return _charge(self, order_id)


@app.task(bind=True, base=FencedTask, fencing_resource="order:{order_id}", fencing_gates=gates, fencing_once=False)
def charge_repeatable(self: Task, order_id: int) -> str:
    """The same with exactly-once off."""
    return _charge(self, order_id)


def _charge(task: Task, order_id: int) -> str:
    charged = int(data().get(key("charged", order_id)) or 0)
    _pause_point(task)
    gates()[0].set(None, key("charged", order_id), charged + 1)
    return f"charged {order_id}"


@app.task(bind=True, acks_late=True, base=FencedTask, fencing_resource="order:{order_id}", fencing_gates=gates)
def charge_and_linger(self: Task, order_id: int) -> int:
    """Charges an order, then lingers before returning (and sealing): returns its execution's token.

    The pause point is after the gated write: a re-delivered copy meets this
    execution's record while this one is still running.
    """
    charged = int(data().get(key("charged", order_id)) or 0)
    gates()[0].set(None, key("charged", order_id), charged + 1)
    _pause_point(self)
    return int(self.request.fencing_token.value)


@app.task
def send_receipt(previous: str, order_id: int) -> None:
    """Second step: a plain task whose effect (a receipt sent) counts how many times it ran."""
    data().rpush(key("receipts", order_id), previous)


# Read-modify-write ---------------------------------------------------------------------


def _think() -> None:
    time.sleep(float(os.environ.get("FT_THINK", "0.01")))


@app.task(bind=True, base=FencedTask, fencing_resource="account:{account_id}", fencing_gates=gates)
def deposit(self: Task, account_id: int, amount: int) -> int:
    """Fenced read-modify-write: claimed at start, so a paused older attempt cannot land its write."""
    return _fenced_deposit(self, account_id, amount)


def _fenced_deposit(task: Task, account_id: int, amount: int) -> int:
    balance = int(data().get(key("balance", account_id)) or 0)
    _think()
    gates()[0].set(None, key("balance", account_id), balance + amount)
    data().rpush(key("applied", account_id), task.request.id)
    return balance + amount


@app.task(bind=True, base=FencedTask, fencing_resource="account:{account_id}", fencing_gates=gates, fencing_once=False)
def deposit_repeatable(self: Task, account_id: int, amount: int) -> int:
    """The fenced deposit without exactly-once: a re-delivered copy that is refused retries and deposits again."""
    return _fenced_deposit(self, account_id, amount)


@app.task(bind=True)
def deposit_unfenced(self: Task, account_id: int, amount: int) -> int:
    """The negative control: the same read-modify-write with a plain SET."""
    balance = int(data().get(key("balance", account_id)) or 0)
    _think()
    data().set(key("balance", account_id), balance + amount)
    data().rpush(key("applied", account_id), self.request.id)
    return balance + amount


# Policies ------------------------------------------------------------------------------


def _fence_out_once(task: Task, always: bool) -> None:
    """Stand in for a newer execution: mint a newer token for this resource and claim it."""
    if always or not task.request.retries:
        newer = runtime_for(app).source().mint(task.request.fencing_resource)
        gates()[0].claim(newer)
        event("fenced-out", task.request.id, task.request.retries, task.request.fencing_token.value, newer.value)


def _policy_body(task: Task, name: str, always: bool) -> dict[str, Any]:
    event("attempt", task.request.id, task.request.retries, task.request.fencing_token.value)
    _fence_out_once(task, always)
    gates()[0].set(None, key("policy", name), task.request.fencing_token.value)
    return {"retries": task.request.retries, "token": task.request.fencing_token.value}


def _policy_task(name: str, policy: str, max_retries: int | None = None) -> Any:
    options: dict[str, Any] = {"fencing_on_stale": policy}
    if max_retries is not None:
        options["fencing_max_retries"] = max_retries

    @app.task(
        bind=True,
        base=FencedTask,
        name=f"{__name__}.{name}",
        fencing_resource="policy:{name}",
        fencing_gates=gates,
        **options,
    )
    def run(self: Task, name: str, always: bool = False) -> dict[str, Any]:
        return _policy_body(self, name, always)

    return run


policy_retry = _policy_task("policy_retry", "retry")
policy_retry_limited = _policy_task("policy_retry_limited", "retry", max_retries=2)
policy_ignore = _policy_task("policy_ignore", "ignore")
policy_reject = _policy_task("policy_reject", "reject")
policy_raise = _policy_task("policy_raise", "raise")


@app.task(bind=True, base=FencedTask, fencing_resource="plain:{name}")
def whoami(self: Task, name: str) -> dict[str, Any]:
    """Report the token this execution got, and the pid that ran it."""
    token = self.request.fencing_token
    return {"resource": token.resource, "token": token.value, "pid": os.getpid()}


# ZooKeeper: exclusive mode and session loss -------------------------------------------------


@app.task(bind=True, base=FencedTask, fencing_resource="excl:{name}", fencing_mode="exclusive")
def exclusive_job(self: Task, name: str) -> int:
    """Holds the resource's lease for its whole run: enter, wait for the test, exit."""
    token = self.request.fencing_token
    event("enter", self.request.id, token.value, os.getpid())
    wait_released(self.request.id, token.value)
    event("exit", self.request.id, token.value, os.getpid())
    return int(token.value)


@app.task(bind=True, base=FencedTask, fencing_resource="kept:{name}", fencing_gates=gates, fencing_mode="exclusive")
def kept_lease_write(self: Task, name: str) -> dict[str, Any]:
    """Writes its token through the gate under an exclusive lease (kept between tasks with fencing_lease_reuse)."""
    token = self.request.fencing_token.value
    event("attempt", self.request.id, self.request.retries, token)
    gates()[0].set(None, key("kept", name), token)
    return {"retries": self.request.retries, "token": token}


@app.task(bind=True, base=FencedTask, fencing_resource="sess:{name}", fencing_gates=gates)
def session_job(self: Task, name: str) -> int:
    """Waits for the test, then writes through the gate; reports whether its session was lost meanwhile."""
    token = self.request.fencing_token
    event("start", self.request.id, token.value, self.request.retries)
    wait_released(self.request.id, token.value)
    lost = self.request.fencing_execution.session_lost.is_set()
    event("lost" if lost else "kept", self.request.id, token.value, self.request.retries)
    gates()[0].set(None, key("sess", name), token.value)
    return int(token.value)


# Pools: executions side by side in one process -----------------------------------------


def _token_fields(token: FencingToken | None) -> list[object] | None:
    return None if token is None else [token.resource, token.value]


@app.task(bind=True, base=FencedTask, fencing_resource="echo:{name}")
def token_echo(self: Task, name: str) -> dict[str, Any]:
    """Report the current token before and after a pause, and how many executions of this process ran at once.

    The pause (``FT_THINK``) is where a gevent or threads worker runs its other
    executions: each must still see its own token after it, not a neighbour's.
    """
    before = current_token()
    running = data().incr(key("running", os.getpid()))
    _think()
    still_running = int(data().get(key("running", os.getpid())) or 0)
    after = current_token()
    data().decr(key("running", os.getpid()))
    return {
        "request": _token_fields(self.request.fencing_token),
        "seen": [_token_fields(before), _token_fields(after)],
        "concurrent": max(running, still_running),
    }
