"""A worker host cut off ZooKeeper mid-task: its session is lost, and the task stops at its next gate call.

Host A starts the task (token t1) and is held before its write; it is then
disconnected from the ZooKeeper network (broker and data stay reachable), and
its token source reports the session suspended. Host B runs a later write of
the same record (t2). A is released: with ``fencing_abort_on_session_loss`` its
gated write raises ``LeaseLostError`` before it reaches Redis, and the task is
retried: whichever host takes the retry (B at once, or A once it is healed and
its source has a new session) writes it with a fresh token, once: nothing is
lost. The control (plain writes, no abort setting) shows A's stale
write landing after B's newer one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .conftest import WholeHosts


@dataclass
class Partition:
    task_id: str
    cut: list[str]  # the cut host's start event: start <task id> <token> <host>
    later: list[str]  # the other host's later write of the same record
    outcome: list[str]  # what the cut execution did when released: wrote, or refused with the error's name


def cut_off_zookeeper_mid_task(hosts: WholeHosts, *, fenced: bool) -> Partition:
    """A holds the task and is cut off ZooKeeper; B writes the record later; A is released, then healed."""
    send = hosts.app.send_task
    first = send("tests.containers.tasks.write_record", args=["r1"], kwargs={"fenced": fenced})
    cut = hosts.wait(lambda: hosts.events("start", first.id), "a host to start the task")[0]
    host_a = hosts.worker_named(cut[3])
    hosts.faults.partition_from_zookeeper(host_a)
    hosts.wait(lambda: hosts.events("session", first.id), "host A's ZooKeeper session to be suspended")
    # A's one pool process is busy (prefetch 1): the later write goes to B.
    later_result = send("tests.containers.tasks.write_record", args=["r1"], kwargs={"fenced": fenced})
    later = hosts.wait(lambda: hosts.events("start", later_result.id), "host B to start the later write")[0]
    assert later[3] != cut[3]
    hosts.release(later_result.id, later[2])
    hosts.wait(lambda: hosts.events("wrote", later_result.id), "host B's write")
    hosts.release(first.id, cut[2])
    outcome = hosts.wait(
        lambda: [e for e in hosts.events("wrote", first.id) + hosts.events("refused", first.id) if e[2] == cut[2]],
        "the cut-off execution to write or be refused",
    )[0]
    hosts.faults.heal()
    return Partition(first.id, cut, later, outcome)


def test_a_host_cut_off_zookeeper_stops_at_its_next_gate_call_and_nothing_is_lost(whole_hosts: Any) -> None:
    """A's write raises LeaseLostError (nothing written with t1); the retry writes with a newer token, once."""
    settings = {"fencing_abort_on_session_loss": True, "fencing_retry_countdown": 0.2}
    hosts = whole_hosts(broker="redis", settings=settings)
    run = cut_off_zookeeper_mid_task(hosts, fenced=True)
    assert run.outcome[0] == "refused" and run.outcome[4] == "LeaseLostError"
    retry = hosts.wait(lambda: hosts.events("wrote", run.task_id), "the retried task's write", timeout=90)
    assert int(retry[0][2]) > int(run.later[2]) > int(run.cut[2])
    assert hosts.record("r1") == f"{retry[0][3]}@{retry[0][2]}"
    assert [e[2] for e in hosts.events("wrote", run.task_id)] == [retry[0][2]]  # applied once, never with t1


def test_without_fencing_the_cut_off_host_writes_over_the_newer_write(whole_hosts: Any) -> None:
    """Negative control: plain writes and no abort setting, so A's stale write lands after B's newer one."""
    hosts = whole_hosts(broker="redis", settings={})
    run = cut_off_zookeeper_mid_task(hosts, fenced=False)
    assert run.outcome[0] == "wrote"
    assert hosts.record("r1") == f"{run.cut[3]}@{run.cut[2]}"
    assert int(run.later[2]) > int(run.cut[2])
