"""`celery-fencing inspect`: last token and marks side by side, read from real stores, nothing written."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from celery_fencing import FencingToken, RedisGate, SQLiteTokenSource
from celery_fencing.cli import main
from celery_fencing.gates.sql import SQLGate
from celery_fencing.sources.etcd import EtcdTokenSource
from celery_fencing.sources.zookeeper import ZooKeeperTokenSource
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.zookeeper import ZooKeeperServer

from .conftest import run_cli


def inspect(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["inspect", *args], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def postgres_gate(postgres_url: str, unique_name: str) -> Iterator[SQLGate]:
    engine = create_engine(postgres_url)
    gate = SQLGate(engine, table=f"{unique_name}_marks")
    gate.create_schema()
    yield gate
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {unique_name}_marks"))
    engine.dispose()


def test_marks_of_three_gates_side_by_side(
    tmp_path: Path, redis_url: str, postgres_url: str, redis_gate: RedisGate, postgres_gate: SQLGate
) -> None:
    """The last token of each resource is shown beside its mark at a Redis, a PostgreSQL and a SQLite gate."""
    source = SQLiteTokenSource(tmp_path / "tokens.db")
    sqlite_url = f"sqlite:///{tmp_path / 'marks.db'}"
    sqlite_gate = SQLGate(create_engine(sqlite_url))
    sqlite_gate.create_schema()
    first, second = source.mint("account:42"), source.mint("account:42")
    redis_gate.claim(second)
    postgres_gate.claim(first)
    sqlite_gate.claim(second)
    other = source.mint("account:7")
    redis_gate.claim(other)
    source.close()

    code, out, err = inspect(
        "--source", f"sqlite:///{tmp_path / 'tokens.db'}",
        "--gate", redis_url, "--redis-prefix", redis_gate.prefix,
        "--gate", postgres_url, "--sql-table", postgres_gate.table.name,
        "--json", "account:42", "account:7", "account:never",
    )  # fmt: skip
    assert code == 0, err
    report = {r["resource"]: r for r in json.loads(out)["resources"]}
    assert report["account:42"]["last_token"] == 2
    assert [m["high_water"] for m in report["account:42"]["marks"]] == [2, 1]
    assert [m["high_water"] for m in report["account:7"]["marks"]] == [3, None]  # one counter for every resource
    assert report["account:never"]["last_token"] is None and report["account:never"]["peek_note"] == "never minted"

    code, out, err = inspect(
        "--source", f"sqlite:///{tmp_path / 'tokens.db'}", "--gate", sqlite_url, "account:42"
    )  # fmt: skip
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("account:42"))
    assert row.split() == ["account:42", "2", "2", "ok"]


def test_task_id_shows_which_execution_applied(tmp_path: Path, redis_url: str, redis_gate: RedisGate) -> None:
    """--task-id reads the exactly-once record of a task on each resource: the applying execution, or none."""
    from celery_fencing import token_context
    from celery_fencing.context import Execution

    source = SQLiteTokenSource(tmp_path / "tokens.db")
    token = source.mint("account:42")
    source.close()
    execution = Execution(token, task_id="task-a", once=True)
    with token_context(execution):
        redis_gate.set(None, f"{redis_gate.prefix}:data", 1)
    args = ["--source", f"sqlite:///{tmp_path / 'tokens.db'}", "--gate", redis_url]
    args += ["--redis-prefix", redis_gate.prefix, "--task-id", "task-a", "--task-id", "task-b"]
    code, out, err = inspect(*args, "--json", "account:42")
    assert code == 0, err
    applied = {entry["task_id"]: entry["execution"] for entry in json.loads(out)["resources"][0]["applied"]}
    assert applied == {"task-a": execution.execution_id, "task-b": None}
    code, out, err = inspect(*args, "account:42")
    assert code == 0, err
    assert execution.execution_id in out and "not applied (or expired)" in out


def test_inspect_mints_nothing(tmp_path: Path) -> None:
    """Peeking leaves the source's counter where it was: the next token is the one after the last minted."""
    source = SQLiteTokenSource(tmp_path / "tokens.db")
    source.mint("r")
    gate_url = f"sqlite:///{tmp_path / 'marks.db'}"
    SQLGate(create_engine(gate_url)).create_schema()
    for _ in range(3):
        code, _, err = inspect("--source", f"sqlite:///{tmp_path / 'tokens.db'}", "--gate", gate_url, "r")
        assert code == 0, err
    assert source.mint("r").value == 2
    source.close()


