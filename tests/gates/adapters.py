"""What the gate contract suite needs from each gate: a small adapter per backend.

An adapter writes integers under string keys through its gate, the way an
application would, and exposes the same operations unfenced for the negative
controls. ``spec`` is a picklable description from which a child process
builds its own adapter (its own client or engine) with :func:`open_adapter`.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
import sqlalchemy as sa
from redis.cluster import RedisCluster

from celery_fencing import (
    FencingError,
    FencingToken,
    InvalidArgumentError,
    InvalidTokenError,
    MemoryGate,
    RedisGate,
    SQLGate,
    StaleTokenError,
    token_context,
)
from celery_fencing.context import current_execution
from celery_fencing.token import Mark, validate_resource
from tests.fixtures.services import armed

# Bounded connect and lock waits, so an unreachable server fails a test fast.
SQL_CONNECT_ARGS = {
    "postgresql": {"connect_timeout": 5},
    "mysql": {"connect_timeout": 5},
    "sqlite": {"timeout": 30},
}


def make_engine(url: str) -> sa.Engine:
    """An engine with bounded connect time, as every test and child process uses."""
    dialect = sa.make_url(url).get_backend_name()
    return sa.create_engine(url, connect_args=SQL_CONNECT_ARGS[dialect], pool_size=10, max_overflow=10)


@dataclass(frozen=True)
class AdapterSpec:
    kind: str  # memory | redis | redis_cluster | sql
    url: str = ""
    namespace: str = ""  # Redis key prefix, or SQL table-name suffix


class GateAdapter:
    """Base: every backend implements these operations on integer values."""

    spec: AdapterSpec
    gate: Any
    #: Whether separate processes using the same spec share marks and data.
    shared_across_processes = True

    def claim(self, token: Any) -> None:
        self.gate.claim(token)

    def high_water(self, resource: str) -> int | None:
        value: int | None = self.gate.high_water(resource)
        return value

    def applied(self, resource: str, task_id: str) -> str | None:
        """The execution id the gate recorded for *task_id* on *resource* (exactly once), or ``None``."""
        value: str | None = self.gate.applied(resource, task_id)
        return value

    def write(self, token: Any, key: str, value: int) -> None:
        """Gated write of *value* at *key*, binding the key to the token's resource."""
        raise NotImplementedError

    def read(self, key: str) -> int | None:
        raise NotImplementedError

    def plain_write(self, key: str, value: int) -> None:
        """The unfenced write the gated one replaces (negative controls only)."""
        raise NotImplementedError

    def failing_write(self, token: FencingToken, key: str, value: int) -> None:
        """A write of *key* that fails in the storage after the token passed, where the backend can fail there."""
        raise NotImplementedError

    def append(self, token: Any, key: str, item: int) -> None:
        """Gated append of *item* to the log at *key*, in the same atomic operation as the check."""
        raise NotImplementedError

    def log(self, key: str) -> list[int]:
        """The log at *key*, in commit order."""
        raise NotImplementedError

    def close(self) -> None:
        """Release clients and engines; drop what the adapter created."""


class MemoryAdapter(GateAdapter):
    shared_across_processes = False

    def __init__(self, spec: AdapterSpec) -> None:
        self.spec = spec
        self.gate = MemoryGate()
        self._plain: dict[str, int] = {}
        # MemoryGate has no append: the adapter serialises read-then-set itself,
        # which is what a storage's atomic operation gives the other backends.
        self._append_lock = threading.Lock()

    def write(self, token: Any, key: str, value: int) -> None:
        self.gate.set(token, key, value)

    def read(self, key: str) -> int | None:
        if key in self._plain:
            return self._plain[key]
        value: int | None = self.gate.get(key)
        return value

    def plain_write(self, key: str, value: int) -> None:
        self._plain[key] = value

    def failing_write(self, token: FencingToken, key: str, value: int) -> None:
        # A dict store cannot fail after the check; the closest failure is a bad
        # key, refused before anything changes.
        self.gate.set(token, 12345, value)

    def append(self, token: Any, key: str, item: int) -> None:
        with self._append_lock:
            current = self.gate.get(key) or ()
            self.gate.set(token, key, (*current, item))

    def log(self, key: str) -> list[int]:
        return list(self.gate.get(key) or ())


