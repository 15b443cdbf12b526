"""Re-delivery on RabbitMQ: no visibility timeout; a lost consumer connection re-delivers the unacked message.

w1 (connected through a TCP proxy of the test's own) starts a task and is
SIGSTOPped; the test cuts w1's AMQP connection at the proxy, so RabbitMQ
requeues the message and delivers it to w2. When w1 resumes, its write carries
the older token: the gate refuses it. The negative control runs the same
schedule with plain writes, and w1's stale write destroys w2's.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from kombu import Connection

from tests.rabbitmq.proxy import TcpProxy

from .conftest import Scenario
from .test_redelivery import Run, _finished, _starts, check_the_stale_gated_write_was_refused
from .workers import WorkerProcess, wait_for


@pytest.fixture
def rabbit(scenario: Scenario, rabbitmq_url: str) -> Iterator[tuple[Scenario, TcpProxy, str]]:
    """The scenario with RabbitMQ as the broker, a proxy to it, and the queue deleted afterwards."""
    parts = urlsplit(rabbitmq_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5672).start()
    scenario.env["FT_BROKER"] = rabbitmq_url
    try:
        yield scenario, proxy, rabbitmq_url
    finally:
        for worker in scenario.workers:
            _cold_stop(worker)
        proxy.close()
        with Connection(rabbitmq_url, connect_timeout=5) as broker:
            broker.default_channel.queue_delete(scenario.name)


def _cold_stop(worker: WorkerProcess) -> None:
    """Kill a worker's process group at once: its tasks are done, and a warm shutdown on AMQP idles for ~10 s."""
    if worker.proc is not None and worker.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.proc.wait(10)
    worker.stop()


def redeliver_on_connection_loss(scenario: Scenario, proxy: TcpProxy, broker_url: str, task: str, *args: object) -> Run:
    """w1 starts *task* through the proxy and is paused; its connection is cut; RabbitMQ re-delivers to w2.

    w2 finishes first; then w1 resumes and finishes.
    """
    scenario.env["FT_BROKER"] = proxy.url()
    w1 = scenario.worker("w1")
    scenario.env["FT_BROKER"] = broker_url  # the client and w2 talk to RabbitMQ directly
    result = scenario.send(task, *args)
    first = wait_for(lambda: _starts(scenario, result.id), 60, "w1 to start the task")[0]  # type: ignore[index]
    w1.pause()
    assert proxy.cut() >= 1, "w1 had no connection through the proxy"
    w2 = scenario.worker("w2")
    wait_for(lambda: len(_starts(scenario, result.id)) >= 2, 60, "RabbitMQ to re-deliver the task to w2")
    second = _starts(scenario, result.id)[1]
    run = Run(result.id, first[2], second[2], first[3], second[3], w1, w2)
    scenario.release(result.id, run.newer_token)
    wait_for(lambda: _finished(w2, result.id), 60, "w2 to finish the task")
    w1.resume()
    scenario.release(result.id, run.stale_token)
    wait_for(lambda: _finished(w1, result.id), 60, "w1 to finish the task")
    return run


@pytest.mark.slow
def test_rabbitmq_redelivery_stale_write_is_rejected(rabbit: tuple[Scenario, TcpProxy, str]) -> None:
    """After its connection was cut and the task re-delivered, the paused execution's gated write is refused."""
    scenario, proxy, broker_url = rabbit
    run = redeliver_on_connection_loss(scenario, proxy, broker_url, "gated_job", "j", "v")
    check_the_stale_gated_write_was_refused(scenario, run)


@pytest.mark.slow
def test_rabbitmq_redelivery_without_fencing_the_stale_write_lands(rabbit: tuple[Scenario, TcpProxy, str]) -> None:
    """Negative control: the same schedule with plain writes lets the resumed execution destroy the newer write."""
    scenario, proxy, broker_url = rabbit
    run = redeliver_on_connection_loss(scenario, proxy, broker_url, "gated_job", "j", "v", False)
    assert scenario.redis.get(scenario.key("job", "j")) == f"v@{run.stale_token}"
