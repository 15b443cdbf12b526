"""FencingToken: validation, ordering within a resource, and the header wire form."""

from __future__ import annotations

import dataclasses

import pytest

from celery_fencing import MAX_TOKEN_VALUE, FencingToken, InvalidTokenError, ResourceMismatchError
from celery_fencing.token import validate_resource
from tests.unit import param_id

BAD_VALUES = [None, True, False, 1.0, 34.5, "35", b"35", 0, -1, 2**63, 2**64, [1], object()]


@pytest.mark.parametrize("value", BAD_VALUES, ids=param_id)
def test_bad_values_are_refused(value: object) -> None:
    """Only ints in [1, 2**63 - 1] are token values: no bool, float, str or out-of-range int."""
    with pytest.raises(InvalidTokenError):
        FencingToken("r", value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "resource", ["", None, 42, "a" * 201, "tab\there", "nul\x00", "del\x7f", "c1\x85", "surrogate\ud800"], ids=repr
)
def test_bad_resources_are_refused(resource: object) -> None:
    """A resource is a non-empty, bounded str without control characters."""
    with pytest.raises(InvalidTokenError):
        FencingToken(resource, 1)  # type: ignore[arg-type]


def test_refused_characters_are_exactly_the_controls_and_surrogates() -> None:
    """C0 and C1 controls, DEL and lone surrogates are refused anywhere in a resource; every other
    character is accepted (all code points up to U+2FFF, the surrogate block's edges, a sample above)."""
    codes = [*range(0x3000), *range(0xD700, 0xE100), *range(0xE100, 0x110000, 97)]
    for code in codes:
        refused = code < 0x20 or 0x7F <= code < 0xA0 or 0xD800 <= code < 0xE000
        resource = f"acct:{chr(code)}:1"
        if refused:
            with pytest.raises(InvalidTokenError):
                validate_resource(resource)
        else:
            assert validate_resource(resource) == resource


def test_extreme_values_are_accepted() -> None:
    """1 and 2**63-1 are both valid, and a bounded-length unicode resource is fine."""
    assert FencingToken("r", 1).value == 1
    assert FencingToken("r", MAX_TOKEN_VALUE).value == 2**63 - 1
    assert FencingToken("konto:ü/ß:" + "x" * 190, 5).resource.startswith("konto")


def test_tokens_of_one_resource_order_by_value() -> None:
    """Within one resource, comparison is by value, exact beyond 2**53."""
    a, b = FencingToken("acct", 2**53), FencingToken("acct", 2**53 + 1)
    assert a < b and a <= b and b > a and b >= a and a != b
    assert FencingToken("acct", 7) == FencingToken("acct", 7)
    assert sorted([b, a]) == [a, b]


def test_tokens_of_different_resources_do_not_order() -> None:
    """Comparing tokens of two resources raises: zxids are global, their order means nothing."""
    a, b = FencingToken("a", 1), FencingToken("b", 2)
    assert a != b
    for compare in (lambda: a < b, lambda: a <= b, lambda: a > b, lambda: a >= b):
        with pytest.raises(ResourceMismatchError):
            compare()


def test_token_is_immutable_and_hashable() -> None:
    """Tokens are frozen values usable as dict keys."""
    token = FencingToken("r", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        token.value = 4  # type: ignore[misc]
    assert {token: 1}[FencingToken("r", 3)] == 1


@pytest.mark.parametrize("token", [FencingToken("r", 1), FencingToken("a:b:c", MAX_TOKEN_VALUE), FencingToken("ü", 9)])
def test_header_round_trip(token: FencingToken) -> None:
    """to_header() and from_header() are inverse, including resources with colons."""
    assert FencingToken.from_header(token.to_header()) == token


@pytest.mark.parametrize(
    "header",
    [
        None,
        7,
        b"1:5:r",
        "",
        "1:5",
        "2:5:r",
        "1:-5:r",
        "1:+5:r",
        "1: 5:r",
        "1:05:r",
        "1:0:r",
        "1:5.0:r",
        f"1:{2**63}:r",
        "1:99999999999999999999:r",
        "1:5:",
        "1:5:bad\x00",
        "1:5:" + "x" * 5000,
        "1:\u0665:r",
    ],
    ids=repr,
)
def test_malformed_headers_are_refused(header: object) -> None:
    """The header parser accepts only what to_header() produces."""
    with pytest.raises(InvalidTokenError):
        FencingToken.from_header(header)
