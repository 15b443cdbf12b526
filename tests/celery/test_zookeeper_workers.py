"""Fenced tasks on the production source: ZooKeeper, with real prefork workers."""

from __future__ import annotations

import time
import uuid

from kazoo.client import KazooClient

from celery_fencing.blocks import SCALE_BITS
from tests.fixtures.zookeeper import ZooKeeperServer

from .conftest import Scenario
from .workers import wait_for


def _use_zookeeper(scenario: Scenario, server: ZooKeeperServer, **params: object) -> None:
    scenario.env["FT_SOURCE"] = server.url(f"/fencing-{scenario.name}", **params)


def test_prefork_children_mint_zxid_tokens(scenario: Scenario, zookeeper_server: ZooKeeperServer) -> None:
    """Each prefork child mints from its own ZooKeeper session and block: a resource's tokens are distinct and
    strictly increase within each process.

    Not across processes: a child's block may be older than its sibling's, so
    a later task there draws a lower token (celery_fencing.blocks). Where that
    matters, the store decides by claim: test_block_tokens.py.
    """
    _use_zookeeper(scenario, zookeeper_server)
    scenario.worker("w", pool="prefork", concurrency=2)
    got = [scenario.send("whoami", "zk").get(timeout=60) for _ in range(6)]
    tokens = [g["token"] for g in got]
    assert len(set(tokens)) == len(tokens), tokens
    for pid in {g["pid"] for g in got}:
        mine = [g["token"] for g in got if g["pid"] == pid]
        assert mine == sorted(mine), (pid, mine)


def test_task_id_resources_leave_no_znode_per_task(scenario: Scenario, zookeeper_server: ZooKeeperServer) -> None:
    """Tasks mint from token blocks reserved by writes to one shared znode: ZooKeeper does not grow
    by a znode per task (nor per domain resource), tokens stay distinct, and each pool process
    reserves its block with one write for all its tasks."""
    _use_zookeeper(scenario, zookeeper_server)
    scenario.worker("w", pool="prefork", concurrency=2)
    results = [scenario.send("task_id_token") for _ in range(8)]
    tokens = [result.get(timeout=60) for result in results]
    assert len(set(tokens)) == len(tokens)
    scenario.send("whoami", "zk").get(timeout=60)
    root = f"/fencing-{scenario.name}"
    admin = KazooClient(zookeeper_server.hosts)
    admin.start(30)
    try:
        assert not admin.exists(f"{root}/tokens") or admin.get_children(f"{root}/tokens") == []
        _, stat = admin.get(f"{root}/transient")
        # One create, then a setData per block: one block per pool process served all nine tasks.
        assert stat.version + 1 <= 2, f"{stat.version + 1} writes for 9 tasks on 2 processes"
        # Tokens come from blocks: the last write's block ends below the next zxid's first token.
        assert max(tokens) < (stat.mzxid + 1) << SCALE_BITS
    finally:
        admin.stop()
        admin.close()


def test_exclusive_mode_runs_one_execution_at_a_time(scenario: Scenario, zookeeper_server: ZooKeeperServer) -> None:
    """In exclusive mode the second execution of a resource enters only after the first exits, with a larger token."""
    _use_zookeeper(scenario, zookeeper_server)
    scenario.worker("w", pool="prefork", concurrency=2)
    scenario.check_exclusive_runs_one_at_a_time()


def test_session_loss_stops_the_task_at_its_next_gate_call(
    scenario: Scenario, zookeeper_server: ZooKeeperServer
) -> None:
    """With --fencing-abort-on-session-loss, a task whose session was suspended is told, and its
    next gate call raises LeaseLostError; the retry mints a new token once the session is back."""
    _use_zookeeper(scenario, zookeeper_server, session_timeout=4, timeout=3)
    worker = scenario.worker("w", pool="prefork", concurrency=1, extra_args=("--fencing-abort-on-session-loss",))
    name = uuid.uuid4().hex[:6]
    result = scenario.send("session_job", name)
    start = wait_for(lambda: scenario.events_of("start", result.id), 60, "the task to start")[0]  # type: ignore[index]
    zookeeper_server.pause()
    try:
        wait_for(lambda: "ZooKeeper session SUSPENDED while 1 fenced task(s)" in worker.log(), 30, "the suspension")
    finally:
        zookeeper_server.resume()
    scenario.release(result.id, start[2])
    retry_start = wait_for(
        lambda: [e for e in scenario.events_of("start", result.id) if e[3] == "1"], 90, "the retry to start"
    )[0]  # type: ignore[index]
    scenario.release(result.id, retry_start[2])
    final = result.get(timeout=60)
    assert scenario.events_of("lost", result.id)[0][2] == start[2], "the first attempt was told its session was lost"
    assert "fenced out at body on 'sess:" in worker.log()
    assert "was lost; this execution stops at its next gate call" in worker.log()
    assert final == int(retry_start[2]) > int(start[2])
    assert scenario.redis.get(scenario.key("sess", name)) == retry_start[2]


def test_task_waits_out_a_grantor_outage(scenario: Scenario, zookeeper_server: ZooKeeperServer) -> None:
    """With ZooKeeper down, a fenced task retries with backoff and never runs unfenced; once it is back, it runs."""
    _use_zookeeper(scenario, zookeeper_server, timeout=1)
    worker = scenario.worker("w", pool="solo")
    scenario.send("whoami", "outage").get(timeout=60)  # the session is up
    zookeeper_server.stop()
    try:
        result = scenario.send("whoami", "outage")
        wait_for(
            lambda: worker.log().count("got no token on 'plain:outage' (grantor unavailable") >= 2,
            60,
            "retries while down",
        )
        assert not result.ready(), "the body must not run without a token"
    finally:
        zookeeper_server.start()
    got = result.get(timeout=90)
    assert got["resource"] == "plain:outage" and got["token"] > 0


def test_an_outage_is_summarised_not_logged_per_reconnect(
    scenario: Scenario, zookeeper_server: ZooKeeperServer
) -> None:
    """A 10 s ZooKeeper outage costs an idle worker a few log lines, not kazoo's lines per reconnect attempt."""
    _use_zookeeper(scenario, zookeeper_server, timeout=1)
    worker = scenario.worker("w", pool="solo")
    scenario.send("whoami", "quiet").get(timeout=60)  # the session is up
    before = len(worker.log().splitlines())
    zookeeper_server.stop()
    try:
        time.sleep(10)  # the fault itself: ten seconds without ZooKeeper
    finally:
        zookeeper_server.start()
    wait_for(lambda: "ZooKeeper connection back after" in worker.log(), 60, "the worker to reconnect")
    lines = worker.log().splitlines()[before:]
    print(f"\n{len(lines)} log lines during the outage and the recovery:\n" + "\n".join(lines))
    assert len(lines) <= 12, "\n".join(lines)
