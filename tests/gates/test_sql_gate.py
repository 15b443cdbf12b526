"""SQLGate specifics on PostgreSQL, MariaDB and SQLite: exactness, schema, guard, column mode, locks, failures."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from celery_fencing import (
    AlreadyAppliedError,
    FencingConfigurationError,
    FencingToken,
    GateUnavailableError,
    InvalidArgumentError,
    InvalidTokenError,
    ResourceMismatchError,
    SQLGate,
    StaleTokenError,
)
from celery_fencing.context import Execution, token_context
from celery_fencing.gates.sql import applied_table, high_water_table
from celery_fencing.token import Mark

from .adapters import make_engine

T = FencingToken

SQL_KINDS = ["postgres", "mariadb", "sqlite"]


@pytest.fixture(params=SQL_KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gate.db'}"
    value: str = request.getfixturevalue(f"{request.param}_url")
    return value


@pytest.fixture
def engine(url: str) -> Iterator[sa.Engine]:
    engine = make_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture
def gate(engine: sa.Engine, unique_name: str) -> Iterator[SQLGate]:
    gate = SQLGate(engine, table=f"hw_{unique_name}", applied_table=f"ap_{unique_name}")
    gate.create_schema()
    try:
        yield gate
    finally:
        gate.table.drop(engine, checkfirst=True)
        gate.applied_table.drop(engine, checkfirst=True)


@pytest.fixture
def accounts(engine: sa.Engine, unique_name: str) -> Iterator[sa.Table]:
    """The user's own table, with a fence column for column mode."""
    table = sa.Table(
        f"accounts_{unique_name}",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("balance", sa.BigInteger, nullable=False),
        sa.Column("owner", sa.String(200)),
        sa.Column("fence", sa.BigInteger),
    )
    table.create(engine)
    try:
        with engine.begin() as conn:
            rows = [{"id": 1, "balance": 100, "owner": "acct:1"}, {"id": 2, "balance": 50, "owner": None}]
            conn.execute(sa.insert(table), rows)
        yield table
    finally:
        table.drop(engine)


def _balance(engine: sa.Engine, accounts: sa.Table, row: int = 1) -> tuple[int, int | None]:
    with engine.connect() as conn:
        balance, fence = conn.execute(sa.select(accounts.c.balance, accounts.c.fence).where(accounts.c.id == row)).one()
        return balance, fence


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# Exactness and schema ------------------------------------------------------------------


def test_tokens_are_exact_beyond_2_53(gate: SQLGate) -> None:
    """BIGINT marks compare exactly: 2**53 is refused after 2**53 + 1, and 2**63 - 1 is stored whole."""
    gate.claim(T("r", 2**53 + 1))
    with pytest.raises(StaleTokenError) as info:
        gate.claim(T("r", 2**53))
    assert info.value.high_water == 2**53 + 1
    gate.claim(T("r", 2**63 - 1))
    assert gate.high_water("r") == 2**63 - 1
    with pytest.raises(StaleTokenError):
        gate.claim(T("r", 2**63 - 2))


def test_create_schema_is_idempotent(gate: SQLGate, engine: sa.Engine) -> None:
    """create_schema can run again (and from another gate on the same table) without touching the marks."""
    gate.claim(T("r", 3))
    gate.create_schema()
    SQLGate(engine, table=gate.table.name).create_schema()
    assert gate.high_water("r") == 3


def test_tables_in_a_named_schema_fence_and_reset(engine: sa.Engine, unique_name: str) -> None:
    """The mark statements qualify the table with its schema: claims, refusals and the operator's reset there."""
    schema = {"postgresql": f"s_{unique_name}", "sqlite": "main"}.get(engine.dialect.name, engine.url.database)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(sa.schema.CreateSchema(schema))
    gate = SQLGate(engine, table=f"hw_{unique_name}", applied_table=f"ap_{unique_name}", schema=schema)
    gate.create_schema()
    try:
        gate.claim(T("acct", 5, "zk-1"))
        with pytest.raises(StaleTokenError):
            gate.claim(T("acct", 4, "zk-1"))
        assert gate.mark("acct") == Mark("acct", 5, "zk-1")
        gate.reset_mark(T("acct", 3, "zk-2"), expected=Mark("acct", 5, "zk-1"))
        assert gate.mark("acct") == Mark("acct", 3, "zk-2")
        with pytest.raises(StaleTokenError):
            gate.reset_mark(T("acct", 2, "zk-2"), expected=Mark("acct", 5, "zk-1"))
        gate.reset_mark(T("new", 7, "zk-2"), expected=None)
        assert gate.high_water("new") == 7
    finally:
        gate.table.drop(engine, checkfirst=True)
        gate.applied_table.drop(engine, checkfirst=True)
        if engine.dialect.name == "postgresql":
            with engine.begin() as conn:
                conn.execute(sa.schema.DropSchema(schema))


