"""The contract every gate passes, parametrised over MemoryGate, Redis, Redis Cluster, PostgreSQL, MariaDB and SQLite.

Each backend provides a GateAdapter fixture named ``<kind>_adapter`` (see
conftest.py); adding a kind to GATE_KINDS runs the whole contract against it.
The two canonical stories come with their negative controls: the same
schedule through unfenced writes loses an update.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

import pytest

from celery_fencing import FencingToken, InvalidTokenError, ResourceMismatchError, StaleTokenError, token_context

from .adapters import GateAdapter, WriterReport, append_random, child_append

T = FencingToken


def _forged(value: object) -> FencingToken:
    """A token whose value was changed after validation (frozen dataclasses can be forced)."""
    token = FencingToken("acct", 5)
    object.__setattr__(token, "value", value)
    return token


BAD_TOKENS: list[tuple[str, Callable[[], object]]] = [
    ("none-without-current-token", lambda: None),
    ("str", lambda: "35"),
    ("float", lambda: 34.5),
    ("bool", lambda: True),
    ("bare-int", lambda: 35),
    ("negative-int", lambda: -1),
    ("foreign-object", lambda: object()),
    ("token-with-str-value", lambda: _forged("35")),
    ("token-with-float-value", lambda: _forged(34.5)),
    ("token-with-bool-value", lambda: _forged(True)),
    ("token-with-negative-value", lambda: _forged(-1)),
    ("token-with-zero-value", lambda: _forged(0)),
    ("token-with-2**63-value", lambda: _forged(2**63)),
    ("token-with-bad-resource", lambda: _forged_resource("")),
]


def _forged_resource(resource: object) -> FencingToken:
    token = FencingToken("acct", 5)
    object.__setattr__(token, "resource", resource)
    return token


def _stale_fields(refused: Callable[[], object]) -> tuple[str, int, int | None]:
    """The (resource, token, high_water) of the StaleTokenError that calling *refused* raises."""
    with pytest.raises(StaleTokenError) as info:
        refused()
    return info.value.resource, info.value.token, info.value.high_water


# Semantics ---------------------------------------------------------------------


def test_equal_token_is_accepted(adapter: GateAdapter) -> None:
    """A claim and repeated writes with the same token all pass: retries of one execution carry one token."""
    adapter.claim(T("acct", 5))
    adapter.write(T("acct", 5), "k", 1)
    adapter.write(T("acct", 5), "k", 2)
    adapter.claim(T("acct", 5))
    assert adapter.read("k") == 2
    assert adapter.high_water("acct") == 5


def test_lower_token_is_rejected_with_its_fields(adapter: GateAdapter) -> None:
    """A lower token raises StaleTokenError(resource, token, high_water) on claim and on write, changing nothing."""
    adapter.write(T("acct", 9), "k", 1)
    assert _stale_fields(lambda: adapter.write(T("acct", 8), "k", 2)) == ("acct", 8, 9)
    assert _stale_fields(lambda: adapter.claim(T("acct", 3))) == ("acct", 3, 9)
    assert adapter.read("k") == 1
    assert adapter.high_water("acct") == 9


def test_higher_token_advances_the_mark(adapter: GateAdapter) -> None:
    """Claims and writes with higher tokens raise the mark, which starts unset."""
    assert adapter.high_water("acct") is None
    adapter.claim(T("acct", 2))
    assert adapter.high_water("acct") == 2
    adapter.write(T("acct", 7), "k", 1)
    assert adapter.high_water("acct") == 7
    adapter.claim(T("acct", 2**62))
    assert adapter.high_water("acct") == 2**62


def test_resources_are_independent(adapter: GateAdapter) -> None:
    """Each resource has its own mark, including names that differ only by case or a trailing space."""
    adapter.claim(T("acct", 100))
    for resource in ["other", "Acct", "acct ", "ACCT"]:
        adapter.claim(T(resource, 1))
        assert adapter.high_water(resource) == 1
    adapter.write(T("other", 2), "k-other", 1)
    assert adapter.high_water("acct") == 100
    assert adapter.high_water("other") == 2


def test_token_of_another_resource_cannot_write_bound_data(adapter: GateAdapter) -> None:
    """Data written under resource B refuses a token of resource A, even a larger one, and nothing changes."""
    adapter.write(T("b", 5), "k", 1)
    with pytest.raises(ResourceMismatchError) as info:
        adapter.write(T("a", 1000), "k", 2)
    assert info.value.token_resource == "a"
    assert adapter.read("k") == 1
    assert adapter.high_water("a") is None
    assert adapter.high_water("b") == 5


@pytest.mark.parametrize(("case", "make"), BAD_TOKENS, ids=[case for case, _ in BAD_TOKENS])
def test_bad_input_is_refused_and_changes_nothing(adapter: GateAdapter, case: str, make: Callable[[], object]) -> None:
    """Every kind of bad token raises InvalidTokenError on claim and write, leaving marks and data as they were."""
    adapter.write(T("acct", 5), "k", 1)
    bad = make()
    with pytest.raises(InvalidTokenError):
        adapter.claim(bad)
    with pytest.raises(InvalidTokenError):
        adapter.write(bad, "k", 999)
    with pytest.raises(InvalidTokenError):
        adapter.write(bad, "fresh", 999)
    assert adapter.read("k") == 1
    assert adapter.read("fresh") is None
    assert adapter.high_water("acct") == 5


def test_current_token_is_used_when_none_is_given(adapter: GateAdapter) -> None:
    """Token None means the running execution's token, taken from the context."""
    with token_context(T("acct", 4)):
        adapter.claim(None)
        adapter.write(None, "k", 1)
    assert adapter.high_water("acct") == 4
    assert adapter.read("k") == 1


