"""`celery-fencing demo`: the README's first command, run as a new user runs it (real worker processes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from tests.fixtures.zookeeper import ZooKeeperServer

from .conftest import ROOT, Done, cli_command, demo_directory, demo_pids, process_gone, run_cli

FENCED_VERDICT = "fencing on: stale write rejected, task retried, nothing lost"
UNFENCED_VERDICT = "fencing off: 1 update lost"


def assert_cleaned_up(done: Done) -> None:
    pids = demo_pids(done.err)
    assert len(pids) == 2, done.err
    assert all(process_gone(pid) for pid in pids), f"worker processes left behind: {pids}"
    assert not demo_directory(done.err).exists(), "the demo's temp dir was left behind"


@pytest.fixture(scope="module")
def embedded_run() -> Done:
    """One run of the bare `celery-fencing demo`, shared by the tests that read its output."""
    return run_cli(["demo"], timeout=120)


def test_demo_needs_no_server_and_proves_the_point(embedded_run: Done) -> None:
    """With no flag the demo runs on embedded components, prints both verdicts and exits 0 in under a minute."""
    done = embedded_run
    assert done.code == 0, done.out + done.err
    assert UNFENCED_VERDICT in done.out
    assert FENCED_VERDICT in done.out
    assert "SQLite counter file" in done.out and "kombu filesystem transport" in done.out
    assert done.seconds < 60, f"the demo took {done.seconds:.1f}s"
    assert "Traceback" not in done.err


def test_timeline_shows_the_pause_and_the_refusal(embedded_run: Done) -> None:
    """The fenced timeline shows the SIGSTOP, the refused stale write with its token and mark, and the retry."""
    fenced = embedded_run.out.split("Run 2: fencing on", 1)[1]
    unfenced = embedded_run.out.split("Run 2: fencing on", 1)[0]
    for table in (fenced, unfenced):
        assert "freezes W1 with SIGSTOP" in table and "resumes W1 with SIGCONT" in table
    # W2's token comes from its own block, above W1's: the numbers are the blocks' (1, 1025), the order is the point.
    refused = re.search(r"REFUSED: token (\d+) < mark (\d+)", fenced)
    assert refused and int(refused[1]) < int(refused[2]), fenced
    assert "deposit 10 starts again (retry 1)" in fenced
    assert "writes balance 130" in fenced
    assert "writes balance 110" in unfenced and "written: nothing checks" in unfenced


def test_demo_leaves_no_process_or_file(embedded_run: Done) -> None:
    """After the demo, its worker processes are gone and its temp dir is deleted."""
    assert_cleaned_up(embedded_run)


def test_ctrl_c_stops_workers_and_removes_files() -> None:
    """SIGINT mid-demo, with one worker frozen by SIGSTOP, still stops every worker and deletes the temp dir."""
    proc = subprocess.Popen(
        [*cli_command(), "demo"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not demo_pids("".join(seen))[1:]:
            line = proc.stderr.readline()
            assert line, "the demo ended before starting its workers:\n" + "".join(seen)
            seen.append(line)
            assert time.monotonic() < deadline
        w2 = demo_pids("".join(seen))[1]
        os.kill(w2, signal.SIGSTOP)  # a frozen worker cannot act on SIGTERM: cleanup must SIGCONT it
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done = Done(proc.returncode, out, "".join(seen) + rest, 0.0)
    assert done.code == 130, done.err
    assert "interrupted: stopping the workers" in done.err
    assert "Traceback" not in done.err
    assert_cleaned_up(done)


@pytest.mark.slow
def test_demo_on_zookeeper_postgres_and_rabbitmq(
    zookeeper_server: ZooKeeperServer, postgres_url: str, rabbitmq_url: str
) -> None:
    """The flags swap in real servers: ZooKeeper tokens, a PostgreSQL SQLGate, RabbitMQ; the story holds."""
    done = run_cli(
        ["demo", "--zookeeper", zookeeper_server.hosts, "--postgres", postgres_url, "--broker", rabbitmq_url]
    )
    assert done.code == 0, done.out + done.err
    assert "ZooKeeper" in done.out and "SQLGate on postgresql" in done.out
    assert UNFENCED_VERDICT in done.out and FENCED_VERDICT in done.out
    assert_cleaned_up(done)


@pytest.mark.slow
def test_demo_on_redis(redis_url: str) -> None:
    """With --redis and a Redis broker the account sits behind a RedisGate; nothing is left in Redis after."""
    import redis

    done = run_cli(["demo", "--redis", redis_url, "--broker", redis_url])
    assert done.code == 0, done.out + done.err
    assert "RedisGate on redis://" in done.out
    assert FENCED_VERDICT in done.out
    assert_cleaned_up(done)
    namespace = re.search(r"names on servers start with (cfdemo\w+)", done.err)
    assert namespace, done.err
    client = redis.Redis.from_url(redis_url)
    try:
        assert not list(client.scan_iter(f"*{namespace.group(1)}*")), "the demo left keys in Redis"
    finally:
        client.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--redis", "redis://127.0.0.1:6379/0", "--postgres", "postgresql://x@127.0.0.1/test"], "give one of them"),
        (["--redis", "postgresql://x@127.0.0.1/test"], "--redis needs a redis:// URL"),
        (["--postgres", "mysql://root@127.0.0.1/test"], "--postgres needs a postgresql:// URL"),
        (["--redis", "redis://127.0.0.1:1/0"], "cannot reach the account store at redis://127.0.0.1:1/0"),
        (["--broker", "not-a-url"], "--broker needs a broker URL"),
        (["--zookeeper", "127.0.0.1:1"], "cannot reach ZooKeeper at zookeeper://127.0.0.1:1/"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_demo_options_exit_2_naming_the_problem(args: list[str], message: str) -> None:
    """Bad or unreachable demo options exit with code 2 and a one-line reason, without a traceback or leftovers."""
    done = run_cli(["demo", *args], timeout=60)
    assert done.code == 2, done.out + done.err
    assert message in done.err
    assert "Traceback" not in done.err
    if "working in" in done.err:
        assert not demo_directory(done.err).exists()