def test_tables_named_with_reserved_words_work_on_an_engine_built_before_it_connects(url: str) -> None:
    """The gate's SQL is written when the gate is built; it quotes every name, whatever the dialect reserves.

    A ``mysql://`` engine learns it talks to MariaDB, whose reserved words are
    more (``offset``, ``raise``), only on connecting: a name quoted only
    when reserved was left bare, and every statement failed (found in review).
    """
    engine = make_engine(url)  # not connected yet
    gate = SQLGate(engine, table="offset", applied_table="raise")
    try:
        gate.create_schema()
        gate.claim(T("acct", 5, "zk-1"))
        with pytest.raises(StaleTokenError):
            gate.claim(T("acct", 4, "zk-1"))
        with token_context(_once(6, resource="acct")), gate.transaction():
            pass
        assert gate.applied("acct", "task-1") is not None
        assert gate.mark("acct") == Mark("acct", 6, "zk-1")
    finally:
        gate.table.drop(engine, checkfirst=True)
        gate.applied_table.drop(engine, checkfirst=True)
        engine.dispose()


def test_table_layout(gate: SQLGate) -> None:
    """The mark table has a string primary key resource, a NOT NULL BIGINT token and a range CHECK."""
    table = gate.table
    assert [c.name for c in table.primary_key.columns] == ["resource"]
    assert isinstance(table.c.token.type, sa.BigInteger)
    assert table.c.token.nullable is False
    checks = [c for c in table.constraints if isinstance(c, sa.CheckConstraint)]
    assert [str(c.sqltext) for c in checks] == ["token >= 1 AND token <= 9223372036854775807"]


def test_high_water_table_joins_the_applications_metadata() -> None:
    """high_water_table defines the table in the caller's MetaData (for autogenerate), once."""
    metadata = sa.MetaData()
    table = high_water_table(metadata)
    assert metadata.tables["fencing_high_water"] is table
    assert high_water_table(metadata) is table
    ddl = str(sa.schema.CreateTable(table).compile(dialect=sa.dialects.mysql.dialect()))
    assert "resource VARBINARY(800) NOT NULL" in ddl


@pytest.mark.parametrize("bad", [0, -5])
def test_check_constraint_refuses_out_of_range_marks(gate: SQLGate, engine: sa.Engine, bad: int) -> None:
    """The CHECK constraint refuses a mark below 1 written around the gate."""
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        conn.execute(sa.insert(gate.table).values(resource="r", token=bad))
    assert gate.high_water("r") is None


# Transaction mode ------------------------------------------------------------------------


def test_transaction_commits_data_with_the_mark(gate: SQLGate, engine: sa.Engine, accounts: sa.Table) -> None:
    """Writes made in gate.transaction() commit together with the new mark."""
    with gate.transaction(T("acct:1", 5)) as conn:
        conn.execute(sa.update(accounts).where(accounts.c.id == 1).values(balance=110))
    assert _balance(engine, accounts)[0] == 110
    assert gate.high_water("acct:1") == 5


def test_callers_own_errors_propagate_unwrapped(gate: SQLGate, engine: sa.Engine, accounts: sa.Table) -> None:
    """A constraint error of the caller's statement propagates as is and rolls back the mark too."""
    with pytest.raises(sa.exc.IntegrityError), gate.transaction(T("acct:1", 5)) as conn:
        conn.execute(sa.update(accounts).where(accounts.c.id == 1).values(balance=110))
        conn.execute(sa.insert(accounts).values(id=1, balance=0))
    assert _balance(engine, accounts)[0] == 100
    assert gate.high_water("acct:1") is None


