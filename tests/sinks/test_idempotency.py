"""Idempotency keys: one contract over every store (memory, Redis, PostgreSQL, SQLite), then each store's
in-store exactly-once mode, each with the negative control that shows the duplicate it prevents."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from celery_fencing import EffectPendingError, FencingConfigurationError, FencingToken
from celery_fencing.context import Execution, token_context
from celery_fencing.idempotency import (
    IdempotencyStore,
    MemoryIdempotencyStore,
    idempotency_key,
    idempotent,
    run_once,
)
from celery_fencing.idempotency.redis import RedisIdempotencyStore
from celery_fencing.idempotency.sql import SQLIdempotencyStore

from .waiting import wait_for

STORE_KINDS = ["memory", "redis", "postgres", "sqlite"]


class Counter:
    """A stand-in external call that counts how often it really ran."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, result: Any = "receipt") -> Any:
        with self._lock:
            self.calls += 1
            return result


def _engine(url: str) -> sa.Engine:
    backend = sa.make_url(url).get_backend_name()
    connect_args = {"connect_timeout": 5} if backend == "postgresql" else {"timeout": 30}
    return sa.create_engine(url, connect_args=connect_args, pool_size=10, max_overflow=10)


@pytest.fixture
def sql_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    """An engine on PostgreSQL or on an SQLite file, chosen by the test's parameter."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else f"sqlite:///{tmp_path}/once.db"
    engine = _engine(url)
    yield engine
    engine.dispose()


def _sql_store(engine: sa.Engine, unique_name: str) -> Iterator[SQLIdempotencyStore]:
    store = SQLIdempotencyStore(engine, table=f"once_{unique_name}")
    store.create_schema()
    yield store
    store.table.drop(engine, checkfirst=True)


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, unique_name: str, tmp_path: Path) -> Iterator[IdempotencyStore]:
    """Each store kind in a namespace of its own (a key prefix, or a table), removed afterwards."""
    if request.param == "memory":
        yield MemoryIdempotencyStore()
    elif request.param == "redis":
        yield RedisIdempotencyStore(request.getfixturevalue("redis_client"), prefix=unique_name)
    else:
        url = request.getfixturevalue("postgres_url") if request.param == "postgres" else f"sqlite:///{tmp_path}/o.db"
        engine = _engine(url)
        yield from _sql_store(engine, unique_name)
        engine.dispose()


# The contract --------------------------------------------------------------------------


def test_a_repeat_returns_the_first_outcome_without_calling(store: IdempotencyStore) -> None:
    """The second run of a key returns the first call's outcome and does not call; a new key calls."""
    call = Counter()
    first = run_once(store, "task-1:charge", lambda: call({"id": "ch_1", "amount": 10}))
    again = run_once(store, "task-1:charge", lambda: call({"id": "ch_2", "amount": 10}))
    other = run_once(store, "task-2:charge", lambda: call({"id": "ch_3", "amount": 10}))
    assert first == again == {"id": "ch_1", "amount": 10}
    assert other["id"] == "ch_3"
    assert call.calls == 2


def test_without_a_key_the_call_repeats(store: IdempotencyStore) -> None:
    """Negative control: the same two calls made directly both reach the external system."""
    call = Counter()
    call({"id": "ch_1"})
    call({"id": "ch_1"})
    assert call.calls == 2


def test_first_call_and_repeat_return_the_same_json_value(store: IdempotencyStore) -> None:
    """A tuple comes back as a list from the first call too, so callers see one type either way."""
    assert run_once(store, "t:shape", lambda: ("a", 1)) == ["a", 1]
    assert run_once(store, "t:shape", lambda: ("b", 2)) == ["a", 1]


def test_a_claim_without_an_outcome_blocks_repeats(store: IdempotencyStore) -> None:
    """At most once: after a claim whose process died before recording, a repeat raises and does not call."""
    store.claim("t:died", retention=60, reclaim_after=None)  # claimed, then the process died
    call = Counter()
    with pytest.raises(EffectPendingError) as caught:
        run_once(store, "t:died", call)
    assert call.calls == 0
    assert caught.value.key == "t:died" and caught.value.age is not None and caught.value.age >= 0


