"""A poisoned mark (a forged 2**63-1 that got in) on real Redis and PostgreSQL gates behind a real
ZooKeeper: `celery-fencing inspect` flags it, `celery-fencing repair` lowers it to a fresh token,
audited, and leaves healthy marks and other grantors' marks alone."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from collections.abc import Iterator

import pytest
import redis
import sqlalchemy as sa

from celery_fencing import MAX_TOKEN_VALUE, RedisGate, SQLGate, StaleTokenError, ZooKeeperTokenSource
from celery_fencing.cli import main
from celery_fencing.token import Mark
from tests.fixtures.services import armed
from tests.fixtures.zookeeper import ZooKeeperServer


@pytest.fixture
def setup(
    zookeeper_server: ZooKeeperServer, redis_url: str, postgres_url: str, unique_name: str
) -> Iterator[tuple[str, ZooKeeperTokenSource, list[RedisGate | SQLGate], list[str]]]:
    url = zookeeper_server.url(f"/{unique_name}", timeout=20)
    client = redis.Redis.from_url(redis_url)
    engine = sa.create_engine(postgres_url, connect_args={"connect_timeout": 5})
    table = f"hw_{unique_name}"
    sql_gate = SQLGate(engine, table=table)
    sql_gate.create_schema()
    gates: list[RedisGate | SQLGate] = [armed(RedisGate(client, prefix=unique_name)), sql_gate]
    cli_gates = ["--gate", redis_url, "--redis-prefix", unique_name, "--gate", postgres_url, "--sql-table", table]
    source = ZooKeeperTokenSource.from_url(url)
    try:
        yield url, source, gates, cli_gates
    finally:
        source.close()
        keys = list(client.scan_iter(f"{unique_name}:*"))
        if keys:
            client.delete(*keys)
        client.close()
        sql_gate.table.drop(engine, checkfirst=True)
        engine.dispose()


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out, err=out)
    return code, out.getvalue()


def test_inspect_flags_and_repair_lowers_a_poisoned_mark(
    setup: tuple[str, ZooKeeperTokenSource, list[RedisGate | SQLGate], list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After a forged 2**63-1 got in, inspect flags it; repair --yes lowers it to a fresh token; honest ones pass."""
    url, source, gates, cli_gates = setup
    honest = source.mint("acct")
    healthy = source.mint("healthy")
    for gate in gates:
        gate.claim(honest)
        gate.claim(healthy)
        gate.claim(dataclasses.replace(honest, value=MAX_TOKEN_VALUE))  # a gate without a verifier takes it
    before_repair = source.mint("acct")
    for gate in gates:
        with pytest.raises(StaleTokenError):
            gate.claim(before_repair)  # the damage: every honest writer is refused

    code, out = run("inspect", "--source", url, *cli_gates, "--json", "acct", "healthy")
    assert code == 1, out
    report = {r["resource"]: r for r in json.loads(out)["resources"]}
    assert report["acct"]["status"] == "MARK AHEAD OF SOURCE" and "repair" in " ".join(report["acct"]["problems"])
    assert report["healthy"]["status"] == "ok"

    code, out = run("repair", "--source", url, *cli_gates, "acct", "healthy")
    assert code == 1 and out.count("would change") == 2 and "healthy" not in out.split("\n", 1)[1], out
    assert all(gate.high_water("acct") == MAX_TOKEN_VALUE for gate in gates), "nothing changes without --yes"

    with caplog.at_level(logging.WARNING, logger="celery_fencing.audit"):
        code, out = run("repair", "--source", url, *cli_gates, "--yes", "acct", "healthy")
    assert code == 0 and out.count("  changed ") == 2, out
    assert sum(r.name == "celery_fencing.audit" for r in caplog.records) == 2
    marks = {gate.high_water("acct") for gate in gates}
    (repaired,) = marks
    assert before_repair.value < repaired < MAX_TOKEN_VALUE
    for gate in gates:
        with pytest.raises(StaleTokenError):
            gate.claim(before_repair)  # minted before the repair: still refused
        assert gate.mark("healthy") == Mark("healthy", healthy.value, healthy.grantor)  # untouched
    after = source.mint("acct")
    for gate in gates:
        gate.claim(after)

    code, out = run("repair", "--source", url, *cli_gates, "--yes", "acct")
    assert code == 0 and "nothing to change" in out


def test_repair_leaves_other_grantors_to_rebase_and_inspect_names_them(
    setup: tuple[str, ZooKeeperTokenSource, list[RedisGate | SQLGate], list[str]],
) -> None:
    """A mark of another grantor is a GRANTOR MISMATCH for inspect, and repair does not touch it."""
    url, source, gates, cli_gates = setup
    token = source.mint("acct")
    foreign = dataclasses.replace(token, value=MAX_TOKEN_VALUE, grantor="zk-another")
    for gate in gates:
        gate.claim(foreign)
    code, out = run("inspect", "--source", url, *cli_gates, "--json", "acct")
    (report,) = json.loads(out)["resources"]
    assert code == 1 and report["status"] == "GRANTOR MISMATCH" and "rebase" in report["problems"][0]
    assert {m["grantor"] for m in report["marks"]} == {"zk-another"}
    code, out = run("repair", "--source", url, *cli_gates, "--yes", "acct")
    assert code == 0 and "nothing to change" in out
    assert all(gate.high_water("acct") == MAX_TOKEN_VALUE for gate in gates)