def test_guard_inside_the_callers_transaction(gate: SQLGate, engine: sa.Engine, accounts: sa.Table) -> None:
    """guard() advances the mark in a transaction the caller holds; the caller's COMMIT publishes both."""
    with engine.begin() as conn:
        gate.guard(conn, T("acct:1", 5))
        conn.execute(sa.update(accounts).where(accounts.c.id == 1).values(balance=110))
    assert _balance(engine, accounts)[0] == 110
    assert gate.high_water("acct:1") == 5

    gate.claim(T("acct:1", 9))
    with pytest.raises(StaleTokenError) as info, engine.begin() as conn:
        gate.guard(conn, T("acct:1", 8))
        conn.execute(sa.update(accounts).where(accounts.c.id == 1).values(balance=999))
    assert info.value.high_water == 9
    assert _balance(engine, accounts)[0] == 110


def test_guard_in_an_orm_session(gate: SQLGate, engine: sa.Engine, accounts: sa.Table) -> None:
    """guard() works on session.connection(), inside the session's transaction."""
    with Session(engine) as session, session.begin():
        gate.guard(session.connection(), T("acct:1", 5))
        session.execute(sa.update(accounts).where(accounts.c.id == 1).values(balance=120))
    assert _balance(engine, accounts)[0] == 120
    assert gate.high_water("acct:1") == 5


def test_guard_needs_a_transaction(gate: SQLGate, engine: sa.Engine) -> None:
    """guard() on a connection outside a transaction is refused before touching the mark."""
    with engine.connect() as conn, pytest.raises(FencingConfigurationError):
        gate.guard(conn, T("r", 5))
    assert gate.high_water("r") is None


def test_row_lock_serialises_writers(gate: SQLGate, url: str, unique_name: str) -> None:
    """While a guarded transaction is open, other writers of the resource wait for its COMMIT, equal token too."""
    impatient = _impatient_engine(url)
    other = SQLGate(impatient, table=gate.table.name)
    try:
        with gate.transaction(T("r", 5)):
            for token in (T("r", 6), T("r", 5)):
                with pytest.raises(GateUnavailableError) as info:
                    other.claim(token)
                assert isinstance(info.value.__cause__, sa.exc.OperationalError)
        other.claim(T("r", 6))
        assert gate.high_water("r") == 6
    finally:
        impatient.dispose()


def _impatient_engine(url: str) -> sa.Engine:
    """An engine whose lock waits give up quickly (a server-side timeout, not a sleep)."""
    backend = sa.make_url(url).get_backend_name()
    connect_args: dict[str, Any]
    if backend == "postgresql":
        connect_args = {"connect_timeout": 5, "options": "-c lock_timeout=200"}
    elif backend == "mysql":
        connect_args = {"connect_timeout": 5, "init_command": "SET SESSION innodb_lock_wait_timeout = 1"}
    else:
        connect_args = {"timeout": 0.2}
    return sa.create_engine(url, connect_args=connect_args)


@pytest.mark.parametrize("kind", ["postgres", "mariadb"])
def test_transaction_killed_before_commit_leaves_nothing(
    request: pytest.FixtureRequest, kind: str, unique_name: str
) -> None:
    """A guarded transaction whose server connection is killed mid-way commits neither data nor mark."""
    url: str = request.getfixturevalue(f"{kind}_url")
    engine = make_engine(url)
    admin = make_engine(url)
    gate = SQLGate(engine, table=f"hw_{unique_name}")
    gate.create_schema()
    data = sa.Table(f"kill_{unique_name}", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    data.create(engine)
    own_id = "SELECT pg_backend_pid()" if kind == "postgres" else "SELECT CONNECTION_ID()"
    kill = "SELECT pg_terminate_backend({})" if kind == "postgres" else "KILL {}"
    try:
        gate.claim(T("r", 1))
        with pytest.raises(GateUnavailableError), gate.transaction(T("r", 2)) as conn:
            conn.execute(sa.insert(data).values(id=1))
            backend = conn.exec_driver_sql(own_id).scalar_one()
            with admin.connect() as killer:
                killer.exec_driver_sql(kill.format(int(backend)))
        assert gate.high_water("r") == 1
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(data)).scalar_one() == 0
    finally:
        data.drop(engine)
        gate.table.drop(engine)
        engine.dispose()
        admin.dispose()