def _check_last_token_is_peeked(
    server: ZooKeeperServer | EtcdServer,
    source_class: type[ZooKeeperTokenSource | EtcdTokenSource],
    unique_name: str,
    redis_url: str,
    redis_gate: RedisGate,
) -> None:
    """Mint job:1 from a source on *server* and claim it: two inspections both show that token as the last and
    the gate's mark, job:2 (never minted) has no last token, and the source's next job:1 token is larger."""
    url = server.url(f"/{unique_name}")
    with source_class.from_url(url) as source:
        token = source.mint("job:1")
        redis_gate.claim(token)
        args = ("--source", url, "--gate", redis_url, "--redis-prefix", redis_gate.prefix, "--json", "job:1", "job:2")
        first = json.loads(inspect(*args)[1])["resources"]
        second = json.loads(inspect(*args)[1])["resources"]
        assert first[0]["last_token"] == second[0]["last_token"] == token.value
        assert first[0]["marks"][0]["high_water"] == token.value
        assert first[1]["last_token"] is None
        assert source.mint("job:1").value > token.value


def test_zookeeper_last_token_is_peeked_not_minted(
    zookeeper_server: ZooKeeperServer, redis_url: str, redis_gate: RedisGate, unique_name: str
) -> None:
    """For ZooKeeper the last token is the mzxid of the token znode: shown exactly, and reading it mints nothing."""
    _check_last_token_is_peeked(zookeeper_server, ZooKeeperTokenSource, unique_name, redis_url, redis_gate)


def test_zookeeper_task_ids_are_bounded_by_the_ensembles_zxid(
    zookeeper_server: ZooKeeperServer, redis_url: str, redis_gate: RedisGate, unique_name: str
) -> None:
    """A task id minted through mint_transient has no znode: its honest mark is not reported ahead of the
    source (the bound is the ensemble's last zxid), while a mark above that zxid still is."""
    url = zookeeper_server.url(f"/{unique_name}")
    with ZooKeeperTokenSource.from_url(url) as source:
        honest = source.mint_transient("task-id-1")
        redis_gate.claim(honest)
        forged = source.mint_transient("task-id-2")
        redis_gate.claim(dataclasses.replace(forged, value=forged.value + 10**9))
        args = ("--source", url, "--gate", redis_url, "--redis-prefix", redis_gate.prefix, "--json")
        code, out, _ = inspect(*args, "task-id-1", "task-id-2")
        report = {entry["resource"]: entry for entry in json.loads(out)["resources"]}
        assert report["task-id-1"]["status"] == "ok"
        assert report["task-id-1"]["last_token"] is None and report["task-id-1"]["peek_note"] == "no znode"
        assert report["task-id-1"]["issued_bound"] >= honest.value
        assert report["task-id-2"]["status"] == "MARK AHEAD OF SOURCE"
        assert code == 1


def test_etcd_last_token_is_peeked_not_minted(
    etcd_server: EtcdServer, redis_url: str, redis_gate: RedisGate, unique_name: str
) -> None:
    """For etcd the last token is the mod_revision of the token key: shown exactly, and reading it mints nothing."""
    _check_last_token_is_peeked(etcd_server, EtcdTokenSource, unique_name, redis_url, redis_gate)


def test_mark_ahead_of_source_is_a_finding(tmp_path: Path, redis_url: str, redis_gate: RedisGate) -> None:
    """A mark above the source's counter (a reset source) is reported with its consequence, exit code 1."""
    source = SQLiteTokenSource(tmp_path / "tokens.db")
    source.mint("account:1")
    source.close()
    redis_gate.claim(FencingToken("account:1", 500))
    code, out, _ = inspect(
        "--source", f"sqlite:///{tmp_path / 'tokens.db'}", "--gate", redis_url, "--redis-prefix", redis_gate.prefix,
        "account:1",
    )  # fmt: skip
    assert code == 1
    assert "MARK AHEAD OF SOURCE" in out
    assert "every new token is refused until it passes the mark" in out


