"""What does a gate cost? The median latency of each gated write against the plain write it replaces.

Usage::

    python benchmarks/gates.py [--rounds 20] [--count 200] [--stores redis,postgres,mariadb,sqlite] [--check]

Comparisons, each printed as two medians and their ratio (gated / plain):

* Redis: ``RedisGate.set`` (one EVALSHA) against a plain ``SET``, without and
  with the exactly-once record (each call then a new task's execution, as a
  fenced task's write is: the script also writes the record key).
* PostgreSQL, MariaDB, SQLite, column mode: ``SQLGate.fenced_update`` against
  the plain single-row ``UPDATE`` it replaces, each in its own transaction
  (the write as an application commits it).
* The same three, transaction mode: a ``gate.transaction()`` holding that
  ``UPDATE`` against ``engine.begin()`` holding the same ``UPDATE``.
* Both SQL modes again with the exactly-once record written (``, once``):
  each call a new task's execution, made before timing, so the gate also
  writes the applied record in the write's transaction.
* The floor of such a record, informative: the plain ``UPDATE`` with a plain
  ``INSERT`` of one new row in its transaction, against the ``UPDATE`` alone.
  No gate that keeps one row per applied task id writes less.

The subjects compared are measured together: each round makes ``count``
turns, calling every subject once per turn, and the round after rotates which
goes first, so drift on a shared machine (other test suites, caches, CPU
frequency) hits every side alike. The first
calls warm connections, scripts and statement caches and are not counted.
Servers are the test suite's (FENCING_TEST_REDIS_URL, FENCING_TEST_POSTGRES_URL,
FENCING_TEST_MARIADB_URL); every key and table is private to the run and
removed at the end. ``--check`` exits 1 when a ratio misses its target.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
import sqlalchemy as sa

# Run as a script from anywhere: make the repository root importable.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import PROGRESS, show_progress  # noqa: E402
from celery_fencing import FencingToken, RedisGate, SQLGate, token_context  # noqa: E402
from celery_fencing.context import Execution  # noqa: E402

REDIS_URL = os.environ.get("FENCING_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
SQL_URLS = {
    "postgres": os.environ.get("FENCING_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("FENCING_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
}
STORES = ("redis", "postgres", "mariadb", "sqlite")
WARMUP = 50

# Done-when targets of issue 3, as gated / plain ratios of the medians.
TARGETS = {"redis set": 1.10, "column mode": 1.15, "transaction": 1.5}


@dataclass
class Comparison:
    name: str
    #: Subject names: the gated write and the plain write it replaces.
    gated: str
    plain: str
    #: None for an informative line without a target.
    target: float | None


@dataclass
class Group:
    """Subjects measured together, so every ratio compares samples from the same rounds."""

    subjects: dict[str, Callable[[], object]]
    comparisons: list[Comparison]


def measure(
    subjects: dict[str, Callable[[], object]], rounds: int, count: int, warmup: int, label: str = ""
) -> dict[str, float]:
    """Return each subject's median latency in microseconds, calling the subjects in turn.

    Logs one progress line per round: *label* and each subject's median of the round.
    """
    for call in subjects.values():
        for _ in range(warmup):
            call()
    names = list(subjects)
    samples: dict[str, list[int]] = {name: [] for name in names}
    clock = time.perf_counter_ns
    for round_no in range(rounds):
        # Rotate which subject goes first, so none always follows the same neighbour.
        shift = round_no % len(names)
        order = [(subjects[name], samples[name]) for name in names[shift:] + names[:shift]]
        for _ in range(count):
            for call, into in order:
                started = clock()
                call()
                into.append(clock() - started)
        medians = (f"{name} {statistics.median(samples[name][-count:]) / 1000:.1f} us" for name in names)
        PROGRESS.info("gates %s round %d/%d: %s", label, round_no + 1, rounds, ", ".join(medians))
    return {name: statistics.median(values) / 1000 for name, values in samples.items()}


def executions(token: FencingToken, run: str, calls: int) -> Iterator[Execution]:
    """One new task's execution per call, made before the timing starts (a task makes its own once, at start)."""
    return iter([Execution(token, task_id=f"{run}-task-{n}", once=True, once_retention=3600) for n in range(calls)])