# Column mode -----------------------------------------------------------------------------


def test_column_mode_is_one_update(gate: SQLGate, engine: sa.Engine, accounts: sa.Table) -> None:
    """An accepted fenced_update is a single UPDATE statement that sets the values and the fence."""
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    with engine.begin() as conn:
        sa.event.listen(conn, "before_cursor_execute", record)
        count = gate.fenced_update(conn, accounts, T("acct:1", 5), where=accounts.c.id == 1, values={"balance": 110})
    assert count == 1
    assert len(statements) == 1 and statements[0].lstrip().upper().startswith("UPDATE")
    assert _balance(engine, accounts) == (110, 5)


def test_column_mode_fences_the_row(gate: SQLGate, engine: sa.Engine, accounts: sa.Table) -> None:
    """NULL fence counts as never fenced, equal and higher tokens pass, a lower one is refused with the row's fence."""
    where = accounts.c.id == 1
    with engine.begin() as conn:
        assert gate.fenced_update(conn, accounts, T("acct:1", 5), where=where, values={"balance": 110}) == 1
        assert gate.fenced_update(conn, accounts, T("acct:1", 5), where=where, values={"balance": 110}) == 1
        assert gate.fenced_update(conn, accounts, T("acct:1", 9), where=where, values={"balance": 120}) == 1
    with engine.begin() as conn, pytest.raises(StaleTokenError) as info:
        gate.fenced_update(conn, accounts, T("acct:1", 8), where=where, values={"balance": 999})
    assert (info.value.resource, info.value.token, info.value.high_water) == ("acct:1", 8, 9)
    assert _balance(engine, accounts) == (120, 9)


def test_column_mode_reports_a_missing_row(gate: SQLGate, engine: sa.Engine, accounts: sa.Table) -> None:
    """No row matching where returns 0: not stale, nothing written."""
    with engine.begin() as conn:
        assert gate.fenced_update(conn, accounts, T("x", 5), where=accounts.c.id == 404, values={"balance": 1}) == 0


def test_column_mode_binds_rows_to_their_resource(gate: SQLGate, engine: sa.Engine, accounts: sa.Table) -> None:
    """With resource_column, a token of another resource cannot write the row, however large."""
    where = accounts.c.id == 1
    with engine.begin() as conn, pytest.raises(ResourceMismatchError) as info:
        gate.fenced_update(
            conn, accounts, T("acct:2", 10**12), where=where, values={"balance": 0}, resource_column="owner"
        )
    assert (info.value.token_resource, info.value.expected_resource) == ("acct:2", "acct:1")
    with engine.begin() as conn:
        count = gate.fenced_update(
            conn, accounts, T("acct:1", 3), where=where, values={"balance": 130}, resource_column="owner"
        )
    assert count == 1
    assert _balance(engine, accounts) == (130, 3)


def test_column_mode_claim_with_no_values(gate: SQLGate, engine: sa.Engine, accounts: sa.Table) -> None:
    """values={} raises the row's fence alone: the column-mode claim before a read."""
    where = accounts.c.id == 2
    with engine.begin() as conn:
        gate.fenced_update(conn, accounts, T("acct:2", 9), where=where, values={})
    with engine.begin() as conn, pytest.raises(StaleTokenError):
        gate.fenced_update(conn, accounts, T("acct:2", 7), where=where, values={"balance": 60})
    assert _balance(engine, accounts, row=2) == (50, 9)