# Atomicity ---------------------------------------------------------------------


def test_rejected_write_changes_neither_data_nor_mark(adapter: GateAdapter) -> None:
    """A refused write to a new key creates nothing, and to an existing key leaves its value."""
    adapter.claim(T("acct", 10))
    with pytest.raises(StaleTokenError):
        adapter.write(T("acct", 9), "new", 1)
    assert adapter.read("new") is None
    assert adapter.high_water("acct") == 10


def test_failed_write_changes_neither_data_nor_mark(adapter: GateAdapter) -> None:
    """A write that fails in the storage after its token passed leaves data and mark as they were."""
    adapter.write(T("acct", 5), "k", 1)
    with pytest.raises(Exception) as info:
        adapter.failing_write(T("acct", 6), "k", 2)
    assert not isinstance(info.value, StaleTokenError)
    assert adapter.read("k") == 1
    assert adapter.high_water("acct") == 5


# The canonical stories -----------------------------------------------------------


def test_paused_writer_is_fenced_out(adapter: GateAdapter) -> None:
    """A holds 33 and pauses; B writes with 34; A's write with 33 is refused and B's deposit survives."""
    adapter.write(T("acct", 30), "balance", 100)
    a = T("acct", 33)
    adapter.claim(a)
    a_seen = adapter.read("balance")  # A reads 100, then pauses (GC, SIGSTOP, VM freeze)
    b = T("acct", 34)
    adapter.claim(b)
    b_seen = adapter.read("balance")
    assert a_seen == b_seen == 100
    adapter.write(b, "balance", b_seen + 10)  # B deposits 10
    with pytest.raises(StaleTokenError) as info:  # A resumes and deposits 5
        adapter.write(a, "balance", a_seen + 5)
    assert (info.value.resource, info.value.token, info.value.high_water) == ("acct", 33, 34)
    assert adapter.read("balance") == 110
    assert adapter.high_water("acct") == 34

    # Negative control: the same schedule through plain writes destroys B's deposit.
    adapter.plain_write("plain-balance", 100)
    a_seen = adapter.read("plain-balance")
    b_seen = adapter.read("plain-balance")
    assert a_seen is not None and b_seen is not None
    adapter.plain_write("plain-balance", b_seen + 10)
    adapter.plain_write("plain-balance", a_seen + 5)
    assert adapter.read("plain-balance") == 105