@contextmanager
def redis_group(run: str, calls: int) -> Iterator[Group]:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5)
    gate = RedisGate(client, prefix=f"{run}:fencing")
    gate.arm(0)  # a private, new store
    token = FencingToken(f"{run}:{{acct}}", 5)
    gated_key, plain_key = f"{run}:{{acct}}:gated", f"{run}:{{acct}}:plain"
    once_key = f"{run}:{{acct}}:once"
    stream = executions(token, run, calls)

    def once_set() -> None:
        with token_context(next(stream)):
            gate.set(token, once_key, "110")

    # The floor no gate can go below: invoking any Lua script with the same
    # keys and arguments (script setup in Redis, and the longer command to
    # pack and parse), against the same SET.
    empty = client.register_script("return 1")
    empty_keys = [gate.mark_key(token.resource), gate.owner_key(gated_key), gated_key]
    empty_args = ["00000000000000000005", token.resource, "110"]
    try:
        yield Group(
            {
                "gated set": lambda: gate.set(token, gated_key, "110"),
                "gated set, once": once_set,
                "SET": lambda: client.set(plain_key, "110"),
                "empty script": lambda: empty(keys=empty_keys, args=empty_args),
            },
            [
                Comparison("redis: RedisGate.set vs SET", "gated set", "SET", TARGETS["redis set"]),
                Comparison("redis: RedisGate.set, exactly once vs SET", "gated set, once", "SET", TARGETS["redis set"]),
                Comparison("redis, floor: EVALSHA 'return 1' vs SET", "empty script", "SET", None),
            ],
        )
    finally:
        keys = list(client.scan_iter(match=f"{run}:*"))
        if keys:
            client.delete(*keys)
        client.close()


