"""Grantor ids on tokens: validation, ordering only within one grantor, the version 2 and 3 wire forms."""

from __future__ import annotations

import pickle

import pytest

from celery_fencing import (
    FencingToken,
    ForgedTokenError,
    GrantorMismatchError,
    InvalidTokenError,
    MemoryGate,
    StaleTokenError,
)
from celery_fencing.context import resolve_token
from celery_fencing.token import Mark

MAC = "ab" * 32


@pytest.mark.parametrize("grantor", ["", "a:b", "zk id", "-zk", "x" * 65, "zk\n1", "ü", 7, b"zk", ["zk"]], ids=repr)
def test_bad_grantor_ids_are_refused(grantor: object) -> None:
    """A grantor id is 1-64 colon-free characters of a small alphabet; anything else is InvalidTokenError."""
    with pytest.raises(InvalidTokenError):
        FencingToken("r", 1, grantor)  # type: ignore[arg-type]


def test_tokens_of_one_grantor_order_by_value() -> None:
    """Within one resource and grantor, tokens compare by value as before."""
    a, b = FencingToken("r", 5, "zk-a"), FencingToken("r", 6, "zk-a")
    assert a < b and b > a and a <= b and b >= a


def test_tokens_of_different_grantors_do_not_order() -> None:
    """Comparing tokens of two grantors raises GrantorMismatchError naming both ids; equality is just False."""
    old, new = FencingToken("r", 900, "zk-old"), FencingToken("r", 5, "zk-new")
    assert old != new
    for compare in (lambda: old < new, lambda: old <= new, lambda: old > new, lambda: old >= new):
        with pytest.raises(GrantorMismatchError) as caught:
            compare()
        assert {caught.value.token_grantor, caught.value.expected_grantor} == {"zk-old", "zk-new"}
        assert "zk-old" in str(caught.value) and "zk-new" in str(caught.value)


def test_token_without_grantor_orders_against_any() -> None:
    """A token from before grantor ids (None) orders by value against a grantor's token."""
    assert FencingToken("r", 5) < FencingToken("r", 6, "zk-a")
    assert FencingToken("r", 5, "zk-a") == FencingToken("r", 5, "zk-a")
    assert FencingToken("r", 5, "zk-a") != FencingToken("r", 5)


@pytest.mark.parametrize(
    ("token", "header"),
    [
        (FencingToken("a:b", 5), "1:5:a:b"),
        (FencingToken("a:b", 5, "zk-1"), "2:zk-1:5:a:b"),
        (FencingToken("a:b", 5, "zk-1", f"k1:{MAC}"), f"3:zk-1:5:k1:{MAC}:a:b"),
    ],
)
def test_header_versions_round_trip(token: FencingToken, header: str) -> None:
    """Version 1 (no grantor) is still written and read; 2 carries the grantor, 3 also the signature."""
    assert token.to_header() == header
    parsed = FencingToken.from_header(header)
    assert parsed == token and parsed.grantor == token.grantor and parsed.signature == token.signature


@pytest.mark.parametrize(
    "header",
    [
        "2:5:r",
        "2::5:r",
        "2:a b:5:r",
        "2:zk:05:r",
        "3:zk:5:k1:r",
        f"3:zk:5:k1:{MAC[:-1]}:r",
        f"3:zk:5::{MAC}:r",
        "4:x:5:r",
    ],
    ids=repr,
)
def test_malformed_versioned_headers_are_refused(header: str) -> None:
    """The version 2 and 3 parsers accept only what to_header() writes."""
    with pytest.raises(InvalidTokenError):
        FencingToken.from_header(header)


def test_signature_needs_a_grantor() -> None:
    """The signature covers the grantor id, so a signed token without one is refused at construction."""
    with pytest.raises(InvalidTokenError):
        FencingToken("r", 1, None, f"k1:{MAC}")


def test_grantor_survives_pickle_and_resolve_token() -> None:
    """Grantor and signature survive pickle and the gates' re-validation (resolve_token)."""
    token = FencingToken("r", 3, "zk-1", f"k1:{MAC}")
    copy = pickle.loads(pickle.dumps(token))
    assert (copy.grantor, copy.signature) == ("zk-1", f"k1:{MAC}")
    checked = resolve_token(token)
    assert (checked.grantor, checked.signature) == ("zk-1", f"k1:{MAC}")


def test_memory_gate_refuses_another_grantor_and_changes_nothing() -> None:
    """A higher token of another grantor is refused with both ids; a lower one of the same grantor is stale."""
    gate = MemoryGate()
    gate.set(FencingToken("r", 10, "zk-old"), "k", "v1")
    with pytest.raises(GrantorMismatchError) as caught:
        gate.set(FencingToken("r", 99, "zk-new"), "k", "v2")
    assert (caught.value.token_grantor, caught.value.expected_grantor) == ("zk-new", "zk-old")
    assert gate.get("k") == "v1" and gate.mark("r") == Mark("r", 10, "zk-old")
    # Negative control: the same grantor's higher token passes.
    gate.set(FencingToken("r", 11, "zk-old"), "k", "v3")
    with pytest.raises(StaleTokenError):
        gate.claim(FencingToken("r", 10, "zk-old"))


def test_mark_without_grantor_adopts_the_first_grantor() -> None:
    """A mark written without a grantor takes the grantor of the first token that passes it, and keeps it."""
    gate = MemoryGate()
    gate.claim(FencingToken("r", 5))
    assert gate.mark("r") == Mark("r", 5, None)
    gate.claim(FencingToken("r", 6, "zk-a"))
    assert gate.mark("r") == Mark("r", 6, "zk-a")
    gate.claim(FencingToken("r", 7))  # no grantor: checked by value only, keeps the mark's grantor
    assert gate.mark("r") == Mark("r", 7, "zk-a")
    with pytest.raises(GrantorMismatchError):
        gate.claim(FencingToken("r", 8, "zk-b"))


@pytest.mark.parametrize(
    "exc",
    [
        GrantorMismatchError(resource="r", token_grantor="zk-new", expected_grantor="zk-old"),
        ForgedTokenError(resource="r", token=5, grantor="zk-a", reason="no signature"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_new_exceptions_survive_pickle_and_rebuild(exc: Exception) -> None:
    """The new exceptions keep their fields through pickle and rebuild from args, as Celery needs."""
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc) and str(copy) == str(exc) and vars(copy) == vars(exc)
    assert str(type(exc)(*exc.args)) == str(exc)
    assert isinstance(exc, InvalidTokenError)