def test_memory_source_says_it_cannot_be_peeked(tmp_path: Path) -> None:
    """memory:// cannot be read from outside its process: inspect says so instead of guessing."""
    gate_url = f"sqlite:///{tmp_path / 'marks.db'}"
    SQLGate(create_engine(gate_url)).create_schema()
    code, out, _ = inspect("--source", "memory://", "--gate", gate_url, "r")
    assert code == 0
    assert "cannot peek" in out and "memory:// lives inside one process" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gate", "redis://127.0.0.1:6379/0", "r"], "the following arguments are required: --source"),
        (["--source", "memory://", "r"], "inspect needs at least one --gate URL"),
        (["--source", "sqlite:///does/not/exist.db", "--gate", "redis://127.0.0.1:6379/0", "r"], "does not exist"),
        (["--source", "consul://h/x", "--gate", "redis://127.0.0.1:6379/0", "r"], "unknown token source scheme"),
        (["--source", "etcd://127.0.0.1:1/f?timeout=1", "--gate", "redis://127.0.0.1:6379/0", "r"],
         "cannot reach etcd at 127.0.0.1:1"),
        (["--source", "memory://", "--gate", "mongodb://h/db", "r"], "unknown gate URL scheme 'mongodb'"),
        (["--source", "memory://", "--gate", "sqlite:///nope.db", "r"], "SQLite database 'nope.db'"),
        (["--source", "memory://", "--gate", "redis://127.0.0.1:1/0", "r"], "cannot read the mark at redis://"),
        (["--source", "memory://", "--gate", "redis://127.0.0.1:6379/0", ""], "bad resource name ''"),
        (["--source", "memory://", "--gate", "redis://127.0.0.1:6379/0", "x" * 201], "bad resource name"),
        (["--source", "zookeeper://127.0.0.1:1/f?timeout=1", "--gate", "redis://127.0.0.1:6379/0", "r"],
         "cannot reach ZooKeeper at 127.0.0.1:1"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_naming_what_is_wrong(args: list[str], message: str) -> None:
    """Bad URLs, missing files, unreachable servers and bad resource names: exit 2, a clear message, no traceback."""
    code, out, err = inspect(*args)
    assert code == 2, out + err
    assert message in err
    assert "Traceback" not in err


def test_console_script_reports_bad_input_without_traceback() -> None:
    """The installed command prints one error line and exits 2 on a bad gate URL."""
    done = run_cli(["inspect", "--source", "memory://", "--gate", "ftp://x", "r"], timeout=60)
    assert done.code == 2
    assert done.err.strip().splitlines() == [
        "celery-fencing: unknown gate URL scheme 'ftp' in 'ftp://x'; known: redis, rediss, unix, postgresql, mysql, "
        "mariadb, sqlite"
    ]


def test_a_prefix_without_any_mark_is_pointed_out(tmp_path: Path, redis_url: str, redis_gate: RedisGate) -> None:
    """A mistyped --redis-prefix shows '-' for every mark, with a note that the prefix holds no mark at all."""
    source = SQLiteTokenSource(tmp_path / "tokens.db")
    redis_gate.claim(source.mint("account:42"))
    source.close()
    base = ["--source", f"sqlite:///{tmp_path / 'tokens.db'}", "--gate", redis_url, "--json", "account:42"]
    code, out, err = inspect(*base[:4], "--redis-prefix", f"{redis_gate.prefix}-typo", *base[4:])
    assert code == 0, err
    (report,) = json.loads(out)["resources"]
    assert report["marks"][0]["high_water"] is None
    assert any("no mark at all under the prefix" in note for note in report["notes"])
    # The right prefix: the mark, and no such note.
    code, out, err = inspect(*base[:4], "--redis-prefix", redis_gate.prefix, *base[4:])
    (report,) = json.loads(out)["resources"]
    assert report["marks"][0]["high_water"] == 1 and report["notes"] == []


def test_result_backend_marks_are_shown_beside_the_gates(tmp_path: Path, redis_url: str, redis_gate: RedisGate) -> None:
    """A fenced+redis:// URL as a gate shows each task's result mark and the execution that sealed it."""
    from celery import Celery, states
    from celery.app.task import Context

    from celery_fencing.context import Execution

    source = SQLiteTokenSource(tmp_path / "tokens.db")
    task_id = f"{redis_gate.prefix}-task"
    token = source.mint(task_id)
    source.close()
    app = Celery("inspect-results", backend="fenced+" + redis_url, set_as_current=False)
    execution = Execution(token, task_id=task_id, once=True)
    app.backend.seal_result(task_id, execution)
    request = Context(id=task_id, task="x", args=(), kwargs={})
    request.fencing_token, request.fencing_execution = token, execution
    app.backend.store_result(task_id, 1, states.SUCCESS, request=request)
    try:
        args = ["--source", f"sqlite:///{tmp_path / 'tokens.db'}", "--gate", "fenced+" + redis_url]
        code, out, err = inspect(*args, "--task-id", task_id, "--json", task_id)
        assert code == 0, err
        (report,) = json.loads(out)["resources"]
        assert report["marks"][0]["high_water"] == token.value
        assert report["applied"][0]["execution"] == execution.execution_id
    finally:
        app.backend.client.delete(f"celery-task-meta-{task_id}", f"celery-task-fence-{task_id}")
        app.close()