class RedisAdapter(GateAdapter):
    client_class: Any = redis.Redis
    APPEND_BODY = "return redis.call('RPUSH', KEYS[1], ARGV[1])"

    def __init__(self, spec: AdapterSpec, *, decode_responses: bool = False) -> None:
        self.spec = spec
        self.client = self.client_class.from_url(
            spec.url, socket_connect_timeout=5, socket_timeout=30, decode_responses=decode_responses
        )
        self.gate = RedisGate(self.client, prefix=f"{spec.namespace}:fencing")
        self.arm(self.gate)

    def arm(self, gate: RedisGate) -> None:
        armed(gate)  # a new store: the contract's tokens are made by hand

    def key(self, key: str) -> str:
        # Data keys live under the test's namespace too, so tests never share keys.
        return f"{self.spec.namespace}:data:{key}"

    def write(self, token: Any, key: str, value: int) -> None:
        self.gate.set(token, self.key(key), value)

    def read(self, key: str) -> int | None:
        raw = self.client.get(self.key(key))
        return None if raw is None else int(raw)

    def plain_write(self, key: str, value: int) -> None:
        self.client.set(self.key(key), value)

    def failing_write(self, token: FencingToken, key: str, value: int) -> None:
        # HSET on a key holding a string fails with WRONGTYPE inside the script,
        # after the fence check passed and before anything was written.
        self.gate.hset(token, self.key(key), {"value": value})

    def append(self, token: Any, key: str, item: int) -> None:
        self.gate.eval(token, self.APPEND_BODY, [self.key(key)], [item])

    def log(self, key: str) -> list[int]:
        return [int(item) for item in self.client.lrange(self.key(key), 0, -1)]

    def close(self) -> None:
        self.client.close()

    def drop(self) -> None:
        keys = list(self.client.scan_iter(match=self.pattern(), count=1000))
        if keys:
            self.client.delete(*keys)

    def pattern(self) -> str:
        """A SCAN pattern matching every key the adapter's gate and data can create."""
        return f"{self.spec.namespace}:*"


class HashTaggedGate:
    """A RedisGate on a Redis Cluster, called with the contract suite's untagged resource names.

    In a cluster every resource needs a hash tag, and its data keys the same
    one (the suite names resources ``"acct"``, ``"Acct "``, ...). This wrapper
    puts *tag* in front of every resource on the way in (explicit tokens, the
    current execution's token, resource arguments) and strips it from every
    resource that comes back (error fields, marks), so each contract assertion
    reads as on one server. One tag for all resources of a test keeps them in
    one slot, as data keys bound to one resource but written with another's
    token must be for the gate to report the mismatch.

    Bad input reaches the gate as given: a forged token keeps its bad value
    and gets the tag, so only the value can be what is refused; a bad resource
    cannot be tagged and goes in unchanged. A refusal by the gate's slot check
    is raised as an ``AssertionError``: the wrapper tags every key, so it means
    the adapter is wrong, and it must not pass for the ``InvalidTokenError`` a
    bad-input test expects.
    """

    def __init__(self, gate: RedisGate, tag: str) -> None:
        self.gate = gate
        self.tag = tag

    def claim(self, token: Any) -> None:
        self._call(self.gate.claim, token)

    def set(self, token: Any, key: str, value: Any) -> None:
        self._call(self.gate.set, token, key, value)

    def hset(self, token: Any, key: str, mapping: dict[str, Any]) -> None:
        self._call(self.gate.hset, token, key, mapping)

    def eval(self, token: Any, script: str, keys: Sequence[str] = (), args: Sequence[Any] = ()) -> Any:
        return self._call(self.gate.eval, token, script, keys, args)

    def reset_mark(self, token: FencingToken, *, expected: Mark | None) -> None:
        tagged = None if expected is None else dataclasses.replace(expected, resource=self.tag + expected.resource)
        self._call(self.gate.reset_mark, token, expected=tagged)

    def high_water(self, resource: str) -> int | None:
        return self.gate.high_water(self.tag + resource)

    def mark(self, resource: str) -> Mark | None:
        mark = self.gate.mark(self.tag + resource)
        return None if mark is None else dataclasses.replace(mark, resource=self._untagged(mark.resource))

    def applied(self, resource: str, task_id: str) -> str | None:
        return self.gate.applied(self.tag + resource, task_id)

    def _call(self, method: Callable[..., Any], token: Any, *args: Any, **kwargs: Any) -> Any:
        with self._tagged_execution():
            try:
                return method(self._tagged_token(token), *args, **kwargs)
            except InvalidArgumentError as exc:
                # The slot check's message, as tests/gates/test_redis_cluster.py pins it.
                if "hashes to slot" in str(exc):
                    raise AssertionError(f"the adapter left a key outside its test's slot: {exc}") from exc
                raise
            except FencingError as exc:
                for name in ("resource", "token_resource", "expected_resource"):
                    if isinstance(getattr(exc, name, None), str):
                        setattr(exc, name, self._untagged(getattr(exc, name)))
                raise

    @contextmanager
    def _tagged_execution(self) -> Iterator[None]:
        """The current execution, if any, with its token tagged: its id and flags stay, so records match."""
        execution = current_execution()
        if execution is None:
            yield
            return
        with token_context(dataclasses.replace(execution, token=self._tagged_token(execution.token))):
            yield

    def _tagged_token(self, token: Any) -> Any:
        if not isinstance(token, FencingToken):
            return token
        try:
            validate_resource(token.resource)
        except InvalidTokenError:
            return token
        # Field by field, not FencingToken(...): a forged value must reach the gate unvalidated.
        tagged = object.__new__(FencingToken)
        for name in (f.name for f in dataclasses.fields(FencingToken)):
            object.__setattr__(tagged, name, getattr(token, name))
        object.__setattr__(tagged, "resource", self.tag + token.resource)
        return tagged

    def _untagged(self, resource: str) -> str:
        # Only this test's tag is stripped: any other name is reported as the gate gave it.
        return resource[len(self.tag) :] if resource.startswith(self.tag) else resource


