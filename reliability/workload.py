"""The workload the reliability workers run: ``celery -A reliability.workload worker``.

One task, in two variants that differ only in which Redis holds the gate data
(``deposit``: the AOF store, ``deposit_volatile``: the store without
persistence). Each execution does a read-modify-write of one account:

1. (fenced) ``FencedTask`` mints a ZooKeeper token for ``acct:<scope>:<n>`` and
   claims it on the SQLGate, the RedisGate and the ``fenced+redis://`` result
   backend before the body runs;
2. reads the balance from PostgreSQL and from Redis, thinks 50-500 ms;
3. writes PostgreSQL in one transaction (``SQLGate.transaction()`` when
   fenced, which also records the task id as applied): ``balance = read + 1``
   and an audit row (task id, attempt, resource, token, values);
4. writes Redis in one script (through ``RedisGate.eval`` when fenced, which
   records the task id likewise): ``bal = read + 1``, the task id into an
   applied set and a log entry (both plain logs for the checker).
   ``deposit_volatile`` writes Redis first, then PostgreSQL: otherwise the SQL
   gate would refuse a stale execution before its Redis write, and a Redis that
   lost its marks in a restart would never be put to the test.

**Exactly once** is the library's (``fencing_once``, on by default): each
gated write records "task T applied on R by execution E" in the same atomic
operation, and a later execution of T meeting the record gets
``AlreadyAppliedError`` with nothing written. The workload has no check of
its own. The two stores have no common transaction, so the body resumes
store by store (:func:`_once`): it logs ``pg-dup`` or ``redis-dup`` and goes
on to the next store, which has its own record, so going on never applies
twice; the body returns and the seal (per task id) decides whose result
stands. A ``superseded`` error is not re-raised either (see :func:`_once`). The
audit table has no unique constraint on purpose, so a duplicate effect stays
visible to the checker instead of becoming an error.

**Fencing off.** ``RW_MODE=control`` keeps every step but the fencing: no
gates to claim, plain ``UPDATE``/``EVAL``, the plain ``redis://`` result
backend, and no exactly-once at all (a re-delivered task applies again: the
control must show duplicate effects). Tokens are still minted (``FencedTask``
with no gates) but only as labels, so the checker can apply the same rules to
both sides.

Storage errors retry the task (new attempt, new token); an error after the
write was sent is recorded as ``unknown``: the retry finds out, through the
gates' records (``pg-dup``/``redis-dup``), whether it had committed.

Environment: ``RW_MODE``, ``RW_PREFIX``, ``RW_QUEUE``, ``RW_BROKER``,
``RW_BROKER_PREFIX``, ``RW_BACKEND``, ``RW_REDIS``, ``RW_REDIS_VOLATILE``,
``RW_PG``, ``RW_SOURCE``, ``RW_HISTORY``, ``RW_WORKER``,
``RW_VISIBILITY_TIMEOUT``, ``RW_THINK_MS`` (``"50,500"``).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from typing import Any

import redis
from celery import Celery, Task, current_task
from celery.signals import task_failure
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError
from redis.retry import Retry
from sqlalchemy import create_engine, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from celery_fencing.celery import FencedTask, install, signals
from celery_fencing.exceptions import AlreadyAppliedError, GateUnavailableError
from celery_fencing.gates.redis import RedisGate
from celery_fencing.gates.sql import SQLGate

from .history import HistoryWriter
from .schema import REDIS_WRITE, Names

MODE = os.environ.get("RW_MODE", "fenced")
FENCED = MODE == "fenced"
NAMES = Names(os.environ.get("RW_PREFIX", "rel"))
ACCOUNTS, AUDIT = NAMES.tables()
THINK_MS = tuple(float(x) for x in os.environ.get("RW_THINK_MS", "50,500").split(","))
RETRY_LIMIT = 10_000

history = HistoryWriter(os.environ.get("RW_HISTORY", "."), os.environ.get("RW_WORKER", "worker"), mode=MODE)

app = install(Celery("reliability", broker=os.environ.get("RW_BROKER"), backend=os.environ.get("RW_BACKEND")))
app.conf.update(
    task_default_queue=os.environ.get("RW_QUEUE", "reliability"),
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("RW_VISIBILITY_TIMEOUT", "3")),
        # kombu sweeps unacked messages every interval x throttle seconds (10 x 10 by default).
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        "global_keyprefix": os.environ.get("RW_BROKER_PREFIX", ""),
    },
    # The result store restarts in some scenarios: result writes wait it out.
    result_backend_always_retry=True,
    result_backend_max_retries=40,
    result_backend_base_sleep_between_retries_ms=20,
    result_backend_max_sleep_between_retries_ms=500,
    redis_socket_timeout=3,
    redis_socket_connect_timeout=2,
    result_expires=3600,
    fencing_timeout=3,
    fencing_max_retries=RETRY_LIMIT,
    fencing_retry_countdown=0.05,
    fencing_retry_backoff_factor=1.5,
    fencing_retry_max_delay=1.0,
    fencing_retry_jitter=0.5,
)
if os.environ.get("RW_SOURCE"):
    app.conf.fencing_source = os.environ["RW_SOURCE"]


# Per-process clients (none may cross fork) ---------------------------------------------

_clients: dict[str, Any] = {}
_clients_pid = 0


def _client(name: str) -> Any:
    global _clients_pid
    if _clients_pid != os.getpid():
        _clients.clear()
        _clients_pid = os.getpid()
    client = _clients.get(name)
    if client is None:
        client = _clients[name] = _build(name)
    return client


def _build(name: str) -> Any:
    if name == "engine":
        return create_engine(
            os.environ["RW_PG"],
            pool_size=2,
            max_overflow=2,
            pool_pre_ping=True,
            connect_args={"connect_timeout": 3, "options": "-c lock_timeout=3000 -c statement_timeout=10000"},
        )
    if name in ("aof", "volatile"):
        url = os.environ["RW_REDIS" if name == "aof" else "RW_REDIS_VOLATILE"]
        return redis.Redis.from_url(
            url,
            socket_timeout=3,
            socket_connect_timeout=2,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
        )
    if name.startswith("gates:"):
        store = name.split(":", 1)[1]
        sql_gate = SQLGate(engine(), table=NAMES.marks, applied_table=NAMES.applied)
        return (sql_gate, RedisGate(_client(store), prefix=NAMES.gate_prefix))
    raise KeyError(name)


def engine() -> Engine:
    engine: Engine = _client("engine")
    return engine


def gates(store: str) -> tuple[SQLGate, RedisGate]:
    built: tuple[SQLGate, RedisGate] = _client(f"gates:{store}")
    return built


def gates_aof() -> tuple[SQLGate, RedisGate]:
    return gates("aof")


def gates_volatile() -> tuple[SQLGate, RedisGate]:
    return gates("volatile")


# Observing: every signal of the library goes to the history --------------------------


def _attempt(sender: Any) -> int:
    try:
        return int(sender.request.retries or 0)
    except AttributeError:
        return 0


@signals.token_minted.connect(weak=False)
def _on_minted(sender: Any, task_id: str, token: Any, **_: Any) -> None:
    history.emit("minted", task=task_id, resource=token.resource, token=token.value, attempt=_attempt(sender))


@signals.fencing_rejected.connect(weak=False)
def _on_rejected(
    sender: Any, task_id: str, resource: str, token: Any, high_water: Any, error: Any, action: str, phase: str, **_: Any
) -> None:
    history.emit(
        "rejected",
        task=task_id,
        resource=resource,
        token=token,
        high_water=high_water,
        phase=phase,
        action=action,
        attempt=_attempt(sender),
        error=type(error).__name__,
    )


@signals.duplicate_prevented.connect(weak=False)
def _on_duplicate(sender: Any, task_id: str, resource: str, phase: str, action: str, error: Any, **_: Any) -> None:
    # The sender is the task, or the result backend (phase result): then the task is the current one.
    task = sender if isinstance(sender, Task) else current_task
    token = getattr(getattr(task, "request", None), "fencing_token", None)
    history.emit(
        "duplicate",
        task=task_id,
        resource=resource,
        token=getattr(token, "value", None),
        phase=phase,
        action=action,
        superseded=getattr(error, "superseded", None),
        high_water=getattr(error, "high_water", None),
        attempt=_attempt(task),
    )


@signals.result_dropped.connect(weak=False)
def _on_result_dropped(sender: Any, task_id: str, state: str, token: Any, high_water: Any, **_: Any) -> None:
    value = getattr(token, "value", None)
    history.emit("result-dropped", task=task_id, state=state, token=value, high_water=high_water)


@signals.session_state_changed.connect(weak=False)
def _on_session(sender: Any, state: str, task_ids: Any, **_: Any) -> None:
    history.emit("session", state=state, tasks=list(task_ids or ()))


@task_failure.connect(weak=False)
def _on_failure(sender: Any = None, task_id: str | None = None, exception: Any = None, **_: Any) -> None:
    history.emit("failed", task=task_id, error=f"{type(exception).__name__}: {exception}"[:300])


# The task ---------------------------------------------------------------------------------


def _retry(task: Task, exc: BaseException) -> BaseException:
    countdown = random.uniform(0.05, 0.4)
    retry: BaseException = task.retry(exc=exc, countdown=countdown, max_retries=RETRY_LIMIT, throw=False)
    return retry


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def _deposit(task: Task, scope: str, account: int, store: str) -> dict[str, Any]:
    request = task.request
    token = request.fencing_token
    resource = token.resource
    ids = {"task": request.id, "attempt": int(request.retries or 0), "resource": resource, "token": token.value}
    history.emit("invoke", **ids)
    applied: str | None = None
    try:
        with engine().connect() as conn:
            pg_value = int(conn.execute(select(ACCOUNTS.c.balance).where(ACCOUNTS.c.resource == resource)).scalar_one())
        redis_value = int(_client(store).hget(NAMES.redis_state(resource), "bal") or 0)
        if FENCED:
            # The library's record at the store written first: only to skip the think time
            # of a copy re-delivered after the commit. The gated writes decide, not this.
            sql_gate, redis_gate = gates(store)
            applied = (redis_gate if store == "volatile" else sql_gate).applied(resource, request.id)
    except (GateUnavailableError, SQLAlchemyError, RedisError) as exc:
        history.emit("error", phase="read", error=_short(exc), **ids)
        raise _retry(task, exc) from None
    if applied is None:
        time.sleep(random.uniform(*THINK_MS) / 1000)  # the workload's think time, not synchronisation
    if store == "volatile":
        # Redis first: a write the Redis gate accepts is not shielded by the SQL gate
        # refusing the same stale execution first, so a Redis that forgot its marks shows.
        _write_redis(task, store, ids, redis_value)
        seq = _write_pg(task, store, ids, pg_value)
    else:
        seq = _write_pg(task, store, ids, pg_value)
        _write_redis(task, store, ids, redis_value)
    history.emit("ok", **ids)
    return {"token": token.value, "pg_seq": seq}


def _once(exc: AlreadyAppliedError, event: str, ids: dict[str, Any]) -> None:
    """The resume pattern for effects on two stores, when a gate finds the task id applied.

    Nothing was written at this store, and the execution goes on to the next
    one, which has its own record: it writes there if the execution that
    applied here never did (killed after its commit, failed at the next
    store), or finds the task applied there too. Going on never applies
    twice, and a stale execution is still refused there (``StaleTokenError``,
    then the retry resumes the same way). The body then returns and the seal,
    per task id, decides whose result stands.

    This holds whether or not the error is ``superseded`` (a newer execution
    of this task applied here, judged by the token in the record): that one
    finishes the task, and going on meets its record at the next store or
    writes there first, which it then meets. Each store applies once either way.
    """
    history.emit(event, superseded=exc.superseded, high_water=exc.high_water, **ids)


def _write_pg(task: Task, store: str, ids: dict[str, Any], pg_value: int) -> int | None:
    """The balance and its audit row in one transaction (gated, recording the task id, when fenced)."""
    request = task.request
    history.emit("write", read=pg_value, **ids)
    stage = "begin"
    try:
        transaction = gates(store)[0].transaction() if FENCED else engine().begin()
        with transaction as conn:
            stage = "body"
            resource = ids["resource"]
            conn.execute(update(ACCOUNTS).where(ACCOUNTS.c.resource == resource).values(balance=pg_value + 1))
            seq: int = conn.execute(
                insert(AUDIT)
                .values(
                    task_id=request.id,
                    attempt=ids["attempt"],
                    resource=resource,
                    token=ids["token"],
                    read_value=pg_value,
                    new_value=pg_value + 1,
                    pid=os.getpid(),
                    worker=history.worker,
                )
                .returning(AUDIT.c.seq)
            ).scalar_one()
            stage = "commit"
    except AlreadyAppliedError as exc:
        # Raised on entering the transaction: rolled back, nothing written.
        _once(exc, "pg-dup", ids)
        return None
    except (GateUnavailableError, SQLAlchemyError) as exc:
        # Leaving the block commits: an error there leaves the outcome unknown.
        history.emit("unknown" if stage == "commit" else "error", phase="pg", stage=stage, error=_short(exc), **ids)
        raise _retry(task, exc) from None
    history.emit("pg-ok", seq=seq, new=pg_value + 1, **ids)
    return seq


def _write_redis(task: Task, store: str, ids: dict[str, Any], redis_value: int) -> None:
    """The Redis balance and its logs, atomic in one script (through the gate, recording the task id, when fenced)."""
    resource = ids["resource"]
    keys = [NAMES.redis_state(resource), NAMES.redis_applied(resource), NAMES.redis_log(resource)]
    args = [ids["task"], redis_value + 1, ids["token"], uuid.uuid4().hex[:12]]
    try:
        if FENCED:
            reply = gates(store)[1].eval(None, REDIS_WRITE, keys, args)
        else:
            reply = _client(store).eval(REDIS_WRITE, len(keys), *keys, *args)
    except AlreadyAppliedError as exc:
        _once(exc, "redis-dup", ids)
        return
    except (GateUnavailableError, RedisError) as exc:
        history.emit("unknown", phase="redis", error=_short(exc), **ids)
        raise _retry(task, exc) from None
    epoch, redis_seq = reply[0], int(reply[1])
    epoch = epoch.decode() if isinstance(epoch, bytes) else str(epoch)
    history.emit("redis-ok", epoch=epoch, seq=redis_seq, new=redis_value + 1, **ids)


_TASK_OPTIONS: dict[str, Any] = {
    "bind": True,
    "base": FencedTask,
    "fencing_resource": "acct:{scope}:{account}",
    "fencing_on_stale": "retry",
    "max_retries": RETRY_LIMIT,
}


@app.task(name="reliability.deposit", fencing_gates=gates_aof if FENCED else (), **_TASK_OPTIONS)
def deposit(self: Task, scope: str, account: int) -> dict[str, Any]:
    """Read-modify-write of one account; gate data in the Redis with AOF."""
    return _deposit(self, scope, account, "aof")


@app.task(name="reliability.deposit_volatile", fencing_gates=gates_volatile if FENCED else (), **_TASK_OPTIONS)
def deposit_volatile(self: Task, scope: str, account: int) -> dict[str, Any]:
    """The same, with gate data in the Redis without persistence."""
    return _deposit(self, scope, account, "volatile")