def test_reclaim_after_makes_it_at_least_once(store: IdempotencyStore) -> None:
    """With reclaim_after, a claim older than that is taken over and called again; the old one cannot record."""
    stale = store.claim("t:slow", retention=60, reclaim_after=None)
    call = Counter()

    def attempt() -> Any:
        try:
            return run_once(store, "t:slow", lambda: call("second"), reclaim_after=0.3)
        except EffectPendingError:
            return None

    assert wait_for(attempt, 30, "the stale claim to become reclaimable") == "second"
    assert call.calls == 1
    assert store.record(stale, '"first"', retention=60) is False
    assert run_once(store, "t:slow", lambda: call("third")) == "second"


def test_forget_on_lets_a_failed_call_run_again(store: IdempotencyStore) -> None:
    """An exception listed in forget_on drops the claim; any other exception leaves it (outcome unknown)."""

    def rejected() -> None:
        raise ValueError("card declined before anything happened")

    with pytest.raises(ValueError):
        run_once(store, "t:declined", rejected, forget_on=(ValueError,))
    assert run_once(store, "t:declined", lambda: "paid") == "paid"

    def timed_out() -> None:
        raise TimeoutError("no answer: did it happen?")

    with pytest.raises(TimeoutError):
        run_once(store, "t:unknown", timed_out, forget_on=(ValueError,))
    with pytest.raises(EffectPendingError):
        run_once(store, "t:unknown", lambda: "paid")


def test_an_outcome_that_is_not_json_leaves_the_claim_pending(store: IdempotencyStore) -> None:
    """The call happened but its outcome cannot be stored: TypeError, and repeats are refused (at most once)."""
    call = Counter()
    with pytest.raises(TypeError):
        run_once(store, "t:object", lambda: call(object()))
    with pytest.raises(EffectPendingError):
        run_once(store, "t:object", lambda: call("again"))
    assert call.calls == 1


def test_retention_ends_the_suppression(store: IdempotencyStore) -> None:
    """Once the retention passes, the key no longer suppresses a repeat."""
    call = Counter()
    run_once(store, "t:short", lambda: call(1), retention=0.3)
    assert wait_for(lambda: run_once(store, "t:short", lambda: call(2), retention=0.3) == 2, 30, "the key to expire")
    assert call.calls == 2