class RedisClusterAdapter(RedisAdapter):
    """RedisGate on a Redis Cluster: one hash tag per test (its namespace) in every resource and data key."""

    client_class = RedisCluster

    def __init__(self, spec: AdapterSpec) -> None:
        self.tag = f"{{{spec.namespace}}}"
        super().__init__(spec)
        self.gate = HashTaggedGate(self.gate, self.tag)

    def arm(self, gate: RedisGate) -> None:
        gate.arm(0, resource=f"any:{self.tag}")  # in a cluster, one floor per hash tag

    def key(self, key: str) -> str:
        return f"{self.tag}:data:{key}"

    def pattern(self) -> str:
        # Every key carries the tag: data keys begin with it, the gate's keys name a tagged resource or data key.
        return f"*{self.tag}*"


class SQLAdapter(GateAdapter):
    """Transaction mode for writes, with column mode binding each data row to its resource."""

    def __init__(self, spec: AdapterSpec) -> None:
        self.spec = spec
        self.engine = make_engine(spec.url)
        suffix = spec.namespace
        self.gate = SQLGate(self.engine, table=f"hw_{suffix}", applied_table=f"ap_{suffix}")
        metadata = sa.MetaData()
        self.data = sa.Table(
            f"data_{suffix}",
            metadata,
            sa.Column("key", sa.String(100), primary_key=True),
            sa.Column("value", sa.BigInteger, nullable=False),
            sa.Column("resource", sa.String(200)),
            sa.Column("fence", sa.BigInteger),
        )
        self.log_table = sa.Table(
            f"log_{suffix}",
            metadata,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("key", sa.String(100), nullable=False),
            sa.Column("item", sa.BigInteger, nullable=False),
        )
        self.metadata = metadata

    def create(self) -> None:
        self.gate.create_schema()
        self.metadata.create_all(self.engine)

    def write(self, token: Any, key: str, value: int) -> None:
        with self.gate.transaction(token) as conn:
            checked = token if token is not None else _current()
            updated = self.gate.fenced_update(
                conn,
                self.data,
                checked,
                where=self.data.c.key == key,
                values={"value": value},
                resource_column="resource",
            )
            if not updated:
                conn.execute(
                    sa.insert(self.data).values(key=key, value=value, resource=checked.resource, fence=checked.value)
                )

    def read(self, key: str) -> int | None:
        with self.engine.connect() as conn:
            value: int | None = conn.execute(
                sa.select(self.data.c.value).where(self.data.c.key == key)
            ).scalar_one_or_none()
            return value

    def plain_write(self, key: str, value: int) -> None:
        with self.engine.begin() as conn:
            if not conn.execute(sa.update(self.data).where(self.data.c.key == key).values(value=value)).rowcount:
                conn.execute(sa.insert(self.data).values(key=key, value=value))

    def failing_write(self, token: FencingToken, key: str, value: int) -> None:
        with self.gate.transaction(token) as conn:
            conn.execute(sa.update(self.data).where(self.data.c.key == key).values(value=value, fence=token.value))
            raise RuntimeError("the task failed after its write, before COMMIT")

    def append(self, token: Any, key: str, item: int) -> None:
        with self.gate.transaction(token) as conn:
            conn.execute(sa.insert(self.log_table).values(key=key, item=item))

    def log(self, key: str) -> list[int]:
        # Ids are assigned in insert order; the mark's row lock makes insert
        # order the commit order for one resource's writers.
        table = self.log_table
        with self.engine.connect() as conn:
            return list(conn.execute(sa.select(table.c.item).where(table.c.key == key).order_by(table.c.id)).scalars())

    def close(self) -> None:
        self.engine.dispose()

    def drop(self) -> None:
        self.metadata.drop_all(self.engine)
        self.gate.table.drop(self.engine, checkfirst=True)
        self.gate.applied_table.drop(self.engine, checkfirst=True)
        self.engine.dispose()