@contextmanager
def sql_groups(store: str, url: str, run: str, calls: int) -> Iterator[list[Group]]:
    engine = sa.create_engine(url, connect_args={"timeout": 30} if url.startswith("sqlite") else {"connect_timeout": 5})
    gate = SQLGate(engine, table=f"{run}_hw", applied_table=f"{run}_applied")
    accounts = sa.Table(
        f"{run}_accounts",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("balance", sa.BigInteger, nullable=False),
        sa.Column("fence", sa.BigInteger),
    )
    # The floor of any exactly-once record kept as a row: one more INSERT in the write's transaction.
    rows = sa.Table(f"{run}_rows", sa.MetaData(), sa.Column("task_id", sa.String(64), primary_key=True))
    gate.create_schema()
    accounts.create(engine)
    rows.create(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(accounts), [{"id": n, "balance": 0} for n in (1, 2, 3, 4, 5, 6)])
    token = FencingToken("acct:1", 5)
    counter = iter(range(1, 1 << 62))

    # Each call writes a new balance, as a real deposit would; the WHERE and
    # values are built per call on every side, as application code does. Each
    # subject has its own row, so none waits for another's lock.
    def column_mode() -> None:
        with engine.begin() as conn:
            gate.fenced_update(conn, accounts, token, where=accounts.c.id == 1, values={"balance": next(counter)})

    def plain_update() -> None:
        with engine.begin() as conn:
            conn.execute(sa.update(accounts).where(accounts.c.id == 2).values(balance=next(counter)))

    def plain_update_and_row() -> None:
        with engine.begin() as conn:
            conn.execute(sa.update(accounts).where(accounts.c.id == 6).values(balance=next(counter)))
            conn.execute(sa.insert(rows).values(task_id=uuid.uuid4().hex))

    def guarded_transaction() -> None:
        with gate.transaction(token) as conn:
            conn.execute(sa.update(accounts).where(accounts.c.id == 3).values(balance=next(counter)))

    # Exactly once, as a fenced task writes: each call a new task's execution, so
    # the gate also writes its applied record in the same transaction. Rows 4, 5.
    stream = executions(token, run, 3 * calls)

    def column_mode_once() -> None:
        with token_context(next(stream)), engine.begin() as conn:
            gate.fenced_update(conn, accounts, token, where=accounts.c.id == 4, values={"balance": next(counter)})

    def guarded_transaction_once() -> None:
        with token_context(next(stream)), gate.transaction(token) as conn:
            conn.execute(sa.update(accounts).where(accounts.c.id == 5).values(balance=next(counter)))

    # Informative: the two statements alone, inside one open transaction, so
    # that COMMIT's flush to disk does not dilute the difference.
    held = engine.connect()
    held.begin()

    def column_mode_statement() -> None:
        gate.fenced_update(held, accounts, token, where=accounts.c.id == 1, values={"balance": next(counter)})

    def column_mode_statement_once() -> None:
        with token_context(next(stream)):
            gate.fenced_update(held, accounts, token, where=accounts.c.id == 4, values={"balance": next(counter)})

    def plain_statement() -> None:
        held.execute(sa.update(accounts).where(accounts.c.id == 2).values(balance=next(counter)))

    try:
        yield [
            Group(
                {
                    "column mode": column_mode,
                    "column mode, once": column_mode_once,
                    "UPDATE": plain_update,
                    "UPDATE + INSERT": plain_update_and_row,
                    "transaction": guarded_transaction,
                    "transaction, once": guarded_transaction_once,
                },
                [
                    Comparison(f"{store}: fenced_update vs UPDATE", "column mode", "UPDATE", TARGETS["column mode"]),
                    Comparison(
                        f"{store}: fenced_update, once vs UPDATE", "column mode, once", "UPDATE", TARGETS["column mode"]
                    ),
                    Comparison(
                        f"{store}: gate.transaction vs engine.begin", "transaction", "UPDATE", TARGETS["transaction"]
                    ),
                    Comparison(
                        f"{store}: gate.transaction, once vs begin",
                        "transaction, once",
                        "UPDATE",
                        TARGETS["transaction"],
                    ),
                    Comparison(f"{store}, floor: UPDATE + INSERT vs UPDATE", "UPDATE + INSERT", "UPDATE", None),
                ],
            ),
            Group(
                {
                    "column mode": column_mode_statement,
                    "column mode, once": column_mode_statement_once,
                    "UPDATE": plain_statement,
                },
                [
                    Comparison(f"{store}, statements alone, no COMMIT", "column mode", "UPDATE", None),
                    Comparison(f"{store}, once, statements alone", "column mode, once", "UPDATE", None),
                ],
            ),
        ]
    finally:
        held.rollback()
        held.close()
        accounts.drop(engine)
        rows.drop(engine)
        gate.table.drop(engine)
        gate.applied_table.drop(engine)
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="rounds, alternating which subject goes first")
    parser.add_argument("--count", type=int, default=200, help="turns per round (one call of each subject)")
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated subset of " + ",".join(STORES))
    parser.add_argument("--warmup", type=int, default=WARMUP, help="uncounted calls per subject first")
    parser.add_argument("--check", action="store_true", help="exit 1 when a ratio misses its target")
    args = parser.parse_args(argv)
    stores = [s for s in args.stores.split(",") if s]
    if args.rounds < 1 or args.count < 1 or args.warmup < 0 or not set(stores) <= set(STORES) or not stores:
        parser.error(f"--rounds and --count must be >= 1; --stores a subset of {','.join(STORES)}")

    show_progress()
    run = "bench" + uuid.uuid4().hex[:8]
    missed = []
    print(f"{'comparison':44} {'gated us':>10} {'plain us':>10} {'ratio':>7} {'target':>7}")
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="fencing-bench-"))
        for store in stores:
            if store == "redis":
                groups = [stack.enter_context(redis_group(run, args.warmup + args.rounds * args.count))]
            else:
                url = SQL_URLS.get(store) or f"sqlite:///{Path(tmp) / 'bench.db'}"
                groups = stack.enter_context(sql_groups(store, url, run, args.warmup + args.rounds * args.count))
            for number, group in enumerate(groups, 1):
                label = f"{store} ({number}/{len(groups)})"
                medians = measure(group.subjects, args.rounds, args.count, args.warmup, label)
                for comparison in group.comparisons:
                    gated, plain = medians[comparison.gated], medians[comparison.plain]
                    ratio = gated / plain
                    if comparison.target is None:
                        target, verdict = "", "(info)"
                    else:
                        target = f"{comparison.target:6.2f}x"
                        verdict = "ok" if ratio <= comparison.target else "MISSED"
                    if verdict == "MISSED":
                        missed.append(comparison.name)
                    print(f"{comparison.name:44} {gated:10.1f} {plain:10.1f} {ratio:7.3f} {target:>7} {verdict}")
                    sys.stdout.flush()
    print(f"rounds={args.rounds} count={args.count}; medians of {args.rounds * args.count} calls per subject")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