def test_column_mode_refuses_bad_options(gate: SQLGate, engine: sa.Engine, accounts: sa.Table) -> None:
    """Setting the fence yourself, an unknown column, or a bad token is refused before any statement."""
    where = accounts.c.id == 1
    with engine.begin() as conn:
        with pytest.raises(FencingConfigurationError):
            gate.fenced_update(conn, accounts, T("acct:1", 5), where=where, values={"fence": 1})
        with pytest.raises(FencingConfigurationError):
            gate.fenced_update(conn, accounts, T("acct:1", 5), where=where, values={}, fence_column="nope")
        with pytest.raises(InvalidTokenError):
            gate.fenced_update(conn, accounts, 5, where=where, values={"balance": 1})  # type: ignore[arg-type]
    assert _balance(engine, accounts) == (100, None)


# Failures -------------------------------------------------------------------------------


def _unreachable_urls(tmp_path: Path) -> list[str]:
    port = _closed_port()
    return [
        f"postgresql+psycopg://postgres@127.0.0.1:{port}/test",
        f"mysql+pymysql://root@127.0.0.1:{port}/test",
        f"sqlite:///{tmp_path / 'no-such-dir' / 'gate.db'}",
    ]


def _gate_calls(gate: SQLGate) -> list[Any]:
    return [lambda: gate.claim(T("r", 1)), lambda: gate.high_water("r"), gate.create_schema]


def test_unreachable_database_is_gate_unavailable_fast(tmp_path: Path) -> None:
    """A refused connection raises GateUnavailableError, driver error chained, in well under the connect timeout."""
    for url in _unreachable_urls(tmp_path):
        engine = make_engine(url)
        try:
            for call in _gate_calls(SQLGate(engine)):
                started = time.monotonic()
                with pytest.raises(GateUnavailableError) as info:
                    call()
                assert time.monotonic() - started < 3, url
                assert isinstance(info.value.__cause__, sa.exc.OperationalError), url
        finally:
            engine.dispose()


def test_bad_input_is_refused_before_any_io(tmp_path: Path) -> None:
    """Bad tokens raise InvalidTokenError even when the database is unreachable: nothing was sent."""
    for url in _unreachable_urls(tmp_path):
        gate = SQLGate(make_engine(url))
        with pytest.raises(InvalidTokenError):
            gate.claim(34.5)  # type: ignore[arg-type]
        with pytest.raises(InvalidTokenError):
            gate.transaction("35")  # type: ignore[arg-type]
        with pytest.raises(InvalidTokenError):
            gate.high_water("")


def test_missing_mark_table_is_gate_unavailable(engine: sa.Engine, unique_name: str) -> None:
    """A gate whose table was never created fails with GateUnavailableError, not a driver error."""
    gate = SQLGate(engine, table=f"missing_{unique_name}")
    with pytest.raises(GateUnavailableError):
        gate.claim(T("r", 1))


def test_unsupported_database_is_refused() -> None:
    """Only PostgreSQL, MySQL/MariaDB and SQLite are supported; others fail at construction."""
    engine = sa.create_mock_engine(sa.make_url("oracle+oracledb://"), executor=lambda *a, **k: None)
    with pytest.raises(
        FencingConfigurationError, match="SQLGate supports PostgreSQL, MySQL, MariaDB and SQLite, not 'oracle'"
    ):
        SQLGate(engine)  # type: ignore[arg-type]


# Exactly once ------------------------------------------------------------------------------


def _once(value: int, task_id: str = "task-1", resource: str = "acct:1", retention: float = 60.0) -> Any:
    """An execution of *task_id* with exactly-once on, holding token *value*, for ``with token_context(...)``."""
    return Execution(T(resource, value), task_id=task_id, once=True, once_retention=retention)


def _expire_records(gate: SQLGate, engine: sa.Engine, task_id: str) -> None:
    table = gate.applied_table
    with engine.begin() as conn:
        conn.execute(sa.update(table).where(table.c.task_id == task_id).values(expires_at=table.c.expires_at - 3600))