def test_concurrent_duplicates_call_once(store: IdempotencyStore) -> None:
    """Eight simultaneous runs of one key: one calls, the others are refused while it runs, then get its outcome."""
    call = Counter()
    others_done = threading.Event()
    outcomes: list[Any] = []
    refused: list[EffectPendingError] = []
    start = threading.Barrier(8)

    def slow_call() -> str:
        # The winner finishes only after every other run was answered.
        assert others_done.wait(30)
        return str(call("only"))

    def run() -> None:
        start.wait(30)
        try:
            outcomes.append(run_once(store, "t:race", slow_call))
        except EffectPendingError as exc:
            refused.append(exc)
            if len(refused) == 7:
                others_done.set()

    threads = [threading.Thread(target=run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert call.calls == 1
    assert outcomes == ["only"] and len(refused) == 7
    assert run_once(store, "t:race", lambda: call("again")) == "only"


# Keys and the decorator ------------------------------------------------------------------


def test_the_decorator_keys_by_task_id_and_operation() -> None:
    """Inside a task the key is '<task id>:<operation>': one call per task, whatever its repeats."""
    store = MemoryIdempotencyStore()
    call = Counter()

    @idempotent(store, "charge")
    def charge(amount: int) -> str:
        return str(call(f"charged {amount}"))

    for task_id in ("task-a", "task-a", "task-b"):
        with token_context(Execution(FencingToken(task_id, 1), task_id=task_id)):
            assert charge(5) == "charged 5"
    assert call.calls == 2
    assert idempotency_key("charge", "task-a") == "task-a:charge"


def test_the_decorator_takes_a_key_function_and_a_store_factory() -> None:
    """key= derives the key from the arguments; a store factory is built once per process."""
    built: list[MemoryIdempotencyStore] = []

    def factory() -> MemoryIdempotencyStore:
        built.append(MemoryIdempotencyStore())
        return built[-1]

    call = Counter()

    @idempotent(factory, key=lambda order_id: f"ship:{order_id}")
    def ship(order_id: int) -> str:
        return str(call(f"shipped {order_id}"))

    assert [ship(1), ship(1), ship(2)] == ["shipped 1", "shipped 1", "shipped 2"]
    assert call.calls == 2 and len(built) == 1


def test_no_task_and_no_key_is_a_configuration_error() -> None:
    """Outside a task, with no key function, there is nothing to derive a key from: a clear error, no call."""
    call = Counter()

    @idempotent(MemoryIdempotencyStore(), "charge")
    def charge() -> Any:
        return call()

    with pytest.raises(FencingConfigurationError, match="no Celery task is running"):
        charge()
    assert call.calls == 0


@pytest.mark.parametrize("bad", ["", "x" * 401, "a\nb", 7, None])
def test_bad_keys_are_refused_before_any_io(bad: object) -> None:
    """Empty, oversized, control-character or non-str keys are refused."""
    with pytest.raises(FencingConfigurationError):
        run_once(MemoryIdempotencyStore(), bad, lambda: None)  # type: ignore[arg-type]


# Effects inside the store: exactly once ------------------------------------------------

APPEND = "return redis.call('RPUSH', KEYS[1], ARGV[1])"


def test_redis_eval_once_appends_once(redis_client: redis.Redis, unique_name: str) -> None:
    """eval_once records the key in the script that appends: a repeat returns the first length, appends nothing."""
    store = RedisIdempotencyStore(redis_client, prefix=unique_name)
    log = f"{unique_name}:log"
    assert store.eval_once("t1:append", APPEND, [log], ["event-1"]) == 1
    assert store.eval_once("t1:append", APPEND, [log], ["event-1"]) == 1
    assert redis_client.lrange(log, 0, -1) == [b"event-1"]
    # Negative control: the same script without a key appends twice.
    redis_client.eval(APPEND, 1, log, "event-1")
    assert redis_client.llen(log) == 2


def test_redis_eval_once_respects_a_pending_claim(redis_client: redis.Redis, unique_name: str) -> None:
    """A key claimed by run_once and never recorded is not run by eval_once either."""
    store = RedisIdempotencyStore(redis_client, prefix=unique_name)
    store.claim("t1:mixed", retention=60, reclaim_after=None)
    with pytest.raises(EffectPendingError):
        store.eval_once("t1:mixed", APPEND, [f"{unique_name}:log"], ["x"])
    assert redis_client.llen(f"{unique_name}:log") == 0


@pytest.fixture
def ledger(sql_engine: sa.Engine, unique_name: str) -> Iterator[tuple[SQLIdempotencyStore, sa.Table]]:
    """An idempotency store and a ledger table in the same database."""
    metadata = sa.MetaData()
    table = sa.Table(
        f"ledger_{unique_name}",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("entry", sa.String(50), nullable=False),
    )
    metadata.create_all(sql_engine)
    for store in _sql_store(sql_engine, unique_name):
        yield store, table
    metadata.drop_all(sql_engine)


def _count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def _book(store: SQLIdempotencyStore, table: sa.Table, key: str, entry: str) -> Any:
    with store.transaction_once(key) as effect:
        if effect.done:
            return effect.outcome
        row = effect.connection.execute(sa.insert(table).values(entry=entry).returning(table.c.id)).one()
        effect.record({"id": row.id})
        return effect.outcome


@pytest.mark.parametrize("sql_engine", ["postgres", "sqlite"], indirect=True)
def test_sql_transaction_once_books_once(ledger: tuple[SQLIdempotencyStore, sa.Table], sql_engine: sa.Engine) -> None:
    """The key commits with the ledger row: a repeat returns the first row's id and books nothing."""
    store, table = ledger
    first = _book(store, table, "t1:book", "deposit 10")
    assert _book(store, table, "t1:book", "deposit 10") == first
    assert _count(sql_engine, table) == 1
    # Negative control: the same insert without a key books twice.
    with sql_engine.begin() as conn:
        conn.execute(sa.insert(table).values(entry="deposit 10"))
    assert _count(sql_engine, table) == 2


@pytest.mark.parametrize("sql_engine", ["postgres", "sqlite"], indirect=True)
def test_sql_transaction_once_rolls_back_key_and_effect_together(
    ledger: tuple[SQLIdempotencyStore, sa.Table], sql_engine: sa.Engine
) -> None:
    """A block that fails leaves neither the row nor the key: the next attempt books."""
    store, table = ledger
    with pytest.raises(RuntimeError), store.transaction_once("t2:book") as effect:
        effect.connection.execute(sa.insert(table).values(entry="deposit 20"))
        raise RuntimeError("crash before commit")
    assert _count(sql_engine, table) == 0
    assert _book(store, table, "t2:book", "deposit 20") is not None
    assert _count(sql_engine, table) == 1


@pytest.mark.parametrize("sql_engine", ["postgres"], indirect=True)
def test_sql_concurrent_duplicate_waits_and_finds_it_done(
    ledger: tuple[SQLIdempotencyStore, sa.Table], sql_engine: sa.Engine
) -> None:
    """A duplicate started while the first transaction is open blocks on the key's row, then sees it done."""
    store, table = ledger
    inside, finish = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def first() -> None:
        with store.transaction_once("t3:book") as effect:
            row = effect.connection.execute(sa.insert(table).values(entry="first").returning(table.c.id)).one()
            effect.record({"id": row.id})
            inside.set()
            assert finish.wait(30)
        results["first"] = effect.outcome

    def duplicate() -> None:
        results["duplicate"] = _book(store, table, "t3:book", "duplicate")

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(30)
    racer = threading.Thread(target=duplicate)
    racer.start()
    # Wait until PostgreSQL shows the duplicate blocked on the first transaction's lock
    # (a new transaction per look: pg_stat_activity is a snapshot within one).
    waiting = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE :pattern"
    ).bindparams(pattern=f"INSERT INTO {store.table.name}%")

    def duplicate_blocked() -> int:
        with sql_engine.connect() as conn:
            return int(conn.execute(waiting).scalar_one())

    wait_for(duplicate_blocked, 30, "the duplicate to wait on the key's row lock")
    finish.set()
    thread.join(30)
    racer.join(30)
    assert results["duplicate"] == results["first"]
    assert _count(sql_engine, table) == 1


@pytest.mark.parametrize("sql_engine", ["postgres", "sqlite"], indirect=True)
def test_sql_purge_deletes_only_expired_keys(sql_engine: sa.Engine, unique_name: str) -> None:
    """purge() removes keys past their retention, by the database's clock, and keeps the others."""
    for store in _sql_store(sql_engine, unique_name):
        run_once(store, "t:short", lambda: 1, retention=0.2)
        run_once(store, "t:long", lambda: 2, retention=600)
        assert wait_for(store.purge, 30, "the short key to expire") == 1
        assert run_once(store, "t:long", lambda: 3) == 2


def test_sql_store_refuses_unsupported_databases() -> None:
    """Only PostgreSQL and SQLite are supported: another dialect is refused at construction."""
    engine = sa.create_engine("mysql+pymysql://nobody@127.0.0.1:1/none")
    with pytest.raises(
        FencingConfigurationError, match="SQLIdempotencyStore supports PostgreSQL and SQLite, not 'mysql'"
    ):
        SQLIdempotencyStore(engine)
