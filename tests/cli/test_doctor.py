"""`celery-fencing doctor -A app`: each check against real servers, through the installed command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine

from celery_fencing.gates.sql import SQLGate
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.zookeeper import ZooKeeperServer

from .conftest import Done, run_cli


def doctor(app: str, env: dict[str, str]) -> tuple[Done, dict[str, Any]]:
    done = run_cli(["doctor", "-A", app, "--json"], env=env, timeout=120)
    assert "Traceback" not in done.err, done.err
    return done, json.loads(done.out)


def findings(report: dict[str, Any], area: str, status: str | None = None) -> list[str]:
    return [
        c["message"]
        for c in report["checks"]
        if c["area"] == area and (status is None or c["status"] == status) and c["status"] != "ok"
    ]


def test_healthy_app_has_no_finding(tmp_path: Path, private_redis_url: str, rabbitmq_url: str) -> None:
    """A well-set-up app passes every check (exit 0): source monotonic, gates answer, AOF on, fenced results."""
    sql = f"sqlite:///{tmp_path / 'marks.db'}"
    SQLGate(create_engine(sql)).create_schema()
    env = {
        "CFT_BROKER": rabbitmq_url,
        "CFT_SOURCE": f"sqlite:///{tmp_path / 'tokens.db'}",
        "CFT_SQL": sql,
        "CFT_REDIS": private_redis_url,
    }
    done, report = doctor("tests.cli.apps.healthy", env)
    assert done.code == 0, json.dumps(report, indent=1)
    assert report["ok"] is True
    statuses = {(c["area"], c["status"]) for c in report["checks"]}
    assert ("source", "ok") in statuses and ("broker", "ok") in statuses
    assert ("persistence", "ok") in statuses, "the AOF Redis behind the gate and the backend is reported fine"
    assert any("minted 1 then 2" in c["message"] for c in report["checks"])
    assert findings(report, "source", "note"), "a SQLite source is pointed out as single-host"


def test_text_output_prints_each_finding_with_its_fix(
    tmp_path: Path, redis_url: str, zookeeper_server: ZooKeeperServer
) -> None:
    """Without --json every finding is printed with a 'fix:' line, and the exit code is 1."""
    env = {"CFT_REDIS": redis_url, "CFT_ZOOKEEPER": zookeeper_server.hosts}
    done = run_cli(["doctor", "-A", "tests.cli.apps.risky"], env=env, timeout=120)
    assert done.code == 1, done.out + done.err
    lines = done.out.splitlines()
    warnings = [i for i, line in enumerate(lines) if line.strip().startswith("WARNING")]
    assert warnings
    for index in warnings:
        assert "fix:" in lines[index + 1], lines[index]
    assert "findings to fix" in lines[-1]


def test_risky_app_findings(redis_url: str, zookeeper_server: ZooKeeperServer) -> None:
    """The re-delivery traps, missing persistence, plain results and ZooKeeper timing are each reported."""
    env = {"CFT_REDIS": redis_url, "CFT_ZOOKEEPER": zookeeper_server.hosts}
    done, report = doctor("tests.cli.apps.risky", env)
    assert done.code == 1
    timing = " ".join(findings(report, "timing", "warning"))
    assert "visibility_timeout (60s, set)" in timing and "build_report" in timing
    assert "retry delays not below the visibility_timeout (60s)" in timing
    assert "tests.cli.apps.risky.build_report (fencing_retry_max_delay): 120s" in timing
    assert any("no persistence" in m for m in findings(report, "persistence", "warning"))
    assert any("plain redis://" in m for m in findings(report, "results", "warning"))
    zookeeper = " ".join(findings(report, "zookeeper", "warning"))
    assert "one ZooKeeper server" in zookeeper
    assert "session_timeout=3s is below what ZooKeeper grants" in zookeeper
    assert "fencing_timeout=5s is not below the ZooKeeper session timeout (3s)" in zookeeper
    assert any("cleanup" in m for m in findings(report, "gates", "note")), "a task claiming no gate is pointed out"
    assert all(c["fix"] for c in report["checks"] if c["status"] != "ok")


def test_broken_app_reports_errors(tmp_path: Path) -> None:
    """A forgotten install(), a bad setting, an unreachable gate and broker are findings (exit 1), not crashes."""
    done, report = doctor("tests.cli.apps.broken", {})
    assert done.code == 1
    assert findings(report, "app", "warning"), "install() not called"
    assert any("fencing_timeout" in m for m in findings(report, "settings", "error"))
    assert any("cannot be read" in m for m in findings(report, "gates", "error"))
    assert any("unreachable" in m for m in findings(report, "broker", "error"))


def test_non_monotonic_source_is_an_error(redis_url: str) -> None:
    """A source that mints the same value twice (a timestamp, a resettable counter) is reported as not monotonic."""
    done, report = doctor("tests.cli.apps.frozen_counter", {"CFT_BROKER": redis_url})
    assert done.code == 1
    assert any("not monotonic: minted 7 then 7" in m for m in findings(report, "source", "error"))


@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("tests.cli.apps.no_such_module", "no module named 'tests.cli.apps.no_such_module'"),
        ("tests.cli.apps.healthy:nope", "cannot load the app 'tests.cli.apps.healthy:nope'"),
        ("json", "cannot load the app 'json'"),
    ],
)
def test_unloadable_app_exits_2(app: str, message: str) -> None:
    """An app that cannot be loaded is a usage error: exit 2, one clear line, no traceback."""
    env = {"CFT_BROKER": "memory://", "CFT_SOURCE": "memory://", "CFT_SQL": "sqlite://", "CFT_REDIS": "redis://"}
    done = run_cli(["doctor", "-A", app], env=env, timeout=60)
    assert done.code == 2, done.out + done.err
    assert message in done.err
    assert "Traceback" not in done.err


def test_etcd_single_server_and_lease_ttl_are_reported(etcd_server: EtcdServer, redis_url: str) -> None:
    """An etcd source is checked too: it mints monotonically, and one server or a TTL below fencing_timeout is a
    finding."""
    env = {"CFT_ETCD": etcd_server.endpoints, "CFT_BROKER": redis_url}
    done, report = doctor("tests.cli.apps.etcd_exclusive", env)
    assert done.code == 1
    assert any(c["area"] == "source" and c["status"] == "ok" for c in report["checks"])
    etcd = " ".join(findings(report, "etcd", "warning"))
    assert "one etcd server" in etcd
    assert "fencing_timeout=5s is not below the etcd lease_ttl (3s)" in etcd


def test_rabbitmq_consumer_timeout_is_advice(tmp_path: Path, rabbitmq_url: str) -> None:
    """On RabbitMQ, acks_late without a time limit and hour-long retry delays are pointed out as notes (exit 0):
    the server's consumer_timeout is not visible from the app."""
    env = {"CFT_BROKER": rabbitmq_url, "CFT_SOURCE": f"sqlite:///{tmp_path / 'tokens.db'}"}
    done, report = doctor("tests.cli.apps.rabbitmq_delays", env)
    assert done.code == 0, json.dumps(report, indent=1)
    notes = " ".join(findings(report, "timing", "note"))
    assert "without a time limit below RabbitMQ's consumer_timeout" in notes
    assert "tests.cli.apps.rabbitmq_delays.job (fencing_retry_max_delay): 3600s" in notes


def test_doctor_takes_the_worker_flags(tmp_path: Path, redis_url: str) -> None:
    """The source given only by --fencing-source, as on the worker: doctor checks it instead of saying it is unset."""
    env = {"CFT_BROKER": redis_url}
    source = f"sqlite:///{tmp_path / 'tokens.db'}"
    done = run_cli(
        ["doctor", "-A", "tests.cli.apps.flag_source", "--json", "--fencing-source", source, "--fencing-timeout", "3"],
        env=env,
        timeout=120,
    )
    assert "Traceback" not in done.err, done.err
    report = json.loads(done.out)
    messages = [c["message"] for c in report["checks"]]
    assert not any("fencing_source is not set" in m for m in messages)
    assert any("minted 1 then 2" in m for m in messages)
    assert any("--fencing-source, --fencing-timeout" in m for m in messages if "setting" in m)
    # Negative control: the same app without the flag has no source.
    _, without = doctor("tests.cli.apps.flag_source", env)
    assert any("fencing_source is not set" in c["message"] for c in without["checks"])