def test_prune_applied_deletes_expired_records_and_keeps_live_ones(gate: SQLGate, engine: sa.Engine) -> None:
    """Expired rows go (bounded by limit, in rounds), live ones stay, and a task whose record was pruned may apply."""
    for number in range(5):
        with token_context(_once(number + 1, f"old-{number}")), gate.transaction():
            pass
    with token_context(_once(10, "live")), gate.transaction():
        pass
    for number in range(5):
        _expire_records(gate, engine, f"old-{number}")
    assert gate.applied("acct:1", "old-0") is None  # expired: absent before any prune
    assert gate.prune_applied(limit=3) == 3
    assert gate.prune_applied(limit=3) == 2
    assert gate.prune_applied() == 0
    with engine.connect() as conn:
        left = conn.execute(sa.select(gate.applied_table.c.task_id)).scalars().all()
    assert left == ["live"]
    assert gate.applied("acct:1", "live") is not None
    with pytest.raises(InvalidArgumentError):
        gate.prune_applied(limit=0)


def test_applied_record_commits_with_the_transaction(gate: SQLGate, engine: sa.Engine, accounts: sa.Table) -> None:
    """A transaction that rolls back leaves no record; the task id may then apply."""
    execution = _once(5)
    with pytest.raises(RuntimeError), token_context(execution), gate.transaction() as conn:
        conn.execute(sa.update(accounts).where(accounts.c.id == 1).values(balance=1))
        raise RuntimeError("the task failed before COMMIT")
    assert gate.applied("acct:1", "task-1") is None
    with token_context(execution), gate.transaction() as conn:
        conn.execute(sa.update(accounts).where(accounts.c.id == 1).values(balance=2))
    assert gate.applied("acct:1", "task-1") == execution.execution_id


def test_column_mode_records_and_refuses_a_second_execution(
    gate: SQLGate, engine: sa.Engine, accounts: sa.Table
) -> None:
    """fenced_update records in the caller's transaction; another execution's UPDATE is refused and rolls back.

    The refusal comes after the UPDATE ran: the exception must leave ``engine.begin()`` to roll it back.
    """
    where = accounts.c.id == 1
    first = _once(5)
    with token_context(first), engine.begin() as conn:
        assert gate.fenced_update(conn, accounts, None, where=where, values={"balance": 110}) == 1
        assert gate.fenced_update(conn, accounts, None, where=where, values={"balance": 111}) == 1
    assert gate.applied("acct:1", "task-1") == first.execution_id
    with token_context(_once(6)), pytest.raises(AlreadyAppliedError) as refused, engine.begin() as conn:
        gate.fenced_update(conn, accounts, None, where=where, values={"balance": 999})
    assert refused.value.superseded is False and refused.value.applied_token == 5
    assert _balance(engine, accounts) == (111, 5)
    # The older copy is below the row's fence and a newer execution of its task applied: superseded, not stale.
    with token_context(_once(4)), pytest.raises(AlreadyAppliedError) as superseded, engine.begin() as conn:
        gate.fenced_update(conn, accounts, None, where=where, values={"balance": 999})
    assert superseded.value.superseded is True and superseded.value.applied_token == 5
    assert superseded.value.high_water == 5


def _statements_of(engine: sa.Engine) -> tuple[list[str], Any]:
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(" ".join(statement.split()).upper())

    return statements, seen


def test_the_record_rides_on_the_mark_upsert_on_postgresql(
    gate: SQLGate, engine: sa.Engine, accounts: sa.Table
) -> None:
    """PostgreSQL with psycopg: the mark upsert and the record are one statement (a data-modifying CTE); SQLite and
    MySQL/MariaDB run the record as a second statement, and column mode does everywhere (see fenced_update)."""
    statements, seen = _statements_of(engine)
    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        with token_context(_once(5, "task-t")), gate.transaction():
            pass
        gated = [s for s in statements if "INSERT" in s]
        statements.clear()
        with token_context(_once(6, "task-c")), engine.begin() as conn:
            gate.fenced_update(conn, accounts, None, where=accounts.c.id == 1, values={"balance": 110})
        column = [s for s in statements if "UPDATE" in s or "INSERT" in s]
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    if engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg":
        assert len(gated) == 1 and gated[0].startswith("WITH CELERY_FENCING_EFFECT AS (INSERT")
    else:
        assert len(gated) == 2
    assert len(column) == 2 and column[0].startswith("UPDATE")
    assert gate.applied("acct:1", "task-t") is not None and gate.applied("acct:1", "task-c") is not None
    assert _balance(engine, accounts) == (110, 6)


