"""Grantor identity at every gate (MemoryGate, Redis, PostgreSQL, MariaDB, SQLite): marks belong to the
grantor that set them, another grantor's token is refused whatever its value, and the operator reset
(what `celery-fencing rebase` and `repair` use) is a compare-and-set."""

from __future__ import annotations

import pytest

from celery_fencing import FencingToken, GrantorMismatchError, StaleTokenError
from celery_fencing.token import Mark

from .adapters import GateAdapter

OLD, NEW = "zk-0123456789abcdef", "zk-fedcba9876543210"


def test_token_of_another_grantor_is_refused_and_changes_nothing(adapter: GateAdapter) -> None:
    """A token of another grantor, even far above the mark, raises GrantorMismatchError naming both ids."""
    adapter.claim(FencingToken("acct", 100, OLD))
    adapter.write(FencingToken("acct", 100, OLD), "k", 1)
    for attempt in (lambda t: adapter.claim(t), lambda t: adapter.write(t, "k", 2)):
        with pytest.raises(GrantorMismatchError) as caught:
            attempt(FencingToken("acct", 10**12, NEW))
        assert (caught.value.token_grantor, caught.value.expected_grantor) == (NEW, OLD)
        assert OLD in str(caught.value) and NEW in str(caught.value)
    assert adapter.read("k") == 1
    assert adapter.gate.mark("acct") == Mark("acct", 100, OLD)
    # Negative control: the same grantor's higher token is accepted.
    adapter.write(FencingToken("acct", 101, OLD), "k", 3)
    assert adapter.read("k") == 3


def test_wiped_grantor_token_reports_the_mismatch_not_staleness(adapter: GateAdapter) -> None:
    """A wiped grantor's tokens are also low: the gate reports the grantor change, which is the news."""
    adapter.claim(FencingToken("acct", 10**9, OLD))
    with pytest.raises(GrantorMismatchError):
        adapter.claim(FencingToken("acct", 3, NEW))
    # Negative control: without grantor ids the same token is merely stale, forever.
    with pytest.raises(StaleTokenError):
        adapter.claim(FencingToken("acct", 3))


def test_mark_without_grantor_adopts_the_first_grantor(adapter: GateAdapter) -> None:
    """A mark set by tokens without a grantor takes the grantor of the first token that passes it."""
    adapter.claim(FencingToken("acct", 5))
    assert adapter.gate.mark("acct") == Mark("acct", 5, None)
    with pytest.raises(StaleTokenError):
        adapter.claim(FencingToken("acct", 4, OLD))
    assert adapter.gate.mark("acct") == Mark("acct", 5, None), "a refused token must not adopt"
    adapter.write(FencingToken("acct", 6, OLD), "k", 6)
    assert adapter.gate.mark("acct") == Mark("acct", 6, OLD)
    adapter.claim(FencingToken("acct", 7))
    assert adapter.gate.mark("acct") == Mark("acct", 7, OLD)
    with pytest.raises(GrantorMismatchError):
        adapter.claim(FencingToken("acct", 8, NEW))


def test_reset_mark_moves_a_resource_to_a_new_grantor(adapter: GateAdapter) -> None:
    """reset_mark sets value and grantor (lower or not) when the mark is as read; old-grantor tokens are refused."""
    adapter.claim(FencingToken("acct", 10**9, OLD))
    before = adapter.gate.mark("acct")
    adapter.gate.reset_mark(FencingToken("acct", 40, NEW), expected=before)
    assert adapter.gate.mark("acct") == Mark("acct", 40, NEW)
    adapter.write(FencingToken("acct", 41, NEW), "k", 41)
    with pytest.raises(GrantorMismatchError):
        adapter.write(FencingToken("acct", 10**9 + 1, OLD), "k", 0)
    with pytest.raises(StaleTokenError):
        adapter.claim(FencingToken("acct", 39, NEW))
    assert adapter.read("k") == 41


def test_reset_mark_is_a_compare_and_set(adapter: GateAdapter) -> None:
    """A mark that moved since it was read is left alone: reset_mark raises StaleTokenError and changes nothing."""
    adapter.claim(FencingToken("acct", 50, OLD))
    seen = adapter.gate.mark("acct")
    adapter.claim(FencingToken("acct", 60, OLD))
    with pytest.raises(StaleTokenError):
        adapter.gate.reset_mark(FencingToken("acct", 5, NEW), expected=seen)
    assert adapter.gate.mark("acct") == Mark("acct", 60, OLD)
    with pytest.raises(StaleTokenError):
        adapter.gate.reset_mark(FencingToken("acct", 5, NEW), expected=None)
    adapter.gate.reset_mark(FencingToken("fresh", 5, NEW), expected=None)
    assert adapter.gate.mark("fresh") == Mark("fresh", 5, NEW)
