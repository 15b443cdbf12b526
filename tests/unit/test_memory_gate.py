"""MemoryGate: the reference gate semantics, as a public test double."""

from __future__ import annotations

import pytest

from celery_fencing import FencingToken, InvalidTokenError, MemoryGate, ResourceMismatchError, StaleTokenError
from celery_fencing.context import token_context


def test_claim_write_and_stale_rejection() -> None:
    """Equal token accepted, higher advances, lower rejected with its fields and no change."""
    gate = MemoryGate()
    gate.claim(FencingToken("acct", 5))
    gate.set(FencingToken("acct", 5), "balance", 100)
    gate.set(FencingToken("acct", 6), "balance", 110)
    with pytest.raises(StaleTokenError) as info:
        gate.set(FencingToken("acct", 5), "balance", 999)
    assert (info.value.resource, info.value.token, info.value.high_water) == ("acct", 5, 6)
    assert gate.get("balance") == 110 and gate.high_water("acct") == 6


def test_key_stays_bound_to_its_resource() -> None:
    """A key written under resource A refuses a token of resource B, even a larger one."""
    gate = MemoryGate()
    gate.set(FencingToken("a", 1), "k", "v")
    with pytest.raises(ResourceMismatchError):
        gate.set(FencingToken("b", 1000), "k", "w")
    assert gate.get("k") == "v" and gate.high_water("b") is None


def test_gate_uses_the_current_token() -> None:
    """Without an explicit token, the gate uses the token of the running execution."""
    gate = MemoryGate()
    with token_context(FencingToken("r", 3)):
        gate.claim()
        gate.set(None, "k", 1)
    assert gate.high_water("r") == 3
    with pytest.raises(InvalidTokenError):
        gate.set(None, "k", 2)