def _current() -> FencingToken:
    from celery_fencing import current_token

    token = current_token()
    assert token is not None
    return token


def open_adapter(spec: AdapterSpec) -> GateAdapter:
    if spec.kind == "memory":
        return MemoryAdapter(spec)
    if spec.kind == "redis":
        return RedisAdapter(spec)
    if spec.kind == "redis_cluster":
        return RedisClusterAdapter(spec)
    if spec.kind == "sql":
        return SQLAdapter(spec)
    raise ValueError(spec.kind)


@dataclass
class WriterReport:
    accepted: list[int] = field(default_factory=list)
    #: (token, high_water reported by the refusal)
    rejected: list[tuple[int, int]] = field(default_factory=list)


def append_random(adapter: GateAdapter, resource: str, key: str, seed: int, count: int) -> WriterReport:
    """Append *count* random tokens of *resource*, recording which were accepted."""
    rng = random.Random(seed)
    report = WriterReport()
    for _ in range(count):
        value = rng.randint(1, 5000)
        try:
            adapter.append(FencingToken(resource, value), key, value)
        except StaleTokenError as exc:
            assert exc.high_water is not None
            report.rejected.append((value, exc.high_water))
        else:
            report.accepted.append(value)
    return report


@contextmanager
def reporting_failure(adapter: GateAdapter, queue: Any) -> Iterator[GateAdapter]:
    """A child process's work on *adapter*: a failure is put on *queue* as its repr (so the parent sees it
    instead of waiting out its timeout) and raised again; the adapter is closed either way."""
    try:
        yield adapter
    except BaseException as exc:
        queue.put(repr(exc))
        raise
    finally:
        adapter.close()


def append_and_report(
    adapter: GateAdapter, resource: str, key: str, seed: int, count: int, barrier: Any, queue: Any
) -> None:
    """A child's part, on its own *adapter*: wait for the others at *barrier*, append random tokens, put
    ``(accepted, rejected)`` on *queue*."""
    with reporting_failure(adapter, queue):
        barrier.wait(timeout=60)
        report = append_random(adapter, resource, key, seed, count)
        queue.put((report.accepted, report.rejected))


def child_append(spec: AdapterSpec, resource: str, key: str, seed: int, count: int, barrier: Any, queue: Any) -> None:
    """Child-process entry point: build an adapter, wait for the others, append, report."""
    append_and_report(open_adapter(spec), resource, key, seed, count, barrier, queue)
