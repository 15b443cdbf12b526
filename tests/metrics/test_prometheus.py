"""The Prometheus exporter, scraped after a real worker ran tasks that were fenced out."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from celery_fencing import MAX_TOKEN_VALUE, FencingToken, RedisGate
from tests.celery.workers import WorkerProcess, wait_for
from tests.fixtures.services import armed
from tests.fixtures.zookeeper import free_ports

APP = "tests.metrics.app_metrics"


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return sum(value for (sample, have), value in samples.items() if sample == name and set(labels.items()) <= have)


@pytest.fixture
def worker(redis_url: str, tmp_path: Path, unique_name: str) -> Iterator[tuple[WorkerProcess, int]]:
    port = free_ports(1)[0]
    env = {
        "FT_BROKER": redis_url,
        "FT_BACKEND": "fenced+" + redis_url,
        "FT_REDIS": redis_url,
        "FT_PREFIX": unique_name,
        "FT_SOURCE": f"sqlite:///{tmp_path / 'tokens.db'}",
        "FT_METRICS_PORT": str(port),
    }
    process = WorkerProcess(APP, name=unique_name, queue=unique_name, env=env, log_dir=tmp_path)
    try:
        yield process.start(), port
    finally:
        process.stop()
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(f"*{unique_name}*"))
        if keys:
            client.delete(*keys)
        client.close()


def test_exporter_counts_a_run_with_rejections(
    worker: tuple[WorkerProcess, int], redis_url: str, unique_name: str
) -> None:
    """After a write refused and retried, a claim refused, and a result dropped, /metrics shows each count."""
    process, port = worker
    client = Celery("client", broker=redis_url, backend="fenced+" + redis_url)
    # A mark no token reaches: the claim of claim_refused is refused.
    armed(RedisGate(redis.Redis.from_url(redis_url), prefix=f"{unique_name}:fence")).claim(
        FencingToken("c:x", MAX_TOKEN_VALUE)
    )
    try:
        send = lambda name, *args: client.send_task(f"{APP}.{name}", args=args, queue=unique_name)  # noqa: E731
        assert send("fenced_once", "a").get(timeout=60) > 0
        refused = send("claim_refused", "x")
        with pytest.raises(Exception, match="stale fencing token"):
            refused.get(timeout=60)
        dropped = send("drop_result")
        wait_for(lambda: f"[{dropped.id}] succeeded" in process.log(), 60, "drop_result to finish")
    finally:
        client.close()

    samples = _scrape(port)
    task = f"{APP}.fenced_once"
    assert _value(samples, "celery_fencing_tokens_minted_total", task=task, mode="token") == 2
    assert _value(samples, "celery_fencing_mint_duration_seconds_count", task=task) == 2
    assert _value(samples, "celery_fencing_rejections_total", task=task, phase="body", action="retry") == 1
    assert (
        _value(samples, "celery_fencing_rejections_total", task=f"{APP}.claim_refused", phase="claim", action="raise")
        == 1
    )
    assert _value(samples, "celery_fencing_results_dropped_total", task=f"{APP}.drop_result", state="SUCCESS") == 1
    # Through the MeteredGate: fenced_once's own claim, the newer claim, the retry's claim; claim_refused's claim.
    ops = "celery_fencing_gate_operations_total"
    assert _value(samples, ops, task=task, operation="claim", outcome="accepted") == 3
    assert _value(samples, ops, task=task, operation="set", outcome="rejected") == 1
    assert _value(samples, ops, task=task, operation="set", outcome="accepted") == 1
    # claim_refused's claim with a token of its block, then the fresh token's (token blocks: sources.md).
    assert _value(samples, ops, task=f"{APP}.claim_refused", operation="claim", outcome="rejected") == 2
    # Bounded cardinality: no resource label unless asked for.
    assert all("resource" not in dict(labels) for _, labels in samples)