def test_a_refused_record_leaves_mark_data_and_record_unchanged(
    gate: SQLGate, engine: sa.Engine, accounts: sa.Table
) -> None:
    """The mark passes but the record refuses (an older execution of the task applied): nothing of it commits,
    and the error names the recorded token; in column mode a caller's parameter named like the record's is fine."""
    first = _once(5)
    with token_context(first), gate.transaction() as conn:
        conn.execute(sa.update(accounts).where(accounts.c.id == 1).values(balance=1))
    with token_context(_once(7)), pytest.raises(AlreadyAppliedError) as refused, gate.transaction() as conn:
        conn.execute(sa.update(accounts).where(accounts.c.id == 1).values(balance=2))
    assert refused.value.superseded is False and refused.value.applied_token == 5
    assert gate.high_water("acct:1") == 5 and gate.applied("acct:1", "task-1") == first.execution_id
    assert _balance(engine, accounts) == (1, None)
    # Column mode, the caller's WHERE binding parameters named like the record's.
    where = sa.and_(accounts.c.id == sa.bindparam("resource", 2), accounts.c.balance > sa.bindparam("token", 0))
    with token_context(_once(3, resource="acct:2")), engine.begin() as conn:
        assert gate.fenced_update(conn, accounts, None, where=where, values={"balance": 60}) == 1
    again_once = token_context(_once(4, resource="acct:2"))
    with again_once, pytest.raises(AlreadyAppliedError) as again, engine.begin() as conn:
        gate.fenced_update(conn, accounts, None, where=where, values={"balance": 70})
    assert again.value.superseded is False and again.value.applied_token == 3
    assert _balance(engine, accounts, row=2) == (60, 3)


def test_column_mode_with_exactly_once_refuses_autocommit(gate: SQLGate, engine: sa.Engine, accounts: sa.Table) -> None:
    """Without a transaction the record could commit apart from the UPDATE: refused before any write."""
    with token_context(_once(5)), engine.connect() as conn:
        autocommit = conn.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(FencingConfigurationError):
            gate.fenced_update(autocommit, accounts, None, where=accounts.c.id == 1, values={"balance": 1})
    assert _balance(engine, accounts) == (100, None)


def test_claim_neither_records_nor_checks(gate: SQLGate) -> None:
    """A claim is not an effect: it writes no record, and a second execution's claim passes."""
    with token_context(_once(1)):
        gate.claim()
    assert gate.applied("acct:1", "task-1") is None
    with token_context(_once(1)), gate.transaction():
        pass
    with token_context(_once(2)):
        gate.claim()


def test_missing_applied_table_fails_closed(engine: sa.Engine, unique_name: str) -> None:
    """With exactly-once on and no applied-record table, the gate refuses with a clear error; without, it works."""
    gate = SQLGate(engine, table=f"hw_{unique_name}", applied_table=f"ap_{unique_name}")
    gate.table.create(engine)
    try:
        with token_context(_once(1)), pytest.raises(GateUnavailableError, match="create_schema"), gate.transaction():
            pass
        assert gate.high_water("acct:1") is None  # the refusal changed nothing
        with token_context(Execution(T("acct:1", 1), task_id="task-1", once=False)), gate.transaction():
            pass
        assert gate.high_water("acct:1") == 1
    finally:
        gate.table.drop(engine)


def test_applied_table_layout_and_metadata() -> None:
    """applied_table joins the caller's MetaData once; resource and task id are binary on MySQL/MariaDB."""
    metadata = sa.MetaData()
    table = applied_table(metadata)
    assert metadata.tables["fencing_applied"] is table and applied_table(metadata) is table
    assert [c.name for c in table.primary_key.columns] == ["resource", "task_id"]
    ddl = str(sa.schema.CreateTable(table).compile(dialect=sa.dialects.mysql.dialect()))
    assert "resource VARBINARY(800) NOT NULL" in ddl and "task_id VARBINARY(800) NOT NULL" in ddl
    assert "execution VARCHAR(64) NOT NULL" in ddl and "expires_at BIGINT NOT NULL" in ddl
    assert "token BIGINT NOT NULL" in ddl