def test_claim_race_loses_no_deposit(adapter: GateAdapter) -> None:
    """A claims 7 and reads; B claims 9 and reads; A's write is refused, B's lands, A's retry counts both."""
    adapter.write(T("acct", 1), "balance", 100)
    a = T("acct", 7)
    adapter.claim(a)
    a_seen = adapter.read("balance")
    b = T("acct", 9)
    adapter.claim(b)
    b_seen = adapter.read("balance")
    assert a_seen == b_seen == 100
    with pytest.raises(StaleTokenError) as info:
        adapter.write(a, "balance", a_seen + 10)
    assert info.value.high_water == 9
    adapter.write(b, "balance", b_seen + 20)
    retry = T("acct", 11)  # A re-acquires: a new token, then claim, re-read, redo
    adapter.claim(retry)
    seen = adapter.read("balance")
    assert seen is not None
    adapter.write(retry, "balance", seen + 10)
    assert adapter.read("balance") == 130

    # Negative control 1: unfenced, the same schedule loses A's deposit.
    adapter.plain_write("plain", 100)
    a_seen, b_seen = adapter.read("plain"), adapter.read("plain")
    assert a_seen is not None and b_seen is not None
    adapter.plain_write("plain", a_seen + 10)
    adapter.plain_write("plain", b_seen + 20)
    assert adapter.read("plain") == 120

    # Negative control 2: gated writes without claims accept both writes and lose it too.
    adapter.write(T("acct2", 1), "unclaimed", 100)
    a_seen, b_seen = adapter.read("unclaimed"), adapter.read("unclaimed")
    assert a_seen is not None and b_seen is not None
    adapter.write(T("acct2", 7), "unclaimed", a_seen + 10)
    adapter.write(T("acct2", 9), "unclaimed", b_seen + 20)
    assert adapter.read("unclaimed") == 120


# Concurrency -------------------------------------------------------------------


def _check_history(adapter: GateAdapter, resource: str, key: str, reports: list[WriterReport]) -> None:
    accepted = [value for report in reports for value in report.accepted]
    rejected = [pair for report in reports for pair in report.rejected]
    log = adapter.log(key)
    assert log == sorted(log), "accepted tokens, in commit order, went down"
    assert sorted(log) == sorted(accepted), "the log and the writers disagree on what was accepted"
    attempted = accepted + [token for token, _ in rejected]
    assert adapter.high_water(resource) == max(attempted) == log[-1]
    assert all(token < mark for token, mark in rejected), "a refusal reported a mark not above the token"
    assert rejected, "no write was refused: the schedule did not exercise the gate"


def test_concurrent_threads_keep_the_mark_monotonic(adapter: GateAdapter) -> None:
    """Threads appending random tokens: accepted tokens never go down in commit order; the mark ends at the maximum."""
    reports: list[WriterReport] = [WriterReport() for _ in range(8)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(reports))

    def work(n: int) -> None:
        try:
            start.wait(timeout=30)
            reports[n] = append_random(adapter, "hot", "log", seed=n, count=40)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(len(reports))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    _check_history(adapter, "hot", "log", reports)


def appends_in_processes(child: Callable[..., None], store: object, count: int = 3) -> list[WriterReport]:
    """*count* spawned processes each run ``child(store, "hot", "log", seed, 40, barrier, queue)``; their reports.

    A child appends 40 random tokens to the key ``log`` of resource ``hot``
    through its own client, starting together with the others at the barrier.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(count)
    queue: Any = ctx.Queue()
    procs = [ctx.Process(target=child, args=(store, "hot", "log", 100 + n, 40, barrier, queue)) for n in range(count)]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    assert all(isinstance(result, tuple) for result in results), results
    return [WriterReport(accepted=list(acc), rejected=list(rej)) for acc, rej in results]


def test_concurrent_processes_keep_the_mark_monotonic(adapter: GateAdapter) -> None:
    """Processes with their own clients appending random tokens: the same history rules hold across processes."""
    if not adapter.shared_across_processes:
        pytest.skip("this gate keeps its state in one process")
    _check_history(adapter, "hot", "log", appends_in_processes(child_append, adapter.spec))
