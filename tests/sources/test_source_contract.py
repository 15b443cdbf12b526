"""The contract every token source passes, parametrised over the implementations.

Each kind provides a SourceHarness fixture named ``<kind>_harness``; adding a
kind to SOURCE_KINDS runs the whole contract against it.
"""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time

import pytest

from celery_fencing import FencingConfigurationError, FencingToken, TokenUnavailableError

from .harness import SourceHarness, mint_many

SOURCE_KINDS = ["memory", "sqlite", "zookeeper", "zookeeper_ensemble", "etcd", "etcd_cluster"]


@pytest.fixture(params=SOURCE_KINDS)
def harness(request: pytest.FixtureRequest) -> SourceHarness:
    value: SourceHarness = request.getfixturevalue(f"{request.param}_harness")
    return value


def test_tokens_strictly_increase_per_resource(harness: SourceHarness) -> None:
    """Consecutive mints for one resource return strictly increasing values."""
    source = harness.open()
    values = [source.mint("acct:1").value for _ in range(50)]
    assert all(b > a for a, b in itertools.pairwise(values))


def test_token_carries_its_resource(harness: SourceHarness) -> None:
    """A minted token is a FencingToken of the resource it was minted for."""
    token = harness.open().mint("orders/2026:ü")
    assert isinstance(token, FencingToken)
    assert token.resource == "orders/2026:ü"


def test_resources_are_independent(harness: SourceHarness) -> None:
    """Interleaved mints for two resources each increase strictly."""
    source = harness.open()
    seen: dict[str, list[int]] = {"a": [], "b": []}
    for i in range(20):
        resource = "a" if i % 3 else "b"
        seen[resource].append(source.mint(resource).value)
    for values in seen.values():
        assert values == sorted(set(values))


def test_bad_resource_is_refused_before_minting(harness: SourceHarness) -> None:
    """An invalid resource name is an InvalidTokenError and mints nothing."""
    from celery_fencing import InvalidTokenError

    source = harness.open()
    before = source.mint("r").value
    for bad in ["", "x\x00y", "a" * 500]:
        with pytest.raises(InvalidTokenError):
            source.mint(bad)
    after = source.mint("r").value
    assert after > before


def test_concurrent_threads_get_unique_values(harness: SourceHarness) -> None:
    """Threads minting for one resource get unique values, increasing within each thread."""
    source = harness.open()
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            results[n] = [source.mint("hot").value for _ in range(40)]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    everything = [v for values in results.values() for v in values]
    assert len(everything) == len(set(everything)) == 8 * 40
    for values in results.values():
        assert values == sorted(values)


def test_concurrent_processes_get_unique_values(harness: SourceHarness) -> None:
    """Several processes minting from one URL get unique, per-process increasing values."""
    if not harness.shared_across_processes:
        pytest.skip(f"{harness.name} keeps its counter in one process by design")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        per_process = pool.starmap(mint_many, [(harness.url, "shared", 60)] * 3)
    everything = [v for values in per_process for v in values]
    assert len(everything) == len(set(everything)) == 180
    for values in per_process:
        assert values == sorted(values) and len(set(values)) == len(values)


def test_values_after_restart_exceed_values_before(harness: SourceHarness) -> None:
    """After the grantor restarts, every new token is above every token minted before."""
    if harness.restart is None:
        pytest.skip(f"{harness.name} has no durable grantor to restart")
    source = harness.open()
    before = max(source.mint("acct:7").value for _ in range(10))
    harness.restart()
    after = harness.open().mint("acct:7", timeout=30).value
    assert after > before


def test_unavailable_grantor_raises_within_timeout(harness: SourceHarness) -> None:
    """A grantor that cannot be reached gives TokenUnavailableError within the timeout, never a hang."""
    if harness.make_unavailable is None:
        pytest.skip(f"{harness.name} cannot be made unavailable")
    url = harness.make_unavailable()
    started = time.monotonic()
    with pytest.raises((TokenUnavailableError, FencingConfigurationError)):
        source = harness.open(url)
        source.mint("r", timeout=2.0)
    assert time.monotonic() - started < 15.0
